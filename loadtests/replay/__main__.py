"""python -m loadtests.replay: one cluster, one workload, policies (1)-(4) on identical arrivals, side by side.

    python -m loadtests.replay --cluster mixed --workload synthetic --load 0.8 --seed 1
    python -m loadtests.replay --cluster alibaba --workload alibaba --load 0.9 --json
    python -m loadtests.replay --cluster alibaba --fleet-scale 0.1 --workload synthetic --jobs 20000
    python -m loadtests.replay --cluster mixed --workload inflation
    python -m loadtests.replay --cluster mixed --workload jobs.csv   # submit_time_s,duration_s,num_gpus[,gpu_model]

`--json` prints {"cluster", "workload", "seed", "load", "policies": {name: metrics}} as one object.
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

from extender.wait import TOPOLOGY_WAIT_SECONDS
from loadtests.replay.clusters import alibaba_fleet, mixed_fleet
from loadtests.replay.engine import Policy, Run, replay
from loadtests.replay.metrics import COMM_SHARE, Summary, summarize
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.plots import write_plots
from loadtests.replay.policies import standard_policies
from loadtests.replay.report import markdown_table
from loadtests.replay.workloads import (TRACE_GPU_MIX, alibaba_trace, at_load, describe, inflation, parse_gpu_mix,
                                        read_csv, synthetic, unplaceable)
from topology.bounds import MAX_TOPOLOGY_WAIT_SECONDS

WORKLOADS = ("synthetic", "alibaba", "inflation")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replay", description=__doc__.split("\n")[0])
    parser.add_argument("--cluster", choices=("mixed", "alibaba"), default="mixed")
    parser.add_argument("--workload", default="synthetic",
                        help=f"{', '.join(WORKLOADS)}, or the path of a CSV job list")
    parser.add_argument("--seed", type=int, default=1, help="workload draws and kube-scheduler's tie-breaks")
    parser.add_argument("--load", type=float, default=0.8,
                        help="target offered load, 0.5-0.95 of GPU capacity (synthetic and alibaba)")
    parser.add_argument("--jobs", type=int, default=2000, help="synthetic jobs")
    parser.add_argument("--gpu-mix", type=parse_gpu_mix, default=TRACE_GPU_MIX,
                        help="synthetic GPUs-per-pod weights, e.g. 1:60,2:20,4:12,8:8 (default: the Alibaba trace's)")
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
        cluster = (mixed_fleet(args.nodes_per_pool) if args.cluster == "mixed"
                   else alibaba_fleet(scale=args.fleet_scale))
        jobs = _workload(args, cluster)
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
    try:
        runs = [_run(cluster, jobs, policy, args.seed, quiet=args.json) for policy in standard_policies(cluster, args.topology_wait)]
    finally:
        extender_log.setLevel(level)
    summaries = [summarize(run, args.comm_share) for run in runs]
    if args.plots is not None:
        label = args.workload if args.workload in WORKLOADS else Path(args.workload).stem
        for path in write_plots(runs, args.plots, f"{args.cluster}-{label}-load{args.load:g}-seed{args.seed}"):
            print(f"wrote {path}", file=sys.stderr)
    if args.json:
        print(json.dumps({"cluster": args.cluster, "workload": args.workload, "seed": args.seed, "load": args.load,
                          "topology_wait": args.topology_wait,
                          "jobs": describe(jobs), "policies": {s.policy: _jsonable(s) for s in summaries}}))
    else:
        print(f"{args.cluster} cluster ({len(cluster)} nodes), {args.workload} workload: {describe(jobs)}; "
              f"seed {args.seed}\n")
        print(markdown_table(summaries))
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


def _workload(args: argparse.Namespace, cluster: Sequence[ClusterNode]) -> tuple[Job, ...]:
    if args.workload == "synthetic":
        return synthetic(cluster, args.load, args.jobs, args.seed, gpu_mix=args.gpu_mix)
    if args.workload == "alibaba":
        return at_load(alibaba_trace(), cluster, args.load)
    if args.workload == "inflation":
        return inflation(alibaba_trace(), cluster, args.seed)
    return read_csv(Path(args.workload))


def _run(cluster: Sequence[ClusterNode], jobs: Sequence[Job], policy: Policy, seed: int, quiet: bool) -> Run:
    with tqdm(total=len(jobs), desc=policy.name, unit="pod", disable=quiet or len(jobs) < 500,
              file=sys.stderr, leave=False) as bar:
        return replay(cluster, jobs, policy, seed, progress=lambda done: bar.update(done - bar.n))


def _jsonable(summary: Summary) -> dict[str, object]:
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
