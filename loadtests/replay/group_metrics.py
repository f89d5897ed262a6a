"""What a replay of multi-node jobs yields per policy (issue 17), beside metrics.py's per-pod figures.

A job is a pod on its own or a group (model.py); a group is started once its last member is placed.
- groups_in_one_domain_share: of the started groups whose size fits one NVLink domain (one empty domain of their
  pool holds all their members), those whose members all sit in one. The same for one leaf block.
- segments_intact_share: of the started groups each of whose segments (`Job.segment_pods` members, else the whole
  group) fits one NVLink domain, those whose members split into such segments, each in one domain: every domain
  holds a whole number of segments. Members are alike (no pod is told its rank), so which member is in which
  segment is not asked.
- GPU utilization of running jobs: GPU-seconds of started jobs within [0, last arrival] over all GPUs times that
  span. metrics.Summary.gpu_utilization counts what is held, and a member holds its GPUs from its own placement,
  running or not; the gap is what partly placed groups hold while they wait.
- Pending time of a job: arrival to its start (a group: its last member's placement); p95 (nearest rank) per
  size class of pods per job, over the jobs started.
- Modelled job time of the started groups: each one's duration with its communication share scaled by the
  all-reduce bandwidth of the narrowest span it could have had over the one it got (spans.allreduce_gbps),
  duration * ((1 - share) + share * best / granted), summed, over their durations summed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from loadtests.replay.clusters import pool_capacity
from loadtests.replay.engine import Outcome, Run, groups_of
from loadtests.replay.metrics import job_firsts, job_starts, percentile, run_seconds
from loadtests.replay.runtime import RunTime
from topology.collectives import COMM_SHARE, slowdown
from loadtests.replay.spans import Span
from topology.bounds import MAX_GROUP_SIZE

POD_CLASSES: tuple[tuple[int, int], ...] = ((1, 1), (2, 4), (5, 8), (9, 18), (19, MAX_GROUP_SIZE))
"""Size classes of pods per job for pending time: a pod on its own, then groups up to one NVL72 rack's 18 trays
and beyond."""


@dataclass(frozen=True, slots=True)
class GroupSummary:
    policy: str
    jobs: int
    groups: int
    """Jobs of more than one pod."""
    groups_started: int
    groups_fitting_one_domain: int
    """Started groups whose size fits one NVLink domain: the denominator of the share below."""
    groups_in_one_domain_share: float
    groups_whose_segments_fit: int
    """Started groups each of whose segments fits one NVLink domain: the denominator of the share below."""
    segments_intact_share: float
    groups_fitting_one_leaf: int
    groups_in_one_leaf_share: float
    gpu_utilization_running: float
    pending_p95_s_by_pods: dict[str, float]
    """Per size class (`POD_CLASSES`) present in the workload; NaN where no job of it started."""
    modelled_group_job_time: float
    """Started groups' modelled job time summed over their durations summed (1.0: every one at its best span)."""
    comm_share: float


def class_name(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}+" if high == MAX_GROUP_SIZE else f"{low}-{high}"


def waits_by_class(outcomes: Sequence[Outcome], starts: Sequence[float | None],
                   firsts: Sequence[int]) -> dict[str, list[float]]:
    """Per class of pods per job (POD_CLASSES) present in the workload, each started job's wait: arrival to start."""
    waits: dict[str, list[float]] = {}
    for index in firsts:
        job, start = outcomes[index].job, starts[index]
        times = waits.setdefault(class_name(*next(bounds for bounds in POD_CLASSES
                                                  if bounds[0] <= job.pods <= bounds[1])), [])
        if start is not None:
            times.append(start - job.submit_s)
    return waits


def summarize_groups(run: Run, comm_share: float = COMM_SHARE) -> GroupSummary:
    if not 0 <= comm_share <= 1:
        raise ValueError(f"the communication share must be within 0..1, not {comm_share}")
    model = RunTime(run.nodes, comm_share)
    spans = model.spans
    outcomes = run.outcomes
    starts = job_starts(outcomes)
    members = groups_of([outcome.job for outcome in outcomes])
    firsts = job_firsts(outcomes)
    horizon = max((outcome.job.submit_s for outcome in outcomes), default=0.0)
    capacity = sum(pool_capacity(run.nodes).values())
    pending = waits_by_class(outcomes, starts, firsts)
    fits = {Span.DOMAIN: [0, 0], Span.LEAF: [0, 0]}  # span -> [groups that fit one, of them in one]
    segments = [0, 0]  # [groups whose segments fit one domain each, of them with every segment in one]
    running = modelled = durations = 0.0
    started_groups = 0
    for index in firsts:
        job, start = outcomes[index].job, starts[index]
        if start is None:
            continue
        if start < horizon:
            running += job.gpus * job.pods * (min(start + run_seconds(outcomes[index]), horizon) - start)
        if job.group is None:
            continue
        started_groups += 1
        placed = [outcomes[at].placement for at in members[job.group]]
        nodes = [placement.node for placement in placed if placement is not None]
        span = spans.span_of(nodes)
        for kind, counts in fits.items():
            if spans.holds(job, kind) >= job.pods:
                counts[0] += 1
                counts[1] += span <= kind
        segment = job.segment_pods or job.pods
        if spans.holds(job, Span.DOMAIN) >= segment:
            segments[0] += 1
            per_domain = Counter(spans.blocks[node][Span.DOMAIN] for node in nodes)
            segments[1] += all(count % segment == 0 for count in per_domain.values())
        found = model.bandwidths(job, [placement for placement in placed if placement is not None])
        if math.isfinite(job.duration_s) and found is not None:
            modelled += job.duration_s * slowdown(comm_share, *found)
            durations += job.duration_s
    return GroupSummary(
        policy=run.policy, jobs=len(firsts), groups=len(members), groups_started=started_groups,
        groups_fitting_one_domain=fits[Span.DOMAIN][0],
        groups_in_one_domain_share=_share(*fits[Span.DOMAIN]),
        groups_whose_segments_fit=segments[0], segments_intact_share=_share(*segments),
        groups_fitting_one_leaf=fits[Span.LEAF][0], groups_in_one_leaf_share=_share(*fits[Span.LEAF]),
        gpu_utilization_running=running / (capacity * horizon) if capacity and horizon else math.nan,
        pending_p95_s_by_pods={name: percentile(pending[name], 0.95) for name in
                               (class_name(*bounds) for bounds in POD_CLASSES) if name in pending},
        modelled_group_job_time=modelled / durations if durations else math.nan, comm_share=comm_share)


def _share(total: int, hits: int) -> float:
    return hits / total if total else math.nan
