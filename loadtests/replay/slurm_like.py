"""Policy (7), Slurm-like: EASY backfill with topology/block placement in segments (issue 29, item 3).

Slurm is the incumbent on GB200 NVL72 (its topology/block plugin was built with NVIDIA). As this baseline plays it:
- **Blocks and segments.** A block is an NVLink domain of several nodes (an NVL72 rack); a node in none is in the
  block of its leaf. A job of several nodes runs in segments of `segment_pods(job)` nodes, each segment inside one
  block (`--segment`), in as few blocks as it can: best fit, the block that leaves the fewest free slots, first.
  The segment is the job's own (`segment_pods`), else NVIDIA's guidance: 16 trays for jobs of 128 GPUs or more,
  4 for 32 or more, else 1 (no constraint), taken down to a divisor of the job's node count, as Slurm requires.
- **EASY backfill** (sched/backfill with one reservation). The waiting job that arrived first (the head) reserves
  the earliest start the running jobs' time limits promise it, and the nodes it would take then. Another job
  starts now only if it fits now and either ends, by its own time limit, before that start, or takes none of the
  reserved nodes. The head starts as soon as it fits.
- **Time limits** drive both: a CSV's `time_limit_s` column where given, else the job's duration times a factor
  drawn from 1 to 3 per job (users overestimate), seeded by the job's name.
- Pods on their own go to the fullest node that holds them (best fit); inside a node, the GPUs are the stock
  device plugin's, as for (1).

Only jobs the engine offers it are known to it: a gang no node could hold by count (kube-scheduler's own filter) is
queued from the first departure that lets one member fit, as the engine retries it then.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from extender.groups.layouts import fewest_blocks
from loadtests.replay.device_plugin import stock_device_plugin
from loadtests.replay.engine import Fleet, Placement
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.spans import Span, Spans

LIMIT_FACTOR = (1.0, 3.0)
"""Where a job states no time limit: its duration times a factor drawn uniformly from this range."""
SEGMENTS: tuple[tuple[int, int], ...] = ((128, 16), (32, 4))
"""(GPUs of the job at least, trays a segment): NVIDIA's guidance for Slurm on NVL72; smaller jobs, 1."""


def time_limit(job: Job) -> float:
    """The job's time limit: stated, or its duration times a factor drawn from LIMIT_FACTOR by its name."""
    if job.time_limit_s is not None:
        return job.time_limit_s
    return job.duration_s * random.Random(job.group or job.name).uniform(*LIMIT_FACTOR)


def limits_note(jobs: Sequence[Job]) -> str:
    """Where the jobs' time limits come from, for the output."""
    stated = sum(job.time_limit_s is not None for job in jobs)
    drawn = f"duration x U({LIMIT_FACTOR[0]:g}, {LIMIT_FACTOR[1]:g}) per job"
    return "as stated" if stated == len(jobs) else drawn if not stated else f"as stated, else {drawn}"


def segment_pods(job: Job) -> int:
    """Nodes per segment: as the job declares (`--segment`), else NVIDIA's guidance for its GPUs, down to a divisor
    of its node count."""
    if job.segment_pods is not None:
        return job.segment_pods
    wanted = next((pods for gpus, pods in SEGMENTS if job.gpus * job.pods >= gpus), 1)
    return max(size for size in range(1, min(wanted, job.pods) + 1) if job.pods % size == 0)


@dataclass(frozen=True, slots=True)
class _Running:
    nodes: tuple[str, ...]  # one entry per member
    gpus: int  # per member
    ends: float  # start plus the time limit


class SlurmLikePolicy:
    def __init__(self, name: str, nodes: Sequence[ClusterNode]) -> None:
        self.name = name
        spans = Spans(nodes)
        sizes = Counter(blocks[Span.DOMAIN] for blocks in spans.blocks.values())
        self.block = {name: blocks[Span.DOMAIN] if sizes[blocks[Span.DOMAIN]] > 1 else blocks[Span.LEAF]
                      for name, blocks in spans.blocks.items()}
        self.waiting: dict[str, Job] = {}  # job key -> its first pod offered, in the order offered
        self.running: dict[str, _Running] = {}
        self.planned: dict[str, list[str]] = {}  # group -> the nodes of its members not yet placed, in order
        self.members_left: dict[str, int] = {}  # group -> members still running
        self._changes = 0  # jobs started or ended: a reservation worked out before is old
        self._reserved: tuple[tuple[str, float, int], tuple[float, frozenset[str]]] | None = None

    def place(self, job: Job, fleet: Fleet, rng: random.Random, now: float) -> Placement | None:
        key = job.group or job.name
        nodes = self.planned.get(key)
        if nodes is None:
            self.waiting.setdefault(key, job)
            nodes = self._admit(key, job, fleet, now)
            if nodes is None:
                return None
            del self.waiting[key]
            self.running[key] = _Running(tuple(nodes), job.gpus, now + time_limit(job))
            self._changes += 1
            self.members_left[key] = job.pods
            self.planned[key] = list(nodes)
            nodes = self.planned[key]
        node = nodes.pop(0)
        if not nodes:
            del self.planned[key]
        return Placement(node, stock_device_plugin(fleet.key[node], fleet.free[node], job.gpus))

    def release(self, job: Job, placement: Placement) -> None:
        key = job.group or job.name
        self.members_left[key] -= 1
        if not self.members_left[key]:
            del self.members_left[key], self.running[key]
            self._changes += 1

    def _admit(self, key: str, job: Job, fleet: Fleet, now: float) -> list[str] | None:
        """The job's nodes if it may start now: it fits, and it is the head or does not delay the head."""
        free = {name: fleet.free_count[name] for name in fleet.pools.get(job.gpu_model, ())}
        nodes = self._fit(job, free)
        if nodes is None:
            return None
        head_key = next(iter(self.waiting))
        if head_key == key:
            return nodes
        head = self.waiting[head_key]
        starts, reserved = self._reservation(head, fleet, now)
        if now + time_limit(job) <= starts or not reserved & set(nodes):
            return nodes
        return None

    def _reservation(self, head: Job, fleet: Fleet, now: float) -> tuple[float, frozenset[str]]:
        """When the head could start by the running jobs' time limits, and the nodes it would take then; worked
        out once while the head, the instant and the running jobs stay as they are."""
        key = (head.group or head.name, now, self._changes)
        if self._reserved is None or self._reserved[0] != key:
            self._reserved = key, self._earliest(head, fleet, now)
        return self._reserved[1]

    def _earliest(self, head: Job, fleet: Fleet, now: float) -> tuple[float, frozenset[str]]:
        free = {name: fleet.free_count[name] for name in fleet.pools.get(head.gpu_model, ())}
        for running in sorted(self.running.values(), key=lambda running: running.ends):
            for node in running.nodes:
                if node in free:
                    free[node] += running.gpus
            nodes = self._fit(head, free)
            if nodes is not None:
                return max(now, running.ends), frozenset(nodes)
        return float("inf"), frozenset()

    def _fit(self, job: Job, free: Mapping[str, int]) -> list[str] | None:
        """One node per member, segment by segment inside blocks, as few blocks as it can; None if it fits
        nowhere now."""
        slots: dict[str, list[str]] = {}
        for name in sorted(free, key=lambda name: (free[name], name)):  # fullest nodes first: best fit
            slots.setdefault(self.block[name], []).extend([name] * (free[name] // job.gpus))
        if job.pods == 1:
            fullest = [nodes[0] for nodes in slots.values() if nodes]
            return [min(fullest, key=lambda name: (free[name], name))] if fullest else None
        size = segment_pods(job)
        spread = fewest_blocks({block: len(nodes) // size for block, nodes in slots.items()}, job.pods // size)
        if spread is None:
            return None
        return [node for block, taken in spread for node in slots[block][:taken * size]]
