"""Hostile node: filter and prioritize over 5,000 names while one node publishes the worst topology the codec
accepts, against the same cluster without it, in one run.

The extender is on the path of every GPU pod, so one node's annotation must not slow the answers for all of
them past kube-scheduler's 3 s httpTimeout (issue 9: a 40-GPU board with NVLink as a complete bipartite graph
made one prioritize take 8.2 s). Here each shape is offered to the codec first: a shape it refuses is reported
with the codec's reason, and one it accepts becomes node `hostile-0` of a 5,000-node load cluster
(`loadtests/large_cluster_server.py --hostile`). Before each cycle the hostile node publishes a new set of used
GPUs (a free count uniform in 0..n, not timed), so no remembered answer helps: every cycle's filter pays for a
cold selection on it. Pods ask for 1 to 8 GPUs, one in three with NVLink preferred and one in three with NVLink
required, and every request's candidates include the hostile node.

    python loadtests/hostile_node.py [--cycles 300] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import copy
import gc
import itertools
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_select import percentile, run_header, write_section  # noqa: E402
from large_cluster_server import HOSTILE_NODE, KEYS, load_pod, node_names  # noqa: E402
from load_extender import Samples, Server, _connect, _post  # noqa: E402

from extender.demo.cluster import with_uuids  # noqa: E402
from topology.codec import CodecError, decode_topology, encode_topology  # noqa: E402
from topology.levels import Level  # noqa: E402
from topology.model import Gpu, NvLinkPair, Topology, TopologyError  # noqa: E402

BEGIN, END = "<!-- hostile_node:begin -->", "<!-- hostile_node:end -->"
NAMES = 5000
TIMEOUT_MS = 3000.0  # kube-scheduler's httpTimeout for the extender (scheduler-config/)
H100 = "NVIDIA H100 80GB HBM3"


def _board(n: int, model: str, links: Callable[[int, int], int], level: Level) -> Topology:
    gpus = tuple(Gpu(index=i, model=model, numa_node=i * 2 // n, pcie_gen=5, pcie_width=16) for i in range(n))
    nvlinks = tuple(NvLinkPair(a, b, count) for a, b in itertools.combinations(range(n), 2) if (count := links(a, b)))
    pcie = tuple(tuple(None if i == j else level for j in range(n)) for i in range(n))
    return with_uuids("hostile", Topology(gpus=gpus, nvlinks=nvlinks, nvswitch=False, pcie=pcie))


def _bipartite(side: int) -> Callable[[], Topology]:
    return lambda: _board(2 * side, H100, lambda a, b: 1 if (a < side) != (b < side) else 0, Level.SYS)


def _circulant(n: int, reach: int) -> Callable[[], Topology]:
    return lambda: _board(n, H100, lambda a, b: 1 if min(b - a, n - (b - a)) <= reach else 0, Level.SYS)


# name -> (what it is, how to build it); each is built and encoded at run time, so the codec decides.
SHAPES: dict[str, tuple[str, Callable[[], Topology]]] = {
    "bipartite-20x20": ("issue 9's shape: 40 GPUs, NVLink as a complete 20 x 20 bipartite graph, 1 link a pair",
                        _bipartite(20)),
    "bipartite-18x18": ("36 GPUs, complete 18 x 18 bipartite NVLink: every GPU at the 18-link budget",
                        _bipartite(18)),
    "circulant-40": ("40 GPUs, each NVLinked to the 18 nearest around a ring (1 link a pair): many equal rings",
                     _circulant(40, 9)),
    "pcie-ties-48": ("48 GPUs, no NVLink, every pair PIX: every set ties on every criterion",
                     lambda: _board(48, "NVIDIA L40S", lambda a, b: 0, Level.PIX)),
}


@dataclass(frozen=True, slots=True)
class Run:
    shape: str
    accepted: bool
    reason: str
    gpus: int = 0
    annotation_bytes: int = 0
    samples: Samples | None = None
    cycles: int = 0
    hostile_passed: int = 0


def hostile_pod(index: int) -> dict:
    """A pending pod of 1 to 8 GPUs; one in three prefers NVLink, one in three requires it."""
    pod = copy.deepcopy(load_pod(index))
    count = str(index % 8 + 1)
    container = pod["spec"]["containers"][0]
    container["resources"]["limits"]["nvidia.com/gpu"] = container["resources"]["requests"]["nvidia.com/gpu"] = count
    annotations: dict[str, str] = {}
    if index % 3 >= 1:
        annotations[KEYS.interconnect] = "nvlink"
    if index % 3 == 2:
        annotations[KEYS.placement] = "required"
    pod["metadata"]["annotations"] = annotations
    pod["metadata"]["name"] = f"hostile-probe-{index}"
    return pod


def measure(server: Server, cycles: int, with_hostile: bool) -> tuple[Samples, int]:
    """`cycles` filter + prioritize cycles over 5,000 names (the hostile node among them)."""
    connection = _connect(server.port)
    names = node_names(NAMES - 1) + [HOSTILE_NODE] if with_hostile else node_names(NAMES)
    names_json = orjson.dumps(names)
    samples = Samples()
    passed_hostile = 0
    gc.disable()
    try:
        for index in range(cycles):
            if with_hostile:
                _post(connection, "/loadtest/hostile-rotate", b"", None, "")
            pod_json = orjson.dumps(hostile_pod(index))
            body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b"}"
            passed = orjson.loads(_post(connection, "/filter", body, samples, "filter"))["NodeNames"] or []
            passed_hostile += HOSTILE_NODE in passed
            if passed:
                body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + orjson.dumps(passed) + b"}"
                _post(connection, "/prioritize", body, samples, "prioritize")
    finally:
        gc.enable()
        connection.close()
    return samples, passed_hostile


def run_shape(name: str, cycles: int, logs: Path) -> Run:
    try:
        topology = SHAPES[name][1]()
        text = encode_topology(topology)
        decode_topology(text)
    except (TopologyError, CodecError) as error:
        return Run(name, False, str(error))
    path = logs / f"{name}.json"
    path.write_text(text, encoding="utf-8")
    server = Server([sys.executable, str(HERE / "large_cluster_server.py"), "--nodes", str(NAMES - 1),
                     "--hostile", str(path)], logs / f"{name}.log")
    try:
        server.wait_ready("/readyz")
        samples, passed = measure(server, cycles, with_hostile=True)
    finally:
        server.stop()
    return Run(name, True, "", topology.size, len(text), samples, cycles, passed)


def run_baseline(cycles: int, logs: Path) -> Run:
    server = Server([sys.executable, str(HERE / "large_cluster_server.py"), "--nodes", str(NAMES)],
                    logs / "baseline.log")
    try:
        server.wait_ready("/readyz")
        samples, _ = measure(server, cycles, with_hostile=False)
    finally:
        server.stop()
    return Run("(no hostile node)", True, "", 0, 0, samples, cycles)


def render(args: argparse.Namespace, argv: Sequence[str] | None, elapsed: float, runs: Sequence[Run]) -> str:
    lines = run_header("Hostile node: one node publishes the worst topology the codec accepts", "hostile_node.py",
                       argv, elapsed, "; the extender and its in-process cluster in one process, this script in "
                       "another")
    lines += [
        f"- Cluster: {NAMES:,} nodes of the load test (`large_cluster_server.py`, 45 % of GPUs taken); with a shape, "
        f"{NAMES - 1:,} of them plus `{HOSTILE_NODE}`, whose topology is the shape and whose used GPUs change before "
        "every cycle (a free count uniform in 0..n), so each filter makes a cold selection on it.",
        f"- Cycles: {args.cycles} per configuration, each a filter over all {NAMES:,} names then a prioritize of the "
        "names that passed; pods of 1 to 8 GPUs in turn, one in three preferring NVLink, one in three requiring "
        f"it. Times are the extender's own (`Server-Timing`), HTTP times as the client saw them; kube-scheduler's "
        f"timeout is {TIMEOUT_MS / 1000:g} s. Configurations run one after the other, each on a fresh server.",
        "",
        "| configuration | GPUs | annotation bytes | filter p50 / p99 / max ms | prioritize p50 / p99 / max ms | "
        "HTTP max ms | cycles the hostile node passed filter |",
        "|---|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        if not run.accepted:
            lines.append(f"| {run.shape} | refused by the codec: {run.reason} | | | | | |")
            continue
        assert run.samples is not None
        cells = []
        for verb in ("filter", "prioritize"):
            values = run.samples.server_ms[verb]
            cells.append(f"{percentile(values, 0.5):.3f} / {percentile(values, 0.99):.3f} / {max(values):.3f}"
                         if values else "-")
        http_max = max((max(v) for v in run.samples.http_ns.values() if v), default=0) / 1e6
        hostile = f"{run.hostile_passed} of {run.cycles}" if run.gpus else "-"
        lines.append(f"| {run.shape} | {run.gpus or '-'} | {run.annotation_bytes or '-'} | {cells[0]} | {cells[1]} | "
                     f"{http_max:.1f} | {hostile} |")
    lines += ["", "Shapes:", ""] + [f"- `{name}`: {what}." for name, (what, _) in SHAPES.items()]
    worst = max((max(max(v) for v in run.samples.http_ns.values() if v) / 1e6
                 for run in runs if run.samples is not None), default=0.0)
    lines += ["", f"Slowest answer of the run, over HTTP: {worst:.1f} ms, against kube-scheduler's "
              f"{TIMEOUT_MS:.0f} ms: **{'within' if worst < TIMEOUT_MS else 'over'}**."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300, help="cycles per configuration (default 300)")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"which shapes (default all: {','.join(SHAPES)})")
    parser.add_argument("--write", metavar="PATH", help="rewrite the hostile_node section of this Markdown file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hostile-node-") as folder:
        logs = Path(folder)
        runs = [run_baseline(args.cycles, logs)]
        for name in args.shapes.split(","):
            runs.append(run_shape(name, args.cycles, logs))
            print(f"{name}: {'accepted' if runs[-1].accepted else 'refused: ' + runs[-1].reason}", flush=True)
    body = render(args, argv, time.perf_counter() - started, runs)
    print(body)
    if args.write:
        write_section(Path(args.write), body, BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
