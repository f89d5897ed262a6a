"""Fragmentation: the full-bandwidth sets (topology/full_sets.py) a choice breaks among the GPUs left free,
beyond the one it uses.

The replay (issue 10) showed what a pairwise view missed: a 1-GPU pod taken from a free L40S socket strands no
GPU's best partner, yet leaves no free socket for the next 4-GPU pod, which then runs across sockets at 60% of
its bandwidth. So for each size of 2, 4 and 8 GPUs the node's disjoint full sets are counted before and after
the choice, and each set lost costs its GPUs. A full set the pod itself takes at its own size is what the set
is for, and costs nothing. Breaking the last free NVLink pair of an RTX A6000 node for a 1-GPU pod costs 2; a
GPU from a PCIe-only node whose free GPUs keep their full sets costs 0 (issue 10, the RTX A6000 / L40S case).
"""

from __future__ import annotations

from topology.compiled import CompiledTopology
from topology.full_sets import full_sets, is_full
from topology.select import Selector

SIZES = (2, 4, 8)
"""The sizes kept whole: those of real multi-GPU jobs (the Alibaba 2023 trace asks for 2, 4 and 8) and of
the boards' NVLink domains."""


def lost_gpus(selector: Selector, compiled: CompiledTopology, free: int, healthy: int, chosen: int) -> int:
    """GPUs of the full-bandwidth sets that taking `chosen` out of `free` breaks, beyond its own. Remembered by the
    selector: on a DRA node the set is what its first fit gives, the same for every pod shape of a size, and each
    shape grades the node's new key anew (scoring/grade.py)."""
    return selector.remembered(("lost", compiled.fingerprint, free, healthy, chosen),
                               lambda: _lost_gpus(selector, compiled, free, healthy, chosen))


def _lost_gpus(selector: Selector, compiled: CompiledTopology, free: int, healthy: int, chosen: int) -> int:
    own = chosen.bit_count()
    lost = 0
    for size in SIZES:
        if size > free.bit_count():
            break
        before = full_sets(selector, compiled, free, healthy, size)
        if not before:
            continue
        broken = before - full_sets(selector, compiled, free & ~chosen, healthy, size)
        if size == own and broken > 0 and is_full(selector, compiled, chosen, healthy):
            broken -= 1
        lost += size * max(broken, 0)
    return lost


def fragmentation_score(lost: int, most_lost: int) -> float:
    """1.0 for a choice that breaks no full set, down to 0.0 for the one that breaks most among the candidates."""
    if most_lost <= 0:
        return 1.0
    return 1.0 - lost / most_lost
