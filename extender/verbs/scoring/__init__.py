"""prioritize: a 0-10 score per node, a weighted sum of one strategy per module.

Bandwidth dominates: a node that gives the pod a faster ring wins over one that only packs better. Among nodes
that offer the same ring, fragmentation weighs most: breaking the last free NVLink pair, where another candidate
breaks no full set, costs 3 points, which at the shipped extender weight (5, x10) outweighs any NodeResourcesFit
difference (0-100), so MostAllocated cannot pull a 1-GPU pod onto that pair (issue 10). Packing is light, as
kube-scheduler's MostAllocated packs too.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from extender.api._names import lookup_few, unique
from extender.api.pod_request import PodRequest
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import Key, NodeKey, SharedKey
from extender.verbs.answer_memo import ON_LOOP, ShapeMemo
from extender.verbs.drains import Drains, ends_by, keys_seen
from extender.verbs.scoring.bandwidth import bandwidth_score
from extender.verbs.scoring.domains import domain_penalty
from extender.verbs.scoring.fragmentation import fragmentation_score, lost_gpus
from extender.verbs.scoring.packing import packing_score
from topology.select import Choice, Request, Selector, mask_of

MAX_SCORE = 10
WEIGHTS = {"bandwidth": 0.6, "packing": 0.1, "fragmentation": 0.3}


@dataclass(frozen=True, slots=True)
class Offer:
    """What a node can give the pod now: the chosen set, whether it meets the pod's preferences, the GPUs of
    the full-bandwidth sets it breaks among those left free (scoring.fragmentation), and its packing score
    (scoring.packing), which depends on the node and the pod alone."""

    choice: Choice
    meets_preferences: bool
    lost_gpus: int
    packing: float


def prioritize_nodes(state: ClusterState, selector: Selector, pod: PodRequest, names: list[str],
                     memo: ShapeMemo[Offer | None] | None = None, drains: Drains | None = None,
                     compute: bool = True) -> list[int]:
    """A score per name. Scores depend only on the node key, so each distinct key is scored once; what each
    node key offers the pod is remembered across requests in `memo`. The passes over the names run in C
    (extender/api/_names.c). GPUs drained for other pods (extender/verbs/drains.py) are not free to this one. Without
    `compute`, only remembered offers and those quick to work out (memo.ON_LOOP) are used: memo.Unknown if one
    more is missing."""
    if pod.request is None:
        return [0] * len(names)
    if pod.pinned:  # exactly the pinned GPUs, where they are (filter passed only that node)
        return [MAX_SCORE if (view := state.view(name)) is not None and pod.pinned <= view.index_of.keys() else 0
                for name in names]
    keys = keys_seen(state, names, drains, pod.uid, None, ends_by(pod, state.clock()), pod.request.count)
    distinct = set(unique(keys))
    boards = [key for key in distinct if isinstance(key, NodeKey)]
    known = (memo or ShapeMemo()).answers(pod.request, boards, partial(_offer, selector, pod.request),
                                          state.key_epoch, None if compute else ON_LOOP)
    offers = {key: known[key] for key in boards}
    live = [offer for offer in offers.values() if offer is not None]
    best_ring = max((offer.choice.ring_gbps or 0.0 for offer in live if offer.meets_preferences), default=0.0)
    most_lost = max((offer.lost_gpus for offer in live), default=0)
    choice = any(not key.whole for key in boards)  # a candidate outside a whole domain: spare the whole ones
    score_of: dict[Key | None, int] = dict.fromkeys(distinct, 0)
    for key, offer in offers.items():
        if offer is not None:
            value = (WEIGHTS["bandwidth"] * bandwidth_score(offer.choice, offer.meets_preferences, best_ring)
                     + WEIGHTS["packing"] * offer.packing
                     + WEIGHTS["fragmentation"] * fragmentation_score(offer.lost_gpus, most_lost))
            score_of[key] = max(0, round(MAX_SCORE * value) - domain_penalty(key.whole, choice))
    shared = [key for key in distinct if isinstance(key, SharedKey)]
    if shared and not pod.request.constrained:
        # A pod that asks nothing of topology is not scored down for sharing: level with the best whole-GPU
        # node, so kube-scheduler's own plugins choose among them as they would without us. One that prefers an
        # interconnect keeps 0 there: replicas and MIG slices offer no ring (topology/sharing.py).
        level = max((score_of[key] for key in boards), default=MAX_SCORE)
        score_of.update(dict.fromkeys(shared, level))
    return lookup_few(keys, score_of)


def _offer(selector: Selector, request: Request, key: NodeKey) -> Offer | None:
    """What the node gives: on a DRA node, the set its allocator will pick (NodeKey.deliverable)."""
    given = key.deliverable(request.count)
    if request.constrained:
        constrained = selector.select(key.compiled, given, request)
        if isinstance(constrained, Choice):
            return offered(selector, key, request.count, constrained, True)
    plain = selector.select(key.compiled, given, Request(request.count))
    return offered(selector, key, request.count, plain, not request.constrained) if isinstance(plain, Choice) else None


def offered(selector: Selector, key: NodeKey, count: int, choice: Choice, meets_preferences: bool) -> Offer:
    healthy = key.compiled.full_mask & ~key.unhealthy
    return Offer(choice, meets_preferences, lost_gpus(selector, key.compiled, key.free, healthy, mask_of(choice.gpus)),
                 packing_score(key.compiled, key.free, key.unhealthy, count))
