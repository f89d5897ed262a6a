"""`gputopo`: parse, show and select on real topologies, and discover this node through NVML (DESIGN §8).

Every failure a person can cause (a missing file, garbage, a partial matrix, an impossible request) ends
with one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import orjson

from topology.bandwidth import pair_gbps
from topology.codec import CodecError, decode_topology, encode_topology
from topology.compiled import compile_topology
from topology.discover import NvmlUnavailable, discover
from topology.fabric import describe
from topology.graph import nvlink_islands
from topology.levels import Interconnect, Level
from topology.model import Topology
from topology.nvidia_smi import TopoParseError, parse_topo_capture, parse_topo_matrix
from topology.platforms import PLATFORMS
from topology.select import Choice, Request, Selector
from topology.version import add_version

EXIT_USAGE = 2
DEMO_PLATFORMS = ("dgx1-v100", "rtx-a6000-pairs", "pcie-8gpu-switch-tree", "dgx-h100", "dgx2-v100")


class CliError(Exception):
    """A problem with what the user asked; printed as one line."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (CliError, TopoParseError, CodecError, NvmlUnavailable) as error:
        if getattr(args, "json", False):
            print(orjson.dumps({"error": str(error)}).decode())
        else:
            print(f"gputopo: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gputopo", description=__doc__.splitlines()[0])
    add_version(parser)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    source_help = ("nvidia-smi topo -m text, topology JSON, or a bundled platform name (see `gputopo platforms`); "
                   "- reads standard input")

    parse = commands.add_parser("parse", help="topo -m text -> topology JSON (the annotation schema)")
    parse.add_argument("file", help=source_help)
    _model_options(parse)
    parse.set_defaults(run=_run_parse)

    show = commands.add_parser("show", help="the matrix, pair bandwidths and best set for each k")
    show.add_argument("file", help=source_help)
    _model_options(show)
    show.set_defaults(run=_run_show)

    select = commands.add_parser("select", help="the best set of free GPUs for a request")
    select.add_argument("--topology", required=True, help=source_help)
    select.add_argument("--free", help="free GPU indices, e.g. 0,1,4,5 (default: all)")
    select.add_argument("--count", required=True, type=int, help="how many GPUs")
    select.add_argument("--interconnect", default="any", help="nvlink | pcie-switch | host-bridge | numa | any")
    select.add_argument("--min-bandwidth", type=float, default=0.0, help="lowest acceptable ring GB/s")
    select.add_argument("--json", action="store_true", help="print only JSON")
    _model_options(select)
    select.set_defaults(run=_run_select)

    discover_command = commands.add_parser("discover", help="this node's topology from NVML, as JSON")
    discover_command.set_defaults(run=lambda args: print(encode_topology(discover())))

    platforms = commands.add_parser("platforms", help="list the bundled real platforms")
    platforms.set_defaults(run=_run_platforms)

    demo = commands.add_parser("demo", help="show the bundled platforms and a fragmentation scenario")
    demo.set_defaults(run=_run_demo)
    return parser


def _model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpu-model", help="GPU model for topo -m text, e.g. 'NVIDIA A100-SXM4-80GB' "
                                            "(sets NVLink and PCIe generation; default: unknown)")


def load_topology(source: str, gpu_model: str | None = None) -> tuple[str, Topology]:
    """A name for people and the topology, from a platform name, topology JSON or topo -m text."""
    title, topology, _ = _load(source, gpu_model)
    return title, topology


def _load(source: str, gpu_model: str | None) -> tuple[str, Topology, tuple[str, ...]]:
    """As load_topology, with the parser's notes on what the capture lacked; `-` is standard input."""
    path = Path(source)
    if source in PLATFORMS and not path.exists():
        platform = PLATFORMS[source]
        topology = platform.topology() if gpu_model is None else parse_topo_matrix(platform.capture_text(), gpu_model)
        return f"{platform.name}: {platform.description}", topology, ()
    name = "<stdin>" if source == "-" else source
    try:
        text = sys.stdin.read() if source == "-" else path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"{source}: no such file or bundled platform") from None
    except (OSError, UnicodeDecodeError) as error:
        raise CliError(f"{name}: cannot read it as text ({error.__class__.__name__})") from None
    if text.lstrip().startswith("{"):
        return name, decode_topology(text), ()
    try:
        parsed = parse_topo_capture(text, gpu_model)
    except TopoParseError as error:
        raise CliError(f"{name}: {error}") from None
    return name, parsed.topology, tuple(f"{name}: {note}" for note in parsed.notes)


def _print_notes(notes: Sequence[str]) -> None:
    for note in notes:
        print(f"gputopo: note: {note}", file=sys.stderr)


def _run_parse(args: argparse.Namespace) -> None:
    _, topology, notes = _load(args.file, args.gpu_model)
    _print_notes(notes)
    print(encode_topology(topology))


def _run_select(args: argparse.Namespace) -> int:
    _, topology = load_topology(args.topology, args.gpu_model)
    free = _indices(args.free, topology.size) if args.free else tuple(range(topology.size))
    try:
        request = Request(args.count, Interconnect.parse(args.interconnect), args.min_bandwidth)
    except ValueError as error:
        raise CliError(str(error)) from None
    result = Selector().select(compile_topology(topology), free, request)
    if not isinstance(result, Choice):
        raise CliError(result.message)
    if args.json:
        print(orjson.dumps(result.as_dict()).decode())
    else:
        print(f"GPUs {_join(result.gpus)}: ring {_gbps(result.ring_gbps)} GB/s, total {result.total_gbps:.1f} GB/s, "
              f"{result.numa_nodes} NUMA node(s), weakest hop {_level(result.weakest)}"
              + ("" if result.exact else "; the search ran out of its work budget, so this is the best it can "
                 "prove, not the proven best"))
    return 0


def _indices(text: str, size: int) -> tuple[int, ...]:
    try:
        indices = tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise CliError(f"--free {text!r}: expected GPU indices like 0,1,4,5") from None
    bad = [index for index in indices if not 0 <= index < size]
    if bad:
        raise CliError(f"--free names GPU{bad[0]}, but the node has GPU0..GPU{size - 1}")
    if not indices:
        raise CliError("--free names no GPU")
    return indices


def _run_platforms(_: argparse.Namespace) -> None:
    for platform in PLATFORMS.values():
        print(f"{platform.name:<24} {platform.description}")


def _run_show(args: argparse.Namespace) -> None:
    title, topology, notes = _load(args.file, args.gpu_model)
    _print_notes(notes)
    print(render(title, topology))


def render(title: str, topology: Topology) -> str:
    """The matrix, per-pair bandwidths and the best set for each k, aligned for people."""
    n = topology.size
    gpu = topology.gpus[0]
    lines = [title,
             f"  {n}x {gpu.model}; NVLink {gpu.nvlink.value if gpu.nvlink else 'none/unknown'}; "
             f"PCIe Gen{gpu.pcie_gen or '? (unknown model: Gen3 assumed)'}; "
             f"{'NVSwitch' if topology.nvswitch else 'no NVSwitch'}; fingerprint {topology.fingerprint}"]
    if topology.domain is not None:  # topology JSON from an agent that read NVML's fabric info
        lines.append(f"  {describe(topology.domain)}")
    lines.append("")
    labels = [f"GPU{i}" for i in range(n)]
    width = max(6, max(len(label) for label in labels) + 1)

    def table(cell: callable, extra: str = "") -> list[str]:
        rows = [" " * width + "".join(f"{label:>{width}}" for label in labels) + extra]
        for i in range(n):
            rows.append(f"{labels[i]:<{width}}" + "".join(f"{cell(i, j):>{width}}" for j in range(n))
                        + (f"{_numa(topology, i):>{len(extra)}}" if extra else ""))
        return rows

    def link_code(i: int, j: int) -> str:
        if i == j:
            return "X"
        links = topology.nvlink_count(i, j)
        return f"NV{links}" if links else topology.level(i, j).name

    lines += ["Links (nvidia-smi topo -m codes)"] + table(link_code, "  NUMA") + [""]
    lines += ["Bandwidth per pair, GB/s per direction"]
    lines += table(lambda i, j: "-" if i == j else f"{pair_gbps(topology, i, j):.1f}") + [""]
    islands = nvlink_islands(topology)
    lines.append("NVLink islands: " + "  ".join("{" + _join(island) + "}" for island in islands))
    lines += ["", "Best set for each k, all GPUs free",
              f"  {'k':>2}  {'GPUs':<{3 * n}} {'ring GB/s':>10} {'total GB/s':>11} {'NUMA':>5}  weakest hop"]
    compiled = compile_topology(topology)
    selector = Selector()
    for k in range(1, n + 1):
        choice = selector.select(compiled, compiled.full_mask, Request(k))
        assert isinstance(choice, Choice), "with every GPU free some set always fits"
        lines.append(f"  {k:>2}  {_join(choice.gpus):<{3 * n}} {_gbps(choice.ring_gbps):>10} "
                     f"{choice.total_gbps:>11.1f} {choice.numa_nodes:>5}  {_level(choice.weakest)}")
    return "\n".join(lines)


def _run_demo(_: argparse.Namespace) -> None:
    for name in DEMO_PLATFORMS:
        platform = PLATFORMS[name]
        print(render(f"== {platform.name}: {platform.description}", platform.topology()))
        print()
    print(_fragmentation_scenario())


# Pod a (2 GPUs) and b (1 GPU) arrive, a leaves, then c (1 GPU) and three 2-GPU pods arrive.
_SCENARIO: tuple[tuple[str, int], ...] = (("a", 2), ("b", 1), ("a", 0), ("c", 1), ("d", 2), ("e", 2), ("f", 2))


def _fragmentation_scenario() -> str:
    """Where a pod leaves a hole, first-free breaks an NVLink pair that the least-cut rule keeps whole."""
    topology = PLATFORMS["rtx-a6000-pairs"].topology()
    compiled = compile_topology(topology)
    selector = Selector()
    lines = ["== Fragmentation on rtx-a6000-pairs (NVLink bridges on 0-1, 2-3, 4-5, 6-7): a(2) b(1) arrive, "
             "a leaves, c(1) d(2) e(2) f(2) arrive"]
    for policy in ("least-cut", "first-free"):
        free = set(range(topology.size))
        placed: dict[str, tuple[int, ...]] = {}
        for pod, count in _SCENARIO:
            if count == 0:
                free |= set(placed.pop(pod))
                continue
            if policy == "first-free":
                gpus = tuple(sorted(free)[:count])
            else:
                choice = selector.select(compiled, free, Request(count))
                assert isinstance(choice, Choice), "eight GPUs hold these pods"
                gpus = choice.gpus
            free -= set(gpus)
            placed[pod] = gpus
        described = []
        for pod, gpus in placed.items():
            hop = "" if len(gpus) == 1 else (
                f" {'NVLink' if topology.nvlink_count(*gpus) else topology.level(*gpus).name} "
                f"{pair_gbps(topology, *gpus):.1f} GB/s")
            described.append(f"{pod}={_join(gpus)}{hop}")
        lines.append(f"  {policy:<11} " + "; ".join(described))
    return "\n".join(lines)


def _numa(topology: Topology, index: int) -> str:
    numa = topology.gpus[index].numa_node
    return "?" if numa is None else str(numa)


def _join(gpus: Sequence[int]) -> str:
    return ",".join(str(gpu) for gpu in gpus)


def _gbps(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _level(level: Level | None) -> str:
    return "-" if level is None else level.name.replace("NVLINK", "NVLink")


if __name__ == "__main__":
    sys.exit(main())
