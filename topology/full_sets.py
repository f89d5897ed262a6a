"""Full-bandwidth sets: k free GPUs whose ring is as fast as the best ring of k that the node's healthy GPUs
hold when all are free (an NVLink pair on an RTX A6000 board, a socket of four on a PCIe L40S board, an
NVLink quad on a DGX-1). The topology wait holds pods out for one; fragmentation scoring keeps them whole.

A search cut short by the work budget proves nothing either way: callers say what that means for them.
"""

from __future__ import annotations

import math
from itertools import combinations

from topology.compiled import CompiledTopology, bits
from topology.select import Choice, Request, Selector, mask_of, ring_gbps

TOLERANCE = 1e-9
"""Ring bandwidths are floats computed two ways (a search, a given set): equal within this share."""


def best_ring_gbps(selector: Selector, compiled: CompiledTopology, healthy: int, size: int) -> float | None:
    """The best ring of `size` among the healthy GPUs; None without one or past the work budget."""
    best = selector.select(compiled, healthy, Request(size))
    if not isinstance(best, Choice) or not best.exact:
        return None
    return best.ring_gbps


def full_choice(selector: Selector, compiled: CompiledTopology, free: int, healthy: int,
                size: int) -> Choice | None:
    """The best set of `size` among `free` when it is full-bandwidth, else None (also past the budget)."""
    best = best_ring_gbps(selector, compiled, healthy, size)
    if best is None:
        return None
    offered = selector.select(compiled, free, Request(size))
    if not isinstance(offered, Choice) or not offered.exact or offered.ring_gbps is None:
        return None
    return offered if offered.ring_gbps >= best * (1 - TOLERANCE) else None


def is_full(selector: Selector, compiled: CompiledTopology, gpus: int, healthy: int) -> bool:
    """These GPUs, as a set, are full-bandwidth for their size."""
    best = best_ring_gbps(selector, compiled, healthy, gpus.bit_count())
    granted = ring_gbps(compiled, [gpu for gpu in range(compiled.size) if gpus >> gpu & 1])
    return best is not None and granted is not None and granted >= best * (1 - TOLERANCE)


def full_sets(selector: Selector, compiled: CompiledTopology, free: int, healthy: int, size: int) -> int:
    """Disjoint full-bandwidth sets of `size` among `free`, taken greedily best first; remembered by the selector.
    Scoring a node counts them before and after each choice (scoring/fragmentation.py), for every size and pod
    shape, and a node's free mask recurs across those."""
    return selector.remembered(("full_sets", compiled.fingerprint, free, healthy, size),
                               lambda: _full_sets(selector, compiled, free, healthy, size))


def _full_sets(selector: Selector, compiled: CompiledTopology, free: int, healthy: int, size: int) -> int:
    count, rest = 0, free
    while rest.bit_count() >= size:
        choice = full_choice(selector, compiled, rest, healthy, size)
        if choice is None:
            break
        rest &= ~mask_of(choice.gpus)
        count += 1
    return count


MAX_SETS_SEARCHED = 4096
"""Candidate sets listed per (board, size): an 8-GPU board has at most 70; a board with more combinations than
this lists none (a pod there waits without a drain)."""

_FULL_SETS: dict[tuple[str, int, int], tuple[int, ...]] = {}
_FULL_SETS_LIMIT = 1024


def full_set_masks(selector: Selector, compiled: CompiledTopology, healthy: int, size: int) -> tuple[int, ...]:
    """Every full-bandwidth set of `size` among the healthy GPUs, as masks; none past MAX_SETS_SEARCHED.
    Remembered by board fingerprint (no board is kept alive by it), for at most 1,024 (board, health, size)."""
    key = (compiled.fingerprint, healthy, size)
    found = _FULL_SETS.get(key)
    if found is None:
        members = bits(healthy)
        found = ()
        if size <= len(members) and math.comb(len(members), size) <= MAX_SETS_SEARCHED:
            masks = (sum(1 << gpu for gpu in chosen) for chosen in combinations(members, size))
            found = tuple(mask for mask in masks if is_full(selector, compiled, mask, healthy))
        if len(_FULL_SETS) >= _FULL_SETS_LIMIT:
            _FULL_SETS.clear()
        _FULL_SETS[key] = found
    return found
