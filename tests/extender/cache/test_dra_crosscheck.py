"""On DRA nodes the node agent's report (which pod the kubelet gave which GPU) is checked against the claims: a GPU the
report shows held and no claim holds stays taken, and once that lasts past the races of a pod's start and end it is
logged and counted (extender/cache/dra_crosscheck.py); claims ahead of the kubelet are no mismatch."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from itertools import count

import pytest

from extender.cache.cluster_state import ClusterState
from extender.cache.dra_crosscheck import GRACE_SECONDS
from extender.demo.dra_objects import allocated_claim, channel_slice, gpu_slice
from extender.verbs.metrics import Metrics
from helpers.reported_nodes import ManualClock, reported_cluster
from topology.codec import NodeState, encode_state

DRA, PLUGIN = "a6000-dra", "a6000-dp"
_generations = count(2)


def _state() -> tuple[ClusterState, ManualClock]:
    clock = ManualClock()
    state = reported_cluster({DRA: ("rtx-a6000-pairs", ()), PLUGIN: ("rtx-a6000-pairs", ())}, clock=clock)
    ids = state.view(DRA).ids  # type: ignore[union-attr]
    state.slices.replace([gpu_slice(DRA, ids, seed=11), channel_slice(PLUGIN)])
    state.claims.replace([])
    return state, clock


def _report(state: ClusterState, node: str, pods: Mapping[str, tuple[int, ...]]) -> None:
    """The node's agent writes its state now: each pod (namespace/name) with the GPUs (indices) the kubelet gave it."""
    view = state.view(node)
    assert view is not None
    held = {pod: frozenset(view.ids[i] for i in gpus) for pod, gpus in pods.items()}
    written = NodeState(frozenset().union(*held.values()), frozenset(),
                        datetime.fromtimestamp(state.clock(), timezone.utc), next(_generations), held)
    state.nodes.apply("MODIFIED", {"metadata": {"name": node, "annotations": {
        state.keys.topology: view.raw_topology, state.keys.state: encode_state(written)}}})


def _free(state: ClusterState, node: str) -> set[int]:
    view = state.view(node)
    assert view is not None
    return {i for i in range(view.size) if view.free >> i & 1}


def _metric(state: ClusterState, name: str) -> float | None:
    return Metrics(state, []).registry.get_sample_value(name)


def test_a_gpu_the_kubelet_shows_held_and_no_claim_holds_stays_taken_and_is_counted_once_it_lasts(
        caplog: pytest.LogCaptureFixture) -> None:
    state, clock = _state()
    state.claims.apply("ADDED", allocated_claim("c1", DRA, ["gpu-0"], pods=["p1"]))
    _report(state, DRA, {"ml/pod-p1": (0,), "ml/rogue": (5,)})
    assert _free(state, DRA) == {1, 2, 3, 4, 6, 7}, "GPU 5 is taken on the kubelet's word"
    assert state.dra_unclaimed() == {} and state.claim_check.found == 0  # a race, until it lasts
    clock.now += GRACE_SECONDS
    with caplog.at_level(logging.WARNING, "extender.cache.dra_crosscheck"):
        _report(state, DRA, {"ml/pod-p1": (0,), "ml/rogue": (5,)})  # the agent's heartbeat
    rogue = state.view(DRA).ids[5]  # type: ignore[union-attr]
    assert state.dra_unclaimed() == {DRA: frozenset({rogue})}
    assert _metric(state, "gpu_topology_extender_dra_unclaimed_gpus") == 1
    assert _metric(state, "gpu_topology_extender_dra_unclaimed_found_total") == 1
    assert caplog.messages == [f"node {DRA}: the kubelet has shown {rogue} held (by ml/rogue) for {GRACE_SECONDS:g} s "
                               "or more, and no allocated ResourceClaim holds them: they stay taken"]
    clock.now += 30
    _report(state, DRA, {"ml/pod-p1": (0,), "ml/rogue": (5,)})
    assert state.claim_check.found == 1, "counted once while it lasts"
    assert _free(state, DRA) == {1, 2, 3, 4, 6, 7}
    _report(state, DRA, {"ml/pod-p1": (0,)})  # the pod ended
    assert state.dra_unclaimed() == {} and _metric(state, "gpu_topology_extender_dra_unclaimed_gpus") == 0
    assert _free(state, DRA) == {1, 2, 3, 4, 5, 6, 7}


def test_a_claim_the_kubelet_does_not_show_yet_is_taken_and_no_mismatch() -> None:
    state, clock = _state()
    _report(state, DRA, {})
    state.claims.apply("ADDED", allocated_claim("c1", DRA, ["gpu-2", "gpu-3"], pods=["p1"]))  # its pod starts
    for _ in range(3):
        clock.now += GRACE_SECONDS
        _report(state, DRA, {})
    assert _free(state, DRA) == {0, 1, 4, 5, 6, 7}
    assert state.dra_unclaimed() == {} and state.claim_check.found == 0


def test_a_pods_end_seen_by_the_claims_before_the_report_is_not_counted() -> None:
    state, clock = _state()
    claim = allocated_claim("c1", DRA, ["gpu-1"], pods=["p1"])
    state.claims.apply("ADDED", claim)
    _report(state, DRA, {"ml/pod-p1": (1,)})
    clock.now += GRACE_SECONDS
    _report(state, DRA, {"ml/pod-p1": (1,)})
    state.claims.apply("DELETED", claim)  # the pod ended: its claim goes before the agent's next report
    assert 1 not in _free(state, DRA), "the kubelet's last word still holds it"
    clock.now += 5
    _report(state, DRA, {})
    assert state.claim_check.found == 0 and 1 in _free(state, DRA)


def test_the_last_pods_held_over_by_the_agent_are_not_counted() -> None:
    """The agent keeps the pods of a List that emptied at once for 15 s (a kubelet restart looks alike)."""
    state, clock = _state()
    claim = allocated_claim("c1", DRA, ["gpu-4", "gpu-5"], pods=["p1"])
    state.claims.apply("ADDED", claim)
    _report(state, DRA, {"ml/pod-p1": (4, 5)})
    state.claims.apply("DELETED", claim)
    for _ in range(3):
        clock.now += 5
        _report(state, DRA, {"ml/pod-p1": (4, 5)})
    clock.now += 5
    _report(state, DRA, {})
    assert state.claim_check.found == 0 and _free(state, DRA) == set(range(8))


def test_device_plugin_nodes_and_stale_reports_are_not_checked() -> None:
    state, clock = _state()
    _report(state, PLUGIN, {"ml/train": (0, 1)})  # no claim ever holds a device plugin node's GPUs
    _report(state, DRA, {"ml/rogue": (3,)})
    clock.now += GRACE_SECONDS
    _report(state, PLUGIN, {"ml/train": (0, 1)})
    _report(state, DRA, {"ml/rogue": (3,)})
    assert set(state.dra_unclaimed()) == {DRA}
    clock.now += state.stale_after + 1  # the DRA node's agent died: the node is unknown, its report no evidence
    assert state.dra_unclaimed() == {}
    state.claims.apply("ADDED", allocated_claim("c1", DRA, ["gpu-0"], pods=["p1"]))
    assert state.claim_check.mismatched() == {}, "a claim event on a stale node forgets its check"
