"""Make the project's own copy of the Alibaba 2023 ("openb") trace data the replay needs, from
`../shared/traces`: the GPU pods with only the columns the replay reads (gzip, fixed mtime, so the bytes are
the same on every run) and the GPU node list's names, counts and models. `data/PROVENANCE.md` says where the
source came from; a test re-derives both files and compares bytes, so the copy cannot drift from its source.

    python -m loadtests.replay.derive_alibaba [--source ../shared/traces]
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
from pathlib import Path

DATA = Path(__file__).parent / "data"
SOURCE = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
POD_SOURCE = "alibaba_v2023_openb_pod_list_default.csv"
NODE_SOURCE = "alibaba_v2023_openb_node_list_gpu_node.csv"
PODS = "alibaba_v2023_gpu_pods.csv.gz"
NODES = "alibaba_v2023_gpu_nodes.csv"
POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "pod_phase", "creation_time", "deletion_time")
NODE_COLUMNS = ("sn", "gpu", "model")


def derived_pods(source: Path) -> bytes:
    """The GPU pods (num_gpu > 0). gpu_spec is dropped because it is empty for every pod of the default
    list; a source where it is not would need a selector, so it is refused rather than silently lost."""
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(POD_COLUMNS)
    with open(source / POD_SOURCE, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if int(row["num_gpu"]) == 0:
                continue
            if row["gpu_spec"]:
                raise ValueError(f"{row['name']}: gpu_spec {row['gpu_spec']!r}; this copy assumes none")
            writer.writerow([row[column] for column in POD_COLUMNS])
    return gzip.compress(text.getvalue().encode("utf-8"), compresslevel=9, mtime=0)


def derived_nodes(source: Path) -> bytes:
    """The GPU nodes: CPU and memory columns are dropped, the replay schedules GPUs only."""
    text = io.StringIO(newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(NODE_COLUMNS)
    with open(source / NODE_SOURCE, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            writer.writerow([row[column] for column in NODE_COLUMNS])
    return text.getvalue().encode("utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=SOURCE, help="the folder with the upstream CSVs")
    args = parser.parse_args(argv)
    DATA.mkdir(exist_ok=True)
    (DATA / PODS).write_bytes(derived_pods(args.source))
    (DATA / NODES).write_bytes(derived_nodes(args.source))


if __name__ == "__main__":
    main()
