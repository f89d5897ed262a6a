"""Draining for waiting pods: while a pod holds out for a full-bandwidth set (extender/verbs/wait.py), the free GPUs
of the full set nearest to free on one candidate node are kept from other pods, so that departures complete the
set instead of small pods refilling it.

Why: waiting alone rarely works at high load. The replay (BENCHMARKS.md) showed 4-GPU pods that waited their
whole wait on an L40S pool while 1-GPU pods took each GPU the moment it came free, so no socket of four ever
emptied. Batch schedulers call this a reservation with draining; kube-scheduler has none, and kube-scheduler's
own count filter still sees the drained GPUs as free, so our filter, prioritize and bind hide them from every
other pod.

A drain lasts no longer than its pod's wait and ends when the pod binds; at most one per pod and
MAX_DRAINS in all, so a flood of waiting pods cannot hold back the cluster. Only GPUs that are free are drained:
a drain never takes a GPU from anyone. A group waiting past its age bound (extender/verbs/group_placement.py)
drains one set per member across the nodes of the domain predicted to free soonest, under the group's key: its
members see them as free. Its drain is a lease the group renews each time kube-scheduler retries it.
"""

from __future__ import annotations

import math
from collections.abc import Container, Sequence
from dataclasses import dataclass, replace

from extender.api._names import lookup
from extender.api.pod_request import PodRequest
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import Key, NodeKey
from topology.full_sets import full_set_masks
from topology.select import Selector

MAX_DRAINS = 1024
"""Pods draining at once; a pod past it waits without draining."""
STOP_SECONDS = 30.0
"""Kubernetes' default terminationGracePeriodSeconds: a pod past its activeDeadlineSeconds has this long to stop."""


def ends_by(pod: PodRequest, now: float) -> float | None:
    """When a pod placed now has ended at the latest: its activeDeadlineSeconds from now, and the time to stop;
    None where it sets no deadline."""
    return None if pod.deadline_seconds is None else now + pod.deadline_seconds + STOP_SECONDS


@dataclass(frozen=True, slots=True)
class Drain:
    uid: str  # the waiting pod's UID, or the waiting group's key
    targets: tuple[tuple[str, int], ...]
    """(node, GPUs) of the full sets being drained: their free GPUs are held back now, busy ones as they free up."""
    until: float
    starts: float | None = None
    """When its group is predicted to start on them: a pod bound to end before (its activeDeadlineSeconds) may
    use them meanwhile, as a backfill. None: a pod's drain, which nothing backfills."""

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(node for node, _ in self.targets)


class Drains:
    """The drains in force, by pod UID. The union of drained GPUs per node is held back in the cluster state
    (`ClusterState.hold_back`), so that every other pod reads it in the same C pass as the node keys, however
    many nodes drain; only a drain's own pod restores its nodes. Shares the ledger's lock, which the state's
    keys are changed under."""

    def __init__(self, state: ClusterState, limit: int = MAX_DRAINS) -> None:
        self._state = state
        self._limit = limit
        self._by_pod: dict[str, Drain] = {}
        self._by_node: dict[str, int] = {}
        self._backfilled: dict[str, Drain] = {}  # the drains with a predicted start, which pods may backfill
        self._lock = state.ledger.lock
        self._next_end = math.inf  # the earliest `until` in force: no drain to end before it
        self.started = 0  # drains begun since start

    def __len__(self) -> int:
        return len(self._by_pod)

    def in_force(self) -> list[Drain]:
        with self._lock:
            return list(self._by_pod.values())

    def held(self, node: str, uid: str, now: float, ends_by: float | None = None) -> int:
        """GPUs of `node` that pod `uid` may not take: those drained for other pods, but for the drains it
        backfills (it ends by `ends_by`, before their group starts)."""
        self._expire(now)
        with self._lock:
            return self._drained(node, self._exempt(uid, ends_by)) if node in self._by_node else 0

    def seen(self, names: list[str], uid: str, now: float, ends_by: float | None = None) -> list[Key | None]:
        """The nodes' keys as pod `uid` sees them: on nodes draining for other pods, the drained GPUs are not
        free; on its own drain's nodes and those of drains it backfills (`held`), only other drains' are hidden."""
        self._expire(now)
        state = self._state
        if not self._by_pod:  # the common case, on every filter and prioritize: no lock taken
            return state.keys_for(names)
        keys = state.keys_held_back(names)
        if uid not in self._by_pod and (ends_by is None or not self._backfilled):
            return keys
        with self._lock:
            exempt = self._exempt(uid, ends_by)
            nodes = list({node for owner in exempt if owner in self._by_pod for node in self._by_pod[owner].nodes})
            restored = {node: state.key_without(key, self._drained(node, exempt)) if isinstance(key, NodeKey)
                        else key for node, key in zip(nodes, state.keys_for(nodes), strict=True)}
        return lookup(names, restored, keys) if restored else keys

    def _exempt(self, uid: str, ends_by: float | None) -> frozenset[str]:
        """The drains pod `uid` sees through: its own, and the groups' it ends before (their `starts`)."""
        if ends_by is None:
            return frozenset((uid,))
        return frozenset((uid, *(owner for owner, drain in self._backfilled.items()
                                 if drain.starts is not None and ends_by <= drain.starts)))

    def start(self, uid: str, candidates: Sequence[tuple[str, NodeKey]], selector: Selector, size: int,
              until: float, now: float) -> Drain | None:
        """Drain, for pod `uid`, the full set of `size` nearest to free among the candidate nodes (most GPUs
        already free; the first candidate on a tie). A pod already draining keeps its drain."""
        self._expire(now)
        with self._lock:
            if uid in self._by_pod:
                return self._by_pod[uid]
            if len(self._by_pod) >= self._limit:
                return None
            best: tuple[int, str, int] | None = None
            for node, key in candidates:
                taken = self._by_node.get(node, 0)
                for target in full_set_masks(selector, key.compiled, key.compiled.full_mask & ~key.unhealthy, size):
                    ready = (target & key.free).bit_count()
                    if not target & taken and (best is None or ready > best[0]):
                        best = (ready, node, target)
            if best is None:
                return None
            _, node, target = best
            return self._add(Drain(uid, ((node, target),), until))

    def start_sets(self, uid: str, targets: Sequence[tuple[str, int]], until: float, now: float,
                   starts: float | None = None) -> Drain | None:
        """Drain these sets for `uid` (a waiting group) until `until`, unless one overlaps another's; a group that
        drains already keeps its sets, and its drain lasts until `until` if that is later (a lease it renews).
        `starts`: when the group is predicted to start on them (Drain.starts)."""
        self._expire(now)
        with self._lock:
            drain = self._by_pod.get(uid)
            if drain is not None:
                if until > drain.until:
                    drain = self._by_pod[uid] = replace(drain, until=until)
                return drain
            if len(self._by_pod) >= self._limit or any(self._by_node.get(node, 0) & gpus for node, gpus in targets):
                return None
            return self._add(Drain(uid, tuple(targets), until, starts))

    def _add(self, drain: Drain) -> Drain:
        self._by_pod[drain.uid] = drain
        if drain.starts is not None:
            self._backfilled[drain.uid] = drain
        self.started += 1
        self._next_end = min(self._next_end, drain.until)
        self._remark(drain.nodes)
        return drain

    def end(self, uid: str) -> None:
        with self._lock:
            drain = self._by_pod.pop(uid, None)
            self._backfilled.pop(uid, None)
            if drain is not None:
                self._remark(drain.nodes)

    def _expire(self, now: float) -> None:
        if now < self._next_end:
            return
        with self._lock:
            expired = [drain for drain in self._by_pod.values() if drain.until <= now]
            for drain in expired:
                del self._by_pod[drain.uid]
                self._backfilled.pop(drain.uid, None)
                self._remark(drain.nodes)
            self._next_end = min((drain.until for drain in self._by_pod.values()), default=math.inf)

    def _drained(self, node: str, besides: Container[str] = ()) -> int:
        mask = 0
        for drain in self._by_pod.values():
            if drain.uid not in besides:
                for target, gpus in drain.targets:
                    if target == node:
                        mask |= gpus
        return mask

    def _remark(self, nodes: frozenset[str]) -> None:
        for node in nodes:
            mask = self._drained(node)
            if mask:
                self._by_node[node] = mask
            else:
                self._by_node.pop(node, None)
            self._state.hold_back(node, mask)


def keys_seen(state: ClusterState, names: list[str], drains: Drains | None, uid: str,
              stale: Key | None, ends_by: float | None = None, count: int = 0) -> list[Key | None]:
    """Each candidate's key as filter and prioritize read it for pod `uid`, which is bound to end by `ends_by`:
    GPUs drained for other pods hidden (but for the drains it backfills), a DRA node's as what its first fit gives
    `count` GPUs, and `stale` in place of a node whose GPU state is too old. Passes over the names run in C
    (extender/api/_names.c)."""
    if drains is None or not len(drains):  # no drain in force, the common case: one C pass
        keys = state.keys_given(names, count)
    else:
        keys = drains.seen(names, uid, state.clock(), ends_by)
        given = state.given_keys(count)
        if given:
            keys = lookup(keys, given, keys)
    old = state.stale_names()
    return lookup(names, dict.fromkeys(old, stale), keys) if old else keys
