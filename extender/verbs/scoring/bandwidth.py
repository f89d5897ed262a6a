"""Ring bandwidth against the best ring on offer among the candidates: the all-reduce the pod will get."""

from __future__ import annotations


def bandwidth_score(ring_gbps: float | None, meets_preferences: bool, best_ring_gbps: float) -> float:
    """1.0 for the best ring on offer, proportionally less for slower ones, 0 where the pod's preference fails.

    A single GPU has no ring (`ring_gbps` None), so every node offers it the same.
    """
    if not meets_preferences:
        return 0.0
    if ring_gbps is None or best_ring_gbps <= 0:
        return 1.0
    return ring_gbps / best_ring_gbps
