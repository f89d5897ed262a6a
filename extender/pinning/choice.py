"""Which DRA node and GPUs the planner pins a pod's claim to (issue 30, C1).

kube-scheduler's allocator gives a claim the first free devices in the order the driver lists them, and on a board
whose sets differ (PCIe, bridged pairs, DGX-1) that first fit is often a crossed pair while an NVLink pair is free.
Only a claim whose selector names the GPUs by UUID gets a set the extender chose. The planner uses the same offer
as prioritize (extender/verbs/scoring/): the best set the node has free, ranked by ring bandwidth, then the
full-bandwidth sets it breaks, then packing.

It pins even where a first fit would give as much. A first version left such claims unpinned, for kube-scheduler
and the extender's prediction to place; with real kube-scheduler v1.36.2 the planner, making six claims within
100 ms, counted each time on the same first fit, since an unpinned claim holds nothing until it is allocated, and
the last pod found its node full and the other node's first fit crossed sockets. A pin holds its GPUs at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import NodeKey
from extender.verbs.scoring import Offer, offered
from topology.select import Choice, Request, Selector, mask_of


@dataclass(frozen=True, slots=True)
class PinChoice:
    node: str
    gpus: tuple[str, ...]  # the chosen set's UUIDs



def choose_pin(state: ClusterState, selector: Selector, count: int, names: Iterable[str]) -> PinChoice | None:
    """The best of the named DRA nodes for `count` whole GPUs, or None if none has that many free. Each distinct
    node key is judged once."""
    names = [name for name in names if (view := state.view(name)) is not None and view.dra_order is not None]
    judged: dict[NodeKey, Offer | None] = {}
    best: tuple[tuple[float, int, float], str, NodeKey] | None = None
    for name, key in zip(names, state.keys_for(names), strict=True):
        if not isinstance(key, NodeKey) or key.order is None:
            continue
        if key not in judged:
            judged[key] = _judge(selector, key, count)
        found = judged[key]
        if found is None:
            continue
        rank = (found.choice.ring_gbps or 0.0, -found.lost_gpus, found.packing)
        if best is None or rank > best[0]:
            best = (rank, name, key)
    if best is None:
        return None
    _, node, key = best
    view = state.view(node)
    offer = judged[key]
    assert view is not None and offer is not None
    return PinChoice(node, view.gpu_ids(mask_of(offer.choice.gpus)))


def _judge(selector: Selector, key: NodeKey, count: int) -> Offer | None:
    chosen = selector.select(key.compiled, key.free, Request(count))
    return offered(selector, key, count, chosen, True) if isinstance(chosen, Choice) else None
