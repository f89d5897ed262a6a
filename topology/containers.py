"""A pod's GPUs container by container, in the order and with the reuse rules of the kubelet's device manager.

The kubelet allocates a pod's devices one container at a time: init containers in spec order, then app
containers (`Allocate` in `pkg/kubelet/cm/devicemanager/manager.go`). Devices of a plain init container go
to a pool that later containers draw from first (`devicesToReuse`); a restartable init container (sidecar)
or an app container keeps what it draws, so those leave the pool. Only what a container needs beyond the
pool is asked of the device plugin (`GetPreferredAllocation`), so that is what a plugin can steer. A
container that needs fewer devices than the pool holds gets them drawn by the kubelet itself, in Go map
order: no plugin can choose which, so such a part is not `exact`.

`split` plans every container: the pool, or all of it, where the kubelet draws from it; otherwise the best
ring for what is new, among the pod's GPUs not yet given. Each part is then itself a good ring, and the parts
together are the pod's set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from topology.compiled import CompiledTopology
from topology.select import Choice, Request, Selector, extend_best, mask_of

MAX_DEVICES_PER_CONTAINER = 1024  # far above any node; a larger request is refused, not planned


class Kind(str, Enum):
    INIT = "init"
    SIDECAR = "sidecar"  # an init container with restartPolicy: Always
    APP = "app"


@dataclass(frozen=True, slots=True)
class ContainerNeed:
    name: str
    kind: Kind
    count: int


@dataclass(frozen=True, slots=True)
class Part:
    need: ContainerNeed
    gpus: int  # mask of GPU indices
    exact: bool  # the kubelet gives exactly these (False: it draws `count` of them from the init pool itself)


def container_needs(spec: Mapping[str, Any], resource: str) -> tuple[ContainerNeed, ...]:
    """The containers that request `resource`, in the kubelet's allocation order. ValueError for a bad count."""
    needs = []
    for kind_of, key in ((_init_kind, "initContainers"), (lambda _: Kind.APP, "containers")):
        containers = spec.get(key) or []
        if not isinstance(containers, list):
            raise ValueError(f"spec.{key} is not a list")
        for container in containers:
            if not isinstance(container, Mapping):
                raise ValueError(f"an entry of spec.{key} is not a container")
            count = device_request(container, resource)
            if count:
                needs.append(ContainerNeed(str(container.get("name") or ""), kind_of(container), count))
    return tuple(needs)


def device_request(container: Mapping[str, Any], resource: str) -> int:
    """A container's request of an extended resource; the API server defaults the request from the limit."""
    resources = container.get("resources") or {}
    if not isinstance(resources, Mapping):
        raise ValueError("resources is not an object")
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    if not isinstance(requests, Mapping) or not isinstance(limits, Mapping):
        raise ValueError("resources.requests and resources.limits must be objects")
    return parse_count(requests.get(resource, limits.get(resource, 0)))


def parse_count(value: Any) -> int:
    """A whole, non-negative number of devices, as an int or a decimal string."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip()) if len(value.strip()) <= 12 else MAX_DEVICES_PER_CONTAINER + 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{str(value)[:40]!r} is not a whole number of devices")
    if value > MAX_DEVICES_PER_CONTAINER:
        raise ValueError(f"{value} devices is more than any node has")
    return value


def device_count(needs: tuple[ContainerNeed, ...]) -> int:
    """How many distinct devices the kubelet gives the pod: at most kube-scheduler's effective request."""
    pool = total = 0
    for need in needs:
        drawn = min(need.count, pool)
        total += need.count - drawn
        pool += need.count - drawn if need.kind is Kind.INIT else -drawn
    return total


def split(selector: Selector, compiled: CompiledTopology, pod_gpus: int,
          needs: tuple[ContainerNeed, ...]) -> tuple[Part, ...]:
    """Each container's part of the pod's GPUs (a mask of `device_count(needs)` GPUs)."""
    if pod_gpus.bit_count() != device_count(needs):
        raise ValueError(f"the pod's set has {pod_gpus.bit_count()} GPUs; its containers take {device_count(needs)}")
    pool = given = 0
    pool_known = True  # False once a sidecar or app container drew part of the pool: the rest is then the kubelet's
    parts = []
    for need in needs:
        pooled = pool.bit_count()
        if need.count <= pooled:
            gpus = _best(selector, compiled, pool, need.count)
            exact = pool_known and need.count == pooled
        else:
            gpus = pool | extend_best(selector, compiled, pool, pod_gpus & ~given, need.count - pooled)
            exact = pool_known or not pool
        parts.append(Part(need, gpus, exact))
        given |= gpus
        if need.kind is Kind.INIT:
            pool |= gpus
        else:
            pool_known = pool_known and (need.count >= pooled)
            pool &= ~gpus
    return tuple(parts)


def _init_kind(container: Mapping[str, Any]) -> Kind:
    return Kind.SIDECAR if container.get("restartPolicy") == "Always" else Kind.INIT


def _best(selector: Selector, compiled: CompiledTopology, free: int, count: int) -> int:
    choice = selector.select(compiled, free, Request(count))
    assert isinstance(choice, Choice), "any k of at least k free GPUs form some ring"
    return mask_of(choice.gpus)
