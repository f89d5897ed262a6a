"""Real kubelets for the end-to-end suite, each with its own fake container runtime and our node agent delivering.

Beside the cluster of kube_e2e (etcd, kube-apiserver, the extender, kube-scheduler), each `KubeletNode` runs:

- `fakecri`: a main over `k8s.io/cri-client/pkg/fake` (runtime and image service on one unix socket, images of a
  non-zero size). It never ends a container, so a plain init container runs for ever and its app containers never
  start; the kubelet still allocates devices for every container at admission;
- the kubelet (v1.36), in a mount namespace of its own (`unshare -m`), where a private directory is bound over
  /var/lib/kubelet/device-plugins (the kubelet's device-plugin directory is fixed whatever `--root-dir` says) and
  another over /var/log/pods. It talks to kube-apiserver as the harness's admin; it has no cgroups of its own
  (`cgroupsPerQOS: false`) and runs on a cgroup v1 host (`failCgroupV1: false`);
- the node agent (`gpu-topology-agent --mode deliver`) outside that namespace, serving the device plugin in the
  private directory and reading the kubelet's pod-resources socket, with the node's real platform topology (UUIDs
  as NVML would give them) from a topology JSON file (`--from-topo`).

A kubelet sets host sysctls when it starts (`Tunables`): they are read before the first kubelet starts and written
back after every kubelet stops, restarts included.

What the kubelet recorded, to check delivery against: its device-manager checkpoint (every container, init
containers too) and pod-resources `List` (app containers and sidecars).

For the manifests' and the chart's e2e: two such nodes with kube-scheduler and the controllers a rollout needs
(`start_two_nodes`), and the checks of the extender's Deployment there: a restart that rolls with a replica ready
throughout (a watch of its Pods), and the surge strategy that stalls on the anti-affinity.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kube_e2e import (
    HOW_TO_RUN,
    ROOT,
    ControlPlane,
    Kube,
    Pki,
    Process,
    binary_version,
    find_kube_binaries,
    free_ports,
    local_get,
    start_controller_manager,
    start_scheduler,
    wait_until,
)
from kubernetes import watch

from extender.api.pod_request import DEFAULT_GPU_RESOURCE
from topology.agent import deviceplugin_v1beta1 as dp
from topology.agent.podresources import PodResourcesClient
from topology.codec import encode_topology
from topology.model import Topology
from topology.platforms import PLATFORMS

KUBELET_BINARIES = ("kubelet", "fakecri")
HOST_TOOLS = ("unshare", "mount")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # the kubelet's, fixed (pluginapi.DevicePluginPath)
POD_LOG_DIR = Path("/var/log/pods")  # the kubelet's, fixed
CHECKPOINT = "kubelet_internal_checkpoint"
# The host sysctls a kubelet sets at start (pkg/kubelet/cm/container_manager_linux.go, setupKernelTunables).
KERNEL_TUNABLES = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops",
                   "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes")
STARTUP_SECONDS = {"fakecri": 30.0, "kubelet": 120.0}
AGENT_INTERVAL_SECONDS = 1.0

# The kubelet binds both mounts, then becomes the kubelet: the namespace ends with it, and so do the mounts.
_IN_NAMESPACE = ('mount --bind "$1" "$3" && mount --bind "$2" "$4" && shift 4 && exec "$@"')


# ---------------------------------------------------------------------------------------------------------
# Which binaries, or why the kubelet suite skips
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KubeletBinaries:
    """The kubelet and fakecri from KUBE_BIN_DIR (beside kube-apiserver and kube-scheduler)."""

    kubelet: Path
    fakecri: Path

    def versions(self) -> dict[str, str]:
        return {"kubelet": binary_version(self.kubelet)}


def find_kubelet_binaries(env: Mapping[str, str] | None = None,
                          root: bool | None = None) -> tuple[KubeletBinaries | None, str | None]:
    """(the binaries, None) or (None, what is missing): the control plane's binaries first, then the kubelet's,
    then what running a kubelet here takes (root, for its mount namespace and sysctls; `root` None: whether this
    process runs as root)."""
    env = os.environ if env is None else env
    root = os.geteuid() == 0 if root is None else root
    _, problem = find_kube_binaries(env)
    if problem is not None:
        return None, problem
    directory = Path(env["KUBE_BIN_DIR"].strip()).expanduser().resolve()
    missing = [name for name in KUBELET_BINARIES
               if not ((directory / name).is_file() and os.access(directory / name, os.X_OK))]
    if missing:
        return None, (f"KUBE_BIN_DIR={env['KUBE_BIN_DIR'].strip()} has no executable {', '.join(missing)} "
                      "(fakecri: a main over k8s.io/cri-client/pkg/fake)")
    tools = [tool for tool in HOST_TOOLS if shutil.which(tool, path=env.get("PATH")) is None]
    if tools:
        return None, f"no {', '.join(tools)} on PATH (util-linux), needed for each kubelet's mount namespace"
    if not root:
        return None, "a kubelet needs root (its mount namespace, its sysctls); the suite is not running as root"
    return KubeletBinaries(directory / "kubelet", directory / "fakecri"), None


def kubelet_skip_reason(problem: str) -> str:
    return (f"end-to-end kubelet suite skipped: {problem}. It needs kube-apiserver, kube-scheduler, kubelet and "
            f"fakecri (v1.36) in one directory, etcd there or on PATH, and root; run it with {HOW_TO_RUN}")


# ---------------------------------------------------------------------------------------------------------
# Host sysctls
# ---------------------------------------------------------------------------------------------------------

class Tunables:
    """The sysctls a kubelet changes, as they were before any kubelet started, written back on `restore`."""

    def __init__(self, root: Path = Path("/proc/sys")) -> None:
        self.root = root
        self.saved = {name: (root / name).read_text().strip() for name in KERNEL_TUNABLES if (root / name).exists()}

    def restore(self) -> dict[str, tuple[str, str]]:
        """Write back each value that differs; returns name: (found, restored) for those."""
        changed = {}
        for name, value in self.saved.items():
            found = (self.root / name).read_text().strip()
            if found != value:
                (self.root / name).write_text(value + "\n")
                changed[name] = (found, value)
        return changed


# ---------------------------------------------------------------------------------------------------------
# One node: fakecri, the kubelet, the agent
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recorded:
    """One container's entry in the kubelet's checkpoint: its device ids and the plugin's Allocate answer, which is
    what the runtime was given (CDI devices, environment, mounts)."""

    ids: frozenset[str]
    response: Any


@dataclass
class KubeletNode:
    """A node of real processes; `base` is a short directory (unix socket paths stay under 108 bytes)."""

    name: str
    topology: Topology
    base: Path
    binaries: KubeletBinaries
    kubeconfig: Path
    pki: Pki
    tunables: Tunables
    logs: Path
    processes: dict[str, Process] = field(default_factory=dict)
    healthz_port: int = 0

    @property
    def root_dir(self) -> Path:
        return self.base / "root"

    @property
    def plugin_dir(self) -> Path:
        return self.base / "device-plugins"

    @property
    def checkpoint_file(self) -> Path:
        return self.plugin_dir / CHECKPOINT

    @property
    def runtime_socket(self) -> Path:
        return self.base / "cri.sock"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    def start(self, stack: ExitStack) -> None:
        for directory in (self.root_dir, self.plugin_dir, self.base / "pod-logs"):
            directory.mkdir(parents=True, exist_ok=True)
        self.write_config()
        fakecri = Process(f"fakecri-{self.name}", [self.binaries.fakecri, "--endpoint",
                                                   f"unix://{self.runtime_socket}"],
                          self.logs / f"fakecri-{self.name}.log")
        stack.callback(fakecri.stop)
        self.processes["fakecri"] = fakecri
        wait_until(self.runtime_socket.is_socket, STARTUP_SECONDS["fakecri"], f"fakecri of {self.name}",
                   watch=[fakecri])
        stack.callback(self.stop_kubelet)
        self.start_kubelet()
        self._start_agent(stack)

    def start_kubelet(self) -> None:
        """The kubelet in its own mount namespace, on the node's root directory, checkpoint and runtime."""
        argv = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", _IN_NAMESPACE,
                f"kubelet-{self.name}", self.plugin_dir, self.base / "pod-logs", DEVICE_PLUGIN_DIR, POD_LOG_DIR,
                self.binaries.kubelet,
                f"--config={self.base / 'kubelet-config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.root_dir}",
                f"--cert-dir={self.base / 'pki'}",
                f"--hostname-override={self.name}",
                "--v=2"]
        kubelet = Process(f"kubelet-{self.name}", argv, self.logs / f"kubelet-{self.name}.log")
        self.processes["kubelet"] = kubelet
        wait_until(lambda: local_get(self.healthz_port, "/healthz")[0] == 200, STARTUP_SECONDS["kubelet"],
                   f"kubelet of {self.name} /healthz", watch=[kubelet], interval=0.5)

    def stop_kubelet(self) -> dict[str, tuple[str, str]]:
        """SIGTERM (then SIGKILL) to the kubelet, and the host sysctls as they were before any kubelet."""
        self.processes["kubelet"].stop()
        return self.tunables.restore()

    def restart_kubelet(self) -> None:
        """A new kubelet process in place of the running one, as after an upgrade or a crash."""
        self.stop_kubelet()
        self.start_kubelet()

    def _start_agent(self, stack: ExitStack) -> None:
        topology_file = self.base / "topology.json"
        topology_file.write_text(encode_topology(self.topology))
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        agent = Process(f"agent-{self.name}", [
            sys.executable, "-m", "topology.agent.cli",
            "--kubeconfig", self.kubeconfig, "--node-name", self.name, "--mode", "deliver",
            "--from-topo", topology_file,
            "--socket", self.pod_resources_socket,
            "--device-plugin-dir", self.plugin_dir,
            "--interval", str(AGENT_INTERVAL_SECONDS), "--heartbeat", "10",
        ], self.logs / f"agent-{self.name}.log", env=env, cwd=ROOT)
        stack.callback(agent.stop)
        self.processes["agent"] = agent

    def write_config(self) -> None:
        port, self.healthz_port = free_ports(2)
        runtime = f"unix://{self.runtime_socket}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.pki.ca)}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": runtime,
            "imageServiceEndpoint": runtime,
            "cgroupDriver": "cgroupfs",
            # No QoS cgroups and no node-allocatable enforcement: two kubelets would share them on one host.
            "cgroupsPerQOS": False,
            "enforceNodeAllocatable": [],
            "failSwapOn": False,
            "failCgroupV1": False,
            "registerNode": True,
            "nodeStatusUpdateFrequency": "4s",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "serializeImagePulls": False,
            # A shared test machine's disk and memory must not evict the pods.
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                             "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
        }
        (self.base / "kubelet-config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    # -- what the kubelet recorded ---------------------------------------------------------------------

    def checkpoint(self, resource: str = DEFAULT_GPU_RESOURCE) -> dict[tuple[str, str], Recorded]:
        """(pod UID, container) -> what the device manager's checkpoint holds for `resource`."""
        data = json.loads(self.checkpoint_file.read_text())["Data"]
        return {(entry["PodUID"], entry["ContainerName"]): Recorded(
                    frozenset(device for ids in entry["DeviceIDs"].values() for device in ids),
                    dp.ContainerAllocateResponse.FromString(base64.b64decode(entry["AllocResp"])))
                for entry in data["PodDeviceEntries"] or () if entry["ResourceName"] == resource}

    def listed(self, resource: str = DEFAULT_GPU_RESOURCE) -> dict[tuple[str, str], dict[str, tuple[str, ...]]]:
        """pod-resources `List`: (namespace, pod) -> container -> device ids of `resource`."""
        client = PodResourcesClient(str(self.pod_resources_socket))
        try:
            return client.listed(resource)
        finally:
            client.close()


# ---------------------------------------------------------------------------------------------------------
# The nodes together
# ---------------------------------------------------------------------------------------------------------

def short_base(stack: ExitStack) -> Path:
    """A short directory for sockets, removed when `stack` closes."""
    base = Path(tempfile.mkdtemp(prefix="kl-"))
    stack.callback(shutil.rmtree, base, True)
    return base


def start_kubelet_nodes(binaries: KubeletBinaries, nodes: Mapping[str, Topology], kube: Kube,
                        kubeconfig: Path, pki: Pki, logs: Path, stack: ExitStack) -> list[KubeletNode]:
    """Each node's fakecri, kubelet and agent; returns once every node is Ready, untainted, offers its GPUs and
    carries the agent's topology and a fresh state."""
    for directory in (DEVICE_PLUGIN_DIR, POD_LOG_DIR):
        directory.mkdir(parents=True, exist_ok=True)  # mount points; the host's own stay untouched
    tunables = Tunables()
    stack.callback(tunables.restore)
    base = short_base(stack)
    started = []
    for name, topology in nodes.items():
        node = KubeletNode(name, topology, base / name, binaries, kubeconfig, pki, tunables, logs)
        node.start(stack)
        started.append(node)
    for node in started:
        wait_node_ready(kube, node)
    return started


def wait_node_ready(kube: Kube, node: KubeletNode, timeout: float = 120.0) -> None:
    """Until the Node is Ready with its GPUs allocatable and the agent's annotations; the not-ready taint that
    admission put on the new Node is lifted here, since no node lifecycle controller runs."""
    watched = list(node.processes.values())

    def ready() -> bool:
        current = kube.get_node(node.name)
        conditions = {c["type"]: c["status"] for c in (current.get("status") or {}).get("conditions") or []}
        if conditions.get("Ready") != "True":
            return False
        if (current.get("spec") or {}).get("taints"):
            kube.patch_node(node.name, {"spec": {"taints": None}})
            return False
        allocatable = (current.get("status") or {}).get("allocatable") or {}
        annotations = (current.get("metadata") or {}).get("annotations") or {}
        return (allocatable.get(DEFAULT_GPU_RESOURCE) == str(node.topology.size)
                and "gpu-topology.io/topology" in annotations and "gpu-topology.io/state" in annotations)

    wait_until(ready, timeout, f"node {node.name} Ready with {node.topology.size} GPUs and the agent's annotations",
               watch=watched, interval=0.5)


# ---------------------------------------------------------------------------------------------------------
# Two nodes for the extender's two replicas: a rollout on real kubelets (the manifests' and the chart's e2e)
# ---------------------------------------------------------------------------------------------------------

EXTENDER_NAMESPACE = "gpu-topology-system"
EXTENDER_DEPLOYMENT = "deployment/gpu-topology-extender"
EXTENDER_SELECTOR = "app.kubernetes.io/name=gpu-topology-extender"
TWO_NODES = ("kubelet-a", "kubelet-b")
# What a rollout and a drain need besides the type-check controller: the Deployment's and ReplicaSet's, the quota's
# (a ResourceQuota that admits the critical priority class is in force once it has a status) and the disruption
# controller's (the eviction API reads the PodDisruptionBudget's status).
ROLLOUT_CONTROLLERS = ("deployment-controller", "replicaset-controller", "resourcequota-controller",
                       "disruption-controller")
ROLLOUT_SECONDS = 240
# The strategy the manifests and the chart had: a surge Pod that no node can take (anti-affinity), and no old
# replica goes while it waits.
SURGE_STRATEGY = {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
STALL_SECONDS = 45
WATCH_SECONDS = 5

Doc = dict[str, Any]


def start_two_nodes(plane: ControlPlane, stack: ExitStack,
                    controllers: tuple[str, ...] = ROLLOUT_CONTROLLERS) -> list[KubeletNode]:
    """kube-controller-manager running `controllers`, kube-scheduler (its defaults) and two real kubelets named
    TWO_NODES, each with its fake runtime (the extender's container never really runs: fakecri pulls any image
    name, an exec probe answers 0) and our agent. Skips the calling test where kubelets cannot run here."""
    binaries, problem = find_kubelet_binaries()
    if problem is not None or binaries is None:
        pytest.skip(kubelet_skip_reason(problem or "no kubelet"))
    kube = Kube(plane.kubeconfig)
    stack.callback(kube.close)
    start_controller_manager(plane.binaries.controller_manager, plane.workdir, plane.kubeconfig, stack, controllers)
    config = plane.workdir / "default-scheduler.yaml"
    config.write_text(yaml.safe_dump({"apiVersion": "kubescheduler.config.k8s.io/v1",
                                      "kind": "KubeSchedulerConfiguration",
                                      "clientConnection": {"kubeconfig": str(plane.kubeconfig)},
                                      "leaderElection": {"leaderElect": False}}))
    start_scheduler(plane.binaries.scheduler, plane.workdir, config, plane.kubeconfig, stack)
    topology = PLATFORMS["rtx-a6000-pairs"].topology()
    return start_kubelet_nodes(binaries, {name: topology for name in TWO_NODES}, kube, plane.kubeconfig, plane.pki,
                               plane.workdir / "logs", stack)


def publish_root_ca(plane: ControlPlane, namespace: str) -> None:
    """The ConfigMaps a Pod's token volume projects, which kube-controller-manager publishes where it runs with a
    root CA (and the service CA, in the OpenShift-derived v1.36.2 tree these binaries are built from)."""
    for name, key in (("kube-root-ca.crt", "ca.crt"), ("openshift-service-ca.crt", "service-ca.crt")):
        plane.apply("--server-side", "-f", "-", stdin=json.dumps({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace},
            "data": {key: plane.pki.ca.read_text()}}))


def extender_pods(plane: ControlPlane) -> list[Doc]:
    """The extender's Pods, but those being deleted."""
    return [pod for pod in plane.get_json("pods", "-n", EXTENDER_NAMESPACE, "-l", EXTENDER_SELECTOR)["items"]
            if not pod["metadata"].get("deletionTimestamp")]


def pod_ready(pod: Doc) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def rollout_status(plane: ControlPlane, seconds: int) -> subprocess.CompletedProcess[str]:
    return plane.kubectl("-n", EXTENDER_NAMESPACE, "rollout", "status", EXTENDER_DEPLOYMENT,
                         f"--timeout={seconds}s", check=False, timeout=seconds + 60)


def extender_state(plane: ControlPlane) -> str:
    """What a failed wait shows: the namespace's Pods and Events."""
    return "\n".join(plane.kubectl(*args, check=False).stdout for args in (
        ("-n", EXTENDER_NAMESPACE, "get", "pods,replicasets,deployments,poddisruptionbudgets", "-o", "wide"),
        ("-n", EXTENDER_NAMESPACE, "get", "events", "--sort-by=.lastTimestamp")))


def both_ready_on_both_nodes(plane: ControlPlane) -> bool:
    pods = extender_pods(plane)
    return len(pods) == 2 and all(map(pod_ready, pods)) and {p["spec"].get("nodeName") for p in pods} == set(TWO_NODES)


def wait_both_ready(plane: ControlPlane, what: str, seconds: float = ROLLOUT_SECONDS) -> None:
    wait_until(lambda: both_ready_on_both_nodes(plane), seconds, what, interval=2.0,
               diagnose=lambda: extender_state(plane))


class ReadyReplicas:
    """The extender's Pods as a watch of the API server sees them: after each event, how many are Ready and not
    being deleted (what the Service's endpoints count as serving)."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kube = Kube(kubeconfig)
        self.counts: list[int] = []
        self.errors: list[str] = []
        self._ready: dict[str, bool] = {}
        self._version = ""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ready-replicas", daemon=True)

    def start(self) -> ReadyReplicas:
        listed = self.kube.core.list_namespaced_pod(EXTENDER_NAMESPACE, label_selector=EXTENDER_SELECTOR,
                                                    _preload_content=False)
        body = json.loads(listed.data)
        self._ready = {pod["metadata"]["name"]: self._serving(pod) for pod in body["items"]}
        self.counts.append(sum(self._ready.values()))
        self._version = body["metadata"]["resourceVersion"]
        self._thread.start()
        return self

    @staticmethod
    def _serving(pod: Doc) -> bool:
        return pod_ready(pod) and not pod["metadata"].get("deletionTimestamp")

    def _run(self) -> None:
        # Short watches, each from the last event's resourceVersion, so that stop() returns within seconds.
        while not self._stopped.is_set():
            try:
                for event in watch.Watch().stream(self.kube.core.list_namespaced_pod, EXTENDER_NAMESPACE,
                                                  label_selector=EXTENDER_SELECTOR, resource_version=self._version,
                                                  timeout_seconds=WATCH_SECONDS):
                    pod = event["raw_object"]
                    if event["type"] not in ("ADDED", "MODIFIED", "DELETED"):
                        raise RuntimeError(f"{event['type']}: {pod}")
                    if event["type"] == "DELETED":
                        self._ready.pop(pod["metadata"]["name"], None)
                    else:
                        self._ready[pod["metadata"]["name"]] = self._serving(pod)
                    self._version = pod["metadata"]["resourceVersion"]
                    self.counts.append(sum(self._ready.values()))
            except Exception as error:  # noqa: BLE001 - the test reads it: a gap in the watch is a failure
                self.errors.append(repr(error))
                return

    def stop(self) -> list[int]:
        """The counts, from the list before the watch to its last event."""
        self._stopped.set()
        self._thread.join(timeout=WATCH_SECONDS + 30)
        self.kube.close()
        return self.counts


def restart_rolls_with_one_ready(plane: ControlPlane) -> list[int]:
    """`kubectl rollout restart` of the extender, both replicas ready on both nodes before: it completes within
    ROLLOUT_SECONDS, both replicas are new and ready on both nodes, and one replica at least was ready at every
    step in between. Returns the ready counts the watch saw."""
    before = {p["metadata"]["name"] for p in extender_pods(plane)}
    replicas = ReadyReplicas(plane.kubeconfig).start()
    try:
        # One old replica goes, its successor takes the freed node and gets ready, then the other.
        plane.kubectl("-n", EXTENDER_NAMESPACE, "rollout", "restart", EXTENDER_DEPLOYMENT)
        done = rollout_status(plane, ROLLOUT_SECONDS)
        assert done.returncode == 0, done.stdout + done.stderr + extender_state(plane)
        wait_both_ready(plane, "both new replicas ready", 60)
        assert not before & {p["metadata"]["name"] for p in extender_pods(plane)}
        wait_until(lambda: replicas.counts[-1] == 2 or replicas.errors, 30, "the watch at both replicas ready")
    finally:
        counts = replicas.stop()
    assert not replicas.errors, replicas.errors
    assert counts[0] == counts[-1] == 2 and min(counts) >= 1, counts
    return counts


def surge_stalls(plane: ControlPlane) -> None:
    """With SURGE_STRATEGY patched in, a restart stalls: the surge Pod stays Pending on the anti-affinity and no old
    replica goes. The caller puts its own strategy back, which finishes the same rollout."""
    wait_both_ready(plane, "two extender replicas ready")
    plane.kubectl("-n", EXTENDER_NAMESPACE, "patch", EXTENDER_DEPLOYMENT, "--type=merge",
                  "-p", json.dumps({"spec": {"strategy": SURGE_STRATEGY}}))
    plane.kubectl("-n", EXTENDER_NAMESPACE, "rollout", "restart", EXTENDER_DEPLOYMENT)
    stalled = rollout_status(plane, STALL_SECONDS)
    assert stalled.returncode != 0, stalled.stdout
    pods = extender_pods(plane)
    pending = [p for p in pods if not p["spec"].get("nodeName")]
    assert len(pending) == 1 and len(pods) == 3, [p["metadata"]["name"] for p in pods]
    assert sum(map(pod_ready, pods)) == 2
    messages = " ".join(c.get("message", "") for c in pending[0]["status"].get("conditions") or [])
    assert "anti-affinity" in messages, messages
