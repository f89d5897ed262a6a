"""What the kubelet and NVML say about this node's GPUs, as one observation in the annotations' GPU ids.

GPU ids are those of the annotations and of the extender (`extender.cache.cluster_state.NodeView.ids`): a GPU's UUID, or
`GPU<index>` when the topology has no UUIDs (a `nvidia-smi topo -m` capture, `--from-topo`).

The kubelet names devices by the ids the device plugin gave them. NVIDIA's device plugin uses the GPU UUID
(`GPU-…`) by default and the index (`0`, `1`, …) with `DEVICE_ID_STRATEGY=index`; with GPU sharing
(time-slicing, MPS) each replica is `<id>::<n>`; MIG devices are `MIG-…` (or `<gpu>:<mig>` by index). All are
mapped here except MIG devices, which are ignored and reported in a note: this project places whole GPUs.

A device id that names no GPU of this node makes the whole observation unknown: publishing `used` without
it would show a busy GPU as free. This happens with `--from-topo` (no UUIDs) when the device plugin uses
UUIDs: run it with `DEVICE_ID_STRATEGY=index`, or let the reporter discover the topology through NVML.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from topology.model import Topology
from topology.sharing import Sharing

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"  # where the kubelet serves pod-resources
MIG = "MIG"  # what `GpuIds.resolve` answers for a MIG device
_INDEX = re.compile(r"(?:GPU)?(\d+)$")
_MIG_BY_INDEX = re.compile(r"\d+:\d+$")


@dataclass(frozen=True, slots=True)
class ContainerDevices:
    """The devices of one resource that the kubelet assigned to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ClaimDevice:
    """One device of a ResourceClaim that the kubelet prepared for one container (pod-resources' dynamic resources),
    named as DRA names it: driver, pool, device."""

    namespace: str
    pod: str
    container: str
    claim: str  # the claim's name, in the pod's namespace
    driver: str
    pool: str
    device: str


@dataclass(frozen=True, slots=True)
class KubeletDevices:
    """One answer of the pod-resources API.

    `allocatable` maps each resource to the device ids the kubelet can allocate, which are its healthy
    devices (the kubelet filters out what the device plugin marked unhealthy, e.g. after a critical XID).
    It is None when the kubelet does not serve GetAllocatableResources (before 1.23 without its gate).
    `claimed` holds the devices of one DRA driver's claims, read on DRA nodes only (`--dra-driver`).
    """

    assigned: tuple[ContainerDevices, ...]
    allocatable: Mapping[str, tuple[str, ...]] | None = None
    claimed: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True, slots=True)
class Observation:
    """A known GPU state: which GPUs are assigned to containers, and which cannot be given to a pod, and why."""

    used: frozenset[str]
    reasons: Mapping[str, str] = field(default_factory=dict)  # GPU id -> why it is unhealthy
    notes: tuple[str, ...] = ()  # what a person should know, e.g. ignored MIG devices
    pods: Mapping[str, frozenset[str]] = field(default_factory=dict)  # "namespace/name" -> the GPUs it holds
    sharing: Sharing = Sharing.NONE  # replica or MIG ids among the kubelet's devices (topology/sharing.py)

    @property
    def unhealthy(self) -> frozenset[str]:
        return frozenset(self.reasons)


@dataclass(frozen=True, slots=True)
class Unknown:
    """The GPU state cannot be known this round (pod-resources unreachable, a device id that maps to no GPU)."""

    reason: str


class DevicesUnavailable(Exception):
    """The kubelet's device assignments cannot be read now (raised by the pod-resources edge); one line."""


class GpuIds:
    """The annotation id of each GPU, and the mapping from kubelet device ids to them."""

    def __init__(self, topology: Topology) -> None:
        self.ids: tuple[str, ...] = tuple(gpu.uuid or f"GPU{gpu.index}" for gpu in topology.gpus)
        self.has_uuids = all(gpu.uuid for gpu in topology.gpus)
        self._by_uuid = {gpu.uuid.lower(): self.ids[gpu.index] for gpu in topology.gpus if gpu.uuid}

    def resolve(self, device_id: str) -> str | None:
        """The GPU id a kubelet device id names, `MIG` for a MIG device, None for an id this node lacks."""
        base = device_id.strip().split("::", 1)[0]  # a shared GPU's replica: <id>::<n>
        if base.upper().startswith("MIG-") or _MIG_BY_INDEX.match(base):
            return MIG
        if base.upper().startswith("GPU-"):
            return self._by_uuid.get(base.lower())
        index = _INDEX.match(base)
        if index and int(index.group(1)) < len(self.ids):
            return self.ids[int(index.group(1))]
        return None


def observe(ids: GpuIds, devices: KubeletDevices, health: Mapping[str, str], resource: str) -> Observation | Unknown:
    """Combine one pod-resources answer with NVML health (GPU id -> reason) for `resource` (nvidia.com/gpu)."""
    pods: dict[str, set[str]] = {}
    mig = 0
    for container in devices.assigned:
        if container.resource != resource:
            continue
        for device_id in container.device_ids:
            gpu = ids.resolve(device_id)
            if gpu is None:
                return Unknown(f"the kubelet gave {container.namespace}/{container.pod} ({container.container}) "
                               f"device {device_id!r} of {resource}, which names no GPU of this node"
                               + _hint(ids, device_id))
            if gpu == MIG:
                mig += 1
            else:
                pods.setdefault(f"{container.namespace}/{container.pod}", set()).add(gpu)
    reasons = dict(health)
    notes: list[str] = []
    if mig:
        notes.append(f"{mig} MIG device(s) of {resource} are assigned and ignored: only whole GPUs are reported")
    if devices.allocatable is not None:
        offered = devices.allocatable.get(resource, ())
        resolved = [ids.resolve(device_id) for device_id in offered]
        if not offered:
            notes.append(f"the kubelet offers no {resource} device (is the device plugin running?)")
        elif None in resolved:
            strange = offered[resolved.index(None)]
            notes.append(f"the kubelet offers {resource} device {strange!r}, which names no GPU of this node; "
                         "allocatable devices are not used to find unhealthy GPUs" + _hint(ids, strange))
        else:
            for gpu in set(ids.ids) - set(resolved):
                reasons.setdefault(gpu, "the kubelet does not offer it (the device plugin reports it unhealthy, "
                                        "or it is in MIG mode)")
    used = frozenset(gpu for gpus in pods.values() for gpu in gpus)
    return Observation(used, reasons, tuple(notes), {key: frozenset(gpus) for key, gpus in pods.items()},
                       _sharing(ids, devices, resource))


def _sharing(ids: GpuIds, devices: KubeletDevices, resource: str) -> Sharing:
    """MIG when any device the kubelet offers or gave out is a MIG device, replicas when any is `<id>::<n>`."""
    seen = [device_id for container in devices.assigned if container.resource == resource
            for device_id in container.device_ids]
    seen += list((devices.allocatable or {}).get(resource, ()))
    if any(ids.resolve(device_id) == MIG for device_id in seen):
        return Sharing.MIG
    if any("::" in device_id for device_id in seen):
        return Sharing.REPLICAS
    return Sharing.NONE


def _hint(ids: GpuIds, device_id: str) -> str:
    if not ids.has_uuids and device_id.upper().startswith("GPU-"):
        return ("; the topology has no GPU UUIDs (it came from a topo -m capture): run the device plugin with "
                "DEVICE_ID_STRATEGY=index, or let the reporter discover the topology through NVML")
    return ""
