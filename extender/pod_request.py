"""What a pod asks for: its effective GPU count and its topology annotations (DESIGN §5).

A malformed annotation never raises out of here: it becomes `problem`, a short reason that names the
annotation, which filter reports for every node and which is sent to the pod as an Event.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from topology.annotations import AnnotationKeys
from topology.levels import Interconnect
from topology.select import Request
from topology.split import ContainerNeed, container_needs, device_request, parse_count

DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"


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

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_pod(pod: Mapping[str, Any], keys: AnnotationKeys, resource: str = DEFAULT_GPU_RESOURCE) -> PodRequest:
    metadata = pod.get("metadata") or {}
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata.get("name") or "")
    uid = str(metadata.get("uid") or "")
    spec = pod.get("spec") or {}
    try:
        containers = container_needs(spec, resource)  # checks the containers' shape first
        gpus = effective_gpu_request(spec, resource)
    except (ValueError, TypeError, AttributeError) as error:
        return PodRequest(namespace, name, uid, 0, None, True, f"{resource}: {error}")
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, dict):
        annotations = {}
    try:
        request, required = _constraints(annotations, keys, gpus)
    except ValueError as error:
        return PodRequest(namespace, name, uid, gpus, None, True, str(error), containers)
    return PodRequest(namespace, name, uid, gpus, request, required, None, containers)


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
