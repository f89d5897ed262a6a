"""prioritize's scores kept across requests (scoring/book.py) are the scores worked out anew: whatever candidates a
request names and however the nodes' free GPUs move between requests."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.pod_request import parse_pod
from extender.demo.dra_objects import allocated_claim, gpu_device, gpu_slice
from extender.verbs.answer_memo import ShapeMemo
from extender.verbs.scoring import prioritize_nodes
from extender.verbs.scoring.book import ScoreBook
from helpers.dra_board import uuids
from helpers.reported_nodes import reported_cluster
from topology.select import Selector

NODES = {"a": "rtx-a6000-pairs", "b": "rtx-a6000-pairs", "c": "dgx-h100", "d": "dgx1-v100", "e": "rtx-a6000-pairs"}
ORDERS = {"a": (0, 5, 1, 2, 3, 4, 6, 7), "e": (4, 5, 0, 1, 2, 3, 6, 7)}  # DRA nodes: keys of their own

step = st.tuples(st.lists(st.sampled_from(sorted(NODES)), min_size=1, max_size=8),
                 st.sampled_from(sorted(NODES)), st.integers(0, 7), st.booleans(), st.sampled_from([1, 2, 4]))


@settings(max_examples=60, deadline=None)
@given(st.lists(step, min_size=1, max_size=12))
def test_kept_scores_equal_scores_worked_out_anew(steps: list[tuple[list[str], str, int, bool, int]]) -> None:
    state = reported_cluster({name: (platform, ()) for name, platform in NODES.items()})
    for name, order in ORDERS.items():
        ids = uuids(name)
        state.slices.apply("ADDED", gpu_slice(name, (), seed=None, devices=[gpu_device(i, ids[i]) for i in order]))
    memo, book, selector = ShapeMemo(), ScoreBook(), Selector()
    for i, (names, node, gpu, take, count) in enumerate(steps):
        if node in ORDERS:  # a DRA node's GPU taken or given back by a claim
            claim = allocated_claim(f"c-{node}-{gpu}", node, [f"gpu-{gpu}"])
            state.claims.apply("ADDED" if take else "DELETED", claim)
        pod = parse_pod({"metadata": {"name": f"p{i}", "namespace": "ml", "uid": f"u{i}"},
                         "spec": {"containers": [{"name": "c", "resources": {"limits": {
                             "nvidia.com/gpu": str(count)}}}]}}, state.keys)
        kept = prioritize_nodes(state, selector, pod, names, memo, None, True, book)
        assert kept == prioritize_nodes(state, selector, pod, names)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(ORDERS)), st.integers(0, 7), st.booleans()), max_size=12),
       st.integers(1, 8), st.booleans())
def test_keys_by_size_are_the_keys_mapped_through_what_their_first_fits_give(
        changes: list[tuple[str, int, bool]], count: int, verdict: bool) -> None:
    """`ClusterState.keys_given` reads, in one pass, each node's key as its first fit of `count` gives it, kept as
    claims take and free GPUs after the table was first made."""
    state = reported_cluster({name: (platform, ()) for name, platform in NODES.items()})
    for name, order in ORDERS.items():
        ids = uuids(name)
        state.slices.apply("ADDED", gpu_slice(name, (), seed=None, devices=[gpu_device(i, ids[i]) for i in order]))
    names = sorted(NODES)
    state.keys_given(names, count, verdict)
    for node, gpu, take in changes:
        state.claims.apply("ADDED" if take else "DELETED", allocated_claim(f"c-{node}-{gpu}", node, [f"gpu-{gpu}"]))
        given = state.given_keys(count, verdict) or {}
        assert state.keys_given(names, count, verdict) == [given.get(key, key) for key in state.keys_for(names)]
