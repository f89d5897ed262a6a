"""The policies side by side as Markdown tables, one row per policy: the per-pod figures, and for multi-node
jobs the per-job ones."""

from __future__ import annotations

import math
from collections.abc import Sequence

from loadtests.replay.group_metrics import POD_CLASSES, GroupSummary, class_name
from loadtests.replay.metrics import FRAGMENTATION_SIZES, Summary

HEADER = ("policy", "placed", "never placed", "multi-GPU on NVLink ring", "efficiency median / p10",
          "at 100%", "pending mean / p95 s", "GPU util.",
          "fragmentation " + "/".join(map(str, FRAGMENTATION_SIZES)), "modelled job time")


def markdown_table(summaries: Sequence[Summary]) -> str:
    rows = [HEADER, tuple("---" for _ in HEADER)]
    for s in summaries:
        rows.append((s.policy, f"{s.placed:,}", f"{s.never_placed:,}", percent(s.nvlink_ring_share),
                     f"{percent(s.efficiency_median)} / {percent(s.efficiency_p10)}", percent(s.efficiency_full_share),
                     f"{_num(s.pending_mean_s)} / {_num(s.pending_p95_s)}", percent(s.gpu_utilization),
                     " / ".join(percent(s.fragmentation_mean[size]) for size in FRAGMENTATION_SIZES),
                     f"x{s.modelled_slowdown:.3f}" if not math.isnan(s.modelled_slowdown) else "-"))
    note = ""
    if summaries and summaries[0].fractional:
        note = f"\n\n{summaries[0].fractional:,} pods asked for a share of one GPU and were counted as 1 whole GPU."
    share = summaries[0].comm_share if summaries else 0.0
    return "\n".join("| " + " | ".join(row) + " |" for row in rows) + note + (
        f"\n\nModelled job time: multi-GPU pods' durations with a communication share of {share:.0%} scaled by "
        "best/granted ring bandwidth, summed, over their durations summed.")


def group_table(summaries: Sequence[tuple[Summary, GroupSummary]]) -> str:
    """Per policy: groups started, the share in one NVLink domain and in one leaf (of those that fit one), GPU
    utilization held and running, p95 pending by pods per job, and the groups' modelled job time."""
    classes = [name for name in (class_name(*bounds) for bounds in POD_CLASSES)
               if any(name in groups.pending_p95_s_by_pods for _, groups in summaries)]
    header = ("policy", "groups started", "groups in one NVLink domain", "groups in one leaf",
              "GPU util. held / running", f"p95 pending s by pods per job ({' / '.join(classes)})",
              "modelled group job time")
    rows = [header, tuple("---" for _ in header)]
    for pods, groups in summaries:
        rows.append((groups.policy, f"{groups.groups_started:,} of {groups.groups:,}",
                     f"{percent(groups.groups_in_one_domain_share)} of {groups.groups_fitting_one_domain:,}",
                     f"{percent(groups.groups_in_one_leaf_share)} of {groups.groups_fitting_one_leaf:,}",
                     f"{percent(pods.gpu_utilization)} / {percent(groups.gpu_utilization_running)}",
                     " / ".join(_num(groups.pending_p95_s_by_pods.get(name, math.nan)) for name in classes),
                     "-" if math.isnan(groups.modelled_group_job_time) else f"x{groups.modelled_group_job_time:.3f}"))
    share = summaries[0][1].comm_share if summaries else 0.0
    return "\n".join("| " + " | ".join(row) + " |" for row in rows) + (
        "\n\nA group is in one NVLink domain (or leaf) when all its members are; the share counts the started "
        "groups one empty domain (leaf) of their pool could hold. GPU utilization held counts a member from its "
        "own placement, running a job from its start (a group's last placement). Modelled group job time: "
        f"durations with a communication share of {share:.0%} scaled by the all-reduce bandwidth of the "
        "narrowest span each group could have had over the span it got (`topology/collectives.py` ALLREDUCE), "
        "summed, over their durations summed.")


def percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"
