"""python -m loadtests.replay: one cluster, one workload, its policies on identical arrivals, side by side.

    python -m loadtests.replay --cluster mixed --workload synthetic --load 0.8 --seed 1
    python -m loadtests.replay --cluster alibaba --workload alibaba --load 0.9 --json
    python -m loadtests.replay --cluster alibaba --fleet-scale 0.1 --workload synthetic --jobs 20000
    python -m loadtests.replay --cluster mixed --workload inflation
    python -m loadtests.replay --cluster mixed --workload jobs.csv   # submit_time_s,duration_s,num_gpus[,gpu_model]
    python -m loadtests.replay --cluster nvl72 --workload jobs.csv --load 0.85 --json   # [,num_pods][,gpu_model]

The mixed and Alibaba fleets compare policies (1)-(4); the nvl72 fleet (GB200 NVL72 racks beside HGX H100 nodes,
under leaf and spine labels) compares (1), (6) Kueue-like and (4) with groups required and preferred on
multi-node jobs, whose synthetic workload there is group_mix.py's. `--load` rescales any workload's arrivals to
that offered load (a CSV's only when given; inflation has none). `--json` prints {"cluster", "workload", "seed",
"load", "policies": {name: metrics}} as one object; on nvl72 each policy's metrics hold
group_metrics.GroupSummary's too.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from tqdm import tqdm

from extender.verbs.wait import TOPOLOGY_WAIT_SECONDS
from loadtests.replay.clusters import alibaba_fleet, mixed_fleet, nvl72_fleet
from loadtests.replay.engine import Policy, Run, replay
from loadtests.replay.group_metrics import GroupSummary, summarize_groups
from loadtests.replay.group_mix import group_workload
from loadtests.replay.metrics import COMM_SHARE, Summary, summarize
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.plots import write_group_plots, write_plots
from loadtests.replay.policies import group_policies, standard_policies
from loadtests.replay.report import group_table, markdown_table
from loadtests.replay.workloads import (TRACE_GPU_MIX, alibaba_trace, at_load, describe, inflation, parse_gpu_mix,
                                        read_csv, synthetic, unplaceable)
from topology.bounds import MAX_TOPOLOGY_WAIT_SECONDS

WORKLOADS = ("synthetic", "alibaba", "inflation")
DEFAULT_LOAD = 0.8
"""The synthetic and trace workloads' load when --load is not given."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", choices=("mixed", "alibaba", "nvl72"), default="mixed")
    parser.add_argument("--workload", default="synthetic",
                        help=f"{', '.join(WORKLOADS)}, or the path of a CSV job list")
    parser.add_argument("--seed", type=int, default=1, help="workload draws and kube-scheduler's tie-breaks")
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
                        help="share of a multi-GPU job's time spent communicating (modelled job time)")
    parser.add_argument("--topology-wait", type=float, default=TOPOLOGY_WAIT_SECONDS, metavar="SECONDS",
                        help="the extender's --topology-wait for policies (3) and (4); 0: no wait "
                             f"(default {TOPOLOGY_WAIT_SECONDS:g})")
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
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    # In scheduling-only mode the extender warns of every pod the stock plugin gave other GPUs: expected here.
    extender_log = logging.getLogger("extender")
    level = extender_log.level
    extender_log.setLevel(logging.ERROR)
    policies = (group_policies if args.cluster == "nvl72" else standard_policies)(cluster, args.topology_wait)
    try:
        runs = [_run(cluster, jobs, policy, args.seed, quiet=args.json) for policy in policies]
    finally:
        extender_log.setLevel(level)
    summaries = [summarize(run, args.comm_share) for run in runs]
    groups = [summarize_groups(run, args.comm_share) for run in runs] if args.cluster == "nvl72" else []
    load = _load(args)
    if args.plots is not None:
        label = args.workload if args.workload in WORKLOADS else Path(args.workload).stem
        prefix = f"{args.cluster}-{label}{'' if load is None else f'-load{load:g}'}-seed{args.seed}"
        paths = write_plots(runs, args.plots, prefix) + (write_group_plots(runs, args.plots, prefix) if groups else [])
        for path in paths:
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        metrics = {s.policy: _jsonable(s) for s in summaries}
        for group in groups:
            metrics[group.policy].update(_jsonable(group))
        print(json.dumps({"cluster": args.cluster, "workload": args.workload, "seed": args.seed, "load": load,
                          "topology_wait": args.topology_wait, "jobs": describe(jobs), "policies": metrics}))
    else:
        print(f"{args.cluster} cluster ({len(cluster)} nodes), {args.workload} workload: {describe(jobs)}; "
              f"seed {args.seed}\n")
        print(markdown_table(summaries))
        if groups:
            print("\n" + group_table(list(zip(summaries, groups))))
    return 0


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


def _workload(args: argparse.Namespace, cluster: Sequence[ClusterNode]) -> tuple[Job, ...]:
    load = _load(args)
    if args.gpu_mix is not None and (args.cluster == "nvl72" or args.workload != "synthetic"):
        raise ValueError("--gpu-mix is for the synthetic workload of the mixed and Alibaba fleets")
    if args.workload == "inflation":
        if load is not None:
            raise ValueError("--load has no meaning for inflation: its pods never leave")
        return inflation(alibaba_trace(), cluster, args.seed)
    if args.workload == "synthetic":
        assert load is not None
        if args.cluster == "nvl72":
            return group_workload(cluster, load, args.jobs, args.seed)
        return synthetic(cluster, load, args.jobs, args.seed, gpu_mix=args.gpu_mix or TRACE_GPU_MIX)
    jobs = alibaba_trace() if args.workload == "alibaba" else read_csv(Path(args.workload))
    return jobs if load is None else at_load(jobs, cluster, load)


def _run(cluster: Sequence[ClusterNode], jobs: Sequence[Job], policy: Policy, seed: int, quiet: bool) -> Run:
    with tqdm(total=len(jobs), desc=policy.name, unit="pod", disable=quiet or len(jobs) < 500,
              file=sys.stderr, leave=False) as bar:
        return replay(cluster, jobs, policy, seed, progress=lambda done: bar.update(done - bar.n))


def _jsonable(summary: Summary | GroupSummary) -> dict[str, object]:
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
