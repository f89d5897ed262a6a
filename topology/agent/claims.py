"""Which pod a kubelet device-plugin call is for, and which GPUs to answer: pure, over plain values.

The kubelet's GetPreferredAllocation carries only (available ids, must_include ids, size) and Allocate only
ids, yet the extender chose each container's GPUs at bind (`gpu-topology.io/containers`). What ties a call
to its pod, with no lock on the node and exactly when several equal-size pods are bound at once, is how the
kubelet admits pods:

- one pod at a time, and the pod is in its pod manager before admission, so during the pod's calls the
  pod-resources `List` shows it with some GPU container still lacking devices (app containers and sidecars
  are listed, plain init containers are not); pods bound to the node but not yet reached are absent from
  List, and admitted pods have all their devices;
- inside the pod, container after container in the order of `topology/containers.py`; GetPreferredAllocation's
  size is the container's whole count, and must_include holds what the kubelet reuses from init containers.

So the candidates are the pods on this node that carry a valid assignment, are in List and are not complete;
the container asking is the pod's first GPU container not yet delivered whose count is the size. A plain
init container is delivered when the agent answered its Allocate (List never shows it), any other when List
shows its devices. A pod whose containers have started is past admission whatever List says.

No candidate means someone else asks (a static pod, another scheduler's pod, a forged or malformed
assignment): the answer is then our best set, away from the GPUs planned for the other pending pods, so
that a foreign pod cannot take what a bound pod will need. GetPreferredAllocation never fails: an error is
an admission failure, final for the pod (kubernetes #118559, NVIDIA/k8s-device-plugin #2038), so any
surprise, even a bug here, ends in the best set.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from itertools import islice
from typing import Any

from topology.agent.devices import GpuIds
from topology.annotations import AnnotationKeys
from topology.assignment import GPU_ID_MAX, AssignmentError, decode_containers
from topology.compiled import CompiledTopology, bits, compile_topology
from topology.containers import ContainerNeed, container_needs, device_count
from topology.model import Topology
from topology.select import Selector, extend_best, mask_of

log = logging.getLogger(__name__)

MAX_IDS = 256  # ids read from one container request; a node has far fewer GPUs
MAX_DELIVERED_PODS = 1024  # pods whose Allocate answers are remembered

# (namespace, pod name) -> container name -> the device ids of our resource that pod-resources List shows
Listed = Mapping[tuple[str, str], Mapping[str, tuple[str, ...]]]
# pod UID -> container name -> the ids the agent answered in that container's Allocate
Delivered = Mapping[str, Mapping[str, tuple[str, ...]]]


class Board:
    """This node's GPUs by the ids the plugin gives them (UUIDs, or GPU<index>), with what ranks their sets."""

    def __init__(self, topology: Topology, selector: Selector | None = None) -> None:
        self.ids: tuple[str, ...] = GpuIds(topology).ids
        self.index: dict[str, int] = {gpu: position for position, gpu in enumerate(self.ids)}
        self.compiled: CompiledTopology = compile_topology(topology)
        self.selector = selector if selector is not None else Selector()  # an empty one is falsy (its len)

    def ordered(self, ids: Iterable[str]) -> tuple[str, ...]:
        """Without repeats, this node's GPUs by index first, then any other id in the order given."""
        unique = list(dict.fromkeys(ids))
        return tuple(sorted((i for i in unique if i in self.index), key=self.index.__getitem__)) + tuple(
            i for i in unique if i not in self.index)


@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod bound to this node, as far as the claims need it.

    `plan` holds each GPU container's ids, aligned with `needs`, or is None when the pod carries no
    assignment that can be trusted (`problem` says why). An `ended` pod asks for nothing. A `started` pod
    (one of its containers ran, which the kubelet allows only after admission) asks only to get back what the
    kubelet lost, for the containers List shows without devices: its init containers are done."""

    namespace: str
    name: str
    uid: str
    created: str
    needs: tuple[ContainerNeed, ...]
    plan: tuple[tuple[str, ...], ...] | None
    problem: str = ""
    ended: bool = False
    started: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return self.namespace, self.name

    @property
    def gpus(self) -> frozenset[str]:
        return frozenset(gpu for part in self.plan or () for gpu in part)


@dataclass(frozen=True, slots=True)
class Preferred:
    """One container request of GetPreferredAllocation."""

    available: tuple[str, ...]
    must_include: tuple[str, ...]
    size: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """One container request of Allocate."""

    ids: tuple[str, ...]


class Outcome(str, Enum):
    PLANNED = "planned"  # the container's plan, as bound (Allocate: the ids are the plan)
    ADJUSTED = "adjusted"  # the plan could not be honoured whole (Allocate: other ids than planned)
    FOREIGN = "foreign"  # no pod of ours asks: our best set, away from the other pods' plans
    BLIND = "blind"  # the pods or pod-resources could not be read, or the call made no sense: our best set
    REFUSED = "refused"  # Allocate of ids that are not GPUs of this node


@dataclass(frozen=True, slots=True)
class Decision:
    ids: tuple[str, ...]  # the answer: preferred ids, or the ids Allocate delivers
    outcome: Outcome
    pod: PodOnNode | None = None
    container: str | None = None
    planned: tuple[str, ...] = ()
    rivals: int = 0  # other candidate pods it was chosen among: more than 0 is an ambiguity
    reason: str = ""

    @property
    def who(self) -> str:
        return f"{self.pod.namespace}/{self.pod.name} ({self.container})" if self.pod else "a pod without assignment"


def read_pod(obj: Any, keys: AnnotationKeys, resource: str, gpus: Iterable[str]) -> PodOnNode | None:
    """A pod of the API as the claims see it; None when it is no pod or asks for no GPU of `resource`.

    The assignment is trusted only when it is the pod's own shape on this node: every GPU container once
    with its count, every id a GPU of this node (`gpus`), as many distinct GPUs as the kubelet will give,
    and the same set as the `gpus` annotation when there is one. Anything else is someone else's pod."""
    if not isinstance(obj, Mapping):
        return None
    meta = obj.get("metadata")
    spec = obj.get("spec")
    if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
        return None
    namespace, name = meta.get("namespace"), meta.get("name")
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    pod = PodOnNode(namespace, name, str(meta.get("uid") or ""), str(meta.get("creationTimestamp") or ""), (),
                    None, ended=status.get("phase") in ("Succeeded", "Failed"), started=_started(status))
    try:
        needs = container_needs(spec, resource)
    except ValueError as error:
        return replace(pod, problem=f"its {resource} requests: {error}")
    if not needs:
        return None
    pod = replace(pod, needs=needs)
    annotations = meta.get("annotations")
    annotations = annotations if isinstance(annotations, Mapping) else {}
    text = annotations.get(keys.containers)
    if text is None:
        return replace(pod, problem="no assignment")
    try:
        parts = dict(decode_containers(text))
    except AssignmentError as error:
        return replace(pod, problem=f"{keys.containers}: {error}")
    problem = _shape_problem(parts, needs, frozenset(gpus), annotations.get(keys.gpus))
    if problem:
        return replace(pod, problem=f"{keys.containers}: {problem}")
    return replace(pod, plan=tuple(parts[need.name] for need in needs))


def _shape_problem(parts: dict[str, tuple[str, ...]], needs: tuple[ContainerNeed, ...], gpus: frozenset[str],
                   listed_gpus: object) -> str:
    names = [need.name for need in needs]
    if sorted(parts) != sorted(names):
        return f"names containers {sorted(parts)}, the pod's GPU containers are {sorted(names)}"
    for need in needs:
        if len(parts[need.name]) != need.count:
            return f"container {need.name} gets {len(parts[need.name])} GPUs, it asks for {need.count}"
    union = {gpu for part in parts.values() for gpu in part}
    strangers = sorted(union - gpus)
    if strangers:
        return f"{strangers[0]} is not a GPU of this node"
    if len(union) != device_count(needs):
        return f"{len(union)} distinct GPUs, the kubelet gives the pod {device_count(needs)}"
    if listed_gpus is not None and (not isinstance(listed_gpus, str) or set(listed_gpus.split(",")) != union):
        return "differs from the pod's gpus annotation"
    return ""


def _started(status: Mapping[str, Any]) -> bool:
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or ():
            if not isinstance(container, Mapping):
                continue
            for state_key in ("state", "lastState"):
                state = container.get(state_key)
                if isinstance(state, Mapping) and (state.get("running") or state.get("terminated")):
                    return True
    return False


def identify(request: Preferred | Allocation, pods: Sequence[PodOnNode] | None, listed: Listed | None,
             delivered: Delivered, board: Board) -> Decision:
    """The pod and container a call is for, and the answer. `pods` is None when the API server could not be
    read, `listed` when pod-resources could not. Never raises."""
    try:
        return _identify(request, pods, listed, delivered, board)
    except Exception as error:  # the answer must never fail, not even on a bug here
        log.exception("identifying a device plugin call failed")
        return _blind(request, board, f"internal error: {type(error).__name__}: {error}")


@dataclass(frozen=True, slots=True)
class _Ask:
    size: int
    must: tuple[str, ...]
    available: tuple[str, ...]  # for Allocate, the ids themselves


@dataclass(frozen=True, slots=True)
class _Claim:
    pod: PodOnNode
    container: str
    planned: tuple[str, ...]
    answered_before: bool  # the agent delivered to this pod already
    fits: bool  # the plan lies within what the kubelet offers


def _identify(request: Preferred | Allocation, pods: Sequence[PodOnNode] | None, listed: Listed | None,
              delivered: Delivered, board: Board) -> Decision:
    if isinstance(request, Allocation):
        ids = _allocation_ids(request, board)
        if isinstance(ids, str):
            return Decision((), Outcome.REFUSED, reason=ids)
        ask = _Ask(len(ids), (), ids)
    else:
        ask = _Ask(request.size if isinstance(request.size, int) else 0, _clean(request.must_include),
                   _clean(request.available))
    if pods is None or listed is None:
        reserved = _pending(pods or (), listed, delivered, None)
        return _answer(request, ask, board, reserved, Decision((), Outcome.BLIND, reason="cannot see " + (
            "the pods on this node" if pods is None else "pod-resources")))
    claims = [claim for pod in pods if (claim := _claim(pod, listed, delivered, ask)) is not None]
    if not claims:
        foreign = [pod for pod in pods if pod.plan is None and not pod.ended and pod.key in listed
                   and not all(_done(pod, need, listed[pod.key], delivered) for need in pod.needs)]
        why = (f"{foreign[0].namespace}/{foreign[0].name} asks: {foreign[0].problem}" if len(foreign) == 1
               else "no pod with an assignment asks")
        return _answer(request, ask, board, _pending(pods, listed, delivered, None),
                       Decision((), Outcome.FOREIGN, reason=why))
    claims.sort(key=lambda c: (not c.answered_before, not c.fits, c.pod.created, c.pod.namespace, c.pod.name))
    chosen = claims[0]
    decision = Decision((), Outcome.PLANNED, chosen.pod, chosen.container, chosen.planned, len(claims) - 1,
                        "" if len(claims) == 1 else "chosen among " + ", ".join(
                            f"{c.pod.namespace}/{c.pod.name}" for c in claims))
    return _answer(request, ask, board, _pending(pods, listed, delivered, chosen.pod), decision)


def _claim(pod: PodOnNode, listed: Listed, delivered: Delivered, ask: _Ask) -> _Claim | None:
    """The pod's container that would be asking, if the pod is a candidate."""
    containers = listed.get(pod.key)
    if pod.plan is None or pod.ended or containers is None or not set(ask.must) <= pod.gpus:
        return None
    answered = delivered.get(pod.uid) or {}
    for need, planned in zip(pod.needs, pod.plan, strict=True):
        if not _done(pod, need, containers, delivered) and need.count == ask.size:
            again = answered.get(need.name)
            planned = again if again is not None and len(again) == ask.size else planned
            offered = set(ask.available) | set(ask.must)
            return _Claim(pod, need.name, planned, bool(answered), set(planned) <= offered)
    return None


def _done(pod: PodOnNode, need: ContainerNeed, containers: Mapping[str, tuple[str, ...]],
          delivered: Delivered) -> bool:
    """List shows a container's devices once the kubelet has them; a container it does not show (a plain init
    container, or any container of a kubelet that lists only allocated ones) is done once answered, or once
    the pod has started."""
    shown = containers.get(need.name)
    if shown is None:
        return pod.started or need.name in (delivered.get(pod.uid) or {})
    return bool(shown)


def _pending(pods: Sequence[PodOnNode], listed: Listed | None, delivered: Delivered,
             asking: PodOnNode | None) -> frozenset[str]:
    """GPUs planned for containers of other pods that have not got them yet."""
    reserved: set[str] = set()
    for pod in pods:
        if pod.plan is None or pod.ended or pod is asking:
            continue
        containers = listed.get(pod.key) if listed is not None else None
        if containers is None and pod.started:
            continue  # past admission: what it holds is allocated, or was freed
        for need, planned in zip(pod.needs, pod.plan, strict=True):
            if containers is None or not _done(pod, need, containers, delivered):
                reserved.update(planned)
    return frozenset(reserved)


def _answer(request: Preferred | Allocation, ask: _Ask, board: Board, reserved: frozenset[str],
            decision: Decision) -> Decision:
    if isinstance(request, Allocation):
        ids = board.ordered(ask.available)
        if decision.pod is not None and set(ids) != set(decision.planned):
            return _with(decision, ids, Outcome.ADJUSTED, f"the kubelet allocates {','.join(ids)}, the plan is "
                                                          f"{','.join(decision.planned)}")
        return _with(decision, ids, decision.outcome, decision.reason)
    if decision.pod is None:
        return _with(decision, best_set(board, ask.available, ask.must, ask.size, reserved), decision.outcome,
                     decision.reason)
    planned = decision.planned
    offered = set(ask.available) | set(ask.must)
    if len(planned) == ask.size and set(ask.must) <= set(planned) <= offered:
        return _with(decision, board.ordered(planned), Outcome.PLANNED, decision.reason)
    kept = [gpu for gpu in planned if gpu in offered and gpu not in ask.must]
    base = list(ask.must) + kept[:max(0, ask.size - len(ask.must))]
    missing = sorted(set(planned) - offered)
    why = (f"planned {','.join(missing)} not offered" if missing else "the kubelet reuses other init GPUs")
    return _with(decision, best_set(board, ask.available, base, ask.size, reserved), Outcome.ADJUSTED,
                 "; ".join(filter(None, (why, decision.reason))))


def _with(decision: Decision, ids: tuple[str, ...], outcome: Outcome, reason: str) -> Decision:
    return replace(decision, ids=ids, outcome=outcome, reason=reason)


def _blind(request: Preferred | Allocation, board: Board, reason: str) -> Decision:
    """The answer when nothing else can be trusted, made with as little as possible that could fail."""
    if isinstance(request, Allocation):
        ids = _allocation_ids(request, board)
        if isinstance(ids, str):
            return Decision((), Outcome.REFUSED, reason=ids)
        return Decision(ids, Outcome.BLIND, reason=reason)
    must, available = _safe_clean(request.must_include), _safe_clean(request.available)
    size = request.size if isinstance(request.size, int) else 0
    try:
        ids = best_set(board, available, must, size, frozenset())
    except Exception:  # the last resort: the kubelet's own ids, as many as asked
        ids = tuple(dict.fromkeys(must + available))[:max(size, 0)]
    return Decision(ids, Outcome.BLIND, reason=reason)


def best_set(board: Board, available: Sequence[str], must: Sequence[str], size: int,
             reserved: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Our best `size` ids: all of `must`, then the GPUs of `available` that make the best ring with them,
    away from `reserved` where enough others are free; everything offered when that is fewer than `size`."""
    must = list(dict.fromkeys(must))
    if size <= len(must):
        return board.ordered(must[:max(size, 0)])
    extra = size - len(must)
    offered = [gpu for gpu in dict.fromkeys(available) if gpu not in must]
    known = [gpu for gpu in offered if gpu in board.index]
    free = [gpu for gpu in known if gpu not in reserved]
    if len(known) < extra:
        strangers = [gpu for gpu in offered if gpu not in board.index]
        return board.ordered(must + known + strangers[:extra - len(known)])
    if len(free) < extra:  # all the free ones, then as few reserved ones as can be
        must, extra = must + free, extra - len(free)
        free = [gpu for gpu in known if gpu in reserved]
    added = extend_best(board.selector, board.compiled, mask_of(board.index[g] for g in must if g in board.index),
                        mask_of(board.index[g] for g in free), extra)
    return board.ordered(must + [board.ids[i] for i in bits(added)])


def remember(delivered: Delivered, decision: Decision,
             pods: Sequence[PodOnNode] | None) -> dict[str, dict[str, tuple[str, ...]]]:
    """The record of answered Allocates after `decision`: its container's ids added; pods no longer on the
    node forgotten (when the pods could be read), and at most MAX_DELIVERED_PODS pods kept, the oldest
    dropped first."""
    record = {uid: dict(containers) for uid, containers in delivered.items()}
    if pods is not None:
        present = {pod.uid for pod in pods}
        record = {uid: containers for uid, containers in record.items() if uid in present}
    pod, container = decision.pod, decision.container
    if pod is not None and container is not None and decision.outcome is not Outcome.REFUSED:
        containers = record.pop(pod.uid, {})
        containers[container] = decision.ids
        record[pod.uid] = containers
    while len(record) > MAX_DELIVERED_PODS:
        del record[next(iter(record))]
    return record


def _allocation_ids(request: Allocation, board: Board) -> tuple[str, ...] | str:
    """Allocate's ids without repeats, or why they cannot be delivered: a container cannot get a GPU this
    node does not have."""
    ids = tuple(islice(request.ids, MAX_IDS + 1))
    if not ids:
        return "no device ids"
    if len(ids) > MAX_IDS:
        return f"more than {MAX_IDS} device ids"
    for gpu in ids:
        if not isinstance(gpu, str) or gpu not in board.index:
            return f"device {str(gpu)[:80]!r} is not a GPU of this node"
    return tuple(dict.fromkeys(ids))


def _clean(ids: Iterable[Any]) -> tuple[str, ...]:
    """Ids as a tuple without repeats, bounded: no more than MAX_IDS, none that could not be a GPU id."""
    return tuple(dict.fromkeys(
        gpu for gpu in islice(ids, MAX_IDS) if isinstance(gpu, str) and 0 < len(gpu) <= GPU_ID_MAX))


def _safe_clean(ids: Any) -> tuple[str, ...]:
    try:
        return _clean(ids)
    except Exception:
        return ()

