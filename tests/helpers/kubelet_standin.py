"""An in-process stand-in for the kubelet's device manager (kubelet v1.36): the device plugin registration
service v1beta1, the plugin clients, per-container allocation at pod admission, the checkpoint, and the
pod-resources v1 service, so a device plugin and a pod-resources client can be tested against what the
kubelet really does rather than against what we think it does.

Written from the behaviour of pkg/kubelet/cm/devicemanager (manager.go, pod_devices.go, endpoint.go,
plugin/v1beta1/server.go, handler.go, client.go), pkg/kubelet/cm/topologymanager/scope.go and
pkg/kubelet/apis/podresources/server_v1.go. Error texts are the kubelet's, so tests can match them.

Where Go iterates a map (device sets, a container's limits), the order is arbitrary; here it is drawn from a
`random.Random` seeded per stand-in, so a plugin that depends on order fails, reproducibly.

A restarted kubelet starts with no pod: pod-resources `List` shows none until its first pod list arrives and it
admits them again before its sources are ready (`readmit`). There a container the runtime reports running keeps
its devices unchecked, any other needs its resource registered with healthy devices, or the pod is rejected; and
no pod's devices are freed until then (the checkpoint's allocations stay in use). A real kubelet v1.36 does this
about a second after it starts, racing its plugins' registration (seen with tests/e2e/test_kubelet_delivery_e2e.py).

The DRA manager (pkg/kubelet/cm/dra/manager.go, claiminfo.go; pkg/kubelet/cm/container_manager_linux.go
GetDynamicResources) is modelled as far as pod-resources shows it: `prepare` checks an active pod's claims as the
API server has them and caches each claim's info with the pod before its drivers' NodePrepareResources answers the
devices; `List` gives each container the claims it uses, by driver, pool and device, with their CDI devices; the
claim infos survive a restart (the DRA manager's checkpoint) and go when no pod uses them (`remove`).

Not modelled: node status (capacity, the stop grace period that drops a resource), the admission predicate
(node allocatable), the plugin-watcher registration paths (a DRA driver is `register_dra_driver`ed), CPU and memory
in pod-resources, PodGroup claims, and `Get`.
"""

from __future__ import annotations

import base64
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from topology.agent import deviceplugin_v1beta1 as dp
from topology.agent import podresources_v1 as pr

Message = Any  # protobuf classes are built at import from a descriptor, so they have no static type
NumaAffinity = Callable[[dict, str], set[int] | None]
CdiNames = Callable[[str, dict], list[str]]  # (claim uid, allocation result) -> the CDI devices a driver prepares

CHECKPOINT = "kubelet_internal_checkpoint"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
NO_TOPOLOGY = -1  # the kubelet's fake NUMA node for devices that report none

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def is_extended_resource_name(name: str) -> bool:
    """The kubelet's test for a device plugin's resource name: has a domain, is outside *kubernetes.io/, has
    no quota prefix, and `requests.<name>` is a qualified name (DNS subdomain prefix, 63-char name)."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, rest = f"requests.{name}".partition("/")
    return ("/" not in rest and len(prefix) <= 253 and _DNS_SUBDOMAIN.fullmatch(prefix) is not None
            and 0 < len(rest) <= 63 and _QUALIFIED_NAME.fullmatch(rest) is not None)


def _go_rpc_error(error: grpc.RpcError) -> str:
    """How a Go gRPC client prints a status error, since the kubelet wraps that text into its own."""
    code = error.code()
    name = "Canceled" if code is grpc.StatusCode.CANCELLED else "".join(
        part.capitalize() for part in code.name.split("_"))
    return f"rpc error: code = {name} desc = {error.details()}"


class DeviceManagerError(Exception):
    """An error the device manager returns; its text is the kubelet's."""


class DraManagerError(Exception):
    """An error the DRA manager's PrepareResources returns; its text is the kubelet's."""


def nvidia_cdi(claim_uid: str, result: dict) -> list[str]:
    """What NVIDIA's GPU driver prepares for a device without claim config: its standard CDI device,
    k8s.gpu.nvidia.com/device=<device> (cmd/gpu-kubelet-plugin/cdi.go, GetStandardDevice)."""
    return [f"k8s.{result['driver']}/device={result['device']}"]


@dataclass
class _ClaimInfo:
    """The DRA manager's cache entry for one claim: the pods that use it, and per driver the devices its
    NodePrepareResources answered (none until it has)."""

    uid: str
    namespace: str
    name: str
    pods: set[str]
    devices: dict[str, list[dict]]  # driver -> allocation results, in the driver's answer's order
    prepared: bool = False


@dataclass(frozen=True)
class CallRecord:
    """One RPC the kubelet made to a plugin (not ListAndWatch), with what came back, for assertions."""

    method: str  # GetDevicePluginOptions, GetPreferredAllocation, Allocate or PreStartContainer
    resource: str
    request: Message
    response: Message | None
    error: str | None
    started: float  # time.monotonic()
    finished: float


@dataclass(frozen=True)
class ContainerAdmission:
    """What one container got at admission: device ids and AllocateResponse per resource, or the error."""

    name: str
    devices: dict[str, tuple[str, ...]]
    responses: dict[str, Message]
    error: str | None = None


@dataclass(frozen=True)
class Admission:
    """The outcome of admitting a pod; a rejected pod is terminal, as the kubelet's UnexpectedAdmissionError."""

    uid: str
    admitted: bool
    reason: str
    message: str
    containers: tuple[ContainerAdmission, ...]

    def container(self, name: str) -> ContainerAdmission:
        """One container's outcome by name, since tests ask about containers, not positions."""
        return next(c for c in self.containers if c.name == name)


@dataclass
class _Allocation:
    """pod_devices' entry for (pod, container, resource): the ids by NUMA node, and the plugin's answer."""

    per_numa: dict[int, list[str]]
    response: Message

    def ids(self) -> set[str]:
        return {device for ids in self.per_numa.values() for device in ids}


class _Endpoint:
    """A registered plugin: the kubelet's client (connection, ListAndWatch) and endpoint (RPCs, stop time).
    One restored from the checkpoint has no connection and is stopped until its plugin registers again."""

    def __init__(self, resource: str, socket: Path | None) -> None:
        self.resource = resource
        self.socket = socket
        self.channel: grpc.Channel | None = None
        self.options: Message | None = None
        self.stopped = socket is None
        self.listed = False  # a ListAndWatch answer arrived on this endpoint's stream

    def dial(self, timeout: float) -> None:
        channel = grpc.insecure_channel(f"unix://{self.socket}")
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            channel.close()
            raise DeviceManagerError("failed to dial device plugin: context deadline exceeded") from None
        self.channel = channel

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


class KubeletStandIn:
    """The kubelet's device manager and pod-resources server on `root/device-plugins/kubelet.sock` and
    `root/pod-resources/kubelet.sock`. Use as a context manager, or call start() and stop()."""

    def __init__(self, root: Path, *, checkpoint: bool = True, numa_affinity: NumaAffinity | None = None,
                 seed: int = 0, dial_timeout: float = 10.0) -> None:
        self.root = root
        self.plugin_dir = root / "device-plugins"
        self.kubelet_socket = self.plugin_dir / dp.KUBELET_SOCKET
        self.pod_resources_socket = root / "pod-resources" / "kubelet.sock"
        self.checkpoint_file = self.plugin_dir / CHECKPOINT
        self._checkpoint = checkpoint
        self._numa_affinity = numa_affinity
        self._dial_timeout = dial_timeout
        self._rng = random.Random(seed)
        self._admit_lock = threading.Lock()  # the sync loop admits one pod at a time
        self._pods_lock = threading.Lock()  # the pod manager's
        self._active: dict[str, dict] = {}  # uid -> pod: the pod manager's
        self._awaiting: dict[str, dict] = {}  # the API server's pods a restarted kubelet has not been given yet
        self._clients_lock = threading.Lock()  # the registration server's
        self._log_lock = threading.Lock()
        self._checkpoint_lock = threading.Lock()
        self._log: list[CallRecord] = []
        self._mutex = threading.Lock()  # the device manager's
        self._servers: list[grpc.Server] = []
        self._sources_ready = True  # false from a restart until its pods are admitted again (`readmit`)
        self._streams: list[tuple[threading.Thread, _Endpoint]] = []  # every connected plugin, replaced or not
        self._dra_drivers: dict[str, CdiNames] = {}
        self._claim_infos: dict[tuple[str, str], _ClaimInfo] = {}  # (namespace, name): checkpointed, kept on restart
        self._reset()

    def _reset(self) -> None:
        """A fresh device manager, as a kubelet process starts with."""
        self._clients: dict[str, _Endpoint] = {}
        self._endpoints: dict[str, _Endpoint] = {}
        self._healthy: dict[str, set[str]] = {}
        self._unhealthy: dict[str, set[str]] = {}
        self._all: dict[str, dict[str, Message]] = {}
        self._allocated: dict[str, set[str]] = {}
        self._pod_devices: dict[str, dict[str, dict[str, _Allocation]]] = {}
        self._reuse: dict[str, dict[str, set[str]]] = {}

    # -- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> KubeletStandIn:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> KubeletStandIn:
        """Read the checkpoint, remove stale sockets from device-plugins/ (how plugins notice a new
        kubelet), then serve registration and pod-resources."""
        if self._servers:
            raise RuntimeError("already started")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.pod_resources_socket.parent.mkdir(parents=True, exist_ok=True)
        self._read_checkpoint()
        for path in self.plugin_dir.iterdir():
            if path != self.checkpoint_file and path.is_socket():
                path.unlink()
        self._serve(self.kubelet_socket, dp.REGISTRATION, {
            "Register": grpc.unary_unary_rpc_method_handler(
                self._register, request_deserializer=dp.RegisterRequest.FromString,
                response_serializer=dp.Empty.SerializeToString)})
        self.pod_resources_socket.unlink(missing_ok=True)
        self._serve(self.pod_resources_socket, pr.SERVICE, {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=pr.ListPodResourcesRequest.FromString,
                response_serializer=pr.ListPodResourcesResponse.SerializeToString),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                self._allocatable, request_deserializer=pr.AllocatableResourcesRequest.FromString,
                response_serializer=pr.AllocatableResourcesResponse.SerializeToString)})
        return self

    def _serve(self, socket: Path, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
        if server.add_insecure_port(f"unix://{socket}") == 0:
            raise RuntimeError(f"cannot listen on {socket}")
        server.start()
        self._servers.append(server)

    def stop(self) -> None:
        """Disconnect every plugin (their streams end) and stop serving; the sockets go, as Go's do."""
        with self._clients_lock:
            clients = list(self._clients.items())
        for resource, endpoint in clients:
            self._disconnect_client(resource, endpoint)
        for server in self._servers:
            server.stop(grace=None).wait(5)
        self._servers.clear()
        self.kubelet_socket.unlink(missing_ok=True)
        self.pod_resources_socket.unlink(missing_ok=True)
        for thread, endpoint in self._streams:  # replaced registrations still stream until the process ends
            endpoint.close()
            thread.join(5)
        self._streams.clear()

    def restart(self, lose_checkpoint: bool = False) -> None:
        """Stop, then start as a new kubelet process: state comes back only from the checkpoint, every
        plugin must register again, and the pods are not known (nor listed) until `readmit`, which makes the
        sources ready."""
        self.stop()
        if lose_checkpoint:
            self.checkpoint_file.unlink(missing_ok=True)
        with self._pods_lock:
            self._awaiting.update(self._active)
            self._active = {}
        with self._mutex:
            self._reset()
            self._sources_ready = False
        self.start()

    # -- registration (plugin/v1beta1/server.go, handler.go, client.go) ----------------------------------

    def _register(self, request: Message, context: grpc.ServicerContext) -> Message:
        if request.version != dp.VERSION:
            context.abort(grpc.StatusCode.UNKNOWN, f"requested API version {json.dumps(request.version)} is "
                          f"not supported by kubelet. Supported versions are [{json.dumps(dp.VERSION)}]")
        if not is_extended_resource_name(request.resource_name):
            context.abort(grpc.StatusCode.UNKNOWN, f"the ResourceName {json.dumps(request.resource_name)} is invalid")
        try:
            self._connect_client(request.resource_name, self.plugin_dir / request.endpoint)
        except DeviceManagerError as error:
            context.abort(grpc.StatusCode.UNKNOWN, str(error))
        return dp.Empty()

    def _connect_client(self, resource: str, socket: Path) -> None:
        """Register answers only after the dial and GetDevicePluginOptions; the options kept are that call's
        answer (not RegisterRequest.options). The newest registration always wins."""
        endpoint = _Endpoint(resource, socket)
        with self._clients_lock:
            self._clients[resource] = endpoint
        try:
            endpoint.dial(self._dial_timeout)
            try:
                endpoint.options = self._call(endpoint, "GetDevicePluginOptions", dp.GET_DEVICE_PLUGIN_OPTIONS,
                                              dp.Empty(), dp.DevicePluginOptions)
            except grpc.RpcError as error:
                raise DeviceManagerError(f"failed to get device plugin options: {_go_rpc_error(error)}") from None
        except DeviceManagerError:
            with self._clients_lock:
                self._clients.pop(resource, None)
            endpoint.close()
            raise
        with self._mutex:
            self._endpoints[resource] = endpoint
        thread = threading.Thread(target=self._run_client, args=(endpoint,), daemon=True,
                                  name=f"list-and-watch {resource}")
        self._streams.append((thread, endpoint))
        thread.start()

    def _run_client(self, endpoint: _Endpoint) -> None:
        """Follow ListAndWatch; when it ends, disconnect whichever client is registered for the resource now.
        That may be a newer registration than this stream's: the kubelet does exactly that."""
        assert endpoint.channel is not None
        stream = endpoint.channel.unary_stream(dp.LIST_AND_WATCH, request_serializer=dp.Empty.SerializeToString,
                                               response_deserializer=dp.ListAndWatchResponse.FromString)
        try:
            for response in stream(dp.Empty()):
                self._devices_listed(endpoint, response)
        except grpc.RpcError:
            pass
        with self._clients_lock:
            current = self._clients.get(endpoint.resource)
        if current is not None:
            self._disconnect_client(endpoint.resource, current)

    def _disconnect_client(self, resource: str, endpoint: _Endpoint) -> None:
        """The plugin is gone: every device of the resource becomes unhealthy and its endpoint stops."""
        with self._clients_lock:
            self._clients.pop(resource, None)
        endpoint.close()
        with self._mutex:
            current = self._endpoints.get(resource)
            if current is not None:
                self._healthy_to_unhealthy(resource)
                current.stopped = True

    def _healthy_to_unhealthy(self, resource: str) -> None:
        self._unhealthy[resource] = self._unhealthy.get(resource, set()) | self._healthy.get(resource, set())
        self._healthy[resource] = set()

    def _devices_listed(self, endpoint: _Endpoint, response: Message) -> None:
        """Each ListAndWatch answer replaces the resource's whole device list (from any of its streams)."""
        with self._mutex:
            self._all[endpoint.resource] = {device.ID: device for device in response.devices}
            self._healthy[endpoint.resource] = {d.ID for d in response.devices if d.health == dp.HEALTHY}
            self._unhealthy[endpoint.resource] = {d.ID for d in response.devices if d.health != dp.HEALTHY}
            endpoint.listed = True
        self._write_checkpoint()

    def _call(self, endpoint: _Endpoint, method: str, path: str, request: Message, answer: type) -> Message:
        """One unary RPC to a plugin, logged. A stopped endpoint refuses, as the kubelet's does."""
        if endpoint.stopped or endpoint.channel is None:
            raise DeviceManagerError(f"endpoint {endpoint.resource} has been stopped")
        started = time.monotonic()
        try:
            response = endpoint.channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                                    response_deserializer=answer.FromString)(request)
        except grpc.RpcError as error:
            self._record(CallRecord(method, endpoint.resource, request, None, _go_rpc_error(error),
                                    started, time.monotonic()))
            raise
        self._record(CallRecord(method, endpoint.resource, request, response, None, started, time.monotonic()))
        return response

    def _record(self, record: CallRecord) -> None:
        with self._log_lock:
            self._log.append(record)

    # -- checkpoint ------------------------------------------------------------------------------------

    def _write_checkpoint(self) -> None:
        """Allocations and registered resource names, rewritten after each allocation and device list.
        Same content as the kubelet's file, not its byte format (no checksum)."""
        if not self._checkpoint:
            return
        with self._mutex:
            entries = [{"PodUID": uid, "ContainerName": container, "ResourceName": resource,
                        "DeviceIDs": {str(numa): ids for numa, ids in allocation.per_numa.items()},
                        "AllocResp": base64.b64encode(allocation.response.SerializeToString()).decode()}
                       for uid, containers in self._pod_devices.items()
                       for container, resources in containers.items()
                       for resource, allocation in resources.items()]
            registered = {resource: sorted(ids) for resource, ids in self._healthy.items()}
        data = json.dumps({"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}})
        with self._checkpoint_lock:
            temporary = self.checkpoint_file.with_suffix(".tmp")
            temporary.write_text(data)
            os.replace(temporary, self.checkpoint_file)

    def _read_checkpoint(self) -> None:
        """Allocations come back; each registered resource gets empty device sets and a stopped endpoint, so
        capacity is zero and allocation fails until its plugin registers again."""
        if not self._checkpoint or not self.checkpoint_file.exists():
            return
        data = json.loads(self.checkpoint_file.read_text())["Data"]
        with self._mutex:
            for entry in data["PodDeviceEntries"]:
                response = dp.ContainerAllocateResponse.FromString(base64.b64decode(entry["AllocResp"]))
                per_numa = {int(numa): list(ids) for numa, ids in entry["DeviceIDs"].items()}
                self._pod_devices.setdefault(entry["PodUID"], {}).setdefault(entry["ContainerName"], {})[
                    entry["ResourceName"]] = _Allocation(per_numa, response)
            self._allocated = self._pod_devices_union()
            for resource in data["RegisteredDevices"]:
                self._healthy[resource] = set()
                self._unhealthy[resource] = set()
                self._endpoints[resource] = _Endpoint(resource, None)

    # -- admission (manager.go Allocate, allocateContainerResources, devicesToAllocate) -----------------

    def admit(self, pod: dict) -> Admission:
        """Admit a pod as the kubelet's sync loop does: the pod is active first (so pod-resources lists it
        during allocation), then each init container and each app container is allocated in spec order.
        The first error rejects the pod: it leaves the active pods and what it held is freed."""
        _validate(pod)
        uid = pod["metadata"]["uid"]
        with self._admit_lock:
            with self._pods_lock:
                if uid in self._active:
                    raise ValueError(f"pod {uid} is already active")
                self._active[uid] = pod
            return self._admit(pod, frozenset())

    def readmit(self, running: Mapping[str, Collection[str]]) -> list[Admission]:
        """What a restarted kubelet does when its first pod list arrives, before its sources are ready: admits
        each pod it had again, in the order they came. A container in `running` (pod UID -> names the runtime
        reports running) keeps what the checkpoint recorded without any check; any other needs its resource
        registered with healthy devices (devicemanager `devicesToAllocate`), so a pod still starting is rejected
        when its plugin has not registered again yet. Then the sources are ready."""
        with self._admit_lock:
            with self._pods_lock:
                pods = list(self._awaiting.values())
                self._awaiting = {}
                self._active.update((pod["metadata"]["uid"], pod) for pod in pods)
            admissions = [self._admit(pod, frozenset(running.get(pod["metadata"]["uid"], ()))) for pod in pods]
            with self._mutex:
                self._sources_ready = True
        self._update_allocated_devices()
        return admissions

    def _admit(self, pod: dict, running: frozenset[str]) -> Admission:
        """Allocate an active pod's containers in order; the first error rejects it (it leaves the active pods)."""
        uid = pod["metadata"]["uid"]
        done: list[ContainerAdmission] = []
        for container in pod_containers(pod):
            try:
                self._allocate(pod, container, container["name"] in running)
            except DeviceManagerError as error:
                done.append(self._container_admission(uid, container["name"], str(error)))
                with self._pods_lock:
                    del self._active[uid]
                self._update_allocated_devices()
                return Admission(uid, False, UNEXPECTED_ADMISSION_ERROR,
                                 f"Allocate failed due to {error}, which is unexpected", tuple(done))
            done.append(self._container_admission(uid, container["name"]))
        return Admission(uid, True, "", "", tuple(done))

    def _container_admission(self, uid: str, name: str, error: str | None = None) -> ContainerAdmission:
        with self._mutex:
            resources = self._pod_devices.get(uid, {}).get(name, {})
            return ContainerAdmission(name, {r: tuple(sorted(a.ids())) for r, a in resources.items()},
                                      {r: a.response for r, a in resources.items()}, error)

    def _allocate(self, pod: dict, container: dict, running: bool = False) -> None:
        """The device manager's Allocate for one container, with the pod's pool of init-container devices:
        a plain init container adds to the pool, a sidecar or an app container takes from it. `running`: the
        runtime reports the container running."""
        uid = pod["metadata"]["uid"]
        with self._mutex:
            reuse = self._reuse.setdefault(uid, {})
            for other in [u for u in self._reuse if u != uid]:
                del self._reuse[other]
        self._allocate_container_resources(pod, container, reuse, running)
        init = next((c for c in pod["spec"].get("initContainers", []) if c["name"] == container["name"]), None)
        keep = init is not None and init.get("restartPolicy") != "Always"
        with self._mutex:
            for resource, allocation in self._pod_devices.get(uid, {}).get(container["name"], {}).items():
                pool = reuse.get(resource, set())
                reuse[resource] = pool | allocation.ids() if keep else pool - allocation.ids()

    def _allocate_container_resources(self, pod: dict, container: dict, reuse: dict[str, set[str]],
                                      running: bool) -> None:
        uid, name = pod["metadata"]["uid"], container["name"]
        updated = written = False
        for resource, needed in self._limits(container):
            if not self._is_device_plugin_resource(resource):
                continue
            if not updated:
                self._update_allocated_devices()
                updated = True
            chosen = self._devices_to_allocate(pod, name, resource, needed, reuse.get(resource, set()), running)
            if not chosen:
                continue
            written = True
            with self._mutex:
                endpoint = self._endpoints.get(resource)
            if endpoint is None:
                self._rollback()
                raise DeviceManagerError(f"unknown Device Plugin {resource}")
            request = dp.AllocateRequest(container_requests=[
                dp.ContainerAllocateRequest(devices_ids=self._unsorted(chosen))])
            try:
                response = self._call(endpoint, "Allocate", dp.ALLOCATE, request, dp.AllocateResponse)
            except grpc.RpcError as error:
                self._rollback()
                raise DeviceManagerError(_go_rpc_error(error)) from None
            except DeviceManagerError:
                self._rollback()
                raise
            if not response.container_responses:
                raise DeviceManagerError(f"no containers return in allocation response {response}")
            with self._mutex:
                self._pod_devices.setdefault(uid, {}).setdefault(name, {})[resource] = _Allocation(
                    self._per_numa(resource, chosen), response.container_responses[0])
        if written:
            self._write_checkpoint()

    def _rollback(self) -> None:
        """After a failed Allocate the in-use set is rebuilt from the recorded allocations."""
        with self._mutex:
            self._allocated = self._pod_devices_union()

    def _devices_to_allocate(self, pod: dict, name: str, resource: str, required: int,
                             reusable: set[str], running: bool) -> set[str] | None:
        """Which devices a container gets for one resource: already recorded ones count, then the reuse pool,
        then (with a NUMA hint) aligned devices, the plugin's preference, and the rest in arbitrary order. A
        container running before the sources are ready (a kubelet restart) is left as it is, unchecked.
        Holds the device manager lock except while GetPreferredAllocation is in flight."""
        uid = pod["metadata"]["uid"]
        self._mutex.acquire()
        try:
            needed = required
            recorded = self._pod_devices.get(uid, {}).get(name, {}).get(resource)
            if recorded is not None:
                needed -= len(recorded.ids())
                if needed != 0:
                    raise DeviceManagerError(f"pod {json.dumps(uid)} container {json.dumps(name)} changed request "
                                             f"for resource {json.dumps(resource)} from {len(recorded.ids())} "
                                             f"to {required}")
            if running and not self._sources_ready:
                return None
            healthy = self._healthy.get(resource)
            if healthy is None:
                raise DeviceManagerError(f"cannot allocate unregistered device {resource}")
            if not healthy:
                raise DeviceManagerError(f"no healthy devices present; cannot allocate unhealthy devices {resource}")
            if recorded is not None and not recorded.ids() <= healthy:
                raise DeviceManagerError("previously allocated devices are no longer healthy; "
                                         f"cannot allocate unhealthy devices {resource}")
            if needed == 0:
                return None
            allocated: set[str] = set()

            def take(source: set[str]) -> bool:
                """Allocate from `source` until enough; the in-use set may have been rebuilt meanwhile."""
                nonlocal needed
                in_use = self._allocated.setdefault(resource, set())
                for device in self._unsorted(source - allocated):
                    in_use.add(device)
                    allocated.add(device)
                    needed -= 1
                    if needed == 0:
                        return True
                return False

            if take(reusable):
                return allocated
            available = self._healthy[resource] - self._allocated.get(resource, set())
            if len(available) < needed:
                raise DeviceManagerError(f"requested number of devices unavailable for {resource}. "
                                         f"Requested: {needed}, Available: {len(available)}")
            aligned, unaligned, no_affinity = self._filter_by_affinity(pod, name, resource, available)
            short = f"unexpectedly allocated less resources than required. Requested: {required}, Got: "
            if needed < len(aligned):
                preferred = self._preferred(resource, aligned | allocated, allocated, required)
                if take(preferred & aligned) or take(aligned):
                    return allocated
                raise DeviceManagerError(f"{short}{required - needed}")
            if take(aligned):
                return allocated
            preferred = self._preferred(resource, available | allocated, allocated, required)
            if take(preferred & available) or take(unaligned) or take(no_affinity):
                return allocated
            raise DeviceManagerError(f"{short}{required - needed}")
        finally:
            self._mutex.release()

    def _preferred(self, resource: str, available: set[str], must_include: set[str], size: int) -> set[str]:
        """GetPreferredAllocation if the plugin offers it, with the device manager lock released meanwhile
        (called with it held). An RPC error fails the allocation."""
        endpoint = self._endpoints.get(resource)
        if endpoint is None:
            raise DeviceManagerError(f"endpoint not found in cache for a registered resource: {resource}")
        if endpoint.options is None or not endpoint.options.get_preferred_allocation_available:
            return set()
        request = dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
            available_deviceIDs=self._unsorted(available), must_include_deviceIDs=self._unsorted(must_include),
            allocation_size=size)])
        self._mutex.release()
        try:
            response = self._call(endpoint, "GetPreferredAllocation", dp.GET_PREFERRED_ALLOCATION, request,
                                  dp.PreferredAllocationResponse)
        except grpc.RpcError as error:
            raise DeviceManagerError(f"device plugin GetPreferredAllocation rpc failed with err: "
                                     f"{_go_rpc_error(error)}") from None
        finally:
            self._mutex.acquire()
        if not response.container_responses:
            return set()
        return set(response.container_responses[0].deviceIDs)

    def _filter_by_affinity(self, pod: dict, name: str, resource: str,
                            available: set[str]) -> tuple[set[str], set[str], set[str]]:
        """Split available devices by the Topology Manager's hint: on a hinted NUMA node, on another node,
        without topology. No hint, or no device of the resource reporting topology, means no alignment."""
        hint = self._numa_affinity(pod, name) if self._numa_affinity is not None else None
        if hint is None or not any(self._nodes(resource, d) for d in self._all.get(resource, {})):
            return set(), set(), set(available)
        nodes = {d: self._nodes(resource, d) for d in available}
        aligned = {d for d, n in nodes.items() if n & hint}
        return aligned, {d for d, n in nodes.items() if n and not n & hint}, {d for d, n in nodes.items() if not n}

    def _nodes(self, resource: str, device: str) -> set[int]:
        known = self._all.get(resource, {}).get(device)
        return {node.ID for node in known.topology.nodes} if known is not None else set()

    def _per_numa(self, resource: str, devices: set[str]) -> dict[int, list[str]]:
        per_numa: dict[int, list[str]] = {}
        for device in sorted(devices):
            for node in self._nodes(resource, device) or {NO_TOPOLOGY}:
                per_numa.setdefault(node, []).append(device)
        return per_numa

    def _update_allocated_devices(self) -> None:
        """Forget the allocations of pods no longer active and rebuild the in-use set from the rest. Only
        when some pod went: a rebuild drops devices chosen for an allocation in flight (kubelet #137534);
        and only once the sources are ready, since until then a pod missing may just not be listed yet."""
        with self._pods_lock:
            active = set(self._active)
        with self._mutex:
            gone = set(self._pod_devices) - active
            if not gone or not self._sources_ready:
                return
            for uid in gone:
                del self._pod_devices[uid]
            self._allocated = self._pod_devices_union()

    def _pod_devices_union(self) -> dict[str, set[str]]:
        union: dict[str, set[str]] = {}
        for containers in self._pod_devices.values():
            for resources in containers.values():
                for resource, allocation in resources.items():
                    union.setdefault(resource, set()).update(allocation.ids())
        return union

    def _is_device_plugin_resource(self, resource: str) -> bool:
        """Registered now or allocated before; any other extended resource is not the device manager's
        (the kubelet's admission then ignores it: it may belong to a scheduler extender)."""
        with self._mutex:
            return resource in self._healthy or resource in self._allocated

    def _limits(self, container: dict) -> list[tuple[str, int]]:
        limits = container.get("resources", {}).get("limits", {})
        return [(resource, int(str(limits[resource]))) for resource in self._unsorted(set(limits))]

    def _unsorted(self, items: Iterable[str]) -> list[str]:
        """A Go map's order: arbitrary, here reproducible per seed."""
        ordered = sorted(items)
        self._rng.shuffle(ordered)
        return ordered

    # -- pods ------------------------------------------------------------------------------------------

    def remove(self, uid: str) -> None:
        """The pod terminated: it leaves the active pods and its devices are freed (once the sources are ready); its
        claims are unprepared, and a claim no other pod uses leaves the DRA manager's cache."""
        with self._pods_lock:
            self._active.pop(uid, None)
            self._awaiting.pop(uid, None)
        self._update_allocated_devices()
        with self._mutex:
            for key, info in list(self._claim_infos.items()):
                info.pods.discard(uid)
                if not info.pods:
                    del self._claim_infos[key]

    # -- DRA (cm/dra/manager.go prepareResources, GetContainerClaimInfos; container_manager_linux.go) ---------

    def register_dra_driver(self, driver: str, cdi: CdiNames = nvidia_cdi) -> None:
        """A DRA driver's kubelet plugin registered; `cdi` names the CDI devices its NodePrepareResources gives."""
        with self._mutex:
            self._dra_drivers[driver] = cdi

    def prepare(self, uid: str, claims: Iterable[dict], *, answered: bool = True) -> None:
        """PrepareResources for an active pod, as its sync runs it before the containers start, with `claims` as the
        API server has them. Every claim of the pod (and of its extended resources) is checked first, and on an error
        nothing changes; then each claim's info is cached with the pod, and each driver's NodePrepareResources answers
        its devices. `answered=False` stops before those answers: List then shows the claims without devices."""
        with self._pods_lock:
            pod = self._active[uid]
        namespace = pod["metadata"]["namespace"]
        by_name = {claim["metadata"]["name"]: claim for claim in claims
                   if claim["metadata"].get("namespace") == namespace}
        checked = []
        for pod_claim in _pod_claims(pod):
            name, must_check_owner = _claim_name(pod, pod_claim)
            if name is None:
                continue
            claim = by_name.get(name)
            if claim is None:
                raise DraManagerError(f'fetch ResourceClaim {name}: resourceclaims.resource.k8s.io "{name}" not found')
            if must_check_owner and not any(owner.get("uid") == uid and owner.get("controller")
                                            for owner in claim["metadata"].get("ownerReferences", [])):
                raise DraManagerError(f"ResourceClaim {namespace}/{name} was not created for Pod "
                                      f"{namespace}/{pod['metadata']['name']} (Pod is not owner)")
            status = claim.get("status") or {}
            if not any(reserved.get("uid") == uid for reserved in status.get("reservedFor", [])):
                raise DraManagerError(f"pod {pod['metadata']['name']} ({uid}) is not allowed to use ResourceClaim "
                                      f"{name} ({claim['metadata']['uid']})")
            if status.get("allocation") is None:
                raise DraManagerError(f"ResourceClaim {name}: not allocated")
            results = status["allocation"]["devices"]["results"]
            with self._mutex:
                missing = [result["driver"] for result in results if result["driver"] not in self._dra_drivers]
            if missing:
                raise DraManagerError(f"DRA driver {missing[0]} is not registered")
            checked.append((claim, results))
        with self._mutex:
            for claim, results in checked:
                key = (namespace, claim["metadata"]["name"])
                info = self._claim_infos.get(key)
                if info is not None and info.uid != claim["metadata"]["uid"]:
                    raise DraManagerError(f"old ResourceClaim with same name {key[1]} and different UID {info.uid} "
                                          "still exists (previous pod force-deleted?!)")
                if info is None:
                    info = self._claim_infos[key] = _ClaimInfo(claim["metadata"]["uid"], namespace, key[1], set(),
                                                               {result["driver"]: [] for result in results})
                info.pods.add(uid)
                if answered and not info.prepared:
                    for result in results:
                        info.devices[result["driver"]].append(result)
                    info.prepared = True

    def _dynamic_resources(self, pod: dict, container: dict) -> list[Message]:
        """GetDynamicResources: the claims of the pod the container uses, and its extended resources' claim. A claim
        the cache lacks makes it list none at all (the kubelet logs the error)."""
        used = {claim["name"] for claim in container.get("resources", {}).get("claims", [])}
        names: list[str] = []
        for pod_claim in pod["spec"].get("resourceClaims", []):
            if pod_claim["name"] not in used:
                continue
            try:
                name = _claim_name(pod, pod_claim)[0]
            except DraManagerError:
                return []
            if name is not None:
                names.append(name)
        extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
        if extended and any(mapping["containerName"] == container["name"] for mapping in extended["requestMappings"]):
            names.append(extended["resourceClaimName"])
        infos = [self._claim_infos.get((pod["metadata"]["namespace"], name)) for name in names]
        if None in infos:
            return []
        return [pr.DynamicResource(claim_name=info.name, claim_namespace=info.namespace,
                                   claim_resources=self._claim_resources(info)) for info in infos if info is not None]

    def _claim_resources(self, info: _ClaimInfo) -> list[Message]:
        """Drivers in a Go map's order, each driver's devices as it answered. As v1.36 builds them, one CDI list per
        driver grows device by device, so each device also carries the CDI devices of the driver's ones before it."""
        resources = []
        for driver in self._unsorted(info.devices):
            cdi: list[Message] = []
            for result in info.devices[driver]:
                cdi = cdi + [pr.CDIDevice(name=name) for name in self._dra_drivers[driver](info.uid, result)]
                resources.append(pr.ClaimResource(cdi_devices=cdi, driver_name=driver, pool_name=result["pool"],
                                                  device_name=result["device"], share_id=result.get("shareID")))
        return resources

    def start_container(self, uid: str, container: str) -> dict[str, Message]:
        """GetDeviceRunContainerOptions when the runtime starts a container of an active pod: PreStartContainer
        where the plugin asks for it, and a fresh Allocate (preference included) for a resource with no
        recorded devices, as after a lost checkpoint. Returns the AllocateResponse per resource."""
        with self._pods_lock:
            pod = self._active[uid]
        spec = next(c for c in pod_containers(pod) if c["name"] == container)
        reallocate = False
        for resource, quantity in self._limits(spec):
            if quantity == 0 or not self._is_device_plugin_resource(resource):
                continue
            self._pre_start_if_needed(uid, container, resource)
            with self._mutex:
                if resource not in self._pod_devices.get(uid, {}).get(container, {}):
                    reallocate = True
        if reallocate:
            self._allocate(pod, spec)
        with self._mutex:
            return {r: a.response for r, a in self._pod_devices.get(uid, {}).get(container, {}).items()}

    def _pre_start_if_needed(self, uid: str, container: str, resource: str) -> None:
        with self._mutex:
            endpoint = self._endpoints.get(resource)
            if endpoint is None:
                raise DeviceManagerError(f"endpoint not found in cache for a registered resource: {resource}")
            if endpoint.options is None or not endpoint.options.pre_start_required:
                return
            allocation = self._pod_devices.get(uid, {}).get(container, {}).get(resource)
            if allocation is None:
                raise DeviceManagerError(f"no devices found allocated in local cache for pod {uid}, "
                                         f"container {container}, resource {resource}")
            request = dp.PreStartContainerRequest(devices_ids=self._unsorted(allocation.ids()))
        try:
            self._call(endpoint, "PreStartContainer", dp.PRE_START_CONTAINER, request, dp.PreStartContainerResponse)
        except grpc.RpcError as error:
            raise DeviceManagerError(f"device plugin PreStartContainer rpc failed with err: "
                                     f"{_go_rpc_error(error)}") from None

    # -- pod-resources v1 (server_v1.go) ---------------------------------------------------------------

    def _list(self, request: Message, context: grpc.ServicerContext) -> Message:
        """Active pods (one being admitted included), each with its sidecars and app containers."""
        with self._pods_lock:
            pods = list(self._active.values())
        self._update_allocated_devices()
        with self._mutex:
            answer = [pr.PodResources(name=pod["metadata"]["name"], namespace=pod["metadata"]["namespace"],
                                      containers=[pr.ContainerResources(
                                          name=c["name"], devices=self._container_devices(pod, c["name"]),
                                          dynamic_resources=self._dynamic_resources(pod, c))
                                          for c in [*(i for i in pod["spec"].get("initContainers", [])
                                                      if i.get("restartPolicy") == "Always"),
                                                    *pod["spec"].get("containers", [])]])
                      for pod in pods]
            self._rng.shuffle(answer)
        return pr.ListPodResourcesResponse(pod_resources=answer)

    def _container_devices(self, pod: dict, name: str) -> list[Message]:
        nodes: dict[str, dict[str, set[int]]] = {}
        for resource, allocation in self._pod_devices.get(pod["metadata"]["uid"], {}).get(name, {}).items():
            for numa, ids in allocation.per_numa.items():
                for device in ids:
                    nodes.setdefault(resource, {}).setdefault(device, set()).update({numa} - {NO_TOPOLOGY})
        return self._wire_devices(nodes)

    def _allocatable(self, request: Message, context: grpc.ServicerContext) -> Message:
        """Every healthy device the plugins listed, with its NUMA nodes."""
        with self._mutex:
            devices = self._wire_devices({resource: {d: self._nodes(resource, d) for d in devices
                                                     if d in self._healthy.get(resource, set())}
                                          for resource, devices in self._all.items()})
        return pr.AllocatableResourcesResponse(devices=devices)

    def _wire_devices(self, nodes: dict[str, dict[str, set[int]]]) -> list[Message]:
        """One entry per device and NUMA node, or one without topology; in arbitrary order."""
        entries = [pr.ContainerDevices(resource_name=resource, device_ids=[device],
                                       topology=pr.TopologyInfo(nodes=[pr.NUMANode(ID=node)]))
                   if node is not None else pr.ContainerDevices(resource_name=resource, device_ids=[device])
                   for resource, devices in sorted(nodes.items()) for device, numa in sorted(devices.items())
                   for node in (sorted(numa) or [None])]
        self._rng.shuffle(entries)
        return entries

    # -- test helpers ----------------------------------------------------------------------------------

    def wait_for(self, condition: Callable[[], bool], timeout: float = 5.0) -> None:
        """Poll until `condition()` holds; the plugin side is asynchronous."""
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached")
            time.sleep(0.01)

    def wait_registered(self, resource: str, timeout: float = 5.0) -> None:
        """Until the resource has a live endpoint whose ListAndWatch has answered."""
        def registered() -> bool:
            with self._mutex:
                endpoint = self._endpoints.get(resource)
                return endpoint is not None and not endpoint.stopped and endpoint.listed
        self.wait_for(registered, timeout)

    def healthy(self, resource: str) -> frozenset[str]:
        with self._mutex:
            return frozenset(self._healthy.get(resource, ()))

    def unhealthy(self, resource: str) -> frozenset[str]:
        with self._mutex:
            return frozenset(self._unhealthy.get(resource, ()))

    def in_use(self, resource: str) -> frozenset[str]:
        """The device manager's in-use set (what it will not hand out), which can differ from the union of
        recorded allocations exactly where the kubelet's does."""
        with self._mutex:
            return frozenset(self._allocated.get(resource, ()))

    def devices(self, uid: str) -> dict[str, tuple[str, ...]]:
        """Recorded device ids per container of a pod, all resources together."""
        with self._mutex:
            return {name: tuple(sorted(set().union(*(a.ids() for a in resources.values()))))
                    for name, resources in self._pod_devices.get(uid, {}).items()}

    def calls(self, method: str | None = None) -> list[CallRecord]:
        with self._log_lock:
            return [record for record in self._log if method is None or record.method == method]


def pod_containers(pod: dict) -> list[dict]:
    """Init containers, then app containers: the kubelet's allocation order."""
    spec = pod["spec"]
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def _pod_claims(pod: dict) -> list[dict]:
    """The pod's claims, and its extended resources' claim (DRAExtendedResource) as one more."""
    extended = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    return [*pod["spec"].get("resourceClaims", []),
            *([{"name": "", "resourceClaimName": extended["resourceClaimName"]}] if extended else [])]


def _claim_name(pod: dict, pod_claim: dict) -> tuple[str | None, bool]:
    """resourceclaim.Name: the claim's name (None: no claim is needed), and whether the pod must own it."""
    metadata = pod["metadata"]
    if pod_claim.get("resourceClaimName") is not None:
        return pod_claim["resourceClaimName"], False
    if pod_claim.get("resourceClaimTemplateName") is not None:
        for status in (pod.get("status") or {}).get("resourceClaimStatuses", []):
            if status["name"] == pod_claim["name"]:
                return status.get("resourceClaimName"), True
        raise DraManagerError(f'pod "{metadata["namespace"]}/{metadata["name"]}": ResourceClaim not created yet')
    raise DraManagerError(f'pod "{metadata["namespace"]}/{metadata["name"]}", spec.resourceClaim '
                          f'"{pod_claim["name"]}": none of the supported fields are set')


def _validate(pod: dict) -> None:
    """What the API server would refuse: extended resources must have requests equal to limits."""
    for container in pod_containers(pod):
        resources = container.get("resources", {})
        limits, requests = resources.get("limits", {}), resources.get("requests", {})
        for resource, quantity in requests.items():
            if "/" in resource and "kubernetes.io/" not in resource and str(limits.get(resource)) != str(quantity):
                raise ValueError(f"container {container['name']}: {resource} request must equal its limit")
