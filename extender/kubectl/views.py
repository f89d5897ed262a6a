"""What `kubectl gputopo` shows, computed from a snapshot of the cluster: values only, no layout.

Every figure comes from the topology core (best sets from topology/select.py, whole full-bandwidth sets from
topology/full_sets.py) over the node views the extender's own state built (extender/cache/cluster_state.py), so a
free ring, a whole set, a stale or a refused node here is what the extender sees.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from datetime import datetime, timezone
from enum import Enum
from typing import Any

import orjson

from extender.api.pod_request import PodRequest, parse_pod
from extender.cache.assignments import Phase, covered
from extender.cache.node_view import NodeView
from extender.kubectl.snapshot import Snapshot
from topology.assignment import AssignmentError, decode_containers
from topology.codec import CodecError, check_state, decode_state, decode_topology
from topology.compiled import CompiledTopology, compile_topology
from topology.fabric import CLIQUE_LABEL, Domain
from topology.full_sets import full_sets, is_full
from topology.levels import Level
from topology.model import Topology
from topology.select import Choice, Request, Selector, mask_of, ring_gbps
from topology.containers import parse_count

SIZES = (2, 4, 8)  # the ring sizes a row shows: what multi-GPU jobs ask for
CLOSEST = 3  # nodes shown for a pod that waits


class Status(str, Enum):
    OK = "ok"
    STALE = "stale"  # its agent's state is older than --stale-after: the extender places nothing there
    REFUSED = "refused"  # an annotation out of bounds or malformed
    NO_TOPOLOGY = "no-topology"  # no agent has reported this GPU node
    SHARED = "shared"  # time-slicing, MPS or MIG: placed by count, no ring promised


@dataclass(frozen=True, slots=True)
class Health:
    status: Status
    reason: str | None = None


class Source(str, Enum):
    """Who says a GPU is taken."""

    KUBELET = "kubelet"  # the agent's report of the kubelet's allocation names the pod
    REPORTED = "reported"  # the report counts it used without naming a pod (an agent from before per-pod reports)
    BOUND = "bound"  # a bind record the report does not show yet (the pod has not started)
    PLANNED = "planned"  # an open slot of a group's plan, held for a member to come


class Delivery(str, Enum):
    YES = "yes"  # the node's report lists the pod with exactly the GPUs it was bound to
    NO = "no"  # ... with other GPUs
    NOT_REPORTED = "not-reported"  # the report does not list the pod (not started yet, or an agent naming no pods)
    UNKNOWN = "unknown"  # the node has no usable report
    COUNT_ONLY = "count-only"  # bound without a GPU choice (a shared node, or kube-scheduler alone)


@dataclass(frozen=True, slots=True)
class NodeRow:
    name: str
    model: str | None
    total: int
    free: int | None  # None where the extender counts no free GPU (refused, shared, no topology)
    unhealthy: int
    rings: tuple[tuple[int, float | None], ...]  # (size, best ring of that many free GPUs, GB/s)
    whole: tuple[tuple[int, int], ...]  # (size, full-bandwidth sets of that size still whole among the free)
    domain: Domain  # the agent's reading and the nvidia.com/gpu.clique label, reconciled
    health: Health
    observed: float | None  # when the agent last looked, epoch seconds
    gpus_from: str  # who hands out its GPUs: device-plugin, dra-gpu, compute-domain-only (cache/dra_inventory.py)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "model": self.model, "gpus": self.total, "free": self.free,
                "unhealthy": self.unhealthy, "rings": {str(size): ring for size, ring in self.rings},
                "whole": {str(size): count for size, count in self.whole}, "domain": self.domain.name,
                "domainProblem": self.domain.problem, "state": self.health.status, "reason": self.health.reason,
                "observed": None if self.observed is None else rfc3339(self.observed), "gpusFrom": self.gpus_from}


@dataclass(frozen=True, slots=True)
class Holder:
    gpu: int
    uuid: str
    holder: str | None  # namespace/pod/container, namespace/pod when the container is not known, plan:<group>
    source: Source | None  # None: free
    unhealthy: bool


@dataclass(frozen=True, slots=True)
class FreeSet:
    count: int
    gpus: tuple[int, ...]
    ring_gbps: float | None
    weakest: str | None
    full: bool  # as fast as the best ring of this size on the healthy board


@dataclass(frozen=True, slots=True)
class NodeDetail:
    row: NodeRow
    topology: Topology | None
    label: str | None  # the nvidia.com/gpu.clique label as written
    holders: tuple[Holder, ...]
    free_sets: tuple[FreeSet, ...]

    def as_dict(self) -> dict[str, Any]:
        return {**self.row.as_dict(), "cliqueLabel": self.label,
                "reportedDomain": None if self.topology is None or self.topology.domain is None
                else self.topology.domain.name,
                "holders": self.holders, "freeSets": self.free_sets}


@dataclass(frozen=True, slots=True)
class ContainerGpus:
    name: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Placement:
    """A bound pod's GPUs, as bound and as delivered."""

    node: str
    gpus: tuple[int, ...]
    gpu_ids: tuple[str, ...]
    containers: tuple[ContainerGpus, ...]
    ring_gbps: float | None
    ring_annotation: str | None  # what the extender wrote at bind
    sealed: bool
    delivery: Delivery
    delivered: tuple[int, ...]  # what the node's report lists for the pod
    node_health: Health


@dataclass(frozen=True, slots=True)
class Offer:
    """What one node could give a waiting pod now."""

    node: str
    free: int
    total: int
    gpus: tuple[int, ...]  # the best set of the pod's count, whatever its constraints
    ring_gbps: float | None
    weakest: str | None
    full: bool
    fits: bool  # the pod's own constraints are met by some set here
    why: str | None  # why not, as the selection says


@dataclass(frozen=True, slots=True)
class EventLine:
    type: str
    reason: str
    source: str
    count: int
    message: str
    last: str


@dataclass(frozen=True, slots=True)
class Member:
    pod: str  # namespace/name
    node: str | None


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    source: str
    size: int | None  # None: its PodGroup object says
    span: str
    required: bool
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class PodReport:
    namespace: str
    name: str
    phase: str
    gpus: int
    interconnect: str | None
    required: bool
    min_bandwidth: float | None
    problem: str | None
    group: Group | None
    events: tuple[EventLine, ...]
    failed_scheduling: str | None  # kube-scheduler's newest FailedScheduling message: the extender's reasons
    placement: Placement | None
    closest: tuple[Offer, ...]


def gpu_node_names(snap: Snapshot) -> list[str]:
    """Nodes an agent reported, whose GPUs are shared, or that offer the GPU resource at all."""
    names = []
    for name, view in sorted(snap.state.views().items()):
        if view.raw_topology is not None or view.sharing.shared or _allocatable(snap, name) > 0:
            names.append(name)
    return names


def node_row(snap: Snapshot, selector: Selector, name: str) -> NodeRow:
    view = _view(snap, name)
    topology = _topology(view)
    health = node_health(snap, view)
    compiled = view.compiled
    rings: tuple[tuple[int, float | None], ...] = ()
    whole: tuple[tuple[int, int], ...] = ()
    free = None
    if compiled is not None and health.status is not Status.SHARED:
        healthy = compiled.full_mask & ~view.unhealthy
        free = view.free.bit_count()
        rings = tuple((size, _best(selector, compiled, view.free, size).ring_gbps) for size in SIZES
                      if size <= compiled.size)
        whole = tuple((size, full_sets(selector, compiled, view.free, healthy, size)) for size in SIZES
                      if size <= healthy.bit_count())
    return NodeRow(name, topology.gpus[0].model if topology else None,
                   topology.size if topology else _allocatable(snap, name), free, view.unhealthy.bit_count(),
                   rings, whole, view.domain, health, view.observed, snap.state.dra.node_class(name).value)


def node_health(snap: Snapshot, view: NodeView) -> Health:
    """The extender's verdict on the node, with the codec's reason where it refused an annotation."""
    if view.sharing.shared:
        return Health(Status.SHARED, f"GPUs shared ({view.sharing.value}): placed by count, no ring")
    if view.refused is not None:
        return Health(Status.REFUSED, _refusal(snap, view))
    if view.compiled is None:
        return Health(Status.NO_TOPOLOGY, view.problem)
    if snap.state.is_stale(view, snap.now):
        stale_after = snap.state.stale_after
        reason = ("no GPU state reported" if view.observed is None
                  else f"GPU state is {snap.now - view.observed:.0f} s old (over {stale_after:g} s)")
        return Health(Status.STALE, reason)
    return Health(Status.OK)


def node_detail(snap: Snapshot, selector: Selector, name: str) -> NodeDetail:
    view = _view(snap, name)
    row = node_row(snap, selector, name)
    labels = (snap.nodes[name].get("metadata") or {}).get("labels") or {}
    label = labels.get(CLIQUE_LABEL)
    free_sets: tuple[FreeSet, ...] = ()
    compiled = view.compiled
    if compiled is not None and row.free is not None:
        healthy = compiled.full_mask & ~view.unhealthy
        free_sets = tuple(_free_set(selector, compiled, view.free, healthy, count)
                          for count in range(1, row.free + 1))
    holders = () if row.health.status is Status.REFUSED else _holders(snap, view)  # a refused report says nothing
    return NodeDetail(row, _topology(view), label if isinstance(label, str) else None, holders, free_sets)


def pod_report(snap: Snapshot, selector: Selector, pod: Mapping[str, Any]) -> PodReport:
    request = parse_pod(pod, snap.state.keys, snap.state.resource, snap.state.dra)
    events = tuple(_event_line(event) for event in snap.events)
    failed = next((event.message for event in reversed(events) if event.reason == "FailedScheduling"), None)
    node = (pod.get("spec") or {}).get("nodeName")
    wanted = request.request
    return PodReport(
        request.namespace, request.name, str((pod.get("status") or {}).get("phase") or ""), request.gpus,
        wanted.interconnect.value if wanted else None, request.required,
        wanted.min_ring_gbps if wanted and wanted.min_ring_gbps else None, request.problem, _group(snap, request),
        events, failed, _placement(snap, pod, request, node) if node else None,
        () if node else _closest(snap, selector, request))


def _view(snap: Snapshot, name: str) -> NodeView:
    view = snap.state.view(name)
    assert view is not None, f"node {name} was read into the snapshot"
    return view


def _topology(view: NodeView) -> Topology | None:
    """The node's board, also where its state annotation was refused (the topology itself was fine)."""
    if view.raw_topology is None:
        return None
    try:
        return decode_topology(view.raw_topology)
    except CodecError:
        return None


def _ids(topology: Topology) -> tuple[str, ...]:
    """GPU id per index, as the node's state names GPUs (extender/cache/cluster_state.py's NodeView.ids)."""
    return tuple(gpu.uuid or f"GPU{gpu.index}" for gpu in topology.gpus)


def _refusal(snap: Snapshot, view: NodeView) -> str:
    """The refused class, with the codec's own words on what is wrong."""
    annotations = (snap.nodes[view.name].get("metadata") or {}).get("annotations") or {}
    keys = snap.state.keys
    try:
        topology = decode_topology(str(annotations.get(keys.topology)))
        state = decode_state(str(annotations.get(keys.state)))
        check_state(state, _ids(topology), snap.now)
    except CodecError as error:
        return f"{view.problem}: {error}"
    return str(view.problem)


def _allocatable(snap: Snapshot, name: str) -> int:
    value = ((snap.nodes[name].get("status") or {}).get("allocatable") or {}).get(snap.state.resource)
    try:
        return parse_count(value)
    except ValueError:
        return 0


def _best(selector: Selector, compiled: CompiledTopology, free: int, count: int) -> FreeSet:
    """The best set of `count` among `free`; no GPUs when too few are free."""
    choice = selector.select(compiled, free, Request(count))
    if not isinstance(choice, Choice):
        return FreeSet(count, (), None, None, False)
    return FreeSet(count, choice.gpus, choice.ring_gbps, _level_name(choice.weakest), False)


def _free_set(selector: Selector, compiled: CompiledTopology, free: int, healthy: int, count: int) -> FreeSet:
    best = _best(selector, compiled, free, count)
    full = count > 1 and bool(best.gpus) and is_full(selector, compiled, mask_of(best.gpus), healthy)
    return FreeSet(count, best.gpus, best.ring_gbps, best.weakest, full)


def _level_name(level: Level | None) -> str | None:
    return None if level is None else level.name.replace("NVLINK", "NVLink")


def _pod_key(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata") or {}
    return f"{metadata.get('namespace') or 'default'}/{metadata.get('name') or ''}"


def _containers(pod: Mapping[str, Any], key: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The pod's per-container GPUs as the extender bound them; none when absent or malformed."""
    text = ((pod.get("metadata") or {}).get("annotations") or {}).get(key)
    try:
        return decode_containers(text) if isinstance(text, str) else ()
    except AssignmentError:
        return ()


def _holders(snap: Snapshot, view: NodeView) -> tuple[Holder, ...]:
    """Who holds each GPU: the kubelet's allocation as the agent reports it, then the extender's records the report
    does not show yet; the container from the pod's bind annotation where the kubelet delivered what was bound."""
    topology = _topology(view)
    if topology is None:
        return ()
    pods = {_pod_key(pod): pod for pod in snap.pods_on(view.name)}
    parts = {key: _containers(pod, snap.state.keys.containers) for key, pod in pods.items()}
    bound = {key: frozenset(gpu for _, ids in containers for gpu in ids) for key, containers in parts.items()}
    taken: dict[str, tuple[str | None, Source]] = {}
    for key, gpus in view.reported_pods.items():
        for gpu in gpus:
            taken[gpu] = (key, Source.KUBELET)
    for entry in snap.state.ledger.entries(view.name):
        if not entry.confirmed and not covered(view, entry):
            source = Source.PLANNED if entry.phase is Phase.PLANNED else Source.BOUND
            for gpu in entry.gpus:
                taken.setdefault(gpu, (entry.pod_key, source))
    for gpu in view.reported_used - taken.keys():
        taken[gpu] = (next((key for key, gpus in bound.items() if gpu in gpus), None), Source.REPORTED)
    holders = []
    for index, gpu in enumerate(_ids(topology)):
        key, source = taken.get(gpu, (None, None))
        holder = key
        delivered = view.reported_pods.get(key or "")
        if key in parts and (delivered is None or delivered == bound[key]):
            names = [name for name, ids in parts[key] if gpu in ids]
            holder = f"{key}/{','.join(names)}" if names else key
        holders.append(Holder(index, gpu, holder, source, bool(view.unhealthy >> index & 1)))
    return tuple(holders)


def _placement(snap: Snapshot, pod: Mapping[str, Any], request: PodRequest, node: str) -> Placement:
    keys = snap.state.keys
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    view = _view(snap, node)
    topology = _topology(view)
    index = {gpu: i for i, gpu in enumerate(_ids(topology))} if topology else {}
    chosen = annotations.get(keys.gpus)
    gpu_ids = tuple(gpu for gpu in chosen.split(",") if gpu) if isinstance(chosen, str) else ()
    containers = tuple(ContainerGpus(name, tuple(index[gpu] for gpu in ids if gpu in index))
                       for name, ids in _containers(pod, keys.containers))
    gpus = tuple(sorted(index[gpu] for gpu in gpu_ids if gpu in index))
    reported = view.reported_pods.get(request.key)
    delivered = tuple(sorted(index[gpu] for gpu in reported or () if gpu in index))
    health = node_health(snap, view)
    if not gpu_ids:
        delivery = Delivery.COUNT_ONLY
    elif reported is not None:
        delivery = Delivery.YES if reported == frozenset(gpu_ids) else Delivery.NO
    elif view.observed is None or health.status is Status.REFUSED:
        delivery = Delivery.UNKNOWN
    else:
        delivery = Delivery.NOT_REPORTED
    ring = ring_gbps(compile_topology(topology), gpus) if topology and gpus else None
    ring_text = annotations.get(keys.ring_bandwidth)
    return Placement(node, gpus, gpu_ids, containers, ring, ring_text if isinstance(ring_text, str) else None,
                     isinstance(annotations.get(keys.seal), str), delivery, delivered, health)


def _closest(snap: Snapshot, selector: Selector, request: PodRequest) -> tuple[Offer, ...]:
    """The usable nodes nearest to holding the pod: those whose sets meet its constraints first, then those
    with enough free GPUs, then by the best ring they could give it, then by free GPUs."""
    if request.gpus == 0:
        return ()
    wanted = request.request or Request(request.gpus)
    offers = []
    for name, view in snap.state.views().items():
        compiled = view.compiled
        if compiled is None or request.gpus > compiled.size or node_health(snap, view).status is not Status.OK:
            continue
        best = _free_set(selector, compiled, view.free, compiled.full_mask & ~view.unhealthy, request.gpus)
        own = selector.select(compiled, view.free, wanted)
        offers.append(Offer(name, view.free.bit_count(), compiled.size, best.gpus, best.ring_gbps, best.weakest,
                            best.full, isinstance(own, Choice), None if isinstance(own, Choice) else own.message))
    offers.sort(key=lambda offer: (not offer.fits, not offer.gpus, -(offer.ring_gbps or 0), -offer.free,
                                   offer.node))
    return tuple(offers[:CLOSEST])


def _group(snap: Snapshot, request: PodRequest) -> Group | None:
    group = request.group
    if group is None:
        return None
    members = []
    for pod in snap.pods:
        other = parse_pod(pod, snap.state.keys, snap.state.resource, snap.state.dra)
        if other.group is not None and other.group.key(other.namespace) == group.key(request.namespace):
            members.append(Member(other.key, (pod.get("spec") or {}).get("nodeName")))
    return Group(group.name, group.source.value, group.size, group.span, group.required,
                 tuple(sorted(members, key=lambda member: member.pod)))


def _event_line(event: Mapping[str, Any]) -> EventLine:
    source = event.get("source") or {}
    count = event.get("count")
    return EventLine(str(event.get("type") or ""), str(event.get("reason") or ""),
                     str(source.get("component") or event.get("reportingComponent") or ""),
                     count if isinstance(count, int) else 1, str(event.get("message") or "").replace("\n", " "),
                     str(event.get("lastTimestamp") or event.get("eventTime") or ""))


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def to_json(kind: str, value: Any) -> str:
    """The -o json form, keyed in camelCase as Kubernetes objects are: a value's `as_dict` where it has one, else
    its fields."""
    document = {"kind": kind, **(value if isinstance(value, dict) else _fields(value))}
    return orjson.dumps(document, default=_fields,
                        option=orjson.OPT_INDENT_2 | orjson.OPT_PASSTHROUGH_DATACLASS).decode()


def _fields(value: Any) -> Any:
    if hasattr(value, "as_dict"):
        return value.as_dict()
    if is_dataclass(value) and not isinstance(value, type):
        return {_camel(field.name): getattr(value, field.name) for field in fields(value)}
    raise TypeError(f"{type(value).__name__} is not JSON")


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.capitalize() for part in rest)
