"""Reads `nvidia-smi topo -m` text into a Topology.

Real captures vary by driver (R450 to R580): tabs or runs of spaces, a header with or without leading
whitespace, underlined with ANSI escapes even into a file (R580), NIC rows named NICn or mlx5_*, legends
(full, one-line or missing), CPU Affinity, NUMA Affinity and GPU NUMA ID columns that some drivers omit, and
affinity cells that are N/A or empty. The parser accepts all of those, and missing NIC rows too (the GPU rows
hold every GPU link), which it reports as a note. It refuses, naming the row and column, anything it would
otherwise have to guess: a missing GPU row, a row the header lacks, an asymmetric pair, an unknown code,
NVLink to a NIC, an unreadable affinity, and anything beyond what real hardware has (topology/bounds.py).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import combinations
from dataclasses import dataclass

from topology import bounds, catalog
from topology.levels import PCIE_CODES, Level
from topology.model import Gpu, NvLinkPair, Topology, TopologyError

_AFFINITY_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
# CSI sequences (ESC [ ... final byte) such as the underline R580 puts on the header, and charset selections.
_ESCAPE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[()][0-9A-Za-z])")
_NUMA_VALUE = re.compile(r"[0-9]{1,6}$")
_GPU_LABEL = re.compile(r"GPU(\d+)$")
# Digit counts cap what int() is asked to read; anything longer is no code nvidia-smi prints.
_NVLINK_CODE = re.compile(r"NV([0-9]{1,6})$")
_CPU_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?$")


class TopoParseError(ValueError):
    """The text is not a complete, consistent `nvidia-smi topo -m` matrix."""


@dataclass(frozen=True, slots=True)
class ParsedCapture:
    """The topology and what the capture lacked without it being an error (missing NIC rows)."""

    topology: Topology
    notes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Row:
    label: str
    cells: tuple[str, ...]
    affinity: dict[str, str]


def parse_topo_matrix(text: str, gpu_model: str | None = None, memory_mib: int | None = None) -> Topology:
    """Parse a capture. `gpu_model` (e.g. "NVIDIA A100-SXM4-40GB") supplies what the text cannot say."""
    return parse_topo_capture(text, gpu_model, memory_mib).topology


def parse_topo_capture(text: str, gpu_model: str | None = None, memory_mib: int | None = None) -> ParsedCapture:
    """As parse_topo_matrix, with the notes a person should see (gputopo prints them)."""
    lines = _capture_lines(text)
    header_at, columns, affinity_columns = _read_header(lines)
    rows = _read_rows(lines[header_at + 1:], columns, affinity_columns)
    notes = _check_complete(rows, columns)
    _check_symmetric(rows, columns)
    model = gpu_model.strip() if gpu_model and gpu_model.strip() else catalog.UNKNOWN_MODEL
    return ParsedCapture(_build(rows, columns, model, memory_mib), notes)


def _capture_lines(text: str) -> list[str]:
    lines = _ESCAPE.sub("", text).replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = 0
    while start < len(lines) and (lines[start].lstrip().startswith("#") or not lines[start].strip()):
        start += 1
    return lines[start:]


def _read_header(lines: Sequence[str]) -> tuple[int, tuple[str, ...], tuple[str, ...]]:
    for at, line in enumerate(lines):
        tokens = line.split()
        if tokens and tokens[0] == "GPU0":
            if tokens[1:2] == ["X"]:
                raise TopoParseError("no header line: the first line starting with GPU0 is the GPU0 row (GPU0 X ...), "
                                     "so the line of column labels above it is missing or unreadable")
            return (at, *_split_header(" ".join(tokens)))
        if tokens and tokens[0].startswith("GPU0") and not tokens[0][4:5].isdigit():
            return (at, *_split_header(_spaced_header(line, lines[at + 1:])))
    raise TopoParseError("no `nvidia-smi topo -m` matrix found: expected a header line starting with GPU0")


def _spaced_header(header: str, rows: Sequence[str]) -> str:
    """A header whose labels run together (`GPU0GPU1...GPU7mlx5_0CPU Affinity...`: a copy of an underlined header
    that lost its escapes), spaced out by the row labels below it, which name the columns in the same order. Each
    row label must come next in the header, and what is left must be affinity columns: anything else (a NIC
    column without its row) is refused, never guessed."""
    compact = "".join(header.split())
    labels: list[str] = []
    at = 0
    for row in rows:
        tokens = row.split()
        if not tokens or not compact.startswith(tokens[0], at):
            break
        labels.append(tokens[0])
        at += len(tokens[0])
    rest = compact[at:]
    while rest:
        name = next((name for name in _AFFINITY_COLUMNS if rest.startswith(name.replace(" ", ""))), None)
        if name is None:
            raise TopoParseError(f"header: the labels run together and {rest[:60]!r} is neither the label of a row "
                                 "below nor an affinity column, so the columns cannot be told apart")
        labels.append(name)
        rest = rest[len(name.replace(" ", "")):]
    return " ".join(labels)


def _split_header(header: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Device columns (GPUn, NICs) first, then the affinity columns, whose names hold spaces."""
    starts = [header.find(name) for name in _AFFINITY_COLUMNS if name in header]
    cut = min(starts, default=len(header))
    columns = tuple(header[:cut].split())
    twice = next((label for at, label in enumerate(columns) if label in columns[:at]), None)
    if twice is not None:
        raise TopoParseError(f"header: column label {twice} appears twice")
    code = next((label for label in columns if label in PCIE_CODES or _NVLINK_CODE.match(label)), None)
    if code is not None:
        raise TopoParseError(f"header: {code} is a link code, not a column label; the header line is unreadable")
    gpus = sum(1 for label in columns if _GPU_LABEL.match(label))
    if gpus > bounds.MAX_GPUS or len(columns) - gpus > bounds.MAX_NICS:
        raise TopoParseError(f"header: {gpus} GPU and {len(columns) - gpus} other columns; a node has at most "
                             f"{bounds.MAX_GPUS} GPUs and {bounds.MAX_NICS} NICs")
    affinity: list[str] = []
    tail = header[cut:]
    while tail:
        name = next((name for name in _AFFINITY_COLUMNS if tail.startswith(name)), None)
        if name is None or name in affinity:
            raise TopoParseError(f"header: cannot read the columns {tail!r} after the GPU and NIC columns")
        affinity.append(name)
        tail = tail[len(name):].lstrip()
    return columns, tuple(affinity)


def _read_rows(lines: Sequence[str], columns: tuple[str, ...], affinity_columns: tuple[str, ...]) -> list[_Row]:
    known = set(columns)
    rows: list[_Row] = []
    for line in lines:
        tokens = line.split()
        if not tokens or tokens[0] not in known:
            if tokens and _GPU_LABEL.match(tokens[0]):
                raise TopoParseError(f"row {tokens[0]}: the header has no column {tokens[0]}")
            break
        label, values = tokens[0], tokens[1:]
        if len(values) < len(columns):
            raise TopoParseError(f"row {label}: {len(values)} entries for {len(columns)} columns; "
                                 f"the row is cut short after column {columns[len(values) - 1] if values else label}")
        cells = tuple(values[:len(columns)])
        extra = values[len(columns):]
        affinity: dict[str, str] = {}
        if label.startswith("GPU") and affinity_columns:
            affinity = _affinity(label, extra, affinity_columns, len(columns))
        elif extra:
            raise TopoParseError(f"row {label}: unexpected trailing values {extra}")
        if any(row.label == label for row in rows):
            raise TopoParseError(f"row {label} appears twice")
        rows.append(_Row(label, cells, affinity))
    return rows


def _affinity(label: str, values: Sequence[str], names: tuple[str, ...], links: int) -> dict[str, str]:
    """Values to affinity columns. Whitespace hides empty cells, so a short row is placed by what each value
    can be (a CPU list, a NUMA node or N/A); it is refused when it fits more than one way."""
    if len(values) > len(names):
        raise TopoParseError(f"row {label}: after the {links} link entries expected {' | '.join(names)}, "
                             f"found {' '.join(values)!r}")
    readings = {tuple(dict(zip(chosen, values)).get(name, "N/A") for name in names)
                for chosen in combinations(names, len(values))
                if all(_fits(name, value) for name, value in zip(chosen, values))}
    if len(readings) != 1:
        if len(values) == len(names):
            bad = next(name for name, value in zip(names, values) if not _fits(name, value))
            value = values[names.index(bad)]
            if bad == "CPU Affinity":
                _cpu_set(label, value)  # raises, naming the part it cannot read
            raise TopoParseError(f"row {label}, column {bad}: {value!r} is not a NUMA node 0..{bounds.MAX_NUMA_NODE}")
        how = "in more than one way" if readings else "in no way"
        raise TopoParseError(f"row {label}: the values {' '.join(values)!r} fit the columns {' | '.join(names)} {how}")
    affinity = dict(zip(names, readings.pop()))
    if "CPU Affinity" in affinity:
        _cpu_set(label, affinity["CPU Affinity"])
    return affinity


def _fits(name: str, value: str) -> bool:
    if value == "N/A":
        return True
    if name == "CPU Affinity":
        return all(_CPU_RANGE.match(part) for part in value.split(","))
    return bool(_NUMA_VALUE.match(value)) and int(value) <= bounds.MAX_NUMA_NODE


def _check_complete(rows: Sequence[_Row], columns: tuple[str, ...]) -> tuple[str, ...]:
    """Every GPU row must be there; missing NIC rows only lose NIC-to-NIC links, so they are a note."""
    have = {row.label for row in rows}
    missing = [label for label in columns if label not in have]
    gpus_missing = [label for label in missing if _GPU_LABEL.match(label)]
    if gpus_missing:
        raise TopoParseError(f"partial matrix: no row for {_some(gpus_missing)} (the header lists {len(columns)} "
                             "columns)")
    gpus = [label for label in columns if label.startswith("GPU")]
    for position, label in enumerate(gpus):
        if label != f"GPU{position}":
            raise TopoParseError(f"header: column {label} where GPU{position} was expected; "
                                 "GPU columns must run GPU0, GPU1, ... in order")
    if not missing:
        return ()
    return (f"no row for {_some(missing)} of the {len(columns) - len(gpus)} NIC columns; every GPU row is there, "
            "so the GPU links are complete",)


def _some(labels: Sequence[str]) -> str:
    return ", ".join(labels[:4]) + (f" and {len(labels) - 4} more" if len(labels) > 4 else "")


def _check_symmetric(rows: Sequence[_Row], columns: tuple[str, ...]) -> None:
    cell = {row.label: dict(zip(columns, row.cells)) for row in rows}
    for r, label in enumerate(columns):
        if label not in cell:
            continue
        for c, other in enumerate(columns):
            value = cell[label][other]
            if r == c:
                if value != "X":
                    raise TopoParseError(f"row {label}, column {other}: expected X on the diagonal, found {value!r}")
                continue
            if value == "X":
                raise TopoParseError(f"row {label}, column {other}: X off the diagonal")
            if value not in PCIE_CODES and not _NVLINK_CODE.match(value):
                raise TopoParseError(f"row {label}, column {other}: unknown code {value!r}")
            if _NVLINK_CODE.match(value) and not (_GPU_LABEL.match(label) and _GPU_LABEL.match(other)):
                raise TopoParseError(f"row {label}, column {other}: {value} between a GPU and a NIC; NVLink joins "
                                     "only GPUs")
            if c > r and other in cell and cell[other][label] != value:
                raise TopoParseError(f"asymmetric pair: row {label}, column {other} says {value} but "
                                     f"row {other}, column {label} says {cell[other][label]}")


def _build(rows: Sequence[_Row], columns: tuple[str, ...], model: str, memory_mib: int | None) -> Topology:
    gpu_rows = [row for row in rows if _GPU_LABEL.match(row.label)]
    gpu_rows.sort(key=lambda row: int(row.label[3:]))
    n = len(gpu_rows)
    numa = _numa_nodes(gpu_rows)
    spec = catalog.lookup(model)
    gpus = tuple(Gpu(index=i, model=model, numa_node=numa[i], memory_mib=memory_mib,
                     nvlink=spec.nvlink if spec else None, pcie_gen=spec.pcie_gen if spec else None,
                     pcie_width=16 if spec else None) for i in range(n))
    pairs: list[NvLinkPair] = []
    pcie: list[list[Level | None]] = [[None] * n for _ in range(n)]
    for i, row in enumerate(gpu_rows):
        for j in range(i + 1, n):
            code = row.cells[columns.index(f"GPU{j}")]
            nvlink = _NVLINK_CODE.match(code)
            if nvlink:
                links = int(nvlink.group(1))
                if links <= 0:
                    raise TopoParseError(f"row {row.label}, column GPU{j}: {code} names no links")
                pairs.append(NvLinkPair(i, j, links))
            else:
                pcie[i][j] = pcie[j][i] = PCIE_CODES[code]
    try:
        return Topology(gpus=gpus, nvlinks=tuple(pairs), nvswitch=_behind_nvswitch(pairs, n, model),
                        pcie=tuple(tuple(row) for row in pcie))
    except TopologyError as error:
        raise TopoParseError(str(error)) from None


def _behind_nvswitch(pairs: Sequence[NvLinkPair], n: int, model: str) -> bool:
    """True when some GPU shows more NVLinks to its peers than it physically has: only switches do that."""
    per_gpu = [0] * n
    for pair in pairs:
        per_gpu[pair.a] += pair.links
        per_gpu[pair.b] += pair.links
    return max(per_gpu, default=0) > catalog.max_nvlinks(model)


def _numa_nodes(gpu_rows: Sequence[_Row]) -> list[int | None]:
    """NUMA Affinity when the driver prints it, else one node per distinct CPU set, numbered by lowest CPU."""
    if any("NUMA Affinity" in row.affinity for row in gpu_rows):
        return [_numa_value(row) for row in gpu_rows]
    if not any("CPU Affinity" in row.affinity for row in gpu_rows):
        return [None] * len(gpu_rows)
    cpu_sets = [_cpu_set(row.label, row.affinity["CPU Affinity"]) for row in gpu_rows]
    distinct = sorted({cpus for cpus in cpu_sets if cpus}, key=min)
    return [distinct.index(cpus) if cpus else None for cpus in cpu_sets]


def _numa_value(row: _Row) -> int | None:
    """Reading the row checked the value (_fits): a NUMA node in bounds, or N/A."""
    value = row.affinity["NUMA Affinity"]
    return None if value == "N/A" else int(value)


def _cpu_set(label: str, value: str) -> frozenset[int]:
    if value == "N/A":
        return frozenset()
    cpus: set[int] = set()
    for part in value.split(","):
        match = _CPU_RANGE.match(part)
        if not match:
            raise TopoParseError(f"row {label}, column CPU Affinity: cannot read {value!r}")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        if high < low:
            raise TopoParseError(f"row {label}, column CPU Affinity: range {part!r} runs backwards")
        if high > bounds.MAX_CPU_ID:
            raise TopoParseError(f"row {label}, column CPU Affinity: CPU {high} is beyond Linux's "
                                 f"{bounds.MAX_CPU_ID + 1} CPUs")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)
