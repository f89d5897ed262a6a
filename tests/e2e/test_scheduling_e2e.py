"""End to end: a real kube-scheduler (v1.36) with our scheduler-config drives our extender over HTTPS+mTLS.

Runs only when KUBE_BIN_DIR holds real `kube-apiserver` and `kube-scheduler` binaries and an `etcd` is there
or on PATH; otherwise the whole module is one skip whose reason says what is missing (pytest runs with -ra, so
CI prints it).

    KUBE_BIN_DIR=/path/to/bins make test

The cluster (kube_e2e.NODES): node-h100-a (DGX H100, NVSwitch), node-a6000-a and node-a6000-b (8x RTX A6000,
NVLink bridges on pairs 0-1, 2-3, 4-5, 6-7), node-v100 (DGX-1 V100, hybrid cube-mesh). No kubelet: a bound
pod stays Pending, so `spec.nodeName` says where it landed and `gpu-topology.io/gpus` which GPUs it got.
The tests share that cluster and run in file order; each one first brings the cluster into the state its
scenario needs (filler pods pinned with a nodeSelector) and checks that state, so each also runs alone.
Nothing is deleted, so every GPU handed out during the run is still held at the end (the last test).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest
from kube_e2e import Cluster, find_kube_binaries, gpu_pod, skip_reason, wait_until

from extender.api.pod_request import DEFAULT_GPU_RESOURCE, effective_gpu_request
from topology.codec import decode_state
from topology.compiled import compile_topology
from topology.levels import Interconnect
from topology.select import Choice, Request, Selector

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

BIND_SECONDS = 180.0  # a shared 2-core VM; the scheduler's backoff alone can reach 10 s
EVENT_SECONDS = 180.0
NVLINK_REQUIRED = {"gpu-topology.io/interconnect": "nvlink", "gpu-topology.io/placement": "required"}
_names = itertools.count(1)


# ---------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------

def _annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def _node_of(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def _describe(cluster: Cluster, name: str) -> str:
    """What `kubectl describe pod` would say that matters here: node, conditions, annotations, events."""
    try:
        pod = cluster.kube.get_pod(name, cluster.namespace)
    except Exception as error:  # noqa: BLE001 - diagnostics only
        return f"pod {name}: {error!r}"
    lines = [f"pod {name}: nodeName={_node_of(pod)!r} phase={(pod.get('status') or {}).get('phase')}"]
    for condition in (pod.get("status") or {}).get("conditions") or []:
        lines.append(f"  condition {condition.get('type')}={condition.get('status')} "
                     f"{condition.get('reason', '')}: {condition.get('message', '')}")
    lines += [f"  annotation {key}={value}" for key, value in _annotations(pod).items()]
    lines += [f"  event {event.get('type')} {event.get('reason')}: {event.get('message')}"
              for event in _events(cluster, name)]
    return "\n".join(lines)


def _events(cluster: Cluster, pod_name: str) -> list[dict[str, Any]]:
    return [event for event in cluster.kube.list_events(cluster.namespace)
            if (event.get("involvedObject") or {}).get("name") == pod_name
            and (event.get("involvedObject") or {}).get("kind") == "Pod"]


def create(cluster: Cluster, stem: str, gpus: int, *, annotations: Mapping[str, str] | None = None,
           node: str | None = None) -> str:
    name = f"{stem}-{next(_names)}"
    cluster.kube.create_pod(gpu_pod(name, gpus, scheduler=cluster.scheduler_name, namespace=cluster.namespace,
                                    annotations=annotations, node=node))
    return name


def wait_bound(cluster: Cluster, name: str) -> dict[str, Any]:
    def bound() -> dict[str, Any] | None:
        pod = cluster.kube.get_pod(name, cluster.namespace)
        return pod if _node_of(pod) else None

    return wait_until(bound, BIND_SECONDS, f"pod {name} to be bound", watch=cluster.processes.values(),
                      diagnose=lambda: _describe(cluster, name))


def wait_event(cluster: Cluster, name: str, reason: str, contains: str) -> dict[str, Any]:
    def seen() -> dict[str, Any] | None:
        for event in _events(cluster, name):
            if event.get("reason") == reason and contains in (event.get("message") or ""):
                return event
        return None

    return wait_until(seen, EVENT_SECONDS, f"a {reason} event on pod {name} containing {contains!r}",
                      watch=cluster.processes.values(), diagnose=lambda: _describe(cluster, name))


def placed(cluster: Cluster, pod: Mapping[str, Any]) -> tuple[str, list[int]]:
    """(node, GPU indices on that node's topology) from the pod's `gpu-topology.io/gpus` annotation."""
    node = _node_of(pod)
    assert node in cluster.topologies, f"{pod['metadata']['name']} is bound to an unknown node {node!r}"
    annotation = _annotations(pod).get(cluster.keys.gpus)
    assert annotation, f"{pod['metadata']['name']} is bound to {node} without a {cluster.keys.gpus} annotation"
    index = cluster.uuid_index(node)
    uuids = annotation.split(",")
    unknown = [uuid for uuid in uuids if uuid not in index]
    assert not unknown, f"{pod['metadata']['name']} got GPUs that {node} does not have: {unknown}"
    return node, sorted(index[uuid] for uuid in uuids)


def nvlink_pairs(cluster: Cluster, node: str) -> set[frozenset[int]]:
    return {frozenset((link.a, link.b)) for link in cluster.topologies[node].nvlinks}


def requested(pod: Mapping[str, Any]) -> int:
    return effective_gpu_request(pod.get("spec") or {}, DEFAULT_GPU_RESOURCE)


def free_by_count(cluster: Cluster) -> dict[str, int]:
    """Free GPUs per node as kube-scheduler counts them (NodeResourcesFit): allocatable minus bound requests."""
    free = {name: topology.size for name, topology in cluster.topologies.items()}
    for pod in cluster.kube.list_pods():
        if _node_of(pod) in free and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            free[_node_of(pod)] -= requested(pod)
    return free


def fill(cluster: Cluster, node: str, leave: int) -> None:
    """Bind a filler pod to `node` so that at most `leave` of its GPUs stay free by count."""
    take = free_by_count(cluster)[node] - leave
    if take > 0:
        name = create(cluster, f"fill-{node}", take, node=node)
        assert _node_of(wait_bound(cluster, name)) == node


@pytest.fixture()
def h100_full(e2e_cluster: Cluster) -> Cluster:
    """node-h100-a full by count, so its NVSwitch board is out of every scenario below."""
    fill(e2e_cluster, "node-h100-a", 0)
    assert free_by_count(e2e_cluster)["node-h100-a"] == 0
    return e2e_cluster


# ---------------------------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------------------------

def test_two_gpu_pod_requiring_nvlink_lands_on_an_nvlink_pair(h100_full: Cluster) -> None:
    cluster = h100_full
    free = free_by_count(cluster)
    fitting = sorted(name for name, count in free.items() if count >= 2)
    assert fitting == ["node-a6000-a", "node-a6000-b", "node-v100"], f"free GPUs by count: {free}"

    name = create(cluster, "nvlink-pair", 2, annotations=NVLINK_REQUIRED)
    node, gpus = placed(cluster, wait_bound(cluster, name))

    assert node in fitting
    assert frozenset(gpus) in nvlink_pairs(cluster, node), (
        f"{name} got GPUs {gpus} on {node}, which are not an NVLink pair "
        f"({sorted(map(sorted, nvlink_pairs(cluster, node)))})")


def test_one_gpu_pods_pack_so_two_gpu_pods_get_whole_bridge_pairs(e2e_cluster: Cluster) -> None:
    cluster = e2e_cluster
    free = free_by_count(cluster)
    boards = [name for name in ("node-a6000-a", "node-a6000-b") if free[name] == 8]
    assert boards, f"no RTX A6000 node has all 8 GPUs free: {free}"
    node = boards[0]
    pairs = nvlink_pairs(cluster, node)
    assert pairs == {frozenset(p) for p in ((0, 1), (2, 3), (4, 5), (6, 7))}

    singles = []
    for _ in range(4):  # one at a time, as "then" in a queue: each sees the GPUs the ones before it took
        name = create(cluster, "single", 1, node=node)
        bound_node, gpus = placed(cluster, wait_bound(cluster, name))
        assert bound_node == node
        singles += gpus
    doubles = []
    for _ in range(2):
        name = create(cluster, "double", 2, node=node)
        bound_node, gpus = placed(cluster, wait_bound(cluster, name))
        assert bound_node == node
        doubles.append(frozenset(gpus))

    assert len(set(singles)) == 4
    # The 1-GPU pods filled two whole pairs (each second one went next to the first instead of breaking
    # another pair), which is what leaves the 2-GPU pods a bridge pair each.
    assert {pair for pair in pairs if pair <= set(singles)} == {pair for pair in pairs if pair & set(singles)}, (
        f"1-GPU pods got {sorted(singles)}: they split NVLink pairs")
    for pair in doubles:
        assert pair in pairs, f"a 2-GPU pod got {sorted(pair)} on {node}, not an NVLink bridge pair"
    assert not set().union(*doubles) & set(singles)


def test_four_gpu_nvlink_pod_stays_pending_with_our_reason(h100_full: Cluster) -> None:
    cluster = h100_full
    fill(cluster, "node-v100", 3)  # the cube-mesh has 4-GPU NVLink rings; leave it too few GPUs by count
    selector = Selector()
    ring = Request(4, Interconnect.NVLINK, 0.0)
    free = free_by_count(cluster)
    candidates = []
    for name, count in free.items():
        if count < 4:
            continue
        candidates.append(name)
        compiled = compile_topology(cluster.topologies[name])
        held = set()
        for pod in cluster.kube.list_pods():
            if _node_of(pod) == name:
                held |= set(placed(cluster, pod)[1])
        mask = sum(1 << index for index in range(compiled.size) if index not in held)
        assert not isinstance(selector.select(compiled, mask, ring), Choice), (
            f"{name} can still give a 4-GPU NVLink ring")
    assert candidates, f"no node has 4 free GPUs by count, so the extender would never be asked: {free}"

    name = create(cluster, "nvlink-ring4", 4, annotations=NVLINK_REQUIRED)
    event = wait_event(cluster, name, "FailedScheduling", "no free NVLink ring of 4 GPUs")

    assert event.get("type") == "Warning"
    pod = cluster.kube.get_pod(name, cluster.namespace)
    assert _node_of(pod) is None, _describe(cluster, name)
    assert cluster.keys.gpus not in _annotations(pod)


def test_malformed_annotation_stays_pending_and_gets_an_event_naming_it(e2e_cluster: Cluster) -> None:
    cluster = e2e_cluster
    free = free_by_count(cluster)
    assert any(count >= 1 for count in free.values()), f"no node has a free GPU by count: {free}"

    name = create(cluster, "bad-bandwidth", 1, annotations={"gpu-topology.io/min-bandwidth": "fast"})
    failed = wait_event(cluster, name, "FailedScheduling", "gpu-topology.io/min-bandwidth")
    ours = wait_event(cluster, name, "InvalidGPUTopologyRequest", "gpu-topology.io/min-bandwidth")

    assert failed.get("type") == "Warning"
    assert ours.get("type") == "Warning"
    assert "fast" in ours.get("message", "")
    source = ours.get("reportingComponent") or (ours.get("source") or {}).get("component")
    assert source == "gpu-topology-extender"
    pod = cluster.kube.get_pod(name, cluster.namespace)
    assert _node_of(pod) is None, _describe(cluster, name)


def test_no_gpu_is_given_twice(e2e_cluster: Cluster) -> None:
    """Every pod bound during the run, all still alive: each holds exactly its request, on its own node, and
    no GPU is held twice; pending pods hold none; the reporter's view matches."""
    cluster = e2e_cluster
    pods = [pod for pod in cluster.kube.list_pods(cluster.namespace)]
    holders: dict[str, str] = {}
    by_node: dict[str, set[str]] = {name: set() for name in cluster.topologies}
    bound = 0
    for pod in pods:
        name = pod["metadata"]["name"]
        if _node_of(pod) is None:
            assert cluster.keys.gpus not in _annotations(pod), f"pending pod {name} carries GPUs"
            continue
        bound += 1
        node, gpus = placed(cluster, pod)
        assert len(gpus) == len(set(gpus)) == requested(pod), f"{name} asked for {requested(pod)} GPUs, got {gpus}"
        for uuid in _annotations(pod)[cluster.keys.gpus].split(","):
            assert uuid not in holders, f"GPU {uuid} on {node} is held by {holders.get(uuid)} and {name}"
            holders[uuid] = name
            by_node[node].add(uuid)
    assert bound >= 1, "no pod was bound during the run"

    cluster.reporter.refresh()
    for name in cluster.topologies:
        state = decode_state(_annotations(cluster.kube.get_node(name))[cluster.keys.state])
        assert state.used == by_node[name], f"{name}: the reporter says {sorted(state.used)}"
