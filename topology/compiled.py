"""A topology compiled for the hot path: integer bandwidths, level ranks and neighbour bitmasks.

Compiled once per fingerprint and shared by every node with the same board, so a cluster of 5,000 DGX nodes
holds a handful of these. Every cache here is bounded: anyone who can patch a Node can make new boards.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from threading import Lock

from topology.bandwidth import pair_mbps
from topology.budget import WorkBudget
from topology.levels import Level
from topology.model import Topology

# Distinct boards kept compiled: a real cluster has a handful; past this the least recently compiled goes
# (a node still holding it keeps its own reference).
MAX_COMPILED = 64
# Per board: neighbour masks per (level, threshold), and ring answers per (level, threshold, GPU set). A real
# 8-GPU board fills a few thousand; a hostile one could fill millions, so each is emptied when full.
MAX_NEIGHBOURS = 512
MAX_RINGS = 4096


@dataclass(frozen=True, eq=False)
class CompiledTopology:
    fingerprint: str
    size: int
    mbps: tuple[tuple[int, ...], ...]
    levels: tuple[tuple[Level, ...], ...]
    # One bit per NUMA node (unknown NUMA counts as one node of its own), so a set's span is a popcount.
    numa_bits: tuple[int, ...]
    _neighbours: dict[tuple[Level, int], tuple[int, ...]] = field(default_factory=dict, repr=False)
    # (whether there is a ring, the steps it took): a remembered answer costs its steps again, so that what
    # a query can do within its budget does not depend on what earlier queries left in the cache.
    _rings: dict[tuple[Level, int, int], tuple[bool, int]] = field(default_factory=dict, repr=False)

    @property
    def full_mask(self) -> int:
        return (1 << self.size) - 1

    def neighbours(self, min_level: Level, min_mbps: int) -> tuple[int, ...]:
        """Per GPU, the bitmask of GPUs it may hop to at this level and bandwidth."""
        key = (min_level, min_mbps)
        found = self._neighbours.get(key)
        if found is None:
            found = tuple(
                sum(1 << j for j in range(self.size)
                    if j != i and self.levels[i][j] >= min_level and self.mbps[i][j] >= min_mbps)
                for i in range(self.size))
            if len(self._neighbours) >= MAX_NEIGHBOURS:
                self._neighbours.clear()
            self._neighbours[key] = found
        return found

    def has_ring(self, min_level: Level, min_mbps: int, gpus: int, budget: WorkBudget | None = None) -> bool:
        """Whether the GPUs in the mask form a ring whose every hop meets the level and bandwidth.

        With a budget, the steps are charged to it (BudgetExhausted when they run out); without, the test runs
        to the end, which only trusted boards may ask for."""
        key = (min_level, min_mbps, gpus)
        found = self._rings.get(key)
        if found is None:
            counted = _Counted(budget)
            found = (_hamiltonian_cycle(self.neighbours(min_level, min_mbps), gpus, counted), counted.steps)
            if len(self._rings) >= MAX_RINGS:
                self._rings.clear()
            self._rings[key] = found
        elif budget is not None:
            budget.spend(found[1])
        return found[0]


_compiled: OrderedDict[str, CompiledTopology] = OrderedDict()
_compiled_lock = Lock()


def compile_topology(topology: Topology) -> CompiledTopology:
    fingerprint = topology.fingerprint
    with _compiled_lock:
        found = _compiled.get(fingerprint)
        if found is not None:
            _compiled.move_to_end(fingerprint)
            return found
    n = topology.size
    numa_ids = sorted({gpu.numa_node for gpu in topology.gpus if gpu.numa_node is not None})
    unknown_bit = 1 << len(numa_ids)
    compiled = CompiledTopology(
        fingerprint=fingerprint,
        size=n,
        mbps=tuple(tuple(0 if i == j else pair_mbps(topology, i, j) for j in range(n)) for i in range(n)),
        levels=tuple(tuple(Level.NVLINK if i == j else topology.level(i, j) for j in range(n)) for i in range(n)),
        numa_bits=tuple(unknown_bit if gpu.numa_node is None else 1 << numa_ids.index(gpu.numa_node)
                        for gpu in topology.gpus),
    )
    with _compiled_lock:
        found = _compiled.setdefault(fingerprint, compiled)
        while len(_compiled) > MAX_COMPILED:
            _compiled.popitem(last=False)
        return found


def bits(mask: int) -> list[int]:
    """Indices of the set bits, ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


class _Counted:
    """Counts a ring test's steps, and charges them to a budget as they are taken."""

    __slots__ = ("budget", "steps")

    def __init__(self, budget: WorkBudget | None) -> None:
        self.budget = budget
        self.steps = 0

    def spend(self, steps: int) -> None:
        self.steps += steps
        if self.budget is not None:
            self.budget.spend(steps)


def _hamiltonian_cycle(adjacency: tuple[int, ...], gpus: int, counted: _Counted) -> bool:
    """Exact Hamiltonian-cycle test by dynamic programming over subsets (Held-Karp on bitmasks).

    One step per (visited set, end) state expanded, plus one per GPU it can go on to."""
    members = bits(gpus)
    k = len(members)
    counted.spend(k)
    if k <= 1:
        return True
    if k == 2:
        return bool(adjacency[members[0]] & gpus)
    if any((adjacency[v] & gpus).bit_count() < 2 for v in members):
        return False
    if all(adjacency[v] & gpus == gpus & ~(1 << v) for v in members):
        return True
    start = members[0]
    layer: dict[int, int] = {1 << start: 1 << start}
    for _ in range(k - 1):
        grown: dict[int, int] = {}
        for visited, ends in layer.items():
            while ends:
                end = ends & -ends
                ends ^= end
                step = adjacency[end.bit_length() - 1] & gpus & ~visited
                counted.spend(1 + step.bit_count())
                while step:
                    nxt = step & -step
                    step ^= nxt
                    grown[visited | nxt] = grown.get(visited | nxt, 0) | nxt
        layer = grown
    return bool(layer.get(gpus, 0) & adjacency[start])
