"""An in-memory cluster of real platforms for `serve --demo` and the tests: no Kubernetes needed.

It plays the API server (it implements `KubeApi`: pod reads, Bindings with annotations, Events), each
node's kubelet with the node agent's device plugin in `--mode deliver` (a bound pod is admitted container by
container, each asking the agent's own attribution and answer, `topology.agent.claims`), and each node's
agent (after every bind or pod end it republishes the node's `state` annotation with the GPUs its pods
hold), and feeds the extender's `ClusterState` the same raw objects the watches would.
"""

from __future__ import annotations

import copy
import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from extender.cache.cluster_state import ClusterState
from extender.kube.client import Conflict, KubeError
from extender.demo.dra_objects import allocated_claim, gpu_device, gpu_slice
from topology.agent.claims import Allocation, Board, Delivered, Preferred, identify, read_pod, remember
from topology.codec import NodeState, encode_state, encode_topology
from topology.model import Topology, installed_subset
from topology.platforms import PLATFORMS
from topology.sharing import Sharing
from topology.containers import Kind, container_needs

DEMO_NODES: tuple[tuple[str, str], ...] = (
    ("dgx-h100-1", "dgx-h100"), ("dgx-h100-2", "dgx-h100"),
    ("dgx-a100-1", "dgx-a100"), ("dgx-a100-2", "dgx-a100"),
    ("dgx1-v100-1", "dgx1-v100"), ("dgx1-v100-2", "dgx1-v100"),
    ("a6000-1", "rtx-a6000-pairs"), ("a6000-2", "rtx-a6000-pairs"),
    ("l40s-1", "pcie-l40s"), ("l40s-2", "pcie-l40s"),
)


@dataclass(frozen=True, slots=True)
class SharedNode:
    """A demo node whose GPUs are shared: GPU feature discovery's labels, and how many kubelet devices each GPU
    becomes (time-slicing replicas `<uuid>::<n>`, or MIG slices `MIG-…`)."""

    labels: Mapping[str, str]
    devices_per_gpu: int
    mig: bool = False


def single_gpu(platform: str) -> Topology:
    """GPU 0 of a platform's capture, alone: a one-GPU node (a VM slice, or a GPU given over to sharing)."""
    return installed_subset(PLATFORMS[platform].topology(), (0,))


def with_uuids(node: str, topology: Topology) -> Topology:
    """Give a parsed capture the per-GPU identities NVML would: stable, unique per node."""
    def uuid(index: int) -> str:
        digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
        return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
    gpus = tuple(replace(gpu, uuid=uuid(gpu.index), pci_bus_id=f"0000:{0x10 + gpu.index * 3:02x}:00.0")
                 for gpu in topology.gpus)
    return replace(topology, gpus=gpus)


class DemoCluster:
    def __init__(self, state: ClusterState, nodes: Sequence[tuple[str, str]] = DEMO_NODES,
                 clock: Callable[[], float] = time.time, boards: Mapping[str, Topology] | None = None,
                 shared: Mapping[str, SharedNode] | None = None,
                 labels: Mapping[str, Mapping[str, str]] | None = None,
                 dra: Mapping[str, tuple[int, ...]] | None = None) -> None:
        """`boards` gives the board of a node, by name, that has other GPUs than its platform's capture (the
        benchmark replay's nodes with some of a board's GPUs installed); `shared` the nodes whose GPUs are
        shared, whose kubelet hands out replicas or MIG slices as NVIDIA's device plugin does there; `labels`
        a node's labels, by name (GPU feature discovery's nvidia.com/gpu.clique, the network levels'); `dra` the
        nodes whose GPUs NVIDIA's DRA driver publishes, each with the order its slice lists them in."""
        self.state = state
        self.clock = clock
        self.shared = dict(shared or {})
        self.labels = {name: dict(values) for name, values in (labels or {}).items()}
        boards = boards or {}
        self.topologies = {name: with_uuids(name, boards.get(name) or PLATFORMS[platform].topology())
                           for name, platform in nodes}
        self.platform_of = dict(nodes)
        self.pods: dict[str, dict[str, Any]] = {}
        self._uids: dict[tuple[str, str], list[str]] = {}  # (namespace, name) -> uids, oldest first: O(1) reads
        self._on_node: dict[str, dict[str, None]] = {name: {} for name in self.topologies}  # node -> uids bound
        self.delivered: dict[str, dict[str, tuple[str, ...]]] = {}  # pod uid -> container -> the GPUs it got
        self._boards = {name: Board(topology) for name, topology in self.topologies.items()}
        self._answered: dict[str, Delivered] = {name: {} for name in self.topologies}  # the agents' records
        self.events: list[tuple[str, str, str, str]] = []
        self._generation = 0
        self._topology_text: dict[str, tuple[Topology, str]] = {}
        self._lock = threading.RLock()
        self.dra = dict(dra or {})
        self.claims: dict[str, tuple[str, tuple[int, ...]]] = {}  # pod uid -> (node, GPUs) its DRA claim holds
        self._held: dict[str, set[int]] = {}  # node -> the GPUs claims hold there (what first_fit skips)
        state.nodes.replace([self._node(name) for name in self.topologies])
        state.nodes.synced()
        state.slices.replace([gpu_slice(name, (), seed=None, devices=[
            gpu_device(index, self.topologies[name].gpus[index].uuid or "") for index in order])
            for name, order in self.dra.items()])
        state.claims.replace([])
        state.pods.replace([])
        state.pods.synced()

    # The KubeApi the extender writes through.
    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._find(namespace, name))

    def bind_soon(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """In process, a bind is a method call: the service makes it on a bind thread."""
        return None

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        with self._lock:
            pod = self._find(namespace, name)
            if pod["metadata"]["uid"] != uid:
                raise Conflict(f"pod {namespace}/{name} has another UID", 409)
            if pod["spec"].get("nodeName"):
                raise Conflict(f"pod {namespace}/{name} is already assigned to node {pod['spec']['nodeName']}", 409)
            pod["spec"]["nodeName"] = node
            self._on_node[node][uid] = None
            pod["metadata"].setdefault("annotations", {}).update(annotations)
            self._bump(pod)
            self.state.pods.apply("MODIFIED", pod)
            if node in self.shared:
                self._admit_shared(node, pod)
            elif node in self.dra:
                gpus = self.topologies[node].gpus
                self.delivered[uid] = {pod["spec"]["containers"][0]["name"]:
                                       tuple(gpus[index].uuid or "" for index in self.claims[uid][1])}
            else:
                self._admit(node, pod)
            self.report(node)

    def indices(self, node: str, ids: Iterable[str]) -> tuple[int, ...]:
        """The node's GPUs named by UUID, as indices in order: how a person reads a set."""
        index_of = {gpu.uuid: gpu.index for gpu in self.topologies[node].gpus}
        return tuple(sorted(index_of[uuid] for uuid in ids))

    def delivered_gpus(self, uid: str) -> tuple[int, ...]:
        """The GPUs the kubelet gave a bound pod's containers, as indices."""
        node = self.pods[uid]["spec"]["nodeName"]
        return self.indices(node, (gpu for ids in self.delivered[uid].values() for gpu in ids))

    def first_fit(self, node: str, count: int) -> tuple[int, ...] | None:
        """What kube-scheduler's DRA allocator gives a request of `count` whole GPUs on a DRA node: the first
        devices in the slice's order that no claim holds, or None where too few are free. Written apart from the
        extender's own prediction (cache/node_view.py `first_fit`), as the allocator it stands in for is."""
        held = self._held.get(node, set())
        free = [index for index in self.dra[node] if index not in held]
        return tuple(free[:count]) if len(free) >= count else None

    def allocate(self, uid: str, node: str) -> None:
        """kube-scheduler's DRA PreBind for a pod asking `nvidia.com/gpu` on a DRA node (KEP-5004): its claim,
        allocated to the first fit and reserved for the pod, before the extender's bind."""
        with self._lock:
            count = int(self.pods[uid]["spec"]["containers"][0]["resources"]["requests"][self.state.resource])
            gpus = self.first_fit(node, count)
            if gpus is None:
                raise RuntimeError(f"node {node} has no {count} devices free")
            self.hold(uid, node, gpus)
            self.state.claims.apply("ADDED", allocated_claim(uid, node, [f"gpu-{index}" for index in gpus],
                                                             pods=[uid], extended=True))

    def hold(self, uid: str, node: str, gpus: tuple[int, ...]) -> None:
        """The pod's claim holds these GPUs of the node."""
        self.claims[uid] = (node, gpus)
        self._held.setdefault(node, set()).update(gpus)

    def release(self, uid: str) -> tuple[str, tuple[int, ...]] | None:
        """The pod's claim lets its GPUs go: (node, GPUs) it held, if any."""
        claim = self.claims.pop(uid, None)
        if claim is not None:
            self._held[claim[0]].difference_update(claim[1])
        return claim

    def allocatable(self, node: str) -> int:
        """The node's devices of the GPU resource: its GPUs, or their replicas or slices on a shared node; none on
        a DRA node (its GPUs are in its ResourceSlice)."""
        if node in self.dra:
            return 0
        shared = self.shared.get(node)
        return self.topologies[node].size * (1 if shared is None else shared.devices_per_gpu)

    def devices(self, node: str) -> tuple[str, ...]:
        """The kubelet devices of a shared node, as NVIDIA's device plugin advertises them."""
        shared, gpus = self.shared[node], self.topologies[node].gpus
        if shared.mig:
            return tuple(f"MIG-{gpu.uuid[4:12]}-{slot}" for gpu in gpus for slot in range(shared.devices_per_gpu))
        return tuple(f"{gpu.uuid}::{slot}" for gpu in gpus for slot in range(shared.devices_per_gpu))

    def _admit_shared(self, node: str, pod: dict[str, Any]) -> None:
        """NVIDIA's device plugin on a shared node: the first free replicas or slices, whatever the extender
        thought (it annotated nothing there)."""
        held = {device for uid in self._on_node[node] for ids in self.delivered.get(uid, {}).values()
                for device in ids}
        free = [device for device in self.devices(node) if device not in held]
        count = int(pod["spec"]["containers"][0]["resources"]["requests"][self.state.resource])
        self.delivered[pod["metadata"]["uid"]] = {pod["spec"]["containers"][0]["name"]: tuple(free[:count])}

    def _admit(self, node: str, pod: dict[str, Any]) -> None:
        """The kubelet admits the pod: each GPU container in its order draws from the init pool first, then
        asks the agent's GetPreferredAllocation, takes what is free of the answer, fills the rest, and
        Allocates; the agent attributes each call from the pods on the node and what the kubelet lists."""
        board, resource, keys = self._boards[node], self.state.resource, self.state.keys
        on_node = [self.pods[uid] for uid in self._on_node[node]]
        pods = [read for other in on_node if (read := read_pod(other, keys, resource, board.ids)) is not None]
        listed = {(other["metadata"]["namespace"], other["metadata"]["name"]): dict(self.delivered[uid])
                  for other in on_node if (uid := other["metadata"]["uid"]) in self.delivered}
        needs = container_needs(pod["spec"], resource)
        key, got = (pod["metadata"]["namespace"], pod["metadata"]["name"]), {}
        listed[key] = {need.name: () for need in needs if need.kind is not Kind.INIT}
        used = {gpu for ids in listed.values() for held in ids.values() for gpu in held}
        pool: list[str] = []
        for need in needs:
            drawn = pool[:need.count]
            available = [gpu for gpu in board.ids if gpu not in used]
            chosen = list(drawn)
            if len(chosen) < need.count:
                ask = Preferred(tuple(available + drawn), tuple(drawn), need.count)
                preferred = identify(ask, pods, listed, self._answered[node], board).ids
                chosen += [gpu for gpu in preferred if gpu in available and gpu not in chosen]
                chosen += [gpu for gpu in available if gpu not in chosen]
                chosen = chosen[:need.count]
            decision = identify(Allocation(tuple(chosen)), pods, listed, self._answered[node], board)
            self._answered[node] = remember(self._answered[node], decision, pods)
            got[need.name] = tuple(chosen)
            used |= set(chosen)
            if need.kind is Kind.INIT:
                pool += [gpu for gpu in chosen if gpu not in pool]
            else:
                pool = [gpu for gpu in pool if gpu not in chosen]
                listed[key][need.name] = tuple(chosen)
        self.delivered[pod["metadata"]["uid"]] = got

    def emit_event(self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str,
                   event_type: str = "Warning") -> None:
        self.events.append((f"{namespace}/{pod_name}", event_type, reason, message))

    def list_nodes(self) -> tuple[list[dict[str, Any]], str]:
        return [self._node(name) for name in self.topologies], str(self._generation)

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        return list(self.pods.values()), str(self._generation)

    def watch_nodes(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())

    # What users and kubelets do.
    def create_pod(self, name: str, gpus: int, annotations: Mapping[str, str] | None = None,
                   namespace: str = "default", created: float | None = None) -> dict[str, Any]:
        """The pod as the API server stores it, stamped with its creation time (`created`, else now)."""
        uid = hashlib.sha256(f"{namespace}/{name}/{len(self.pods)}".encode()).hexdigest()[:32]
        stamp = datetime.fromtimestamp(self.clock() if created is None else created, timezone.utc)
        return self.add_pod({"metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": "1",
                                          "creationTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                          "annotations": dict(annotations or {})},
                             "spec": {"containers": [{"name": "main", "resources": {
                                 "limits": {self.state.resource: str(gpus)},
                                 "requests": {self.state.resource: str(gpus)}}}]},
                             "status": {"phase": "Pending"}})

    def add_pod(self, pod: Mapping[str, Any], adopt: bool = False) -> dict[str, Any]:
        """Admit a pod object as the API server would hold it: a pending copy of it, or with `adopt` the object
        itself (one made for this call, which the caller no longer touches)."""
        with self._lock:
            stored = dict(pod) if adopt else copy.deepcopy(dict(pod))
            stored["spec"].pop("nodeName", None)
            stored["metadata"]["resourceVersion"] = str(stored["metadata"].get("resourceVersion") or "1")
            self.pods[stored["metadata"]["uid"]] = stored
            self._uids.setdefault((stored["metadata"]["namespace"], stored["metadata"]["name"]), []).append(
                stored["metadata"]["uid"])
            self.state.pods.apply("ADDED", stored)
            return stored

    def finish_pod(self, uid: str) -> None:
        """The pod ends: the watch drops it and the node's reporter no longer lists its GPUs."""
        with self._lock:
            pod = self.pods.pop(uid)
            key = (pod["metadata"]["namespace"], pod["metadata"]["name"])
            self._uids[key].remove(uid)
            if not self._uids[key]:
                del self._uids[key]
            if pod["spec"].get("nodeName"):
                self._on_node[pod["spec"]["nodeName"]].pop(uid, None)
            self.delivered.pop(uid, None)
            claim = self.release(uid)
            if claim is not None:
                self.state.claims.apply("DELETED", allocated_claim(uid, claim[0], []))
            pod["status"]["phase"] = "Succeeded"
            self.state.pods.apply("DELETED", pod)
            if pod["spec"].get("nodeName"):
                self.report(pod["spec"]["nodeName"])

    def report(self, node: str) -> None:
        """The node's reporter publishes what its pods hold now."""
        with self._lock:
            self.state.nodes.apply("MODIFIED", self._node(node))

    def refresh_all(self) -> None:
        for node in self.topologies:
            self.report(node)

    def _node(self, name: str) -> dict[str, Any]:
        """The node as its agent reports it: what the kubelet allocated to each pod (its containers listed)."""
        self._generation += 1
        shared = self.shared.get(name)
        # The agent reports a replica as the GPU it is a replica of, and leaves MIG slices out (devices.py).
        pods = {f"{pod['metadata']['namespace']}/{pod['metadata']['name']}":
                frozenset(device.split("::")[0] for held in self.delivered.get(pod["metadata"]["uid"], {}).values()
                          for device in held if not device.startswith("MIG-"))
                for pod in (self.pods[uid] for uid in self._on_node[name])}
        pods = {key: gpus for key, gpus in pods.items() if gpus}
        used = frozenset(gpu for gpus in pods.values() for gpu in gpus)
        observed = Sharing.NONE if shared is None else Sharing.MIG if shared.mig else Sharing.REPLICAS
        state = NodeState(used, frozenset(), datetime.fromtimestamp(self.clock(), timezone.utc), self._generation,
                          pods, observed)
        return {"metadata": {"name": name, "resourceVersion": str(self._generation),
                             "labels": {**self.labels.get(name, {}), **(shared.labels if shared is not None else {})},
                             "annotations": {self.state.keys.topology: self._published(name),
                                             self.state.keys.state: encode_state(state)}},
                "status": {"allocatable": {self.state.resource: str(self.allocatable(name))}}}

    def _published(self, name: str) -> str:
        """The node's topology annotation, encoded again only when its board changed: its agent publishes the
        same text on every report, and a load test's churn would otherwise spend the extender's CPU on it."""
        topology = self.topologies[name]
        known = self._topology_text.get(name)
        if known is None or known[0] is not topology:
            known = self._topology_text[name] = (topology, encode_topology(topology))
        return known[1]

    def _find(self, namespace: str, name: str) -> dict[str, Any]:
        uids = self._uids.get((namespace, name))
        if uids:
            return self.pods[uids[0]]
        raise KubeError(f"pods {name!r} not found", 404)

    def _bump(self, pod: dict[str, Any]) -> None:
        pod["metadata"]["resourceVersion"] = str(int(pod["metadata"]["resourceVersion"]) + 1)
