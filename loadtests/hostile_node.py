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

The run exits 1 when an answer took kube-scheduler's timeout or longer, or when the extender answered an Error
(filter) or logged one (a prioritize that failed answers `[]`, no Error): either way a pod would not be placed as the
extender decides, however fast the answer came.

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

from bench_select import Check, missed, percentile, run_header, verdict, write_section  # noqa: E402
from large_cluster_server import HOSTILE_NODE, KEYS, load_pod, node_names  # noqa: E402
from load_extender import Samples, Server, _connect, _post, stats  # noqa: E402

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
class Measured:
    """What one configuration's cycles gave."""

    samples: Samples
    hostile_passed: int  # cycles the hostile node passed filter
    errors: list[str]  # filter's Error answers
    logged: int  # errors the extender logged


@dataclass(frozen=True, slots=True)
class Run:
    shape: str
    accepted: bool
    reason: str
    gpus: int = 0
    annotation_bytes: int = 0
    measured: Measured | None = None
    cycles: int = 0


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


def measure(port: int, cycles: int, with_hostile: bool) -> Measured:
    """`cycles` filter + prioritize cycles over 5,000 names (the hostile node among them), on the server at `port`."""
    connection = _connect(port)
    names = node_names(NAMES - 1) + [HOSTILE_NODE] if with_hostile else node_names(NAMES)
    names_json = orjson.dumps(names)
    samples = Samples()
    passed_hostile = 0
    errors = []
    gc.disable()
    try:
        for index in range(cycles):
            if with_hostile:
                _post(connection, "/loadtest/hostile-rotate", b"", None, "")
            pod_json = orjson.dumps(hostile_pod(index))
            body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b"}"
            answer = orjson.loads(_post(connection, "/filter", body, samples, "filter"))
            if answer["Error"]:
                errors.append(answer["Error"])
            passed = answer["NodeNames"] or []
            passed_hostile += HOSTILE_NODE in passed
            if passed:
                body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + orjson.dumps(passed) + b"}"
                _post(connection, "/prioritize", body, samples, "prioritize")
        logged = stats(connection)["errors_logged"]
    finally:
        gc.enable()
        connection.close()
    return Measured(samples, passed_hostile, errors, logged)


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
        measured = measure(server.port, cycles, with_hostile=True)
    finally:
        server.stop()
    return Run(name, True, "", topology.size, len(text), measured, cycles)


def run_baseline(cycles: int, logs: Path) -> Run:
    server = Server([sys.executable, str(HERE / "large_cluster_server.py"), "--nodes", str(NAMES)],
                    logs / "baseline.log")
    try:
        server.wait_ready("/readyz")
        measured = measure(server.port, cycles, with_hostile=False)
    finally:
        server.stop()
    return Run("(no hostile node)", True, "", 0, 0, measured, cycles)


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
        "HTTP max ms | cycles the hostile node passed filter | error answers / errors logged |",
        "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for run in runs:
        if run.measured is None:
            lines.append(f"| {run.shape} | refused by the codec: {run.reason} | | | | | | |")
            continue
        found = run.measured
        cells = []
        for verb in ("filter", "prioritize"):
            values = found.samples.server_ms[verb]
            cells.append(f"{percentile(values, 0.5):.3f} / {percentile(values, 0.99):.3f} / {max(values):.3f}"
                         if values else "-")
        hostile = f"{found.hostile_passed} of {run.cycles}" if run.gpus else "-"
        lines.append(f"| {run.shape} | {run.gpus or '-'} | {run.annotation_bytes or '-'} | {cells[0]} | {cells[1]} | "
                     f"{slowest_ms(found):.1f} | {hostile} | {len(found.errors)} / {found.logged} |")
    lines += ["", "Shapes:", ""] + [f"- `{name}`: {what}." for name, (what, _) in SHAPES.items()]
    lines += ["", "| target | measured | verdict |", "|---|---:|---|", *(check.row() for check in checks(runs))]
    errors = [f"{run.shape}: {run.measured.errors[0]}" for run in runs if run.measured and run.measured.errors]
    if errors:
        lines += ["", "First error answer of each configuration that had one: " + "; ".join(errors) + "."]
    return "\n".join(lines)


def slowest_ms(found: Measured) -> float:
    """The slowest answer over HTTP, in ms."""
    return max((max(values) for values in found.samples.http_ns.values() if values), default=0) / 1e6


def checks(runs: Sequence[Run]) -> list[Check]:
    """Every answer within kube-scheduler's timeout, and none an error."""
    measured = [run.measured for run in runs if run.measured is not None]
    worst = max(map(slowest_ms, measured), default=0.0)
    errors, logged = sum(len(found.errors) for found in measured), sum(found.logged for found in measured)
    return [Check(f"slowest answer over HTTP < kube-scheduler's {TIMEOUT_MS:.0f} ms", f"{worst:.1f} ms",
                  worst < TIMEOUT_MS, "**within**" if worst < TIMEOUT_MS else "**over**"),
            Check("no error answer (filter's Error) and no error logged by the extender",
                  f"{errors} error answers, {logged} errors logged", errors == 0 and logged == 0)]


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
    return verdict("hostile_node", missed(checks(runs)))


if __name__ == "__main__":
    raise SystemExit(main())
