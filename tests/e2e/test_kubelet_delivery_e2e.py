"""End to end with real kubelets: every container gets exactly the GPUs the extender bound it to, by the kubelet's own
records, through churn and a kubelet restart.

Runs only when KUBE_BIN_DIR also holds `kubelet` and `fakecri` (kubelets.find_kubelet_binaries says what is
missing, as one skip). The cluster is kube_e2e's control plane with no fake node: two real kubelets (a DGX H100 and
an 8x RTX A6000 bridge-pairs board), each with its fake runtime and our node agent in deliver mode (kubelets.py).
kube-scheduler, with the shipped profile, sends every GPU pod to the extender, which binds it with its
`gpu-topology.io/containers` annotation; the kubelet admits it, asking the agent's device plugin.

Checked after each step, for every live pod (`check_pod` has the kubelet's rule):
- the kubelet's device-manager checkpoint holds, for each container asking for GPUs (plain init containers too),
  the annotated GPUs; where the kubelet draws a container's GPUs from the pod's init pool itself (fewer than the
  pool holds), they are among that pool. The plugin's answer kept there hands the runtime those as CDI devices;
- pod-resources `List` shows the same for app containers and sidecars, and never a plain init container;
- no GPU is held by two pods; every Allocate the agent answered was as planned (but for a container drawn from an
  init pool), and no GPUAllocationMismatch Event exists;
- the agent's `used` on each Node is what its pods' app containers and sidecars hold.

The shapes: one container, several containers, a plain init container before its app container (the fake runtime
never ends it, so its app container waits, admitted), and a sidecar (an init container with restartPolicy Always)
beside its app container.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
from kube_e2e import PAUSE_IMAGE, Cluster, ClusterSpec, Kube, Process, node_topologies, wait_until
from kubelets import (
    KubeletNode,
    Recorded,
    find_kubelet_binaries,
    kubelet_skip_reason,
    start_kubelet_nodes,
    wait_node_ready,
)

from extender.api.pod_request import DEFAULT_GPU_RESOURCE
from topology.agent.allocate import DEFAULT_CDI_KIND
from topology.assignment import decode_containers
from topology.codec import decode_state

_BINARIES, _PROBLEM = find_kubelet_binaries()
if _PROBLEM is not None:
    pytest.skip(kubelet_skip_reason(_PROBLEM), allow_module_level=True)

NODES = {"kubelet-h100": "dgx-h100", "kubelet-a6000": "rtx-a6000-pairs"}
# No topology wait: a pod takes the best set on offer at once, so the scenario never waits on fragmentation.
CLUSTER_SPEC = ClusterSpec({}, namespace="gpu-kubelet", extender_args=("--topology-wait", "0"))
ADMIT_SECONDS = 180.0  # a shared 2-core VM; the scheduler's backoff alone can reach 10 s
GONE_SECONDS = 120.0
REPORT_SECONDS = 60.0
FINISHED = ("Failed", "Succeeded")
_names = itertools.count(1)


# ---------------------------------------------------------------------------------------------------------
# Pods of every shape
# ---------------------------------------------------------------------------------------------------------

def _container(name: str, gpus: int, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": PAUSE_IMAGE, **extra,
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi", DEFAULT_GPU_RESOURCE: str(gpus)},
                          "limits": {DEFAULT_GPU_RESOURCE: str(gpus)}}}


def shaped_pod(stem: str, shape: str, gpus: Sequence[int], *, scheduler: str, namespace: str) -> dict[str, Any]:
    """`one`: one container of gpus[0]; `several`: one app container per count; `init`: a plain init container of
    gpus[0] before an app container of gpus[1]; `sidecar`: a sidecar of gpus[0] beside an app container of gpus[1]."""
    if shape == "one":
        spec: dict[str, Any] = {"containers": [_container("main", gpus[0])]}
    elif shape == "several":
        spec = {"containers": [_container(f"worker-{i}", count) for i, count in enumerate(gpus)]}
    elif shape == "init":
        spec = {"initContainers": [_container("prep", gpus[0])], "containers": [_container("main", gpus[1])]}
    elif shape == "sidecar":
        spec = {"initContainers": [_container("side", gpus[0], restartPolicy="Always")],
                "containers": [_container("main", gpus[1])]}
    else:
        raise ValueError(f"unknown shape {shape!r}")
    # A second of grace: the kubelet stops the containers, then deletes the pod itself.
    spec.update(schedulerName=scheduler, automountServiceAccountToken=False, terminationGracePeriodSeconds=1)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{stem}-{next(_names)}", "namespace": namespace,
                         "labels": {"app.kubernetes.io/part-of": "gpu-kubelet-e2e"}},
            "spec": spec}


def gpu_containers(pod: Mapping[str, Any]) -> dict[str, int]:
    spec = pod["spec"]
    return {c["name"]: int(c["resources"]["limits"][DEFAULT_GPU_RESOURCE])
            for c in [*spec.get("initContainers", []), *spec["containers"]]
            if int((c.get("resources") or {}).get("limits", {}).get(DEFAULT_GPU_RESOURCE, 0))}


def plain_init_containers(pod: Mapping[str, Any]) -> set[str]:
    return {c["name"] for c in pod["spec"].get("initContainers", []) if c.get("restartPolicy") != "Always"}


# ---------------------------------------------------------------------------------------------------------
# The cluster with its kubelets
# ---------------------------------------------------------------------------------------------------------

@dataclass
class KubeletCluster:
    cluster: Cluster
    nodes: dict[str, KubeletNode]

    def create(self, stem: str, shape: str, *gpus: int) -> str:
        pod = shaped_pod(stem, shape, gpus, scheduler=self.cluster.scheduler_name, namespace=self.cluster.namespace)
        self.cluster.kube.create_pod(pod)
        return pod["metadata"]["name"]

    def pods(self) -> list[dict[str, Any]]:
        return self.cluster.kube.list_pods(self.cluster.namespace)

    def watched(self) -> list[Process]:
        return list(self.cluster.processes.values())

    def restart_kubelet(self, node: KubeletNode) -> None:
        """A new kubelet process on the node, which the suite then watches (and whose log a failure shows)."""
        node.restart_kubelet()
        self.cluster.processes[node.processes["kubelet"].name] = node.processes["kubelet"]
        wait_node_ready(self.cluster.kube, node)


@pytest.fixture(scope="module")
def kubelets(spec_cluster: Cluster) -> Iterator[KubeletCluster]:
    assert _BINARIES is not None
    with ExitStack() as stack:
        nodes = start_kubelet_nodes(_BINARIES, node_topologies(NODES), spec_cluster.kube,
                                    spec_cluster.workdir / "admin.kubeconfig", spec_cluster.pki,
                                    spec_cluster.workdir / "logs", stack)
        for node in nodes:
            spec_cluster.processes.update({process.name: process for process in node.processes.values()})
        spec_cluster.versions.update(_BINARIES.versions())
        yield KubeletCluster(spec_cluster, {node.name: node for node in nodes})


# ---------------------------------------------------------------------------------------------------------
# What the kubelets recorded, against the annotations
# ---------------------------------------------------------------------------------------------------------

def _admitted(kubelets: KubeletCluster, names: set[str]) -> bool:
    """Every named pod is bound and its node's checkpoint has each of its GPU containers."""
    recorded: set[tuple[str, str]] = set()
    for node in kubelets.nodes.values():
        if node.checkpoint_file.exists():
            recorded |= set(node.checkpoint())
    pods = {pod["metadata"]["name"]: pod for pod in kubelets.pods()}
    for name in names:
        pod = pods.get(name)
        if pod is None or not pod["spec"].get("nodeName"):
            return False
        if any((pod["metadata"]["uid"], container) not in recorded for container in gpu_containers(pod)):
            return False
    return True


def wait_admitted(kubelets: KubeletCluster, names: Sequence[str]) -> None:
    wait_until(lambda: _admitted(kubelets, set(names)), ADMIT_SECONDS, f"pods {', '.join(names)} admitted with GPUs",
               watch=kubelets.watched(), interval=0.5)


def wait_gone(kubelets: KubeletCluster, names: Sequence[str]) -> None:
    wait_until(lambda: not {pod["metadata"]["name"] for pod in kubelets.pods()} & set(names), GONE_SECONDS,
               f"pods {', '.join(names)} deleted by their kubelets", watch=kubelets.watched(), interval=0.5)


def kubelet_order(pod: Mapping[str, Any]) -> list[tuple[str, bool, int]]:
    """(container, is a plain init container, GPUs) of each GPU container, in the order the kubelet allocates them:
    init containers in spec order, then app containers."""
    asked = gpu_containers(pod)
    plain = plain_init_containers(pod)
    spec = pod["spec"]
    return [(c["name"], c["name"] in plain, asked[c["name"]])
            for c in [*spec.get("initContainers", []), *spec["containers"]] if c["name"] in asked]


def check_pod(pod: Mapping[str, Any], planned: Mapping[str, frozenset[str]], recorded: Mapping[str, Recorded],
              shown: Mapping[str, Sequence[str]]) -> set[str]:
    """One pod's containers as the kubelet recorded them, against the plan; returns the containers whose GPUs the
    kubelet drew from the pod's init pool itself.

    The kubelet's rule (devicemanager `Allocate`, `devicesToAllocate`): a container takes from the pool of the pod's
    plain init containers first; a container needing fewer than the pool holds gets them picked by the kubelet in Go
    map order, without asking the plugin, so only its count and its being among the pool can be checked; any other
    container gets the whole pool and what the plugin preferred, which must be exactly its plan. A plain init
    container then adds its GPUs to the pool, a sidecar or app container takes its own out."""
    name = pod["metadata"]["name"]
    pool: set[str] = set()
    drawn = set()
    for container, plain, count in kubelet_order(pod):
        entry = recorded.get(container)
        assert entry is not None, f"{name}/{container}: not in the kubelet's checkpoint"
        got, plan = set(entry.ids), set(planned[container])
        assert len(got) == count, f"{name}/{container}: the kubelet recorded {sorted(got)} for {count} GPUs"
        if count < len(pool):
            assert got <= pool and plan <= pool, (
                f"{name}/{container}: recorded {sorted(got)}, planned {sorted(plan)}, out of the pool {sorted(pool)}")
            drawn.add(container)
        else:
            assert got == plan, (
                f"{name}/{container}: the kubelet recorded {sorted(got)}, the extender bound {sorted(plan)}")
        handed = {device.name for device in entry.response.cdi_devices}
        assert handed == {f"{DEFAULT_CDI_KIND}={gpu}" for gpu in got}, (
            f"{name}/{container}: the runtime was handed {sorted(handed)} for {sorted(got)}")
        pool = pool | got if plain else pool - got
    assert not set(shown) & plain_init_containers(pod), f"{name}: List shows a plain init container"
    for container, devices in shown.items():
        entry = recorded.get(container)
        assert set(devices) == (set(entry.ids) if entry is not None else set()), (
            f"{name}/{container}: List shows {sorted(devices)}, the checkpoint {entry}")
    return drawn


def check_delivery(kubelets: KubeletCluster, ignored: frozenset[str] = frozenset()) -> tuple[int, set[str]]:
    """Every live pod but the `ignored` against its node's checkpoint and pod-resources List, and no GPU in two pods;
    returns how many pods were checked and the containers drawn from an init pool, as `namespace/pod (container)`."""
    pods = [pod for pod in kubelets.pods()
            if not pod["metadata"].get("deletionTimestamp") and pod["metadata"]["name"] not in ignored]
    holders: dict[str, str] = {}
    drawn: set[str] = set()
    for node in kubelets.nodes.values():
        checkpoint, listed = node.checkpoint(), node.listed()
        for pod in (pod for pod in pods if pod["spec"].get("nodeName") == node.name):
            name, uid, namespace = pod["metadata"]["name"], pod["metadata"]["uid"], pod["metadata"]["namespace"]
            status = pod.get("status") or {}
            assert status.get("phase") not in FINISHED, f"{name}: {status.get('reason')}: {status.get('message')}"
            annotation = (pod["metadata"].get("annotations") or {}).get(kubelets.cluster.keys.containers)
            assert annotation, f"{name} is bound to {node.name} without {kubelets.cluster.keys.containers}"
            planned = {container: frozenset(gpus) for container, gpus in decode_containers(annotation)}
            assert set(planned) == set(gpu_containers(pod)), f"{name}: planned {planned}"
            recorded = {container: entry for (owner, container), entry in checkpoint.items() if owner == uid}
            drawn |= {f"{namespace}/{name} ({container})" for container in
                      check_pod(pod, planned, recorded, listed.get((namespace, name), {}))}
            for gpu in frozenset().union(*planned.values()):
                assert gpu not in holders, f"GPU {gpu} on {node.name} is held by {holders[gpu]} and {name}"
                holders[gpu] = name
    return sum(1 for pod in pods if pod["spec"].get("nodeName") in kubelets.nodes), drawn


def check_agents(kubelets: KubeletCluster, drawn: set[str]) -> None:
    """No Allocate refused, none other than planned but for a container the kubelet drew from an init pool, and no
    GPUAllocationMismatch Event."""
    for node in kubelets.nodes.values():
        log = node.processes["agent"].log_path.read_text(errors="replace")
        bad = [line for line in log.splitlines() if "Allocate for" in line and (
               "refused" in line or (", not as planned" in line
                                     and line.split("Allocate for ", 1)[1].split(":", 1)[0] not in drawn))]
        assert not bad, f"agent on {node.name}:\n" + "\n".join(bad[:5])
    mismatches = [event for event in kubelets.cluster.kube.list_events(kubelets.cluster.namespace)
                  if event.get("reason") == "GPUAllocationMismatch"]
    assert not mismatches, [event.get("message") for event in mismatches]


def held_and_reported(kubelets: KubeletCluster) -> dict[str, tuple[set[str], frozenset[str] | None]]:
    """Per node: the GPUs the kubelet recorded for its live pods' app containers and sidecars, and the agent's
    `used` (None: no state). List never shows a plain init container, so GPUs only such a container holds are not in
    `used` (the extender keeps counting them from its own reservation, extender/cache/ledger.py `covered`)."""
    pods = [pod for pod in kubelets.pods() if (pod.get("status") or {}).get("phase") not in FINISHED]
    result = {}
    for name, node in kubelets.nodes.items():
        shown = {(pod["metadata"]["uid"], container) for pod in pods if pod["spec"].get("nodeName") == name
                 for container in set(gpu_containers(pod)) - plain_init_containers(pod)}
        held = {gpu for key, entry in node.checkpoint().items() if key in shown for gpu in entry.ids}
        state = (kubelets.cluster.kube.get_node(name)["metadata"].get("annotations") or {}).get(
            kubelets.cluster.keys.state)
        result[name] = (held, decode_state(state).used if state is not None else None)
    return result


def wait_reported(kubelets: KubeletCluster) -> None:
    """Each agent's `used` becomes the GPUs its node's live pods hold in app containers and sidecars."""
    wait_until(lambda: all(held == used for held, used in held_and_reported(kubelets).values()), REPORT_SECONDS,
               "each agent's used GPUs to match its pods", watch=kubelets.watched(), interval=0.5,
               diagnose=lambda: "\n".join(
                   f"{node}: the agent says {'no state' if used is None else f'{len(used)} GPUs'}, missing "
                   f"{sorted(held - (used or set()))}, extra {sorted((used or set()) - held)}"
                   for node, (held, used) in held_and_reported(kubelets).items()))


def check_all(kubelets: KubeletCluster, expected: int, ignored: frozenset[str] = frozenset()) -> None:
    checked, drawn = check_delivery(kubelets, ignored)
    assert checked == expected
    check_agents(kubelets, drawn)
    wait_reported(kubelets)


# ---------------------------------------------------------------------------------------------------------
# Scenarios, in file order on one cluster
# ---------------------------------------------------------------------------------------------------------

# 14 of the 16 GPUs by kube-scheduler's count (an init container counts as the larger of it and the app containers),
# then 13 after the churn and 15 after the restart: every pod fits by count wherever the ones before it went.
FIRST = [("single", "one", 1), ("pair", "one", 2), ("quad", "one", 4), ("workers", "several", 1, 1),
         ("prepared", "init", 2, 1), ("prepared", "init", 1, 1), ("sided", "sidecar", 1, 1)]
CHURN_LEAVING = ("pair", "quad", "workers")
CHURN_COMING = [("quad", "one", 4), ("sided", "sidecar", 1, 2)]
AFTER_RESTART = [("single", "one", 1), ("prepared", "init", 1, 1)]


def test_every_shape_gets_exactly_its_annotated_gpus(kubelets: KubeletCluster) -> None:
    names = [kubelets.create(stem, shape, *gpus) for stem, shape, *gpus in FIRST]
    wait_admitted(kubelets, names)
    check_all(kubelets, len(names))


def test_after_churn_new_pods_get_theirs_and_old_ones_keep_theirs(kubelets: KubeletCluster) -> None:
    live = sorted(pod["metadata"]["name"] for pod in kubelets.pods())
    leaving = [name for name in live if name.rsplit("-", 1)[0] in CHURN_LEAVING]
    assert len(leaving) == len(CHURN_LEAVING)
    for name in leaving:
        kubelets.cluster.kube.delete_pod(name, kubelets.cluster.namespace)
    wait_gone(kubelets, leaving)
    names = [kubelets.create(stem, shape, *gpus) for stem, shape, *gpus in CHURN_COMING]
    wait_admitted(kubelets, names)
    check_all(kubelets, len(live) - len(leaving) + len(names))


class UsedWatch:
    """Each node's published `used`, read every 0.1 s in a thread of its own: the GPUs of `held` (node -> GPUs of
    pods that run throughout) that the agent published as free meanwhile."""

    def __init__(self, kubelets: KubeletCluster, held: Mapping[str, set[str]]) -> None:
        self.held = held
        self.freed: dict[str, set[str]] = {name: set() for name in held}
        self._kube = Kube(kubelets.cluster.workdir / "admin.kubeconfig")
        self._keys = kubelets.cluster.keys
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="used-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            for name, gpus in self.held.items():
                state = (self._kube.get_node(name)["metadata"].get("annotations") or {}).get(self._keys.state)
                if state is not None:
                    self.freed[name] |= gpus - decode_state(state).used

    def stop(self) -> dict[str, set[str]]:
        self._stop.set()
        self._thread.join(10)
        self._kube.close()
        return {name: gpus for name, gpus in self.freed.items() if gpus}


def test_a_kubelet_restart_keeps_every_running_pod_and_its_gpus(kubelets: KubeletCluster) -> None:
    """Every pod survives both kubelets' restarts with its GPUs, and pods created once the agents report them
    again get theirs. The two ways this failed before, each now a plain failure:

    - a pod with a GPU container not running yet (here behind a plain init container, which the fake runtime
      never ends; in production an init container at work, or a container between two restarts) is rejected for
      good (UnexpectedAdmissionError, "no healthy devices present") if the restarted kubelet admits its pods
      again (about a second after it starts) before the agent registered again: only a container the runtime
      reports running skips the device checks (devicemanager `devicesToAllocate`). The agent polled its
      device-plugin directory once a second and lost that race; it now wakes on the directory's change
      (topology/agent/dir_watch.py);
    - until that first pod list, the restarted kubelet's pod-resources `List` shows no pod, and the agent
      published it as `used` without the running pods' GPUs, so the extender could bind them again; it now holds
      the last pods over a List that empties at once (topology/agent/reporter.py,
      tests/agent/test_delivery_cluster.py)."""
    pods = kubelets.pods()
    before = {pod["metadata"]["uid"]: pod["metadata"]["name"] for pod in pods}
    running = {pod["metadata"]["uid"] for pod in pods if not plain_init_containers(pod)}
    watch = UsedWatch(kubelets, {name: {gpu for (uid, _), entry in node.checkpoint().items() if uid in running
                                        for gpu in entry.ids} for name, node in kubelets.nodes.items()})
    try:
        for node in kubelets.nodes.values():
            kubelets.restart_kubelet(node)
        wait_reported(kubelets)
    finally:
        freed = watch.stop()
    names = [kubelets.create(stem, shape, *gpus) for stem, shape, *gpus in AFTER_RESTART]
    wait_admitted(kubelets, names)

    after = kubelets.pods()
    assert set(before) <= {pod["metadata"]["uid"] for pod in after}, "a pod was lost in the restart"
    rejected = {pod["metadata"]["name"]: (pod.get("status") or {}).get("message", "") for pod in after
                if (pod.get("status") or {}).get("phase") in FINISHED}
    assert not rejected, f"the restarted kubelet rejected pods before the agent registered again: {rejected}"
    assert not freed, f"the agents published GPUs of running pods as free after the kubelet restarted: {freed}"
    check_all(kubelets, len(before) + len(names), frozenset())
