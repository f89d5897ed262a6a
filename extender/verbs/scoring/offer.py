"""What a node key offers a pod: the value prioritize scores, kept per key across requests."""

from __future__ import annotations

from dataclasses import dataclass

from topology.select import Choice


@dataclass(frozen=True, slots=True)
class Offer:
    """What a node can give the pod now: the chosen set, whether it meets the pod's preferences, the GPUs of
    the full-bandwidth sets it breaks among those left free (scoring.fragmentation), and its packing score
    (scoring.packing), which depends on the node and the pod alone."""

    choice: Choice
    meets_preferences: bool
    lost_gpus: int
    packing: float
    ring_part: float  # its ring where it meets the pod's preferences, else 0: the best ring on offer is their most
