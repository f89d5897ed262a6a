"""A pod that asks for GPUs through DRA claims reaches filter and prioritize with its count: its claims' requests
of a GPU class, read from the claims the extender watches (extender/cache/dra_inventory.py)."""

from __future__ import annotations

from typing import Any

import pytest

from extender.api.dra import GPU_DRIVER
from extender.api.wire import BindingArgs, ExtenderArgs
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import NodeKey
from extender.demo.cluster import DemoCluster, with_uuids
from extender.verbs.filter import PINNED_ELSEWHERE, PINNED_TAKEN
from extender.verbs.service import ExtenderService
from extender.demo.dra_objects import allocated_claim, gpu_device, gpu_slice
from helpers.reported_nodes import reported_cluster
from topology.platforms import PLATFORMS

NODES = ["a6000-0", "a6000-1"]


def _service() -> ExtenderService:
    state = reported_cluster({name: ("rtx-a6000-pairs", ()) for name in NODES})
    for name in NODES:
        uuids = [gpu.uuid or "" for gpu in with_uuids(name, PLATFORMS["rtx-a6000-pairs"].topology()).gpus]
        state.slices.apply("ADDED", gpu_slice(name, uuids, seed=7))
    return ExtenderService(state, DemoCluster(ClusterState(), []))


def _claim_pod(version: str = "1", made: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": "train", "namespace": "ml", "uid": "p1", "resourceVersion": version},
            "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]},
            "status": {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "train-gpus-x7k2p"}]
                       if made else []}}


def _template_claim() -> dict[str, Any]:
    claim = allocated_claim("c1", NODES[0], [], pods=[])
    claim["metadata"]["name"] = "train-gpus-x7k2p"
    claim["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    del claim["status"]
    return claim


def test_a_claim_pod_is_placed_by_its_claims_gpus_once_its_claim_is_seen() -> None:
    service = _service()
    # Busy GPUs 1 and 3 of node 0 through another pod's claim: no NVLink pair is left free there.
    service.state.claims.apply("ADDED", allocated_claim("busy", NODES[0], ["gpu-1", "gpu-3", "gpu-5", "gpu-7"]))
    early = service.filter(ExtenderArgs(_claim_pod(), NODES, None))
    assert early.passed == [] and early.unresolvable == {}
    assert early.failed == {"ResourceClaim ml/train-gpus-x7k2p is not seen yet": NODES}  # resolvable: a lag
    service.state.claims.apply("ADDED", _template_claim())
    pod = service.pod_request(_claim_pod())
    assert (pod.gpus, pod.problem) == (2, None)
    outcome = service.filter(ExtenderArgs(_claim_pod(), NODES, None))
    assert outcome.passed == [NODES[1]]  # within its topology wait, only a node with a free NVLink pair passes
    assert list(outcome.failed.values()) == [[NODES[0]]]
    names, scores = service.prioritize(ExtenderArgs(_claim_pod(), NODES, None))
    by_node = dict(zip(names, scores))
    assert by_node[NODES[1]] > by_node[NODES[0]]  # a free NVLink pair only on node 1


def test_a_template_claim_not_made_yet_waits_without_a_warning() -> None:
    service = _service()
    outcome = service.filter(ExtenderArgs(_claim_pod(made=False), NODES, None))
    assert list(outcome.failed) == ["spec.resourceClaims[0]: its claim is not made from its template yet"]
    assert not service._warned


def test_a_dra_node_is_judged_by_the_set_its_allocator_will_pick_not_by_its_best_free_set() -> None:
    state = reported_cluster({name: ("rtx-a6000-pairs", ()) for name in NODES})
    for name, order in zip(NODES, [(0, 5, 1, 2, 3, 4, 6, 7), (4, 5, 0, 1, 2, 3, 6, 7)]):
        uuids = [gpu.uuid or "" for gpu in with_uuids(name, PLATFORMS["rtx-a6000-pairs"].topology()).gpus]
        devices = [gpu_device(i, uuids[i]) for i in order]
        state.slices.apply("ADDED", gpu_slice(name, (), seed=None, devices=devices))
    service = ExtenderService(state, DemoCluster(ClusterState(), []))
    service.state.claims.apply("ADDED", _template_claim())
    # Both nodes have all four NVLink pairs free; kube-scheduler's first fit gives GPUs 0 and 5 (PCIe, across
    # sockets) on node 0, and the pair 4-5 on node 1.
    outcome = service.filter(ExtenderArgs(_claim_pod(), NODES, None))
    assert outcome.passed == [NODES[1]]
    names, scores = service.prioritize(ExtenderArgs(_claim_pod(), NODES, None))
    by_node = dict(zip(names, scores))
    assert by_node[NODES[1]] > by_node[NODES[0]]


class _Binder:
    """Records each Binding and shows the pod bound to the watch, as the API server does."""

    def __init__(self, state: ClusterState, pod: dict[str, Any]) -> None:
        self.state, self.pod, self.bindings = state, pod, []

    def bind_soon(self, *args: Any) -> None:
        return None

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        self.bindings.append((node, dict(annotations)))
        self.pod["spec"]["nodeName"] = node
        self.state.pods.apply("MODIFIED", self.pod)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.pod  # a pod that asks for no GPU is not in the watch's cache: bind reads it from the API

    def emit_event(self, *args: Any, **kwargs: Any) -> None:
        pass


def test_bind_on_a_dra_node_posts_no_gpu_of_ours_and_holds_the_first_fit_until_the_claim_counts_it() -> None:
    service = _service()
    pod = _claim_pod()
    binder = _Binder(service.state, pod)
    service.kube = binder  # type: ignore[assignment]
    service.state.claims.apply("ADDED", _template_claim())
    service.state.pods.apply("ADDED", pod)
    key = service.state.keys_for([NODES[1]])[0]
    assert isinstance(key, NodeKey) and key.order is not None
    first_two = list(key.order[:2])
    assert service.bind(BindingArgs("train", "ml", "p1", NODES[1])) == ""
    assert binder.bindings == [(NODES[1], {})]  # kube-scheduler's allocator chose the GPUs at its PreBind
    view = service.state.view(NODES[1])
    assert view is not None
    held = service.state.ledger.get("p1")
    assert held is not None and held.gpus == {view.ids[gpu] for gpu in first_two}
    # The claim, allocated as predicted and reserved for the pod, is seen: it counts the pod, once.
    allocated = _template_claim()
    allocated["status"] = allocated_claim("c1", NODES[1], [f"gpu-{gpu}" for gpu in first_two], pods=["p1"])["status"]
    service.state.claims.apply("MODIFIED", allocated)
    view = service.state.view(NODES[1])
    assert view is not None and view.free.bit_count() == 6


def test_the_metrics_class_nodes_and_count_what_dra_nodes_have_free() -> None:
    service = _service()
    service.state.slices.apply("ADDED", {"metadata": {"name": "broken"}, "spec": {"driver": GPU_DRIVER}})
    service.state.claims.apply("ADDED", allocated_claim("busy", NODES[0], ["gpu-1", "gpu-3", "gpu-99"]))
    registry = service.metrics.registry
    assert registry.get_sample_value("gpu_topology_extender_nodes_by_class", {"class": "dra-gpu"}) == 2
    assert registry.get_sample_value("gpu_topology_extender_nodes_by_class", {"class": "device-plugin"}) == 0
    assert registry.get_sample_value("gpu_topology_extender_dra_free_gpus") == 16 - 2
    assert registry.get_sample_value("gpu_topology_extender_dra_refused_objects") == 1
    assert registry.get_sample_value("gpu_topology_extender_dra_unknown_devices") == 1


def test_a_pod_whose_claims_ask_no_gpu_passes_every_node_and_is_bound_plainly() -> None:
    service = _service()
    nic = _template_claim()
    nic["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "rdma.example.com"
    service.state.claims.apply("ADDED", nic)
    pod = _claim_pod()
    binder = _Binder(service.state, pod)
    service.kube = binder  # type: ignore[assignment]
    service.state.pods.apply("ADDED", pod)
    assert service.filter(ExtenderArgs(pod, NODES, None)).passed == NODES
    assert service.prioritize(ExtenderArgs(pod, NODES, None))[1] == [0, 0]
    assert service.bind(BindingArgs("train", "ml", "p1", NODES[0])) == ""
    assert binder.bindings == [(NODES[0], {})] and service.state.ledger.get("p1") is None


def test_a_pod_whose_claim_narrows_its_gpus_by_selector_does_not_wait_on_the_first_fit() -> None:
    """A claim with a selector of its own is allocated the first devices its selector allows, not the node's first
    fit: the extender does not compute that pick, so it does not hold the pod back for a full-bandwidth first fit
    (it would for up to --topology-wait on a node the claim alone allows)."""
    service = _service()
    service.state.claims.apply("ADDED", allocated_claim("busy", NODES[0], ["gpu-1", "gpu-3", "gpu-5", "gpu-7"]))
    service.state.claims.apply("ADDED", allocated_claim("busy-1", NODES[1], ["gpu-1", "gpu-3", "gpu-5", "gpu-7"]))
    claim = _template_claim()
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        {"cel": {"expression": "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA RTX A6000'"}}]
    service.state.claims.apply("ADDED", claim)
    assert service.pod_request(_claim_pod()).selected
    assert service.filter(ExtenderArgs(_claim_pod(), NODES, None)).passed == NODES
    plain = _template_claim()
    service.state.claims.apply("MODIFIED", plain)
    assert service.filter(ExtenderArgs(_claim_pod("2"), NODES, None)).passed == []  # no free pair first: it waits


def test_a_pod_whose_claim_pins_gpus_by_uuid_passes_only_the_node_that_has_them_free() -> None:
    service = _service()
    uuids = [gpu.uuid or "" for gpu in with_uuids(NODES[1], PLATFORMS["rtx-a6000-pairs"].topology()).gpus]
    claim = _template_claim()
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": (
        f"device.attributes['gpu.nvidia.com'].uuid in ['{uuids[2]}', '{uuids[3]}']")}}]
    service.state.claims.apply("ADDED", claim)
    assert service.pod_request(_claim_pod()).pinned == {uuids[2], uuids[3]}
    outcome = service.filter(ExtenderArgs(_claim_pod(), NODES, None))
    assert outcome.passed == [NODES[1]] and outcome.unresolvable == {PINNED_ELSEWHERE: [NODES[0]]}
    assert service.prioritize(ExtenderArgs(_claim_pod(), NODES, None))[1] == [0, 10]
    service.state.claims.apply("ADDED", allocated_claim("other", NODES[1], ["gpu-3"]))
    outcome = service.filter(ExtenderArgs(_claim_pod("2"), NODES, None))
    assert outcome.passed == [] and outcome.failed == {PINNED_TAKEN: [NODES[1]]}


@pytest.mark.parametrize("as_predicted", [True, False])
def test_a_claim_given_other_gpus_than_the_first_fit_judged_by_is_counted_at_bind(as_predicted: bool) -> None:
    """The first fit is what filter and prioritize judged the node by; kube-scheduler's in-flight allocations, which
    the extender cannot see, can make its allocator give others. Bind counts that, by node."""
    service = _service()
    pod = _claim_pod()
    service.kube = _Binder(service.state, pod)  # type: ignore[assignment]
    key = service.state.keys_for([NODES[1]])[0]
    assert isinstance(key, NodeKey) and key.order is not None
    gpus = list(key.order[:2]) if as_predicted else list(key.order[2:4])
    allocated = _template_claim()
    allocated["status"] = allocated_claim("c1", NODES[1], [f"gpu-{gpu}" for gpu in gpus], pods=["p1"])["status"]
    service.state.claims.apply("ADDED", allocated)  # allocated at kube-scheduler's PreBind, before our bind
    service.state.pods.apply("ADDED", pod)
    assert service.bind(BindingArgs("train", "ml", "p1", NODES[1])) == ""
    counted = service.metrics.dra_mispredicted.labels(NODES[1])._value.get()
    assert counted == (0 if as_predicted else 1)
    held = service.state.ledger.get("p1")
    view = service.state.view(NODES[1])
    assert held is not None and view is not None and held.gpus == {view.ids[gpu] for gpu in gpus}
