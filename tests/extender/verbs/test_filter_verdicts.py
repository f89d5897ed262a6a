"""filter's verdicts (extender/verbs/filter.py): which nodes pass, which fail for now (FailedNodes: preemption may
help), which can never serve the pod (FailedAndUnresolvableNodes), and the reason kubectl describe shows.

Each test fails on a filter.py mutant that survived `make mutate` (BENCHMARKS.md): a node that cannot give a
required NVLink pair passed, a node too small for the pod offered to preemption, a node that eviction would fix
kept from it, the reason of an interconnect miss misnamed, a waiting pod denied the GPUs drained for it.
"""

from __future__ import annotations

from datetime import datetime, timezone

import orjson

from extender.api.wire import ExtenderArgs, parse_extender_args
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster, with_uuids
from extender.verbs.filter import NOT_ENOUGH_FREE, TOO_SMALL
from extender.verbs.service import ExtenderService
from extender.verbs.wait import WAITING
from helpers.reported_nodes import ManualClock, reported_cluster
from topology.codec import NodeState, encode_state, encode_topology
from topology.platforms import PLATFORMS

NVLINK_REQUIRED = {"gpu-topology.io/interconnect": "nvlink", "gpu-topology.io/placement": "required"}


def test_a_required_nvlink_pod_passes_only_nodes_with_a_free_pair_and_each_other_is_failed_as_it_can_be_fixed() -> None:
    """RTX A6000 boards bridge GPUs in pairs. `split` has one GPU of each pair taken: no free pair now, one after
    evictions (FailedNodes). A pod of more GPUs than a board has can never fit (FailedAndUnresolvableNodes)."""
    state = ClusterState()
    cluster = DemoCluster(state, (("split", "rtx-a6000-pairs"), ("bridged", "rtx-a6000-pairs")))
    # No pod waits for a full-bandwidth set here, and every fit passes.
    service = ExtenderService(state, cluster, topology_wait=0.0, one_best=False)
    ids = [gpu.uuid for gpu in cluster.topologies["split"].gpus]
    state.ledger.reserve("other-uid", "default/other", "split", frozenset(ids[i] for i in (0, 2, 4, 6)))

    def filtered(gpus: int, annotations: dict[str, str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        pod = cluster.create_pod(f"pod-{len(cluster.pods)}", gpus, annotations)
        outcome = service.filter(parse_extender_args(orjson.dumps({"Pod": pod, "NodeNames": ["split", "bridged"]})))
        return (outcome.passed, *outcome.reasons())

    passed, failed, unresolvable = filtered(2, NVLINK_REQUIRED)
    assert passed == ["bridged"]
    assert failed == {"split": "no free NVLink ring of 2 GPUs"} and unresolvable == {}
    assert filtered(2, {})[0] == ["split", "bridged"], "a pod that requires nothing takes any two"
    passed, failed, unresolvable = filtered(16, {})
    assert passed == [] and failed == {} and unresolvable == {"split": TOO_SMALL, "bridged": TOO_SMALL}


def _pod(uid: str, gpus: int) -> dict:
    return {"metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_a_waiting_pod_passes_on_the_gpus_drained_for_it_and_no_other_pod_does() -> None:
    """On the PCIe L40S board a socket is GPUs 0-3 or 4-7. GPUs 0, 1, 2 and 7 busy: the 4-GPU pod waits, and
    socket 4-7 is drained for it. Once GPU 7 is free, that socket passes for that pod, and for no other."""
    clock = ManualClock()
    state = reported_cluster({"a": ("pcie-l40s", (0, 1, 2, 7))}, clock=clock, stale_after=1e6)
    service = ExtenderService(state, DemoCluster(ClusterState(), []), topology_wait=300.0, one_best=False)
    assert service.filter(ExtenderArgs(_pod("train", 4), ["a"], None)).failed == {WAITING: ["a"]}
    topology = with_uuids("a", PLATFORMS["pcie-l40s"].topology())
    report = NodeState(frozenset(topology.gpus[i].uuid for i in (0, 1, 2)), frozenset(),
                       datetime.fromtimestamp(clock(), timezone.utc), 2)
    state.nodes.apply("MODIFIED", {"metadata": {"name": "a", "labels": {}, "annotations": {
        state.keys.topology: encode_topology(topology), state.keys.state: encode_state(report)}}})
    assert service.filter(ExtenderArgs(_pod("train", 4), ["a"], None)).passed == ["a"]
    assert service.filter(ExtenderArgs(_pod("other", 4), ["a"], None)).failed == {NOT_ENOUGH_FREE: ["a"]}
