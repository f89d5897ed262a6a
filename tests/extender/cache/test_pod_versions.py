"""A pod's new version is parsed again only where it changes what the parse reads (pod_request.parse_inputs): the
watch delivers a version for its Binding and each status update, and most change none of it."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from extender.api import pod_request
from extender.cache import cluster_state as cluster_state_module
from extender.cache.cluster_state import ClusterState
from topology.annotations import AnnotationKeys

KEYS = AnnotationKeys()


def _pod(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u1", "resourceVersion": "1",
                         "annotations": dict(annotations), "labels": {"app": "train"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}],
                     "tolerations": [{"key": "k", "operator": "Exists", "effect": "PreferNoSchedule"}]},
            "status": {"phase": "Pending"}}


def _next(pod: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    newer = copy.deepcopy(pod)
    newer["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
    change(newer)
    return newer


@pytest.fixture
def parsed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = pod_request.parse_pod

    def counting(pod, *args):
        calls.append(pod["metadata"]["resourceVersion"])
        return real(pod, *args)

    monkeypatch.setattr(cluster_state_module, "parse_pod", counting)
    return calls


def _bound(pod: dict[str, Any]) -> None:
    pod["spec"]["nodeName"] = "n1"
    pod["metadata"]["annotations"].update({KEYS.gpus: "GPU-a,GPU-b", KEYS.containers: "c=GPU-a,GPU-b",
                                           KEYS.seal: "mac", KEYS.ring_bandwidth: "400"})


def _running(pod: dict[str, Any]) -> None:
    pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}


def test_a_binding_and_status_updates_reuse_the_parse(parsed: list[str]) -> None:
    state = ClusterState()
    first = _pod(**{KEYS.topology_wait: "30"})
    state.pods.apply("ADDED", first)
    request = state.pod("u1").request
    bound = _next(first, _bound)
    running = _next(bound, _running)
    for pod in (bound, running):
        state.pods.apply("MODIFIED", pod)
    assert parsed == ["1"]
    record = state.pod("u1")
    assert record.request is request and record.node == "n1" and record.version == "3"
    assert state.parsed("u1", "3") is request


@pytest.mark.parametrize("change", [
    lambda pod: pod["metadata"]["annotations"].update({KEYS.topology_wait: "45"}),
    lambda pod: pod["metadata"]["labels"].update({"pod-group.scheduling.sigs.k8s.io": "g"}),
    lambda pod: pod["metadata"].update({"ownerReferences": [{"kind": "ReplicaSet", "name": "r", "uid": "o"}]}),
    lambda pod: pod["spec"]["tolerations"].append({"key": "other", "operator": "Exists"}),
    lambda pod: pod["spec"].update({"activeDeadlineSeconds": 600}),
], ids=["annotation", "label", "owner", "toleration", "deadline"])
def test_a_change_the_parse_reads_is_parsed_again(parsed: list[str], change: Callable[[dict], None]) -> None:
    state = ClusterState()
    first = _pod()
    state.pods.apply("ADDED", first)
    newer = _next(first, change)
    state.pods.apply("MODIFIED", newer)
    assert len(parsed) == 2
    assert state.pod("u1").request == pod_request.parse_pod(newer, KEYS)


def test_a_version_of_another_shape_is_parsed_again(parsed: list[str]) -> None:
    """A resourceVersion the API server would not write makes a problem of the pod, which the parse finds."""
    state = ClusterState()
    first = _pod()
    state.pods.apply("ADDED", first)
    state.pods.apply("MODIFIED", _next(first, lambda pod: pod["metadata"].update({"resourceVersion": "9" * 65})))
    assert parsed == ["1", "9" * 65]


def test_a_pod_with_resource_claims_is_always_parsed(parsed: list[str]) -> None:
    state = ClusterState()
    first = _pod()
    first["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "claim-1"}]
    state.pods.apply("ADDED", first)
    state.pods.apply("MODIFIED", _next(first, _running))
    assert parsed == ["1", "2"]


def test_the_fingerprint_is_none_where_the_pod_cannot_be_read_alike() -> None:
    assert pod_request.parse_inputs({"metadata": {}, "spec": []}, KEYS) is None
    assert pod_request.parse_inputs({"metadata": {}, "spec": {1: "not a JSON key"}}, KEYS) is None


def test_a_pod_that_asks_no_gpu_is_parsed_and_never_fingerprinted(parsed: list[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """It is not kept, so there is no version to compare with: most of a cluster's pods ask no GPU."""
    fingerprinted: list[str] = []
    real = pod_request.parse_inputs
    monkeypatch.setattr(cluster_state_module, "parse_inputs",
                        lambda pod, keys: fingerprinted.append(pod["metadata"]["resourceVersion"]) or real(pod, keys))
    state = ClusterState()
    first = _pod()
    first["spec"]["containers"][0]["resources"] = {}
    state.pods.apply("ADDED", first)
    state.pods.apply("MODIFIED", _next(first, _running))
    assert parsed == ["1", "2"] and fingerprinted == [] and state.pod("u1") is None
