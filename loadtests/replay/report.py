"""The policies side by side as a Markdown table, one row per policy."""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def percent(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.1%}"


def _num(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"
