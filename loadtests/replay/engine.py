"""The event-driven replay: pods arrive, are placed by a policy, run and leave.

A pod that cannot be placed when it arrives waits, and is retried in arrival order as kube-scheduler's queue
retries it (pkg/scheduler/internal/queue, v1.36):
- a pod that no node could hold by count (NodeResourcesFit) is retried when a departure frees GPUs on a node
  of its pool that can now hold it: that plugin's queueing hint. Placements only take GPUs away and a node's
  verdict depends on that node alone, so every other such pod would fail again;
- a pod that fit by count but that the policy declined (our extender's filter refused every node) carries the
  "Extender" rejector, which any cluster event requeues, after the pod's backoff (1 s doubling per attempt, at
  most 10 s). Its retry is due at the later of that backoff and the next placement or departure.
A group's members (model.py) arrive together and are scheduled together: at its arrival and whenever one of
them is retried, its waiting members are attempted in order until one is not placed (count alone fails the rest
too; Kueue admits a group whole; our extender plans it whole at its first member). A member placed holds its
GPUs while the others wait; the group runs from its last member's placement, and its members leave together.
How long a job runs is the run-time model's to say from where it landed (runtime.py); without one, its duration.
At one instant departures come before arrivals. The only randomness is kube-scheduler's tie-break among equal
node scores, drawn from one `random.Random(seed)` per run, so a run is a function of (cluster, workload,
policy, seed).
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from loadtests.replay.boards import board, board_key
from loadtests.replay.model import ClusterNode, Job


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpus: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one job: when it was placed and where, or never (placed_s and placement None)."""

    job: Job
    placed_s: float | None
    placement: Placement | None
    run_s: float | None = None
    """How long its job ran once started (a member: its group's run); None: never started."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The free GPU mask of every node (in cluster order) at one instant, for fragmentation over time."""

    time_s: float
    free: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Run:
    policy: str
    seed: int
    nodes: tuple[ClusterNode, ...]
    outcomes: tuple[Outcome, ...]
    """In workload order."""
    snapshots: tuple[Snapshot, ...]


class Fleet:
    """What each node has free now: the state every policy reads, and only the engine writes."""

    def __init__(self, nodes: Sequence[ClusterNode]) -> None:
        if len({node.name for node in nodes}) != len(nodes):
            raise ValueError("cluster node names must be unique")
        self.nodes = tuple(nodes)
        self.key = {node.name: board_key(node) for node in nodes}
        compiled = {name: board(key) for name, key in self.key.items()}
        self.size = {name: topology.size for name, topology in compiled.items()}
        self.free = {name: topology.full_mask for name, topology in compiled.items()}
        self.free_count = dict(self.size)
        pools: dict[str | None, list[str]] = {None: [node.name for node in nodes]}
        for node in nodes:
            pools.setdefault(node.gpu_model, []).append(node.name)
        self.pools = {model: tuple(names) for model, names in pools.items()}
        self.members = {model: frozenset(names) for model, names in pools.items()}

    def fits_by_count(self, job: Job) -> bool:
        """kube-scheduler's own filter passes some node: the node selector (NodeAffinity) and enough free GPUs
        (NodeResourcesFit)."""
        free = self.free_count
        return any(free[name] >= job.gpus for name in self.pools.get(job.gpu_model, ()))

    def find_feasible(self, job: Job, limit: int, start: int) -> tuple[list[str], int]:
        """kube-scheduler's filter pass: nodes in cluster order from `start`, round the end, until `limit` are
        feasible by count and selector; returns them and where the next pod's pass starts."""
        names, members, free, n = self.pools[None], self.members.get(job.gpu_model, frozenset()), self.free_count, len(
            self.nodes)
        found: list[str] = []
        processed = n
        for step in range(n):
            name = names[(start + step) % n]
            if name in members and free[name] >= job.gpus:
                found.append(name)
                if len(found) == limit:
                    processed = step + 1
                    break
        return found, (start + processed) % n

    def take(self, placement: Placement) -> None:
        mask = sum(1 << gpu for gpu in placement.gpus)
        if self.free[placement.node] & mask != mask or len(placement.gpus) != len(set(placement.gpus)):
            raise ValueError(f"{placement} takes GPUs that are not free")
        self.free[placement.node] &= ~mask
        self.free_count[placement.node] -= len(placement.gpus)

    def release(self, placement: Placement) -> None:
        self.free[placement.node] |= sum(1 << gpu for gpu in placement.gpus)
        self.free_count[placement.node] += len(placement.gpus)


INITIAL_BACKOFF_S = 1.0
MAX_BACKOFF_S = 10.0
"""kube-scheduler's podInitialBackoffSeconds and podMaxBackoffSeconds defaults."""
DECLINED_TAIL_S = 86_400.0
"""After the last event, declined pods are still retried (kube-scheduler flushes them every 5 minutes) for
this long, so a policy that declines a pod forever cannot keep a replay running."""


def backoff_s(attempts: int) -> float:
    """A pod's backoff after `attempts` failed scheduling attempts (kube-scheduler's calculateBackoffDuration)."""
    return min(INITIAL_BACKOFF_S * 2 ** min(attempts - 1, 10), MAX_BACKOFF_S)


class Policy(Protocol):
    """Chooses a node and GPUs for a job on the fleet as it is at `now`, or None to keep the job waiting."""

    name: str

    def place(self, job: Job, fleet: Fleet, rng: random.Random, now: float) -> Placement | None: ...

    def release(self, job: Job, placement: Placement) -> None: ...


def groups_of(workload: Sequence[Job]) -> dict[str, tuple[int, ...]]:
    """Each group's member indices in the workload, checked: consecutive, as many as its `pods`, with one arrival
    and one duration."""
    members: dict[str, list[int]] = {}
    for index, job in enumerate(workload):
        if job.group is not None:
            members.setdefault(job.group, []).append(index)
        elif job.pods != 1:
            raise ValueError(f"{job.name}: {job.pods} pods but no group")
    for group, indices in members.items():
        first = workload[indices[0]]
        if (indices != list(range(indices[0], indices[0] + len(indices))) or len(indices) != first.pods
                or any((workload[at].submit_s, workload[at].duration_s, workload[at].pods)
                       != (first.submit_s, first.duration_s, first.pods) for at in indices)):
            raise ValueError(f"group {group}: its {first.pods} members must be consecutive jobs with one arrival and "
                             "one duration")
    return {group: tuple(indices) for group, indices in members.items()}


RunSeconds = Callable[[Job, Sequence[Placement]], float]
"""How long a job runs from its start, given where it landed (a group: every member's placement)."""


def _duration(job: Job, placements: Sequence[Placement]) -> float:
    return job.duration_s


def replay(nodes: Sequence[ClusterNode], workload: Sequence[Job], policy: Policy, seed: int, *,
           samples: int = 200, progress: Callable[[int], None] | None = None,
           run_seconds: RunSeconds = _duration) -> Run:
    """Replay the workload on a fresh fleet; `progress` is told of each job that arrives, `run_seconds` says how
    long a job runs where it landed (runtime.RunTime.seconds; by default its duration)."""
    if any(later.submit_s < earlier.submit_s for earlier, later in zip(workload, workload[1:])):
        raise ValueError("the workload must be sorted by submit_s")
    if len({job.name for job in workload}) != len(workload):
        raise ValueError("job names must be unique: policies follow a job by its name")
    members = groups_of(workload)
    unplaced = {group: len(indices) for group, indices in members.items()}
    fleet, rng = Fleet(nodes), random.Random(seed)
    placed: list[tuple[float, Placement] | None] = [None] * len(workload)
    ran: list[float | None] = [None] * len(workload)
    waiting: dict[int, None] = {}  # in arrival order
    attempts = [0] * len(workload)
    declined: list[tuple[float, int]] = []  # (retry due, job) for pods the policy declined
    due_at: dict[int, float] = {}  # each declined pod's latest due time: older heap entries are void
    departures: list[tuple[float, int]] = []
    horizon = workload[-1].submit_s if workload else 0.0
    sample_times = [horizon * step / samples for step in range(samples + 1)] if samples else []
    snapshots: list[Snapshot] = []

    def sample_before(now: float) -> None:
        """Samples hold the state after every event at their instant: take those before `now` first."""
        while sample_times and sample_times[0] < now:
            snapshots.append(Snapshot(sample_times.pop(0), tuple(fleet.free[node.name] for node in fleet.nodes)))

    def attempt(index: int, now: float) -> bool:
        job = workload[index]
        attempts[index] += 1
        if not fleet.fits_by_count(job):
            return False
        placement = policy.place(job, fleet, rng, now)
        if placement is None:
            due_at[index] = now + backoff_s(attempts[index])
            heapq.heappush(declined, (due_at[index], index))
            return False
        due_at.pop(index, None)
        fleet.take(placement)
        placed[index] = (now, placement)
        waiting.pop(index, None)
        start(index, now)
        return True

    def start(index: int, now: float) -> None:
        """A pod runs from its placement; a group once its last member is placed, then all leave together."""
        group = workload[index].group
        if group is None:
            entry = placed[index]
            assert entry is not None
            seconds = ran[index] = run_seconds(workload[index], (entry[1],))
            heapq.heappush(departures, (now + seconds, index))
            return
        unplaced[group] -= 1
        if not unplaced[group]:
            placements = [entry[1] for member in members[group] if (entry := placed[member]) is not None]
            seconds = run_seconds(workload[index], placements)
            for member in members[group]:
                ran[member] = seconds
                heapq.heappush(departures, (now + seconds, member))

    def attempt_members(index: int, now: float) -> bool:
        """A pod on its own, or its group's waiting members in order until one is not placed; True if any was."""
        group = workload[index].group
        if group is None:
            return attempt(index, now)
        placed_any = False
        for member in members[group]:
            if member in waiting:
                if not attempt(member, now):
                    break
                placed_any = True
        return placed_any

    def first_try(index: int, tried: set[str]) -> bool:
        """Whether a retry round tries this waiting pod: a group is tried once, from its first waiting member."""
        group = workload[index].group
        if group is None:
            return True
        if group in tried:
            return False
        tried.add(group)
        return True

    def retry_declined(now: float) -> None:
        """After a cluster event: the declined pods whose backoff has passed, in arrival order."""
        due: list[int] = []
        while declined and declined[0][0] <= now:
            when, index = heapq.heappop(declined)
            if due_at.get(index) == when:
                due.append(index)
        tried: set[str] = set()
        for index in sorted(due):
            if index in waiting and first_try(index, tried):
                attempt_members(index, now)

    def depart(now: float) -> None:
        _, index = heapq.heappop(departures)
        job, (_, placement) = workload[index], placed[index]
        fleet.release(placement)
        policy.release(job, placement)
        node, free = placement.node, fleet.free_count
        tried: set[str] = set()
        for waiter in list(waiting):
            if waiter not in waiting:
                continue
            candidate = workload[waiter]
            if (candidate.gpus <= free[node] and node in fleet.members.get(candidate.gpu_model, ())
                    and first_try(waiter, tried)):
                attempt_members(waiter, now)
        retry_declined(now)

    index = 0
    while index < len(workload):
        job = workload[index]
        arriving = members[job.group] if job.group is not None else (index,)
        while departures and departures[0][0] <= job.submit_s:
            now = departures[0][0]
            sample_before(now)
            depart(now)
        sample_before(job.submit_s)
        for member in arriving:
            waiting[member] = None
        if attempt_members(index, job.submit_s):
            retry_declined(job.submit_s)
        index += len(arriving)
        if progress is not None:
            progress(index)
    sample_before(float("inf"))
    while departures and departures[0][0] != float("inf"):
        depart(departures[0][0])
    end = max(horizon, max((entry[0] for entry in placed if entry is not None), default=0.0))
    while waiting and declined and declined[0][0] <= end + DECLINED_TAIL_S:
        retry_declined(declined[0][0])
    outcomes = tuple(Outcome(job, None, None) if entry is None else Outcome(job, entry[0], entry[1], seconds)
                     for job, entry, seconds in zip(workload, placed, ran))
    return Run(policy.name, seed, fleet.nodes, outcomes, tuple(snapshots))
