"""An extender wired as `gpu-topology-extender serve` wires it, in this process, against the in-process API
server: the real client, the reflectors, the service and the HTTP app (through Starlette's TestClient).

The fault and leader tests drive it as kube-scheduler would (filter, then bind) and look at what the API
server holds afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import kubernetes.client as k8s
import orjson
from fastapi.testclient import TestClient
from kube_api_server import FakeKubeApiServer, wait_until

from extender.app import create_app
from extender.demo_cluster import with_uuids
from extender.kube import KubernetesApi
from extender.leader import LeaderElector
from extender.reflector import Reflector
from extender.seal import Seal
from extender.service import ExtenderService
from extender.state import ClusterState
from topology.codec import NodeState, encode_state, encode_topology
from topology.model import Topology
from topology.platforms import PLATFORMS

KEYS = ("gpu-topology.io/topology", "gpu-topology.io/state")
GPUS_KEY = "gpu-topology.io/gpus"


def board(node: str, platform: str = "rtx-a6000-pairs") -> Topology:
    """A real platform's topology with the per-GPU UUIDs NVML would give on `node`."""
    return with_uuids(node, PLATFORMS[platform].topology())


def node_annotations(node: str, *, observed: datetime | None = None, used: frozenset[str] = frozenset(),
                     generation: int = 1) -> dict[str, str]:
    """What the node's reporter writes: its topology and a GPU state observed at `observed` (now)."""
    state = NodeState(used, frozenset(), observed or datetime.now(UTC), generation)
    return {KEYS[0]: encode_topology(board(node)), KEYS[1]: encode_state(state)}


@dataclass
class Extender:
    api: KubernetesApi
    state: ClusterState
    service: ExtenderService
    client: TestClient
    reflectors: tuple[Reflector, Reflector]  # nodes, pods
    elector: LeaderElector | None = None

    def stop(self) -> None:
        if self.elector is not None:
            self.elector.stop()
        for reflector in self.reflectors:
            reflector.stop()

    def filter(self, pod: dict, nodes: list[str]) -> dict:
        return self.client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": nodes})).json()

    def bind(self, pod: dict, node: str) -> str:
        """The bind's Error ("" when bound)."""
        metadata = pod["metadata"]
        return self.client.post("/bind", content=orjson.dumps({
            "PodName": metadata["name"], "PodNamespace": metadata["namespace"], "PodUID": metadata["uid"],
            "Node": node})).json()["Error"]

    def readyz(self) -> tuple[int, str]:
        answer = self.client.get("/readyz")
        return answer.status_code, answer.text


def start(server: FakeKubeApiServer, *, seal: Seal | None = None, stale_after: float = 120.0, timeout: float = 2.0,
          elector: LeaderElector | None = None, wait: bool = True, bind_outcome_seconds: float = 60.0) -> Extender:
    """Start the extender; with `wait`, return once its first lists are in (it is ready to filter)."""
    api = KubernetesApi.from_configuration(k8s.Configuration(host=server.url), timeout=timeout, instance="test")
    state = ClusterState(stale_after=stale_after, seal=seal, bind_outcome_seconds=bind_outcome_seconds)
    nodes = Reflector(api.list_nodes, api.watch_nodes, state.nodes, name="nodes", watch_timeout=5)
    pods = Reflector(api.list_pods, api.watch_pods, state.pods, name="pods", watch_timeout=5)
    service = ExtenderService(state, api) if elector is None else ExtenderService(state, api, leader=elector, pods=pods)
    for reflector in (nodes, pods):
        reflector.start()
    extender = Extender(api, state, service, TestClient(create_app(service)), (nodes, pods), elector)
    if wait:
        wait_until(lambda: state.ready, what="the first Node and Pod lists")
    return extender


def held_gpus(server: FakeKubeApiServer, node: str) -> list[str]:
    """Every GPU the pods bound to `node` carry in their assignment, one entry per holder (duplicates kept)."""
    return [gpu for pod in server.pods_on(node)
            for gpu in (pod["metadata"].get("annotations") or {}).get(GPUS_KEY, "").split(",") if gpu]
