"""Nodes that share their GPUs (topology/sharing.py): time-slicing, MPS, MIG single and mixed, from GPU feature
discovery's labels or the node agent's observation of replica and MIG device ids. Unconstrained pods are placed
there as kube-scheduler alone would place them; pods that require topology get a short, stable reason; the
ledger never turns a replica into a whole GPU."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import pytest

from extender.api.pod_request import PodRequest, parse_pod
from extender.api.wire import BindingArgs, Victims
from extender.cache.cluster_state import ClusterState, NodeKey, SharedKey
from extender.demo.cluster import single_gpu, with_uuids
from extender.demo.shared import run_shared_demo
from extender.groups.plans import GroupPlans
from extender.verbs.bind import BindError, Bound, begin_bind
from extender.verbs.filter import filter_nodes
from extender.verbs.metrics import Metrics
from extender.verbs.preempt import preempt_nodes
from extender.verbs.scoring import prioritize_nodes
from extender.verbs.wait import WaitClock
from helpers.reported_nodes import ManualClock, reported_cluster
from topology.agent.devices import ContainerDevices, GpuIds, KubeletDevices, Unknown, observe
from topology.codec import NodeState, encode_state, encode_topology
from topology.select import Selector
from topology.sharing import Sharing, combine, from_labels, no_guarantee

TIME_SLICED = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4",
               "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED", "nvidia.com/mig.strategy": "single"}
MPS = {"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "2"}
MIG_SINGLE = {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
              "nvidia.com/mig.capable": "true"}
MIG_MIXED = {"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.count": "7",
             "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}
WHOLE = {"nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.replicas": "1",
         "nvidia.com/mig.strategy": "single", "nvidia.com/mig.capable": "false",
         "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
NVLINK = {"gpu-topology.io/interconnect": "nvlink", "gpu-topology.io/placement": "required"}

# Each mode as the extender learns it: (labels, the agent's observation) -> the node's sharing.
MODES = [
    (TIME_SLICED, Sharing.NONE, Sharing.TIME_SLICING),
    (MPS, Sharing.REPLICAS, Sharing.MPS),  # both say shared: the label names the kind
    (MIG_SINGLE, Sharing.NONE, Sharing.MIG_SINGLE),
    (MIG_MIXED, Sharing.MIG, Sharing.MIG_MIXED),
    (WHOLE, Sharing.REPLICAS, Sharing.REPLICAS),  # labels say none, the kubelet hands out replicas: shared
    ({}, Sharing.MIG, Sharing.MIG),  # no GFD at all: the agent's observation alone
]


def test_gfd_labels_name_the_sharing_mode() -> None:
    assert from_labels(TIME_SLICED) is Sharing.TIME_SLICING
    assert from_labels(MPS) is Sharing.MPS
    assert from_labels(MIG_SINGLE) is Sharing.MIG_SINGLE
    assert from_labels(MIG_MIXED) is Sharing.MIG_MIXED
    # GFD sets mig.strategy on nodes without MIG too: alone it says nothing.
    assert from_labels(WHOLE) is Sharing.NONE
    assert from_labels({**MIG_MIXED, "nvidia.com/mig-1g.5gb.count": "0"}) is Sharing.NONE
    assert from_labels({"nvidia.com/gpu.sharing-strategy": "x" * 1000}) is Sharing.NONE  # not a label value
    assert combine(Sharing.NONE, Sharing.NONE) is Sharing.NONE


def _cluster(labels: Mapping[str, str], observed: Sharing) -> ClusterState:
    clock = ManualClock()
    return reported_cluster({"shared": ("dgx-h100", (0,)), "whole": ("rtx-a6000-pairs", (0, 1, 2, 3, 4, 5))},
                            clock=clock, stale_after=1e9, labels={"shared": labels}, observed={"shared": observed})


def _pod(state: ClusterState, gpus: int, annotations: Mapping[str, str] | None = None, uid: str = "u1") -> PodRequest:
    return parse_pod({"metadata": {"name": f"p-{uid}", "namespace": "ml", "uid": uid,
                                   "annotations": dict(annotations or {})},
                      "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}},
                     state.keys)


@pytest.mark.parametrize(("labels", "observed", "sharing"), MODES)
def test_unconstrained_pods_pass_and_required_ones_get_the_stable_reason(
        labels: Mapping[str, str], observed: Sharing, sharing: Sharing) -> None:
    state = _cluster(labels, observed)
    assert state.keys_for(["shared"]) == [SharedKey(sharing)]
    assert isinstance(state.keys_for(["whole"])[0], NodeKey)  # the whole-GPU node keeps its topology
    wait = WaitClock(600)
    plain = filter_nodes(state, Selector(), _pod(state, 2), ["shared", "whole"], wait=wait)
    # Neither blocked nor held back by the topology wait on the shared node; the A6000 node has its pair 6-7.
    assert plain.passed == ["shared", "whole"]
    required = filter_nodes(state, Selector(), _pod(state, 2, NVLINK, uid="u2"), ["shared", "whole"], wait=wait)
    assert required.passed == ["whole"]
    assert required.unresolvable == {f"GPUs on this node are shared ({sharing.value}): no topology guarantee":
                                     ["shared"]}
    assert no_guarantee(sharing) in required.unresolvable


@pytest.mark.parametrize(("labels", "observed", "sharing"), MODES[:2])
def test_a_shared_node_scores_level_with_the_best_whole_gpu_node(
        labels: Mapping[str, str], observed: Sharing, sharing: Sharing) -> None:
    state = _cluster(labels, observed)
    shared, whole = prioritize_nodes(state, Selector(), _pod(state, 2), ["shared", "whole"])
    assert shared == whole > 0
    assert prioritize_nodes(state, Selector(), _pod(state, 2), ["shared"]) == [10]
    # A pod that prefers NVLink (not required) may land there by count, but the shared node offers no ring.
    preferred = _pod(state, 2, {"gpu-topology.io/interconnect": "nvlink"}, uid="pref")
    assert prioritize_nodes(state, Selector(), preferred, ["shared", "whole"])[0] == 0


class _Kube:
    """The API server as bind sees it: records Bindings."""

    def __init__(self) -> None:
        self.bindings: list[tuple[str, str, dict[str, str]]] = []

    def bind_soon(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        return None

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        self.bindings.append((name, node, dict(annotations)))

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("bind read the pod from the watch")


def _watched(state: ClusterState, pod: PodRequest, gpus: int, annotations: Mapping[str, str] | None = None) -> None:
    state.pods.apply("ADDED", {"metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid,
                                            "resourceVersion": "1", "annotations": dict(annotations or {})},
                               "spec": {"containers": [{"name": "c", "resources": {
                                   "limits": {"nvidia.com/gpu": str(gpus)}}}]}})


@pytest.mark.parametrize(("labels", "observed", "sharing"), MODES)
def test_bind_on_a_shared_node_is_a_plain_binding_and_holds_no_gpu(
        labels: Mapping[str, str], observed: Sharing, sharing: Sharing) -> None:
    state = _cluster(labels, observed)
    kube = _Kube()
    before = state.view("whole").free
    for uid in ("a", "b", "c"):  # more pods than the node has free whole GPUs of its own: replicas
        pod = _pod(state, 2, uid=uid)
        _watched(state, pod, 2)
        # A shared node's plain Binding is posted before begin_bind returns: nothing is left to post.
        bound = begin_bind(state, GroupPlans(state), Selector(), kube, BindingArgs(pod.name, "ml", uid, "shared"))  # type: ignore[arg-type]
        assert isinstance(bound, Bound) and bound.gpus == () and bound.ring_gbps is None
    assert kube.bindings == [(f"p-{uid}", "shared", {}) for uid in ("a", "b", "c")]
    assert list(state.ledger.entries("shared")) == []  # no replica became a whole GPU
    assert state.view("whole").free == before  # and nothing else moved
    required = _pod(state, 2, NVLINK, uid="r")
    _watched(state, required, 2, NVLINK)
    with pytest.raises(BindError, match="no topology guarantee"):
        begin_bind(state, GroupPlans(state), Selector(), kube, BindingArgs(required.name, "ml", "r", "shared"))  # type: ignore[arg-type]


def test_preemption_keeps_kube_schedulers_victims_on_a_shared_node() -> None:
    state = _cluster(TIME_SLICED, Sharing.REPLICAS)
    victims = {"shared": Victims(("victim-uid",), 1)}
    assert preempt_nodes(state, Selector(), _pod(state, 2), victims) == victims
    assert preempt_nodes(state, Selector(), _pod(state, 2, NVLINK), victims) == {}


def test_a_shared_node_without_a_reporter_is_not_locked_out() -> None:
    """GFD's labels alone mark it shared: kube-scheduler's count decides, no topology is needed."""
    state = ClusterState()
    state.nodes.replace([{"metadata": {"name": "sliced", "labels": TIME_SLICED, "annotations": {}}}])
    state.nodes.synced()
    state.pods.replace([])
    state.pods.synced()
    assert filter_nodes(state, Selector(), _pod(state, 1), ["sliced"]).passed == ["sliced"]


def test_metrics_count_shared_nodes_by_mode() -> None:
    state = _cluster(MIG_MIXED, Sharing.MIG)
    metrics = Metrics(state, GroupPlans(state), leading=lambda: True)
    assert metrics.registry.get_sample_value("gpu_topology_extender_nodes_shared", {"mode": "mig-mixed"}) == 1
    assert metrics.registry.get_sample_value("gpu_topology_extender_nodes_shared", {"mode": "time-slicing"}) == 0


def test_the_demo_places_plain_pods_on_shared_nodes_and_the_ring_pod_on_whole_gpus() -> None:
    lines: list[str] = []
    run_shared_demo(lines.append)
    placed = {line.split()[0]: line for line in lines if " -> " in line}
    assert "-> h100-sliced  plain binding, the kubelet gave GPU-" in placed["notebook"]
    assert "::0" in placed["notebook"]
    assert "-> a6000-whole  GPUs chosen by the extender" in placed["allreduce"]
    assert placed["allreduce"].endswith("; a100-mig refused")  # no reason on the wire: another node passed
    assert "-> a100-mig     plain binding, the kubelet gave MIG-" in placed["batch"]


@pytest.mark.parametrize(("device", "sharing"), [("{uuid}::{n}", Sharing.REPLICAS), ("MIG-{short}-{n}", Sharing.MIG)])
def test_from_pod_resources_ids_to_the_extenders_verdict(device: str, sharing: Sharing) -> None:
    """The agent reads the kubelet's replica or MIG ids (three pods on one GPU's replicas), publishes state v3,
    and the extender places by count there: unconstrained pods pass, required ones get the reason, and the GPU
    the replicas share is held by nobody in the ledger, neither once nor three times."""
    topology = with_uuids("sliced", single_gpu("dgx-h100"))
    uuid = topology.gpus[0].uuid
    ids = [device.format(uuid=uuid, short=uuid[4:12], n=n) for n in range(4)]
    assigned = tuple(ContainerDevices("ml", f"p{n}", "main", "nvidia.com/gpu", (ids[n],)) for n in range(3))
    observation = observe(GpuIds(topology), KubeletDevices(assigned, {"nvidia.com/gpu": tuple(ids)}), {},
                          "nvidia.com/gpu")
    assert not isinstance(observation, Unknown) and observation.sharing is sharing
    state = ClusterState()
    reported = NodeState(observation.used, observation.unhealthy, datetime.now(timezone.utc), 1, observation.pods,
                         observation.sharing)
    state.nodes.replace([{"metadata": {"name": "sliced", "annotations": {
        state.keys.topology: encode_topology(topology), state.keys.state: encode_state(reported)}}}])
    state.nodes.synced()
    state.pods.replace([])
    state.pods.synced()
    assert state.keys_for(["sliced"]) == [SharedKey(sharing)]
    assert filter_nodes(state, Selector(), _pod(state, 1), ["sliced"]).passed == ["sliced"]
    assert filter_nodes(state, Selector(), _pod(state, 1, NVLINK), ["sliced"]).unresolvable == {
        no_guarantee(sharing): ["sliced"]}
    assert list(state.ledger.entries("sliced")) == []
