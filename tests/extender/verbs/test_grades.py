"""prioritize's scores through grades kept across requests (scoring/grade.py) are the scores worked out anew, node by
node, from what each node key offers: whatever candidates a request names and however the nodes' free GPUs move
between requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.pod_request import PodRequest, parse_pod
from extender.api.wire import RecentNames
from extender.demo.dra_objects import allocated_claim, gpu_device, gpu_slice
from extender.verbs.answer_memo import ShapeMemo
from extender.cache.cluster_state import ClusterState
from extender.cache.kept_keys import KEEP_FROM
from extender.cache.node_view import NodeKey, SharedKey
from extender.verbs.scoring import MAX_SCORE, WEIGHTS, offer_of, prioritize_nodes
from extender.verbs.scoring.bandwidth import bandwidth_score
from extender.verbs.scoring.domains import domain_penalty
from extender.verbs.scoring.fragmentation import fragmentation_score
from helpers.dra_board import uuids
from helpers.reported_nodes import reported_cluster
from topology.select import Selector

NODES = {"a": "rtx-a6000-pairs", "b": "rtx-a6000-pairs", "c": "dgx-h100", "d": "dgx1-v100", "e": "rtx-a6000-pairs"}
ORDERS = {"a": (0, 5, 1, 2, 3, 4, 6, 7), "e": (4, 5, 0, 1, 2, 3, 6, 7)}  # DRA nodes: keys of their own

step = st.tuples(st.lists(st.sampled_from(sorted(NODES)), min_size=1, max_size=8),
                 st.sampled_from(sorted(NODES)), st.integers(0, 7), st.booleans(), st.sampled_from([1, 2, 4]),
                 st.sampled_from([None, "preferred", "required"]))  # NVLink asked for, and how


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=12))
def test_kept_scores_equal_scores_worked_out_anew(
        steps: list[tuple[list[str], str, int, bool, int, str | None]]) -> None:
    state = reported_cluster({name: (platform, ()) for name, platform in NODES.items()})
    for name, order in ORDERS.items():
        ids = uuids(name)
        state.slices.apply("ADDED", gpu_slice(name, (), seed=None, devices=[gpu_device(i, ids[i]) for i in order]))
    memo, selector = ShapeMemo(), Selector()
    for i, (names, node, gpu, take, count, placement) in enumerate(steps):
        if node in ORDERS:  # a DRA node's GPU taken or given back by a claim
            claim = allocated_claim(f"c-{node}-{gpu}", node, [f"gpu-{gpu}"])
            state.claims.apply("ADDED" if take else "DELETED", claim)
        asked = {state.keys.interconnect: "nvlink", state.keys.placement: placement} if placement else {}
        pod = parse_pod({"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}", "annotations": asked},
                         "spec": {"containers": [{"name": "c", "resources": {"limits": {
                             "nvidia.com/gpu": str(count)}}}]}}, state.keys)
        kept = prioritize_nodes(state, selector, pod, names, memo)
        assert kept == prioritize_nodes(state, selector, pod, names) == _node_by_node(state, selector, pod, names)


def _node_by_node(state: ClusterState, selector: Selector, pod: PodRequest, names: list[str]) -> list[int]:
    """The scores as prioritize defines them, worked out from each name's own key and offer, with no grade."""
    assert pod.request is not None
    given = state.given_keys(pod.request.count) or {}
    keys = [given.get(key, key) for key in state.keys_for(names)]
    offers = {key: offer_of(selector, pod.request, key) for key in keys if type(key) is NodeKey}
    made = [offer for offer in offers.values() if offer is not None]
    best_ring = max((offer.ring_part for offer in made), default=0.0)
    most_lost = max((offer.lost_gpus for offer in made), default=0)
    choice = any(not key.whole for key in offers)
    scores = []
    for key in keys:
        offer = offers.get(key)
        if offer is None:
            scores.append(0)
            continue
        value = (WEIGHTS["bandwidth"] * bandwidth_score(offer.choice.ring_gbps, offer.meets_preferences, best_ring)
                 + WEIGHTS["packing"] * offer.packing
                 + WEIGHTS["fragmentation"] * fragmentation_score(offer.lost_gpus, most_lost))
        scores.append(max(0, round(MAX_SCORE * value) - domain_penalty(key.whole, choice)))
    assert not any(isinstance(key, SharedKey) for key in keys)  # none here: their level is test_shared_gpus'
    return scores


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(ORDERS)), st.integers(0, 7), st.booleans()), max_size=12),
       st.integers(1, 8))
def test_keys_by_size_are_the_keys_mapped_through_what_their_first_fits_give(
        changes: list[tuple[str, int, bool]], count: int) -> None:
    """`ClusterState.keys_given` reads, in one pass, each node's key as its first fit of `count` gives it, kept as
    claims take and free GPUs after the table was first made."""
    state = reported_cluster({name: (platform, ()) for name, platform in NODES.items()})
    for name, order in ORDERS.items():
        ids = uuids(name)
        state.slices.apply("ADDED", gpu_slice(name, (), seed=None, devices=[gpu_device(i, ids[i]) for i in order]))
    names = sorted(NODES)
    listed = names + [f"absent-{i}" for i in range(KEEP_FROM)]  # long enough to be kept
    kept = RecentNames(listed, listed)  # a list requests repeat (api/wire.py NameLists): its keys are kept
    state.keys_given(names, count)
    assert state.keys_given(kept, count) is not state.keys_given(kept, count), "each request its own copy"
    for node, gpu, take in changes:
        state.claims.apply("ADDED" if take else "DELETED", allocated_claim(f"c-{node}-{gpu}", node, [f"gpu-{gpu}"]))
        given = state.given_keys(count) or {}
        assert state.keys_given(names, count) == [given.get(key, key) for key in state.keys_for(names)]
        assert state.keys_given(kept, count) == [given.get(key, key) for key in state.keys_for(kept)]
