"""The service takes the watch's parse of the very pod version kube-scheduler sends (ClusterState.parsed), and parses
any other version itself: a version the watch has not read yet, or one it read before a change."""

from __future__ import annotations

import copy

import pytest

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.verbs import service as service_module
from extender.verbs.service import ExtenderService


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    parsed: list[str] = []
    real = service_module.parse_pod

    def counting(pod, *args):
        parsed.append(pod["metadata"].get("resourceVersion", ""))
        return real(pod, *args)

    monkeypatch.setattr(service_module, "parse_pod", counting)
    return parsed


def test_the_watchs_parse_of_the_same_version_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClusterState()
    cluster = DemoCluster(state, (("n1", "dgx-h100"),))
    service = ExtenderService(state, cluster)
    parsed = _counted(monkeypatch)
    pod = cluster.create_pod("p", 2, {state.keys.topology_wait: "30"})
    request = service.pod_request(copy.deepcopy(pod))
    assert parsed == [] and request is state.pod(pod["metadata"]["uid"]).request
    assert (request.gpus, request.wait_seconds) == (2, 30.0)


def test_a_version_the_watch_has_not_read_is_parsed_here(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ClusterState()
    cluster = DemoCluster(state, (("n1", "dgx-h100"),))
    service = ExtenderService(state, cluster)
    parsed = _counted(monkeypatch)
    pod = cluster.create_pod("p", 2)
    newer = copy.deepcopy(pod)
    newer["metadata"]["resourceVersion"] = "2"
    newer["metadata"]["annotations"][state.keys.topology_wait] = "45"  # changed where the watch has not seen it
    request = service.pod_request(newer)
    assert parsed == ["2"] and request.wait_seconds == 45.0
    unversioned = copy.deepcopy(pod)
    del unversioned["metadata"]["resourceVersion"]
    service.pod_request(unversioned)
    assert parsed == ["2", ""], "a pod without a version is never matched to the watch's"


def test_a_pod_with_resource_claims_is_parsed_here_as_its_claims_are_now(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch parsed it against the claims as they were then; they change apart from the pod's version."""
    state = ClusterState()
    cluster = DemoCluster(state, (("n1", "dgx-h100"),))
    service = ExtenderService(state, cluster)
    pod = cluster.create_pod("p", 2)
    pod = copy.deepcopy(pod)
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "claim-1"}]
    state.pods.apply("MODIFIED", pod)
    parsed = _counted(monkeypatch)
    service.pod_request(pod)
    assert parsed == [pod["metadata"]["resourceVersion"]]
