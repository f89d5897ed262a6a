"""python -m loadtests.replay.bench: the replay's standard set (issue 10), run by `make bench`.

Policies (1)-(4) (policies.standard_policies), seed 1, on: the mixed fleet under synthetic load with the trace's
GPU mix and with an assumed training-heavy mix, and under the Alibaba trace; a tenth of the Alibaba fleet under
synthetic load and under the trace; FGD's inflation on the whole Alibaba fleet and on the mixed fleet; then
(1), (6) Kueue-like and (4) with groups required and preferred (policies.group_policies) on the nvl72 fleet
under its multi-node mix at 0.8 and 0.9;
and policy (5), the extender over HTTP, against (4) on a sample. `--write BENCHMARKS.md` replaces the section between
`<!-- replay:begin -->` and `<!-- replay:end -->`; the plots go to loadtests/plots/replay/ under fixed names.

It exits 1 when a run at load 0.8 or 0.9 falls short of its acceptance (`acceptance`, `group_acceptance`) or
policy (5) over HTTP placed a job otherwise than (4) in-process. A `--quick` run is a smoke run of far fewer jobs
than the targets are set for: its verdicts are shown, not judged; only the HTTP check fails it.

    python -m loadtests.replay.bench [--write BENCHMARKS.md] [--quick]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

from tqdm import tqdm

from loadtests.bench_select import run_header, verdict, write_section
from loadtests.replay.boards import board_key
from loadtests.replay.clusters import alibaba_fleet, mixed_fleet, nvl72_fleet, pool_capacity
from loadtests.replay.engine import Run, replay
from loadtests.replay.group_metrics import GroupSummary, summarize_groups
from loadtests.replay.group_mix import group_workload, mix_note
from loadtests.replay.http_check import HttpCheck, http_check
from loadtests.replay.inflation_curve import (COMPARABILITY, CurvePoint, allocation_curve, discrete,
                                              published_by_policy, read_published)
from loadtests.replay.metrics import FULL, Summary, pod_bandwidth, summarize
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.plots import write_group_plots, write_inflation_plot, write_plots
from loadtests.replay.policies import group_policies, standard_policies
from loadtests.replay.report import group_table, markdown_table, percent
from loadtests.replay.spans import SPINE_FACTOR, Spans
from topology.collectives import ALLREDUCE
from loadtests.replay.workloads import (TRACE_DURATION_MU, TRACE_DURATION_SIGMA, TRACE_GPU_MIX, alibaba_trace,
                                        at_load, describe, inflation, synthetic)

BEGIN, END = "<!-- replay:begin -->", "<!-- replay:end -->"
PLOTS = Path(__file__).resolve().parents[1] / "plots" / "replay"
SEED = 1
TRAINING_HEAVY_MIX: Mapping[int, int] = {1: 50, 2: 25, 4: 15, 8: 10}
"""An assumed stress mix with many multi-GPU pods, not a trace statistic."""
FLEET_SCALE = 0.1
ALIBABA_SYNTHETIC_JOBS = 20_000
"""On a tenth of the Alibaba fleet (628 GPUs) at 0.9, 20,000 jobs span ~55,000 s, by when the GPUs held reach
96.5 % of their steady-state level (steady_share), at about 1 minute for the four policies per load."""
NVL72_JOBS = 2_000
"""Jobs of the multi-node mix on the nvl72 fleet: they arrive over ~118,000 s at 0.8 and ~105,000 s at 0.9, by when
the GPUs held reach 98.8 % and 98.5 % of their steady-state level (the M/G/inf ramp of steady_share)."""
INFLATION_PERCENTS = (80, 90, 100, 110, 120, 130)
QUICK_JOBS = 300
QUICK_FLEET_JOBS = 1_000
"""A quick run's job counts: enough GPUs asked for to reach load 0.9 of the mixed fleet (192 GPUs) and of the
Alibaba fleet at scale 0.1 (628 GPUs); the trace and inflation are cut to QUICK_JOBS."""
QUICK_SAMPLE = 40
FULL_SHARE_TARGET = 0.99
"""Issues 10 and 17: (4)'s multi-GPU pods at full bandwidth efficiency, and its groups in one NVLink domain."""
HTTP_SAMPLE = 400
HTTP_SAMPLE_OF = "mixed-synthetic-stress-mix-load0.9"
"""Policy (5) replays the first jobs of the stress mix at 0.9: half of them multi-GPU, many of them waiting for a
full set (the topology wait and its drains), so the HTTP path is checked where the extender keeps the most state."""
STRESS_MIX_NOTE = "assumed training-heavy stress mix 1:50,2:25,4:15,8:10 (not a trace statistic)"
TRACE_MIX_NOTE = "the Alibaba trace's GPU mix"


@dataclass(frozen=True, slots=True)
class Spec:
    """One run of the set: its fixed plot prefix, what the section calls it, and how to build its inputs."""

    key: str
    title: str
    cluster: str
    """"mixed" (clusters.mixed_fleet(4)), "alibaba" (clusters.alibaba_fleet at `fleet_scale`) or "nvl72"
    (clusters.nvl72_fleet(), whose synthetic workload is group_mix.py's)."""
    fleet_scale: float
    workload: str
    """One of "synthetic", "alibaba" and "inflation"."""
    load: float | None
    jobs: int | None
    """Synthetic jobs; for the trace and inflation, a cap on the jobs kept (None: all, the standard set)."""
    gpu_mix: Mapping[int, int]
    """The synthetic GPUs-per-pod weights of the mixed and Alibaba fleets (empty for nvl72)."""
    mix_note: str


@dataclass(frozen=True, slots=True)
class Result:
    spec: Spec
    nodes: int
    gpus: int
    jobs: str
    summaries: tuple[Summary, ...]
    seconds: float
    plots: tuple[Path, ...]
    verdict: str | None
    met: bool | None
    """Whether the verdict's targets were met; None where the run has none."""
    pools: str | None
    curve: str | None
    groups: tuple[GroupSummary, ...]
    """Per policy, for the nvl72 runs; empty for the others."""


@dataclass(frozen=True, slots=True)
class Bench:
    results: tuple[Result, ...]
    http: HttpCheck
    http_seconds: float
    seconds: float
    quick: bool


def standard_set(quick: bool = False) -> tuple[Spec, ...]:
    """The issue's standard set; `quick` keeps every run with far fewer jobs (for tests)."""
    cap = QUICK_JOBS if quick else None
    specs = []
    for load in (0.8, 0.9):
        specs.append(Spec(f"mixed-synthetic-trace-mix-load{load:g}",
                          f"Mixed fleet, synthetic (trace mix), load {load:g}", "mixed", 1.0, "synthetic", load,
                          cap or 10_000, TRACE_GPU_MIX, TRACE_MIX_NOTE))
    for load in (0.8, 0.9):
        specs.append(Spec(f"mixed-synthetic-stress-mix-load{load:g}",
                          f"Mixed fleet, synthetic (assumed training-heavy stress mix), load {load:g}",
                          "mixed", 1.0, "synthetic", load, cap or 3_000, TRAINING_HEAVY_MIX, STRESS_MIX_NOTE))
    specs.append(Spec("mixed-alibaba-load0.8", "Mixed fleet, Alibaba trace compressed to load 0.8", "mixed", 1.0,
                      "alibaba", 0.8, cap, TRACE_GPU_MIX, TRACE_MIX_NOTE))
    for load in (0.8, 0.9):
        specs.append(Spec(f"alibaba0.1-synthetic-trace-mix-load{load:g}",
                          f"Alibaba fleet at scale {FLEET_SCALE:g}, synthetic (trace mix), load {load:g}", "alibaba",
                          FLEET_SCALE, "synthetic", load, QUICK_FLEET_JOBS if quick else ALIBABA_SYNTHETIC_JOBS,
                          TRACE_GPU_MIX, TRACE_MIX_NOTE))
    specs.append(Spec("alibaba0.1-alibaba-load0.8", f"Alibaba fleet at scale {FLEET_SCALE:g}, Alibaba trace "
                      "compressed to load 0.8", "alibaba", FLEET_SCALE, "alibaba", 0.8, cap, TRACE_GPU_MIX,
                      TRACE_MIX_NOTE))
    specs.append(Spec("alibaba-inflation", "Inflation (workload c) on the whole Alibaba fleet, as FGD", "alibaba", 1.0,
                      "inflation", None, cap, TRACE_GPU_MIX, TRACE_MIX_NOTE))
    specs.append(Spec("mixed-inflation", "Inflation (workload c) on the mixed fleet", "mixed", 1.0, "inflation",
                      None, cap, TRACE_GPU_MIX, TRACE_MIX_NOTE))
    for load in (0.8, 0.9):
        specs.append(Spec(f"nvl72-groups-load{load:g}", f"NVL72 racks beside HGX nodes, multi-node jobs, load {load:g}",
                          "nvl72", 1.0, "synthetic", load, cap or NVL72_JOBS, {}, mix_note()))
    return tuple(specs)


def cluster_of(spec: Spec) -> tuple[ClusterNode, ...]:
    if spec.cluster == "nvl72":
        return nvl72_fleet()
    return mixed_fleet(4) if spec.cluster == "mixed" else alibaba_fleet(scale=spec.fleet_scale)


def workload_of(spec: Spec, cluster: Sequence[ClusterNode]) -> tuple[Job, ...]:
    if spec.workload == "synthetic":
        assert spec.load is not None and spec.jobs is not None
        if spec.cluster == "nvl72":
            return group_workload(cluster, spec.load, spec.jobs, SEED)
        return synthetic(cluster, spec.load, spec.jobs, SEED, gpu_mix=spec.gpu_mix)
    if spec.workload == "alibaba":
        assert spec.load is not None
        return at_load(alibaba_trace(), cluster, spec.load)[:spec.jobs]
    return inflation(alibaba_trace(), cluster, SEED)[:spec.jobs]


def steady_share(jobs: int, cluster: Sequence[ClusterNode], load: float,
                 gpu_mix: Mapping[int, int] = TRACE_GPU_MIX) -> float:
    """GPUs held at the last arrival over their steady-state level, for Poisson arrivals with the trace's
    lognormal durations and nothing waiting (an M/G/inf ramp): E[min(D, T)] / E[D] with T the arrival window."""
    mean_gpus = sum(size * weight for size, weight in gpu_mix.items()) / sum(gpu_mix.values())
    mean_duration = math.exp(TRACE_DURATION_MU + TRACE_DURATION_SIGMA ** 2 / 2)
    window = jobs * mean_gpus * mean_duration / (load * sum(pool_capacity(cluster).values()))
    z = (math.log(window) - TRACE_DURATION_MU) / TRACE_DURATION_SIGMA
    normal = NormalDist()
    held = mean_duration * normal.cdf(z - TRACE_DURATION_SIGMA) + window * (1 - normal.cdf(z))
    return held / mean_duration


def run_spec(spec: Spec, plots: Path, published_curve: bool) -> tuple[Result, tuple[Job, ...], Sequence[ClusterNode]]:
    """Every standard policy on the spec's cluster and workload, with a progress bar per policy on stderr."""
    started = time.perf_counter()
    cluster = cluster_of(spec)
    jobs = workload_of(spec, cluster)
    runs = []
    for policy in (group_policies if spec.cluster == "nvl72" else standard_policies)(cluster):
        with tqdm(total=len(jobs), desc=f"{spec.key} {policy.name}", unit="pod", file=sys.stderr, leave=False) as bar:
            runs.append(replay(cluster, jobs, policy, SEED, progress=lambda done: bar.update(done - bar.n)))
    summaries = tuple(summarize(run) for run in runs)
    groups = tuple(summarize_groups(run) for run in runs) if spec.cluster == "nvl72" else ()
    paths = write_plots(runs, plots, spec.key) + (write_group_plots(runs, plots, spec.key) if groups else [])
    curve = None
    if spec.workload == "inflation":
        curves = {run.policy: allocation_curve(run) for run in runs}
        published = read_published() if published_curve else ()
        paths.append(write_inflation_plot(curves, published, plots, spec.key))
        curve = curve_table(curves, published_curve)
    judged = spec.load in (0.8, 0.9)
    said = (group_acceptance(groups) if groups else acceptance(summaries)) if judged else None
    met = (group_met(groups) if groups else acceptance_met(summaries)) if judged else None
    mixed_at_09 = spec.cluster == "mixed" and spec.workload == "synthetic" and spec.load == 0.9
    pools = pool_table(runs) if mixed_at_09 else None
    result = Result(spec, len(cluster), sum(pool_capacity(cluster).values()), describe(jobs), summaries,
                    time.perf_counter() - started, tuple(paths), said, met, pools, curve, groups)
    return result, jobs, cluster


def acceptance(summaries: Sequence[Summary]) -> str:
    """The gap between (3) and (4) on "at 100%", and whether (4) reached >= 99 % of multi-GPU pods at full
    bandwidth efficiency with GPU utilization and p95 pending time no worse than (1) and (2)."""
    _, _, three, four = summaries
    checks = acceptance_checks(summaries)
    if checks is None:
        return "No multi-GPU pod was placed: nothing to judge on bandwidth."
    gap = 100 * (four.efficiency_full_share - three.efficiency_full_share)
    short = [text for ok, text in checks if not ok]
    said = ("meets the acceptance: " + "; ".join(text for _, text in checks) if not short
            else "falls short: " + "; ".join(short))
    return (f"(4) against (3) at 100%: {percent(four.efficiency_full_share)} against "
            f"{percent(three.efficiency_full_share)} ({gap:+.2f} points). (4) {said}.")


def acceptance_checks(summaries: Sequence[Summary]) -> list[tuple[bool, str]] | None:
    """`acceptance`'s targets, each met or not with its figures; None when no multi-GPU pod was placed."""
    one, two, _, four = summaries
    if not four.multi_gpu:
        return None
    return [(four.efficiency_full_share >= FULL_SHARE_TARGET,
             f"at 100% {percent(four.efficiency_full_share)} (target >= {FULL_SHARE_TARGET:.0%})"),
            (four.gpu_utilization >= max(one.gpu_utilization, two.gpu_utilization),
             f"GPU utilization {four.gpu_utilization:.2%} against {one.gpu_utilization:.2%} (1) and "
             f"{two.gpu_utilization:.2%} (2)"),
            (four.pending_p95_s <= min(one.pending_p95_s, two.pending_p95_s),
             f"p95 pending {four.pending_p95_s:,.0f} s against {one.pending_p95_s:,.0f} s (1) and "
             f"{two.pending_p95_s:,.0f} s (2)")]


def acceptance_met(summaries: Sequence[Summary]) -> bool:
    """Every target of `acceptance` met; a run with no multi-GPU pod placed cannot meet them."""
    checks = acceptance_checks(summaries)
    return checks is not None and all(ok for ok, _ in checks)


def group_met(groups: Sequence[GroupSummary]) -> bool:
    """`group_acceptance`'s target: (4) required puts >= 99 % of the groups that fit one NVLink domain into one."""
    return groups[3].groups_in_one_domain_share >= FULL_SHARE_TARGET


def group_acceptance(groups: Sequence[GroupSummary]) -> str:
    """Issue 17's target: (4) with required placement puts >= 99 % of the groups that fit one NVLink domain into
    one; its GPU utilization and p95 pending are set beside (1)'s, (6)'s and (7)'s, and (4) preferred is named
    too."""
    one, kueue, slurm, ours, preferred = groups
    met = group_met(groups)
    classes = ", ".join(f"{name}: {_seconds(ours, name)} against {_seconds(one, name)} (1), "
                        f"{_seconds(kueue, name)} (6) and {_seconds(slurm, name)} (7)"
                        for name in ours.pending_p95_s_by_pods)
    return (f"{ours.policy} puts {percent(ours.groups_in_one_domain_share)} of the "
            f"{ours.groups_fitting_one_domain:,} started groups that fit one NVLink domain into one (target >= "
            f"{FULL_SHARE_TARGET:.0%}: "
            f"{'met' if met else 'not met'}); {preferred.policy} {percent(preferred.groups_in_one_domain_share)}, "
            f"(1) {percent(one.groups_in_one_domain_share)}, (6) {percent(kueue.groups_in_one_domain_share)}, "
            f"(7) {percent(slurm.groups_in_one_domain_share)}. GPU utilization of running jobs "
            f"{percent(ours.gpu_utilization_running)} against {percent(one.gpu_utilization_running)} (1), "
            f"{percent(kueue.gpu_utilization_running)} (6) and {percent(slurm.gpu_utilization_running)} (7); p95 "
            f"pending by pods per job, {classes}.")


def _seconds(groups: GroupSummary, name: str) -> str:
    value = groups.pending_p95_s_by_pods.get(name, math.nan)
    return "-" if math.isnan(value) else f"{value:,.0f} s"


def pool_table(runs: Sequence[Run]) -> str:
    """Per pool and policy: the share of multi-GPU pods at full bandwidth efficiency, and how many there were."""
    cells: dict[str, dict[str, tuple[int, int]]] = {}
    for run in runs:
        key_of = {node.name: board_key(node) for node in run.nodes}
        pool_of = {node.name: node.gpu_model for node in run.nodes}
        for pool in pool_of.values():
            cells.setdefault(pool, {}).setdefault(run.policy, (0, 0))
        for outcome in run.outcomes:
            pod = pod_bandwidth(key_of, outcome)
            if pod is not None and outcome.placement is not None:
                full, count = cells[pool_of[outcome.placement.node]][run.policy]
                cells[pool_of[outcome.placement.node]][run.policy] = (full + (pod.efficiency >= FULL), count + 1)
    policies = [run.policy for run in runs]
    lines = ["| pool | " + " | ".join(policies) + " |", "|---|" + "---:|" * len(policies)]
    for pool, by_policy in cells.items():
        lines.append(f"| {pool} | " + " | ".join(
            f"{percent(full / count) if count else '-'} of {count:,}" for full, count in
            (by_policy[policy] for policy in policies)) + " |")
    return "\n".join(lines)


def curve_table(curves: Mapping[str, Sequence[CurvePoint]], published: bool) -> str:
    """GPUs allocated (% of capacity) at a few arrived percents, ours and, for the whole fleet, FGD's."""
    header = "| policy | " + " | ".join(f"{at}% arrived" for at in INFLATION_PERCENTS) + " |"
    lines = [header, "|---|" + "---:|" * len(INFLATION_PERCENTS)]
    for policy, curve in curves.items():
        values = discrete(curve, INFLATION_PERCENTS)
        lines.append(f"| {policy} | " + " | ".join("-" if values[p] is None else f"{values[p]:.1f}%"
                                                    for p in INFLATION_PERCENTS) + " |")
    if published:
        for policy, points in published_by_policy(read_published()).items():
            at = {point.arrived_pct: point.median_pct for point in points}
            lines.append(f"| FGD paper: {policy} (median of its seeds) | " + " | ".join(
                f"{at[p]:.1f}%" if p in at else "-" for p in INFLATION_PERCENTS) + " |")
    lines += ["", COMPARABILITY]
    if published:
        lines.append("FGD's rows: `loadtests/replay/data/fgd_published.csv` (source in `data/PROVENANCE.md`).")
    return "\n".join(lines)


def run_bench(plots: Path = PLOTS, quick: bool = False) -> Bench:
    started = time.perf_counter()
    # In scheduling-only mode the extender warns of every pod the stock plugin gave other GPUs: expected here.
    extender_log = logging.getLogger("extender")
    level = extender_log.level
    extender_log.setLevel(logging.ERROR)
    try:
        results: list[Result] = []
        http_input: tuple[tuple[Job, ...], Sequence[ClusterNode]] | None = None
        for spec in standard_set(quick):
            result, jobs, cluster = run_spec(spec, plots, spec.key == "alibaba-inflation")
            results.append(result)
            if spec.key == HTTP_SAMPLE_OF:
                http_input = (jobs, cluster)
        assert http_input is not None
        http_started = time.perf_counter()
        check = http_check(http_input[1], http_input[0], SEED, sample=QUICK_SAMPLE if quick else HTTP_SAMPLE)
        http_seconds = time.perf_counter() - http_started
    finally:
        extender_log.setLevel(level)
    return Bench(tuple(results), check, http_seconds, time.perf_counter() - started, quick)


def render(bench: Bench, root: Path, times: bool = True) -> str:
    """The section's body; `times` False leaves out every time, so two runs of one seed compare equal."""
    lines = [
        f"- Seed {SEED} for every run; policies (1)-(4) of `policies.standard_policies`. Each run's table is "
        "`report.markdown_table` of its summaries; plots under `loadtests/plots/replay/`.",
        f"- Job counts: 10,000 (mixed, trace mix) and 3,000 (mixed, stress mix: multi-GPU pods make each step "
        f"slower); {ALIBABA_SYNTHETIC_JOBS:,} on the Alibaba fleet at scale {FLEET_SCALE:g} (`--fleet-scale`), "
        f"chosen so that the GPUs held at the last arrival reach "
        f"{percent(steady_share(ALIBABA_SYNTHETIC_JOBS, alibaba_fleet(scale=FLEET_SCALE), 0.9))} of their "
        "steady-state level at load 0.9 (the M/G/inf ramp of the trace's lognormal durations; the whole fleet "
        "would need ten times the jobs for the same).",
        f"- The nvl72 runs replay {NVL72_JOBS:,} jobs of the multi-node mix with policies (1), (6) and (4) (its "
        "members asking required, then preferred placement) of `policies.group_policies`; their table is "
        "`report.group_table`, and the all-reduce figures behind the "
        "modelled job time are `topology/collectives.py` ALLREDUCE (" + "; ".join(
            f"{platform}: {figures.domain_gbps:g} GB/s in one NVLink domain, {figures.leaf_gbps:g} within a leaf"
            for platform, figures in ALLREDUCE.items())
        + f"; across leaves x{SPINE_FACTOR:g}, an assumed 2:1 spine oversubscription).",
    ]
    if bench.quick:
        lines.append(f"- **Quick run**: {QUICK_FLEET_JOBS:,} synthetic jobs on the Alibaba fleet, every other workload "
                     f"cut to {QUICK_JOBS} jobs; not the standard set, and its verdicts are not judged.")
    if times:
        lines.append(f"- Total wall time {bench.seconds:,.0f} s (" + ", ".join(
            f"{result.spec.key} {result.seconds:,.0f} s" for result in bench.results)
                     + f", HTTP check {bench.http_seconds:,.0f} s).")
    for result in bench.results:
        spec = result.spec
        load = "" if spec.load is None else f", offered load {spec.load:g}"
        mix = f", {spec.mix_note}" if spec.workload == "synthetic" else ""
        fleet = {"alibaba": f" at scale {spec.fleet_scale:g}", "mixed": " (4 nodes per pool)",
                 "nvl72": f" ({Spans(cluster_of(spec)).outline()})"}[spec.cluster]
        lines += ["", f"### {spec.title}", "",
                  f"- Cluster: {spec.cluster} fleet{fleet}, {result.nodes:,} nodes, {result.gpus:,} GPUs; workload "
                  f"{spec.workload}{mix}{load}: {result.jobs}."
                  + (f" Run time {result.seconds:,.0f} s." if times else ""),
                  "", group_table(list(zip(result.summaries, result.groups))) if result.groups
                  else markdown_table(result.summaries)]
        if result.verdict is not None:
            lines += ["", result.verdict]
        if result.pools is not None:
            lines += ["", "Per pool: multi-GPU pods at full bandwidth efficiency, of how many.", "", result.pools]
        if result.curve is not None:
            lines += ["", "GPU allocation ratio against arrived workload (FGD's curve), sampled at arrivals:", "",
                      result.curve]
        lines += ["", "Plots: " + ", ".join(f"[{path.stem.removeprefix(spec.key + '-')}]"
                                            f"({Path(os.path.relpath(path, root)).as_posix()})"
                                            for path in result.plots)]
    lines += ["", "### Policy (5): the extender over HTTP", "",
              f"{bench.http.summary()}; {len(bench.http.mismatches)} mismatches (the first jobs of `{HTTP_SAMPLE_OF}`)."
              + (f" Run time {bench.http_seconds:,.0f} s." if times else "")]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replay.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--write", type=Path, metavar="FILE", help="replace the replay section of FILE")
    parser.add_argument("--quick", action="store_true", help="far fewer jobs (a smoke run)")
    parser.add_argument("--plots", type=Path, default=PLOTS, metavar="DIR", help="where the PNG plots go")
    args = parser.parse_args(argv)
    bench = run_bench(args.plots, args.quick)
    root = (args.write.parent if args.write is not None else Path.cwd())
    header = run_header("Workload replay", "replay/bench.py", argv, bench.seconds)[:-1]
    command = " ".join(["python -m loadtests.replay.bench", *(sys.argv[1:] if argv is None else argv)])
    section = "\n".join([*header, f"- Command: `{command}`"])
    body = section + "\n" + render(bench, root)
    if args.write is not None:
        write_section(args.write, body, BEGIN, END)
    else:
        print(body)
    return verdict("replay/bench", missed(bench))


def missed(bench: Bench) -> list[str]:
    """The runs that fell short of their targets (not judged in a quick run), and a mismatch of policy (5)."""
    misses = [f"{result.spec.title}: {result.verdict}" for result in bench.results
              if result.met is False and not bench.quick]
    if not bench.http.matches:
        misses.append(f"policy (5) over HTTP: {bench.http.summary()}")
    return misses


if __name__ == "__main__":
    sys.exit(main())
