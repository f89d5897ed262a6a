"""The real extender server on a large in-memory cluster, for `loadtests/load_extender.py`.

It builds a DemoCluster of N nodes (the ten real platforms of `extender.demo.cluster.DEMO_NODES`, repeated with
a numeric suffix), occupies a share of the GPUs by binding 1-, 2- and 4-GPU pods through `ExtenderService.bind`
on random nodes (so free masks vary from node to node), creates the first pending pods the load generator will
schedule, then serves `extender.server.app.create_app(service)` as `gpu-topology-extender serve` does
(`extender.server.serve.server_config`: uvicorn with the extender's own protocol, which answers the verbs; plain HTTP),
one process, one worker, no access log, 127.0.0.1 only. It prints one line `READY {json}` with the port and the
cluster's figures.

With `--dra-share S` that share of the nodes (the first names, every platform among them) are DRA-GPU nodes,
as `make bench-dra` builds them: NVIDIA's driver publishes each one's GPUs in a ResourceSlice, in an order shuffled
per node (`extender.demo.dra_objects`), and its allocatable has no `nvidia.com/gpu`; the fill's pods there are
`nvidia.com/gpu: N` pods whose GPUs an allocated ResourceClaim holds (KEP-5004: kube-scheduler's PreBind allocates
the first fit in slice order before the extender's bind). The load's pods are then DRA pods too (`load_pod`):
half of them ask their GPUs through the claim templates of scheduler-config/dra-claim-templates.yaml, whose claim
the resourceclaim controller makes before kube-scheduler sees the pod. The generator plays kube-scheduler's PreBind
through `POST /loadtest/prebind` before each bind on a DRA node.

With `--leaf-nodes L` every node carries Topograph's network labels (a leaf per L consecutive names, a spine
per eight leaves) and the extender's state is built with those levels. With `--plans N` (which needs the
levels), N groups are then planned before serving, as kube-scheduler's first cycle for each plans it: every
member is created pending and the first member's filter goes through the service, so N plans hold their open
slots in the ledger (PLANNED entries) against every other pod while the load runs. They never expire during a
run: the group timeout is as long as the staleness bound.

The cluster stays in a steady state while the load runs. After every bind of a load pod a background thread
plays users and kubelets: it creates the next pending pod (the generator's pods `load-{i}` stay a window ahead)
and ends the oldest running pod, so the number of running pods stays what the initial fill left. Both arrive
as the watch events a real API server would send, off the request path, in this process. On DRA nodes the churn is
coherent: a new claim-template pod's claim is created with it, and a pod that ends takes its claim with it (the
claim kube-scheduler made for a KEP-5004 pod, or the one made from its template), so what the claims hold is what
the running pods hold.

`load_pod(i)` is the pending pod `load-{i}` exactly as the API server holds it, so the generator rebuilds the
same JSON kube-scheduler would send. The pod is shaped like the pod kube-scheduler v1.36.2 sent in
`shared/kube-scheduler/annotated-nvlink--filter.json`.

Added to the product app, under /loadtest/ only, for the generator's report: `GET /loadtest/stats` (time spent
in the in-process API server, churn counts, garbage-collector pauses, plans in force, claims allocated, errors the
process logged: ErrorCount), for the generator's cycles `POST /loadtest/prebind` (kube-scheduler's DRA PreBind for
a pod about to be bound to a DRA node: its claim allocated, or why not), `POST /loadtest/profile/start|stop`
(cProfile of the event-loop thread, and of the service's filter and prioritize where they run on a thread of their
own), for the soak `POST /loadtest/replace-board` (a node with no pods gets a board the extender has not seen), and
with `--hostile FILE` `POST /loadtest/hostile-rotate` (the hostile node publishes another set of used GPUs).

    python loadtests/large_cluster_server.py --nodes 5000 [--fill 0.45] [--window 2000] [--port 0]
        [--leaf-nodes 20 [--plans 1000]] [--dra-share 0.5]
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import hashlib
import itertools
import json
import logging
import pstats
import queue
import random
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
import yaml
from fastapi import Request
from fastapi.responses import JSONResponse

from extender.api.dra import CLAIMS_MARKER
from extender.api.pod_request import DEFAULT_GPU_RESOURCE
from extender.api.wire import BindingArgs, ExtenderArgs
from extender.cache.assignments import Phase
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import NodeKey
from extender.demo.cluster import DEMO_NODES, DemoCluster, with_uuids
from extender.demo.dra_objects import allocated_claim
from extender.server.app import create_app
from extender.server.gc_freeze import settle_when_synced
from extender.server.serve import ServeOptions, server_config
from extender.verbs.drains import MAX_DRAINS
from extender.verbs.service import ExtenderService
from topology.agent.claims import Board
from topology.annotations import AnnotationKeys
from topology.codec import NodeState, decode_topology, encode_state
from topology.model import Topology
from topology.platforms import PLATFORMS

KEYS = AnnotationKeys()
Answer = TypeVar("Answer")
LOAD_NAMESPACE = "ml-team"
# The load pods' GPU counts and topology wishes, repeating: one in eight prefers NVLink, one in eight requires it.
LOAD_SIZES = (1, 2, 1, 4, 2, 1, 4, 2)
FILL_SIZES = (1, 1, 2, 2, 4)
# Nodes never go stale during a run: the reporters' heartbeats are not simulated (node updates come from binds
# and pod ends only), so the staleness bound is set past any run's length; so is the group timeout, so that no
# plan expires while the load runs.
STALE_AFTER_SECONDS = 24 * 3600.0
HOSTILE_NODE = "hostile-0"
# Topograph's node labels, outermost first, as --topology-levels lists them.
SPINE, LEAF = "network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"
SPINE_LEAVES = 8
PLAN_NAMESPACE = "training"
# GPUs per member of a planned group. Two, not one: a single GPU has no ring, so no full-bandwidth set of one
# exists (topology/full_sets.py) and a group of 1-GPU members is never planned (extender/groups/layouts.py).
PLAN_GPUS = 2
DRA_SEED = 7  # of the DRA nodes' slice orders
TEMPLATES = Path(__file__).resolve().parents[1] / "scheduler-config" / "dra-claim-templates.yaml"
CLAIM = "gpus"  # a claim-template pod's name for its claim, as the templates' own example names it


def node_names(count: int) -> list[str]:
    """`count` names: DEMO_NODES' ten names with a replica suffix, replica by replica, so any run of ten
    consecutive names holds every platform."""
    names = (f"{name}-{replica:04d}" for replica in itertools.count() for name, _ in DEMO_NODES)
    return list(itertools.islice(names, count))


def cluster_nodes(count: int) -> tuple[tuple[str, str], ...]:
    platforms = itertools.cycle(platform for _, platform in DEMO_NODES)
    return tuple(zip(node_names(count), platforms))


def pod_uid(seed: str) -> str:
    """A stable UUID for a pod the generator and the server both name."""
    return str(uuid.UUID(bytes=hashlib.sha256(seed.encode()).digest()[:16]))


def network_labels(names: Sequence[str], leaf_nodes: int) -> dict[str, dict[str, str]]:
    """Topograph's labels: a leaf per `leaf_nodes` consecutive names, a spine per SPINE_LEAVES leaves. With a
    multiple of ten nodes per leaf, every leaf holds the same mix of platforms."""
    return {name: {SPINE: f"spine-{index // (leaf_nodes * SPINE_LEAVES)}", LEAF: f"leaf-{index // leaf_nodes}"}
            for index, name in enumerate(names)}


def dra_names(names: Sequence[str], share: float) -> list[str]:
    """The nodes a run with this DRA share makes DRA nodes: the first names, which hold every platform alike."""
    return list(names[:round(share * len(names))])


def dra_orders(layout: Sequence[tuple[str, str]], share: float) -> dict[str, tuple[int, ...]]:
    """Each DRA node's slice order, the GPUs' indices as the slice lists them: shuffled per node, as NVIDIA's driver
    lists them in a Go map walk's order (each node's shuffle seeded as `extender.demo.dra_objects.gpu_slice`'s)."""
    platform_of = dict(layout)
    sizes = {platform: PLATFORMS[platform].topology().size for platform in set(platform_of.values())}
    rng = random.Random(DRA_SEED)
    orders = {}
    for name in dra_names([name for name, _ in layout], share):
        order = list(range(sizes[platform_of[name]]))
        random.Random(rng.randrange(1 << 30)).shuffle(order)
        orders[name] = tuple(order)
    return orders


def load_pod(index: int, dra: bool = False) -> dict[str, Any]:
    """The pending pod `load-{index}` as the API server holds it (and kube-scheduler sends it). With `dra` (a run
    with DRA nodes), the third and fourth of every four ask their GPUs through the shipped claim template of their
    size (1, 4, 4 and 2 GPUs in turn); the others ask `nvidia.com/gpu`, which kube-scheduler turns into a claim on a
    DRA node (KEP-5004)."""
    annotations = {}
    if index % 8 == 6:
        annotations[KEYS.interconnect] = "nvlink"
    elif index % 8 == 7:
        annotations.update({KEYS.interconnect: "nvlink", KEYS.placement: "required"})
    gpus = LOAD_SIZES[index % len(LOAD_SIZES)]
    return training_pod(f"load-{index}", LOAD_NAMESPACE, pod_uid(f"load/{index}"), gpus, annotations,
                        f"gpus-{gpus}" if dra and index % 4 >= 2 else None)


def claims_only(pod: Mapping[str, Any]) -> bool:
    """The pod asks its GPUs through claims only: kube-scheduler's DRA plugin passes it on DRA nodes only."""
    return bool(pod["spec"].get("resourceClaims")) and not any(
        DEFAULT_GPU_RESOURCE in container["resources"].get("requests", {}) for container in pod["spec"]["containers"])


@functools.cache
def claim_templates() -> dict[str, dict[str, Any]]:
    """The shipped ResourceClaimTemplates by name: the claim spec each gives the claims made from it."""
    documents = yaml.safe_load_all(TEMPLATES.read_text(encoding="utf-8"))
    return {document["metadata"]["name"]: document["spec"]["spec"] for document in documents
            if document and document.get("kind") == "ResourceClaimTemplate"}


def made_claim(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ResourceClaim the resourceclaim controller makes from a claim-template pod's template, unallocated and
    named as the pod's status names it (None for a pod with no template)."""
    templates = [claim for claim in pod["spec"].get("resourceClaims", ()) if "resourceClaimTemplateName" in claim]
    if not templates:
        return None
    metadata, made = pod["metadata"], pod["status"]["resourceClaimStatuses"][0]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": made["resourceClaimName"], "namespace": metadata["namespace"],
                         "uid": pod_uid(f"claim/{metadata['uid']}"),
                         "annotations": {"resource.kubernetes.io/pod-claim-name": made["name"]},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": metadata["name"],
                                              "uid": metadata["uid"], "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": claim_templates()[templates[0]["resourceClaimTemplateName"]]}


def plan_members(group: int) -> int:
    """Members of planned group `group`: 2, 3 or 4 in turn."""
    return 2 + group % 3


def group_pod(group: int, member: int) -> dict[str, Any]:
    """Member `member` of planned group `job-{group}`: required in one leaf, PLAN_GPUS GPUs."""
    annotations = {KEYS.group: f"job-{group}", KEYS.group_size: str(plan_members(group)), KEYS.group_span: LEAF,
                   KEYS.group_placement: "required"}
    return training_pod(f"job-{group}-{member}", PLAN_NAMESPACE, pod_uid(f"group/{group}/{member}"), PLAN_GPUS,
                        annotations)


def training_pod(name: str, namespace: str, uid: str, gpus: int, annotations: dict[str, str],
                 template: str | None = None) -> dict[str, Any]:
    """A pending training pod shaped like the one kube-scheduler v1.36.2 sent in the captured scenario, asking
    `gpus` as `nvidia.com/gpu` (0: no GPU). With `template`, its GPUs come instead from the claim made from that
    ResourceClaimTemplate, and it carries the marker scheduler-config/dra-claims-policy.yaml adds to such a pod (in
    its limits, and in its requests as kube-apiserver defaults them)."""
    extended = {CLAIMS_MARKER: "1"} if template else {DEFAULT_GPU_RESOURCE: str(gpus)} if gpus else {}
    container: dict[str, Any] = {
        "name": "trainer", "image": "registry.invalid/llm-finetune:1.0",
        "command": ["torchrun", f"--nproc-per-node={gpus}", "train.py"],
        "env": [{"name": "NCCL_P2P_LEVEL", "value": "NVL"}],
        "resources": {"limits": {"memory": "32Gi", **extended}, "requests": {"cpu": "8", "memory": "32Gi", **extended}},
        "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent"}
    claims: dict[str, Any] = {}
    status: dict[str, Any] = {"phase": "Pending", "qosClass": "Burstable"}
    if template:
        container["resources"]["claims"] = [{"name": CLAIM}]
        claims = {"resourceClaims": [{"name": CLAIM, "resourceClaimTemplateName": template}]}
        # The resourceclaim controller's name for the claim: the pod's, the claim's and five random characters.
        status["resourceClaimStatuses"] = [{"name": CLAIM, "resourceClaimName": f"{name}-{CLAIM}-{uid[:5]}"}]
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": uid,
                     "resourceVersion": "1", "generation": 1, "creationTimestamp": "2026-11-21T19:02:33Z",
                     "labels": {"app": "llm-finetune", "team": "nlp"}, "annotations": annotations},
        "spec": {
            "containers": [container], **claims,
            "restartPolicy": "Never", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "automountServiceAccountToken": False,
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300}],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority"},
        "status": status,
    }


def load_index(name: str) -> int | None:
    prefix, _, number = name.rpartition("-")
    return int(number) if prefix == "load" and number.isdigit() else None


class LoadCluster(DemoCluster):
    """DemoCluster that times the API calls the extender makes (the Binding, including the watch events it
    applies to the extender's state synchronously) for the report, and can replace boards and play a hostile
    node. On DRA nodes it also plays the resourceclaim controller (claims made from templates, deleted with their
    pod) and kube-scheduler's DRA PreBind (`prebind`)."""

    def __init__(self, state: ClusterState, nodes: Sequence[tuple[str, str]],
                 labels: Mapping[str, Mapping[str, str]] | None = None,
                 dra: Mapping[str, tuple[int, ...]] | None = None) -> None:
        self.api_calls = 0
        self.api_seconds = 0.0
        self.on_bound = lambda uid, name: None
        self.boards_replaced = 0
        self.hostile: str | None = None
        self.hostile_used: frozenset[str] = frozenset()
        self.made: dict[str, dict[str, Any]] = {}  # a claim-template pod's UID -> the claim made from its template
        super().__init__(state, nodes, labels=labels, dra=dra)

    def add_load_pod(self, index: int) -> None:
        """A user creates `load-{index}` (a DRA pod where the cluster has DRA nodes); a claim-template pod's claim
        is made first, as kube-scheduler sees it before it schedules the pod."""
        pod = load_pod(index, bool(self.dra))
        claim = made_claim(pod)
        with self._lock:
            if claim is not None:
                self.made[pod["metadata"]["uid"]] = claim
                self.state.claims.apply("ADDED", claim)
            self.add_pod(pod, adopt=True)

    def prebind(self, uid: str, node: str) -> str:
        """kube-scheduler's DRA PreBind before the extender's bind to a DRA node: the pod's claim allocated to the
        first fit; nothing elsewhere. Returns why not, or ''."""
        if node not in self.dra:
            return ""
        try:
            self.allocate(uid, node)
        except RuntimeError as error:
            return str(error)
        return ""

    def allocate(self, uid: str, node: str) -> None:
        """The claim made from a claim-template pod's template allocated to the first fit and reserved for the pod;
        a KEP-5004 pod's claim made so by DemoCluster."""
        claim = self.made.get(uid)
        if claim is None:
            return super().allocate(uid, node)
        with self._lock:
            count = claim["spec"]["devices"]["requests"][0]["exactly"]["count"]
            gpus = self.first_fit(node, count)
            if gpus is None:
                raise RuntimeError(f"node {node} has no {count} devices free")
            self.hold(uid, node, gpus)
            allocated = allocated_claim(uid, node, [f"gpu-{index}" for index in gpus], pods=[uid])
            self.state.claims.apply("MODIFIED", {**claim, "status": allocated["status"]})

    def finish_pod(self, uid: str) -> None:
        """The pod ends; the claim made from its template goes with it (DemoCluster deletes a KEP-5004 claim)."""
        with self._lock:
            claim = self.made.pop(uid, None)
            if claim is not None:
                self.release(uid)  # not the claim DemoCluster makes, which it would delete
            super().finish_pod(uid)
            if claim is not None:
                self.state.claims.apply("DELETED", claim)

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        started = time.perf_counter()
        try:
            super().bind(namespace, name, uid, node, annotations)
        finally:
            self._count(started)
        self.on_bound(uid, name)

    def replace_board(self, rng: random.Random) -> str | None:
        """A node with no pods gets another board (a GPU swap, or a reporter publishing shapes nobody has seen):
        new GPU ids and its NUMA ids moved on by one, so its topology is one the extender has not compiled yet.
        A DRA node keeps its board: its slice names its GPUs. Returns the node, or None when every other node
        holds pods."""
        with self._lock:
            empty = [name for name in self.topologies if not self._on_node.get(name) and name not in self.dra]
            if not empty:
                return None
            name = rng.choice(empty)
            self.boards_replaced += 1
            gpus = tuple(replace(gpu, numa_node=None if gpu.numa_node is None else (gpu.numa_node + 1) % 64)
                         for gpu in self.topologies[name].gpus)
            self._install(name, with_uuids(f"{name}#{self.boards_replaced}", replace(self.topologies[name], gpus=gpus)))
            self.report(name)
            return name

    def add_hostile(self, name: str, topology: Topology) -> None:
        """A node whose reporter publishes `topology` and a state of its own choosing (`rotate_hostile`)."""
        with self._lock:
            self.hostile = name
            self.hostile_used = frozenset()
            self._install(name, topology)
            self._on_node[name] = {}
            self.state.nodes.apply("ADDED", self._node(name))

    def _install(self, name: str, topology: Topology) -> None:
        """The node's board is now `topology`: its node agent starts with no answers given."""
        self.topologies[name] = topology
        self._boards[name] = Board(topology)
        self._answered[name] = {}

    def rotate_hostile(self, rng: random.Random) -> int:
        """The hostile node publishes a new set of used GPUs (a free count uniform in 0..n), so no memo of a
        previous answer helps with the next request; returns the free count."""
        with self._lock:
            ids = [gpu.uuid for gpu in self.topologies[self.hostile].gpus]
            self.hostile_used = frozenset(rng.sample(ids, len(ids) - rng.randint(0, len(ids))))
            self.report(self.hostile)
            return len(ids) - len(self.hostile_used)

    def _node(self, name: str) -> dict[str, Any]:
        """DemoCluster's node object; the hostile node's state is its own."""
        node = super()._node(name)
        if name == self.hostile:
            state = NodeState(self.hostile_used, frozenset(), datetime.now(timezone.utc), self._generation)
            node["metadata"]["annotations"][self.state.keys.state] = encode_state(state)
        return node

    def _count(self, started: float) -> None:
        self.api_seconds += time.perf_counter() - started
        self.api_calls += 1


class Churn:
    """Users and kubelets: after each bind of a load pod, pending pods are created up to `window` ahead of it,
    and the oldest running pods end until `running` remain. Runs on its own thread, off the request path."""

    def __init__(self, cluster: LoadCluster, running: deque[str], window: int) -> None:
        self.cluster = cluster
        self.running = running
        self.limit = len(running)
        self.window = window
        self.next_pending = 0
        self.created = 0
        self.ended = 0
        self._bound: queue.SimpleQueue[tuple[str, str]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="churn", daemon=True)

    def create_up_to(self, last: int) -> None:
        while self.next_pending <= last:
            self.cluster.add_load_pod(self.next_pending)
            self.next_pending += 1
            self.created += 1

    def bound(self, uid: str, name: str) -> None:
        self._bound.put((uid, name))

    def _run(self) -> None:
        while True:
            uid, name = self._bound.get()
            index = load_index(name)
            if index is not None:
                self.create_up_to(index + self.window)
            self.running.append(uid)
            while len(self.running) > self.limit:
                self.cluster.finish_pod(self.running.popleft())
                self.ended += 1


class GcPauses:
    """Count and time the collector's runs per generation, through gc.callbacks."""

    def __init__(self) -> None:
        self.runs = [[0, 0.0, 0.0] for _ in range(3)]  # count, total seconds, longest seconds
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: Mapping[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        run = self.runs[info["generation"]]
        run[0] += 1
        run[1] += took
        run[2] = max(run[2], took)


def build(nodes: int, fill: float, window: int, seed: int, hostile: Path | None = None, leaf_nodes: int = 0,
          plans: int = 0, drains: int = 0, dra_share: float = 0.0) -> tuple[ExtenderService, LoadCluster, Churn, dict]:
    if plans and not leaf_nodes:
        raise ValueError("planned groups span a leaf: --plans needs --leaf-nodes")
    if not 0 <= drains <= min(MAX_DRAINS, nodes):
        raise ValueError(f"--drains must be 0 to {min(MAX_DRAINS, nodes)}, not {drains}")
    if not 0 <= dra_share <= 1:
        raise ValueError(f"--dra-share must be 0 to 1, not {dra_share}")
    started = time.perf_counter()
    layout = cluster_nodes(nodes)
    labels = network_labels([name for name, _ in layout], leaf_nodes) if leaf_nodes else None
    state = ClusterState(stale_after=STALE_AFTER_SECONDS, levels=(SPINE, LEAF) if leaf_nodes else ())
    cluster = LoadCluster(state, layout, labels, dra_orders(layout, dra_share))
    service = ExtenderService(state, cluster, group_timeout=STALE_AFTER_SECONDS)
    names = list(cluster.topologies)
    total = sum(topology.size for topology in cluster.topologies.values())
    rng = random.Random(seed)
    running: deque[str] = deque()
    used = 0
    refused = 0
    for number in itertools.count():
        if used >= fill * total:
            break
        gpus = FILL_SIZES[number % len(FILL_SIZES)]
        pod = cluster.create_pod(f"fill-{number}", gpus, namespace="default")
        uid = pod["metadata"]["uid"]
        for _ in range(20):
            node = rng.choice(names)
            error = cluster.prebind(uid, node) or service.bind(BindingArgs(f"fill-{number}", "default", uid, node))
            if not error:
                running.append(uid)
                used += gpus
                break
            refused += 1
        else:
            cluster.finish_pod(uid)
    if hostile is not None:
        cluster.add_hostile(HOSTILE_NODE, decode_topology(hostile.read_text(encoding="utf-8")))
    planning = plan_groups(service, cluster, plans)
    draining = start_drains(service, drains)
    churn = Churn(cluster, running, window)
    churn.create_up_to(window - 1)
    cluster.on_bound = churn.bound
    keys = {key for key in state.keys_for(names) if isinstance(key, NodeKey)}
    facts = {"nodes": len(names), "gpus": total, "used_gpus": used, "fill_pods": len(running),
             "fill_refused_binds": refused, "pending_pods": churn.created, "distinct_node_keys": len(keys),
             "boards": len({key.compiled.fingerprint for key in keys}), "leaf_nodes": leaf_nodes,
             "dra_share": dra_share, "dra_nodes": len(cluster.dra), "dra_claims": len(cluster.claims),
             "spine_leaves": SPINE_LEAVES, **planning, **draining, **plans_in_force(service),
             "setup_seconds": round(time.perf_counter() - started, 2)}
    return service, cluster, churn, facts


def plan_groups(service: ExtenderService, cluster: LoadCluster, count: int) -> dict[str, Any]:
    """Plan `count` groups as kube-scheduler's first cycle for each would: every member pending, the first
    member's filter over every name. A group left without a plan stops the server: the run would measure less."""
    names = list(cluster.topologies)
    took: list[float] = []
    for group in range(count):
        members = [cluster.add_pod(group_pod(group, member)) for member in range(plan_members(group))]
        started = time.perf_counter()
        outcome = service.filter(ExtenderArgs(members[0], names, None))
        took.append(time.perf_counter() - started)
        if not outcome.passed:
            raise RuntimeError(f"group job-{group} got no plan: {outcome.failed or outcome.unresolvable}")
    return {"plan_groups": count, "plan_gpus_per_member": PLAN_GPUS,
            "plan_filter_ms_mean": round(1000 * sum(took) / count, 2) if count else 0.0,
            "plan_filter_ms_max": round(1000 * max(took, default=0.0), 2)}


def start_drains(service: ExtenderService, count: int) -> dict[str, int]:
    """`count` drains in force for the whole run, as pods waiting for a full set leave them (extender/verbs/wait.py):
    each holds back the free GPUs of a set of 2 on a node of its own, spread over the cluster, so every request's
    5,000 names meet them. Nodes with no such set free are passed over."""
    state, drains = service.state, service.drains
    names = list(state.views())
    now = state.clock()
    for step in range(len(names)):
        if len(drains) >= count:
            break
        name = names[step * 7919 % len(names)]
        key = state.keys_for([name])[0]
        if isinstance(key, NodeKey):
            drains.start(f"drain-{step}", [(name, key)], service.selector, 2, now + 1e9, now)
    return {"drains": len(drains)}


def plans_in_force(service: ExtenderService) -> dict[str, int]:
    """The plans in force, and their open slots and GPUs held in the ledger."""
    planned = [entry for entry in service.state.ledger.pods() if entry.phase is Phase.PLANNED]
    return {"plans": len(service.plans), "planned_slots": len(planned),
            "planned_gpus": sum(len(entry.gpus) for entry in planned), "drains_in_force": len(service.drains)}


def serve(service: ExtenderService, cluster: LoadCluster, churn: Churn, facts: dict, port: int) -> None:
    app = create_app(service)
    web = app.web  # the FastAPI app behind the verbs' routes, which serves every other path
    pauses = GcPauses()

    @web.get("/loadtest/stats")
    async def stats() -> JSONResponse:
        return JSONResponse({"api_calls": cluster.api_calls, "api_seconds": cluster.api_seconds,
                             "pending_created": churn.created, "pods_ended": churn.ended,
                             "running": len(churn.running), "boards_replaced": cluster.boards_replaced,
                             "dra_claims": len(cluster.claims), "errors_logged": ERRORS.count,
                             **plans_in_force(service),
                             "gc": [{"runs": n, "seconds": total, "longest": longest}
                                    for n, total, longest in pauses.runs],
                             "gc_threshold": gc.get_threshold()})

    replacements = random.Random(facts["nodes"])

    @web.post("/loadtest/prebind")
    async def prebind(request: Request) -> JSONResponse:
        asked = await request.json()
        return JSONResponse({"error": cluster.prebind(asked["uid"], asked["node"])})

    @web.post("/loadtest/replace-board")
    async def replace_board() -> JSONResponse:
        return JSONResponse({"node": cluster.replace_board(replacements)})

    hostile_states = random.Random(facts["nodes"] + 1)

    @web.post("/loadtest/hostile-rotate")
    async def hostile_rotate() -> JSONResponse:
        return JSONResponse({"free": cluster.rotate_hostile(hostile_states)})

    loop = [cProfile.Profile()]
    verbs = VerbProfile(service)

    # Both run on the event-loop thread, so `loop` covers that thread: all HTTP handling, and filter and prioritize
    # where they run there; `verbs` profiles them on the verbs' thread. Each start begins a new profile.
    @web.post("/loadtest/profile/start")
    async def profile_start() -> JSONResponse:
        loop[0] = cProfile.Profile()
        loop[0].enable()
        verbs.start()
        return JSONResponse({})

    @web.post("/loadtest/profile/stop")
    async def profile_stop() -> JSONResponse:
        loop[0].disable()
        verbs.on = False
        return JSONResponse({"rows": _rows(loop[0]), "verbs": _rows(verbs.profiler)})

    # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted connections only then, as on the sockets uvicorn binds
    # itself; without it a response's headers and body, written apart, wait on delayed ACKs.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    config = server_config(service, ServeOptions(log_level="warning"), app)
    logging.getLogger("uvicorn").addHandler(ERRORS)  # set up by server_config; it does not pass records to the root
    settle_when_synced(service.state)  # as `gpu-topology-extender serve` does once its watches have synced
    churn.thread.start()
    print("READY " + json.dumps({**facts, "port": sock.getsockname()[1], "http": _http_impl(config)}), flush=True)
    uvicorn.Server(config).run(sockets=[sock])


class ErrorCount(logging.Handler):
    """Records at ERROR and above: the extender logs every verb that failed, whose answer to kube-scheduler was an
    Error (or prioritize's `[]`, which says nothing), so a run whose server counts one met an error answer."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


ERRORS = ErrorCount()


class VerbProfile:
    """cProfile of the service's filter and prioritize where they run on the verbs' thread, which a profiler
    enabled on the event loop does not see (extender/server/app.py answers on the event loop what needs only remembered
    answers, and sends new work to that thread). On the event loop they are left to the loop's profiler: a second
    one there would take its place. Parsing the body and writing the answer are outside it."""

    def __init__(self, service: ExtenderService) -> None:
        self.profiler = cProfile.Profile()
        self.on = False
        for verb in ("filter", "prioritize"):
            setattr(service, verb, self._wrap(getattr(service, verb)))

    def start(self) -> None:
        """A new profile; the verbs' thread is idle between the generator's requests, so no call straddles it."""
        self.profiler = cProfile.Profile()
        self.on = True

    def _wrap(self, method: Callable[..., Answer]) -> Callable[..., Answer]:
        def call(*args: Any, **kwargs: Any) -> Answer:
            if self.on and threading.current_thread() is not threading.main_thread():  # uvicorn's loop: the main one
                return self.profiler.runcall(method, *args, **kwargs)
            return method(*args, **kwargs)
        return call


def _rows(profiler: cProfile.Profile) -> list[dict[str, Any]]:
    """Each function's calls, own and cumulative seconds."""
    if not profiler.getstats():
        return []
    return [{"function": _function_name(where), "calls": calls, "own": own, "cumulative": cumulative}
            for where, (_, calls, own, cumulative, _) in pstats.Stats(profiler).stats.items()]


def _function_name(where: tuple[str, int, str]) -> str:
    filename, line, function = where
    if filename == "~":  # a builtin
        return function
    path = Path(filename)
    return f"{path.parent.name}/{path.name}:{line} {function}"


def _http_impl(config: uvicorn.Config) -> str:
    return f"uvicorn {uvicorn.__version__}, the extender's protocol over httptools, {config.loop}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000, help="number of nodes (default 5000)")
    parser.add_argument("--fill", type=float, default=0.45,
                        help="share of the GPUs taken by running pods before the load starts (default 0.45)")
    parser.add_argument("--window", type=int, default=2000,
                        help="pending load pods kept ahead of the last one bound (default 2000)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the initial fill (default 1)")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    parser.add_argument("--hostile", type=Path, metavar="FILE",
                        help=f"add a node {HOSTILE_NODE!r} whose topology annotation is this file's text")
    parser.add_argument("--leaf-nodes", type=int, default=0,
                        help="network labels, a leaf per this many consecutive nodes, and the extender built with "
                             "those levels (default 0: no labels, no levels)")
    parser.add_argument("--plans", type=int, default=0,
                        help="groups planned before serving, each in one leaf (default 0; needs --leaf-nodes)")
    parser.add_argument("--drains", type=int, default=0,
                        help=f"drains in force while serving, each on a node of its own (default 0; at most "
                             f"{MAX_DRAINS})")
    parser.add_argument("--dra-share", type=float, default=0.0,
                        help="share of the nodes whose GPUs a DRA driver publishes, with the load's pods DRA pods "
                             "(default 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)  # to stderr, as Python's last resort printed them, beside the count
    logging.getLogger().addHandler(ERRORS)
    service, cluster, churn, facts = build(args.nodes, args.fill, args.window, args.seed, args.hostile,
                                           args.leaf_nodes, args.plans, args.drains, args.dra_share)
    serve(service, cluster, churn, facts, args.port)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
