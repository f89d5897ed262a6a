"""No GPU is ever given twice: parallel binds, restarts, reporter lag; and bad bodies never get a 500."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.api.wire import BindingArgs
from extender.cache.cluster_state import ClusterState
from extender.cache.ledger import Phase
from extender.demo.cluster import DemoCluster
from extender.server.app import create_app
from extender.verbs.service import ExtenderService
from topology.agent.claims import Board
from topology.codec import NodeState, encode_state
from topology.platforms import PLATFORMS
from topology.select import Selector

NODES = (("dgx-a", "dgx-h100"), ("dgx-b", "dgx-h100"), ("v100", "dgx1-v100"), ("a6000", "rtx-a6000-pairs"))


def _cluster(nodes=NODES) -> tuple[ClusterState, DemoCluster, ExtenderService]:
    state = ClusterState()
    cluster = DemoCluster(state, nodes)
    return state, cluster, ExtenderService(state, cluster)


def _args(pod: dict, node: str) -> BindingArgs:
    return BindingArgs(pod["metadata"]["name"], pod["metadata"]["namespace"], pod["metadata"]["uid"], node)


def _assert_no_gpu_twice(cluster: DemoCluster) -> None:
    held: dict[tuple[str, str], str] = {}
    for pod in cluster.pods.values():
        node = pod["spec"].get("nodeName")
        gpus = pod["metadata"].get("annotations", {}).get("gpu-topology.io/gpus")
        if not node or not gpus:
            continue
        for gpu in gpus.split(","):
            assert (node, gpu) not in held, (
                f"{gpu} on {node} given to {held[(node, gpu)]} and {pod['metadata']['name']}")
            held[(node, gpu)] = pod["metadata"]["name"]


def test_parallel_binds_at_overlapping_nodes_never_share_a_gpu() -> None:
    state, cluster, service = _cluster()
    sizes = [1, 2, 4, 8, 1, 2, 1, 4, 2, 1] * 6
    pods = [cluster.create_pod(f"p{i}", size) for i, size in enumerate(sizes)]
    for pod in pods:
        service.pod_request(pod)
    barrier = threading.Barrier(8)

    def bind(indexed: tuple[int, dict]) -> str:
        index, pod = indexed
        if index < 8:
            barrier.wait()
        return service.bind(_args(pod, ("dgx-a", "dgx-b", "v100", "a6000")[index % 4]))

    with ThreadPoolExecutor(max_workers=8) as pool:
        errors = list(pool.map(bind, enumerate(pods)))
    bound = [pod for pod in cluster.pods.values() if pod["spec"].get("nodeName")]
    assert len(bound) == sum(1 for error in errors if error == "")
    assert 0 < len(bound) < len(pods), "the nodes fill up, and later binds are refused"
    _assert_no_gpu_twice(cluster)
    for name, view in state.views().items():
        held = {gpu for entry in state.ledger.pods() if entry.node == name for gpu in entry.gpus}
        assert view.mask(held) & view.free == 0
        assert all(entry.phase in (Phase.BOUND, Phase.ALLOCATED) for entry in state.ledger.pods())


def test_http_parallel_binds_through_the_app() -> None:
    state, cluster, service = _cluster((("only", "dgx-h100"),))
    client = TestClient(create_app(service))
    pods = [cluster.create_pod(f"q{i}", 3) for i in range(6)]
    for pod in pods:
        service.pod_request(pod)

    def bind(pod: dict) -> dict:
        return client.post("/bind", content=orjson.dumps({
            "PodName": pod["metadata"]["name"], "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
            "Node": "only"})).json()

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = list(pool.map(bind, pods))
    assert sum(1 for answer in answers if answer == {"Error": ""}) == 2, "8 GPUs hold two 3-GPU pods"
    assert all(answer["Error"].startswith("node only: needs 3 GPUs") for answer in answers if answer["Error"])
    _assert_no_gpu_twice(cluster)


def test_restart_rebuilds_the_ledger_from_sealed_pod_annotations() -> None:
    state, cluster, service = _cluster((("n1", "dgx-h100"),))
    first = cluster.create_pod("first", 4)
    service.pod_request(first)
    assert service.bind(_args(first, "n1")) == ""
    # A new extender process: its watches list the same cluster, but the reporter has not seen the bind yet.
    stale_report = NodeState(frozenset(), frozenset(), datetime.now(timezone.utc), 1)
    nodes, _ = cluster.list_nodes()
    nodes[0]["metadata"]["annotations"]["gpu-topology.io/state"] = encode_state(stale_report)
    unkeyed = ClusterState()  # another seal key: the annotations are not records it can trust
    unkeyed.nodes.replace(nodes)
    unkeyed.pods.replace(list(cluster.pods.values()))
    assert unkeyed.view("n1").free.bit_count() == 8
    restarted = ClusterState(seal=state.seal)  # the replicas' shared key (a Secret)
    restarted.nodes.replace(nodes)
    restarted.pods.replace(list(cluster.pods.values()))
    assert restarted.view("n1").free.bit_count() == 4
    cluster.state = restarted
    again = ExtenderService(restarted, cluster)
    second = cluster.create_pod("second", 4)
    again.pod_request(second)
    assert again.bind(_args(second, "n1")) == ""
    _assert_no_gpu_twice(cluster)
    third = cluster.create_pod("third", 1)
    again.pod_request(third)
    assert again.bind(_args(third, "n1")).startswith("node n1: needs 1 GPUs, 0 free")


def test_reporter_lag_is_covered_both_ways() -> None:
    state, cluster, service = _cluster((("n1", "rtx-a6000-pairs"),))
    pod = cluster.create_pod("lag", 2)
    service.pod_request(pod)
    assert service.bind(_args(pod, "n1")) == ""
    held = cluster.pods[pod["metadata"]["uid"]]["metadata"]["annotations"]["gpu-topology.io/gpus"].split(",")
    view = state.view("n1")
    assert view.free & view.mask(held) == 0
    # The pod ends; an old report (observed before the end) still lists its GPUs: they count as free.
    old = NodeState(frozenset(held), frozenset(), datetime.fromtimestamp(state.clock() - 5, timezone.utc), 99)
    node = cluster.list_nodes()[0][0]
    node["metadata"]["annotations"]["gpu-topology.io/state"] = encode_state(old)
    state.pods.apply("DELETED", cluster.pods.pop(pod["metadata"]["uid"]))
    state.nodes.apply("MODIFIED", node)
    assert state.view("n1").free.bit_count() == 8
    # An unhealthy GPU is never offered.
    sick = NodeState(frozenset(), frozenset({held[0]}), datetime.now(timezone.utc), 100)
    node["metadata"]["annotations"]["gpu-topology.io/state"] = encode_state(sick)
    state.nodes.apply("MODIFIED", node)
    assert state.view("n1").free.bit_count() == 7


def test_stale_node_is_refused_for_bind_and_filtered() -> None:
    now = [1_000_000.0]
    state = ClusterState(stale_after=60, clock=lambda: now[0])
    cluster = DemoCluster(state, (("n1", "dgx-h100"),), clock=lambda: now[0])
    service = ExtenderService(state, cluster)
    pod = cluster.create_pod("late", 1)
    request = service.pod_request(pod)
    now[0] += 61
    from extender.verbs.filter import filter_nodes
    outcome = filter_nodes(state, service.selector, request, ["n1", "unknown"])
    assert outcome.reasons() == ({"n1": "no fresh GPU state from the node reporter"},
                                 {"unknown": "no GPU topology reported"})
    assert service.bind(_args(pod, "n1")) == "node n1: no fresh GPU state from the node reporter"
    cluster.refresh_all()
    assert service.bind(_args(pod, "n1")) == ""


@pytest.mark.parametrize(("verb", "body", "status", "expected"), [
    ("filter", b"not json", 400, None),
    ("filter", b"[]", 200, {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                            "Error": "body is not a JSON object"}),
    ("filter", b'{"Pod": 3}', 200, {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                                    "FailedAndUnresolvableNodes": {},
                                    "Error": "Pod: expected a Pod object, got a number"}),
    ("filter", b'{"Pod": {"metadata": {}}, "NodeNames": [1]}', 200,
     {"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
      "Error": "NodeNames[0]: expected a string, got a number"}),
    ("prioritize", b'{"Pod": {}}', 200, []),
    ("prioritize", b"\xff\xfe", 400, None),
    ("bind", b'{"PodName": "x"}', 200, {"Error": "binding request has no PodNamespace"}),
    ("bind", b'{"PodName":"x","PodNamespace":"d","PodUID":"u","Node":"dgx-a"}', 200,
     {"Error": "cannot read pod d/x: pods 'x' not found"}),
    ("preempt", b'{"Pod": {"metadata": {}}, "NodeNameToMetaVictims": {"a": 1}}', 200, {"NodeNameToMetaVictims": {}}),
])
def test_malformed_bodies_get_a_clear_answer_never_a_500(verb: str, body: bytes, status: int, expected) -> None:
    _, _, service = _cluster()
    response = TestClient(create_app(service)).post(f"/{verb}", content=body)
    assert response.status_code == status
    if expected is not None:
        assert response.json() == expected
    else:
        assert response.json()["Error"].startswith("body is not JSON")


def test_garbage_pod_fields_become_reasons() -> None:
    _, _, service = _cluster()
    client = TestClient(create_app(service))
    pod = {"metadata": {"name": "g", "uid": "g1", "annotations": {"gpu-topology.io/placement": "maybe"}},
           "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "two"}}}]}}
    answer = client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["dgx-a"]})).json()
    assert answer["FailedAndUnresolvableNodes"] == {"dgx-a": "nvidia.com/gpu: 'two' is not a whole number of devices"}
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "2"
    pod["metadata"]["uid"] = "g2"
    answer = client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["dgx-a"]})).json()
    assert answer["FailedAndUnresolvableNodes"] == {
        "dgx-a": "gpu-topology.io/placement: unknown value 'maybe'; expected required | preferred"}


def test_health_readiness_and_metrics() -> None:
    state = ClusterState()
    cluster = DemoCluster(state, (("n1", "dgx-h100"),))
    client = TestClient(create_app(ExtenderService(state, cluster)))
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert ClusterState().ready is False
    metrics = client.get("/metrics").text
    assert "gpu_topology_extender_nodes 1.0" in metrics and "gpu_topology_extender_ledger_pods 0.0" in metrics


def test_server_timing_header_reports_the_verb_time() -> None:
    _, _, service = _cluster()
    response = TestClient(create_app(service)).post("/filter", content=b'{"Pod": {"metadata": {}}, "NodeNames": []}')
    name, duration = response.headers["Server-Timing"].split(";dur=")
    assert name == "verb" and 0 <= float(duration) < 1000


def test_the_selector_given_is_the_one_used_even_while_empty() -> None:
    """`serve` hands one Selector to the pin planner and the service, so that both remember the same selections;
    an empty Selector is falsy (its len), and was replaced."""
    selector = Selector()
    assert len(selector) == 0
    assert ExtenderService(ClusterState(), DemoCluster(ClusterState(), ()), selector).selector is selector
    assert Board(PLATFORMS["rtx-a6000-pairs"].topology(), selector).selector is selector
