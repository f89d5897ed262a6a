"""The extender's one object: state, selector, Kubernetes client and metrics, with one method per verb.

Handlers in `app.py` parse, call one of these, and serialize; everything here is free of HTTP.

With leader election, only the leader binds, so two replicas never hand out the same GPU. A replica that
starts leading first rebuilds its ledger: it lists the pods afresh (a consistent read, holding every bind its
predecessor made, which stopped binding before this replica could win) and binds, and `leads()`, only once that
list is in the ledger. Readiness is no leadership test: a standby with synced caches is ready to take over, so
rollouts and drains can proceed; the leader's label on its own Pod (extender/kube/leader_label.py) routes the
Service to it alone.

Observing (`--observe`), to weigh the extender before it decides: prioritize scores as usual; filter passes every
candidate and counts what it would have refused (decisions_total{verb="filter",outcome="observed-refusal"});
preempt keeps every node kube-scheduler offers; bind is kube-scheduler's own binder's, and one sent here anyway is
refused. Nothing is reserved or held: no group plan, drain or shortlist, so group members are judged as single pods.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from functools import partial
from random import Random
from typing import Any, Protocol

from extender.api.pod_request import PodRequest, parse_pod
from extender.api.preferences import tolerates
from extender.api.wire import BindingArgs, ExtenderArgs, PreemptionArgs, Victims
from extender.cache.assignments import Assignment
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import NodeKey
from extender.groups.plans import GROUP_TIMEOUT_SECONDS, GroupPlans
from extender.kube.binding_writer import StaleConnection
from extender.kube.client import KubeApi
from extender.verbs.answer_memo import ShapeMemo, Unknown
from extender.verbs.bind import (
    BindError,
    Bound,
    Reservation,
    WouldRead,
    begin_bind,
    finish_bind,
    needs_read,
    post_binding,
)
from extender.verbs.drains import Drains, ends_by
from extender.verbs.filter import FilterOutcome, filter_nodes
from extender.verbs.group_placement import GROUP_AGE_BOUND_SECONDS, GroupPlacement
from extender.verbs.metrics import Metrics
from extender.verbs.preempt import preempt_nodes
from extender.verbs.scoring import prioritize_nodes
from extender.verbs.scoring.grade import Grade
from extender.verbs.scoring.shortlist import OUTRANKED, SHORTLIST, Shortlists
from extender.verbs.wait import TOPOLOGY_WAIT_SECONDS, WAITING, WaitClock
from topology.collectives import COMM_SHARE
from topology.select import Selector

log = logging.getLogger(__name__)

_POD_CACHE_SIZE = 4096
OBSERVED_REFUSAL = "observed-refusal"
OBSERVED_DROP = "observed-dropped"
OBSERVE_ONLY = "observe-only"
_EVENT_QUEUE_SIZE = 1024


class Leadership(Protocol):
    """The leader election, as the service sees it (`extender.kube.leader_election.LeaderElector`)."""

    identity: str

    def term(self) -> int | None: ...  # the current term while leading, else None

    def on_new_term(self, listener: Callable[[int], None]) -> None: ...


class Relister(Protocol):
    """The pod reflector, as the service sees it: a fresh list on demand (`extender.kube.reflector.Reflector`)."""

    def relist(self) -> int: ...

    def listed(self, ticket: int) -> bool: ...


def _version(pod: Mapping[str, Any]) -> tuple[str, str]:
    """(uid, resourceVersion): what names one version of a pod."""
    metadata = pod.get("metadata") or {}
    return str(metadata.get("uid") or ""), str(metadata.get("resourceVersion") or "")


def _pass_on(answer: asyncio.Future[str], done: asyncio.Future[str]) -> None:
    if answer.done():
        return
    if done.cancelled():
        answer.cancel()
    elif (error := done.exception()) is not None:
        answer.set_exception(error)
    else:
        answer.set_result(done.result())


class ExtenderService:
    def __init__(self, state: ClusterState, kube: KubeApi, selector: Selector | None = None, *,
                 leader: Leadership | None = None, pods: Relister | None = None,
                 topology_wait: float = TOPOLOGY_WAIT_SECONDS, group_timeout: float = GROUP_TIMEOUT_SECONDS,
                 group_age_bound: float | None = GROUP_AGE_BOUND_SECONDS, comm_share: float = COMM_SHARE,
                 pin_claims: bool = False, shortlist: int = SHORTLIST, one_best: bool = False,
                 ties: Callable[[int], int] | None = None, observe: bool = False) -> None:
        """`pin_claims`: the admission webhook names pinnable template claims, for the planner that makes them
        (extender/pinning/planner.py, run beside the service). `shortlist`: filter passes at most this many nodes
        where more fit, the best by prioritize's rank (verbs/scoring/shortlist.py); 0 passes every fit. `one_best`:
        a pod for which kube-scheduler's scoring weighs nothing of its own (api/preferences.py) is passed only the
        first of them, which kube-scheduler then takes without scoring or prioritize; `ties(count)` draws which of
        the equal best (a generator of its own by default; the replay's draws as its kube-scheduler does). `observe`:
        the module's
        docstring."""
        if (leader is None) != (pods is None):
            raise ValueError("leader election needs the pod reflector, to rebuild the ledger on each win")
        if observe and pin_claims:
            raise ValueError("--observe pins no claim: a pinned claim decides the pod's node and GPUs")
        self.state = state
        self.kube = kube
        self.selector = selector if selector is not None else Selector()  # an empty one is falsy (its len)
        self.wait = WaitClock(topology_wait)
        self.drains = Drains(state)
        self.plans = GroupPlans(state, group_timeout)
        self.groups = GroupPlacement(state, self.plans, self.selector, self.wait, self.drains, group_age_bound,
                                     comm_share)
        self.leader, self._pod_lists = leader, pods
        self.pin_claims = pin_claims
        self.observe = observe
        self.shortlist = 0 if observe else shortlist
        # kube-scheduler's selectHost draws among equal totals; so does the one node filter passes (filter._one).
        self._one_best = (ties or Random(0).randrange) if one_best and self.shortlist > 0 else None
        self._shortlists = Shortlists()
        self._rebuild: tuple[int, int] | None = None  # (term, ticket of the pod list that rebuilds its ledger)
        if leader is not None:
            leader.on_new_term(self._new_term)
        self.metrics = Metrics(state, self.plans, leading=lambda: leader is None or leader.term() is not None,
                               drains=self.drains)
        self._grades: ShapeMemo[Grade] = ShapeMemo()  # filter's and prioritize's, per request shape
        self._pods: OrderedDict[str, tuple[str, PodRequest]] = OrderedDict()  # uid -> (resourceVersion, request)
        self._pods_lock = threading.Lock()
        self._warned: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._events: queue.Queue[tuple[str, str, str, str, str]] = queue.Queue(_EVENT_QUEUE_SIZE)
        state.ledger.on_mismatch = self._mismatch
        threading.Thread(target=self._send_events, name="pod-events", daemon=True).start()
        threading.Thread(target=self._sweep, name="bind-outcomes", daemon=True).start()

    def filter(self, args: ExtenderArgs, compute: bool = True) -> FilterOutcome:
        """Without `compute`, from remembered verdicts and quick new ones only (memo.ON_LOOP): memo.Unknown where
        an answer needs more (a verdict on a big board, a group's plan, a drain to start)."""
        pod = self.pod_request(args.pod)
        if self.observe:
            return self._observed(args.candidates(), filter_nodes(
                self.state, self.selector, pod, args.candidates(), self._grades, self.wait, None, compute))
        if not compute and pod.group_key is not None:
            raise Unknown
        outcome = self.groups.filter(pod, args.candidates()) if pod.group_key is not None else None
        if outcome is None:
            # While GPUs are drained for waiting pods, our keys count them as used where kube-scheduler's packing
            # does not: it chooses from the shortlist.
            alone = self._one_best is not None and pod.group is None and not pod.weighed and not len(self.drains)
            outcome = filter_nodes(self.state, self.selector, pod, args.candidates(), self._grades, self.wait,
                                   self.drains, compute, self.shortlist, self._one_best if alone else None)
            if alone and len(outcome.passed) == 1 and outcome.unlisted.get((OUTRANKED, True)) and not (
                    self._unweighed_at(pod, outcome.passed[0])):
                outcome = filter_nodes(self.state, self.selector, pod, args.candidates(), self._grades, self.wait,
                                       self.drains, compute, self.shortlist)
            if outcome.scores is not None:  # for the pod's prioritize (Shortlists says why)
                self._shortlists.keep(_version(args.pod), list(outcome.passed), outcome.scores)
        if not outcome.passed and WAITING in outcome.failed:
            if not compute:
                raise Unknown
            self._drain(pod, outcome.failed[WAITING])
        unlisted = outcome.unlisted
        outranked = unlisted.get((OUTRANKED, True), 0)
        self.metrics.decision("filter", "pass").inc(len(outcome.passed))
        self.metrics.decision("filter", "outranked").inc(outranked)
        self.metrics.decision("filter", "fail").inc(
            sum(map(len, outcome.failed.values())) + sum(n for (_, fix), n in unlisted.items() if fix) - outranked)
        self.metrics.decision("filter", "unresolvable").inc(
            sum(map(len, outcome.unresolvable.values())) + sum(n for (_, fix), n in unlisted.items() if not fix))
        return outcome

    def _unweighed_at(self, pod: PodRequest, name: str) -> bool:
        """The node has no PreferNoSchedule taint the pod does not tolerate, so kube-scheduler's TaintToleration
        scores no other node above it (api/preferences.py)."""
        view = self.state.view(name)
        return view is not None and tolerates(pod.tolerations, view.soft_taints)

    def _observed(self, names: list[str], outcome: FilterOutcome) -> FilterOutcome:
        """Every candidate passes; the refusals filter would have made are counted, not made."""
        refused = sum(map(len, outcome.failed.values())) + sum(map(len, outcome.unresolvable.values()))
        self.metrics.decision("filter", "pass").inc(len(outcome.passed))
        self.metrics.decision("filter", OBSERVED_REFUSAL).inc(refused)
        return FilterOutcome(list(names))

    def prioritize(self, args: ExtenderArgs, compute: bool = True) -> tuple[list[str], list[int]]:
        """Without `compute`, from remembered offers and quick new ones only (memo.ON_LOOP): memo.Unknown where an
        answer needs more."""
        names = args.candidates()
        pod = self.pod_request(args.pod)
        grouped = pod.group_key is not None and not self.observe
        if not compute and grouped:
            raise Unknown
        planned = self.groups.prioritize(pod, names) if grouped else None
        if planned is not None:
            return names, planned
        shortlisted = self._shortlists.scores(_version(args.pod), names)
        if shortlisted is not None:
            return names, shortlisted
        return names, prioritize_nodes(self.state, self.selector, pod, names, self._grades, self.drains, compute)

    def _drain(self, pod: PodRequest, waiting: list[str]) -> None:
        """Every candidate refused the pod only to wait for a full set: drain the one nearest to free."""
        deadline = self.wait.deadline(pod.uid, self.wait.seconds(pod))
        if deadline is None or pod.request is None:
            return
        candidates = [(name, key) for name, key in zip(waiting, self.state.keys_for(waiting), strict=True)
                      if isinstance(key, NodeKey)]
        drain = self.drains.start(pod.uid, candidates, self.selector, pod.request.count, deadline, self.state.clock())
        if drain is not None:
            self.metrics.decision("filter", "drain").inc()

    def preempt(self, args: PreemptionArgs) -> dict[str, Victims]:
        kept = preempt_nodes(self.state, self.selector, self.pod_request(args.pod), args.victims)
        self.metrics.decision("preempt", "kept").inc(len(kept))
        self.metrics.decision("preempt", OBSERVED_DROP if self.observe else "dropped").inc(
            len(args.victims) - len(kept))
        return dict(args.victims) if self.observe else kept

    def readiness(self) -> str | None:
        """None when this replica can serve or take over (its caches are synced), else why not."""
        if not self.state.ready:
            return "caches not synced"
        return None

    def leads(self) -> bool:
        """True while this replica leads an election with its ledger rebuilt: its Pod should carry the label."""
        return self.leader is not None and self._not_leading() is None

    def _new_term(self, term: int) -> None:
        """Called by the election on each win: list the pods afresh before binding."""
        assert self._pod_lists is not None
        self._rebuild = (term, self._pod_lists.relist())

    def _not_leading(self) -> str | None:
        """None when this replica may bind: no election, or leading with the ledger rebuilt in this term."""
        if self.leader is None:
            return None
        term, rebuild = self.leader.term(), self._rebuild
        if term is None:
            return f"replica {self.leader.identity} is not the leader"
        assert self._pod_lists is not None
        if rebuild is None or rebuild[0] != term or not self._pod_lists.listed(rebuild[1]):
            return f"replica {self.leader.identity} has just become the leader and is rebuilding its GPU ledger"
        return None

    def bind(self, args: BindingArgs) -> str:
        """Bind the pod; returns "" or the error kube-scheduler should see."""
        step = self._begin(args, self.kube)
        if isinstance(step, str):
            return step
        return self._answer(args, partial(post_binding, self.state, self.kube, args, step))

    def bind_soon(self, args: BindingArgs, threads: Executor) -> asyncio.Future[str] | None:
        """`bind` on the running event loop, its Binding posted from there (KubeApi.bind_soon), or None, having
        done nothing, where it would wait: the ledger is busy, or the pod needs a read from the API server first.
        What still needs a thread then (a Binding without an idle connection, a conflict's read) goes to
        `threads`."""
        lock = self.state.ledger.lock
        if not lock.acquire(blocking=False):
            return None
        try:
            step = self._begin(args, None)
        except WouldRead:
            return None
        finally:
            lock.release()
        answer: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        if isinstance(step, str):
            answer.set_result(step)
            return answer
        post = partial(post_binding, self.state, self.kube, args, step)  # on a thread, from the start
        finish = partial(finish_bind, self.state, self.kube, args, step)  # given what the POST raised, or None
        try:
            posted = self.kube.bind_soon(args.pod_namespace, args.pod_name, args.pod_uid, args.node,
                                         step.annotations)
        except Exception as error:  # settled as a Binding that raised: its GPUs stay reserved until the watch tells
            self._settle(answer, None, partial(finish, error), args)
            return answer
        if posted is None:
            self._settle(answer, threads, post, args)
            return answer

        def posted_done(posted: asyncio.Future[None]) -> None:
            error = asyncio.CancelledError() if posted.cancelled() else posted.exception()
            if isinstance(error, StaleConnection):
                self._settle(answer, threads, post, args)
            else:
                self._settle(answer, threads if needs_read(error) else None, partial(finish, error), args)
        posted.add_done_callback(posted_done)
        return answer

    def _begin(self, args: BindingArgs, kube: KubeApi | None) -> str | Reservation:
        """The bind up to its Binding: the reservation to post, or kube-scheduler's answer when nothing is left to
        post. Without `kube`, WouldRead where begin_bind would read from the API server."""
        if self.observe:
            self.metrics.decision("bind", OBSERVE_ONLY).inc()
            return (f"binding {args.pod_namespace}/{args.pod_name} refused: the GPU topology extender observes only "
                    "(--observe) and binds no pod: its kube-scheduler configuration for observing sets no bindVerb")
        standby = self._not_leading()
        if standby is not None:
            self.metrics.decision("bind", "not-leader").inc()
            return (f"binding {args.pod_namespace}/{args.pod_name} refused: {standby}; "
                    "kube-scheduler will retry the pod")
        self.state.ledger.sweep()
        try:
            now = self.state.clock()
            with self._pods_lock:
                known = self._pods.get(args.pod_uid)
            held = self.drains.held(args.node, args.pod_uid, now, None if known is None else ends_by(known[1], now))
            step = begin_bind(self.state, self.plans, self.selector, kube, args, held)
        except BindError as error:
            return self._refused(args, error)
        return self._bound(args, step) if isinstance(step, Bound) else step

    def _answer(self, args: BindingArgs, finish: Callable[[], Bound]) -> str:
        """kube-scheduler's answer once the Binding is settled by `finish`."""
        try:
            return self._bound(args, finish())
        except BindError as error:
            return self._refused(args, error)

    def _settle(self, answer: asyncio.Future[str], threads: Executor | None, finish: Callable[[], Bound],
                args: BindingArgs) -> None:
        """`answer` from `finish`, run here or on `threads`; an exception other than BindError goes to it."""
        if threads is None:
            try:
                answer.set_result(self._answer(args, finish))
            except BaseException as error:
                answer.set_exception(error)
            return
        asyncio.get_running_loop().run_in_executor(threads, self._answer, args, finish).add_done_callback(
            partial(_pass_on, answer))

    def _refused(self, args: BindingArgs, error: BindError) -> str:
        self.metrics.decision("bind", "error").inc()
        log.info("bind %s/%s to %s refused: %s", args.pod_namespace, args.pod_name, args.node, error)
        return str(error)

    def _bound(self, args: BindingArgs, bound: Bound) -> str:
        self.metrics.decision("bind", "repeated" if bound.repeated else "bound").inc()
        self.wait.forget(args.pod_uid)
        self.drains.end(args.pod_uid)
        if bound.ring_gbps is not None and not bound.repeated:
            self.metrics.ring_gbps.observe(bound.ring_gbps)
        if bound.mispredicted:
            self.metrics.dra_mispredicted.labels(args.node).inc()
            log.info("pod %s/%s on %s: DRA gave %s, not the first fit it was judged by", args.pod_namespace,
                     args.pod_name, args.node, ",".join(bound.gpus))
        # At debug: one line a pod took 4% of the extender's time under kube-scheduler (py-spy, scheduler_throughput)
        # and says nothing new: the pod's annotations carry the GPUs, kube-scheduler logs the node (`--v=2`), the
        # metrics count every bind.
        log.debug("bound %s/%s to %s on %s (ring %s GB/s)", args.pod_namespace, args.pod_name, args.node,
                  ",".join(bound.gpus), bound.ring_gbps)
        return ""

    def pod_request(self, pod: Mapping[str, Any]) -> PodRequest:
        """Parsed once per pod version: filter and prioritize of one cycle carry the same pod."""
        uid, version = _version(pod)
        with self._pods_lock:
            found = self._pods.get(uid)
            if found is not None and found[0] == version and uid:
                return found[1]
        parsed = self.state.parsed(uid, version) or parse_pod(pod, self.state.keys, self.state.resource,
                                                                self.state.dra)
        if parsed.transient:
            return parsed  # asked again next time: the claim will have come
        if uid:
            with self._pods_lock:
                self._pods[uid] = (version, parsed)
                self._pods.move_to_end(uid)
                while len(self._pods) > _POD_CACHE_SIZE:
                    self._pods.popitem(last=False)
        if parsed.problem is not None:
            self._warn(parsed)
        return parsed

    def _mismatch(self, held: Assignment, allocated: frozenset[str]) -> None:
        """The kubelet gave a pod other GPUs than we bound it to: the ledger now follows the kubelet."""
        self.metrics.mismatches.labels(held.node).inc()
        namespace, _, name = held.pod_key.partition("/")
        message = (f"the kubelet allocated {', '.join(sorted(allocated))} on {held.node}, not the GPUs bound "
                   f"({', '.join(sorted(held.gpus))}); is the node agent's device plugin serving this node?")
        log.warning("pod %s: %s", held.pod_key, message)
        self._queue_event(namespace, name, held.pod_uid, "GPUAllocationMismatch", message)

    def _sweep(self) -> None:
        while True:
            time.sleep(1.0)
            self.state.ledger.sweep()
            with self.state.ledger.lock:
                self.plans.expire(self.state.clock())

    def _warn(self, pod: PodRequest) -> None:
        """One Event per pod and problem, sent off the hot path; a full queue drops it."""
        key = (pod.uid, pod.problem or "")
        with self._pods_lock:
            if key in self._warned or not pod.uid:
                return
            self._warned[key] = None
            if len(self._warned) > _POD_CACHE_SIZE:
                self._warned.popitem(last=False)
        self._queue_event(pod.namespace, pod.name, pod.uid, "InvalidGPUTopologyRequest", pod.problem or "")

    def _queue_event(self, namespace: str, name: str, uid: str, reason: str, message: str) -> None:
        try:
            self._events.put_nowait((namespace, name, uid, reason, message))
        except queue.Full:
            log.warning("event queue full; not sending %s to pod %s/%s", reason, namespace, name)

    def _send_events(self) -> None:
        while True:
            namespace, name, uid, reason, message = self._events.get()
            self.kube.emit_event(namespace, name, uid, reason, message)
