"""The kubelet pod-resources API v1 over its unix socket: the edge that imports gRPC.

`List` gives the devices assigned to each container, by resource; `GetAllocatableResources` gives the
devices the kubelet can allocate (its healthy ones). The kubelet serves both on
/var/lib/kubelet/pod-resources/kubelet.sock to root on the node.

Every failure is a `PodResourcesUnavailable` with a one-line reason; the reporter then marks the state
unknown and retries with backoff. After a failure the channel is dropped and the next read dials anew, so a
socket that comes back (a kubelet restart) is used at once, not after gRPC's own reconnect backoff (up to
two minutes). `listed` gives the device plugin each pod's containers as List shows them, including those
without devices. A kubelet without GetAllocatableResources (before 1.23 without its feature gate) answers
UNIMPLEMENTED: the reporter then does without it, and says so once.

With a DRA driver (`--dra-driver`, a DRA node) `read` gives the devices of that driver's claims instead, from
each container's dynamic resources (GA and on in 1.36), and neither device-plugin devices nor allocatable ones:
that driver, not a device plugin, hands out the GPUs. Each dynamic resource is checked against what a kubelet can
list (counts, names), since a wrong answer would free or take GPUs: one outside it makes the read fail with why.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from typing import Any

import grpc

from topology import bounds
from topology.agent import podresources_v1 as api
from topology.agent.devices import DEFAULT_SOCKET, ClaimDevice, ContainerDevices, DevicesUnavailable, KubeletDevices

log = logging.getLogger(__name__)

# The kubelet's own client allows 16 MiB answers; a List of a busy node can pass gRPC's 4 MiB default.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class PodResourcesUnavailable(DevicesUnavailable):
    """The pod-resources API cannot be read now; the message is one line."""


class PodResourcesClient:
    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout: float = 5.0, dra_driver: str | None = None) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self.dra_driver = dra_driver
        self._channel: grpc.Channel | None = None
        self._channel_lock = threading.Lock()  # the reporter and the device plugin share one client
        self._allocatable_supported = True

    def read(self) -> KubeletDevices:
        self._require_socket()
        listed = self._call(api.LIST, api.ListPodResourcesRequest, api.ListPodResourcesResponse)
        if self.dra_driver is not None:
            try:
                return KubeletDevices((), claimed=claim_devices(listed, self.dra_driver))
            except ValueError as error:
                raise PodResourcesUnavailable(f"pod-resources List on {self.socket_path}: {error}") from None
        assigned = tuple(
            ContainerDevices(pod.namespace, pod.name, container.name, devices.resource_name, tuple(devices.device_ids))
            for pod in listed.pod_resources for container in pod.containers for devices in container.devices)
        return KubeletDevices(assigned, self._allocatable())

    def listed(self, resource: str,
               timeout: float | None = None) -> dict[tuple[str, str], dict[str, tuple[str, ...]]]:
        """(namespace, pod) -> container -> the device ids of `resource` it holds, for every pod and container
        List shows (the kubelet lists app containers and sidecars, allocated or not, and no init container)."""
        self._require_socket()
        answer = self._call(api.LIST, api.ListPodResourcesRequest, api.ListPodResourcesResponse, timeout)
        listed: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
        for pod in answer.pod_resources:
            containers = listed.setdefault((pod.namespace, pod.name), {})
            for container in pod.containers:
                containers[container.name] = tuple(
                    device_id for devices in container.devices if devices.resource_name == resource
                    for device_id in devices.device_ids)
        return listed

    def _require_socket(self) -> None:
        """PodResourcesUnavailable when the socket is gone; the channel is dropped, so a new socket is dialled."""
        if not os.path.exists(self.socket_path):
            self.close()
            raise PodResourcesUnavailable(f"the pod-resources socket {self.socket_path} does not exist "
                                          "(is the kubelet running, and its pod-resources directory mounted?)")

    def _allocatable(self) -> dict[str, tuple[str, ...]] | None:
        if not self._allocatable_supported:
            return None
        try:
            answer = self._call(api.GET_ALLOCATABLE_RESOURCES, api.AllocatableResourcesRequest,
                                api.AllocatableResourcesResponse)
        except _Unimplemented:
            self._allocatable_supported = False
            log.warning("the kubelet does not serve GetAllocatableResources; GPUs the device plugin marks "
                        "unhealthy are not seen (NVML health still is)")
            return None
        except PodResourcesUnavailable as error:
            log.warning("%s; allocatable devices are not used this round", error)
            return None
        allocatable: dict[str, list[str]] = {}
        for devices in answer.devices:
            allocatable.setdefault(devices.resource_name, []).extend(devices.device_ids)
        return {resource: tuple(ids) for resource, ids in allocatable.items()}

    def _call(self, method: str, request: Any, response: Any, timeout: float | None = None) -> Any:
        stub = self._connect().unary_unary(method, request_serializer=request.SerializeToString,
                                           response_deserializer=response.FromString)
        try:
            return stub(request(), timeout=timeout or self.timeout)
        except grpc.RpcError as error:
            code = error.code() if hasattr(error, "code") else None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise _Unimplemented(method) from None
            self.close()
            details = error.details() if hasattr(error, "details") else str(error)
            name = code.name if code is not None else "error"
            raise PodResourcesUnavailable(f"pod-resources {method.rsplit('/', 1)[-1]} on {self.socket_path} "
                                          f"failed: {name}: {_one_line(details)}") from None

    def _connect(self) -> grpc.Channel:
        with self._channel_lock:
            if self._channel is None:
                self._channel = grpc.insecure_channel(
                    "unix://" + os.path.abspath(self.socket_path),
                    options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                             ("grpc.enable_retries", 0)])
            return self._channel

    def close(self) -> None:
        with self._channel_lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None


class _Unimplemented(Exception):
    pass


def claim_devices(answer: Any, driver: str) -> tuple[ClaimDevice, ...]:
    """The devices of `driver` in a List answer's dynamic resources. ValueError, saying where, for anything a
    kubelet cannot list: more claims per container or devices per claim than Kubernetes allows, a claim outside its
    pod's namespace, a name that is not one, a pool or device of the driver not named as DRA names them."""
    found: list[ClaimDevice] = []
    for pod in answer.pod_resources:
        _require(_named(pod.namespace, bounds.MAX_NAMESPACE_LENGTH) and _named(pod.name, bounds.MAX_NAME_LENGTH),
                 f"a pod named {_shown(pod.namespace)}/{_shown(pod.name)}")
        for container in pod.containers:
            where = f"{pod.namespace}/{pod.name} ({_shown(container.name)})"
            claims = container.dynamic_resources
            _require(len(claims) <= bounds.MAX_CONTAINER_CLAIMS,
                     f"{where}: {len(claims)} claims, more than the {bounds.MAX_CONTAINER_CLAIMS} a container can use")
            for claim in claims:
                _require(claim.claim_namespace == pod.namespace and _named(claim.claim_name, bounds.MAX_NAME_LENGTH),
                         f"{where}: claim {_shown(claim.claim_namespace)}/{_shown(claim.claim_name)}, not one of "
                         "its pod's namespace")
                devices = claim.claim_resources
                _require(len(devices) <= bounds.MAX_ALLOCATION_RESULTS,
                         f"{where}: claim {claim.claim_name} has {len(devices)} devices, more than the "
                         f"{bounds.MAX_ALLOCATION_RESULTS} an allocation holds")
                for device in devices:
                    if device.driver_name != driver:
                        continue
                    _require(_pool(device.pool_name) and _label(device.device_name),
                             f"{where}: claim {claim.claim_name} has {driver} device {_shown(device.device_name)} "
                             f"of pool {_shown(device.pool_name)}, not a DRA device name and pool name")
                    found.append(ClaimDevice(pod.namespace, pod.name, container.name, claim.claim_name, driver,
                                             device.pool_name, device.device_name))
    return tuple(found)


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise ValueError(f"dynamic resources of {what}: no kubelet lists that")


def _named(name: str, longest: int) -> bool:
    """A Kubernetes object name or namespace: a DNS subdomain of at most `longest` characters."""
    return len(name) <= longest and bounds.DNS_SUBDOMAIN.fullmatch(name) is not None


def _label(name: str) -> bool:
    """A DRA device name: a DNS label."""
    return len(name) <= bounds.MAX_DEVICE_NAME_LENGTH and _DNS_LABEL.fullmatch(name) is not None


def _pool(name: str) -> bool:
    """A DRA pool name: DNS subdomains joined by slashes, at most 253 characters."""
    return len(name) <= bounds.MAX_POOL_NAME_LENGTH and all(_named(part, bounds.MAX_POOL_NAME_LENGTH)
                                                            for part in name.split("/"))


def _shown(text: str) -> str:
    """Untrusted text in a one-line reason: its start, quoted."""
    return repr(text[:bounds.MAX_DEVICE_NAME_LENGTH] + ("..." if len(text) > bounds.MAX_DEVICE_NAME_LENGTH else ""))


def _one_line(text: str | None) -> str:
    return " ".join((text or "").split())[:300]
