"""The ledger: the one owner of GPU reservations, reconciled with what the kubelet reports, as scheduler-plugins'
noderesourcetopology cache reconciles its reservations with node reports.

Whoever takes or gives back GPUs asks the ledger once: bind reserves a set on a node (`reserve`) and settles it by
its Binding's outcome (`bound`, `uncertain`, `release`), a group plan holds its open slots (`hold`), the watches
report pods bound or gone and nodes reporting. Behind each call the ledger keeps the rest in step under its one
lock: the entries (extender/cache/assignments.py), the node's free mask in its view (and with it the node's key and
the domain index), the releases a report has not seen yet, and a group's slot when a member's bind did not happen.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from threading import RLock
from typing import Protocol

from extender.cache.assignments import Assignment, AssignmentBook, Phase
from extender.cache.node_view import NodeView

# How long a reservation whose Binding answer was lost waits for the watch to tell whether it committed:
# kube-apiserver's default --request-timeout, after which an accepted request has surely finished.
BIND_OUTCOME_SECONDS = 60.0

Mismatch = Callable[[Assignment, frozenset[str]], None]


class NodeViews(Protocol):
    """The node views whose free masks the ledger keeps (the cluster state)."""

    def view(self, name: str) -> NodeView | None: ...

    def store(self, view: NodeView) -> None: ...


class SlotClaims(Protocol):
    """The group plans whose open slots the ledger holds (extender/groups/plans.py), as the ledger tells them that
    a member's bind did not happen: its slot opens again."""

    def unclaim(self, pod_uid: str) -> None: ...


class NoClaims:
    """No group plans: nothing was claimed."""

    def unclaim(self, pod_uid: str) -> None:
        """Nothing to open again."""


class Ledger:
    """Every change happens under one re-entrant lock, which bind also holds while it chooses GPUs."""

    def __init__(self, nodes: NodeViews, placed: Callable[[str], str | None],
                 clock: Callable[[], float] = time.time, bind_outcome_seconds: float = BIND_OUTCOME_SECONDS) -> None:
        """`placed` tells where the watch shows a pod bound (None: unbound or unknown)."""
        self.lock = RLock()
        self.clock = clock
        self.bind_outcome_seconds = bind_outcome_seconds
        self.on_mismatch: Mismatch | None = None  # told when the kubelet allocated other GPUs than we bound
        self.claims: SlotClaims = NoClaims()
        self._book = AssignmentBook(self.lock)
        self._nodes = nodes
        self._placed = placed

    def __len__(self) -> int:
        return len(self._book)

    def get(self, pod_uid: str) -> Assignment | None:
        return self._book.get(pod_uid)

    def entries(self, node: str) -> list[Assignment]:
        return self._book.entries(node)

    def pods(self) -> list[Assignment]:
        return self._book.pods()

    def taken(self, view: NodeView) -> int:
        return self._book.taken(view)

    def reserve(self, pod_uid: str, pod_key: str, node: str, gpus: frozenset[str]) -> Assignment:
        """Reserve `gpus` on `node` for a bind about to post its Binding (BINDING). A reservation whose last
        Binding's answer was lost is taken again as it was, for the Binding sent again with the same GPUs."""
        with self.lock:
            previous = self._book.get(pod_uid)
            again = previous is not None and (previous.node, previous.gpus) == (node, gpus)
            assignment = Assignment(pod_uid, pod_key, node, gpus, previous.at if previous and again else self.clock(),
                                    Phase.BINDING)
            self.record(assignment)
            return assignment

    def bound(self, assignment: Assignment) -> None:
        """The Binding committed (its answer, the watch, or a read after a conflict says so)."""
        self.record(replace(assignment, phase=Phase.BOUND, expires=None))

    def hold(self, slot_uid: str, owner: str, node: str, gpus: frozenset[str], at: float) -> None:
        """Hold a group plan's open slot (PLANNED) for a member to come."""
        self.record(Assignment(slot_uid, owner, node, gpus, at, Phase.PLANNED))

    def record(self, assignment: Assignment) -> None:
        """Put an entry in, replacing the pod's previous one, and keep the node's free mask in step."""
        with self.lock:
            previous = self._book.get(assignment.pod_uid)
            cleared = self._book.put(assignment)
            if previous is not None and not cleared and _holds_alike(previous, assignment):
                return  # a bind's BINDING turned BOUND (by its answer or the watch): the node's GPUs are as they were
            self.refresh(assignment.node)
            if previous is not None and previous.node != assignment.node:
                self.refresh(previous.node)

    def release(self, pod_uid: str, *, freed: bool) -> None:
        """`freed`: the pod ended. Otherwise its bind did not happen, and a group slot it claimed opens again."""
        with self.lock:
            if not freed:
                self.claims.unclaim(pod_uid)
            entry = self._book.remove(pod_uid, self.clock(), freed=freed)
            if entry is not None:
                self.refresh(entry.node)

    def uncertain(self, pod_uid: str) -> None:
        """The Binding's answer was lost: keep the reservation until the watch, or time, tells the outcome."""
        with self.lock:
            entry = self._book.get(pod_uid)
            if entry is not None and entry.phase is Phase.BINDING:
                self._book.put(replace(entry, phase=Phase.UNCERTAIN, expires=self.clock() + self.bind_outcome_seconds))

    def sweep(self) -> None:
        """End the waits that ran out: a pod the watch still shows unbound was not bound by the lost Binding."""
        with self.lock:
            for entry in self._book.expired(self.clock()):
                if self._placed(entry.pod_uid) == entry.node:
                    self.bound(entry)
                else:
                    self.release(entry.pod_uid, freed=False)

    def reported(self, view: NodeView) -> None:
        """The node's agent reported (or the node changed): releases it has seen are forgotten, what the kubelet
        allocated replaces each reservation the report covers, and the node's free mask follows."""
        with self.lock:
            if view.observed is not None:
                self._book.reporter_observed(view.name, view.observed)
            self._book.reconcile(view, self.on_mismatch)
            self.refresh(view.name)

    def forget_node(self, node: str) -> None:
        self._book.forget_node(node)

    def refresh(self, node: str) -> None:
        """Recompute a node's free mask from what is taken."""
        with self.lock:
            view = self._nodes.view(node)
            if view is None or view.compiled is None:
                return
            free = view.compiled.full_mask & ~self._book.taken(view) & ~view.unhealthy
            if free != view.free:
                self._nodes.store(replace(view, free=free))


def _holds_alike(previous: Assignment, current: Assignment) -> bool:
    """Two entries that `taken` counts alike (it reads neither the phase, beyond `confirmed`, nor the expiry): one
    may replace the other, if that clears no release, without recomputing the node."""
    return (previous.node == current.node and previous.gpus == current.gpus and previous.at == current.at
            and previous.pod_key == current.pod_key and previous.confirmed == current.confirmed)
