"""DRA objects (resource.k8s.io/v1) as the extender reads them: a ResourceSlice's GPUs, a ResourceClaim's allocation.

Both come from whoever may write them, so each is checked against what kube-apiserver v1.36 admits
(topology/bounds.py) before any of it is kept, and refused whole with the field to blame. Only what placement needs
is read: a device's name, its `uuid` (NVIDIA publishes no index or minor since 2025, so devices join our topology
on it), its `type` (gpu, mig, vfio; channel and daemon for ComputeDomains), a MIG device's `parentUUID`, and
whether a taint keeps pods off it; a claim's results (driver, pool, device, admin access) and the pods it is
reserved for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from topology import bounds

GPU_DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"  # the DeviceClass NVIDIA's chart installs for whole GPUs
COMPUTE_DOMAIN_DRIVER = "compute-domain.nvidia.com"
CLAIMS_MARKER = "gpu-topology.io/dra-claims"
"""The extended resource scheduler-config/dra-claims-policy.yaml puts on pods with DRA claims, and the scheduler
configuration lists among the extender's managedResources (ignoredByScheduler): it brings them to the extender."""
EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
"""The annotation kube-scheduler puts on the claim it makes for a pod's `nvidia.com/gpu: N` (KEP-5004)."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = bounds.DNS_SUBDOMAIN
_PIN = re.compile(r"device\.attributes\['[a-z0-9.-]+'\]\.uuid in \[([^\]]*)\]")  # no nested quantifier
_KEEP_OFF = frozenset({"NoSchedule", "NoExecute"})  # a taint of effect None only informs
_SHOWN = 60


class DraError(ValueError):
    """A DRA object outside what kube-apiserver admits, with the object and field to blame."""


class ClaimUnseen(ValueError):
    """A claim a pod names that the extender's watch has not delivered yet: a moment's lag, not a fault."""


@dataclass(frozen=True, slots=True)
class SliceDevice:
    name: str
    uuid: str | None
    kind: str | None  # NVIDIA's `type` attribute: gpu, mig, vfio, channel, daemon
    parent_uuid: str | None  # a MIG device's GPU
    tainted: bool  # a NoSchedule or NoExecute taint: no new pod is given it unless the pod tolerates it

    @property
    def whole(self) -> bool:
        """A whole GPU (NVIDIA's `type` gpu, or no type at all), not a MIG slice, a VFIO device or a channel."""
        return self.kind in (None, "gpu")


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int  # slices of the pool at this generation: the pool is complete once all are seen
    node: str | None
    devices: tuple[SliceDevice, ...]


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    driver: str
    pool: str
    device: str
    admin_access: bool  # monitoring access: it takes no device from anyone


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One request of a claim: its device class and count (0 for allocation mode All), or, for `firstAvailable`,
    each alternative in the order the allocator tries them."""

    name: str
    alternatives: tuple[tuple[str, int], ...]
    admin_access: bool
    selected: bool = False  # CEL selectors of its own narrow the devices: the allocator's pick is not the first fit
    pinned: frozenset[str] = frozenset()  # the GPUs a selector `...uuid in [...]` names: exactly those are given


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """What a pod's claims ask of GPUs: how many, whether selectors of their own narrow the devices, and the GPUs
    a UUID pin names (then exactly those are given, wherever they are)."""

    gpus: int = 0
    selected: bool = False
    pinned: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class ClaimTemplate:
    """A ResourceClaimTemplate whose claims the planner may make itself, pinned (extender/pinning/planner.py):
    the requests read as a claim's, and the claim spec it copies."""

    key: str  # namespace/name
    requests: tuple[DeviceRequest, ...]
    spec: dict[str, Any]  # spec.spec, as kube-apiserver admitted it


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    uid: str
    key: str  # namespace/name
    requests: tuple[DeviceRequest, ...]
    results: tuple[AllocatedDevice, ...]  # empty while unallocated
    reserved_for: tuple[str, ...]  # UIDs of the pods (or other consumers) it is reserved for
    extended: bool  # made by kube-scheduler for a KEP-5004 `nvidia.com/gpu: N` pod


def pod_claims(spec: Mapping[str, Any], status: Any) -> tuple[str, ...]:
    """The names of the ResourceClaims a pod uses: those it names, and those made from its templates, which the
    resourceclaim controller names in status.resourceClaimStatuses (ClaimUnseen while it has not)."""
    claims = spec.get("resourceClaims") or []
    if not isinstance(claims, list) or len(claims) > bounds.MAX_POD_CLAIMS:
        raise ValueError(f"spec.resourceClaims: expected a list of at most {bounds.MAX_POD_CLAIMS}")
    statuses = (status or {}).get("resourceClaimStatuses") or [] if isinstance(status, dict) else []
    made = {entry["name"]: entry.get("resourceClaimName") for entry in statuses[:bounds.MAX_POD_CLAIMS]
            if isinstance(entry, dict) and isinstance(entry.get("name"), str)} if isinstance(statuses, list) else {}
    names = []
    for i, claim in enumerate(claims):
        if not isinstance(claim, dict):
            raise ValueError(f"spec.resourceClaims[{i}]: expected an object")
        name = claim.get("resourceClaimName")
        if name is None and claim.get("resourceClaimTemplateName") is not None:
            if not isinstance(claim.get("name"), str) or claim["name"] not in made:
                raise ClaimUnseen(f"spec.resourceClaims[{i}]: its claim is not made from its template yet")
            name = made[claim["name"]]
            if name is None:
                continue  # the controller found no claim needed
        names.append(_text(name, "Pod", f"spec.resourceClaims[{i}]", bounds.MAX_POOL_NAME_LENGTH))
    return tuple(names)


def valid_driver(name: str) -> bool:
    return len(name) <= bounds.MAX_DRIVER_NAME_LENGTH and bounds.DNS_SUBDOMAIN.fullmatch(name) is not None


def parse_slice(obj: Any) -> ResourceSlice:
    metadata, spec = _object(obj, "ResourceSlice")
    name = _name(metadata.get("name"), "ResourceSlice", "metadata.name", bounds.MAX_POOL_NAME_LENGTH, _DNS_SUBDOMAIN)
    where = f"ResourceSlice {name}"
    driver = _name(spec.get("driver"), where, "spec.driver", bounds.MAX_DRIVER_NAME_LENGTH, _DNS_SUBDOMAIN)
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        raise DraError(f"{where}: spec.pool: expected an object")
    pool_name = _text(pool.get("name"), where, "spec.pool.name", bounds.MAX_POOL_NAME_LENGTH)
    generation = _count(pool.get("generation"), where, "spec.pool.generation", 0, bounds.MAX_GENERATION)
    count = _count(pool.get("resourceSliceCount"), where, "spec.pool.resourceSliceCount", 1, bounds.MAX_POOL_SLICES)
    node = spec.get("nodeName")
    if node is not None:
        node = _name(node, where, "spec.nodeName", bounds.MAX_POOL_NAME_LENGTH, _DNS_SUBDOMAIN)
    devices = spec.get("devices") or []
    if not isinstance(devices, list) or len(devices) > bounds.MAX_SLICE_DEVICES:
        raise DraError(f"{where}: spec.devices: expected a list of at most {bounds.MAX_SLICE_DEVICES} devices")
    parsed = tuple(_device(device, driver, f"{where}: spec.devices[{i}]") for i, device in enumerate(devices))
    if len({device.name for device in parsed}) != len(parsed):
        raise DraError(f"{where}: spec.devices: a device name appears twice")
    return ResourceSlice(name, driver, pool_name, generation, count, node, parsed)


def parse_claim(obj: Any) -> ResourceClaim:
    metadata, spec = _object(obj, "ResourceClaim")
    name = _text(metadata.get("name"), "ResourceClaim", "metadata.name", bounds.MAX_POOL_NAME_LENGTH)
    namespace = _text(metadata.get("namespace"), "ResourceClaim", "metadata.namespace", 63)
    where = f"ResourceClaim {namespace}/{name}"
    uid = _text(metadata.get("uid"), where, "metadata.uid", 128)
    annotations = metadata.get("annotations") or {}
    extended = isinstance(annotations, dict) and annotations.get(EXTENDED_RESOURCE_CLAIM) == "true"
    status = obj.get("status") or {}
    if not isinstance(status, dict):
        raise DraError(f"{where}: status: expected an object")
    allocation = status.get("allocation") or {}
    results = ((allocation.get("devices") or {}).get("results") or []) if isinstance(allocation, dict) else None
    if not isinstance(results, list) or len(results) > bounds.MAX_ALLOCATION_RESULTS:
        raise DraError(f"{where}: status.allocation.devices.results: expected a list of at most "
                       f"{bounds.MAX_ALLOCATION_RESULTS}")
    reserved = status.get("reservedFor") or []
    if not isinstance(reserved, list) or len(reserved) > bounds.MAX_RESERVED_FOR:
        raise DraError(f"{where}: status.reservedFor: expected a list of at most {bounds.MAX_RESERVED_FOR}")
    devices = spec.get("devices") or {}
    requests = devices.get("requests") or [] if isinstance(devices, dict) else None
    if not isinstance(requests, list) or len(requests) > bounds.MAX_ALLOCATION_RESULTS:
        raise DraError(f"{where}: spec.devices.requests: expected a list of at most {bounds.MAX_ALLOCATION_RESULTS}")
    return ResourceClaim(uid, f"{namespace}/{name}",
                         tuple(_request(request, f"{where}: spec.devices.requests[{i}]")
                               for i, request in enumerate(requests)),
                         tuple(_result(result, f"{where}: status.allocation.devices.results[{i}]")
                               for i, result in enumerate(results)),
                         tuple(_text((consumer or {}).get("uid") if isinstance(consumer, dict) else None,
                                     where, f"status.reservedFor[{i}].uid", 128)
                               for i, consumer in enumerate(reserved)),
                         extended)


def parse_template(obj: Any) -> ClaimTemplate:
    """A template's claim spec is a claim's spec: read and bounded as one."""
    metadata, spec = _object(obj, "ResourceClaimTemplate")
    inner = spec.get("spec") or {}
    if not isinstance(inner, dict):
        raise DraError("ResourceClaimTemplate: spec.spec must be an object")
    claim = parse_claim({"metadata": {**metadata, "uid": metadata.get("uid") or "-"}, "spec": inner})
    return ClaimTemplate(claim.key, claim.requests, inner)


def pin_selector(driver: str, uuids: Iterable[str]) -> dict[str, Any]:
    """The CEL selector that pins a request to exactly these GPUs, in the one form `_pinned` reads back."""
    listed = ", ".join(f"'{uuid}'" for uuid in sorted(uuids))
    return {"cel": {"expression": f"device.attributes['{driver}'].uuid in [{listed}]"}}


def _device(device: Any, driver: str, where: str) -> SliceDevice:
    if not isinstance(device, dict):
        raise DraError(f"{where}: expected an object")
    name = _name(device.get("name"), where, "name", bounds.MAX_DEVICE_NAME_LENGTH, _DNS_LABEL)
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if (not isinstance(attributes, dict) or not isinstance(capacity, dict)
            or len(attributes) + len(capacity) > bounds.MAX_DEVICE_ATTRIBUTES):
        raise DraError(f"{where}: attributes and capacity: expected at most {bounds.MAX_DEVICE_ATTRIBUTES} in all")
    taints = device.get("taints") or []
    if not isinstance(taints, list) or len(taints) > bounds.MAX_DEVICE_TAINTS:
        raise DraError(f"{where}: taints: expected a list of at most {bounds.MAX_DEVICE_TAINTS}")
    uuid = _string_attribute(attributes, driver, "uuid", where)
    if uuid is not None and not bounds.valid_id(uuid):
        raise DraError(f"{where}: attribute uuid {uuid[:_SHOWN]!r} is no GPU UUID")
    parent = _string_attribute(attributes, driver, "parentUUID", where)
    if parent is not None and not bounds.valid_id(parent):
        raise DraError(f"{where}: attribute parentUUID {parent[:_SHOWN]!r} is no GPU UUID")
    tainted = any(isinstance(taint, dict) and taint.get("effect") in _KEEP_OFF for taint in taints)
    return SliceDevice(name, uuid, _string_attribute(attributes, driver, "type", where), parent, tainted)


def _string_attribute(attributes: Mapping[str, Any], driver: str, name: str, where: str) -> str | None:
    """An attribute is named bare (in the driver's domain) or qualified by it; both spell the same one."""
    value = attributes.get(name, attributes.get(f"{driver}/{name}"))
    if value is None:
        return None
    text = value.get("string") if isinstance(value, dict) else None
    if not isinstance(text, str) or len(text) > bounds.DEVICE_ATTRIBUTE_MAX_LENGTH:
        raise DraError(f"{where}: attribute {name}: expected a string of at most "
                       f"{bounds.DEVICE_ATTRIBUTE_MAX_LENGTH} characters")
    return text


def _request(request: Any, where: str) -> DeviceRequest:
    if not isinstance(request, dict):
        raise DraError(f"{where}: expected an object")
    name = _name(request.get("name"), where, "name", bounds.MAX_DEVICE_NAME_LENGTH, _DNS_LABEL)
    exactly, first = request.get("exactly"), request.get("firstAvailable")
    if (exactly is None) == (first is None):
        raise DraError(f"{where}: exactly one of exactly and firstAvailable must be set")
    if exactly is not None:
        selectors = exactly.get("selectors") if isinstance(exactly, dict) else None
        return DeviceRequest(name, (_alternative(exactly, f"{where}.exactly"),),
                             isinstance(exactly, dict) and exactly.get("adminAccess") is True, bool(selectors),
                             _pinned(selectors))
    if not isinstance(first, list) or not 0 < len(first) <= bounds.MAX_FIRST_AVAILABLE:
        raise DraError(f"{where}: firstAvailable: expected 1 to {bounds.MAX_FIRST_AVAILABLE} alternatives")
    return DeviceRequest(name, tuple(_alternative(sub, f"{where}.firstAvailable[{i}]") for i, sub in enumerate(first)),
                         False)


def _pinned(selectors: Any) -> frozenset[str]:
    """The GPU UUIDs a selector names as `device.attributes['<driver>'].uuid in ['GPU-...', ...]`, the form a pin
    takes (research/dra.md §7, C1); none for any other selector, whose pick the extender does not compute."""
    if not isinstance(selectors, list) or len(selectors) > bounds.MAX_DEVICE_SELECTORS:
        return frozenset()
    for selector in selectors:
        cel = selector.get("cel") if isinstance(selector, dict) else None
        expression = cel.get("expression") if isinstance(cel, dict) else None
        if not isinstance(expression, str) or len(expression) > bounds.MAX_PIN_EXPRESSION:
            continue
        found = _PIN.fullmatch(expression.strip())
        items = [item.strip() for item in found.group(1).split(",")] if found is not None else []
        if items and all(len(item) > 2 and item[0] == item[-1] == "'" and bounds.valid_id(item[1:-1])
                         for item in items):
            return frozenset(item[1:-1] for item in items)
    return frozenset()


def _alternative(request: Any, where: str) -> tuple[str, int]:
    """(device class, count), the count 0 for allocation mode All."""
    if not isinstance(request, dict):
        raise DraError(f"{where}: expected an object")
    device_class = _name(request.get("deviceClassName"), where, "deviceClassName", bounds.MAX_POOL_NAME_LENGTH,
                         _DNS_SUBDOMAIN)
    mode = request.get("allocationMode") or "ExactCount"
    if mode == "All":
        return device_class, 0
    if mode != "ExactCount":
        raise DraError(f"{where}: allocationMode: expected ExactCount or All")
    return device_class, _count(request.get("count", 1), where, "count", 1, bounds.MAX_DEVICE_COUNT)


def _result(result: Any, where: str) -> AllocatedDevice:
    if not isinstance(result, dict):
        raise DraError(f"{where}: expected an object")
    return AllocatedDevice(
        _name(result.get("driver"), where, "driver", bounds.MAX_DRIVER_NAME_LENGTH, _DNS_SUBDOMAIN),
        _text(result.get("pool"), where, "pool", bounds.MAX_POOL_NAME_LENGTH),
        _name(result.get("device"), where, "device", bounds.MAX_DEVICE_NAME_LENGTH, _DNS_LABEL),
        result.get("adminAccess") is True)


def _object(obj: Any, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    if not isinstance(obj, dict):
        raise DraError(f"{kind}: expected an object")
    metadata, spec = obj.get("metadata"), obj.get("spec") or {}
    if not isinstance(metadata, dict) or not isinstance(spec, dict):
        raise DraError(f"{kind}: metadata and spec must be objects")
    return metadata, spec


def _text(value: Any, where: str, field: str, limit: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        shown = repr(value[:_SHOWN]) if isinstance(value, str) else type(value).__name__
        raise DraError(f"{where}: {field}: expected 1 to {limit} characters, not {shown}")
    return value


def _name(value: Any, where: str, field: str, limit: int, pattern: re.Pattern[str]) -> str:
    text = _text(value, where, field, limit)
    if not pattern.fullmatch(text):
        raise DraError(f"{where}: {field}: {text[:_SHOWN]!r} is not a DNS name")
    return text


def _count(value: Any, where: str, field: str, low: int, high: int) -> int:
    if type(value) is not int or not low <= value <= high:
        raise DraError(f"{where}: {field}: expected a whole number from {low} to {high}")
    return value
