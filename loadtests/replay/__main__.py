"""python -m loadtests.replay: one cluster, one workload, its policies on identical arrivals, side by side.

    python -m loadtests.replay --cluster mixed --workload synthetic --load 0.8 --seed 1
    python -m loadtests.replay --cluster alibaba --workload alibaba --load 0.9 --json
    python -m loadtests.replay --cluster alibaba --fleet-scale 0.1 --workload synthetic --jobs 20000
    python -m loadtests.replay --cluster mixed --workload inflation
    python -m loadtests.replay --cluster mixed --workload jobs.csv   # submit_time_s,duration_s,num_gpus[,gpu_model]
    python -m loadtests.replay --cluster nvl72 --workload jobs.csv --load 0.85 --json   # [,num_pods][,gpu_model]
                                                          # [,time_limit_s]

The mixed and Alibaba fleets compare policies (1)-(4); the nvl72 fleet (GB200 NVL72 racks beside HGX H100 nodes,
under leaf and spine labels) compares (1), (6) Kueue-like and (4) with groups required and preferred on
multi-node jobs, whose synthetic workload there is group_mix.py's. `--load` rescales any workload's arrivals to
that offered load (a CSV's only when given; inflation has none). A job runs longer where its placement's
all-reduce is slower than its best (`--comm-share`, runtime.py). `--json` prints {"cluster", "workload", "seed",
"load", "default_policy", "policies": {name: metrics}} as one object: each policy's metrics are metrics.Summary's
and job_metrics.JobSummary's, and on nvl72 group_metrics.GroupSummary's too. With `--seeds N` the seeds run from
`--seed` up, each policy's figures are their mean over the seeds, and "ci95" gives each one's 95% interval
(the half-width, Student's t) where it varies.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from extender.verbs.scoring.shortlist import SHORTLIST
from extender.verbs.wait import TOPOLOGY_WAIT_SECONDS
from loadtests.replay.clusters import alibaba_fleet, mixed_fleet, nvl72_fleet
from loadtests.replay.engine import Policy, Run, replay
from loadtests.replay.group_metrics import GroupSummary, summarize_groups
from loadtests.replay.group_mix import group_workload
from loadtests.replay.job_metrics import JobSummary, summarize_jobs
from loadtests.replay.kube_scores import Profile, shipped_profile
from loadtests.replay.metrics import Summary, summarize
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.plots import write_group_plots, write_plots
from loadtests.replay.policies import OURS, OURS_GROUPS_PREFERRED, group_policies, standard_policies
from loadtests.replay.report import group_table, markdown_table
from loadtests.replay.runtime import RunTime
from topology.collectives import COMM_SHARE
from loadtests.replay.slurm_like import limits_note
from loadtests.replay.workloads import (TRACE_GPU_MIX, alibaba_trace, at_load, describe, inflation, parse_gpu_mix,
                                        read_csv, synthetic, unplaceable)
from topology.bounds import MAX_TOPOLOGY_WAIT_SECONDS

WORKLOADS = ("synthetic", "alibaba", "inflation")
DEFAULT_LOAD = 0.8
"""The synthetic and trace workloads' load when --load is not given."""
MAX_SEEDS = 50
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Student's t at 97.5% for 1 to 30 degrees of freedom; past 30, the last (within 2% of the normal's 1.96)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", choices=("mixed", "alibaba", "nvl72"), default="mixed")
    parser.add_argument("--workload", default="synthetic",
                        help=f"{', '.join(WORKLOADS)}, or the path of a CSV job list")
    parser.add_argument("--seed", type=int, default=1, help="workload draws and kube-scheduler's tie-breaks")
    parser.add_argument("--seeds", type=int, default=1,
                        help=f"run this many seeds from --seed up, and report each figure's mean and 95%% interval "
                             f"(1 to {MAX_SEEDS})")
    parser.add_argument("--load", type=float,
                        help=f"target offered load, 0.05-2.0 of GPU capacity: arrivals are rescaled to it (default "
                             f"{DEFAULT_LOAD:g} for synthetic and alibaba; a CSV keeps its times unless given)")
    parser.add_argument("--jobs", type=int, default=2000, help="synthetic jobs")
    parser.add_argument("--gpu-mix", type=parse_gpu_mix,
                        help="synthetic GPUs-per-pod weights, e.g. 1:60,2:20,4:12,8:8 (default: the Alibaba "
                             "trace's; the mixed and Alibaba fleets)")
    parser.add_argument("--nodes-per-pool", type=int, default=4, help="mixed fleet size")
    parser.add_argument("--fleet-scale", type=_fleet_scale, default=1.0,
                        help="Alibaba fleet: keep this share (0 < scale <= 1) of each model's nodes (default 1)")
    parser.add_argument("--comm-share", type=float, default=COMM_SHARE,
                        help="share of a job's time at its best placement spent in all-reduce: a job runs longer "
                             "where its placement's bandwidth is lower (loadtests/replay/runtime.py); 0: every job "
                             f"runs its duration (default {COMM_SHARE:g})")
    parser.add_argument("--topology-wait", type=float, default=TOPOLOGY_WAIT_SECONDS, metavar="SECONDS",
                        help="the extender's --topology-wait for policies (3) and (4); 0: no wait "
                             f"(default {TOPOLOGY_WAIT_SECONDS:g})")
    parser.add_argument("--shortlist", type=int, default=SHORTLIST, metavar="K",
                        help=f"the extender's --shortlist for policies (3) and (4); 0: every fit (default {SHORTLIST})")
    parser.add_argument("--percentage", type=int, metavar="0-100",
                        help="percentageOfNodesToScore of the profile policies (3) and (4) run under, instead of the "
                             "shipped profile's (0: kube-scheduler's adaptive share)")
    parser.add_argument("--json", action="store_true", help="print the per-policy metrics as one JSON object")
    parser.add_argument("--plots", type=Path, metavar="DIR",
                        help="write PNG plots (efficiency and pending-time CDFs, fragmentation over time) to DIR")
    args = parser.parse_args(argv)
    try:
        cluster = (mixed_fleet(args.nodes_per_pool) if args.cluster == "mixed" else nvl72_fleet()
                   if args.cluster == "nvl72" else alibaba_fleet(scale=args.fleet_scale))
        jobs = _workload(args, cluster)
        if args.cluster != "nvl72" and any(job.group is not None for job in jobs):
            raise ValueError("multi-node jobs (num_pods > 1) replay on --cluster nvl72, whose nodes carry the "
                             "NVLink domain and network labels")
        problem = unplaceable(jobs, cluster)
        if problem is not None:
            raise ValueError(f"a job can never run on this cluster: {problem}")
        if not 0 <= args.topology_wait <= MAX_TOPOLOGY_WAIT_SECONDS:
            raise ValueError(f"--topology-wait must be 0 to {MAX_TOPOLOGY_WAIT_SECONDS:g}, not {args.topology_wait}")
        if not 0 <= args.comm_share <= 1:
            raise ValueError(f"--comm-share must be within 0..1, not {args.comm_share}")
        if args.percentage is not None and not 0 <= args.percentage <= 100:
            raise ValueError(f"--percentage must be 0 to 100, not {args.percentage}")
        if args.percentage is not None and args.cluster == "nvl72":
            raise ValueError("--percentage applies to --cluster mixed and alibaba: nvl72's 96 nodes are all searched "
                             "at any percentage (kube-scheduler searches every node of a cluster under 100)")
        if args.shortlist < 0:
            raise ValueError(f"--shortlist must be 0 or more, not {args.shortlist}")
        if not 1 <= args.seeds <= MAX_SEEDS:
            raise ValueError(f"--seeds must be 1 to {MAX_SEEDS}, not {args.seeds}")
        if args.seeds > 1 and not args.json:
            raise ValueError("--seeds reports means and intervals: use it with --json")
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.seeds > 1:
        seeds = list(range(args.seed, args.seed + args.seeds))
        merged = _over_seeds([_replayed(args, cluster, seed, _workload(args, cluster, seed)) for seed in seeds])
        print(json.dumps({**_header(args, cluster, jobs), "seeds": seeds,
                          "policies": {name: {key: mean for key, (mean, _) in figures.items()}
                                       for name, figures in merged.items()},
                          "ci95": {name: {key: half for key, (_, half) in figures.items() if half is not None}
                                   for name, figures in merged.items()}}))
        return 0
    runs = _runs(args, cluster, jobs, args.seed)
    summaries, groups = _summaries(args, runs)
    load = _load(args)
    if args.plots is not None:
        label = args.workload if args.workload in WORKLOADS else Path(args.workload).stem
        prefix = f"{args.cluster}-{label}{'' if load is None else f'-load{load:g}'}-seed{args.seed}"
        paths = write_plots(runs, args.plots, prefix) + (write_group_plots(runs, args.plots, prefix) if groups else [])
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps({**_header(args, cluster, jobs), "seed": args.seed,
                          "policies": _metrics(runs, summaries, groups)}))
    else:
        print(f"{args.cluster} cluster ({len(cluster)} nodes), {args.workload} workload: {describe(jobs)}; "
              f"seed {args.seed}\n")
        print(markdown_table(summaries))
        if groups:
            print("\n" + group_table(list(zip(summaries, groups))))
    return 0


def _profile(percentage: int | None) -> Profile | None:
    """The shipped profile with another percentageOfNodesToScore, or None for the shipped one as it is."""
    return None if percentage is None else replace(shipped_profile(), percentage_of_nodes_to_score=percentage)


def _fleet_scale(text: str) -> float:
    """A share of the Alibaba fleet's nodes: more than 0, at most 1."""
    try:
        scale = float(text)
    except ValueError:
        scale = math.nan
    if not 0 < scale <= 1:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number more than 0 and at most 1")
    return scale


def _load(args: argparse.Namespace) -> float | None:
    """The offered load the arrivals are rescaled to: --load, else the default for a generated workload."""
    if args.load is not None or args.workload not in ("synthetic", "alibaba"):
        return args.load
    return DEFAULT_LOAD


def _header(args: argparse.Namespace, cluster: Sequence[ClusterNode], jobs: Sequence[Job]) -> dict[str, object]:
    return {"cluster": args.cluster, "workload": args.workload, "load": _load(args), "comm_share": args.comm_share,
            "topology_wait": args.topology_wait, "jobs": describe(jobs),
            "default_policy": OURS_GROUPS_PREFERRED if args.cluster == "nvl72" else OURS,
            **({"time_limits": limits_note(jobs)} if args.cluster == "nvl72" else {})}


def _runs(args: argparse.Namespace, cluster: Sequence[ClusterNode], jobs: Sequence[Job], seed: int) -> list[Run]:
    """Every policy of the cluster on the same jobs and seed, each job running as long as where it landed says."""
    # In scheduling-only mode the extender warns of every pod the stock plugin gave other GPUs: expected here.
    extender_log = logging.getLogger("extender")
    level = extender_log.level
    extender_log.setLevel(logging.ERROR)
    policies = (group_policies(cluster, args.topology_wait, args.comm_share, args.shortlist)
                if args.cluster == "nvl72" else standard_policies(cluster, args.topology_wait, args.shortlist,
                                                                  _profile(args.percentage)))
    run_time = RunTime(cluster, args.comm_share)
    try:
        return [_run(cluster, jobs, policy, seed, run_time, quiet=args.json) for policy in policies]
    finally:
        extender_log.setLevel(level)


def _metrics(runs: Sequence[Run], summaries: Sequence[Summary],
             groups: Sequence[GroupSummary]) -> dict[str, dict[str, object]]:
    """Each policy's figures, as JSON: per pod, per job and, on a fleet of groups, per group."""
    metrics = {summary.policy: _jsonable(summary) for summary in summaries}
    for run in runs:
        metrics[run.policy].update(_jsonable(summarize_jobs(run)))
    for group in groups:
        metrics[group.policy].update(_jsonable(group))
    return metrics


def _summaries(args: argparse.Namespace, runs: Sequence[Run]) -> tuple[list[Summary], list[GroupSummary]]:
    """Each run's per-pod figures and, on the fleet of groups, its per-group ones."""
    groups = [summarize_groups(run, args.comm_share) for run in runs] if args.cluster == "nvl72" else []
    return [summarize(run, args.comm_share) for run in runs], groups


def _replayed(args: argparse.Namespace, cluster: Sequence[ClusterNode], seed: int,
              jobs: Sequence[Job]) -> dict[str, dict[str, object]]:
    runs = _runs(args, cluster, jobs, seed)
    return _metrics(runs, *_summaries(args, runs))


def _over_seeds(figures: Sequence[dict[str, dict[str, object]]]) -> dict[str, dict[str, tuple[float | None,
                                                                                             float | None]]]:
    """Per policy and numeric figure (a figure by class flattened to `name.class`): the mean over the seeds that
    have it, and the half-width of its 95% interval where two or more do."""
    merged: dict[str, dict[str, tuple[float | None, float | None]]] = {}
    for name in figures[0]:
        values: dict[str, list[float]] = {}
        for figure in figures:
            for key, value in _flat(figure[name]):
                values.setdefault(key, []).append(value)
        merged[name] = {key: mean_interval(found) for key, found in values.items()}
    return merged


def _flat(metrics: dict[str, object], prefix: str = "") -> list[tuple[str, float]]:
    found: list[tuple[str, float]] = []
    for key, value in metrics.items():
        if isinstance(value, dict):
            found.extend(_flat(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            found.append((prefix + key, float(value)))
    return found


def mean_interval(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The mean of the finite values and the half-width of its 95% interval (Student's t); None where too few."""
    finite = [value for value in values if math.isfinite(value)]
    if not finite:
        return None, None
    mean = sum(finite) / len(finite)
    if len(finite) < 2:
        return mean, None
    variance = sum((value - mean) ** 2 for value in finite) / (len(finite) - 1)
    return mean, T_975[min(len(finite) - 1, len(T_975)) - 1] * math.sqrt(variance / len(finite))


def _workload(args: argparse.Namespace, cluster: Sequence[ClusterNode], seed: int | None = None) -> tuple[Job, ...]:
    load = _load(args)
    if args.gpu_mix is not None and (args.cluster == "nvl72" or args.workload != "synthetic"):
        raise ValueError("--gpu-mix is for the synthetic workload of the mixed and Alibaba fleets")
    if args.workload == "inflation":
        if load is not None:
            raise ValueError("--load has no meaning for inflation: its pods never leave")
        return inflation(alibaba_trace(), cluster, args.seed if seed is None else seed)
    if args.workload == "synthetic":
        assert load is not None
        seed = args.seed if seed is None else seed
        if args.cluster == "nvl72":
            return group_workload(cluster, load, args.jobs, seed)
        return synthetic(cluster, load, args.jobs, seed, gpu_mix=args.gpu_mix or TRACE_GPU_MIX)
    jobs = alibaba_trace() if args.workload == "alibaba" else read_csv(Path(args.workload))
    return jobs if load is None else at_load(jobs, cluster, load)


def _run(cluster: Sequence[ClusterNode], jobs: Sequence[Job], policy: Policy, seed: int, run_time: RunTime,
         quiet: bool) -> Run:
    with tqdm(total=len(jobs), desc=policy.name, unit="pod", disable=quiet or len(jobs) < 500,
              file=sys.stderr, leave=False) as bar:
        return replay(cluster, jobs, policy, seed, progress=lambda done: bar.update(done - bar.n),
                      run_seconds=run_time.seconds)


def _jsonable(summary: Summary | GroupSummary | JobSummary) -> dict[str, object]:
    """NaN (no such pods) becomes null: JSON has no NaN."""
    def clean(value: object) -> object:
        if isinstance(value, float) and math.isnan(value):
            return None
        if isinstance(value, dict):
            return {str(key): clean(item) for key, item in value.items()}
        return value
    return {key: clean(value) for key, value in asdict(summary).items()}


if __name__ == "__main__":
    sys.exit(main())
