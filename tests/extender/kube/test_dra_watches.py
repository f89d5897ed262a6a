"""DRA's objects reach the cluster state through the official client and the reflectors, as from kube-apiserver:
the GPUs a claim holds on a DRA node leave its free mask, and readiness waits for both lists."""

from __future__ import annotations

from extender.demo.dra_objects import allocated_claim, gpu_slice
from helpers.kube_api_server import CLAIMS, SLICES, FakeKubeApiServer, kube_server_fixture, wait_until
from helpers.reported_nodes import reported_cluster
from kubernetes import client as k8s

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import with_uuids
from extender.kube.client import KubernetesApi
from extender.kube.reflector import Reflector
from topology.platforms import PLATFORMS

__all__ = ["kube_server_fixture"]
NODE = "a6000-dra"


def _free(state: ClusterState) -> int:
    view = state.view(NODE)
    assert view is not None
    return view.free.bit_count()


def test_slices_and_claims_are_followed_and_the_state_is_ready_only_once_both_are_listed(
        kube_server: FakeKubeApiServer) -> None:
    uuids = [gpu.uuid or "" for gpu in with_uuids(NODE, PLATFORMS["rtx-a6000-pairs"].topology()).gpus]
    kube_server.put(SLICES, gpu_slice(NODE, uuids, seed=2))
    kube_server.put(CLAIMS, allocated_claim("c1", NODE, ["gpu-2", "gpu-6"], pods=["p1"]))
    state = reported_cluster({NODE: ("rtx-a6000-pairs", ())})
    state.watch_dra()
    assert not state.ready
    api = KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), timeout=5.0)
    reflectors = [Reflector(api.list_resource_slices, api.watch_resource_slices, state.slices, name="slices"),
                  Reflector(api.list_resource_claims, api.watch_resource_claims, state.claims, name="claims")]
    for reflector in reflectors:
        reflector.start()
    try:
        wait_until(lambda: state.ready, what="both DRA lists")
        assert _free(state) == 6
        claim = allocated_claim("c2", NODE, ["gpu-0"])
        kube_server.put(CLAIMS, claim)
        wait_until(lambda: _free(state) == 5, what="the new claim")
        kube_server.delete(CLAIMS, "ml", "claim-c1")
        wait_until(lambda: _free(state) == 7, what="the deleted claim")
        kube_server.put(SLICES, gpu_slice(NODE, uuids[:4], seed=2, generation=2))  # GPUs 4-7 unpublished
        wait_until(lambda: _free(state) == 3, what="the new generation")
    finally:
        for reflector in reflectors:
            assert reflector.stop(15)
