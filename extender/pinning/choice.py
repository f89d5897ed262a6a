"""Which DRA node and GPUs the planner pins a pod's claim to (issue 30, C1).

kube-scheduler's allocator gives a claim the first free devices in the order the driver lists them, and on a board
whose sets differ (PCIe, bridged pairs, DGX-1) that first fit is often a crossed pair while an NVLink pair is free.
Only a claim whose selector names the GPUs by UUID gets a set the extender chose. The planner uses the same offer
as prioritize (extender/verbs/scoring/): the best set the node has free, ranked by ring bandwidth, then the
full-bandwidth sets it breaks, then packing. It pins only when no candidate's first fit already gives that ring:
otherwise kube-scheduler, with the extender's prediction (NodeKey.deliverable), gets as much without a pin, and
keeps its own say over the node.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import NodeKey, first_fit
from extender.verbs.scoring import Offer, offered
from topology.select import Choice, Request, Selector, mask_of


@dataclass(frozen=True, slots=True)
class PinChoice:
    node: str
    gpus: tuple[str, ...]  # the chosen set's UUIDs
    ring_gbps: float | None
    pin: bool  # False: some candidate's first fit gives this ring already; the claim goes unpinned


@dataclass(frozen=True, slots=True)
class _Judged:
    offer: Offer
    first_fit_gbps: float  # the ring of what the allocator's first fit gives there (0 if it gives too few)


def choose_pin(state: ClusterState, selector: Selector, count: int, names: Iterable[str]) -> PinChoice | None:
    """The best of the named DRA nodes for `count` whole GPUs, or None if none has that many free. Each distinct
    node key is judged once."""
    names = [name for name in names if (view := state.view(name)) is not None and view.dra_order is not None]
    judged: dict[NodeKey, _Judged | None] = {}
    best: tuple[tuple[float, int, float], str, NodeKey] | None = None
    best_first_fit = 0.0
    for name, key in zip(names, state.keys_for(names), strict=True):
        if not isinstance(key, NodeKey) or key.order is None:
            continue
        if key not in judged:
            judged[key] = _judge(selector, key, count)
        found = judged[key]
        if found is None:
            continue
        best_first_fit = max(best_first_fit, found.first_fit_gbps)
        rank = (found.offer.choice.ring_gbps or 0.0, -found.offer.lost_gpus, found.offer.packing)
        if best is None or rank > best[0]:
            best = (rank, name, key)
    if best is None:
        return None
    (ring, _, _), node, key = best
    view = state.view(node)
    assert view is not None
    offer = judged[key]
    assert offer is not None
    gpus = view.gpu_ids(mask_of(offer.offer.choice.gpus))
    return PinChoice(node, gpus, offer.offer.choice.ring_gbps, ring > best_first_fit)


def _judge(selector: Selector, key: NodeKey, count: int) -> _Judged | None:
    chosen = selector.select(key.compiled, key.free, Request(count))
    if not isinstance(chosen, Choice):
        return None
    given = first_fit(key.free, key.order or (), count)
    first = selector.select(key.compiled, given, Request(count)) if given.bit_count() == count else None
    first_gbps = (first.ring_gbps or 0.0) if isinstance(first, Choice) else 0.0
    return _Judged(offered(selector, key, count, chosen, True), first_gbps)
