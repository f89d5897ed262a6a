"""The ledger's entries: one GPU reservation per pod, indexed by pod and by node, with the releases a node's
report has not seen yet. Values and bookkeeping only; the ledger (extender/cache/ledger.py) is the one that
changes them, and says what each entry means.

Only two sources are trusted. The extender's own bind records: a reservation taken at bind, kept until the
outcome of the Binding is known, and after a restart the pod annotations that carry its seal. And the
kubelet, through the node agent's report of which pod holds which GPUs. When the report shows a pod, what
the kubelet allocated *replaces* the reservation (phase ALLOCATED); it is never added to it. A GPU is used
when the report says so (unless its pod ended after the report was taken), or when a live pod holds it in a
reservation the kubelet has not reported yet. A `gpus` annotation that a user wrote counts for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from threading import RLock

from extender.cache.node_view import NodeView


class Phase(str, Enum):
    PLANNED = "planned"  # an open slot of a group's plan (extender/groups/plans.py): held for a member to come
    BINDING = "binding"  # reserved; the Binding is in flight
    UNCERTAIN = "uncertain"  # the Binding's answer was lost: it may have committed; kept until that is known
    BOUND = "bound"  # the Binding committed (its answer, the watch, or our seal on the pod says so)
    ALLOCATED = "allocated"  # the kubelet reported these GPUs for the pod; they replaced the reservation


@dataclass(frozen=True, slots=True)
class Assignment:
    pod_uid: str
    pod_key: str  # namespace/name, as the node's report names pods
    node: str
    gpus: frozenset[str]  # GPU ids: UUIDs where the topology has them
    at: float  # when it was reserved, or last confirmed by the kubelet; epoch seconds
    phase: Phase
    expires: float | None = None  # UNCERTAIN: when to stop waiting for the watch to tell the outcome

    @property
    def confirmed(self) -> bool:
        """The kubelet has reported this pod's GPUs, so the node's report counts them, not the ledger."""
        return self.phase is Phase.ALLOCATED


class AssignmentBook:
    """Every call holds the ledger's re-entrant lock, which bind also holds while it chooses GPUs."""

    def __init__(self, lock: RLock) -> None:
        self.lock = lock
        self._by_pod: dict[str, Assignment] = {}
        self._by_node: dict[str, dict[str, Assignment]] = {}
        self._released: dict[str, dict[str, float]] = {}
        # The UNCERTAIN entries, so that the sweep each bind makes reads them alone, not every pod's.
        self._uncertain: dict[str, Assignment] = {}

    def __len__(self) -> int:
        return len(self._by_pod)

    def get(self, pod_uid: str) -> Assignment | None:
        return self._by_pod.get(pod_uid)

    def entries(self, node: str) -> list[Assignment]:
        with self.lock:
            return list(self._by_node.get(node, {}).values())

    def released_since(self, node: str, observed: float | None) -> frozenset[str]:
        """GPU ids freed after the report's observation, which its `used` list may still show."""
        with self.lock:
            released = self._released.get(node, {})
            return frozenset(gpu for gpu, at in released.items() if observed is None or at > observed)

    def put(self, assignment: Assignment) -> bool:
        """Whether a release of one of its GPUs was cleared (what `taken` reads of the node changed beyond it)."""
        with self.lock:
            previous = self._by_pod.get(assignment.pod_uid)
            if previous is not None:
                self._drop_from_node(previous)
            self._by_pod[assignment.pod_uid] = assignment
            self._by_node.setdefault(assignment.node, {})[assignment.pod_uid] = assignment
            if assignment.phase is Phase.UNCERTAIN:
                self._uncertain[assignment.pod_uid] = assignment
            else:
                self._uncertain.pop(assignment.pod_uid, None)
            released = self._released.get(assignment.node)
            if not released or assignment.phase is Phase.PLANNED:
                return False
            # A pod now holds these GPUs: the release before it no longer says they are free. A plan's slot
            # holds them for a pod to come, and gives them back to it, so the release still stands.
            cleared = [gpu for gpu in assignment.gpus if released.pop(gpu, None) is not None]
            return bool(cleared)

    def remove(self, pod_uid: str, at: float, *, freed: bool = True) -> Assignment | None:
        """Drop a pod's entry. `freed` says its GPUs really came free (the pod ended), not a bind that failed."""
        with self.lock:
            entry = self._by_pod.pop(pod_uid, None)
            if entry is None:
                return None
            self._drop_from_node(entry)
            self._uncertain.pop(pod_uid, None)
            if freed:
                released = self._released.setdefault(entry.node, {})
                for gpu in entry.gpus:
                    released[gpu] = at
            return entry

    def reporter_observed(self, node: str, observed: float) -> None:
        """Forget releases the report has now seen."""
        with self.lock:
            released = self._released.get(node)
            if released:
                for gpu in [gpu for gpu, at in released.items() if at <= observed]:
                    del released[gpu]

    def forget_node(self, node: str) -> None:
        with self.lock:
            for uid in list(self._by_node.pop(node, {})):
                self._by_pod.pop(uid, None)
                self._uncertain.pop(uid, None)
            self._released.pop(node, None)

    def pods(self) -> list[Assignment]:
        with self.lock:
            return list(self._by_pod.values())

    def expired(self, now: float) -> list[Assignment]:
        """UNCERTAIN entries whose wait for the outcome is over."""
        with self.lock:
            return [entry for entry in self._uncertain.values() if entry.expires is not None and entry.expires <= now]

    def taken(self, view: NodeView) -> int:
        """The node's GPUs in use, as a mask: what the kubelet reported (less what ended since the report), what
        DRA claims hold (kept apart: a claim is read live, not as of the report), and every entry neither shows
        yet, a pod's reservation or a plan's open slot alike."""
        assert view.compiled is not None
        with self.lock:
            taken = view.mask(view.reported_used - self.released_since(view.name, view.observed)) | view.dra_taken
            for entry in sorted(self.entries(view.name), key=lambda entry: entry.at):
                if entry.confirmed or covered(view, entry) or entry.pod_uid in view.dra_pods:
                    continue  # the kubelet's report, or the pod's DRA claims, count its GPUs
                reserved = view.mask(entry.gpus)
                # GPUs the kubelet has given to another pod meanwhile (a plugin that ignores us): this pod will
                # get as many others, so count it as many more, the lowest free ones, as the stock plugin picks.
                own = view.mask(view.reported_pods.get(entry.pod_key, ()))
                clash = (reserved & taken & ~own).bit_count()
                taken |= reserved
                for _ in range(clash):
                    spare = view.compiled.full_mask & ~taken & ~view.unhealthy
                    taken |= spare & -spare
            return taken

    def reconcile(self, view: NodeView, on_mismatch: Callable[[Assignment, frozenset[str]], None] | None) -> None:
        """What the kubelet allocated replaces each reservation the node's report covers; `on_mismatch` is told
        of a pod that got other GPUs than it was bound to."""
        if not view.reported_pods:
            return
        with self.lock:
            for entry in self.entries(view.name):
                if not covered(view, entry):
                    continue
                allocated = view.reported_pods[entry.pod_key]
                if entry.confirmed and entry.gpus == allocated:
                    continue
                if not entry.confirmed and entry.gpus != allocated and on_mismatch is not None:
                    on_mismatch(entry, allocated)
                assert view.observed is not None
                self.put(replace(entry, gpus=allocated, at=view.observed, phase=Phase.ALLOCATED, expires=None))

    def _drop_from_node(self, entry: Assignment) -> None:
        node_entries = self._by_node.get(entry.node, {})
        node_entries.pop(entry.pod_uid, None)
        if not node_entries:
            self._by_node.pop(entry.node, None)


def covered(view: NodeView, entry: Assignment) -> bool:
    """The report, taken after this entry, shows its pod with all its GPUs: the kubelet allocated it.

    A pod the kubelet is still admitting is listed with the containers done so far; and GPUs that only its plain
    init containers hold are never listed (pod-resources shows app containers and sidecars), though the kubelet
    keeps them allocated. So a report that shows fewer GPUs than reserved covers nothing: the reservation still
    counts, beside the GPUs reported. A plan's open slot is no pod's, so no report ever covers it."""
    if view.observed is None or entry.at > view.observed:
        return False
    allocated = view.reported_pods.get(entry.pod_key)
    return allocated is not None and len(allocated) >= len(entry.gpus)
