"""A whole cluster in one process, for delivery tests and benchmarks: every piece real but the kubelet.

- the in-process API server (`kube_api_server.py`), reached through the real `kubernetes` client;
- the extender: its watches, `ClusterState`, and filter, prioritize and bind as kube-scheduler drives them;
- per node, the kubelet stand-in (`kubelet_standin.py`), the node agent's device plugin (`--mode deliver`)
  and its reporter loop, on real unix sockets, exactly as one agent process wires them;
- per node, the kubelet's pod source: it follows the pods bound to its node and admits them one at a time
  in the order it sees them (creation time within a batch), and forgets the ones that are deleted.
  `admit_delay` holds each bound pod back that long after the pod source first sees it, as the real kubelet's
  watch and sync loop take tens to hundreds of milliseconds; `on_admitted` is called on the pod source's
  thread after each admission (benchmarks: a lock released after Allocate, the time a pod got its GPUs).

`mode="report"` runs the reporter only and gives the kubelet a stock-like plugin instead of ours: it
registers the GPUs but ignores the extender (first free GPUs, as NVIDIA's plugin does for one GPU).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import kubernetes.client as k8s
import orjson

from extender.api.wire import BindingArgs, parse_extender_args
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import with_uuids
from extender.kube.client import KubernetesApi
from extender.kube.reflector import Reflector
from extender.verbs.service import ExtenderService
from helpers.kube_api_server import FakeKubeApiServer, make_node
from helpers.kubelet_standin import Admission, KubeletStandIn, pod_containers
from topology.agent import deviceplugin_v1beta1 as dp
from topology.agent.deviceplugin import DevicePlugin
from topology.agent.kube import NodeApi
from topology.agent.podresources import PodResourcesClient
from topology.agent.pods import NodePods
from topology.agent.reporter import Reporter
from topology.annotations import AnnotationKeys
from topology.codec import encode_topology
from topology.model import Topology
from topology.platforms import PLATFORMS

GPU = "nvidia.com/gpu"
KEYS = AnnotationKeys()


@dataclass
class Admitted:
    """One admission as the kubelet did it, and what pod-resources `List` said right after it."""

    pod: dict
    admission: Admission
    listed: dict[str, tuple[str, ...]]  # container -> our resource's device ids, from List


@dataclass
class NodeRig:
    name: str
    topology: Topology
    kubelet: KubeletStandIn
    admitted: list[Admitted] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    running: threading.Event = field(default_factory=threading.Event)  # cleared: the pod source waits
    busy: threading.Lock = field(default_factory=threading.Lock)  # held by the pod source while it admits
    shared: list[str] = field(default_factory=list)  # a device List showed in two containers at once
    stock: grpc.Server | None = None


class DeliveryCluster:
    def __init__(self, root: Path, nodes: tuple[tuple[str, str], ...], *, mode: str = "deliver",
                 report_interval: float = 0.2, admit_delay: float = 0.0,
                 on_admitted: Callable[[NodeRig, Admitted], None] | None = None) -> None:
        self.root, self.mode = root, mode
        self.admit_delay = admit_delay  # may be changed while running; read on every pass of the pod source
        self.on_admitted = on_admitted
        self.server = FakeKubeApiServer().start()
        self.stop_event = threading.Event()
        self.rigs: dict[str, NodeRig] = {}
        self.reflectors: list[Reflector] = []
        try:
            self._start(nodes, report_interval)
        except BaseException:
            self.close()
            raise

    def _start(self, nodes: tuple[tuple[str, str], ...], report_interval: float) -> None:
        configuration = k8s.Configuration(host=self.server.url)
        mode = self.mode
        for number, (name, platform) in enumerate(nodes):
            topology = with_uuids(name, PLATFORMS[platform].topology())
            self.server.add_node(make_node(name, gpus=topology.size,
                                           annotations={KEYS.topology: encode_topology(topology)}))
            kubelet = KubeletStandIn(self.root / f"k{number}", seed=number).start()
            rig = NodeRig(name, topology, kubelet)
            rig.running.set()
            self.rigs[name] = rig
            if mode == "deliver":
                plugin = DevicePlugin(topology, PodResourcesClient(str(kubelet.pod_resources_socket), timeout=2.0),
                                      NodePods.from_configuration(k8s.Configuration(host=self.server.url), name,
                                                                  timeout=2.0),
                                      plugin_dir=str(kubelet.plugin_dir), poll=0.05)
                self._thread(rig, plugin.run, self.stop_event)
            else:
                rig.stock = _stock_plugin(kubelet, topology)
            kubelet.wait_registered(GPU, timeout=15)
            reporter = Reporter(topology, NodeApi.from_configuration(k8s.Configuration(host=self.server.url), name),
                                PodResourcesClient(str(kubelet.pod_resources_socket)), interval=report_interval,
                                heartbeat=5.0, stop=self.stop_event)
            self._thread(rig, reporter.run)
            self._thread(rig, self._pod_source, rig)
        self.api = KubernetesApi.from_configuration(configuration, timeout=5.0, instance="delivery")
        self.state = ClusterState()
        self.reflectors = [Reflector(self.api.list_nodes, self.api.watch_nodes, self.state.nodes, name="nodes",
                                     watch_timeout=30),
                           Reflector(self.api.list_pods, self.api.watch_pods, self.state.pods, name="pods",
                                     watch_timeout=30)]
        for reflector in self.reflectors:
            reflector.start()
        self.service = ExtenderService(self.state, self.api)
        self.wait(lambda: self.state.ready and all(
            view.observed is not None for view in self.state.views().values()), 30, "the extender's first lists")

    # -- what kube-scheduler does ----------------------------------------------------------------------

    def schedule(self, pod: dict) -> str:
        """filter, prioritize, then bind to the best node; "" when bound, else why not."""
        names = sorted(self.rigs)
        body = orjson.dumps({"Pod": pod, "NodeNames": names})
        outcome = self.service.filter(parse_extender_args(body))
        if not outcome.passed:
            return "; ".join(sorted(set(outcome.reasons()[0].values()) | set(outcome.reasons()[1].values())))
        hosts, scores = self.service.prioritize(parse_extender_args(orjson.dumps({"Pod": pod,
                                                                                  "NodeNames": outcome.passed})))
        node = max(zip(scores, hosts), key=lambda pair: (pair[0], pair[1]))[1]
        metadata = pod["metadata"]
        return self.service.bind(BindingArgs(metadata["name"], metadata["namespace"], metadata["uid"], node))

    # -- what each node's kubelet does ----------------------------------------------------------------

    def _pod_source(self, rig: NodeRig) -> None:
        seen: dict[str, dict] = {}
        noticed: dict[str, float] = {}  # uid -> when the pod source first saw the pod on its node
        while not self.stop_event.is_set():
            if not rig.running.wait(0.05):
                continue
            with rig.busy:
                self._admit_new(rig, seen, noticed)
            self.stop_event.wait(0.01)

    def _admit_new(self, rig: NodeRig, seen: dict[str, dict], noticed: dict[str, float] | None = None) -> None:
        pods = {pod["metadata"]["uid"]: pod for pod in self.server.pods_on(rig.name)}
        for uid in set(seen) - set(pods):
            rig.kubelet.remove(uid)
            del seen[uid]
        ready = set(pods)
        if noticed is not None:
            now, delay = time.monotonic(), self.admit_delay
            for uid in set(noticed) - set(pods):
                del noticed[uid]
            ready = {uid for uid in pods if now - noticed.setdefault(uid, now) >= delay}
        fresh = sorted((pod for uid, pod in pods.items() if uid not in seen and uid in ready),
                       key=lambda pod: pod["metadata"].get("creationTimestamp", ""))
        for pod in fresh:
            seen[pod["metadata"]["uid"]] = pod
            admission = rig.kubelet.admit(pod)
            listed = self._listed(rig, pod) if admission.admitted else {}
            entry = Admitted(pod, admission, listed)
            rig.admitted.append(entry)
            if self.on_admitted is not None:
                self.on_admitted(rig, entry)
            if not admission.admitted:
                failed = self.server.pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
                failed["status"] = {"phase": "Failed", "reason": admission.reason, "message": admission.message}
                self.server.update_pod(failed)

    def _listed(self, rig: NodeRig, pod: dict) -> dict[str, tuple[str, ...]]:
        client = PodResourcesClient(str(rig.kubelet.pod_resources_socket))
        try:
            listed = client.listed(GPU)
        finally:
            client.close()
        holders: dict[str, str] = {}
        for (namespace, name), containers in listed.items():
            for container, devices in containers.items():
                for device in devices:
                    if device in holders:
                        rig.shared.append(f"{device}: {holders[device]} and {namespace}/{name}/{container}")
                    holders[device] = f"{namespace}/{name}/{container}"
        return dict(listed.get((pod["metadata"]["namespace"], pod["metadata"]["name"]), {}))

    def restart_kubelet(self, name: str, readmit: bool = True) -> None:
        """The kubelet restarts and admits its pods again at once (every container of an admitted pod runs); its
        pod source resumes once our plugin has registered again. A real kubelet gets its first pod list about a
        second after it starts, and lists no pod until then: `readmit=False` leaves it so, its pod source paused,
        until `readmit_all`."""
        rig = self.rigs[name]
        rig.running.clear()
        with rig.busy:
            rig.kubelet.restart()
            if readmit:
                self._readmit(rig)
        rig.kubelet.wait_registered(GPU, timeout=15)
        self.wait(lambda: bool(rig.kubelet.healthy(GPU)), 15, f"{name}'s devices listed again")
        if readmit:
            rig.running.set()

    def readmit_all(self, name: str) -> None:
        """The restarted kubelet's first pod list: its pods admitted again, every container running; its pod
        source resumes."""
        rig = self.rigs[name]
        with rig.busy:
            self._readmit(rig)
        rig.running.set()

    def _readmit(self, rig: NodeRig) -> None:
        rig.kubelet.readmit({entry.pod["metadata"]["uid"]: [c["name"] for c in pod_containers(entry.pod)]
                             for entry in rig.admitted if entry.admission.admitted})

    # -- plumbing ----------------------------------------------------------------------------------------

    def _thread(self, rig: NodeRig, target: Callable[..., Any], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name=f"{rig.name}-{target.__name__}")
        thread.start()
        rig.threads.append(thread)

    def wait(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.02)

    def admitted(self) -> Iterator[Admitted]:
        for rig in self.rigs.values():
            yield from list(rig.admitted)

    def close(self) -> None:
        self.stop_event.set()
        for reflector in self.reflectors:
            reflector.stop()
        for rig in self.rigs.values():
            for thread in rig.threads:
                thread.join(10)
            if rig.stock is not None:
                rig.stock.stop(0)
            rig.kubelet.stop()
        self.server.stop()


def _stock_plugin(kubelet: KubeletStandIn, topology: Topology) -> grpc.Server:
    """A device plugin that ignores the extender, as the stock one does: any preference is the first free GPUs."""
    ids = [gpu.uuid for gpu in topology.gpus]

    def options(request: Any, context: Any) -> Any:
        return dp.DevicePluginOptions(get_preferred_allocation_available=True)

    def list_and_watch(request: Any, context: Any) -> Iterator[Any]:
        yield dp.ListAndWatchResponse(devices=[dp.Device(ID=gpu, health=dp.HEALTHY) for gpu in ids])
        while context.is_active():
            time.sleep(0.1)

    def preferred(request: Any, context: Any) -> Any:
        answers = []
        for ask in request.container_requests:
            chosen = list(ask.must_include_deviceIDs)
            chosen += [gpu for gpu in ids if gpu in set(ask.available_deviceIDs) and gpu not in chosen]
            answers.append(dp.ContainerPreferredAllocationResponse(deviceIDs=chosen[:ask.allocation_size]))
        return dp.PreferredAllocationResponse(container_responses=answers)

    def allocate(request: Any, context: Any) -> Any:
        return dp.AllocateResponse(container_responses=[
            dp.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ask.devices_ids)})
            for ask in request.container_requests])

    handlers = {
        "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
            options, dp.Empty.FromString, dp.DevicePluginOptions.SerializeToString),
        "ListAndWatch": grpc.unary_stream_rpc_method_handler(
            list_and_watch, dp.Empty.FromString, dp.ListAndWatchResponse.SerializeToString),
        "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
            preferred, dp.PreferredAllocationRequest.FromString, dp.PreferredAllocationResponse.SerializeToString),
        "Allocate": grpc.unary_unary_rpc_method_handler(
            allocate, dp.AllocateRequest.FromString, dp.AllocateResponse.SerializeToString),
    }
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(dp.DEVICE_PLUGIN, handlers),))
    socket = kubelet.plugin_dir / "stock.sock"
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    channel = grpc.insecure_channel(f"unix://{kubelet.kubelet_socket}")
    channel.unary_unary(dp.REGISTER, dp.RegisterRequest.SerializeToString, dp.Empty.FromString)(
        dp.RegisterRequest(version=dp.VERSION, endpoint="stock.sock", resource_name=GPU,
                           options=dp.DevicePluginOptions(get_preferred_allocation_available=True)), timeout=15)
    channel.close()
    return server


def gpu_pod(name: str, shape: str, size: int, annotations: dict[str, str] | None = None) -> dict:
    """A pod of `size` GPUs in one of the shapes the kubelet allocates exactly:
    "one" container; "two" containers of size/2; "init" an init container of size then an app of size;
    "sidecar" a sidecar of 1 then an app of size-1."""
    def container(cname: str, count: int, **extra: Any) -> dict:
        return {"name": cname, "image": "cuda", **extra,
                "resources": {"limits": {GPU: str(count)}, "requests": {GPU: str(count)}}}
    if shape == "one" or size == 1:
        spec = {"containers": [container("main", size)]}
    elif shape == "two":
        spec = {"containers": [container("a", size // 2), container("b", size - size // 2)]}
    elif shape == "init":
        spec = {"initContainers": [container("prep", size)], "containers": [container("main", size)]}
    elif shape == "sidecar":
        spec = {"initContainers": [container("side", 1, restartPolicy="Always")],
                "containers": [container("main", size - 1)]}
    else:
        raise ValueError(shape)
    spec["schedulerName"] = "default-scheduler"
    return {"metadata": {"name": name, "namespace": "jobs", "annotations": dict(annotations or {})},
            "spec": spec, "status": {"phase": "Pending"}}


def workload(count: int, seed: int) -> list[dict]:
    """Mixed sizes 1, 2, 4 and 8, in every shape, in a seeded order."""
    rng = random.Random(seed)
    shapes = itertools.cycle(("one", "two", "init", "sidecar", "one"))
    return [gpu_pod(f"job-{i:03d}", next(shapes), rng.choice((1, 1, 2, 2, 4, 8))) for i in range(count)]
