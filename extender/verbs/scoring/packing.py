"""Packing: prefer nodes that are already partly used, and keep empty big nodes for big pods."""

from __future__ import annotations

from topology.compiled import CompiledTopology


def packing_score(compiled: CompiledTopology, free: int, unhealthy: int, count: int) -> float:
    """The share of the node's healthy GPUs in use once the pod is placed.

    A 1-GPU pod scores 1/8 on an empty 8-GPU node but 5/8 on a half-used one, while an 8-GPU pod scores 1.0 on
    the empty node it needs, so small pods fill gaps and whole NVLink boards stay free for large ones.
    """
    healthy = (compiled.full_mask & ~unhealthy).bit_count()
    if healthy == 0:
        return 0.0
    used = healthy - free.bit_count()
    return min(1.0, (used + count) / healthy)
