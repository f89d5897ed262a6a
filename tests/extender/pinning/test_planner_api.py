"""The planner against the in-process API server through the real client: the template comes by its watch, the
pinned claim is POSTed and seen back by the claims' watch, and a delete at an old resourceVersion is refused (409),
as kube-apiserver refuses it when kube-scheduler allocated the claim meanwhile."""

from __future__ import annotations

import pytest
from helpers.dra_board import CROSSED, dra_cluster, template, uuids
from helpers.kube_api_server import CLAIMS, TEMPLATES, FakeKubeApiServer, kube_server_fixture, wait_until
from kubernetes import client as k8s

from extender.api.dra import parse_claim
from extender.demo.dra_objects import allocated_claim
from extender.kube.client import KubeError, KubernetesApi
from extender.kube.reflector import Reflector, Tee
from extender.pinning.planner import PinPlanner
from topology.select import Selector

__all__ = ["kube_server_fixture"]
NVLINK_PAIRS = ({0, 1}, {2, 3}, {4, 5}, {6, 7})


def test_a_pinned_claim_is_made_through_the_api_and_an_allocated_one_cannot_be_deleted(
        kube_server: FakeKubeApiServer) -> None:
    state = dra_cluster({"a": CROSSED})
    api = KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), timeout=5.0)
    planner = PinPlanner(state, Selector(), api, state.keys, state.clock)
    kube_server.put(TEMPLATES, template())
    kube_server.add_node({"metadata": {"name": "a"}, "spec": {}})
    kube_server.add_pod({"metadata": {"name": "train", "namespace": "ml",
                                      "annotations": {"gpu-topology.io/claim-templates": "gpus=two-gpus"}},
                         "spec": {"containers": [{"name": "c"}],
                                  "resourceClaims": [{"name": "gpus", "resourceClaimName": "train-gpus-x7k2p"}]},
                         "status": {"phase": "Pending"}})
    reflectors = [
        Reflector(api.list_resource_claim_templates, api.watch_resource_claim_templates, state.templates, name="t"),
        Reflector(api.list_resource_claims, api.watch_resource_claims, state.claims, name="claims"),
        Reflector(api.list_nodes, api.watch_nodes, planner.nodes, name="nodes"),  # the state has its reported nodes
        Reflector(api.list_pods, api.watch_pods, Tee(state.pods, planner.pods), name="pods")]
    for reflector in reflectors:
        reflector.start()
    try:
        wait_until(lambda: state.dra.template("ml", "two-gpus") is not None, what="the template")
        wait_until(lambda: (planner.tick(), state.dra.claim_state("ml", "train-gpus-x7k2p"))[1] is not None,
                   what="the claim made and seen back")
        made = kube_server._get(CLAIMS, ("ml", "train-gpus-x7k2p"))
        pinned = parse_claim(made).requests[0].pinned
        assert {uuids("a").index(gpu) for gpu in pinned} in NVLINK_PAIRS
        # kube-scheduler allocates it: its resourceVersion moves on, and the planner's delete would be refused.
        allocated = allocated_claim("x", "a", sorted(f"gpu-{uuids('a').index(gpu)}" for gpu in pinned))
        kube_server.put(CLAIMS, {**made, "status": allocated["status"]})
        with pytest.raises(KubeError) as refused:
            api.delete_resource_claim("ml", "train-gpus-x7k2p", made["metadata"]["uid"],
                                      made["metadata"]["resourceVersion"])
        assert refused.value.status == 409
        with pytest.raises(KubeError) as taken:
            api.create_resource_claim("ml", made)
        assert taken.value.status == 409
    finally:
        for reflector in reflectors:
            assert reflector.stop(15)
