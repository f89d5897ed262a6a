"""DRA nodes at 5,000 names: filter and prioritize in-process, against the same cluster without DRA (issue 30).

A DRA node's key carries its slice's device order (kube-scheduler's allocator is first-fit over it), and NVIDIA's
driver shuffles that order on every node, so no two DRA nodes share a key. Filter and prioritize decide once per
distinct key; they read DRA nodes through the key of what the first fit gives for the pod's size
(`ClusterState.given_keys`), which nodes of other orders share. This measures that: the same 5,000-node cluster
and fill as `make loadtest` (large_cluster_server.py `build`, whose `--dra-share` makes a share of its nodes DRA
nodes: NVIDIA-shaped slices, each shuffled, the fill's GPUs there held by allocated claims), and a 2-GPU pod's
filter over every name and prioritize over the names it passed (its shortlist), as a scheduling cycle calls them,
in-process: the verbs' own work, without HTTP (load_extender.py
measures that part, at the share of TARGET_SHARE).

Target (issue 30): server-side p99 <= 1 ms with DRA nodes in the mix (half of them here). Exits 1 on a miss.

    python loadtests/bench_dra_keys.py [--shares 0,0.5,1] [--samples 300]
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_select import percentile  # noqa: E402
from large_cluster_server import build  # noqa: E402

from extender.api.wire import ExtenderArgs  # noqa: E402

TARGET_MS = 1.0
TARGET_SHARE = 0.5


def measure(share: float, samples: int) -> dict[str, float]:
    """p50 and p99 in ms of each verb, and the distinct keys before and after the first fit's."""
    service, cluster, _, _ = build(5000, 0.45, 2000, 1, dra_share=share)
    names = list(cluster.topologies)
    pod = cluster.create_pod("probe", 2, namespace="default")
    took: dict[str, list[float]] = {"filter": [], "prioritize": []}
    for _ in range(samples):  # a scheduling cycle: prioritize gets the names filter passed (its shortlist)
        started = time.perf_counter()
        passed = service.filter(ExtenderArgs(pod, names, None)).passed
        took["filter"].append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        service.prioritize(ExtenderArgs(pod, passed, None))
        took["prioritize"].append(1000 * (time.perf_counter() - started))
    found: dict[str, float] = {}
    for verb, times in took.items():
        found[f"{verb} p50"], found[f"{verb} p99"] = percentile(times, 0.5), percentile(times, 0.99)
    keys = service.state.keys_for(names)
    given = service.state.given_keys(2) or {}
    found["keys"], found["given keys"] = len(set(keys)), len({given.get(key, key) for key in keys})
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shares", default="0,0.5,1", help="shares of DRA nodes, comma-separated (default 0,0.5,1)")
    parser.add_argument("--samples", type=int, default=300, help="calls of each verb per share (default 300)")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the fill's refused binds
    shares = [float(part) for part in args.shares.split(",")]
    if not all(0 <= share <= 1 for share in shares) or args.samples < 100:
        raise SystemExit("shares are 0 to 1, and at least 100 samples")
    print("| DRA share | distinct keys | keys for a 2-GPU pod | filter p50 / p99 ms | prioritize p50 / p99 ms |")
    print("|---:|---:|---:|---:|---:|")
    missed = []
    for share in shares:
        found = measure(share, args.samples)
        print(f"| {share:.0%} | {found['keys']:,.0f} | {found['given keys']:,.0f} | {found['filter p50']:.3f} / "
              f"{found['filter p99']:.3f} | {found['prioritize p50']:.3f} / {found['prioritize p99']:.3f} |")
        if share == TARGET_SHARE:
            missed += [verb for verb in ("filter", "prioritize") if found[f"{verb} p99"] > TARGET_MS]
    if missed:
        print(f"missed: {', '.join(missed)} p99 above {TARGET_MS} ms with {TARGET_SHARE:.0%} DRA nodes")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
