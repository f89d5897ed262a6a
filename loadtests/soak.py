"""Soak: a steady scheduling load for ten minutes against the real extender on a 1,000-node demo cluster, with
pods arriving and leaving and boards being replaced, recording the extender's RSS and each verb's p99 every 10 s.

A leak, or a cache that grows with churn, shows as a slope in RSS over minutes, not in a 15-second load test; a
tail that drifts shows as p99 climbing from one interval to the next. So the load is paced (a fixed rate of
scheduling cycles, as a busy cluster's queue gives), not flat out, and every interval is reported on its own.

- The extender: `loadtests/large_cluster_server.py` (the product app on a DemoCluster of N real boards, 45 % of
  the GPUs taken; after each bind a running pod ends and a new pending pod is created, so the cluster stays in a
  steady state with arrivals and departures).
- kube-scheduler, played by this script: cycles of filter, prioritize on the names that passed, and bind to the
  best, at `--rate` cycles per second. Each cycle sends the candidate names kube-scheduler's default
  percentageOfNodesToScore gives at this cluster size (50 % - nodes/125, at least 100 names), a window moved along
  the cluster from one cycle to the next.
- Every `--replace-every` seconds a node with no pods gets a board the extender has not seen (new GPU ids, NUMA
  ids moved on): the churn that made the compiled-topology cache grow without bound (issue 9).
- Every `--interval` seconds: the extender's RSS (VmRSS), each verb's server-side p50/p99 (its `Server-Timing`)
  and HTTP p99, the cycles done and their outcomes.

Its verdict (`checks`), on the intervals after the first minute split in halves: no leak (RSS grows by at most
RSS_SLOPE_LIMIT MB a minute over the second half: a cache filling up flattens out, a leak does not), no tail that
drifts (each verb's median p99 over the second half at most P99_DRIFT_LIMIT times the first half's), the pace
held (PACE_SHARE of the cycles asked for done), and no error answer or error the extender logged. It exits 1 on a
miss.

    python loadtests/soak.py [--nodes 1000] [--seconds 600] [--rate 20] [--write BENCHMARKS.md]

The plot (`--plot`, default loadtests/plots/soak.png) needs matplotlib: `pip install -e '.[harness]'`
(the Makefile's venv has it).
"""

from __future__ import annotations

import argparse
import gc
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench_select import Check, load_average, missed, percentile, run_header, verdict, write_section  # noqa: E402
from load_extender import BOUND, VERBS, Client, Samples, Server, _post  # noqa: E402

from loadtests.replay.kube_scores import feasible_nodes_to_find  # noqa: E402

BEGIN, END = "<!-- soak:begin -->", "<!-- soak:end -->"
WARMUP_SECONDS = 60.0  # RSS slope is fitted after this: the first minute fills caches that then stay
RSS_SLOPE_LIMIT = 0.5
"""MB a minute the extender's RSS may grow over the second half: a leak at this rate adds 30 MB an hour."""
P99_DRIFT_LIMIT = 1.5
"""A verb's median p99 over the second half against the first half's: beyond this the tail drifts."""
PACE_SHARE = 0.95
"""Of the cycles `--rate` asks for, the share done: fewer, and the load was not the one the figures claim."""


@dataclass(frozen=True, slots=True)
class Interval:
    """One `--interval` of the run, as measured at its end."""

    at: float  # seconds since the load started
    rss_mb: float
    cycles: int
    outcomes: dict[str, int]
    server_p50_ms: dict[str, float]
    server_p99_ms: dict[str, float]
    http_p99_ms: dict[str, float]
    boards_replaced: int
    errors_logged: int  # by the extender since it started


def names_per_cycle(nodes: int) -> int:
    """kube-scheduler's numFeasibleNodesToFind with the default percentageOfNodesToScore (0: adaptive)."""
    return feasible_nodes_to_find(0, nodes)


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def run_load(args: argparse.Namespace, server: Server) -> list[Interval]:
    client = Client(server.port, None, args.nodes)
    size = names_per_cycle(args.nodes)
    pid = server.process.pid
    intervals: list[Interval] = []
    gc.disable()  # no collector pause in the client's paced loop; collected between intervals
    started = time.perf_counter()
    next_cycle = started
    next_replace = started + args.replace_every if args.replace_every > 0 else float("inf")
    number = 0
    while (now := time.perf_counter()) - started < args.seconds:
        samples, outcomes, cycles = Samples(), {}, 0
        interval_end = min(started + args.seconds, now + args.interval)
        while (now := time.perf_counter()) < interval_end:
            if now >= next_replace:
                _post(client.ours, "/loadtest/replace-board", b"", None, "")
                next_replace += args.replace_every
            if now < next_cycle:
                time.sleep(min(next_cycle, interval_end, next_replace) - now)
                continue
            cycle = client.cycle(*client.window(size, number), samples)
            number += 1
            cycles += 1
            outcomes[cycle.outcome] = outcomes.get(cycle.outcome, 0) + 1
            next_cycle = max(next_cycle + 1 / args.rate, time.perf_counter() - 1.0)  # no burst after a stall
        stats = client.stats()
        intervals.append(Interval(
            at=round(time.perf_counter() - started, 1), rss_mb=rss_mb(pid), cycles=cycles, outcomes=outcomes,
            server_p50_ms={verb: _pct(samples.server_ms[verb], 0.50) for verb in VERBS},
            server_p99_ms={verb: _pct(samples.server_ms[verb], 0.99) for verb in VERBS},
            http_p99_ms={verb: _pct(samples.http_ns[verb], 0.99) / 1e6 for verb in VERBS},
            boards_replaced=int(stats.get("boards_replaced", 0)), errors_logged=stats["errors_logged"]))
        gc.collect()
        last = intervals[-1]
        print(f"{last.at:6.0f} s  rss {last.rss_mb:7.1f} MB  cycles {cycles:4d}  "
              + "  ".join(f"{verb} p99 {last.server_p99_ms[verb]:.3f} ms" for verb in VERBS), flush=True)
    return intervals


def _pct(values: list[float] | list[int], fraction: float) -> float:
    return float(percentile(values, fraction)) if values else float("nan")


def slope_mb_per_minute(intervals: Sequence[Interval]) -> float:
    """Least-squares slope of RSS over time."""
    points = [(i.at, i.rss_mb) for i in intervals]
    if len(points) < 2:
        return 0.0
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    return 60 * sum((t - mean_t) * (r - mean_r) for t, r in points) / spread if spread else 0.0


def halves(intervals: Sequence[Interval]) -> tuple[list[Interval], list[Interval]]:
    """The intervals after the first minute (all of them in a shorter run), in two halves."""
    steady = [i for i in intervals if i.at > WARMUP_SECONDS] or list(intervals)
    return steady[:len(steady) // 2], steady[len(steady) // 2:]


def checks(args: argparse.Namespace, intervals: Sequence[Interval]) -> list[Check]:
    """What the soak is for: no leak, no drifting tail, the pace held, no error. A figure that could not be taken
    (too few intervals, a verb never answered) is missed."""
    first, second = halves(intervals)
    slope = slope_mb_per_minute(second) if len(second) >= 2 else math.inf
    found = [Check(f"RSS slope over the second half after the first minute <= {RSS_SLOPE_LIMIT:g} MB/min",
                   f"{slope:+.2f} MB/min" if len(second) >= 2 else "not measured", slope <= RSS_SLOPE_LIMIT)]
    for verb in VERBS:
        before, after = (_median([i.server_p99_ms[verb] for i in half]) for half in (first, second))
        drift = after / before if before > 0 else math.nan
        found.append(Check(f"{verb}: median p99 of the second half <= {P99_DRIFT_LIMIT:g}x the first half's",
                           f"{drift:.2f}x ({before:.3f} / {after:.3f} ms)", drift <= P99_DRIFT_LIMIT))
    cycles, asked = sum(i.cycles for i in intervals), args.rate * args.seconds
    found.append(Check(f"cycles done >= {PACE_SHARE:.0%} of {args.rate:g}/s over {args.seconds:g} s",
                       f"{cycles:,} of {asked:,.0f}", cycles >= PACE_SHARE * asked))
    errors = sum(count for i in intervals for outcome, count in i.outcomes.items()
                 if outcome not in BOUND and outcome != "unschedulable")
    logged = intervals[-1].errors_logged if intervals else 0
    found.append(Check("no error answer (filter, bind) and no error logged by the extender",
                       f"{errors} error answers, {logged} errors logged", errors == 0 and logged == 0))
    return found


def plot(intervals: Sequence[Interval], path: Path, title: str, interval: float) -> None:
    import matplotlib  # the harness extra; imported here so that the rest of loadtests/ runs without it
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times = [i.at / 60 for i in intervals]
    figure, (memory, tail) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    memory.plot(times, [i.rss_mb for i in intervals], marker=".", color="tab:blue")
    memory.set_ylabel("extender RSS (MB)")
    memory.set_ylim(bottom=0)
    memory.grid(alpha=0.3)
    for verb, colour in zip(VERBS, ("tab:green", "tab:orange", "tab:red")):
        tail.plot(times, [i.server_p99_ms[verb] for i in intervals], marker=".", color=colour, label=f"{verb} p99")
    tail.set_ylabel(f"server-side p99 per {interval:g} s (ms)")
    tail.set_xlabel("minutes")
    tail.set_ylim(bottom=0)
    tail.grid(alpha=0.3)
    tail.legend()
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)


def render(args: argparse.Namespace, argv: Sequence[str] | None, elapsed: float, facts: dict,
           intervals: Sequence[Interval], plot_path: Path | None, loadavg: tuple[str, str]) -> str:
    size = names_per_cycle(args.nodes)
    cycles = sum(i.cycles for i in intervals)
    outcomes: dict[str, int] = {}
    for interval in intervals:
        for outcome, count in interval.outcomes.items():
            outcomes[outcome] = outcomes.get(outcome, 0) + count
    first, second = halves(intervals)
    steady = first + second
    slope = slope_mb_per_minute(steady)
    rss = [i.rss_mb for i in steady]
    lines = run_header("Soak: steady load, arrivals, departures and new boards", "soak.py", argv, elapsed,
                       "; the extender and its in-process cluster in one process, this script in another")
    lines += [
        f"- Cluster: {facts['nodes']:,} nodes ({facts['boards']} real boards), {facts['gpus']:,} GPUs, "
        f"{facts['used_gpus']:,} taken at the start by {facts['fill_pods']:,} pods; after each bind a running pod "
        "ends and a pending one is created, so the load keeps the cluster in a steady state.",
        f"- Load: {args.rate:g} scheduling cycles/s (filter, prioritize, bind) for {args.seconds:g} s, {size} "
        f"candidate names per cycle (kube-scheduler's default percentageOfNodesToScore at {args.nodes:,} nodes), "
        f"{cycles:,} cycles in all: " + ", ".join(f"{count:,} {outcome}" for outcome, count in sorted(outcomes.items()))
        + f". A node with no pods got a board the extender had not seen every {args.replace_every:g} s: "
        f"{intervals[-1].boards_replaced if intervals else 0} in all.",
        f"- Load average before / after: {loadavg[0]} / {loadavg[1]} (other work on this 2-CPU machine shows there).",
        "",
        "### Figures",
        "",
        f"- RSS after the first minute: {min(rss):.1f} to {max(rss):.1f} MB; least-squares slope "
        f"**{slope:+.2f} MB/min**; over the first half of that time {slope_mb_per_minute(first):+.2f} MB/min, "
        f"over the second half **{slope_mb_per_minute(second):+.2f} MB/min** (a cache filling up flattens out, a "
        "leak does not).",
    ]
    for verb in VERBS:
        p99 = [i.server_p99_ms[verb] for i in steady]
        lines.append(f"- {verb}, server-side p99 per interval after the first minute: median "
                     f"{_median(p99):.3f} ms, range {min(p99):.3f} to {max(p99):.3f} ms; median of the first half "
                     f"{_median([i.server_p99_ms[verb] for i in first]):.3f} ms, of the second half "
                     f"{_median([i.server_p99_ms[verb] for i in second]):.3f} ms.")
    lines += ["", "### Targets", "", "| target | measured | verdict |", "|---|---:|---|",
              *(check.row() for check in checks(args, intervals))]
    if plot_path is not None:
        lines += ["", f"![soak: RSS and p99 per interval]({plot_path.as_posix()})"]
    lines += ["", "### Every interval", "",
              "| t (s) | RSS MB | cycles | filter p50 / p99 ms | prioritize p50 / p99 ms | bind p50 / p99 ms "
              "| HTTP p99 filter / prioritize / bind ms | boards replaced |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for i in intervals:
        verbs = " | ".join(f"{i.server_p50_ms[v]:.3f} / {i.server_p99_ms[v]:.3f}" for v in VERBS)
        http = " / ".join(f"{i.http_p99_ms[v]:.2f}" for v in VERBS)
        lines.append(f"| {i.at:.0f} | {i.rss_mb:.1f} | {i.cycles} | {verbs} | {http} | {i.boards_replaced} |")
    return "\n".join(lines)


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000, help="cluster nodes (default 1000)")
    parser.add_argument("--seconds", type=float, default=600.0, help="length of the load (default 600)")
    parser.add_argument("--rate", type=float, default=20.0, help="scheduling cycles per second (default 20)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds per recorded interval (default 10)")
    parser.add_argument("--replace-every", type=float, default=1.0,
                        help="seconds between board replacements (default 1; 0: none)")
    parser.add_argument("--fill", type=float, default=0.45, help="share of GPUs taken before the load (default 0.45)")
    parser.add_argument("--plot", type=Path, default=HERE / "plots" / "soak.png", help="where to draw the plot")
    parser.add_argument("--write", metavar="PATH", help="rewrite the soak section of this Markdown file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    loadavg_before = load_average()
    logs = Path(tempfile.mkdtemp(prefix="soak-"))
    server = Server([sys.executable, str(HERE / "large_cluster_server.py"), "--nodes", str(args.nodes),
                     "--fill", str(args.fill)], logs / "extender.log")
    try:
        server.wait_ready("/readyz")
        intervals = run_load(args, server)
    finally:
        server.stop()
    elapsed = time.perf_counter() - started
    plot_path: Path | None = args.plot
    try:
        plot(intervals, args.plot, f"{args.nodes:,} nodes, {args.rate:g} cycles/s", args.interval)
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[harness]'): no plot", file=sys.stderr)
        plot_path = None
    shown = None
    if plot_path is not None and args.write:
        shown = Path(plot_path).resolve().relative_to(Path(args.write).resolve().parent)
    body = render(args, argv, elapsed, server.facts, intervals, shown, (loadavg_before, load_average()))
    print(body)
    if any(log.stat().st_size for log in logs.iterdir()):
        print(f"\n(the extender wrote to {logs})")
    else:
        shutil.rmtree(logs)
    if args.write:
        write_section(Path(args.write), body, BEGIN, END)
    return verdict("soak", missed(checks(args, intervals)))


if __name__ == "__main__":
    raise SystemExit(main())
