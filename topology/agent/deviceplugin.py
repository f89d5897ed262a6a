"""The kubelet device plugin API v1beta1 for this node's GPUs: the gRPC edge of "scheduling plus delivery".

The agent serves `v1beta1.DevicePlugin` on <device-plugins dir>/<socket> and registers it for the GPU
resource on the kubelet's `kubelet.sock`, so the kubelet allocates exactly the GPUs the extender bound:

- ListAndWatch: one device per GPU, its id the GPU's UUID (`GPU<index>` for a topology without UUIDs),
  Healthy or Unhealthy from the reporter's NVML round (`SharedHealth`: one check, one answer for both); a new
  list goes out only when a GPU's health changes. No TopologyInfo unless `numa_topology` (README: why).
- GetPreferredAllocation: the asking container's planned GPUs (`claims.identify`). It never fails: any
  trouble ends in our best set, because an error is an admission failure, final for the pod.
- Allocate: the ids the kubelet chose, checked (an id that is no GPU of this node is an error: the container
  cannot get a device we do not have) and attributed; other ids than planned are delivered, logged and
  counted. The answer's form is `allocate.Delivery`'s.

The kubelet deletes every socket in its device-plugins directory when it starts, so `run` looks for our
socket vanishing or `kubelet.sock` being recreated whenever the directory changes (inotify, `dir_watch.py`)
and at least every `poll` seconds, then serves again and registers again, with jittered backoff on failures.
Every input is bounded: message size, container requests per call, ids per request, id length.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import grpc

from topology.agent import deviceplugin_v1beta1 as api
from topology.agent.allocate import ContainerAnswer, Delivery
from topology.agent.dir_watch import DirectoryWatch
from topology.annotations import AnnotationKeys
from topology.backoff import Backoff
from topology.model import Topology
from topology.select import Selector
from topology.agent.claims import (
    MAX_IDS,
    Allocation,
    Board,
    Decision,
    Delivered,
    Listed,
    Outcome,
    PodOnNode,
    Preferred,
    identify,
    read_pod,
    remember,
)
from topology.agent.reporter import DEFAULT_RESOURCE, HealthSource

log = logging.getLogger("gpu-topology-agent.deviceplugin")

DEFAULT_PLUGIN_DIR = api.DEVICE_PLUGIN_PATH
DEFAULT_SOCKET_NAME = "gpu-topology.sock"
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
MAX_CONTAINER_REQUESTS = 16  # the kubelet sends one per call
MAX_MESSAGE_BYTES = 1024 * 1024
_MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes with the final NUL
_WORKERS = 8  # one is held by the kubelet's ListAndWatch stream
_REGISTER_TIMEOUT = 10.0  # the kubelet answers Register after dialling us and asking our options
_CDI_SPEC_FILES = 64
_CDI_SPEC_BYTES = 4 * 1024 * 1024


_OUTCOMES = {Outcome.PLANNED: "as planned", Outcome.ADJUSTED: "not as planned", Outcome.FOREIGN: "our best set",
             Outcome.BLIND: "our best set, blind", Outcome.REFUSED: "refused"}


class PodSource(Protocol):
    """The pods bound to this node, as the API serves them (`pods.NodePods`); raises on any failure."""

    def pods(self) -> list[dict[str, Any]]: ...


class ListingSource(Protocol):
    """pod-resources List per pod and container (`podresources.PodResourcesClient`); raises on any failure."""

    def listed(self, resource: str, timeout: float | None = None) -> Listed: ...


class PluginError(Exception):
    """Serving or registering failed; retried with backoff."""


class _Refused(Exception):
    """An Allocate that cannot be answered: the kubelet gets INVALID_ARGUMENT with this message."""


class DevicePlugin:
    """This node's GPUs as the kubelet's device plugin. `run(stop)` serves, registers and watches until
    `stop` is set; `update_health` feeds ListAndWatch; `stats` counts what it answered."""

    def __init__(self, topology: Topology, listing: ListingSource, pods: PodSource | None, *,
                 keys: AnnotationKeys | None = None, resource: str = DEFAULT_RESOURCE,
                 plugin_dir: str = DEFAULT_PLUGIN_DIR, socket_name: str = DEFAULT_SOCKET_NAME,
                 delivery: Delivery | None = None, numa_topology: bool = False, selector: Selector | None = None,
                 timeout: float = 2.0, poll: float = 1.0, backoff: Backoff | None = None,
                 cdi_spec_dirs: Sequence[str] = CDI_SPEC_DIRS) -> None:
        if os.sep in socket_name or not socket_name:
            raise ValueError(f"the socket name {socket_name!r} must be a file name inside the device-plugins dir")
        self.socket_path = os.path.join(plugin_dir, socket_name)
        self.kubelet_socket = os.path.join(plugin_dir, api.KUBELET_SOCKET)
        for path in (self.socket_path, self.kubelet_socket):
            if len(os.fsencode(os.path.abspath(path))) > _MAX_SOCKET_PATH:
                raise ValueError(f"the socket path {path} is longer than a unix socket allows")
        self.topology = topology
        self.board = Board(topology, selector)
        self.keys = keys or AnnotationKeys()
        self.resource = resource
        self.socket_name = socket_name
        self.delivery = delivery or Delivery()
        self.numa_topology = numa_topology
        self.timeout, self.poll = timeout, poll
        self.backoff = backoff or Backoff(initial=1.0, maximum=30.0)
        self.cdi_spec_dirs = tuple(cdi_spec_dirs)
        self.stats: Counter[str] = Counter()
        self._listing, self._pods = listing, pods
        self._lock = threading.Lock()  # the delivered record and the stats
        self._delivered: Delivered = {}
        self._changed = threading.Condition()
        self._health: dict[str, str] = {}  # GPU id -> why it is unhealthy
        self._version = 0  # grows on each change of the device list
        self._generation = 0  # grows each time a server stops: its ListAndWatch streams end
        self._server: grpc.Server | None = None
        self._socket_identity: tuple[int, int] | None = None
        self._registered_with: tuple[int, int] | None = None
        self._said: dict[str, str | None] = {}

    # -- health ------------------------------------------------------------------------------------------

    def update_health(self, reasons: Mapping[str, str]) -> None:
        """The reporter's NVML result of this round (GPU id -> why it is unhealthy)."""
        health = {gpu: reasons[gpu] for gpu in self.board.ids if gpu in reasons}
        with self._changed:
            if health == self._health:
                return
            for gpu in self.board.ids:
                if (gpu in health) != (gpu in self._health):
                    log.warning("GPU %s is now %s", gpu, f"Unhealthy: {health[gpu]}" if gpu in health else "Healthy")
            self._health = health
            self._version += 1
            self._changed.notify_all()

    def devices(self) -> list[Any]:
        """ListAndWatch's devices now."""
        with self._changed:
            unhealthy = set(self._health)
        devices = []
        for gpu, gpu_id in zip(self.topology.gpus, self.board.ids, strict=True):
            device = api.Device(ID=gpu_id, health=api.UNHEALTHY if gpu_id in unhealthy else api.HEALTHY)
            if self.numa_topology and gpu.numa_node is not None:
                device.topology.nodes.append(api.NUMANode(ID=gpu.numa_node))
            devices.append(device)
        return devices

    # -- serving, registering, watching ------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serve and stay registered until `stop` is set; failures are retried with backoff, never raised."""
        self._check_cdi()
        watch = DirectoryWatch(os.path.dirname(self.socket_path))
        try:
            while not stop.is_set():
                delay = self.poll
                try:
                    self._serve()
                    self._register()
                except (PluginError, OSError) as error:
                    self._say("plugin", str(error), logging.WARNING, f"{error}; retrying with backoff")
                    delay = self.backoff.next()
                else:
                    self.backoff.reset()
                    self._say("plugin", None, logging.INFO, "device plugin serving and registered again")
                watch.wait(delay, stop)
        finally:
            watch.close()
            self.close()

    def close(self) -> None:
        """Stop serving and remove our socket; the kubelet then marks our devices unavailable."""
        self._stop_server()
        self._registered_with = None

    def register(self) -> None:
        """One Register call on the kubelet's socket; PluginError when it fails."""
        channel = grpc.insecure_channel("unix://" + os.path.abspath(self.kubelet_socket),
                                        options=[("grpc.enable_retries", 0)])
        try:
            call = channel.unary_unary(api.REGISTER, request_serializer=api.RegisterRequest.SerializeToString,
                                       response_deserializer=api.Empty.FromString)
            call(api.RegisterRequest(version=api.VERSION, endpoint=self.socket_name, resource_name=self.resource,
                                     options=self._options()), timeout=_REGISTER_TIMEOUT)
        except grpc.RpcError as error:
            code = error.code().name if hasattr(error, "code") else "error"
            details = error.details() if hasattr(error, "details") else str(error)
            raise PluginError(f"registering {self.resource} with the kubelet on {self.kubelet_socket} failed: "
                              f"{code}: {' '.join((details or '').split())[:300]}") from None
        finally:
            channel.close()

    def _serve(self) -> None:
        if self._server is not None and _identity(self.socket_path) == self._socket_identity:
            return
        if self._server is not None:
            log.warning("our socket %s is gone (the kubelet restarted?): serving again", self.socket_path)
            self._stop_server()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        server = grpc.server(ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="device-plugin"),
                             handlers=(self._handlers(),), maximum_concurrent_rpcs=_WORKERS * 2,
                             options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)])
        try:
            bound = server.add_insecure_port("unix://" + os.path.abspath(self.socket_path))
        except RuntimeError as error:
            bound, reason = 0, str(error)
        else:
            reason = "cannot bind"
        if not bound:
            server.stop(None)
            raise PluginError(f"cannot serve the device plugin on {self.socket_path}: {reason}")
        server.start()
        self._server, self._socket_identity = server, _identity(self.socket_path)
        self._registered_with = None
        log.info("serving the device plugin for %s on %s", self.resource, self.socket_path)

    def _register(self) -> None:
        kubelet = _identity(self.kubelet_socket)
        if kubelet is None:
            raise PluginError(f"no kubelet registration socket {self.kubelet_socket} (is the kubelet running, and "
                              "the device-plugins directory mounted?)")
        if kubelet == self._registered_with:
            return
        self.register()
        self._registered_with = kubelet
        with self._lock:
            self.stats["registrations"] += 1
        log.info("registered %s with the kubelet (%s)", self.resource, self.kubelet_socket)

    def _stop_server(self) -> None:
        server, self._server = self._server, None
        with self._changed:
            self._generation += 1
            self._changed.notify_all()
        if server is not None:
            server.stop(grace=1.0).wait(5)
            if _identity(self.socket_path) == self._socket_identity:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.socket_path)
        self._socket_identity = None

    def _options(self) -> Any:
        return api.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def _handlers(self) -> grpc.GenericRpcHandler:
        unary = grpc.unary_unary_rpc_method_handler
        return grpc.method_handlers_generic_handler(api.DEVICE_PLUGIN, {
            "GetDevicePluginOptions": unary(lambda request, context: self._options(),
                                            request_deserializer=api.Empty.FromString,
                                            response_serializer=api.DevicePluginOptions.SerializeToString),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self._list_and_watch, request_deserializer=api.Empty.FromString,
                response_serializer=api.ListAndWatchResponse.SerializeToString),
            "GetPreferredAllocation": unary(
                self._get_preferred_allocation, request_deserializer=api.PreferredAllocationRequest.FromString,
                response_serializer=api.PreferredAllocationResponse.SerializeToString),
            "Allocate": unary(self._allocate, request_deserializer=api.AllocateRequest.FromString,
                              response_serializer=api.AllocateResponse.SerializeToString),
            "PreStartContainer": unary(lambda request, context: api.PreStartContainerResponse(),
                                       request_deserializer=api.PreStartContainerRequest.FromString,
                                       response_serializer=api.PreStartContainerResponse.SerializeToString),
        })

    # -- the calls ---------------------------------------------------------------------------------------

    def _list_and_watch(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        with self._changed:
            generation = self._generation
        sent = None
        while context.is_active():
            with self._changed:
                if self._version == sent and self._generation == generation:
                    self._changed.wait(1.0)
                if self._generation != generation:
                    return
                version = self._version
            if version != sent:
                sent = version
                yield api.ListAndWatchResponse(devices=self.devices())

    def _get_preferred_allocation(self, request: Any, context: grpc.ServicerContext) -> Any:
        asks = list(request.container_requests)[:MAX_CONTAINER_REQUESTS]
        answers: list[tuple[str, ...]] = []
        try:
            pods, listed = self._view() if asks else (None, None)
            with self._lock:
                delivered = self._delivered
            for ask in asks:
                decision = identify(_preferred(ask), pods, listed, delivered, self.board)
                self._tell("GetPreferredAllocation", decision)
                answers.append(decision.ids)
        except Exception:  # never an error: the kubelet would fail the pod's admission for good
            log.exception("GetPreferredAllocation failed; answering our best sets")
            answers = [identify(_preferred(ask), None, None, {}, self.board).ids for ask in asks]
        return api.PreferredAllocationResponse(container_responses=[
            api.ContainerPreferredAllocationResponse(deviceIDs=list(ids)) for ids in answers])

    def _allocate(self, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return self._allocate_answer(request)
        except _Refused as refusal:
            status, message = grpc.StatusCode.INVALID_ARGUMENT, str(refusal)
        except Exception as error:  # a bug must not kill the server thread silently
            log.exception("Allocate failed")
            status, message = grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}"
        log.error("Allocate refused: %s", message)
        with self._lock:
            self.stats["refused"] += 1
        context.abort(status, message[:500])

    def _allocate_answer(self, request: Any) -> Any:
        containers = request.container_requests
        if len(containers) > MAX_CONTAINER_REQUESTS:
            raise _Refused(f"{len(containers)} container requests in one Allocate; at most {MAX_CONTAINER_REQUESTS}")
        if any(len(container.devices_ids) > MAX_IDS for container in containers):
            raise _Refused(f"more than {MAX_IDS} device ids for one container")
        pods, listed = self._view() if containers else (None, None)
        responses = []
        for container in containers:
            with self._lock:
                decision = identify(Allocation(tuple(container.devices_ids)), pods, listed, self._delivered,
                                    self.board)
                if decision.outcome is Outcome.REFUSED:
                    raise _Refused(f"cannot allocate {self.resource}: {decision.reason}")
                self._delivered = remember(self._delivered, decision, pods)
            self._tell("Allocate", decision)
            responses.append(_container_response(self.delivery.answer(decision.ids, str(uuid.uuid4()))))
        return api.AllocateResponse(container_responses=responses)

    def _view(self) -> tuple[list[PodOnNode] | None, Listed | None]:
        """The pods on this node and what pod-resources lists, each None when it cannot be read now."""
        pods: list[PodOnNode] | None = None
        listed: Listed | None = None
        if self._pods is not None:
            try:
                pods = [pod for obj in self._pods.pods()
                        if (pod := read_pod(obj, self.keys, self.resource, self.board.ids)) is not None]
            except Exception as error:
                self._say("pods", str(error), logging.WARNING, f"cannot read this node's pods: {error}")
            else:
                self._say("pods", None, logging.INFO, "this node's pods can be read again")
        try:
            listed = self._listing.listed(self.resource, self.timeout)
        except Exception as error:
            self._say("listing", str(error), logging.WARNING, f"cannot read pod-resources: {error}")
        else:
            self._say("listing", None, logging.INFO, "pod-resources can be read again")
        return pods, listed

    # -- telling people ----------------------------------------------------------------------------------

    def _tell(self, call: str, decision: Decision) -> None:
        with self._lock:
            self.stats[call] += 1
            self.stats[f"{call}:{decision.outcome.value}"] += 1
            if decision.rivals:
                self.stats["ambiguous"] += 1
            if call == "Allocate" and decision.outcome is Outcome.ADJUSTED:
                self.stats["mismatch"] += 1
        quiet = decision.outcome in (Outcome.PLANNED, Outcome.FOREIGN) and not decision.rivals
        log.log(logging.INFO if quiet else logging.WARNING, "%s for %s: %s, %s%s%s", call, decision.who,
                ",".join(decision.ids) or "nothing", _OUTCOMES[decision.outcome],
                f" among {decision.rivals + 1} candidates" if decision.rivals else "",
                f": {decision.reason}" if decision.reason else "")

    def _say(self, topic: str, problem: str | None, level: int, message: str) -> None:
        """Log a problem when it first shows or changes, and its end once."""
        previous = self._said.get(topic)
        self._said[topic] = problem
        if problem != previous:
            log.log(level, "%s", message)

    def _check_cdi(self) -> None:
        if not self.delivery.uses_cdi:
            return
        found = cdi_kind_defined(self.delivery.cdi_kind, self.cdi_spec_dirs)
        if found is None:
            log.warning("cannot read the CDI spec directories %s to check that CDI kind %s is defined",
                        ", ".join(self.cdi_spec_dirs), self.delivery.cdi_kind)
        elif not found:
            log.warning("no CDI spec in %s defines kind %s: containers will fail to start with 'unresolvable CDI "
                        "devices' until one does (README: the CDI spec)", ", ".join(self.cdi_spec_dirs),
                        self.delivery.cdi_kind)


class SharedHealth:
    """The reporter's health source, handing each round's NVML result to the device plugin as well, so both
    publish the one answer of one NVML check."""

    def __init__(self, health: HealthSource, plugin: DevicePlugin) -> None:
        self._health, self._plugin = health, plugin

    def check(self, topology: Topology) -> Mapping[str, str]:
        reasons = self._health.check(topology)
        self._plugin.update_health(reasons)
        return reasons


def cdi_kind_defined(kind: str, directories: Sequence[str]) -> bool | None:
    """Whether a CDI spec file (JSON or YAML) in `directories` declares `kind`; None when none can be read."""
    pattern = re.compile(r"""["']?kind["']?\s*:\s*["']?""" + re.escape(kind) + r"""["']?\s*(,|}|$)""", re.MULTILINE)
    readable = False
    for directory in directories:
        try:
            files = sorted(Path(directory).iterdir())[:_CDI_SPEC_FILES]
        except OSError:
            continue
        readable = True
        for path in files:
            if path.suffix not in (".json", ".yaml", ".yml"):
                continue
            try:
                with path.open("rb") as spec:
                    text = spec.read(_CDI_SPEC_BYTES).decode("utf-8", "replace")
            except OSError:
                continue
            if pattern.search(text):
                return True
    return False if readable else None


def _preferred(ask: Any) -> Preferred:
    return Preferred(tuple(ask.available_deviceIDs), tuple(ask.must_include_deviceIDs), int(ask.allocation_size))


def _container_response(answer: ContainerAnswer) -> Any:
    return api.ContainerAllocateResponse(
        envs=dict(answer.envs), annotations=dict(answer.annotations),
        mounts=[api.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                for m in answer.mounts],
        cdi_devices=[api.CDIDevice(name=name) for name in answer.cdi_devices])


def _identity(path: str) -> tuple[int, int] | None:
    """A socket file's identity (inode, change time), None when it is gone: a recreated file differs."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_ino, status.st_ctime_ns
