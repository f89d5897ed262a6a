"""PNG plots of replay runs, one line per policy: the CDFs of bandwidth efficiency and pending time,
fragmentation over time, FGD's allocation-ratio curve of an inflation run, and for multi-node jobs the CDF of
their pending time and the span their members landed in.
matplotlib is the harness extra; nothing else in the replay imports it."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first: no display on a benchmark host)

from loadtests.replay.boards import board_key  # noqa: E402
from loadtests.replay.engine import Run, groups_of  # noqa: E402
from loadtests.replay.inflation_curve import (COMPARABILITY, CurvePoint, PublishedPoint,  # noqa: E402
                                              published_by_policy)
from loadtests.replay.metrics import fragmentation, job_starts, pod_bandwidth  # noqa: E402
from loadtests.replay.spans import SPAN_NAMES, Span, Spans  # noqa: E402


def _cdf(axis: plt.Axes, values: Sequence[float], label: str) -> None:
    ordered = sorted(values)
    if ordered:
        axis.step(ordered, [(at + 1) / len(ordered) for at in range(len(ordered))], where="post", label=label)


def write_plots(runs: Sequence[Run], directory: Path, prefix: str, fragmentation_size: int = 4) -> list[Path]:
    """Write `<prefix>-efficiency.png`, `-pending.png` and `-fragmentation.png`; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    figures = {name: plt.subplots(figsize=(7, 4.2)) for name in ("efficiency", "pending", "fragmentation")}
    for run in runs:
        key_of = {node.name: board_key(node) for node in run.nodes}
        _cdf(figures["efficiency"][1], [pod.efficiency for o in run.outcomes
                                        if (pod := pod_bandwidth(key_of, o)) is not None], run.policy)
        _cdf(figures["pending"][1], [o.placed_s - o.job.submit_s for o in run.outcomes if o.placed_s is not None],
             run.policy)
        series = [(time, share) for time, share in fragmentation(run, fragmentation_size) if share is not None]
        figures["fragmentation"][1].plot([t for t, _ in series], [share for _, share in series], label=run.policy)
    labels = {"efficiency": ("ring bandwidth / best ring for the pod's size on its board", "share of multi-GPU pods"),
              "pending": ("pending time (s)", "share of placed pods"),
              "fragmentation": ("time (s)", f"free GPUs unable to serve a {fragmentation_size}-GPU NVLink request")}
    paths = []
    for name, (figure, axis) in figures.items():
        axis.set_xlabel(labels[name][0])
        axis.set_ylabel(labels[name][1])
        if name == "pending":
            axis.set_xscale("symlog", linthresh=1.0)
        paths.append(_save(figure, axis, directory / f"{prefix}-{name}.png"))
    return paths


def _save(figure: plt.Figure, axis: plt.Axes, path: Path) -> Path:
    """A grid, the policies' legend, and the PNG written without a timestamp-bearing Software tag."""
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)
    return path


def write_inflation_plot(curves: Mapping[str, Sequence[CurvePoint]], published: Sequence[PublishedPoint],
                         directory: Path, prefix: str) -> Path:
    """Write `<prefix>-inflation.png`: allocated against arrived GPUs (in % of capacity), one line per policy,
    FGD's published medians as markers, and y = x, the ideal every policy follows until the cluster is full."""
    directory.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(7, 4.6))
    for policy, curve in curves.items():
        axis.plot([100 * point.arrived for point in curve], [100 * point.allocated for point in curve], label=policy)
    for (policy, points), marker in zip(published_by_policy(published).items(), "os^vDP*X"):
        axis.plot([point.arrived_pct for point in points], [point.median_pct for point in points], marker,
                  markersize=4, linestyle="none", label=f"FGD paper: {policy}")
    axis.plot([0, 100], [0, 100], linestyle=":", color="grey", label="ideal (y = x)")
    axis.set_xlabel("arrived workload: GPUs requested, % of capacity")
    axis.set_ylabel("GPUs allocated, % of capacity")
    axis.set_title(textwrap.fill(COMPARABILITY, 95), fontsize=7)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7, ncol=2, loc="lower right")
    figure.tight_layout()
    path = directory / f"{prefix}-inflation.png"
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)
    return path



def write_group_plots(runs: Sequence[Run], directory: Path, prefix: str) -> list[Path]:
    """Write `<prefix>-group-pending.png` (the CDF of multi-node jobs' pending time, arrival to last placement)
    and `<prefix>-group-spans.png` (per policy, the share of started groups whose members landed within each
    span); returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    pending_figure, pending_axis = plt.subplots(figsize=(7, 4.2))
    spans_figure, spans_axis = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(len(runs), 1)
    for at, run in enumerate(runs):
        starts, spans = job_starts(run.outcomes), Spans(run.nodes)
        landed: list[Span] = []
        waits: list[float] = []
        for indices in groups_of([outcome.job for outcome in run.outcomes]).values():
            start = starts[indices[0]]
            if start is not None:
                waits.append(start - run.outcomes[indices[0]].job.submit_s)
                landed.append(spans.span_of(run.outcomes[index].placement.node for index in indices))
        _cdf(pending_axis, waits, run.policy)
        shares = [sum(span is kind for span in landed) / len(landed) if landed else 0.0 for kind in Span]
        spans_axis.bar([kind + at * width for kind in Span], shares, width, label=run.policy)
    pending_axis.set_xscale("symlog", linthresh=1.0)
    pending_axis.set_xlabel("pending time of a multi-node job, arrival to its last member's placement (s)")
    pending_axis.set_ylabel("share of started multi-node jobs")
    spans_axis.set_xticks([kind + 0.4 - width / 2 for kind in Span], [f"one {SPAN_NAMES[kind]}" for kind in Span])
    spans_axis.set_ylabel("share of started multi-node jobs")
    spans_axis.set_xlabel("the narrowest block holding all of a job's members")
    return [_save(pending_figure, pending_axis, directory / f"{prefix}-group-pending.png"),
            _save(spans_figure, spans_axis, directory / f"{prefix}-group-spans.png")]
