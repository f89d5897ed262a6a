"""The extender on the Kubernetes side: the real `kubernetes` client against the in-process API server.

Watches feed the state, bind patches the pod and creates the Binding, Events reach the pod, a restart
rebuilds the ledger from the API, and an unreachable API server gives a clear Error.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone

import kubernetes.client as k8s
import orjson
import pytest
from fastapi.testclient import TestClient

from extender.cache.cluster_state import ClusterState
from extender.cache.ledger import Phase
from extender.cache.seal import Seal
from extender.demo.cluster import with_uuids
from extender.kube.client import KubernetesApi
from extender.kube.reflector import Reflector
from extender.server.app import create_app
from extender.verbs.service import ExtenderService
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, make_node, make_pod, wait_until
from topology.codec import NodeState, encode_state, encode_topology
from topology.platforms import PLATFORMS

__all__ = ["kube_server_fixture"]

TOPOLOGY = with_uuids("gpu-1", PLATFORMS["rtx-a6000-pairs"].topology())


@dataclass
class Extender:
    state: ClusterState
    service: ExtenderService
    client: TestClient
    reflectors: list[Reflector]
    posts: Posts
    posted_from: str

    def stop(self) -> None:
        for reflector in self.reflectors:
            reflector.stop()


def _node_annotations(used: frozenset[str] = frozenset()) -> dict[str, str]:
    state = NodeState(used, frozenset(), datetime.now(timezone.utc), 1)
    return {"gpu-topology.io/topology": encode_topology(TOPOLOGY), "gpu-topology.io/state": encode_state(state)}


class Posts:
    """How the extender's Bindings went out: from a bind thread (`post`) or from the event loop (`post_soon`)."""

    def __init__(self, api: KubernetesApi) -> None:
        self.thread = self.loop = 0
        writer = api._writer
        assert writer is not None
        post, post_soon = writer.post, writer.post_soon

        def counted_post(*args, **kwargs):
            self.thread += 1
            return post(*args, **kwargs)

        def counted_post_soon(*args, **kwargs):
            posted = post_soon(*args, **kwargs)
            self.loop += posted is not None
            return posted
        writer.post, writer.post_soon = counted_post, counted_post_soon  # type: ignore[method-assign]


def _start(server: FakeKubeApiServer, timeout: float = 5.0, seal: Seal | None = None,
           bind_outcome_seconds: float = 60.0, posted_from: str = "thread") -> Extender:
    """`posted_from` "loop": the writer first keeps a connection (a POST the API server refuses), so Bindings go
    out from the event loop; "thread": it keeps none, so the first goes from a bind thread."""
    api = KubernetesApi.from_configuration(k8s.Configuration(host=server.url), timeout=timeout, instance="test")
    if posted_from == "loop":
        assert api._writer is not None
        assert api._writer.post("/api/v1/nowhere", b"{}", {}, timeout)[0] == 404
    posts = Posts(api)
    state = ClusterState(seal=seal, bind_outcome_seconds=bind_outcome_seconds)
    reflectors = [Reflector(api.list_nodes, api.watch_nodes, state.nodes, name="nodes", watch_timeout=5),
                  Reflector(api.list_pods, api.watch_pods, state.pods, name="pods", watch_timeout=5)]
    for reflector in reflectors:
        reflector.start()
    service = ExtenderService(state, api)
    extender = Extender(state, service, TestClient(create_app(service)), reflectors, posts, posted_from)
    wait_until(lambda: state.ready, what="the first Node and Pod lists")
    return extender


@pytest.fixture
def cluster(kube_server: FakeKubeApiServer) -> Iterator[FakeKubeApiServer]:
    kube_server.add_node(make_node("gpu-1", annotations=_node_annotations()))
    yield kube_server


@pytest.fixture(params=["thread", "loop"])
def extender(cluster: FakeKubeApiServer, request: pytest.FixtureRequest) -> Iterator[Extender]:
    running = _start(cluster, posted_from=request.param)
    yield running
    running.stop()


def _one_binding_posted(extender: Extender) -> None:
    """From where `posted_from` said."""
    assert (extender.posts.thread, extender.posts.loop) == ((1, 0) if extender.posted_from == "thread" else (0, 1))


def _schedule(extender: Extender, server: FakeKubeApiServer, pod: dict) -> dict:
    """filter, prioritize and bind, as kube-scheduler would; returns the bind answer."""
    filtered = extender.client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["gpu-1"]})).json()
    assert filtered["NodeNames"] == ["gpu-1"], filtered
    # A lone candidate scores the least of the request, which kube-scheduler needs not be told: left out.
    assert extender.client.post("/prioritize", content=orjson.dumps({"Pod": pod, "NodeNames": ["gpu-1"]})).json() == []
    return extender.client.post("/bind", content=orjson.dumps({
        "PodName": pod["metadata"]["name"], "PodNamespace": pod["metadata"]["namespace"],
        "PodUID": pod["metadata"]["uid"], "Node": "gpu-1"})).json()


def test_bind_writes_the_assignment_in_the_binding(extender: Extender, cluster: FakeKubeApiServer) -> None:
    pod = cluster.add_pod(make_pod("train", gpus=2, annotations={"gpu-topology.io/interconnect": "nvlink",
                                                                  "gpu-topology.io/placement": "required"}))
    # Seen by the watch first, as kube-scheduler's own watch usually makes it: a bind never reads the pod then.
    wait_until(lambda: extender.state.pod(pod["metadata"]["uid"]) is not None, what="the pod in the watch")
    assert _schedule(extender, cluster, pod) == {"Error": ""}
    stored = cluster.pod("default", "train")
    annotations = stored["metadata"]["annotations"]
    pair = [g.uuid for g in TOPOLOGY.gpus[:2]]
    assert stored["spec"]["nodeName"] == "gpu-1"
    assert annotations["gpu-topology.io/gpus"] == ",".join(pair)
    assert orjson.loads(annotations["gpu-topology.io/containers"]) == {"main": pair}
    assert annotations["gpu-topology.io/ring-bandwidth"] == "56"
    assert extender.state.seal.verify(annotations["gpu-topology.io/seal"], pod["metadata"]["uid"], "gpu-1",
                                      annotations["gpu-topology.io/gpus"], annotations["gpu-topology.io/containers"])
    assert [b["target"]["name"] for b in cluster.bindings] == ["gpu-1"]
    assert cluster.bindings[0]["metadata"]["uid"] == pod["metadata"]["uid"]
    assert cluster.patches == [], "one write: the Binding carries the annotations"
    wait_until(lambda: extender.state.view("gpu-1").free.bit_count() == 6, what="the ledger to hold 2 GPUs")
    assert extender.state.ledger.get(pod["metadata"]["uid"]).phase is Phase.BOUND
    _one_binding_posted(extender)


def test_pod_end_seen_by_the_watch_frees_its_gpus(extender: Extender, cluster: FakeKubeApiServer) -> None:
    pod = cluster.add_pod(make_pod("short", gpus=4))
    assert _schedule(extender, cluster, pod) == {"Error": ""}
    wait_until(lambda: extender.state.view("gpu-1").free.bit_count() == 4, what="4 GPUs held")
    cluster.delete_pod("default", "short")
    wait_until(lambda: extender.state.view("gpu-1").free.bit_count() == 8, what="the GPUs back after the delete")


def test_malformed_annotation_becomes_an_event_on_the_pod(extender: Extender, cluster: FakeKubeApiServer) -> None:
    pod = cluster.add_pod(make_pod("bad", gpus=1, annotations={"gpu-topology.io/min-bandwidth": "fast"}))
    answer = extender.client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": ["gpu-1"]})).json()
    assert answer["FailedAndUnresolvableNodes"] == {
        "gpu-1": "gpu-topology.io/min-bandwidth: 'fast' is not a positive number of GB/s"}
    wait_until(lambda: cluster.events, what="the Warning Event")
    event = cluster.events[0]
    assert event["reason"] == "InvalidGPUTopologyRequest" and event["type"] == "Warning"
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"] and "min-bandwidth" in event["message"]


def test_restart_rebuilds_the_ledger_before_the_reporter_catches_up(cluster: FakeKubeApiServer) -> None:
    key = Seal.ephemeral()  # the replicas' shared key, a Secret in the deployment
    first = _start(cluster, seal=key)
    pod = cluster.add_pod(make_pod("before-restart", gpus=6))
    assert _schedule(first, cluster, pod) == {"Error": ""}
    first.stop()
    # The reporter still says nothing is used; only the pod's sealed annotations tell the new process.
    second = _start(cluster, seal=key)
    try:
        wait_until(lambda: second.state.view("gpu-1").free.bit_count() == 2, what="the rebuilt ledger")
        late = cluster.add_pod(make_pod("after-restart", gpus=4))
        wait_until(lambda: second.state.pod(late["metadata"]["uid"]) is not None, what="the new pod in the watch")
        answer = second.client.post("/filter", content=orjson.dumps({"Pod": late, "NodeNames": ["gpu-1"]})).json()
        assert answer["FailedNodes"] == {"gpu-1": "not enough free GPUs"}
    finally:
        second.stop()


def test_bind_of_a_pod_bound_elsewhere_rolls_back(extender: Extender, cluster: FakeKubeApiServer) -> None:
    pod = cluster.add_pod(make_pod("raced", gpus=2))
    extender.service.pod_request(pod)
    cluster.update_pod({**cluster.pod("default", "raced"), "spec": {**pod["spec"], "nodeName": "other-node"}})
    def seen_elsewhere() -> bool:
        record = extender.state.pod(pod["metadata"]["uid"])
        return record is not None and record.node == "other-node"
    wait_until(seen_elsewhere, what="the watch to show the pod bound elsewhere")
    answer = extender.client.post("/bind", content=orjson.dumps({
        "PodName": "raced", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "gpu-1"})).json()
    assert answer["Error"].startswith("binding default/raced to gpu-1 conflicted")
    assert "gpu-topology.io/gpus" not in cluster.pod("default", "raced")["metadata"]["annotations"]
    assert cluster.patches == []
    wait_until(lambda: extender.state.ledger.get(pod["metadata"]["uid"]) is None, what="no ledger entry")
    wait_until(lambda: extender.state.view("gpu-1").free.bit_count() == 8, what="gpu-1 whole again")
    _one_binding_posted(extender)


@pytest.mark.parametrize("posted_from", ["thread", "loop"])
def test_an_unanswered_bind_keeps_its_gpus_until_the_outcome_is_known(cluster: FakeKubeApiServer,
                                                                      posted_from: str) -> None:
    extender = _start(cluster, timeout=1.0, bind_outcome_seconds=1.5, posted_from=posted_from)
    try:
        pod = cluster.add_pod(make_pod("stranded", gpus=1))
        uid = pod["metadata"]["uid"]
        wait_until(lambda: extender.state.pod(uid) is not None, what="the pod in the watch")
        cluster.hang("POST", None, times=5)
        answer = extender.client.post("/bind", content=orjson.dumps({
            "PodName": "stranded", "PodNamespace": "default", "PodUID": uid, "Node": "gpu-1"})).json()
        cluster.release_hangs()
        assert answer["Error"].startswith("binding default/stranded to gpu-1: ")
        assert "outcome is unknown" in answer["Error"]
        assert extender.state.ledger.get(uid).phase is Phase.UNCERTAIN
        assert extender.state.view("gpu-1").free.bit_count() == 7
        _one_binding_posted(extender)
        # The Binding never landed: once the wait is over with the pod still unbound, the GPU comes back.
        wait_until(lambda: extender.state.ledger.get(uid) is None, timeout=10, what="the reservation released")
        assert extender.state.view("gpu-1").free.bit_count() == 8
    finally:
        extender.stop()


def test_a_pod_the_watch_has_not_shown_is_read_and_bound_on_a_bind_thread(cluster: FakeKubeApiServer) -> None:
    extender = _start(cluster, posted_from="loop")
    try:
        extender.reflectors[1].stop()  # the pods' watch: the pod below never reaches the state
        pod = cluster.add_pod(make_pod("unseen", gpus=1))
        answer = extender.client.post("/bind", content=orjson.dumps({
            "PodName": "unseen", "PodNamespace": "default", "PodUID": pod["metadata"]["uid"], "Node": "gpu-1"})).json()
        assert answer == {"Error": ""}
        assert extender.state.pod(pod["metadata"]["uid"]) is None
        assert (extender.posts.thread, extender.posts.loop) == (1, 0)
        assert cluster.pod("default", "unseen")["spec"]["nodeName"] == "gpu-1"
        assert extender.state.ledger.get(pod["metadata"]["uid"]).phase is Phase.BOUND
    finally:
        extender.stop()
