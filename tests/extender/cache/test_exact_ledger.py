"""The ledger counts what we decided and what the kubelet did, never what a user wrote (DESIGN §2, Exactness).

One test per hole found in the ledger: capacity counted twice with the stock device plugin, GPUs squatted
through a user-written annotation, a Binding whose lost answer released GPUs the API server had committed,
a stale bind that wrote on a recreated pod of the same name, and a bind that trusted a forged filter body.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timezone

import kubernetes.client as k8s
import orjson
import pytest

from extender.api.wire import BindingArgs, parse_extender_args
from extender.cache.cluster_state import ClusterState
from extender.cache.ledger import Ledger, Phase
from extender.demo.cluster import DemoCluster, with_uuids
from extender.kube.client import KubernetesApi
from extender.kube.reflector import Reflector
from extender.verbs.service import ExtenderService
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, make_node, make_pod, wait_until
from topology.codec import NodeState, encode_state, encode_topology
from topology.platforms import PLATFORMS

__all__ = ["kube_server_fixture"]


def _demo(platform: str) -> tuple[ClusterState, DemoCluster, ExtenderService]:
    state = ClusterState()
    cluster = DemoCluster(state, (("n1", platform),))
    return state, cluster, ExtenderService(state, cluster)


def _bind(service: ExtenderService, pod: dict, node: str = "n1") -> str:
    metadata = pod["metadata"]
    return service.bind(BindingArgs(metadata["name"], metadata["namespace"], metadata["uid"], node))


def _report(cluster: DemoCluster, state: ClusterState, pods: dict[str, list[int]], at: float) -> None:
    """The node agent's report: pod-resources says these pods hold these GPU indices."""
    ids = [gpu.uuid for gpu in cluster.topologies["n1"].gpus]
    held = {key: frozenset(ids[i] for i in gpus) for key, gpus in pods.items()}
    node = cluster.list_nodes()[0][0]
    report = NodeState(frozenset().union(*held.values()), frozenset(), datetime.fromtimestamp(at, timezone.utc), 50,
                       held)
    node["metadata"]["annotations"]["gpu-topology.io/state"] = encode_state(report)
    state.nodes.apply("MODIFIED", node)


def _indices(state: ClusterState, mask: int) -> set[int]:
    return {i for i in range(state.view("n1").size) if mask >> i & 1}


def test_what_the_kubelet_allocated_replaces_the_reservation() -> None:
    """Scheduling only, with a device plugin that ignores us: the kubelet gave 3,4,5,7 where we bound 0-3."""
    state, cluster, service = _demo("rtx-a6000-pairs")
    first = cluster.create_pod("first", 4)
    assert _bind(service, first) == ""
    assert _indices(state, state.view("n1").free) == {4, 5, 6, 7}
    _report(cluster, state, {"default/first": [3, 4, 5, 7]}, time.time() + 0.01)
    assert _indices(state, state.view("n1").free) == {0, 1, 2, 6}, "never the union of both"
    entry = state.ledger.get(first["metadata"]["uid"])
    assert entry.phase is Phase.ALLOCATED and len(entry.gpus) == 4
    assert service.metrics.mismatches.labels("n1")._value.get() == 1
    wait_until(lambda: any(event[2] == "GPUAllocationMismatch" for event in cluster.events), what="the Event")
    # The next NVLink pod is placed on the free bridge pair 0-1, not left Pending.
    pair = cluster.create_pod("pair", 2, {"gpu-topology.io/interconnect": "nvlink",
                                          "gpu-topology.io/placement": "required"})
    outcome = service.filter(parse_extender_args(orjson.dumps({"Pod": pair, "NodeNames": ["n1"]})))
    assert outcome.passed == ["n1"], outcome.reasons()
    assert _bind(service, pair) == ""
    held = cluster.pods[pair["metadata"]["uid"]]["metadata"]["annotations"]["gpu-topology.io/gpus"].split(",")
    assert _indices(state, state.view("n1").mask(held)) == {0, 1}


def test_a_user_written_gpus_annotation_holds_nothing() -> None:
    state, cluster, service = _demo("dgx-h100")
    everything = ",".join(gpu.uuid for gpu in cluster.topologies["n1"].gpus)
    squatter = cluster.create_pod("squatter", 1, {"gpu-topology.io/gpus": everything})
    squatter = {**squatter, "spec": {**squatter["spec"], "nodeName": "n1"}}  # created bound, past the scheduler
    state.pods.apply("MODIFIED", squatter)
    assert state.view("n1").free.bit_count() == 8
    assert state.ledger.get(squatter["metadata"]["uid"]) is None
    # Editing one's own bound pod's annotation changes nothing either.
    ours = cluster.create_pod("ours", 2)
    assert _bind(service, ours) == ""
    edited = cluster.pods[ours["metadata"]["uid"]]
    edited["metadata"]["annotations"]["gpu-topology.io/gpus"] = everything
    state.pods.apply("MODIFIED", edited)
    assert state.view("n1").free.bit_count() == 6
    assert len(state.ledger.get(ours["metadata"]["uid"]).gpus) == 2


def test_a_bind_uses_the_watched_pod_not_a_forged_filter_body() -> None:
    state, cluster, service = _demo("dgx-h100")
    real = cluster.create_pod("real", 1)
    forged = {**real, "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    service.filter(parse_extender_args(orjson.dumps({"Pod": forged, "NodeNames": ["n1"]})))
    assert _bind(service, real) == ""
    annotations = cluster.pods[real["metadata"]["uid"]]["metadata"]["annotations"]
    assert len(annotations["gpu-topology.io/gpus"].split(",")) == 1
    assert state.view("n1").free.bit_count() == 7


# -- against the in-process API server, through the real client ---------------------------------------------

TOPOLOGY = with_uuids("gpu-1", PLATFORMS["dgx-h100"].topology())


@pytest.fixture
def extender(kube_server: FakeKubeApiServer) -> Iterator[tuple[ExtenderService, FakeKubeApiServer]]:
    report = NodeState(frozenset(), frozenset(), datetime.now(timezone.utc), 1)
    kube_server.add_node(make_node("gpu-1", annotations={"gpu-topology.io/topology": encode_topology(TOPOLOGY),
                                                         "gpu-topology.io/state": encode_state(report)}))
    api = KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), timeout=1.0, instance="test")
    state = ClusterState()
    reflectors = [Reflector(api.list_nodes, api.watch_nodes, state.nodes, name="nodes", watch_timeout=5),
                  Reflector(api.list_pods, api.watch_pods, state.pods, name="pods", watch_timeout=5)]
    for reflector in reflectors:
        reflector.start()
    wait_until(lambda: state.ready, what="the first lists")
    try:
        yield ExtenderService(state, api), kube_server
    finally:
        for reflector in reflectors:
            reflector.stop()


def _watched(service: ExtenderService, pod: dict) -> dict:
    wait_until(lambda: service.state.pod(pod["metadata"]["uid"]) is not None, what="the pod in the watch")
    return pod


@pytest.mark.parametrize("trial", range(3))
def test_a_lost_binding_answer_keeps_the_gpus_until_the_watch_tells(extender, trial: int) -> None:
    service, server = extender
    first = _watched(service, server.add_pod(make_pod(f"first-{trial}", gpus=8)))
    second = _watched(service, server.add_pod(make_pod(f"second-{trial}", gpus=8)))
    server.watch_delay = 0.2  # the Binding commits, its answer is lost, and the watch lags behind
    server.lose("POST", f"/api/v1/namespaces/default/pods/first-{trial}/binding")
    lost = _bind(service, first, "gpu-1")
    assert server.pod("default", f"first-{trial}")["spec"]["nodeName"] == "gpu-1", "the API server committed it"
    assert _bind(service, second, "gpu-1").startswith("node gpu-1: needs 8 GPUs, 0 free"), "never the same GPUs"
    assert "outcome is unknown" in lost
    wait_until(lambda: service.state.ledger.get(first["metadata"]["uid"]).phase is Phase.BOUND,
               what="the watch to show the Binding")
    assert [b["metadata"]["name"] for b in server.bindings] == [f"first-{trial}"]


def test_a_binding_lost_on_a_kept_alive_connection_is_sent_again_and_known_as_ours(extender) -> None:
    """The connection ends after the Binding committed: the writer sends it once more on a new connection, the
    API server refuses that 409, and the pod, read back, is ours on this node: bound, with its GPUs, no second
    Binding and no wait for the watch."""
    service, server = extender
    warm = _watched(service, server.add_pod(make_pod("warm", gpus=1)))
    lost = _watched(service, server.add_pod(make_pod("lost", gpus=4)))
    assert _bind(service, warm, "gpu-1") == ""  # its connection is kept for the next Binding
    server.watch_delay = 0.5
    server.lose("POST", "/api/v1/namespaces/default/pods/lost/binding")
    assert _bind(service, lost, "gpu-1") == ""
    entry = service.state.ledger.get(lost["metadata"]["uid"])
    assert entry.phase is Phase.BOUND and len(entry.gpus) == 4
    assert [b["metadata"]["name"] for b in server.bindings] == ["warm", "lost"]
    assert len([r for r in server.requests if r.path.endswith("/lost/binding")]) == 2


def test_a_stale_bind_never_writes_on_the_recreated_pod(extender) -> None:
    service, server = extender
    old = _watched(service, server.add_pod(make_pod("db-0", gpus=2, uid="old-uid")))
    server.delete_pod("default", "db-0")
    wait_until(lambda: service.state.pod("old-uid") is None, what="the delete in the watch")
    new = _watched(service, server.add_pod(make_pod("db-0", gpus=2, uid="new-uid")))
    assert _bind(service, new, "gpu-1") == ""
    annotations = dict(server.pod("default", "db-0")["metadata"]["annotations"])
    writes = len(server.requests)
    answer = _bind(service, old, "gpu-1")  # kube-scheduler's bind for the pod that no longer exists
    assert "deleted or recreated" in answer
    assert server.pod("default", "db-0")["metadata"]["annotations"] == annotations
    assert all(request.method == "GET" for request in server.requests[writes:])
    assert service.state.view("gpu-1").free.bit_count() == 6
    assert service.state.ledger.get("new-uid").gpus == frozenset(annotations["gpu-topology.io/gpus"].split(","))


def test_a_pending_reservation_whose_gpus_the_kubelet_gave_away_still_counts() -> None:
    """The stock plugin gave the first pod the GPUs reserved for the second, not yet admitted: the second will
    get as many others, so the node must still count both pods' GPUs."""
    state, cluster, service = _demo("rtx-a6000-pairs")
    first, second = cluster.create_pod("first", 2), cluster.create_pod("second", 2)
    assert _bind(service, first) == "" and _bind(service, second) == ""
    seconds = cluster.pods[second["metadata"]["uid"]]["metadata"]["annotations"]["gpu-topology.io/gpus"].split(",")
    taken = sorted(_indices(state, state.view("n1").mask(seconds)))
    _report(cluster, state, {"default/first": taken}, time.time() + 0.01)
    assert state.view("n1").free.bit_count() == 4


# Found by mutation testing (make mutate, BENCHMARKS.md): each fails on the ledger mutant its docstring names.


def test_a_bind_that_did_not_happen_frees_no_gpu_the_kubelet_reports_used() -> None:
    """Its reservation goes, but no release is recorded: the kubelet gave those GPUs to another pod meanwhile
    (a plugin that ignores us), and its report says so. Recorded as released (`release` without `freed`), they
    would count as free past that report, and go to a second pod."""
    state, cluster, service = _demo("rtx-a6000-pairs")
    ids = [gpu.uuid for gpu in cluster.topologies["n1"].gpus]
    state.ledger.reserve("failed-uid", "default/failed", "n1", frozenset(ids[:2]))
    _report(cluster, state, {"default/other": [0, 1]}, time.time() - 1)
    assert _indices(state, state.view("n1").free) == {4, 5, 6, 7}, "the pending reservation counts as 2 more"
    state.ledger.release("failed-uid", freed=False)  # its Binding was refused
    assert state.ledger.get("failed-uid") is None
    assert _indices(state, state.view("n1").free) == {2, 3, 4, 5, 6, 7}, "the other pod's GPUs are not free"
    # A pod that ended frees its GPUs even before a report shows it: that release is recorded.
    state.ledger.reserve("ended-uid", "default/ended", "n1", frozenset(ids[2:4]))
    state.ledger.release("ended-uid", freed=True)
    assert _indices(state, state.view("n1").free) == {2, 3, 4, 5, 6, 7}


def test_a_lost_answer_turns_only_a_binding_in_flight_uncertain() -> None:
    """`uncertain` after a bound pod's answer (a retried POST, the watch first) must not reopen its outcome: an
    UNCERTAIN entry is released by the sweep when the watch does not show the pod placed, and its GPUs given
    again. Nor may it fail for a pod the ledger no longer holds (deleted while its Binding was in flight)."""
    state = ClusterState(bind_outcome_seconds=0.0)  # an UNCERTAIN entry's wait is over at once
    cluster = DemoCluster(state, (("n1", "dgx-h100"),))
    ids = [gpu.uuid for gpu in cluster.topologies["n1"].gpus]
    assignment = state.ledger.reserve("bound-uid", "default/bound", "n1", frozenset(ids[:2]))
    state.ledger.bound(assignment)
    state.ledger.uncertain("bound-uid")
    assert state.ledger.get("bound-uid").phase is Phase.BOUND
    state.ledger.sweep()  # the watch has not shown the pod: an UNCERTAIN entry would be released here
    assert state.ledger.get("bound-uid") is not None
    assert state.view("n1").free.bit_count() == 6
    state.ledger.uncertain("gone-uid")
    assert state.ledger.get("gone-uid") is None


def test_a_deleted_node_takes_its_reservations_with_it() -> None:
    """A node deleted forgets what the ledger held there: registered again under its name, what its report
    shows counts, not reservations of the node that went."""
    state, cluster, service = _demo("dgx-h100")
    pod = cluster.create_pod("first", 2)
    assert _bind(service, pod) == ""
    assert state.view("n1").free.bit_count() == 6
    node = cluster.list_nodes()[0][0]
    state.nodes.apply("DELETED", node)
    assert state.ledger.get(pod["metadata"]["uid"]) is None
    assert state.ledger.entries("n1") == []
    state.nodes.apply("ADDED", node)
    # The pod is still bound there by the API server: its 2 GPUs count once, as the node's report shows them.
    assert state.view("n1").free.bit_count() == 6


def test_an_entry_replaced_on_other_gpus_or_another_node_moves_what_is_taken() -> None:
    """`record` skips recomputing a node only when the new entry holds exactly what the old one did. A plan's
    slot held again (same owner, same time) on other GPUs, then on another node, must free what it held and take
    what it holds now; a skipped recompute would leave the new GPUs free to a second pod."""
    state = ClusterState()
    cluster = DemoCluster(state, (("n1", "dgx-h100"), ("n2", "dgx-h100")))
    ids = [gpu.uuid for gpu in cluster.topologies["n1"].gpus]
    ids2 = [gpu.uuid for gpu in cluster.topologies["n2"].gpus]

    def taken(node: str) -> set[int]:
        view = state.view(node)
        return {i for i in range(view.size) if not view.free >> i & 1}

    state.ledger.hold("slot-0", "plan:default/g", "n1", frozenset(ids[:2]), 100.0)
    assert taken("n1") == {0, 1}
    state.ledger.hold("slot-0", "plan:default/g", "n1", frozenset(ids[2:4]), 100.0)
    assert taken("n1") == {2, 3}
    state.ledger.hold("slot-0", "plan:default/g", "n2", frozenset(ids2[2:4]), 100.0)
    assert taken("n1") == set() and taken("n2") == {2, 3}


@pytest.mark.parametrize("placed", ["n1", None, "n2"])
def test_the_sweep_settles_a_lost_answer_by_where_the_watch_shows_the_pod(placed: str | None) -> None:
    """When the wait for a lost Binding's outcome runs out, the sweep asks the watch: a pod placed on that node was
    bound by it and keeps its GPUs (BOUND); unplaced, or placed elsewhere, it was not, and they come free. Released
    while the pod runs there, they would go to a second pod."""
    state = ClusterState()
    cluster = DemoCluster(state, (("n1", "dgx-h100"),))
    ids = [gpu.uuid for gpu in cluster.topologies["n1"].gpus]
    ledger = Ledger(state, lambda uid: placed if uid == "lost-uid" else None, bind_outcome_seconds=0.0)
    ledger.reserve("lost-uid", "default/lost", "n1", frozenset(ids[:2]))
    ledger.uncertain("lost-uid")
    assert ledger.get("lost-uid").phase is Phase.UNCERTAIN
    ledger.sweep()
    entry = ledger.get("lost-uid")
    if placed == "n1":
        assert entry is not None and entry.phase is Phase.BOUND and entry.gpus == frozenset(ids[:2])
        assert state.view("n1").free.bit_count() == 6
    else:
        assert entry is None and state.view("n1").free.bit_count() == 8


def test_a_release_older_than_the_report_frees_nothing_the_report_shows_used() -> None:
    """A release counts against a report taken before it (the report may still show the ended pod), never against
    one taken after, even one that arrives first (the watch lags): there the GPUs the report shows used are
    another pod's, which took them since."""
    state, cluster, service = _demo("rtx-a6000-pairs")
    ids = [gpu.uuid for gpu in cluster.topologies["n1"].gpus]
    state.ledger.reserve("ended-uid", "default/ended", "n1", frozenset(ids[:2]))
    state.ledger.release("ended-uid", freed=True)  # the pod ended
    _report(cluster, state, {"default/ended": [0, 1]}, time.time() - 60)  # taken before it ended
    assert _indices(state, state.view("n1").free) == set(range(8))
    state.ledger.reserve("late-uid", "default/late", "n1", frozenset(ids[2:4]))
    _report(cluster, state, {"default/next": [2, 3]}, time.time() + 30)  # taken after it ended, came first
    state.ledger.release("late-uid", freed=True)  # the watch shows its end only now
    assert _indices(state, state.view("n1").free) == {0, 1, 4, 5, 6, 7}


def test_a_report_older_than_a_reservation_never_covers_it() -> None:
    """A pod recreated under the same name is reserved other GPUs than its predecessor held: a report taken before
    the reservation, which shows the old pod by that name, must not stand for it. Both sets are taken until a
    newer report shows what the kubelet gave the new pod, and then only that, in the pod's entry too."""
    state, cluster, service = _demo("rtx-a6000-pairs")
    ids = [gpu.uuid for gpu in cluster.topologies["n1"].gpus]
    _report(cluster, state, {"default/db-0": [0, 1]}, time.time() - 60)  # the pod that was deleted
    state.ledger.reserve("new-uid", "default/db-0", "n1", frozenset(ids[4:6]))
    assert _indices(state, state.view("n1").free) == {2, 3, 6, 7}
    _report(cluster, state, {"default/db-0": [4, 7]}, time.time() + 0.01)  # the kubelet gave it 4 and 7
    entry = state.ledger.get("new-uid")
    assert entry.phase is Phase.ALLOCATED and entry.gpus == frozenset({ids[4], ids[7]})
    assert _indices(state, state.view("n1").free) == {0, 1, 2, 3, 5, 6}
