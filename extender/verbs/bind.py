"""bind: choose the GPUs, reserve them, and bind the pod with its assignment in one write (DESIGN §7).

The pod comes from the watch, or from the API when the watch has not delivered it yet, never from a request
body. The choice and the reservation happen under the ledger lock, so two binds never take the same GPU;
the API call happens outside it. The Binding carries the pod's UID and our annotations (each container's
GPUs and their seal), which the API server applies in the same atomic write that sets the node, so a pod
recreated under the same name is refused (409) and never annotated, and no pod is left annotated but
unbound.

A refusal releases the reservation. A lost answer (no reply, a timeout, a 5xx) does not: the Binding may
have committed, so the GPUs stay reserved until the watch shows where the pod went, or a GET after a
conflict does, or the wait runs out with the pod still unbound. A retried bind for a pod we already bound
to that node succeeds without a second assignment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from extender.api.pod_request import PodRequest, parse_pod
from extender.api.wire import BindingArgs
from extender.cache.assignments import Assignment, Phase
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import NodeView, allocator_pick, first_fit
from extender.groups.plans import GroupPlans
from extender.kube.client import Conflict, KubeApi, KubeError
from extender.verbs.filter import STALE
from topology.assignment import encode_containers
from topology.select import Choice, Request, Selector, mask_of
from topology.sharing import Sharing, no_guarantee
from topology.containers import device_count, split

log = logging.getLogger(__name__)


class BindError(Exception):
    """The bind cannot go ahead; the message goes back to kube-scheduler as `Error`."""


class WouldRead(Exception):
    """begin_bind without the API: the bind needs a read from it before its Binding, so it belongs on a thread."""


@dataclass(frozen=True, slots=True)
class Bound:
    gpus: tuple[str, ...]
    ring_gbps: float | None
    repeated: bool  # the pod was already bound here; nothing new was assigned
    mispredicted: bool = False  # on a DRA node, its claims were given other GPUs than the first fit we judged by


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs reserved for a pod (BINDING in the ledger) and the annotations its Binding carries."""

    assignment: Assignment
    gpus: tuple[str, ...]  # in index order
    annotations: dict[str, str]
    ring_gbps: float | None
    mispredicted: bool = False  # see Bound


def begin_bind(state: ClusterState, plans: GroupPlans, selector: Selector, kube: KubeApi | None, args: BindingArgs,
               held: int = 0) -> Bound | Reservation:
    """Everything before the Binding: the pod's reservation, or its answer when nothing is left to post.
    `held`: GPUs of the node drained for other pods (extender/verbs/drains.py), which this pod may not take. Without
    `kube` it never waits on the API server: where it would read from it, it raises WouldRead first, having
    changed nothing. A Reservation goes on to post_binding, or to the API from the event loop and then
    finish_bind."""
    pod = _read_pod(state, kube, args)
    if pod.request is None:  # no GPU at all: a pod sent here for its DRA claims, all of other devices
        if kube is None:
            raise WouldRead(f"pod {pod.key} asks for no GPU")
        return _bind_plain(kube, pod, args)
    view = state.view(args.node)
    existing = state.ledger.get(args.pod_uid)
    if view is not None and view.sharing.shared and existing is None:
        if kube is None:
            raise WouldRead(f"node {args.node} shares its GPUs")
        return _bind_shared(kube, pod, args, view.sharing)
    if existing is not None and existing.phase is Phase.UNCERTAIN and existing.node != args.node:
        if kube is None:
            raise WouldRead(f"the outcome of pod {pod.key}'s Binding to {existing.node} is unknown")
        _settle_elsewhere(state, kube, args, existing)
    return _reserve(state, plans, selector, pod, args, held)


def post_binding(state: ClusterState, kube: KubeApi, args: BindingArgs, reservation: Reservation) -> Bound:
    """The reservation's Binding posted on this thread, and its outcome settled."""
    try:
        kube.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node, reservation.annotations)
    except BaseException as error:
        return finish_bind(state, kube, args, reservation, error)
    return finish_bind(state, kube, args, reservation, None)


def finish_bind(state: ClusterState, kube: KubeApi, args: BindingArgs, reservation: Reservation,
                error: BaseException | None) -> Bound:
    """Settle the reservation by what its Binding's POST raised (None: accepted). Only a Conflict reads from the
    API server (was the Binding ours, its answer lost?): `needs_read` tells a caller on the event loop."""
    key = reservation.assignment.pod_key
    if error is None:
        state.ledger.bound(reservation.assignment)
        return Bound(reservation.gpus, reservation.ring_gbps, repeated=False, mispredicted=reservation.mispredicted)
    if isinstance(error, Conflict):
        if _ours_committed(state, kube, args, reservation):
            return Bound(reservation.gpus, reservation.ring_gbps, repeated=True)
        raise BindError(f"binding {key} to {args.node} conflicted: {error}") from None
    if isinstance(error, KubeError):
        if error.status is None or error.status >= 500:
            state.ledger.uncertain(args.pod_uid)
            raise BindError(f"binding {key} to {args.node}: {error}; the outcome is unknown, so its GPUs stay "
                            "reserved until the watch shows it") from None
        state.ledger.release(args.pod_uid, freed=False)
        raise BindError(f"binding {key} to {args.node} failed: {error}") from None
    state.ledger.uncertain(args.pod_uid)
    raise error


def needs_read(error: BaseException | None) -> bool:
    """finish_bind would read from the API server for this outcome, so it belongs on a thread."""
    return isinstance(error, Conflict)


def _bind_shared(kube: KubeApi, pod: PodRequest, args: BindingArgs, sharing: Sharing) -> Bound:
    """A node that shares its GPUs: a plain Binding, as kube-scheduler would make. The kubelet and the device
    plugin give out replicas or slices there, so no GPUs are chosen, reserved or annotated: the ledger never
    turns a replica into a whole GPU."""
    if pod.requires_topology:
        raise BindError(f"node {args.node}: {no_guarantee(sharing)}")
    return _bind_plain(kube, pod, args)


def _bind_plain(kube: KubeApi, pod: PodRequest, args: BindingArgs) -> Bound:
    """A Binding with no GPU of ours, as kube-scheduler's own binder would post it."""
    try:
        kube.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node, {})
    except Conflict as error:
        try:
            current = kube.get_pod(args.pod_namespace, args.pod_name)
        except KubeError:
            raise BindError(f"binding {pod.key} to {args.node} conflicted: {error}") from None
        if _bound_here(current, args):
            return Bound((), None, repeated=True)  # an earlier Binding of ours whose answer was lost
        raise BindError(f"binding {pod.key} to {args.node} conflicted: {error}") from None
    except KubeError as error:
        raise BindError(f"binding {pod.key} to {args.node} failed: {error}") from None
    return Bound((), None, repeated=False)


def _read_pod(state: ClusterState, kube: KubeApi | None, args: BindingArgs) -> PodRequest:
    record = state.pod(args.pod_uid)
    if record is not None:
        pod = record.request
    elif kube is None:
        raise WouldRead(f"pod {args.pod_namespace}/{args.pod_name} is not in the watch's cache yet")
    else:
        try:
            raw = kube.get_pod(args.pod_namespace, args.pod_name)
        except KubeError as error:
            raise BindError(f"cannot read pod {args.pod_namespace}/{args.pod_name}: {error}") from None
        if str((raw.get("metadata") or {}).get("uid") or "") != args.pod_uid:
            raise BindError(f"pod {args.pod_namespace}/{args.pod_name} is not the one being bound "
                            f"(UID {args.pod_uid}): it was deleted or recreated")
        pod = parse_pod(raw, state.keys, state.resource, state.dra)
    if pod.problem is not None:
        raise BindError(f"pod {pod.key}: {pod.problem}")
    return pod


def _reserve(state: ClusterState, plans: GroupPlans, selector: Selector, pod: PodRequest, args: BindingArgs,
             held: int) -> Reservation | Bound:
    """Reserve the best set on the node now, or find the pod's existing reservation there."""
    request = pod.request
    assert request is not None
    with state.ledger.lock:
        existing = state.ledger.get(args.pod_uid)
        view = state.view(args.node)
        if existing is not None:
            if existing.node != args.node:
                raise BindError(f"pod {pod.key} already holds GPUs on node {existing.node}")
            if existing.phase is Phase.BINDING:
                raise BindError(f"a bind of pod {pod.key} is already in progress")
            gpus = view.gpu_ids(view.mask(existing.gpus)) if view is not None else tuple(sorted(existing.gpus))
            if existing.phase is not Phase.UNCERTAIN:
                return Bound(gpus, None, repeated=True)
            # The last Binding's answer was lost: send it again with the same GPUs; a 409 then tells us.
            assert view is not None and view.compiled is not None
            return _reservation(state, plans, selector, pod, args, view, view.mask(existing.gpus))
        if view is None or view.compiled is None:
            raise BindError(f"node {args.node}: {view.problem if view else 'no GPU topology reported'}")
        if state.is_stale(view, state.clock()):
            raise BindError(f"node {args.node}: {STALE}")
        dra = view.dra_order is not None
        if not (dra or pod.containers):
            raise BindError(f"node {args.node} has no {state.resource} of the device plugin; pod {pod.key}'s "
                            "GPUs are asked by claims, which only a DRA node serves")
        # On a DRA node the pod's own claims were allocated at kube-scheduler's PreBind: those GPUs are its own.
        own = view.mask(state.dra.held_by(args.pod_uid, args.node)) if dra else 0
        planned = _planned(state, plans, pod, args, held, pod.gpus if dra else device_count(pod.containers), own)
        if dra:
            assert view.dra_order is not None
            chosen = own or (planned[1] if planned else first_fit(view.free & ~held, view.dra_order, pod.gpus))
            # What filter and prioritize judged the node by, for a pod whose claims no selector of its own narrows:
            # the first fit over what was free before its claims were allocated.
            judged = allocator_pick((view.free | own) & ~held, view.dra_pinned & ~own, view.dra_order, pod.gpus)
            mispredicted = bool(own) and not (pod.selected or pod.pinned) and own != judged
            return _dra_reservation(state, selector, pod, args, view, chosen, mispredicted)
        if planned is not None:
            return _reservation(state, plans, selector, pod, args, planned[0], planned[1])
        count = device_count(pod.containers)
        free = view.free & ~held
        choice = selector.select(view.compiled, free, replace(request, count=count))
        if not isinstance(choice, Choice) and not pod.required:
            choice = selector.select(view.compiled, free, Request(count))
        if not isinstance(choice, Choice):
            raise BindError(f"node {args.node}: {choice.message}")
        return _reservation(state, plans, selector, pod, args, view, mask_of(choice.gpus))


def _planned(state: ClusterState, plans: GroupPlans, pod: PodRequest, args: BindingArgs, held: int,
             count: int, own: int = 0) -> tuple[NodeView, int] | None:
    """The GPUs the pod's group plan keeps for it on this node (claimed now), or None when no plan is in force.

    Called under the ledger lock. The claim turns the slot's PLANNED entry into room for this pod's own
    reservation; GPUs that someone else holds meanwhile void the plan (its members are planned again)."""
    group = pod.group_key
    if group is None or plans.get(group) is None:
        return None
    slot = plans.claim(group, args.pod_uid, args.node, state.clock())
    if slot is None:
        raise BindError(f"node {args.node} has no place in the plan of pod {pod.key}'s group")
    view = state.view(args.node)
    assert view is not None
    if slot.gpus & ~((view.free | own) & ~held) or count != slot.gpus.bit_count():
        plans.drop(group)
        raise BindError(f"node {args.node}: the GPUs planned for pod {pod.key}'s group are no longer free; "
                        "its members are planned again")
    return view, slot.gpus


def _reservation(state: ClusterState, plans: GroupPlans, selector: Selector, pod: PodRequest, args: BindingArgs,
                 view: NodeView, chosen: int) -> Reservation:
    """The pod's one ask of the ledger: reserve the chosen GPUs on the node, with the annotations to post."""
    assert view.compiled is not None
    parts = split(selector, view.compiled, chosen, pod.containers)
    ids = view.gpu_ids(chosen)
    gpus = ",".join(ids)
    containers = encode_containers([(part.need.name, view.gpu_ids(part.gpus)) for part in parts])
    ring = _ring_of(selector, view, chosen)
    annotations = {state.keys.gpus: gpus, state.keys.containers: containers,
                   state.keys.seal: state.seal.sign(args.pod_uid, args.node, gpus, containers)}
    plan = plans.sealed(pod.group_key, args.pod_uid, args.node) if pod.group_key is not None else None
    if plan is not None:
        annotations[state.keys.group_plan] = plan
    if ring is not None:
        annotations[state.keys.ring_bandwidth] = f"{ring:g}"
    assignment = state.ledger.reserve(args.pod_uid, pod.key, args.node, frozenset(ids))
    return Reservation(assignment, ids, annotations, ring)


def _dra_reservation(state: ClusterState, selector: Selector, pod: PodRequest, args: BindingArgs, view: NodeView,
                     chosen: int, mispredicted: bool) -> Reservation:
    """On a DRA node kube-scheduler's allocator has chosen the GPUs and written them to the pod's claims before
    this bind (its PreBind): the Binding carries no GPU of ours, and the ledger holds `chosen`: the claims' GPUs
    when they are seen already, else the set its first fit gives (a group's plan foresaw it the same way), until
    the claims count the pod (extender/cache/dra_inventory.py)."""
    ids = view.gpu_ids(chosen)
    assignment = state.ledger.reserve(args.pod_uid, pod.key, args.node, frozenset(ids))
    return Reservation(assignment, ids, {}, _ring_of(selector, view, chosen) if chosen.bit_count() > 1 else None,
                       mispredicted)


def _ring_of(selector: Selector, view: NodeView, gpus: int) -> float | None:
    assert view.compiled is not None
    choice = selector.select(view.compiled, gpus, Request(gpus.bit_count()))
    return choice.ring_gbps if isinstance(choice, Choice) else None


def _ours_committed(state: ClusterState, kube: KubeApi, args: BindingArgs, reservation: Reservation) -> bool:
    """After a 409: is the pod bound here with our assignment (an earlier Binding whose answer was lost)?"""
    try:
        pod = kube.get_pod(args.pod_namespace, args.pod_name)
    except KubeError as error:
        log.warning("bind %s/%s: cannot read the pod after a conflict (%s); its GPUs stay reserved until the "
                    "watch tells", args.pod_namespace, args.pod_name, error)
        state.ledger.uncertain(args.pod_uid)
        return False
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    key = state.keys.containers
    if _bound_here(pod, args) and annotations.get(key) == reservation.annotations.get(key):
        state.ledger.bound(reservation.assignment)
        return True
    state.ledger.release(args.pod_uid, freed=False)
    return False


def _bound_here(pod: dict[str, Any], args: BindingArgs) -> bool:
    """The pod as the API server holds it is this one (same UID) and assigned to this node."""
    metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    return metadata.get("uid") == args.pod_uid and spec.get("nodeName") == args.node


def _settle_elsewhere(state: ClusterState, kube: KubeApi, args: BindingArgs, uncertain: Assignment) -> None:
    """kube-scheduler retries a pod on another node while an earlier Binding's outcome is unknown: read it."""
    try:
        pod = kube.get_pod(args.pod_namespace, args.pod_name)
    except KubeError as error:
        raise BindError(f"pod {args.pod_namespace}/{args.pod_name}: the outcome of its Binding to {uncertain.node} "
                        f"is unknown and the pod cannot be read: {error}") from None
    node = (pod.get("spec") or {}).get("nodeName")
    if (pod.get("metadata") or {}).get("uid") == args.pod_uid and node:
        if node == uncertain.node:
            state.ledger.bound(uncertain)
        raise BindError(f"pod {args.pod_namespace}/{args.pod_name} is already bound to {node}")
    state.ledger.release(args.pod_uid, freed=False)
