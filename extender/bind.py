"""bind: choose the GPUs, reserve them, annotate the pod, then create the Binding (DESIGN §7).

The choice and the reservation happen under the ledger lock, so two binds never take the same GPU; the API
calls happen outside it. Any failure rolls the reservation back and becomes an `Error` for kube-scheduler.
A retried bind for a pod we already bound to that node succeeds without a second assignment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from extender.filter import STALE
from extender.kube import Conflict, KubeApi, KubeError
from extender.ledger import Assignment, Phase
from extender.pod_request import PodRequest
from extender.state import ClusterState
from extender.wire import BindingArgs
from topology.select import Choice, Request, Selector

log = logging.getLogger(__name__)


class BindError(Exception):
    """The bind cannot go ahead; the message goes back to kube-scheduler as `Error`."""


@dataclass(frozen=True, slots=True)
class Bound:
    gpus: tuple[str, ...]
    ring_gbps: float | None
    repeated: bool  # the pod was already bound here; nothing new was assigned


def bind_pod(state: ClusterState, selector: Selector, kube: KubeApi, pod: PodRequest | None,
             args: BindingArgs) -> Bound:
    if pod is None or pod.request is None:
        raise BindError(f"pod {args.pod_namespace}/{args.pod_name} requests no GPU that this extender has seen")
    assignment, choice = _reserve(state, selector, pod, args)
    gpus = _in_index_order(state, assignment)
    if choice is None:
        return Bound(gpus, None, repeated=True)
    annotations = {state.keys.gpus: ",".join(gpus),
                   state.keys.ring_bandwidth: None if choice.ring_gbps is None else f"{choice.ring_gbps:g}"}
    try:
        kube.patch_pod_annotations(args.pod_namespace, args.pod_name, annotations)
        kube.bind(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
    except Conflict as error:
        record = state.pod(args.pod_uid)
        if record is not None and record.node == args.node:
            state.record(replace(assignment, phase=Phase.BOUND))
            return Bound(gpus, choice.ring_gbps, repeated=True)
        state.release(args.pod_uid, freed=False)
        _withdraw(kube, args, state)
        raise BindError(f"binding {pod.key} to {args.node} conflicted: {error}") from None
    except KubeError as error:
        state.release(args.pod_uid, freed=False)
        raise BindError(f"binding {pod.key} to {args.node} failed: {error}") from None
    except Exception:
        state.release(args.pod_uid, freed=False)
        raise
    state.record(replace(assignment, phase=Phase.BOUND))
    return Bound(gpus, choice.ring_gbps, repeated=False)


def _withdraw(kube: KubeApi, args: BindingArgs, state: ClusterState) -> None:
    """Take our GPU annotations back off a pod that someone else bound; best effort."""
    try:
        kube.patch_pod_annotations(args.pod_namespace, args.pod_name,
                                   {state.keys.gpus: None, state.keys.ring_bandwidth: None})
    except KubeError as error:
        log.warning("could not withdraw the GPU annotations of %s/%s: %s", args.pod_namespace, args.pod_name, error)


def _reserve(state: ClusterState, selector: Selector, pod: PodRequest,
             args: BindingArgs) -> tuple[Assignment, Choice | None]:
    """Reserve the best set on the node now, or find the pod's existing reservation there."""
    request = pod.request
    assert request is not None
    with state.ledger.lock:
        existing = state.ledger.get(args.pod_uid)
        if existing is not None:
            if existing.node != args.node:
                raise BindError(f"pod {pod.key} already holds GPUs on node {existing.node}")
            if existing.phase is Phase.BOUND:
                return existing, None
            raise BindError(f"a bind of pod {pod.key} is already in progress")
        view = state.view(args.node)
        if view is None or view.compiled is None:
            raise BindError(f"node {args.node}: {view.problem if view else 'no GPU topology reported'}")
        if state.is_stale(view, state.clock()):
            raise BindError(f"node {args.node}: {STALE}")
        choice = selector.select(view.compiled, view.free, request)
        if not isinstance(choice, Choice) and not pod.required:
            choice = selector.select(view.compiled, view.free, Request(request.count))
        if not isinstance(choice, Choice):
            raise BindError(f"node {args.node}: {choice.message}")
        assignment = Assignment(args.pod_uid, pod.key, args.node, frozenset(view.gpu_ids(_mask(choice.gpus))),
                                state.clock(), Phase.BINDING)
        state.record(assignment)
        return assignment, choice


def _mask(gpus: tuple[int, ...]) -> int:
    return sum(1 << gpu for gpu in gpus)


def _in_index_order(state: ClusterState, assignment: Assignment) -> tuple[str, ...]:
    view = state.view(assignment.node)
    if view is None:
        return tuple(sorted(assignment.gpus))
    return view.gpu_ids(view.mask(assignment.gpus))
