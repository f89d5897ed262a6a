"""python -m loadtests.replay.group_matrix: the nvl72 fleet's policies over loads and communication shares, each
over several seeds (issue 29, item 5), run by `make bench`.

For every load in LOADS and communication share `c` in COMM_SHARES, group_mix's synthetic workload of each seed
is replayed under the group policies (policies.group_policies: count-only, Kueue-like, Slurm-like, ours required
and ours preferred, the default), each job running as long as where it landed says (runtime.py). Per policy, the
mean over the seeds and its 95% interval (Student's t) of: groups in one domain, GPU and goodput utilization,
mean and p95 JCT, bounded slowdown, p95 wait by pods per job, jobs never started. Runs go to worker processes, one
per CPU. `--write` replaces the section between the markers in the Markdown file; the plots (goodput and
utilization against load, and p95 wait by size class, one figure per `c`) go to loadtests/plots/replay/.

The verdicts are issue 29's, at load 0.85: at `c` 0.3 the default lands 95% of the groups that fit one domain in
one, has the highest goodput and the lowest mean JCT, and a p95 wait of its largest class no longer than the
Slurm-like policy's; at `c` 0 its GPU utilization is within 2 points of count-only's. Each is judged on the means;
a miss exits 1.

    python -m loadtests.replay.group_matrix [--seeds 5] [--jobs 2000] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first: no display on a benchmark host)

from loadtests.bench_select import run_header, write_section  # noqa: E402
from loadtests.replay.__main__ import mean_interval  # noqa: E402
from loadtests.replay.clusters import nvl72_fleet  # noqa: E402
from loadtests.replay.engine import replay  # noqa: E402
from loadtests.replay.group_metrics import summarize_groups  # noqa: E402
from loadtests.replay.group_mix import group_workload, mix_note  # noqa: E402
from loadtests.replay.job_metrics import summarize_jobs  # noqa: E402
from loadtests.replay.metrics import summarize  # noqa: E402
from loadtests.replay.policies import OURS_GROUPS_PREFERRED, group_policies  # noqa: E402
from loadtests.replay.runtime import RunTime  # noqa: E402
from loadtests.replay.slurm_like import limits_note  # noqa: E402
from loadtests.replay.spans import Spans  # noqa: E402

BEGIN, END = "<!-- group_matrix:begin -->", "<!-- group_matrix:end -->"
PLOTS = Path(__file__).resolve().parents[1] / "plots" / "replay"
LOADS = (0.7, 0.85, 0.95)
COMM_SHARES = (0.0, 0.3, 0.5)
SEEDS = 5
JOBS = 2000
JUDGED_LOAD = 0.85
ONE_DOMAIN_SHARE = 0.95
UTILIZATION_POINTS = 0.02
COUNT_ONLY = "(1) quantity only"
SLURM_LIKE = "(7) Slurm-like, EASY backfill, topology/block"
LARGEST = "9-18"
FIGURES = ("groups_in_one_domain_share", "gpu_utilization", "goodput_utilization", "jct_mean_s", "jct_p95_s",
           "bounded_slowdown_mean", "still_waiting")

Figures = dict[str, float]
"""A run's figures by name; a wait by class is `wait_p95_s_by_pods.<class>`."""


def replay_one(load: float, comm_share: float, seed: int, jobs: int) -> dict[str, Figures]:
    """Every group policy on one seed's workload at one load and communication share: each one's figures."""
    logging.getLogger("extender").setLevel(logging.ERROR)  # scheduling-only warnings are expected here
    cluster = nvl72_fleet()
    workload = group_workload(cluster, load, jobs, seed)
    run_time = RunTime(cluster, comm_share)
    found: dict[str, Figures] = {}
    for policy in group_policies(cluster, comm_share=comm_share):
        run = replay(cluster, workload, policy, seed, run_seconds=run_time.seconds)
        merged = {**asdict(summarize(run, comm_share)), **asdict(summarize_jobs(run)),
                  **asdict(summarize_groups(run, comm_share))}
        figures = {name: float(merged[name]) for name in FIGURES}
        figures.update({f"wait_p95_s_by_pods.{name}": value for name, value in merged["wait_p95_s_by_pods"].items()})
        found[policy.name] = figures
    return found


Cell = dict[str, dict[str, tuple[float | None, float | None]]]
"""Per policy, per figure: the mean over the seeds and the half-width of its 95% interval."""


def merge(seeds: Sequence[dict[str, Figures]]) -> Cell:
    return {policy: {name: mean_interval([found[policy][name] for found in seeds if name in found[policy]])
                     for name in seeds[0][policy]} for policy in seeds[0]}


def run_matrix(seeds: int, jobs: int, workers: int) -> dict[tuple[float, float], Cell]:
    tasks = [(load, share, seed) for load in LOADS for share in COMM_SHARES for seed in range(1, seeds + 1)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        futures = {task: pool.submit(replay_one, *task, jobs) for task in tasks}
        done: dict[tuple[float, float], list[dict[str, Figures]]] = {}
        for number, (task, future) in enumerate(futures.items(), 1):
            done.setdefault(task[:2], []).append(future.result())
            print(f"\r{number}/{len(tasks)} runs", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return {cell: merge(found) for cell, found in done.items()}


def verdicts(matrix: Mapping[tuple[float, float], Cell]) -> list[tuple[str, bool]]:
    """Issue 29's acceptance, on the means at JUDGED_LOAD: (what, held)."""
    judged, blind = matrix[(JUDGED_LOAD, 0.3)], matrix[(JUDGED_LOAD, 0.0)]
    ours = judged[OURS_GROUPS_PREFERRED]
    others = [name for name in judged if name != OURS_GROUPS_PREFERRED]

    def mean(cell: Cell, policy: str, figure: str) -> float:
        value = cell[policy].get(figure, (None, None))[0]
        return math.nan if value is None else value

    largest = f"wait_p95_s_by_pods.{LARGEST}"
    return [
        (f"c 0.3: the default lands at least {ONE_DOMAIN_SHARE:.0%} of the groups that fit one domain in one",
         mean(judged, OURS_GROUPS_PREFERRED, "groups_in_one_domain_share") >= ONE_DOMAIN_SHARE),
        ("c 0.3: the default's goodput is at least every other policy's",
         all(mean(judged, OURS_GROUPS_PREFERRED, "goodput_utilization") >= mean(judged, name, "goodput_utilization")
             for name in others)),
        ("c 0.3: the default's mean JCT is at most every other policy's",
         all(mean(judged, OURS_GROUPS_PREFERRED, "jct_mean_s") <= mean(judged, name, "jct_mean_s")
             for name in others)),
        (f"c 0.3: the default's p95 wait of {LARGEST}-pod jobs is at most the Slurm-like policy's",
         largest in ours and mean(judged, OURS_GROUPS_PREFERRED, largest) <= mean(judged, SLURM_LIKE,
                                                                                               largest)),
        (f"c 0: the default's GPU utilization is within {UTILIZATION_POINTS * 100:g} points of count-only's",
         mean(blind, OURS_GROUPS_PREFERRED, "gpu_utilization")
         >= mean(blind, COUNT_ONLY, "gpu_utilization") - UTILIZATION_POINTS),
    ]


def _value(cell: Cell, policy: str, figure: str, percent: bool = False) -> str:
    mean, half = cell[policy].get(figure, (None, None))
    if mean is None:
        return "-"
    if percent:
        return f"{100 * mean:.1f}%" + ("" if half is None else f" ± {100 * half:.1f}")
    return f"{mean:,.0f}" + ("" if half is None else f" ± {half:,.0f}")


def tables(matrix: Mapping[tuple[float, float], Cell]) -> list[str]:
    lines: list[str] = []
    for share in COMM_SHARES:
        lines += ["", f"#### Communication share c = {share:g}", "",
                  "| load | policy | in one domain | GPU utilization | goodput | mean JCT (s) | p95 JCT (s) | "
                  f"bounded slowdown | p95 wait, 1 pod (s) | p95 wait, {LARGEST} pods (s) | never started |",
                  "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for load in LOADS:
            cell = matrix[(load, share)]
            for policy in cell:
                slowdown = cell[policy]["bounded_slowdown_mean"][0]
                lines.append(
                    f"| {load:g} | {policy} | {_value(cell, policy, 'groups_in_one_domain_share', True)} | "
                    f"{_value(cell, policy, 'gpu_utilization', True)} | "
                    f"{_value(cell, policy, 'goodput_utilization', True)} | {_value(cell, policy, 'jct_mean_s')} | "
                    f"{_value(cell, policy, 'jct_p95_s')} | {'-' if slowdown is None else f'{slowdown:,.1f}'} | "
                    f"{_value(cell, policy, 'wait_p95_s_by_pods.1')} | "
                    f"{_value(cell, policy, f'wait_p95_s_by_pods.{LARGEST}')} | "
                    f"{_value(cell, policy, 'still_waiting')} |")
    return lines


def write_plots(matrix: Mapping[tuple[float, float], Cell], directory: Path) -> list[Path]:
    """Per communication share, `group-matrix-c<c>.png`: goodput and GPU utilization against load, and the p95
    wait by pods per job at JUDGED_LOAD, one line or bar group per policy."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for share in COMM_SHARES:
        figure, (goodput, utilization, waits) = plt.subplots(1, 3, figsize=(15, 4.4))
        policies = list(matrix[(LOADS[0], share)])
        for policy in policies:
            for axis, name in ((goodput, "goodput_utilization"), (utilization, "gpu_utilization")):
                means = [matrix[(load, share)][policy][name][0] for load in LOADS]
                axis.plot(LOADS, [math.nan if value is None else 100 * value for value in means], marker="o",
                          label=policy)
        classes = [name.split(".", 1)[1] for name in matrix[(JUDGED_LOAD, share)][policies[0]]
                   if name.startswith("wait_p95_s_by_pods.")]
        width = 0.8 / len(policies)
        for number, policy in enumerate(policies):
            cell = matrix[(JUDGED_LOAD, share)][policy]
            values = [cell.get(f"wait_p95_s_by_pods.{name}", (None, None))[0] for name in classes]
            waits.bar([at + number * width for at in range(len(classes))],
                      [math.nan if value is None else value for value in values], width, label=policy)
        waits.set_xticks([at + 0.4 - width / 2 for at in range(len(classes))], [f"{name} pods" for name in classes])
        waits.set_yscale("symlog", linthresh=10.0)
        for axis, (x, y) in ((goodput, ("offered load", "goodput utilization (%)")),
                             (utilization, ("offered load", "GPU utilization (%)")),
                             (waits, ("pods per job", f"p95 wait at load {JUDGED_LOAD:g} (s)"))):
            axis.set_xlabel(x)
            axis.set_ylabel(y)
            axis.grid(alpha=0.3)
        goodput.legend(fontsize=7)
        figure.suptitle(f"nvl72 fleet, communication share {share:g}")
        figure.tight_layout()
        path = directory / f"group-matrix-c{share:g}.png"
        figure.savefig(path, dpi=100, metadata={"Software": None})
        plt.close(figure)
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtests.replay.group_matrix", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=SEEDS, help=f"seeds per cell, from 1 (default {SEEDS})")
    parser.add_argument("--jobs", type=int, default=JOBS, help=f"synthetic jobs per run (default {JOBS})")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: CPUs)")
    parser.add_argument("--write", type=Path, metavar="PATH", help="rewrite this Markdown file's group_matrix section")
    args = parser.parse_args(argv)
    if not 2 <= args.seeds <= 50 or not 100 <= args.jobs <= 100_000 or not 1 <= args.workers <= 64:
        print("error: --seeds 2-50, --jobs 100-100,000, --workers 1-64", file=sys.stderr)
        return 2
    started = time.perf_counter()
    matrix = run_matrix(args.seeds, args.jobs, args.workers)
    held = verdicts(matrix)
    cluster = nvl72_fleet()
    plots = write_plots(matrix, PLOTS)
    lines = run_header("Multi-node jobs over loads and communication shares (issue 29)", "replay/group_matrix.py",
                       argv, time.perf_counter() - started)
    lines += [f"- Fleet: {Spans(cluster).outline()}, {len(cluster)} nodes; workload: {args.jobs:,} jobs of "
              f"group_mix.py's {mix_note()}, at each load; seeds 1 to {args.seeds}, each figure their mean ± the "
              "half-width of its 95% interval. A job runs `duration × ((1 − c) + c × best / got)` where it landed "
              "(runtime.py), and our extender runs with `--comm-share c`, as an operator who knows the fleet's jobs "
              f"sets it; the Slurm-like policy's time limits: {limits_note(group_workload(cluster, 0.85, 100, 1))}"
              ". The default policy is ours, preferred.", "",
              "| issue 29's acceptance, at load 0.85, on the means | verdict |", "|---|---|"]
    lines += [f"| {what} | {'**met**' if ok else '**missed**'} |" for what, ok in held]
    lines += tables(matrix)
    lines += ["", "Plots: " + ", ".join(f"`{path.relative_to(PLOTS.parents[2])}`" for path in plots) + "."]
    section = "\n".join(lines)
    print(section)
    if args.write is not None:
        write_section(args.write, section, BEGIN, END)
    return 0 if all(ok for _, ok in held) else 1


if __name__ == "__main__":
    sys.exit(main())
