"""prioritize: a 0-10 score per node, a weighted sum of one strategy per module.

Bandwidth dominates: a node that gives the pod a faster ring always wins over one that only packs better.
Packing and fragmentation then break near-ties between nodes that offer the same ring.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from extender.pod_request import PodRequest
from extender.scoring.bandwidth import bandwidth_score
from extender.scoring.fragmentation import fragmentation_score
from extender.scoring.packing import packing_score
from extender.state import ClusterState, NodeView
from topology.select import Choice, Request, Selector

MAX_SCORE = 10
WEIGHTS = {"bandwidth": 0.6, "packing": 0.25, "fragmentation": 0.15}


NodeKey = tuple[str, int, int]


@dataclass(frozen=True, slots=True)
class Offer:
    """What a node can give the pod now: the chosen set, and whether it meets the pod's preferences."""

    view: NodeView
    choice: Choice
    meets_preferences: bool


def prioritize_nodes(state: ClusterState, selector: Selector, pod: PodRequest,
                     names: Sequence[str]) -> list[tuple[str, int]]:
    """Scores depend only on (board, free mask, unhealthy mask), so each distinct key is scored once."""
    if pod.request is None:
        return [(name, 0) for name in names]
    now = state.clock()
    keys: list[NodeKey | None] = []
    offers: dict[NodeKey, Offer | None] = {}
    for name in names:
        view = state.view(name)
        if view is None or view.compiled is None or state.is_stale(view, now):
            keys.append(None)
            continue
        key = (view.compiled.fingerprint, view.free, view.unhealthy)
        if key not in offers:
            offers[key] = _offer(selector, pod.request, view)
        keys.append(key)
    live = [offer for offer in offers.values() if offer is not None]
    best_ring = max((offer.choice.ring_gbps or 0.0 for offer in live if offer.meets_preferences), default=0.0)
    most_cut = max((offer.choice.cut_gbps for offer in live), default=0.0)
    score_of: dict[NodeKey | None, int] = {None: 0}
    for key, offer in offers.items():
        if offer is None:
            score_of[key] = 0
            continue
        value = (WEIGHTS["bandwidth"] * bandwidth_score(offer.choice, offer.meets_preferences, best_ring)
                 + WEIGHTS["packing"] * packing_score(offer.view, pod.request.count)
                 + WEIGHTS["fragmentation"] * fragmentation_score(offer.choice, most_cut))
        score_of[key] = round(MAX_SCORE * value)
    return [(name, score_of[key]) for name, key in zip(names, keys, strict=True)]


def _offer(selector: Selector, request: Request, view: NodeView) -> Offer | None:
    assert view.compiled is not None
    if request.constrained:
        constrained = selector.select(view.compiled, view.free, request)
        if isinstance(constrained, Choice):
            return Offer(view, constrained, True)
    plain = selector.select(view.compiled, view.free, Request(request.count))
    return Offer(view, plain, not request.constrained) if isinstance(plain, Choice) else None
