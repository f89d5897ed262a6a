"""An extender wired as `gpu-topology-extender serve` wires it, in this process, against the in-process API
server: the real client, the reflectors, the service and the HTTP app (through Starlette's TestClient).

The fault and leader tests drive it as kube-scheduler would (filter, then bind) and look at what the API
server holds afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import kubernetes.client as k8s
import orjson
from fastapi.testclient import TestClient
from helpers.kube_api_server import FakeKubeApiServer, wait_until
from helpers.paths import ROOT

from extender.cache.cluster_state import ClusterState
from extender.cache.seal import Seal
from extender.demo.cluster import with_uuids
from extender.kube.client import KubernetesApi
from extender.kube.leader_election import LeaderElector
from extender.kube.leader_label import LeaderLabel
from extender.kube.reflector import Reflector
from extender.server.app import create_app
from extender.verbs.service import ExtenderService
from topology.codec import NodeState, encode_state, encode_topology
from topology.model import Topology
from topology.platforms import PLATFORMS

KEYS = ("gpu-topology.io/topology", "gpu-topology.io/state")
GPUS_KEY = "gpu-topology.io/gpus"
LEADER_LABEL = "gpu-topology.io/leader"
APP_LABELS = {"app.kubernetes.io/name": "gpu-topology-extender"}


def board(node: str, platform: str = "rtx-a6000-pairs") -> Topology:
    """A real platform's topology with the per-GPU UUIDs NVML would give on `node`."""
    return with_uuids(node, PLATFORMS[platform].topology())


def node_annotations(node: str, *, observed: datetime | None = None, used: frozenset[str] = frozenset(),
                     generation: int = 1, platform: str = "rtx-a6000-pairs") -> dict[str, str]:
    """What the node's reporter writes: its topology and a GPU state observed at `observed` (now)."""
    state = NodeState(used, frozenset(), observed or datetime.now(UTC), generation)
    return {KEYS[0]: encode_topology(board(node, platform)), KEYS[1]: encode_state(state)}


@dataclass
class Extender:
    api: KubernetesApi
    state: ClusterState
    service: ExtenderService
    client: TestClient
    reflectors: tuple[Reflector, Reflector]  # nodes, pods
    elector: LeaderElector | None = None
    label: LeaderLabel | None = None

    def stop(self) -> None:
        if self.label is not None:
            self.label.stop()
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


def extender_pod(name: str, namespace: str) -> dict:
    """The Pod an extender replica runs in, as the Deployment makes it: no GPUs, the app's labels."""
    return {"metadata": {"name": name, "namespace": namespace, "labels": dict(APP_LABELS)},
            "spec": {"containers": [{"name": "extender", "image": "gpu-topology-extender:0.1.0"}]},
            "status": {"phase": "Running"}}


def leader_pods(server: FakeKubeApiServer, namespace: str) -> list[str]:
    """The names of the Pods the Service selects: the app's labels and the leader label."""
    return server.pods_labelled(namespace, {**APP_LABELS, LEADER_LABEL: "true"})


def start(server: FakeKubeApiServer, *, seal: Seal | None = None, stale_after: float = 120.0, timeout: float = 2.0,
          elector: LeaderElector | None = None, wait: bool = True, bind_outcome_seconds: float = 60.0,
          levels: Sequence[str] = (), one_best: bool = False) -> Extender:
    """Start the extender; with `wait`, return once its first lists are in (it is ready to filter). With an
    `elector`, the replica runs in a Pod named after its identity (created here) and keeps the leader label on
    it, as `serve --leader-elect` does. `levels`: --topology-levels. Without `one_best` (serve's default has it),
    filter passes every fit, so a test sees each node's verdict."""
    api = KubernetesApi.from_configuration(k8s.Configuration(host=server.url), timeout=timeout, instance="test")
    state = ClusterState(stale_after=stale_after, seal=seal, bind_outcome_seconds=bind_outcome_seconds,
                         levels=levels)
    nodes = Reflector(api.list_nodes, api.watch_nodes, state.nodes, name="nodes", watch_timeout=5)
    pods = Reflector(api.list_pods, api.watch_pods, state.pods, name="pods", watch_timeout=5)
    service = ExtenderService(state, api, one_best=one_best) if elector is None else ExtenderService(
        state, api, leader=elector, pods=pods, one_best=one_best)
    for reflector in (nodes, pods):
        reflector.start()
    label = None
    if elector is not None:
        server.add_pod(extender_pod(elector.identity, elector.namespace))
        label = LeaderLabel(api, elector.namespace, elector.identity, state.keys.leader, service.leads, period=0.02,
                            retry=0.1)
        label.start()
    extender = Extender(api, state, service, TestClient(create_app(service)), (nodes, pods), elector, label)
    if wait:
        wait_until(lambda: state.ready, what="the first Node and Pod lists")
    return extender


def held_gpus(server: FakeKubeApiServer, node: str) -> list[str]:
    """Every GPU the pods bound to `node` carry in their assignment, one entry per holder (duplicates kept)."""
    return [gpu for pod in server.pods_on(node)
            for gpu in (pod["metadata"].get("annotations") or {}).get(GPUS_KEY, "").split(",") if gpu]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Replica:
    """One `gpu-topology-extender serve --leader-elect` process of this checkout, with the seal key in `tmp`
    (`write_seal_key`) and `options` added (timings, say)."""

    def __init__(self, identity: str, server: FakeKubeApiServer, tmp: Path, namespace: str,
                 options: tuple[str, ...] = ()) -> None:
        self.identity, self.port = identity, free_port()
        server.add_pod(extender_pod(identity, namespace))  # the Pod the downward API names, for the leader label
        kubeconfig = server.write_kubeconfig(tmp / "kubeconfig")
        script = Path(sys.executable).with_name("gpu-topology-extender")
        command = [str(script)] if script.exists() else [sys.executable, "-m", "extender.cli"]
        self.log = open(tmp / f"{identity}.log", "w+")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            [*command, "serve", "--kubeconfig", str(kubeconfig), "--port", str(self.port),
             "--seal-key-file", str(tmp / "seal.key"), "--leader-elect", "--leader-elect-namespace", namespace,
             "--leader-elect-identity", identity, *options],
            cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),  # this checkout's code
                 "POD_NAME": identity, "POD_NAMESPACE": namespace})

    @staticmethod
    def write_seal_key(tmp: Path) -> None:
        """The key the replicas share (a Secret in the deployment)."""
        (tmp / "seal.key").write_text(os.urandom(32).hex())

    def get(self, path: str) -> tuple[int, str]:
        if self.process.poll() is not None:
            raise AssertionError(f"replica {self.identity} exited with {self.process.returncode}: {self.output()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError:
            return 0, ""

    def bind(self, pod: dict, node: str) -> str:
        metadata = pod["metadata"]
        body = orjson.dumps({"PodName": metadata["name"], "PodNamespace": metadata["namespace"],
                             "PodUID": metadata["uid"], "Node": node})
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/bind", data=body, method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return orjson.loads(answer.read())["Error"]

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        self.log.close()
