"""/preempt (extender/verbs/preempt.py): no pod is evicted in vain. kube-scheduler's dry run counts GPUs, so it
offers victims on nodes where evicting them frees no set the pod can use: the extender must drop those nodes and
keep the others (README, the verbs' table). The nodes are real boards, filled with one-GPU pods through the
extender's own bind; the victims are sent over HTTP as kube-scheduler sends them. Every test keeps one node beside
the one it drops, since a preempt that fails answers no node at all (extender/server/app.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from fastapi.testclient import TestClient

from extender.api.wire import BindingArgs
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server.app import create_app
from extender.verbs.service import ExtenderService

NVLINK_REQUIRED = {"gpu-topology.io/interconnect": "nvlink", "gpu-topology.io/placement": "required"}


class Cluster:
    """Real platforms in memory, the extender serving them, and which one-GPU pod holds which GPU of each node."""

    def __init__(self, nodes: Sequence[tuple[str, str]]) -> None:
        self.state = ClusterState()
        self.kube = DemoCluster(self.state, nodes)
        self.service = ExtenderService(self.state, self.kube)
        self.client = TestClient(create_app(self.service))
        self.holder: dict[str, dict[int, str]] = {name: {} for name, _ in nodes}  # node -> GPU index -> pod UID

    def fill(self, node: str, pods: int) -> None:
        """Bind `pods` one-GPU pods to the node through the extender, and note the GPU the kubelet gave each."""
        for number in range(pods):
            pod = self.kube.create_pod(f"{node}-small-{number}", 1)
            uid = pod["metadata"]["uid"]
            assert self.service.bind(BindingArgs(pod["metadata"]["name"], "default", uid, node)) == ""
            (gpu,) = self.kube.delivered_gpus(uid)
            self.holder[node][gpu] = uid
        assert self.state.view(node).free.bit_count() == len(self.kube.topologies[node].gpus) - len(self.holder[node])

    def victims(self, node: str, gpus: Sequence[int]) -> list[str]:
        """The pods that hold these GPUs of the node."""
        return [self.holder[node][gpu] for gpu in gpus]

    def preempt(self, gpus: int, annotations: Mapping[str, str], victims: Mapping[str, list[str]],
                client: TestClient | None = None) -> dict[str, list[str]]:
        """POST /preempt for a new pod of `gpus` GPUs, as kube-scheduler does with nodeCacheCapable: the nodes kept,
        each with its victims' UIDs."""
        pod = self.kube.create_pod(f"preemptor-{len(self.kube.pods)}", gpus, annotations)
        body = {"Pod": pod, "NodeNameToVictims": None, "NodeNameToMetaVictims": {
            node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": 0} for node, uids in victims.items()}}
        response = (client or self.client).post("/preempt", content=orjson.dumps(body),
                                                headers={"Content-Type": "application/json"})
        assert response.status_code == 200
        answer: dict[str, Any] = response.json()["NodeNameToMetaVictims"]
        assert all(entry["NumPDBViolations"] == 0 for entry in answer.values())
        return {node: [victim["UID"] for victim in entry["Pods"]] for node, entry in answer.items()}


def test_a_node_whose_eviction_frees_no_nvlink_pair_is_dropped() -> None:
    """RTX A6000 boards bridge GPUs in pairs (0,1), (2,3), (4,5), (6,7). Evicting the holders of GPUs 1 and 2 frees
    two GPUs but no bridged pair: a pod that requires NVLink could not use them."""
    cluster = Cluster([("split", "rtx-a6000-pairs"), ("bridged", "rtx-a6000-pairs"), ("pcie", "pcie-l40s")])
    for node in ("split", "bridged", "pcie"):
        cluster.fill(node, 8)
    victims = {"split": cluster.victims("split", [1, 2]), "bridged": cluster.victims("bridged", [2, 3]),
               "pcie": cluster.victims("pcie", [0, 1])}
    assert cluster.preempt(2, NVLINK_REQUIRED, victims) == {"bridged": victims["bridged"]}
    # The same evictions serve a pod that states no requirement: any two GPUs do, as kube-scheduler counts.
    assert cluster.preempt(2, {}, victims) == victims


def test_a_node_whose_eviction_frees_too_few_gpus_is_dropped() -> None:
    """On DGX H100 boards (NVSwitch: any four GPUs are a full-bandwidth set) a 4-GPU pod needs four GPUs free after the
    eviction: the GPUs already free count, and three freed on a full node are not enough."""
    cluster = Cluster([("three", "dgx-h100"), ("four", "dgx-h100"), ("two-free", "dgx-h100")])
    cluster.fill("three", 8)
    cluster.fill("four", 8)
    cluster.fill("two-free", 6)
    victims = {"three": cluster.victims("three", [0, 1, 2]), "four": cluster.victims("four", [4, 5, 6, 7]),
               "two-free": cluster.victims("two-free", sorted(cluster.holder["two-free"])[:2])}
    assert cluster.preempt(4, {}, victims) == {"four": victims["four"], "two-free": victims["two-free"]}
    assert cluster.preempt(4, NVLINK_REQUIRED, victims) == {"four": victims["four"], "two-free": victims["two-free"]}


def test_after_a_restart_the_kubelets_report_tells_what_an_eviction_frees() -> None:
    """A new extender (another seal key: no bind record of the old one is trusted) holds no reservation for the
    victims; the node agents' reports still say which GPUs each holds, so the split pair is still dropped."""
    cluster = Cluster([("split", "rtx-a6000-pairs"), ("bridged", "rtx-a6000-pairs")])
    cluster.fill("split", 8)
    cluster.fill("bridged", 8)
    restarted = ClusterState()
    restarted.nodes.replace(cluster.kube.list_nodes()[0])
    restarted.nodes.synced()
    restarted.pods.replace(cluster.kube.list_pods()[0])
    restarted.pods.synced()
    victims = {"split": cluster.victims("split", [1, 2]), "bridged": cluster.victims("bridged", [0, 1])}
    assert all(restarted.ledger.get(uid) is None for uids in victims.values() for uid in uids)
    client = TestClient(create_app(ExtenderService(restarted, cluster.kube)))
    assert cluster.preempt(2, NVLINK_REQUIRED, victims, client) == {"bridged": victims["bridged"]}


# Found by mutation testing (make mutate, BENCHMARKS.md): each fails on a preempt.py mutant that survived.


def test_a_pod_that_prefers_nvlink_may_evict_for_any_two_gpus() -> None:
    """Only a required interconnect narrows what an eviction must free: a pod that merely prefers NVLink runs on any
    two GPUs, as kube-scheduler counts them, so the node whose eviction frees no bridged pair is kept for it."""
    cluster = Cluster([("split", "rtx-a6000-pairs"), ("bridged", "rtx-a6000-pairs")])
    for node in ("split", "bridged"):
        cluster.fill(node, 8)
    victims = {"split": cluster.victims("split", [1, 2]), "bridged": cluster.victims("bridged", [2, 3])}
    assert cluster.preempt(2, {"gpu-topology.io/interconnect": "nvlink"}, victims) == victims
    assert cluster.preempt(2, NVLINK_REQUIRED, victims) == {"bridged": victims["bridged"]}


def test_victims_on_a_node_the_cache_does_not_know_drop_that_node_only() -> None:
    """A node kube-scheduler names that the extender has no view of (deleted meanwhile) is dropped; the nodes after
    it in the body are still judged."""
    cluster = Cluster([("bridged", "rtx-a6000-pairs"), ("split", "rtx-a6000-pairs")])
    for node in ("bridged", "split"):
        cluster.fill(node, 8)
    victims = {"gone": ["some-uid"], "bridged": cluster.victims("bridged", [2, 3]),
               "split": cluster.victims("split", [1, 2])}
    assert cluster.preempt(2, NVLINK_REQUIRED, victims) == {"bridged": victims["bridged"]}


def test_victims_whose_gpus_no_one_knows_are_taken_on_trust() -> None:
    """A victim that neither the ledger nor the node's report places (a pod the watch has not shown yet): what its
    eviction frees is unknown, so the node is kept and filter judges it after the eviction."""
    cluster = Cluster([("split", "rtx-a6000-pairs"), ("bridged", "rtx-a6000-pairs")])
    for node in ("split", "bridged"):
        cluster.fill(node, 8)
    victims = {"split": ["a-pod-no-one-has-seen"], "bridged": cluster.victims("bridged", [2, 3])}
    assert cluster.preempt(2, NVLINK_REQUIRED, victims) == victims


def test_a_pod_asking_no_gpu_keeps_every_nodes_victims() -> None:
    cluster = Cluster([("split", "rtx-a6000-pairs"), ("bridged", "rtx-a6000-pairs")])
    for node in ("split", "bridged"):
        cluster.fill(node, 8)
    victims = {"split": cluster.victims("split", [1, 2]), "bridged": cluster.victims("bridged", [2, 3])}
    assert cluster.preempt(0, {}, victims) == victims


def test_a_victim_the_ledger_holds_before_any_report_frees_its_reserved_gpus_only() -> None:
    """A victim bound a moment ago: the ledger holds its GPUs, no report shows it yet. What its eviction frees is
    those GPUs, known, not taken on trust. On an RTX A6000 board (pairs 0-1, 2-3, 4-5, 6-7) with 0, 2, 4 and 6 held
    and 5, 7 free, the victim holds 1 and 3: evicting it leaves no bridged pair, so a pod that requires NVLink
    drops the node."""
    cluster = Cluster([("split", "rtx-a6000-pairs"), ("bridged", "rtx-a6000-pairs")])
    cluster.fill("bridged", 8)
    ids = [gpu.uuid for gpu in cluster.kube.topologies["split"].gpus]
    cluster.state.ledger.reserve("busy-uid", "default/busy", "split", frozenset(ids[i] for i in (0, 2, 4, 6)))
    cluster.state.ledger.reserve("fresh-uid", "default/fresh", "split", frozenset(ids[i] for i in (1, 3)))
    victims = {"split": ["fresh-uid"], "bridged": cluster.victims("bridged", [2, 3])}
    assert cluster.preempt(2, NVLINK_REQUIRED, victims) == {"bridged": victims["bridged"]}
    assert cluster.preempt(2, {}, victims) == victims  # any two GPUs: 1 and 3 do
