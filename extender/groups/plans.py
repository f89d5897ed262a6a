"""Group plans in force: each one a domain and a slot per member, its open slots held in the ledger.

A plan's open slots are ledger entries (phase PLANNED), so every other pod's filter, prioritize and bind sees
their GPUs as taken, exactly as it sees a reservation. A member's bind claims a slot: the PLANNED entry gives
way to the member's own reservation of the same GPUs, under the ledger lock; a refused Binding gives the slot
back. A plan ends when it runs out (`--group-timeout` from its last claim: members that never come free their
GPUs) or once every slot is held by a bound member.

The plan outlives the extender on the members: each member's Binding carries the plan as planned, sealed like
its assignment (extender/cache/seal.py). After a restart, or on the new leader, the first sealed plan read back is
put in force again with the slots of the members already bound claimed, so nothing is given twice and later
members land where the plan put them. A plan whose text would pass MAX_PLAN_BYTES is not written: after a
restart its remaining members are planned again, inside the domain of the members already bound.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import orjson

from extender.cache.assignments import Phase
from extender.cache.cluster_state import ClusterState
from extender.groups.layouts import Slot
from topology.bounds import MAX_DOMAIN_LENGTH, MAX_GROUP_SIZE, valid_id

log = logging.getLogger(__name__)

MAX_PLANS = 4096
"""Plans in force at once. Each needs a live member that asked; past it a new group waits for one to end."""
MAX_PLAN_BYTES = 64 * 1024
"""The longest plan text sealed on a member: 1,024 members with 40-character node names fit; a pod's
annotations may total 256 KiB (apimachinery's TotalAnnotationSizeLimitB)."""
GROUP_TIMEOUT_SECONDS = 300.0
"""How long a plan waits for its next member (--group-timeout). A job controller creates its pods together and
kube-scheduler takes them in seconds; five minutes covers a busy queue and a backoff or two."""
PLAN_VERSION = 1


@dataclass(frozen=True, slots=True)
class Plan:
    group: str  # the group's key (namespace/name)
    span: str
    domain: str
    count: int  # GPUs per member
    slots: tuple[Slot, ...]
    at: float  # when planned
    expires: float


class GroupPlans:
    """The plans in force, by group key. Every call is made under the cluster state's ledger lock.

    Made, the plans attach to the state (`ClusterState.use_plans`): its watches read sealed plans back into them,
    and its ledger gives a member's slot back when the member's bind did not happen."""

    def __init__(self, state: ClusterState, timeout: float = GROUP_TIMEOUT_SECONDS, limit: int = MAX_PLANS) -> None:
        self._state = state
        self.timeout = timeout
        self._limit = limit
        self._plans: dict[str, Plan] = {}
        self._claims: dict[str, dict[int, str]] = {}  # group -> slot index -> member UID
        self._claimed_by: dict[str, tuple[str, int]] = {}  # member UID -> (group, slot index)
        state.use_plans(self)

    def __len__(self) -> int:
        return len(self._plans)

    @property
    def full(self) -> bool:
        return len(self._plans) >= self._limit

    def get(self, group: str) -> Plan | None:
        return self._plans.get(group)

    def open_slots(self, group: str) -> list[tuple[int, Slot]]:
        plan = self._plans.get(group)
        if plan is None:
            return []
        claims = self._claims[group]
        return [(index, slot) for index, slot in enumerate(plan.slots) if index not in claims]

    def claimed(self, group: str) -> list[str]:
        """The members holding a slot of the group's plan."""
        return list(self._claims.get(group, {}).values())

    def claim_of(self, uid: str, group: str) -> int | None:
        """The slot member `uid` holds in the group's plan, if any."""
        held = self._claimed_by.get(uid)
        return held[1] if held is not None and held[0] == group else None

    def install(self, plan: Plan, claims: Mapping[int, str] | None = None) -> None:
        """Put a plan in force (replacing the group's previous one): its open slots become PLANNED entries."""
        self.drop(plan.group)
        self._plans[plan.group] = plan
        self._claims[plan.group] = dict(claims or {})
        for index, uid in self._claims[plan.group].items():
            self._claimed_by[uid] = (plan.group, index)
        for index, slot in self.open_slots(plan.group):
            self._hold(plan, index, slot)

    def claim(self, group: str, uid: str, node: str, now: float) -> Slot | None:
        """Give member `uid` an open slot of its group's plan on `node` (its own, if it holds one already)."""
        plan = self._plans.get(group)
        if plan is None:
            return None
        held = self._claimed_by.get(uid)
        if held is not None and held[0] == group:
            slot = plan.slots[held[1]]
            return slot if slot.node == node else None
        for index, slot in self.open_slots(group):
            if slot.node == node:
                self._take(group, index, uid)
                self._plans[group] = replace(plan, expires=max(plan.expires, now + self.timeout))
                return slot
        return None

    def _take(self, group: str, index: int, uid: str) -> None:
        """Member `uid` holds slot `index`: the slot's PLANNED entry gives way to the member's own."""
        self._state.ledger.release(_slot_uid(group, index), freed=False)
        self._claims[group][index] = uid
        self._claimed_by[uid] = (group, index)

    def unclaim(self, uid: str) -> None:
        """The member's Binding was refused: its slot is open again while the plan lasts."""
        held = self._claimed_by.pop(uid, None)
        if held is None:
            return
        group, index = held
        plan = self._plans.get(group)
        if plan is not None and self._claims[group].get(index) == uid:
            del self._claims[group][index]
            self._hold(plan, index, plan.slots[index])

    def forget_member(self, uid: str) -> None:
        """The member ended: its slot stays claimed (its GPUs came free through its own entry)."""
        self._claimed_by.pop(uid, None)

    def expire(self, now: float) -> list[Plan]:
        """End the plans that ran out, and those whose every slot a bound member holds."""
        ended = [plan for plan in self._plans.values() if plan.expires <= now or self._settled(plan)]
        for plan in ended:
            self.drop(plan.group)
        return ended

    def drop(self, group: str) -> None:
        plan = self._plans.pop(group, None)
        if plan is None:
            return
        for index, _ in enumerate(plan.slots):
            self._state.ledger.release(_slot_uid(group, index), freed=False)
        for uid in self._claims.pop(group).values():
            self._claimed_by.pop(uid, None)

    def _settled(self, plan: Plan) -> bool:
        claims = self._claims[plan.group]
        if len(claims) < len(plan.slots):
            return False
        entries = (self._state.ledger.get(uid) for uid in claims.values())
        return all(entry is not None and entry.phase in (Phase.BOUND, Phase.ALLOCATED) for entry in entries)

    def _hold(self, plan: Plan, index: int, slot: Slot) -> None:
        view = self._state.view(slot.node)
        if view is None or view.compiled is None:
            return
        self._state.ledger.hold(_slot_uid(plan.group, index), f"plan:{plan.group}", slot.node,
                                frozenset(view.gpu_ids(slot.gpus)), plan.at)

    # The plan as sealed on members (DESIGN §10).

    def sealed(self, group: str, uid: str, node: str) -> str | None:
        """The annotation value that carries the group's plan on this member: the seal, a space, the plan."""
        plan = self._plans.get(group)
        if plan is None:
            return None
        text = encode_plan(plan, self._state)
        if text is None:
            return None
        return f"{self._state.seal.sign(uid, node, text, 'group-plan')} {text}"

    def restore(self, group: str, uid: str, node: str, value: object, held: frozenset[str]) -> None:
        """A bound member's sealed plan, read back after a restart: in force again unless it ran out or a newer
        plan of the group is in force; the member's own slot is claimed."""
        plan = self._unseal(group, uid, node, value)
        now = self._state.clock()
        current = self._plans.get(group)
        if plan is not None and plan.expires > now and (current is None or current.at < plan.at):
            if not self.full:
                self.install(plan)
        current = self._plans.get(group)
        if current is None:
            return
        view = self._state.view(node)
        for index, slot in self.open_slots(group):
            if slot.node == node and view is not None and frozenset(view.gpu_ids(slot.gpus)) == held:
                self._take(group, index, uid)
                return

    def _unseal(self, group: str, uid: str, node: str, value: object) -> Plan | None:
        if not isinstance(value, str) or len(value) > MAX_PLAN_BYTES + 64:
            return None
        seal, _, text = value.partition(" ")
        if not self._state.seal.verify(seal, uid, node, text, "group-plan"):
            return None
        try:
            return decode_plan(text, group, self._state)
        except (ValueError, orjson.JSONDecodeError) as error:
            log.warning("group %s: sealed plan on pod %s not read back: %s", group, uid, error)
            return None


def encode_plan(plan: Plan, state: ClusterState) -> str | None:
    slots = []
    for slot in plan.slots:
        view = state.view(slot.node)
        if view is None:
            return None
        slots.append([slot.node, ",".join(view.gpu_ids(slot.gpus))])
    text = orjson.dumps({"v": PLAN_VERSION, "group": plan.group, "span": plan.span, "domain": plan.domain,
                         "count": plan.count, "at": plan.at, "expires": plan.expires, "slots": slots}).decode()
    return text if len(text) <= MAX_PLAN_BYTES else None


def decode_plan(text: str, group: str, state: ClusterState) -> Plan:
    """A sealed plan: sealed by us, yet checked against the nodes as they are now (a node may have gone)."""
    raw: Any = orjson.loads(text)
    if not isinstance(raw, dict) or raw.get("v") != PLAN_VERSION or raw.get("group") != group:
        raise ValueError("not a plan of this group")
    slots_raw = raw.get("slots")
    count = raw.get("count")
    if not isinstance(slots_raw, list) or not 0 < len(slots_raw) <= MAX_GROUP_SIZE or not isinstance(count, int):
        raise ValueError("slots or count out of bounds")
    slots: list[Slot] = []
    for entry in slots_raw:
        if not (isinstance(entry, list) and len(entry) == 2 and all(isinstance(part, str) for part in entry)):
            raise ValueError("a slot is not [node, gpus]")
        view = state.view(entry[0])
        ids = entry[1].split(",")
        if view is None or not all(valid_id(gpu) and gpu in view.index_of for gpu in ids) or len(ids) != count:
            raise ValueError(f"slot on {entry[0][:63]!r} names GPUs the node does not have")
        slots.append(Slot(entry[0], view.mask(ids)))
    domain, span = raw.get("domain"), raw.get("span")
    if not isinstance(domain, str) or len(domain) > MAX_DOMAIN_LENGTH * 8 or not isinstance(span, str):
        raise ValueError("domain or span malformed")
    at, expires = raw.get("at"), raw.get("expires")
    if not isinstance(at, (int, float)) or not isinstance(expires, (int, float)):
        raise ValueError("times malformed")
    return Plan(group, span, domain, count, tuple(slots), float(at), float(expires))


def _slot_uid(group: str, index: int) -> str:
    return f"plan:{group}#{index}"
