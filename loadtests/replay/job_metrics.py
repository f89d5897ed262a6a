"""When jobs finish, per policy (issue 29): what a job's owner sees, beside metrics.py's per-pod placement figures.

A job is a pod on its own or a group (model.py), counted once. It starts when placed (a group: its last member),
and runs for its run time where it landed (runtime.py), which with a communication share above 0 is longer than
its duration wherever its placement's all-reduce is slower than its best.

- `goodput_utilization`: the work done within [0, last arrival], at best-placement speed, over all GPUs times
  that span. A job running at `duration / run` of its best speed does that share of useful work per GPU-second;
  GPUs held by members whose group has not started do none. Beside `gpu_utilization` (metrics.py: GPU-time held),
  which a scattered job inflates by holding its GPUs longer.
- `jct_mean_s`, `jct_p95_s`: arrival to finish, over the jobs that finished; `bounded_slowdown_mean`: each one's
  time over its duration, its duration taken as at least BOUNDED_SLOWDOWN_S (Feitelson's bounded slowdown, so a
  short job's wait does not dominate), at least 1.
- Wait (arrival to start) p50, p95 and max per class of pods per job (group_metrics.POD_CLASSES), over the jobs
  that started; `still_waiting`: the jobs never started by the end of the replay.
- `free_domains_mean`: the mean, over the replay's snapshots, of NVLink domains of several nodes (NVL72 racks)
  with every GPU free, where a whole job could still start; NaN on a fleet without such domains.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from loadtests.replay.boards import board, board_key
from loadtests.replay.engine import Run
from loadtests.replay.group_metrics import POD_CLASSES, class_name, waits_by_class
from loadtests.replay.metrics import job_firsts, job_starts, percentile, run_seconds
from loadtests.replay.spans import Span, Spans

BOUNDED_SLOWDOWN_S = 10.0
"""The shortest duration bounded slowdown divides by (the usual 10 s)."""


@dataclass(frozen=True, slots=True)
class JobSummary:
    policy: str
    goodput_utilization: float
    jct_mean_s: float
    jct_p95_s: float
    bounded_slowdown_mean: float
    wait_p50_s_by_pods: dict[str, float]
    wait_p95_s_by_pods: dict[str, float]
    wait_max_s_by_pods: dict[str, float]
    """Per class of pods per job present in the workload; NaN where none of it started."""
    still_waiting: int
    free_domains_mean: float


def summarize_jobs(run: Run) -> JobSummary:
    outcomes = run.outcomes
    starts = job_starts(outcomes)
    firsts = job_firsts(outcomes)
    horizon = max((outcome.job.submit_s for outcome in outcomes), default=0.0)
    capacity = sum(board(board_key(node)).size for node in run.nodes)
    waits = waits_by_class(outcomes, starts, firsts)
    jct: list[float] = []
    slowdowns: list[float] = []
    useful = 0.0
    for index in firsts:
        job, start = outcomes[index].job, starts[index]
        if start is None:
            continue
        ran = run_seconds(outcomes[index])
        if start < horizon and ran > 0:
            speed = job.duration_s / ran if math.isfinite(ran) else 0.0
            useful += job.gpus * job.pods * (min(start + ran, horizon) - start) * speed
        if math.isfinite(ran):
            took = start + ran - job.submit_s
            jct.append(took)
            slowdowns.append(max(1.0, took / max(job.duration_s, BOUNDED_SLOWDOWN_S)))
    classes = [name for name in (class_name(*bounds) for bounds in POD_CLASSES) if name in waits]
    return JobSummary(
        policy=run.policy,
        goodput_utilization=useful / (capacity * horizon) if capacity and horizon else math.nan,
        jct_mean_s=sum(jct) / len(jct) if jct else math.nan, jct_p95_s=percentile(jct, 0.95),
        bounded_slowdown_mean=sum(slowdowns) / len(slowdowns) if slowdowns else math.nan,
        wait_p50_s_by_pods={name: percentile(waits[name], 0.5) for name in classes},
        wait_p95_s_by_pods={name: percentile(waits[name], 0.95) for name in classes},
        wait_max_s_by_pods={name: max(waits[name], default=math.nan) for name in classes},
        still_waiting=sum(starts[index] is None for index in firsts), free_domains_mean=free_domains_mean(run))


def free_domains_mean(run: Run) -> float:
    """The mean count of whole-free NVLink domains of several nodes over the run's snapshots."""
    domain_of = Spans(run.nodes).blocks
    sizes = Counter(domain_of[node.name][Span.DOMAIN] for node in run.nodes)
    shared = [(index, domain_of[node.name][Span.DOMAIN], board(board_key(node)).full_mask)
              for index, node in enumerate(run.nodes) if sizes[domain_of[node.name][Span.DOMAIN]] > 1]
    if not shared or not run.snapshots:
        return math.nan
    total = 0
    for snapshot in run.snapshots:
        busy = {domain for index, domain, full in shared if snapshot.free[index] != full}
        total += len({domain for _, domain, _ in shared} - busy)
    return total / len(run.snapshots)
