"""Scheduler-side GPU reservations, reconciled with what node reporters say.

The reporter's `used` list lags: a pod bound a moment ago is not in it yet, and a pod that just finished
still is. So a GPU counts as used when the reporter says so, unless we saw its pod end after the reporter's
observation, or when a live pod holds it in the ledger. Entries come from our binds and, after a restart,
from the `gpus` annotation of bound pods, so the union never hands a GPU out twice. This plays the part of
the over-reserve cache in scheduler-plugins' noderesourcetopology.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from threading import RLock


class Phase(str, Enum):
    BINDING = "binding"  # reserved; the Binding is not confirmed yet
    BOUND = "bound"


@dataclass(frozen=True, slots=True)
class Assignment:
    pod_uid: str
    pod_key: str
    node: str
    gpus: frozenset[str]  # GPU ids: UUIDs where the topology has them
    at: float
    phase: Phase


class Ledger:
    """All mutation happens under one re-entrant lock, which bind also holds while it chooses GPUs."""

    def __init__(self) -> None:
        self.lock = RLock()
        self._by_pod: dict[str, Assignment] = {}
        self._by_node: dict[str, dict[str, Assignment]] = {}
        self._released: dict[str, dict[str, float]] = {}

    def __len__(self) -> int:
        return len(self._by_pod)

    def get(self, pod_uid: str) -> Assignment | None:
        return self._by_pod.get(pod_uid)

    def held(self, node: str) -> frozenset[str]:
        """GPU ids that live pods hold on the node."""
        with self.lock:
            return frozenset(gpu for entry in self._by_node.get(node, {}).values() for gpu in entry.gpus)

    def released_since(self, node: str, observed: float | None) -> frozenset[str]:
        """GPU ids freed after the reporter's observation, which its `used` list may still show."""
        with self.lock:
            released = self._released.get(node, {})
            return frozenset(gpu for gpu, at in released.items() if observed is None or at > observed)

    def record(self, assignment: Assignment) -> None:
        with self.lock:
            previous = self._by_pod.get(assignment.pod_uid)
            if previous is not None:
                self._by_node.get(previous.node, {}).pop(previous.pod_uid, None)
            self._by_pod[assignment.pod_uid] = assignment
            self._by_node.setdefault(assignment.node, {})[assignment.pod_uid] = assignment
            released = self._released.get(assignment.node)
            if released:
                for gpu in assignment.gpus:
                    released.pop(gpu, None)

    def release(self, pod_uid: str, at: float, *, freed: bool = True) -> Assignment | None:
        """Drop a pod's entry. `freed` says its GPUs really came free (the pod ended), not a rolled-back bind."""
        with self.lock:
            entry = self._by_pod.pop(pod_uid, None)
            if entry is None:
                return None
            node_entries = self._by_node.get(entry.node, {})
            node_entries.pop(pod_uid, None)
            if not node_entries:
                self._by_node.pop(entry.node, None)
            if freed:
                released = self._released.setdefault(entry.node, {})
                for gpu in entry.gpus:
                    released[gpu] = at
            return entry

    def reporter_observed(self, node: str, observed: float) -> None:
        """Forget releases the reporter has now seen."""
        with self.lock:
            released = self._released.get(node)
            if released:
                for gpu in [gpu for gpu, at in released.items() if at <= observed]:
                    del released[gpu]

    def forget_node(self, node: str) -> None:
        with self.lock:
            for uid in list(self._by_node.pop(node, {})):
                self._by_pod.pop(uid, None)
            self._released.pop(node, None)

    def pods(self) -> list[Assignment]:
        with self.lock:
            return list(self._by_pod.values())
