"""Delay scheduling for topology: a multi-GPU pod that states no requirement of its own waits, for a bounded
time, for a node that can give it the best ring its size gets on that node's board, before it takes the best
ring on offer.

Why: at high load the only node with enough free GPUs often has them scattered, and a pod placed there keeps
its slow ring for its whole run (an all-reduce over PCIe between sockets instead of NVLink), while a departure
minutes later would have freed a full set. The replay (loadtests/replay, BENCHMARKS.md) measured the trade.
This is Zaharia et al.'s delay scheduling (EuroSys '10) applied to GPU sets: a short, bounded wait buys
placement quality, and the bound keeps every pod schedulable.

The wait runs from the first filter call for the pod, not from its creation: kube-scheduler calls the extender
only with nodes that can hold the pod by count, so that call is the first moment the pod could have run. A pod
that queued an hour for GPUs by count still gets its wait for a good set, as delay scheduling counts from the
first offer of a slot.

How kube-scheduler retries such a pod: our filter is an extender, so a pod it refuses carries the "Extender"
rejector, which any cluster event requeues after the pod's backoff (at most 10 s); a busy cluster retries it
within seconds, an idle one at the 5-minute flush of unschedulable pods.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from extender.api.pod_request import PodRequest
from topology.bounds import MAX_TOPOLOGY_WAIT_SECONDS

TOPOLOGY_WAIT_SECONDS = 600.0
"""How long a pod waits by default (--topology-wait; 0 turns the wait off). Measured in the replay (mixed fleet,
the Alibaba 2023 size mix at 90% load, seeds 1-3): multi-GPU pods at full bandwidth 86.8% without the wait,
91.3% at 300 s (Slurm's max_switch_wait default), 92.8% at 600 s, 93.4% at 900 s, with GPU utilization
79.8%, 80.0%, 80.3%, 80.5% and p95 pending 1,227 s, 1,188 s, 1,211 s, 1,908 s: 600 s gains most of what
waiting gives before the queue's tail grows."""
MAX_WAITING_PODS = 32_768
"""Pods whose wait is remembered. Past that the oldest is forgotten and, if it comes back, waits once more:
at most one more wait, never an unbounded one, and never more memory."""
WAITING = "waiting for a node with a full-bandwidth GPU set (topology wait)"


class WaitClock:
    """When each pod's wait started, by UID: the first time it was asked about."""

    def __init__(self, wait_seconds: float, limit: int = MAX_WAITING_PODS) -> None:
        if not 0 <= wait_seconds <= MAX_TOPOLOGY_WAIT_SECONDS:
            raise ValueError(f"the topology wait must be 0 to {MAX_TOPOLOGY_WAIT_SECONDS:g} s, not {wait_seconds}")
        self.wait_seconds = wait_seconds
        self._limit = limit
        self._started: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def waits(self, pod: PodRequest, now: float) -> bool:
        """The pod still holds out for a full-bandwidth set: it asks for 2 GPUs or more, requires nothing
        itself (a stated requirement is its own, unbounded, wait) and its wait (its own annotation, else the
        extender's) has not run out. A pod whose DRA claims narrow their devices by selectors does not wait: the
        first fit the extender predicts is not what the allocator will give it (a UUID pin, say)."""
        request = pod.request
        if request is None or request.count < 2 or pod.required or not pod.uid or pod.selected:
            return False
        return self.holds(pod.uid, self.seconds(pod), now)

    def holds(self, owner: str, wait: float, now: float) -> bool:
        """The wait of `owner` (a pod's UID, or a group's key: its members share one wait) has not run out;
        it starts now if it has not started."""
        if wait <= 0:
            return False
        with self._lock:
            started = self._started.setdefault(owner, now)
            if len(self._started) > self._limit:
                self._started.popitem(last=False)
        return now - started < wait

    def seconds(self, pod: PodRequest) -> float:
        """The pod's wait: its own annotation, else the extender's."""
        return self.wait_seconds if pod.wait_seconds is None else pod.wait_seconds

    def deadline(self, owner: str, wait: float) -> float | None:
        """When the wait of `owner` ends, if it has started."""
        with self._lock:
            started = self._started.get(owner)
        return None if started is None else started + wait

    def forget(self, uid: str) -> None:
        """The pod was bound or deleted, or the group planned."""
        with self._lock:
            self._started.pop(uid, None)

    def __len__(self) -> int:
        return len(self._started)
