"""The selection objective evaluated the slow, obvious way: every subset, every ring.

Shares no code with topology.select beyond the compiled bandwidth and level tables, so agreement between
the two is evidence, not tautology.
"""

from __future__ import annotations

from itertools import combinations, permutations

from topology.compiled import CompiledTopology
from topology.levels import Level


def ring_mbps(compiled: CompiledTopology, subset: tuple[int, ...], min_level: Level) -> int | None:
    """Best bottleneck over every Hamiltonian cycle using allowed hops; None when no cycle exists.

    The cycle is walked from subset[0]; a permutation stops early once it cannot beat the best found, and
    the search ends when a cycle reaches the ceiling (each GPU's second-best allowed hop).
    """
    def hop(i: int, j: int) -> int | None:
        return compiled.mbps[i][j] if compiled.levels[i][j] >= min_level else None

    if len(subset) == 2:
        return hop(*subset)
    ceiling = min(sorted((hop(i, j) or 0 for j in subset if j != i), reverse=True)[1] for i in subset)
    best: int | None = None
    first, rest = subset[0], subset[1:]
    for order in permutations(rest):
        cycle = (first, *order, first)
        low: int | None = None
        for a, b in zip(cycle, cycle[1:]):
            value = hop(a, b)
            if value is None or (best is not None and value <= best):
                low = None
                break
            low = value if low is None else min(low, value)
        if low is not None and (best is None or low > best):
            best = low
            if best >= ceiling:
                break
    return best


_subset_facts: dict[tuple[str, tuple[int, ...], Level], tuple[int | None, int, int]] = {}


def _facts(compiled: CompiledTopology, subset: tuple[int, ...], min_level: Level) -> tuple[int | None, int, int]:
    """(ring, total, NUMA span) of a subset: they do not depend on the free set, so they are kept."""
    key = (compiled.fingerprint, subset, min_level)
    found = _subset_facts.get(key)
    if found is None:
        ring = 0 if len(subset) == 1 else ring_mbps(compiled, subset, min_level)
        total = sum(compiled.mbps[i][j] for i, j in combinations(subset, 2))
        found = (ring, total, len({compiled.numa_bits[i] for i in subset}))
        _subset_facts[key] = found
    return found


def best_subset(compiled: CompiledTopology, free: tuple[int, ...], k: int, min_level: Level = Level.SYS,
                min_mbps: int = 0) -> tuple[tuple[int, ...], tuple[int, int, int, int]] | None:
    """The optimal subset and its key (ring, total, numa span, cut), by exhaustive search."""
    mbps = compiled.mbps
    best: tuple[tuple[int, ...], tuple[int, int, int, int]] | None = None
    best_order: tuple | None = None
    for subset in combinations(sorted(free), k):
        ring, total, numa = _facts(compiled, subset, min_level)
        if ring is None or ring < min_mbps:
            continue
        inside = set(subset)
        cut = sum(mbps[i][j] for i in subset for j in free if j not in inside)
        order = (ring, total, -numa, -cut, tuple(-i for i in subset))
        if best_order is None or order > best_order:
            best_order = order
            best = (subset, (ring, total, numa, cut))
    return best
