"""What a pod asks for: its effective GPU count and its topology annotations (DESIGN §5).

A malformed annotation never raises out of here: it becomes `problem`, a short reason that names the
annotation, which filter reports for every node and which is sent to the pod as an Event. A pod whose JSON
has the wrong shape (which the API server never stores, so only a forged request carries one) is named by
`pod_shape_problem`: the field, what was expected and what came.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

from extender.api.dra import ClaimAsk, ClaimUnseen, pod_claims
from extender.api.group_request import GroupRequest, parse_group
from extender.api.preferences import Toleration, kube_weighs, soft_tolerations
from topology.annotations import AnnotationKeys
from topology.bounds import MAX_ACTIVE_DEADLINE_SECONDS, MAX_TOPOLOGY_WAIT_SECONDS
from topology.collectives import parse_comm_share
from topology.levels import Interconnect
from topology.select import Request
from topology.containers import ContainerNeed, container_needs, device_request, parse_count

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
# Kubernetes' own bounds on what a request may name (apimachinery validation): longer is refused, so nothing
# kept per name or pod (caches, Events) can grow past them.
MAX_NAME_CHARS = 253  # a Node or Pod name is a DNS subdomain
MAX_NAMESPACE_CHARS = 63  # a namespace is a DNS label
MAX_UID_CHARS = 128  # a UID is a 36-character UUID; room for other formats, none for a megabyte
MAX_VERSION_CHARS = 64  # resourceVersion: etcd's revision, a decimal uint64
MAX_CONTAINERS = 256  # per list (containers, initContainers): far past real pods, which etcd holds to 1.5 MiB


@dataclass(frozen=True, slots=True)
class PodRequest:
    namespace: str
    name: str
    uid: str
    gpus: int
    request: Request | None  # None when the pod asks for no GPU or its annotations are malformed
    required: bool  # nodes that cannot meet the constraints are filtered out, not just scored low
    problem: str | None = None
    containers: tuple[ContainerNeed, ...] = ()  # its GPU containers in the kubelet's allocation order
    wait_seconds: float | None = None  # its own topology wait (extender/verbs/wait.py); None: the extender's
    group: GroupRequest | None = None  # the job it is a member of, placed whole (extender/groups.py)
    deadline_seconds: int | None = None  # spec.activeDeadlineSeconds: the longest it runs once started
    comm_share: float | None = None  # its stated share of step time in all-reduce; None: the extender's
    transient: bool = False  # its problem passes by itself (a claim the watch has not delivered yet)
    selected: bool = False  # its GPU claims narrow the devices by selectors: no first fit predicts its GPUs
    pinned: frozenset[str] = frozenset()  # the GPUs its claims pin by UUID: exactly these are given
    weighed: bool = True  # kube-scheduler's scoring weighs something it states (api/preferences.py): no one-node pass
    tolerations: tuple[Toleration, ...] | None = None  # those of PreferNoSchedule taints; None: unreadable here

    @property
    def requires_topology(self) -> bool:
        """It requires an interconnect or a bandwidth: nodes that cannot meet it are refused, not scored low."""
        return self.required and self.request is not None and self.request.constrained

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def group_key(self) -> str | None:
        """The group's identity when this pod is a member that counts toward its span (it has GPUs)."""
        return None if self.group is None or self.request is None else self.group.key(self.namespace)


class ClaimCounter(Protocol):
    """What a pod's DRA claims ask for (extender/cache/dra_inventory.py)."""

    def requested_gpus(self, namespace: str, names: Iterable[str]) -> ClaimAsk: ...


def parse_pod(pod: Mapping[str, Any], keys: AnnotationKeys, resource: str = DEFAULT_GPU_RESOURCE,
              claims: ClaimCounter | None = None) -> PodRequest:
    """`claims` counts the GPUs of the pod's ResourceClaims beside its `resource` requests; without it, only those
    requests count. What it reads of a pod is what `parse_inputs` fingerprints: a field read here is added there."""
    shape = pod_shape_problem(pod)
    metadata = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    namespace = _text(metadata.get("namespace"), MAX_NAMESPACE_CHARS) or "default"
    name = _text(metadata.get("name"), MAX_NAME_CHARS)
    uid = _text(metadata.get("uid"), MAX_UID_CHARS)
    if shape is not None:
        return PodRequest(namespace, name, uid, 0, None, True, f"Pod.{shape}")
    spec = pod.get("spec") or {}
    try:
        containers = container_needs(spec, resource)
        gpus = effective_gpu_request(spec, resource)
    except ValueError as error:
        return PodRequest(namespace, name, uid, 0, None, True, f"{resource}: {error}")
    ask = ClaimAsk()
    if claims is not None:
        try:
            ask = claims.requested_gpus(namespace, pod_claims(spec, pod.get("status")))
            gpus += ask.gpus
        except ValueError as error:
            return PodRequest(namespace, name, uid, gpus, None, True, str(error), containers,
                              transient=isinstance(error, ClaimUnseen))
    annotations = metadata.get("annotations") or {}
    try:
        request, required = _constraints(annotations, keys, gpus)
        wait_seconds = _wait_seconds(annotations.get(keys.topology_wait), keys)
        comm_share = _comm_share(annotations.get(keys.comm_share), keys)
        group = parse_group(metadata, spec, keys)
    except ValueError as error:
        return PodRequest(namespace, name, uid, gpus, None, True, str(error), containers)
    return PodRequest(namespace, name, uid, gpus, request, required, None, containers, wait_seconds, group,
                      spec.get("activeDeadlineSeconds"), comm_share, selected=ask.selected, pinned=ask.pinned,
                      weighed=kube_weighs(metadata, spec), tolerations=soft_tolerations(spec))


def parse_inputs(pod: Mapping[str, Any], keys: AnnotationKeys) -> bytes | None:
    """A fingerprint of what `parse_pod` reads of a pod, so that a new version of it that changes none of that
    (its node set by a Binding, the bind record the Binding writes, the kubelet's status updates) is not parsed
    again. None for a pod that asks ResourceClaims: its parse reads the claims too, which change apart from it."""
    spec = pod.get("spec")
    metadata = pod.get("metadata")
    if not isinstance(spec, dict) or not isinstance(metadata, dict) or spec.get("resourceClaims"):
        return None
    annotations = metadata.get("annotations")
    if isinstance(annotations, dict):
        written = (keys.gpus, keys.containers, keys.ring_bandwidth, keys.seal, keys.group_plan)
        annotations = {key: value for key, value in annotations.items() if key not in written}
    version = metadata.get("resourceVersion")
    try:
        read = orjson.dumps((
            {key: value for key, value in spec.items() if key != "nodeName"}, annotations, metadata.get("labels"),
            metadata.get("ownerReferences"), metadata.get("name"), metadata.get("namespace"), metadata.get("uid"),
            version is None or (isinstance(version, str) and len(version) <= MAX_VERSION_CHARS)))
    except (TypeError, orjson.JSONEncodeError):
        return None
    return hashlib.blake2b(read, digest_size=16).digest()


def pod_shape_problem(pod: Mapping[str, Any]) -> str | None:
    """Where a pod's JSON differs from the Pod schema in the fields we read, or None.

    Reads no more than a pod has of those fields (a few containers), so it runs on every request.
    """
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        return f"metadata: expected an object, got {json_type(metadata)}"
    for field, limit in (("name", MAX_NAME_CHARS), ("namespace", MAX_NAMESPACE_CHARS), ("uid", MAX_UID_CHARS),
                         ("resourceVersion", MAX_VERSION_CHARS)):
        problem = _string_problem(metadata.get(field), f"metadata.{field}", limit)
        if problem is not None:
            return problem
    annotations = metadata.get("annotations")
    if annotations is not None:
        if not isinstance(annotations, dict):
            return f"metadata.annotations: expected an object, got {json_type(annotations)}"
        for key, value in annotations.items():
            if not isinstance(value, str):
                return f"metadata.annotations[{key[:63]!r}]: expected a string, got {json_type(value)}"
    spec = pod.get("spec")
    if spec is None:
        return None
    if not isinstance(spec, dict):
        return f"spec: expected an object, got {json_type(spec)}"
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None and (type(deadline) is not int or not 1 <= deadline <= MAX_ACTIVE_DEADLINE_SECONDS):
        return f"spec.activeDeadlineSeconds: expected a whole number from 1 to {MAX_ACTIVE_DEADLINE_SECONDS}"
    overhead = spec.get("overhead")
    if overhead is not None and not isinstance(overhead, dict):
        return f"spec.overhead: expected an object, got {json_type(overhead)}"
    for field in ("initContainers", "containers"):
        containers = spec.get(field)
        if containers is None:
            continue
        if not isinstance(containers, list):
            return f"spec.{field}: expected an array of containers, got {json_type(containers)}"
        if len(containers) > MAX_CONTAINERS:
            return f"spec.{field}: expected at most {MAX_CONTAINERS} containers, got {len(containers)}"
        for index, container in enumerate(containers):
            problem = _container_problem(container, f"spec.{field}[{index}]")
            if problem is not None:
                return problem
    return None


def json_type(value: Any) -> str:
    """The JSON type of a decoded value, as an error message says it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _container_problem(container: Any, where: str) -> str | None:
    if not isinstance(container, dict):
        return f"{where}: expected a container object, got {json_type(container)}"
    for field in ("name", "restartPolicy"):
        problem = _string_problem(container.get(field), f"{where}.{field}", MAX_NAME_CHARS)
        if problem is not None:
            return problem
    resources = container.get("resources")
    if resources is None:
        return None
    if not isinstance(resources, dict):
        return f"{where}.resources: expected an object, got {json_type(resources)}"
    for field in ("requests", "limits"):
        amounts = resources.get(field)
        if amounts is not None and not isinstance(amounts, dict):
            return f"{where}.resources.{field}: expected an object, got {json_type(amounts)}"
    return None


def _string_problem(value: Any, where: str, limit: int) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        return f"{where}: expected a string, got {json_type(value)}"
    if len(value) > limit:
        return f"{where}: expected at most {limit} characters, got {len(value)}"
    return None


def _text(value: Any, limit: int) -> str:
    return value if isinstance(value, str) and len(value) <= limit else ""


def effective_gpu_request(spec: Mapping[str, Any], resource: str) -> int:
    """kube-scheduler's rule: the containers' sum, or the largest init container if larger.

    Restartable init containers (sidecars) keep running, so they add to everything started after them,
    as in the scheduler's computePodResourceRequest; pod overhead is added on top.
    """
    total = sum(device_request(container, resource) for container in spec.get("containers") or ())
    sidecars = 0
    peak = 0
    for container in spec.get("initContainers") or ():
        amount = device_request(container, resource)
        if container.get("restartPolicy") == "Always":
            sidecars += amount
            peak = max(peak, sidecars)
        else:
            peak = max(peak, sidecars + amount)
    overhead = parse_count((spec.get("overhead") or {}).get(resource, 0))
    return max(total + sidecars, peak) + overhead


def _wait_seconds(raw: Any, keys: AnnotationKeys) -> float | None:
    """The pod's own topology wait: whole seconds, 0 to MAX_TOPOLOGY_WAIT_SECONDS."""
    if raw is None:
        return None
    text = str(raw).strip()
    if not text.isdigit() or len(text) > 6 or int(text) > MAX_TOPOLOGY_WAIT_SECONDS:
        raise ValueError(f"{keys.topology_wait}: {text[:40]!r} is not a whole number of seconds from 0 to "
                         f"{MAX_TOPOLOGY_WAIT_SECONDS:g}")
    return float(text)


def _comm_share(raw: Any, keys: AnnotationKeys) -> float | None:
    """The pod's own communication share (topology/collectives.py), which decides how long its group waits."""
    if raw is None:
        return None
    try:
        return parse_comm_share(str(raw).strip())
    except ValueError as error:
        raise ValueError(f"{keys.comm_share}: {error}") from None


def _constraints(annotations: Mapping[str, Any], keys: AnnotationKeys, gpus: int) -> tuple[Request | None, bool]:
    raw_interconnect = annotations.get(keys.interconnect)
    raw_placement = annotations.get(keys.placement)
    raw_bandwidth = annotations.get(keys.min_bandwidth)
    interconnect = Interconnect.ANY
    if raw_interconnect is not None:
        try:
            interconnect = Interconnect.parse(str(raw_interconnect))
        except ValueError:
            allowed = " | ".join(member.value for member in Interconnect)
            raise ValueError(f"{keys.interconnect}: unknown value {str(raw_interconnect)[:40]!r}; "
                             f"expected {allowed}") from None
    required = False
    if raw_placement is not None:
        placement = str(raw_placement).strip().lower()
        if placement not in ("required", "preferred"):
            raise ValueError(f"{keys.placement}: unknown value {str(raw_placement)[:40]!r}; "
                             "expected required | preferred")
        required = placement == "required"
    min_bandwidth = 0.0
    if raw_bandwidth is not None:
        text = str(raw_bandwidth).strip()
        try:
            min_bandwidth = float(text)
        except ValueError:
            min_bandwidth = math.nan
        if not math.isfinite(min_bandwidth) or min_bandwidth <= 0:
            raise ValueError(f"{keys.min_bandwidth}: {text[:40]!r} is not a positive number of GB/s")
        required = True
    if gpus == 0:
        return None, required
    return Request(gpus, interconnect, min_bandwidth), required
