"""PNG plots of replay runs, one line per policy: the CDFs of bandwidth efficiency and pending time,
fragmentation over time, and FGD's allocation-ratio curve of an inflation run.
matplotlib is the harness extra; nothing else in the replay imports it."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend is chosen first: no display on a benchmark host)

from loadtests.replay.boards import board_key  # noqa: E402
from loadtests.replay.engine import Run  # noqa: E402
from loadtests.replay.inflation_curve import (COMPARABILITY, CurvePoint, PublishedPoint,  # noqa: E402
                                              published_by_policy)
from loadtests.replay.metrics import fragmentation, pod_bandwidth  # noqa: E402


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
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
        if name == "pending":
            axis.set_xscale("symlog", linthresh=1.0)
        figure.tight_layout()
        path = directory / f"{prefix}-{name}.png"
        figure.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(figure)
        paths.append(path)
    return paths


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

