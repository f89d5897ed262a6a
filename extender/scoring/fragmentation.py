"""Fragmentation: how much bandwidth the choice cuts between the pod's GPUs and the GPUs left free."""

from __future__ import annotations

from topology.select import Choice


def fragmentation_score(choice: Choice, most_cut_gbps: float) -> float:
    """1.0 for a choice that cuts nothing (it fills a hole), less as it splits well-connected free GPUs.

    The cut is the same quantity selection minimises inside a node (DESIGN §4, key 4); here it compares
    nodes, relative to the largest cut among the candidates.
    """
    if most_cut_gbps <= 0:
        return 1.0
    return 1.0 - choice.cut_gbps / most_cut_gbps
