"""Every request body a real kube-scheduler (v1.36.2) sent, replayed through the app in capture order.

The bodies are byte-for-byte copies of ../shared/kube-scheduler. The cluster is the capture's: node-a and
node-b are DGX H100 boards; node-c had 4 A100s, and stands here as the 4-GPU HGX H100 capture, the only real
4-GPU NVLink board we have. Expected answers are this extender's policy, not the capture stub's.
"""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server.app import create_app
from extender.verbs.service import ExtenderService
from helpers import paths

BODIES = paths.FIXTURES / "kube-scheduler"
SHARED = paths.SHARED / "kube-scheduler"
NODES = (("node-a", "dgx-h100"), ("node-b", "dgx-h100"), ("node-c", "hgx-h100-4gpu"))
FILTER_KEYS = {"NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}


class Replay:
    def __init__(self, one_best: bool = False) -> None:
        """Without `one_best`, as the captures were made: every fit passed, kube-scheduler scored them and called
        prioritize."""
        self.state = ClusterState()
        self.cluster = DemoCluster(self.state, NODES)
        self.service = ExtenderService(self.state, self.cluster, one_best=one_best)
        self.client = TestClient(create_app(self.service))

    def body(self, name: str) -> bytes:
        return (BODIES / name).read_bytes()

    def post(self, verb: str, name: str) -> Any:
        response = self.client.post(f"/{verb}", content=self.body(name), headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        return response.json()

    def admit(self, name: str) -> dict[str, Any]:
        """The pod of a captured filter body, as the API server held it before scheduling."""
        return self.cluster.add_pod(orjson.loads(self.body(name))["Pod"])

    def filter(self, name: str) -> dict[str, Any]:
        request = orjson.loads(self.body(name))
        answer = self.post("filter", name)
        names = request["NodeNames"]
        assert set(answer) == FILTER_KEYS and answer["Error"] == ""
        assert set(answer["NodeNames"]) <= set(names), "filter must never claim a node it was not sent"
        failed = list(answer["FailedNodes"]) + list(answer["FailedAndUnresolvableNodes"])
        if answer["NodeNames"]:
            assert failed == [], "reasons only when no node passes: kube-scheduler reads them only then"
        else:
            assert sorted(failed) == sorted(names), "when none passes, every candidate gets its reason"
        return answer

    def prioritize(self, name: str) -> dict[str, int]:
        """The scores as kube-scheduler reads them: a host left out adds 0."""
        request = orjson.loads(self.body(name))
        answer = self.post("prioritize", name)
        assert isinstance(answer, list)
        hosts = [entry["Host"] for entry in answer]
        assert hosts == [host for host in request["NodeNames"] if host in hosts], "only candidates, in their order"
        for entry in answer:
            assert set(entry) == {"Host", "Score"} and isinstance(entry["Score"], int) and 1 <= entry["Score"] <= 10
        given = {entry["Host"]: entry["Score"] for entry in answer}
        return {host: given.get(host, 0) for host in request["NodeNames"]}

    def bind(self, name: str) -> dict[str, Any]:
        answer = self.post("bind", name)
        assert answer == {"Error": ""}, answer
        request = orjson.loads(self.body(name))
        pod = self.cluster.pods[request["PodUID"]]
        assert pod["spec"]["nodeName"] == request["Node"]
        return pod

    def gpus_of(self, pod: dict[str, Any]) -> list[str]:
        return pod["metadata"]["annotations"]["gpu-topology.io/gpus"].split(",")

    def uuids(self, node: str, indices: range | list[int]) -> list[str]:
        topology = self.cluster.topologies[node]
        return [topology.gpus[i].uuid for i in indices]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/kube-scheduler is not beside this checkout")
def test_fixtures_are_the_captured_bytes() -> None:
    captured = sorted(path.name for path in SHARED.glob("*.json"))
    assert captured == sorted(path.name for path in BODIES.glob("*.json"))
    for name in captured:
        assert (SHARED / name).read_bytes() == (BODIES / name).read_bytes(), name


def test_config_a_scenarios_in_capture_order() -> None:
    replay = Replay()

    # 1. plain-4gpu: every node can give 4 GPUs; bound to node-a, on one NUMA node of its NVSwitch board.
    replay.admit("plain-4gpu--filter.json")
    assert replay.filter("plain-4gpu--filter.json")["NodeNames"] == ["node-a", "node-b", "node-c"]
    scores = replay.prioritize("plain-4gpu--prioritize.json")
    assert scores["node-a"] == scores["node-b"] > scores["node-c"], "450 GB/s boards beat the NV6 mesh"
    plain = replay.bind("plain-4gpu--bind.json")
    assert replay.gpus_of(plain) == replay.uuids("node-a", range(4))
    assert plain["metadata"]["annotations"]["gpu-topology.io/ring-bandwidth"] == "450"

    # 2. annotated-nvlink: nvlink, required, >= 300 GB/s; both H100 boards qualify; the partly used one packs better.
    replay.admit("annotated-nvlink--filter.json")
    assert replay.filter("annotated-nvlink--filter.json")["NodeNames"] == ["node-a", "node-b"]
    scores = replay.prioritize("annotated-nvlink--prioritize.json")
    assert scores["node-a"] > scores["node-b"]
    nvlink = replay.bind("annotated-nvlink--bind.json")
    assert replay.gpus_of(nvlink) == replay.uuids("node-b", [0, 1])

    # 3. multi-container-init: max(1 + 2, 4) = 4 GPUs; node-c's 4 GPUs fit exactly.
    replay.admit("multi-container-init--filter.json")
    assert replay.service.pod_request(orjson.loads(replay.body("multi-container-init--filter.json"))["Pod"]).gpus == 4
    assert replay.filter("multi-container-init--filter.json")["NodeNames"] == ["node-a", "node-c", "node-b"]
    replay.prioritize("multi-container-init--prioritize.json")
    init = replay.bind("multi-container-init--bind.json")
    assert replay.gpus_of(init) == replay.uuids("node-c", range(4))

    # 5. filter-rejects-all: 4 GPUs on an NVLink ring, required. node-a has GPUs 4-7 free, node-b six:
    # behind NVSwitch any 4 free GPUs form one, so both pass (the capture's stub rejected them on purpose).
    replay.admit("filter-rejects-all--filter.json")
    for name in ("filter-rejects-all--filter.json", "filter-rejects-all--filter.2.json"):
        assert replay.filter(name)["NodeNames"] == ["node-a", "node-b"]

    # 6. unresolvable: interconnect=nvswitch is not a value we know: unresolvable everywhere, naming it.
    replay.admit("unresolvable--filter.json")
    for name in ("unresolvable--filter.json", "unresolvable--filter.2.json"):
        answer = replay.filter(name)
        assert answer["NodeNames"] == [] and answer["FailedNodes"] == {}
        reasons = set(answer["FailedAndUnresolvableNodes"].values())
        assert reasons == {"gpu-topology.io/interconnect: unknown value 'nvswitch'; "
                           "expected nvlink | pcie-switch | host-bridge | numa | any"}

    # 7. stub-error-field: min-bandwidth 'fast'. Not an Error (that means endless SchedulerError retries).
    replay.admit("stub-error-field--filter.json")
    for name in ("stub-error-field--filter.json", "stub-error-field--filter.2.json", "stub-error-field--filter.3.json"):
        answer = replay.filter(name)
        assert answer["Error"] == "" and answer["NodeNames"] == []
        assert set(answer["FailedAndUnresolvableNodes"].values()) == {
            "gpu-topology.io/min-bandwidth: 'fast' is not a positive number of GB/s"}

    # Each malformed pod got one Warning Event naming its annotation, sent off the hot path.
    deadline = time.monotonic() + 10
    while len(replay.cluster.events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted((pod, reason) for pod, _, reason, _ in replay.cluster.events) == [
        ("default/stub-error-field", "InvalidGPUTopologyRequest"),
        ("default/unresolvable", "InvalidGPUTopologyRequest")]


def test_bind_conflict_retry_does_not_assign_twice() -> None:
    replay = Replay()
    replay.admit("bind-conflict--filter.json")
    assert replay.filter("bind-conflict--filter.json")["NodeNames"] == ["node-a", "node-c", "node-b"]
    replay.prioritize("bind-conflict--prioritize.json")
    first = replay.bind("bind-conflict--bind.json")
    held = replay.gpus_of(first)
    assert replay.filter("bind-conflict--filter.2.json")["NodeNames"] == ["node-a", "node-b", "node-c"]
    replay.prioritize("bind-conflict--prioritize.2.json")
    again = replay.bind("bind-conflict--bind.2.json")
    assert replay.gpus_of(again) == held
    assert len(replay.state.ledger) == 1
    assert replay.state.view("node-a").free.bit_count() == 6


def test_nodecache_false_answers_with_the_node_list() -> None:
    replay = Replay()
    replay.admit("nodecache-false--filter.json")
    request = orjson.loads(replay.body("nodecache-false--filter.json"))
    answer = replay.post("filter", "nodecache-false--filter.json")
    assert set(answer) == FILTER_KEYS | {"Nodes"} and answer["NodeNames"] is None and answer["Error"] == ""
    assert answer["Nodes"]["items"] == request["Nodes"]["items"], "all three pass, returned as sent"
    replay.post("prioritize", "nodecache-false--prioritize.json")
    replay.bind("nodecache-false--bind.json")


def test_with_one_best_a_pod_that_states_no_preference_is_passed_one_node_the_best_scored() -> None:
    """kube-scheduler takes a single node that passes without scoring (api/preferences.py): here one of the two
    empty H100 boards, which tie, as kube-scheduler drew node-a among them after scoring three; without the node
    cache, the one Node object is answered back."""
    shipped = Replay(one_best=True)
    shipped.admit("plain-4gpu--filter.json")
    [one] = shipped.filter("plain-4gpu--filter.json")["NodeNames"]
    assert one in ("node-a", "node-b")
    assert orjson.loads(shipped.body("plain-4gpu--bind.json"))["Node"] == "node-a"
    shipped.admit("nodecache-false--filter.json")
    answer = shipped.post("filter", "nodecache-false--filter.json")
    [passed] = [item["metadata"]["name"] for item in answer["Nodes"]["items"]]
    assert answer["NodeNames"] is None and answer["Error"] == ""
    scores = {entry["Host"]: entry["Score"] for entry in shipped.post("prioritize", "nodecache-false--prioritize.json")}
    assert scores and scores.get(passed, 0) == max(scores.values())


def _place(replay: Replay, pod: dict[str, Any], node: str) -> None:
    """Schedule a pod through the extender onto a given node, as the captured fillers were."""
    stored = replay.cluster.add_pod(pod)
    replay.service.pod_request(stored)
    answer = replay.client.post("/bind", content=orjson.dumps({
        "PodName": stored["metadata"]["name"], "PodNamespace": stored["metadata"]["namespace"],
        "PodUID": stored["metadata"]["uid"], "Node": node})).json()
    assert answer == {"Error": ""}, answer


def _filler(template: dict[str, Any], name: str, uid: str, gpus: int) -> dict[str, Any]:
    pod = orjson.loads(orjson.dumps(template))
    pod["metadata"].update(name=name, uid=uid)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)},
                                                 "requests": {"nvidia.com/gpu": str(gpus)}}
    return pod


@pytest.mark.parametrize("meta", [True, False], ids=["nodecache", "full-victims"])
def test_preempt_keeps_nodes_where_eviction_frees_an_nvlink_ring(meta: bool) -> None:
    replay = Replay()
    prefix = "preempt" if meta else "preempt-nodecache-false"
    preempt_request = orjson.loads(replay.body(f"{prefix}--preempt.json"))
    victims = preempt_request["NodeNameToMetaVictims"] if meta else {
        node: {"Pods": [{"UID": pod["metadata"]["uid"]} for pod in entry["Pods"]]}
        for node, entry in preempt_request["NodeNameToVictims"].items()}
    template = orjson.loads(replay.body(f"{prefix}-filler--filter.json"))["Pod"]
    sizes = {0: 2, 1: 4, 2: 2} if meta else {0: 2, 1: 2, 2: 4}
    for position, victim in enumerate(victims["node-a"]["Pods"]):
        _place(replay, _filler(template, f"filler-a{position}", victim["UID"], sizes[position]), "node-a")
    _place(replay, _filler(template, "filler-b", victims["node-b"]["Pods"][0]["UID"], 8), "node-b")
    _place(replay, _filler(template, "filler-c", "filler-c-uid", 4), "node-c")
    assert all(replay.state.view(node).free == 0 for node in ("node-a", "node-b", "node-c"))

    replay.admit(f"{prefix}--filter.json")
    answer = replay.post("preempt", f"{prefix}--preempt.json")
    assert answer == {"NodeNameToMetaVictims": {
        node: {"Pods": entry["Pods"], "NumPDBViolations": 0} for node, entry in victims.items()}}

    replay.cluster.finish_pod(victims["node-b"]["Pods"][0]["UID"])
    request = orjson.loads(replay.body(f"{prefix}--filter.json"))
    answer = replay.post("filter", f"{prefix}--filter.json")
    assert answer["Error"] == "" and answer["FailedNodes"] == {} and answer["FailedAndUnresolvableNodes"] == {}
    passed = answer["NodeNames"] if meta else [item["metadata"]["name"] for item in answer["Nodes"]["items"]]
    assert passed == ["node-b"] and (meta or request["NodeNames"] is None)
    pod = replay.bind(f"{prefix}--bind.json")
    assert replay.gpus_of(pod) == replay.uuids("node-b", range(8))


@pytest.mark.parametrize("name", sorted(path.name for path in BODIES.glob("*--*.json")
                                        if not path.name.endswith(".response.json")))
def test_every_captured_body_gets_a_well_formed_answer_on_an_empty_cluster(name: str) -> None:
    """Out of order and out of context, every body still gets a 200 and the verb's shape."""
    replay = Replay()
    verb = name.split("--")[1].split(".")[0]
    response = replay.client.post(f"/{verb}", content=replay.body(name))
    assert response.status_code == 200
    answer = response.json()
    if verb == "prioritize":
        assert isinstance(answer, list)
    elif verb == "filter":
        assert FILTER_KEYS <= set(answer)
    elif verb == "preempt":
        assert set(answer) == {"NodeNameToMetaVictims"}
    else:
        assert set(answer) == {"Error"}
