"""filter and prioritize for a member of a group: the group goes whole into one domain, or waits.

At the first member's filter the whole group is planned (extender/groups/layouts.py) and the plan is put in force
(extender/groups/plans.py): its GPUs are held against every other pod, and each member's filter passes only the
nodes where the plan has a place left for it. The members still to come are planned, not the size the group
states: after a restart, an expired plan or a lost node, the rest of the group is planned again inside the
domain where its bound members already are.

A group no domain of its span can hold now waits, as a single pod waits for a full-bandwidth set
(extender/verbs/wait.py): every node says why, and nothing of it binds. A group with `required` placement waits
for as long as it takes. A preferred one (the default) waits as long as waiting finishes it sooner than a split
(`group_wait`): its own `topology-wait` if it states one. Else the wait follows from what a split would cost it,
by its communication share c (its `comm-share`, else the extender's --comm-share; topology/collectives.py): a
split across NVLink domains runs up to `split_slowdown(c)` times as long, so a group that states
activeDeadlineSeconds waits `split_slowdown(c) - 1` times that (2.56 at c = 0.3: a wait that long still finishes
no later), one that states none waits for as long as a domain could hold it, since a split runs slower for its
whole run and the replay measured that any split feeds itself at load (issue 29), and one with c = 0 does not
wait at all, as a split costs it nothing. Then it tries wider spans (a leaf, a spine) with its members in equal
segments, each inside one NVLink domain, the largest that fit, and last places its members as single pods, unless
it declared a segment and a split costs it anything (c > 0): Slurm's `--segment` is strict, and a segment is kept
whole for as long as it takes. A group no domain could hold even empty is refused at once if required, and goes to
the wider spans at once if preferred.

No group starves: with an age bound (--group-age-bound), the group waiting longest past it drains the domain
predicted to free soonest (extender/verbs/drains.py), one group at a time, once that is predicted within
DRAIN_HORIZON_SECONDS. A running pod's remaining time is predicted from its elapsed time (as long again: GPU job
run times are heavy-tailed). Only pods bound to end before that (by their activeDeadlineSeconds) may use the
drained GPUs meanwhile, as a backfill. The drain is a lease the group renews at each retry, and its pods' reason
says so.
Drains are not taken during the ordinary wait: holding free GPUs idle for every waiting group cost utilization
and lengthened the waits of large groups (issue 29).

A group with a segment (`gpu-topology.io/group-segment`, Slurm's `--segment`) that spans more than an NVLink
domain is planned with each segment of members inside one NVLink domain, in as few as hold them
(extender/groups/layouts.py `layout`); a preferred one keeps its segments whole as it widens its span.

Every node the plan does not name is refused as unresolvable: kube-scheduler's preemption of single pods
cannot make a group fit (the preempt verb knows no groups yet).
"""

from __future__ import annotations

import logging
import math
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, replace

from extender.api.group_request import NVLINK_DOMAIN, GroupRequest
from extender.api.pod_request import PodRequest
from extender.cache.cluster_state import ClusterState
from extender.cache.domains import span_name
from extender.cache.node_view import NodeKey
from extender.groups.layouts import Layout, Slot, best_layout, capacity, drain_targets, layout
from extender.groups.plans import GroupPlans, Plan
from extender.verbs.drains import Drains
from extender.verbs.filter import FilterOutcome
from extender.verbs.wait import WaitClock
from topology.collectives import COMM_SHARE, split_slowdown
from topology.select import Choice, Selector

log = logging.getLogger(__name__)

ELSEWHERE = "not in the placement planned for the pod's group"
PLAN_LIMIT = "too many group plans in force; the group waits for one to end"
MAX_SCORE = 10
NO_ROOM_SECONDS = 1.0
MAX_REMEMBERED_GROUPS = 4096
RETRIED_SECONDS = 600.0
"""A group refused within this long is still waiting: kube-scheduler retries an unschedulable pod at least every
5 minutes (its flush of unschedulable pods), so one not seen for twice that was deleted or placed elsewhere."""
DRAIN_LEASE_SECONDS = 600.0
"""An age-bound drain lasts this long past the group's last retry: a group gone lets its domain go within it."""
DRAIN_HORIZON_SECONDS = 3600.0
"""A group past its age bound drains only a domain predicted to hold it within this long: a drain idles the domain's
free GPUs until then, and one predicted to free later costs more than the wait it saves. Measured in the replay
(nvl72 fleet, load 0.85, --comm-share 0.3, a 2 h age bound; goodput with no horizon, with this one, and with no
drain): synthetic seed 2 77.4%, 77.9%, 75.0%; seed 4 70.7%, 73.3%, 72.5%; two unseen multi-node CSVs 73.9%,
74.9%, 75.6% and 73.2%, 72.8%, 71.8%."""
AGE_DRAINING = "past its age bound, a domain is drained for it"
GROUP_AGE_BOUND_SECONDS = 7200.0
"""--group-age-bound's default. Measured in the replay (nvl72 fleet, load 0.85, --comm-share 0.3, synthetic seed 1,
before the horizon), longest wait of 9-18-tray gangs and mean JCT: none 39,454 s and 2,029 s; 4 h 29,554 s and
2,000 s; 2 h 21,925 s and 1,910 s; 1 h 27,510 s and 2,113 s, goodput 70.7%, 70.4%, 70.5%, 69.0%."""


@dataclass(frozen=True, slots=True)
class _NoRoom:
    """No domain of `span` holds the group now, though one could once GPUs come free."""

    span: str
    targets: tuple[Slot, ...]  # the sets of the domain predicted to free soonest, for an age-bound drain
    members: int
    starts: float  # when that domain is predicted to hold it


class GroupPlacement:
    def __init__(self, state: ClusterState, plans: GroupPlans, selector: Selector, wait: WaitClock,
                 drains: Drains, age_bound: float | None = None, comm_share: float = COMM_SHARE) -> None:
        self.state = state
        self.plans = plans
        self.selector = selector
        self.wait = wait
        self.drains = drains
        self.age_bound = age_bound
        self.split_cost = split_slowdown(comm_share) - 1  # for members that state no comm-share of their own
        self._no_room: OrderedDict[str, tuple[int, float, _NoRoom | None]] = OrderedDict()
        self._first: OrderedDict[str, float] = OrderedDict()  # waiting group -> its first refusal, oldest first
        self._last: dict[str, float] = {}  # waiting group -> its last refusal
        self._segments: dict[tuple[int, int, frozenset[str]], tuple[int, bool]] = {}  # -> (state version, fits)

    def filter(self, pod: PodRequest, names: Sequence[str]) -> FilterOutcome | None:
        """The member's verdicts, or None when it is to be placed as a single pod."""
        group, key, request = pod.group, pod.group_key, pod.request
        assert group is not None and key is not None and request is not None
        state = self.state
        size = group.size if group.size is not None else state.group_sizes.get(key)
        if size is None:
            if not group.required:
                return None
            return _refuse(names, f"group {group.name}: its PodGroup object gives no member count", resolvable=False)
        if group.span not in state.domains.spans:
            expected = " | ".join(state.domains.spans)
            return _refuse(names, f"{state.keys.group_span}: {group.span[:63]!r} names no topology level; "
                                  f"expected {expected}", resolvable=False)
        now = state.clock()
        with state.ledger.lock:
            self.plans.expire(now)
            plan = self.plans.get(key)
            if plan is not None and plan.count != request.count:
                return _refuse(names, f"group {group.name}: its members must request the same number of GPUs "
                                      f"(the group's plan gives {plan.count} to each)", resolvable=False)
            nodes = self._open_nodes(key, pod.uid)
            if nodes:
                return _only(names, nodes)
            if self.plans.full and self.plans.get(key) is None:
                return _refuse(names, PLAN_LIMIT, resolvable=True)
            if group.segment is not None and not self._segment_fits(group.segment, request.count, names):
                if group.required:
                    return _refuse(names, f"{state.keys.group_segment}: no NVLink domain of these nodes holds "
                                          f"{group.segment} pods of {request.count} GPUs", resolvable=False)
                group = replace(group, segment=None)  # preferred: planned as if it set none
                pod = replace(pod, group=group)
            found = self._plan_once(pod, key, size, now, names)
            if isinstance(found, Plan):
                self.plans.install(found)
                self.wait.forget(key)
                self.drains.end(key)
                self._first.pop(key, None)
                self._last.pop(key, None)
                log.info("group %s planned in %s %s: %s", key, span_name(found.span), found.domain,
                         ", ".join(slot.node for slot in found.slots))
                return _only(names, self._open_nodes(key, pod.uid))
        within = self.wait.holds(key, self.group_wait(pod), now)
        if found is None:
            if group.required:
                return _refuse(names, f"no {span_name(group.span)} can hold the group's pods of "
                                      f"{request.count} GPUs", resolvable=False)
            return None
        if not (group.required or within or (group.segment is not None and self.split_cost_of(pod) > 0)):
            return None  # a declared segment is kept whole while a split costs the group anything
        reason = f"no {span_name(found.span)} with room for {found.members} pods of {request.count} GPUs"
        if self._age_drain(key, found, now):
            reason += f"; {AGE_DRAINING}"
        return _refuse(names, reason, resolvable=False)

    def group_wait(self, pod: PodRequest) -> float:
        """How long a preferred group waits for one domain of its span before it splits (the module's docstring)."""
        if pod.wait_seconds is not None:
            return pod.wait_seconds
        cost = self.split_cost_of(pod)
        if self.wait.wait_seconds <= 0 or cost <= 0:
            return 0.0
        if pod.deadline_seconds is not None:
            return max(self.wait.wait_seconds, cost * pod.deadline_seconds)
        return math.inf

    def split_cost_of(self, pod: PodRequest) -> float:
        """How much longer than in one NVLink domain the group may run split: split_slowdown(c) - 1."""
        return self.split_cost if pod.comm_share is None else split_slowdown(pod.comm_share) - 1

    def _age_drain(self, key: str, found: _NoRoom, now: float) -> bool:
        """Whether the group drains now: it has waited past the age bound, longest of the groups still retried, and
        a domain is predicted to hold it within DRAIN_HORIZON_SECONDS."""
        if key not in self._first:
            self._first[key] = now
            if len(self._first) > MAX_REMEMBERED_GROUPS:
                self._last.pop(self._first.popitem(last=False)[0], None)
        self._last[key] = now
        if not self._aged(key, now) or not found.targets or found.starts - now > DRAIN_HORIZON_SECONDS:
            return False
        drain = self.drains.start_sets(key, [(slot.node, slot.gpus) for slot in found.targets],
                                       now + DRAIN_LEASE_SECONDS, now, found.starts)
        return drain is not None

    def prioritize(self, pod: PodRequest, names: Sequence[str]) -> list[int] | None:
        """Planned nodes first; None when the member has no plan (it is placed as a single pod)."""
        key = pod.group_key
        assert key is not None
        with self.state.ledger.lock:
            nodes = self._open_nodes(key, pod.uid)
        if not nodes:
            return None
        return [MAX_SCORE if name in nodes else 0 for name in names]

    def _open_nodes(self, key: str, uid: str) -> frozenset[str]:
        """Where the group's plan has a place for this member: its own claim, else every open slot's node."""
        plans = self.plans
        plan = plans.get(key)
        if plan is None:
            return frozenset()
        claimed = plans.claim_of(uid, key)
        if claimed is not None:
            return frozenset({plan.slots[claimed].node})
        return frozenset(slot.node for _, slot in plans.open_slots(key))

    def _plan_once(self, pod: PodRequest, key: str, size: int, now: float,
                   names: Sequence[str]) -> Plan | _NoRoom | None:
        """`_plan`, but a group found no room for is not searched again until a node changes or a second passes:
        kube-scheduler may retry a waiting gang a thousand times a second (README, kube-scheduler's pod groups)."""
        seen = self._no_room.get(key)
        if seen is not None and seen[0] == self.state.version and now - seen[1] < NO_ROOM_SECONDS:
            return seen[2]
        found = self._plan(pod, key, size, now, frozenset(names))
        if isinstance(found, Plan):
            self._no_room.pop(key, None)
        else:
            self._no_room[key] = (self.state.version, now, found)
            self._no_room.move_to_end(key)
            if len(self._no_room) > MAX_REMEMBERED_GROUPS:
                self._no_room.popitem(last=False)
        return found

    def _plan(self, pod: PodRequest, key: str, size: int, now: float,
              candidates: frozenset[str]) -> Plan | _NoRoom | None:
        """A plan for the members still to come; else the span to wait at, or None if no domain ever holds them.

        Only the candidates of this member's filter are planned on: kube-scheduler passed them by the pod's node
        selector, affinity, taints and resources, which the members share and the extender does not evaluate. To
        wait, only domains with a board of a candidate count (the pool a node selector picks is a GPU model), so
        a rack of another pool is never drained for the group, while the pod's own racks are, busy or not."""
        group, request = pod.group, pod.request
        assert group is not None and request is not None
        state = self.state
        members = state.group_members.get(key, {})
        placed = {uid for uid, node in members.items() if node and uid != pod.uid} | set(self.plans.claimed(key))
        remaining = max(size - len(placed), 1)
        spans = (group.span,) if group.required else state.domains.outward(group.span)
        wait_at: _NoRoom | None = None
        boards = {found.compiled for found in state.keys_for(list(candidates)) if isinstance(found, NodeKey)}
        for span in spans:
            placed_nodes = [members[uid] for uid in placed if members.get(uid)]
            every = [(domain, self._usable(pod, key, nodes, now))
                     for domain, nodes in self._domains(span, placed_nodes)]
            domains = [(domain, usable) for domain, usable in every
                       if any(found.compiled in boards for _, found in usable)]
            best = best_layout(self._layout(group, span, domain, usable, remaining, request.count, candidates)
                               for domain, usable in domains)
            if best is not None:
                return Plan(key, span, best.domain, request.count, best.slots, now, now + self.plans.timeout)
            if wait_at is None:
                wait_at = self._soonest(span, domains, remaining, request.count, now, self._aged(key, now))
                if wait_at is not None and (group.required or self.wait.holds(key, self.group_wait(pod), now)):
                    return wait_at
        return wait_at

    def _layout(self, group: GroupRequest, span: str, domain: str, usable: list[tuple[str, NodeKey]], members: int,
                count: int, candidates: frozenset[str]) -> Layout | None:
        """The group's layout in one block of the span: with a segment, each segment inside one NVLink domain;
        without one, past its own span, in the largest equal segments that fit, each inside one NVLink domain
        (a split pays only its between-segment traffic)."""
        index = self.state.domains

        def nvlink_of(node: str) -> str | None:
            return index.domain_of(NVLINK_DOMAIN, node)

        if span == NVLINK_DOMAIN or group.segment == 1 or (group.segment is None and span == group.span):
            return layout(self.selector, domain, usable, members, count, candidates)
        if group.segment is not None:
            return layout(self.selector, domain, usable, members, count, candidates, group.segment, nvlink_of)
        for segment in sorted((size for size in range(2, members) if members % size == 0), reverse=True):
            found = layout(self.selector, domain, usable, members, count, candidates, segment, nvlink_of)
            if found is not None:
                return found
        return layout(self.selector, domain, usable, members, count, candidates)

    def _segment_fits(self, segment: int, count: int, names: Sequence[str]) -> bool:
        """Some NVLink domain of the candidates holds a segment with every GPU free (on HGX nodes, each its own
        domain, a segment of several 8-GPU pods never does: waiting for one would be forever). Remembered per
        answer until a node changes."""
        if segment <= 1:
            return True
        state = self.state
        index = state.domains
        domains = frozenset(domain for name in names if (domain := index.domain_of(NVLINK_DOMAIN, name)) is not None)
        remembered = self._segments.get((segment, count, domains))
        if remembered is not None and remembered[0] == state.version:
            return remembered[1]
        members = index.domains(NVLINK_DOMAIN)
        fits = any(capacity(self.selector, [(node, found) for node, found in zip(nodes, state.keys_for(nodes))
                                            if isinstance(found, NodeKey)], count) >= segment
                   for nodes in (sorted(members.get(domain, ())) for domain in domains))
        if len(self._segments) >= MAX_REMEMBERED_GROUPS:
            self._segments.clear()
        self._segments[(segment, count, domains)] = (state.version, fits)
        return fits

    def _aged(self, key: str, now: float) -> bool:
        """The group has waited past the age bound, longest of the groups still retried: the one that drains, so
        the one whose drain is worth predicting. A group not refused for RETRIED_SECONDS is forgotten on the way."""
        if self.age_bound is None:
            return False
        first, last = self._first, self._last
        while first:
            oldest, since = next(iter(first.items()))
            if oldest == key:  # being retried now
                return now - since >= self.age_bound
            if now - last.get(oldest, since) < RETRIED_SECONDS:
                return False
            del first[oldest]
            last.pop(oldest, None)
        return False

    def _soonest(self, span: str, domains: list[tuple[str, list[tuple[str, NodeKey]]]], members: int, count: int,
                 now: float, predict: bool) -> _NoRoom | None:
        """Among the domains that could hold the group with every GPU free, the one predicted to hold it soonest:
        by when the last of its sets frees (a node frees when its longest-running pod ends, predicted to run as
        long again as it has), then by most GPUs free now. Without `predict`, only whether one could: the first."""
        soonest: tuple[tuple[float, int], list[Slot]] | None = None
        for _, usable in domains:
            if capacity(self.selector, usable, count) >= members:
                if not predict:
                    return _NoRoom(span, (), members, math.inf)
                frees_at = {name: self._frees_at(name, now) for name, _ in usable}
                ready, targets = drain_targets(self.selector, usable, members, count, frees_at)
                keys = dict(usable)
                rank = (max((frees_at[slot.node] for slot in targets if slot.gpus & keys[slot.node].free != slot.gpus),
                            default=now), -ready)
                if soonest is None or rank < soonest[0]:
                    soonest = (rank, targets)
        return None if soonest is None else _NoRoom(span, tuple(soonest[1]), members, soonest[0][0])

    def _frees_at(self, node: str, now: float) -> float:
        """When the node's pods are predicted to have ended: each runs as long again as it has run (the median
        remaining time of a heavy-tailed run time grows with its age)."""
        return now + max((now - entry.at for entry in self.state.ledger.entries(node)), default=0.0)

    def _domains(self, span: str, placed_nodes: list[str]) -> list[tuple[str, list[str]]]:
        """The span's domains as (domain, nodes); only the one most of the group's bound members are in, if any."""
        index = self.state.domains
        where = Counter(domain for node in placed_nodes if (domain := index.domain_of(span, node)) is not None)
        every = index.domains(span)
        chosen = [where.most_common(1)[0][0]] if where else sorted(every)
        return [(domain, sorted(every[domain])) for domain in chosen if domain in every]

    def _usable(self, pod: PodRequest, key: str, nodes: list[str], now: float) -> list[tuple[str, NodeKey]]:
        """The nodes' keys as the group sees them (fresh, whole GPUs, others' drains hidden), where a full set
        meets what the pod requires."""
        state = self.state
        keys = self.drains.seen(nodes, key, now)
        stale = state.stale_names()
        usable = [(name, found) for name, found in zip(nodes, keys, strict=True)
                  if isinstance(found, NodeKey) and name not in stale]
        if pod.requires_topology and pod.request is not None:
            usable = [(name, found) for name, found in usable if isinstance(
                self.selector.select(found.compiled, found.compiled.full_mask & ~found.unhealthy, pod.request), Choice)]
        return usable


def _only(names: Sequence[str], nodes: frozenset[str]) -> FilterOutcome:
    passed = [name for name in names if name in nodes]
    others = [name for name in names if name not in nodes]
    return FilterOutcome(passed, {}, {ELSEWHERE: others} if others else {})


def _refuse(names: Sequence[str], reason: str, *, resolvable: bool) -> FilterOutcome:
    if resolvable:
        return FilterOutcome([], {reason: list(names)}, {})
    return FilterOutcome([], {}, {reason: list(names)})
