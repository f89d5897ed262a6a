"""Leader election on a `coordination.k8s.io/v1` Lease, with the semantics of client-go's leaderelection.

Only the leader binds, so two replicas never hand out the same GPU. The rules, as client-go keeps them:
- A candidate takes the Lease when nobody holds it, or when the holder has not renewed it for
  `leaseDurationSeconds`. That time is measured on this replica's own clock, from the moment it last saw
  the record change, never from the `renewTime` another machine wrote: clocks may disagree, and only the
  rates at which they run matter.
- Every write is an update at the Lease's resourceVersion, so of two candidates racing for an expired
  Lease one gets a 409 and stays a candidate.
- A leader counts as leading until `renew_deadline` after the start of its last successful renewal. That
  is earlier than any other replica can take over (`lease_duration` after it saw that renewal), so a
  leader that cannot reach the API server stops binding before a successor starts; the gap between the two
  durations (5 s by default) also covers a bind already on its way.
- `leaseTransitions` counts changes of holder; `acquireTime` is kept while the same holder renews.

The elector is pure over a small `LeaseApi` and an injectable clock, so the rules are tested without
waiting. Each time this replica wins after not leading, a new term begins and listeners are told, so the
service can rebuild its ledger before it binds and labels its Pod (extender/kube/leader_label.py).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from extender.kube.client import KubeError

log = logging.getLogger(__name__)

# The Lease's own bound on leaseDurationSeconds that we honour; a longer one (a hand edit) counts as ours.
MAX_LEASE_SECONDS = 3600
_JITTER = 0.2  # candidates retry after retry_period x [1, 1.2], as client-go's JitterFactor


@dataclass(frozen=True, slots=True)
class Timings:
    """client-go's defaults, as kube-scheduler uses them: lease 15 s, renew deadline 10 s, retry 2 s."""

    lease_duration: int = 15
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period * (1 + _JITTER) < self.renew_deadline < self.lease_duration:
            raise ValueError("leader election needs lease duration > renew deadline > 1.2 x retry period > 0, got "
                             f"{self.lease_duration}, {self.renew_deadline} and {self.retry_period}")


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The Lease's spec, as far as the election reads it."""

    holder: str = ""
    duration: int = 0
    acquired: str | None = None  # MicroTime text, kept as written
    renewed: str | None = None
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: dict[str, Any]) -> LeaseRecord:
        """Read leniently: a field of the wrong type reads as unset, so a mangled Lease can still be taken over."""
        spec = lease.get("spec")
        spec = spec if isinstance(spec, dict) else {}
        holder, duration, transitions = (spec.get(key) for key in
                                         ("holderIdentity", "leaseDurationSeconds", "leaseTransitions"))
        return cls(holder if isinstance(holder, str) else "",
                   duration if type(duration) is int else 0,
                   _text(spec.get("acquireTime")), _text(spec.get("renewTime")),
                   transitions if type(transitions) is int and transitions >= 0 else 0)

    def spec(self) -> dict[str, Any]:
        return {"holderIdentity": self.holder, "leaseDurationSeconds": self.duration, "acquireTime": self.acquired,
                "renewTime": self.renewed, "leaseTransitions": self.transitions}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


class LeaseApi(Protocol):
    """The three Lease calls; each raises `KubeError` (`Conflict` for a 409)."""

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...  # None: no such Lease

    def create_lease(self, namespace: str, lease: dict[str, Any]) -> dict[str, Any]: ...

    def replace_lease(self, namespace: str, name: str, lease: dict[str, Any]) -> dict[str, Any]: ...


def micro_time(moment: datetime) -> str:
    """metav1.MicroTime's text form. The client re-serializes it through `datetime.isoformat`, which drops a
    zero fraction that the API server's parser requires, so the fraction is never zero."""
    return moment.astimezone(UTC).replace(microsecond=moment.microsecond or 1).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease in a daemon thread (`start`), or one `step()` at a time in tests."""

    def __init__(self, api: LeaseApi, namespace: str, name: str, identity: str, timings: Timings = Timings(), *,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 rand: Callable[[], float] = random.random) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        self.api, self.namespace, self.name, self.identity, self.timings = api, namespace, name, identity, timings
        self._clock, self._wall, self._rand = clock, wall, rand
        self._lock = threading.Lock()
        self._observed: LeaseRecord | None = None
        self._observed_at = 0.0
        self._renewed: float | None = None  # clock() at the start of the last successful write of ours
        self._term = 0
        self._announced = False
        self._listeners: list[Callable[[int], None]] = []
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # -- what the rest of the extender asks ------------------------------------------------------------------

    def is_leader(self) -> bool:
        """True while this replica may act as the leader: within the renew deadline of its last renewal."""
        with self._lock:
            return self._within_deadline()

    def term(self) -> int | None:
        """The number of the current term while leading (it grows with each win), None otherwise."""
        with self._lock:
            return self._term if self._within_deadline() and self._announced else None

    def _within_deadline(self) -> bool:
        return self._renewed is not None and self._clock() - self._renewed < self.timings.renew_deadline

    def on_new_term(self, listener: Callable[[int], None]) -> None:
        """Call `listener(term)` each time this replica starts leading."""
        self._listeners.append(listener)

    # -- the campaign ----------------------------------------------------------------------------------------

    def step(self) -> bool:
        """One attempt to acquire or renew, and the change of term it makes; True if this replica leads."""
        continuing = self.is_leader()
        won = self.try_acquire_or_renew()
        if won and not continuing:
            with self._lock:
                self._term += 1
                self._announced = True
                term = self._term
            log.info("leader election: %s leads %s/%s (term %d)", self.identity, self.namespace, self.name, term)
            for listener in self._listeners:
                listener(term)
        elif not won and self._announced and not self.is_leader():
            with self._lock:
                self._announced = False
            log.warning("leader election: %s could not renew %s/%s within %.1f s: stepped down",
                        self.identity, self.namespace, self.name, self.timings.renew_deadline)
        return won

    def try_acquire_or_renew(self) -> bool:
        """Read the Lease and write it as ours if it is ours or free or expired; a failed call or a lost race
        is False."""
        started = self._clock()
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease is None:
                written = self.api.create_lease(self.namespace,
                                                self._lease(self._record(None), None))
            else:
                current = LeaseRecord.from_lease(lease)
                self._observe(current)
                if current.holder not in ("", self.identity) and not self._expired(current):
                    return False
                written = self.api.replace_lease(self.namespace, self.name,
                                                 self._lease(self._record(current), lease))
        except KubeError as error:
            log.info("leader election: %s/%s: %s", self.namespace, self.name, error)
            return False
        self._observe(LeaseRecord.from_lease(written))
        with self._lock:
            self._renewed = started
        return True

    def _lease(self, record: LeaseRecord, previous: dict[str, Any] | None) -> dict[str, Any]:
        """The Lease to write; an update carries the resourceVersion it read, so a lost race is a 409."""
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if previous is not None:
            read = previous.get("metadata")
            metadata["resourceVersion"] = read.get("resourceVersion") if isinstance(read, dict) else None
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": record.spec()}

    def _record(self, current: LeaseRecord | None) -> LeaseRecord:
        """This replica's record over `current` (None: a new Lease): a renewal keeps the acquire time and the
        count of transitions, a takeover counts one more."""
        now = micro_time(self._wall())
        if current is None:
            return LeaseRecord(self.identity, self.timings.lease_duration, now, now, 0)
        if current.holder == self.identity:
            return LeaseRecord(self.identity, self.timings.lease_duration, current.acquired or now, now,
                               current.transitions)
        return LeaseRecord(self.identity, self.timings.lease_duration, now, now, current.transitions + 1)

    def _observe(self, record: LeaseRecord) -> None:
        with self._lock:
            if record != self._observed:
                self._observed, self._observed_at = record, self._clock()

    def _expired(self, record: LeaseRecord) -> bool:
        with self._lock:
            return self._clock() >= self._expires_at(record)

    def _expires_at(self, record: LeaseRecord) -> float:
        """When `record`, last seen changed at `_observed_at`, expires on this replica's clock (holding the lock)."""
        duration = record.duration if 0 < record.duration <= MAX_LEASE_SECONDS else self.timings.lease_duration
        return self._observed_at + duration

    def next_attempt(self, leading: bool) -> float:
        """Seconds to the next step: a leader renews every retry period; a candidate retries after a little more
        (client-go's jitter), or wakes when the Lease another holds expires, if that comes first. Waiting for the
        next retry instead would add up to 1.2 retry periods to a failover after a crash."""
        delay = self.timings.retry_period * (1.0 if leading else 1.0 + _JITTER * self._rand())
        with self._lock:
            record = self._observed
            if leading or record is None or record.holder in ("", self.identity):
                return delay
            left = self._expires_at(record) - self._clock()
        return left if 0 < left < delay else delay  # at or past expiry an attempt failed: retry as usual

    # -- the thread ------------------------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("leader election already started")
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._stopping.wait(self.next_attempt(self.step()))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop campaigning and, if leading, hand the Lease back so a successor need not wait for it to expire.

        Call it only once this replica has stopped binding."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self.is_leader():
            self.release()

    def release(self) -> None:
        """Clear the holder, as client-go's ReleaseOnCancel does; a failure only leaves the Lease to expire."""
        with self._lock:
            self._renewed = None
            self._announced = False
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            current = LeaseRecord.from_lease(lease) if lease is not None else None
            if current is None or current.holder != self.identity:
                return
            now = micro_time(self._wall())
            released = LeaseRecord("", 1, now, now, current.transitions)
            self.api.replace_lease(self.namespace, self.name, self._lease(released, lease))
            log.info("leader election: %s released %s/%s", self.identity, self.namespace, self.name)
        except KubeError as error:
            log.warning("leader election: releasing %s/%s: %s; it expires by itself", self.namespace, self.name,
                        error)
