"""A Binding the API server refuses 409: only a pod bound here with our own assignment is ours (bind.py).

Each test fails on a mutant of extender/verbs/bind.py that survived `make mutate` (BENCHMARKS.md): a 409 read as
ours when another scheduler bound the pod, and a 409 whose pod cannot be read taken as committed or forgotten.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from extender.api.wire import BindingArgs
from extender.cache.cluster_state import ClusterState
from extender.cache.ledger import Phase
from extender.demo.cluster import DemoCluster
from extender.kube.client import KubeError
from extender.verbs.service import ExtenderService


class _UnreadableAfterConflict(DemoCluster):
    """The API server refuses the Binding, then cannot be read (the GET after the 409 fails)."""

    unreadable = False

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if self.unreadable:
            raise KubeError("the API server is unreachable", None)
        return super().get_pod(namespace, name)


def _service(cluster_type: type[DemoCluster] = DemoCluster) -> tuple[ClusterState, DemoCluster, ExtenderService]:
    state = ClusterState()
    cluster = cluster_type(state, (("n1", "dgx-h100"), ("n2", "dgx-h100")))
    return state, cluster, ExtenderService(state, cluster)


def _bind(service: ExtenderService, pod: dict, node: str) -> str:
    metadata = pod["metadata"]
    return service.bind(BindingArgs(metadata["name"], metadata["namespace"], metadata["uid"], node))


def _bound_by_another_scheduler(cluster: DemoCluster, service: ExtenderService, name: str, gpus: int,
                                node: str) -> dict:
    """A pod in the watch that another scheduler has bound to `node` (a plain Binding, none of our annotations)
    before our bind posts its own."""
    pod = cluster.create_pod(name, gpus)
    service.pod_request(pod)
    metadata = pod["metadata"]
    cluster.bind(metadata["namespace"], metadata["name"], metadata["uid"], node, {})
    return pod


def test_a_pod_another_scheduler_bound_here_is_not_taken_for_ours() -> None:
    """Bound to this very node, but without our assignment: the 409 is a refusal, and the GPUs we reserved go
    back. Taken for ours, the ledger would hold GPUs the kubelet never gives the pod, and miss those it does."""
    state, cluster, service = _service()
    pod = _bound_by_another_scheduler(cluster, service, "taken", 2, "n1")
    answer = _bind(service, pod, "n1")
    assert "conflicted" in answer, answer
    assert state.ledger.get(pod["metadata"]["uid"]) is None
    assert state.view("n1").free.bit_count() == 6, "the 2 GPUs the kubelet gave it, as the node reports them"


def test_a_plain_pod_bound_elsewhere_is_not_bound_here() -> None:
    """A pod without GPUs gets a plain Binding; after its 409 the pod read back is ours only with our UID on this
    node. Bound to another node meanwhile, the bind fails: kube-scheduler must not believe it placed the pod."""
    state, cluster, service = _service()
    elsewhere = _bound_by_another_scheduler(cluster, service, "elsewhere", 0, "n2")
    answer = _bind(service, elsewhere, "n1")
    assert "conflicted" in answer, answer


def test_a_conflict_whose_pod_cannot_be_read_keeps_the_gpus_reserved_as_uncertain() -> None:
    """The 409 may hide our own earlier Binding: unable to read the pod, bind fails but keeps the reservation
    UNCERTAIN, for the watch or the wait to settle. Not a success, and not a reservation left BINDING forever."""
    state, cluster, service = _service(_UnreadableAfterConflict)
    pod = _bound_by_another_scheduler(cluster, service, "unread", 4, "n1")
    cluster.unreadable = True
    answer = _bind(service, pod, "n1")
    assert "conflicted" in answer, answer
    entry = state.ledger.get(pod["metadata"]["uid"])
    assert entry is not None and entry.phase is Phase.UNCERTAIN and len(entry.gpus) == 4


class _LostAnswer(DemoCluster):
    """A Binding that commits on the API server while its answer and the watch's event are lost, for the pods named
    in `lose`; the others bind as usual."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lose: set[str] = set()
        self.commit = True  # False: the lost Binding did not commit either

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        if name not in self.lose:
            return super().bind(namespace, name, uid, node, annotations)
        self.lose.discard(name)
        if self.commit:
            with self._lock:
                pod = self._find(namespace, name)
                pod["spec"]["nodeName"] = node
                pod["metadata"].setdefault("annotations", {}).update(annotations)
                self._bump(pod)
        raise KubeError("connection reset by peer", None)


def _lost_on_n1(name: str, gpus: int, committed: bool) -> tuple[ClusterState, _LostAnswer, ExtenderService, dict]:
    """A pod whose first Binding, to n1, lost its answer (having committed or not): its GPUs held UNCERTAIN."""
    state = ClusterState()
    cluster = _LostAnswer(state, (("n1", "dgx-h100"), ("n2", "dgx-h100")))
    service = ExtenderService(state, cluster)
    pod = cluster.create_pod(name, gpus)
    service.pod_request(pod)
    cluster.lose.add(name)
    cluster.commit = committed
    assert "outcome is unknown" in _bind(service, pod, "n1")
    assert state.ledger.get(pod["metadata"]["uid"]).phase is Phase.UNCERTAIN
    return state, cluster, service, pod


@pytest.mark.parametrize("committed", [True, False])
def test_a_retry_on_another_node_reads_where_the_lost_binding_went(committed: bool) -> None:
    """kube-scheduler retries a pod on another node while its first Binding's outcome is unknown (its GPUs held
    UNCERTAIN on the first). The bind reads the pod: bound to the first node, it fails and the first node's GPUs
    stay the pod's (BOUND), since it runs there; not bound, the first reservation goes and the retry binds."""
    state, cluster, service, pod = _lost_on_n1("retried", 4, committed)
    uid = pod["metadata"]["uid"]
    answer = _bind(service, pod, "n2")
    entry = state.ledger.get(uid)
    if committed:
        assert "already bound to n1" in answer, answer
        assert entry.node == "n1" and entry.phase is Phase.BOUND and len(entry.gpus) == 4
        assert state.view("n1").free.bit_count() == 4 and state.view("n2").free.bit_count() == 8
    else:
        assert answer == "", answer
        assert entry.node == "n2" and state.view("n1").free.bit_count() == 8


@pytest.mark.parametrize("committed", [False, True])
def test_a_lost_answer_retried_on_the_same_node_posts_the_binding_again_with_the_same_gpus(committed: bool) -> None:
    """kube-scheduler retries on the node it chose: the bind sends the Binding again with the GPUs already held
    (UNCERTAIN), never answering success without one. Had the first committed, the API server refuses the second
    409, and the pod, read back, is ours with that assignment: bound either way, on the same GPUs."""
    state, cluster, service, pod = _lost_on_n1("resent", 2, committed)
    uid = pod["metadata"]["uid"]
    held = state.ledger.get(uid).gpus
    assert _bind(service, pod, "n1") == ""
    stored = cluster.get_pod("default", "resent")
    assert stored["spec"]["nodeName"] == "n1"
    assert frozenset(stored["metadata"]["annotations"]["gpu-topology.io/gpus"].split(",")) == held
    entry = state.ledger.get(uid)
    assert entry.gpus == held and entry.phase in (Phase.BOUND, Phase.ALLOCATED)
    assert state.view("n1").free.bit_count() == 6


def test_a_pod_that_requires_nvlink_is_never_bound_to_gpus_without_it() -> None:
    """A bind that races filter (the node changed since) finds no free NVLink pair for a pod that requires one:
    it fails. Only a pod that merely prefers NVLink falls back to the best set without it. RTX A6000 boards bridge
    GPUs in pairs; one GPU of each pair is taken."""
    state = ClusterState()
    cluster = DemoCluster(state, (("pairs", "rtx-a6000-pairs"),))
    service = ExtenderService(state, cluster)
    ids = [gpu.uuid for gpu in cluster.topologies["pairs"].gpus]
    state.ledger.reserve("other-uid", "default/other", "pairs", frozenset(ids[i] for i in (0, 2, 4, 6)))
    required = cluster.create_pod("required", 2, {"gpu-topology.io/interconnect": "nvlink",
                                                 "gpu-topology.io/placement": "required"})
    preferred = cluster.create_pod("preferred", 2, {"gpu-topology.io/interconnect": "nvlink"})
    for pod in (required, preferred):
        service.pod_request(pod)
    assert _bind(service, required, "pairs").startswith("node pairs:")
    assert state.ledger.get(required["metadata"]["uid"]) is None
    assert _bind(service, preferred, "pairs") == ""
    assert len(state.ledger.get(preferred["metadata"]["uid"]).gpus) == 2
