"""Faults, each against the in-process API server with the real client, reflectors, service and HTTP app.

The API server down at start and mid-run, a watch answered with 410 Gone, a node reporter that stops, a
corrupt or unknown-version annotation, and an extender that restarts while pods are mid-bind. In every
case the extender keeps answering, says why a node cannot be used, and never hands a GPU to two pods.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import orjson
import pytest
from helpers.extender_harness import KEYS, Extender, held_gpus, node_annotations, start
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, make_node, make_pod, wait_until

from extender.cache.ledger import Phase
from extender.cache.seal import Seal
from extender.verbs.filter import STALE

__all__ = ["kube_server_fixture"]

NODES = ["gpu-1", "gpu-2", "gpu-3"]


@pytest.fixture
def cluster(kube_server: FakeKubeApiServer) -> FakeKubeApiServer:
    for node in NODES:
        kube_server.add_node(make_node(node, annotations=node_annotations(node)))
    return kube_server


@pytest.fixture
def running() -> Iterator[list[Extender]]:
    """Extenders started through this list are stopped after the test, even when it fails."""
    extenders: list[Extender] = []
    yield extenders
    for extender in extenders:
        extender.stop()


def report(server: FakeKubeApiServer, node: str, generation: int) -> None:
    """The node's reporter writes a fresh GPU state (its heartbeat)."""
    current = server.node(node)
    current["metadata"]["annotations"][KEYS[1]] = node_annotations(node, generation=generation)[KEYS[1]]
    server.update_node(current)


def failed(answer: dict) -> dict[str, str]:
    return {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}


def test_the_api_server_down_at_start_is_not_ready_then_ready_once_it_is_back(cluster, running, caplog):
    cluster.stop()
    caplog.set_level(logging.WARNING, logger="extender.kube.reflector")
    extender = start(cluster, wait=False)
    running.append(extender)
    wait_until(lambda: "reflector pods: list pods" in caplog.text and "reflector nodes: list nodes" in caplog.text,
               what="both lists refused")
    assert extender.readyz() == (503, "caches not synced")
    assert extender.client.get("/healthz").status_code == 200, "alive: restarting would not help"
    pod = make_pod("early", gpus=1, uid="early-uid")
    assert failed(extender.filter(pod, NODES)) == dict.fromkeys(NODES, "no GPU topology reported")
    cluster.start()
    wait_until(lambda: extender.readyz() == (200, "ok"), what="ready once the API server is back")
    assert extender.filter(pod, NODES)["NodeNames"] == NODES


def test_the_api_server_down_mid_run_serves_from_the_cache_marks_nodes_stale_and_recovers(cluster, running):
    extender = start(cluster, stale_after=2.0, timeout=1.0)
    running.append(extender)
    pod = cluster.add_pod(make_pod("during", gpus=2))
    wait_until(lambda: extender.state.pod(pod["metadata"]["uid"]), what="the pod in the cache")
    cluster.stop()
    assert extender.filter(pod, NODES)["NodeNames"] == NODES, "filter answers from the cache"
    assert extender.readyz() == (200, "ok")
    error = extender.bind(pod, "gpu-1")
    assert error.startswith("binding default/during to gpu-1: ") and "outcome is unknown" in error
    # No reporter can write meanwhile: once their states are older than the bound, no node is trusted.
    wait_until(lambda: failed(extender.filter(pod, NODES)) == dict.fromkeys(NODES, STALE), what="stale nodes")
    assert "gpu_topology_extender_stale_nodes 3.0" in extender.client.get("/metrics").text
    cluster.start()
    for generation, node in enumerate(NODES, start=2):
        report(cluster, node, generation)
    wait_until(lambda: extender.filter(pod, NODES)["NodeNames"] == NODES, what="fresh nodes after the outage")
    assert extender.bind(pod, "gpu-2") == "", "kube-scheduler's retry binds the pod"
    assert cluster.pod("default", "during")["spec"]["nodeName"] == "gpu-2"


def test_a_watch_answered_410_relists_and_keeps_the_reservations_of_pods_mid_bind(cluster, running):
    extender = start(cluster)
    running.append(extender)
    gone = cluster.add_pod(make_pod("gone", gpus=2))
    kept = cluster.add_pod(make_pod("kept", gpus=2))
    mid = cluster.add_pod(make_pod("mid", gpus=4))
    wait_until(lambda: all(extender.state.pod(p["metadata"]["uid"]) for p in (gone, kept, mid)), what="the pods")
    assert extender.bind(gone, "gpu-1") == "" and extender.bind(kept, "gpu-1") == ""
    # Twice: the API writer sends a Binding once more when a kept-alive connection ends before any answer.
    cluster.hang("POST", "/api/v1/namespaces/default/pods/mid/binding", times=2)
    answers: list[str] = []
    binding = threading.Thread(target=lambda: answers.append(extender.bind(mid, "gpu-1")))
    binding.start()
    try:
        wait_until(lambda: extender.state.ledger.get(mid["metadata"]["uid"]) is not None, what="mid's Binding sent")
        lists = cluster.list_count("pods")
        cluster.fail("GET", "/api/v1/pods", watch=True)  # the watch stays down a moment ...
        cluster.break_watches("pods")
        cluster.delete_pod("default", "gone")  # ... while gone ends, and the server forgets that it did
        cluster.compact()
        wait_until(lambda: cluster.list_count("pods") > lists, what="the relist after 410 Gone")
        wait_until(lambda: extender.state.pod(gone["metadata"]["uid"]) is None, what="gone's end, from the list")
        entry = extender.state.ledger.get(mid["metadata"]["uid"])
        assert entry is not None and entry.phase is Phase.BINDING and len(entry.gpus) == 4
        assert extender.state.ledger.get(kept["metadata"]["uid"]).phase is Phase.BOUND
        assert extender.state.view("gpu-1").free.bit_count() == 2, "8 - kept's 2 - mid's 4; gone's 2 are back"
        big = make_pod("big", gpus=4, uid="big-uid")
        assert failed(extender.filter(big, ["gpu-1"])) == {"gpu-1": "not enough free GPUs"}
    finally:
        cluster.release_hangs()
        binding.join(30)
    assert "outcome is unknown" in answers[0]


def test_a_reporter_that_stops_makes_only_its_node_stale_with_a_clear_reason(cluster, running):
    extender = start(cluster, stale_after=1.5)
    running.append(extender)
    pod = make_pod("probe", gpus=1, uid="probe-uid")
    stop = threading.Event()

    def heartbeats() -> None:  # the reporters of gpu-2 and gpu-3 keep going; gpu-1's has stopped
        generation = 2
        while not stop.wait(0.25):
            for node in NODES[1:]:
                report(cluster, node, generation)
            generation += 1

    beating = threading.Thread(target=heartbeats)
    beating.start()
    try:
        wait_until(lambda: extender.filter(pod, NODES)["NodeNames"] == NODES[1:], what="gpu-1 stale")
        # The reason is answered when no node passes (kube-scheduler reads it only then): gpu-1 alone.
        assert extender.filter(pod, NODES[:1])["FailedNodes"] == {"gpu-1": STALE}
        assert "gpu_topology_extender_stale_nodes 1.0" in extender.client.get("/metrics").text
        report(cluster, "gpu-1", 2)  # the reporter is back
        wait_until(lambda: extender.filter(pod, NODES)["NodeNames"] == NODES, what="gpu-1 fresh again")
    finally:
        stop.set()
        beating.join(10)


def test_a_corrupt_or_unknown_version_annotation_fails_only_its_node(cluster, running):
    topology = orjson.loads(node_annotations("gpu-2")[KEYS[0]])
    corrupt = {
        "gpu-1": {KEYS[0]: "{not json", KEYS[1]: node_annotations("gpu-1")[KEYS[1]]},
        "gpu-2": {KEYS[0]: orjson.dumps({**topology, "v": 99}).decode(), KEYS[1]: node_annotations("gpu-2")[KEYS[1]]},
    }
    for node, written in corrupt.items():
        current = cluster.node(node)
        current["metadata"]["annotations"] = written
        cluster.update_node(current)
    extender = start(cluster)
    running.append(extender)
    pod = make_pod("probe", gpus=1, uid="probe-uid")
    assert extender.filter(pod, NODES)["NodeNames"] == ["gpu-3"]
    answer = extender.filter(pod, NODES[:2])  # no node passes: the reasons are answered
    assert answer["FailedNodes"] == {}
    assert set(answer["FailedAndUnresolvableNodes"]) == {"gpu-1", "gpu-2"}
    assert all("topology annotation" in reason for reason in answer["FailedAndUnresolvableNodes"].values())
    # A corrupt GPU state leaves no state to trust: the node is unusable (never free), the others are not touched.
    current = cluster.node("gpu-3")
    current["metadata"]["annotations"][KEYS[1]] = '{"v":1,"used":'
    cluster.update_node(current)
    wait_until(lambda: "gpu-3" in failed(extender.filter(pod, NODES)), what="gpu-3 refused")
    # The reporter rewrites valid annotations: each node comes back on its own.
    for generation, node in enumerate(NODES, start=2):
        current = cluster.node(node)
        current["metadata"]["annotations"] = node_annotations(node, generation=generation)
        cluster.update_node(current)
    wait_until(lambda: extender.filter(pod, NODES)["NodeNames"] == NODES, what="all nodes usable again")


def test_a_restart_while_pods_are_mid_bind_assigns_no_gpu_twice(cluster, running):
    seal = Seal.ephemeral()  # the key the replicas share (a Secret)
    first = start(cluster, seal=seal, timeout=1.0)
    running.append(first)
    pods = {name: cluster.add_pod(make_pod(name, gpus=gpus)) for name, gpus in
            (("lost", 4), ("hung", 2), ("later", 2), ("over", 1))}
    wait_until(lambda: all(first.state.pod(p["metadata"]["uid"]) for p in pods.values()), what="the pods")
    # lost: the Binding commits but its answer never arrives; hung: the Binding never reaches the store.
    cluster.lose("POST", "/api/v1/namespaces/default/pods/lost/binding")
    assert "outcome is unknown" in first.bind(pods["lost"], "gpu-1")
    cluster.hang("POST", "/api/v1/namespaces/default/pods/hung/binding")
    answers: list[str] = []
    binding = threading.Thread(target=lambda: answers.append(first.bind(pods["hung"], "gpu-1")))
    binding.start()
    try:
        wait_until(lambda: first.state.ledger.get(pods["hung"]["metadata"]["uid"]) is not None, what="hung reserved")
        first.stop()  # the extender dies with both binds in flight
        second = start(cluster, seal=seal)
        running.append(second)
        # The committed Binding is known from its sealed annotations, though no reporter says the GPUs are used.
        wait_until(lambda: second.state.view("gpu-1").free.bit_count() == 4, what="lost's 4 GPUs held")
        assert second.state.ledger.get(pods["hung"]["metadata"]["uid"]) is None
        assert second.bind(pods["hung"], "gpu-1") == "", "kube-scheduler retries hung at the new extender"
        assert second.bind(pods["later"], "gpu-1") == ""
        assert second.bind(pods["over"], "gpu-1") != "", "gpu-1 is full"
    finally:
        cluster.release_hangs()
        binding.join(30)
    held = held_gpus(cluster, "gpu-1")
    assert len(held) == len(set(held)) == 8, held
    assert sorted(p["metadata"]["name"] for p in cluster.pods_on("gpu-1")) == ["hung", "later", "lost"]
    assert "nodeName" not in cluster.pod("default", "over")["spec"]
