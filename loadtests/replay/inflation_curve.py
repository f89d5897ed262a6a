"""FGD's allocation-ratio curve for workload (c), inflation (Weng et al., USENIX ATC '23, "Beware of
Fragmentation", its evaluation on the openb default trace): GPUs allocated over capacity against the workload
arrived so far (GPUs requested over capacity), sampled at each arrival, and FGD's published points for that
trace (data/fgd_published.csv) to set it against.

Inflation pods never leave, so a pod the engine could not place at its arrival is placed, if ever, at a later
arrival's instant (a declined pod's retry follows a placement): a point counts the pods placed by its instant.
FGD counts a fractional pod by its share of a GPU; this replay counts it as one whole GPU on both axes, so
the two curves compare in shape, not point for point.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from loadtests.replay.clusters import pool_capacity
from loadtests.replay.engine import Run

FGD_PUBLISHED = Path(__file__).parent / "data" / "fgd_published.csv"
FGD_COLUMNS = ("policy", "arrived_pct", "alloc_pct_median", "alloc_pct_min", "alloc_pct_max", "seeds")
FGD_MAX_ROWS = 10_000
COMPARABILITY = ("FGD counts a fractional-GPU pod by its share and schedules CPU and memory too; this replay counts "
                 "each fractional pod as one whole GPU and schedules GPUs only, so the curves compare in shape, "
                 "not point for point.")


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """After one arrival: requested and allocated GPUs, each over the cluster's GPU capacity."""

    arrived: float
    allocated: float


@dataclass(frozen=True, slots=True)
class PublishedPoint:
    """FGD's allocation ratio (in %) of one policy at one arrived workload (in %), over its seeds."""

    policy: str
    arrived_pct: int
    median_pct: float
    min_pct: float
    max_pct: float
    seeds: int


def allocation_curve(run: Run) -> tuple[CurvePoint, ...]:
    """One point per arrival, in workload order; a pod placed after the last arrival is in no point."""
    if any(math.isfinite(outcome.job.duration_s) for outcome in run.outcomes):
        raise ValueError("the allocation curve is for an inflation run: its pods never leave")
    capacity = sum(pool_capacity(run.nodes).values())
    placed_at = sorted((outcome.placed_s, outcome.job.gpus) for outcome in run.outcomes
                       if outcome.placed_s is not None)
    points: list[CurvePoint] = []
    requested = allocated = taken = 0
    for outcome in run.outcomes:
        now = outcome.job.submit_s
        requested += outcome.job.gpus
        while taken < len(placed_at) and placed_at[taken][0] <= now:
            allocated += placed_at[taken][1]
            taken += 1
        points.append(CurvePoint(requested / capacity, allocated / capacity))
    return tuple(points)


def discrete(curve: Sequence[CurvePoint], percents: Sequence[int]) -> dict[int, float | None]:
    """The allocation ratio (in %) at each arrived percent, as FGD's merge_alloc_discrete.py takes it: the mean
    over the points whose arrived share rounds to that percent, else over those within one percent of it;
    None where no point is that close."""
    values: dict[int, float | None] = {}
    for percent in percents:
        near = [point.allocated for point in curve if round(point.arrived * 100) == percent] or [
            point.allocated for point in curve if abs(round(point.arrived * 100) - percent) <= 1]
        values[percent] = 100 * sum(near) / len(near) if near else None
    return values


def read_published(path: Path = FGD_PUBLISHED) -> tuple[PublishedPoint, ...]:
    """The shipped FGD figures (data/PROVENANCE.md), checked row by row."""
    with open(path, newline="", encoding="utf-8") as handle:
        rows = list(csv.reader(handle))
    if not rows or tuple(rows[0]) != FGD_COLUMNS:
        raise ValueError(f"{path}: the header must be {','.join(FGD_COLUMNS)}")
    if len(rows) - 1 > FGD_MAX_ROWS:
        raise ValueError(f"{path}: more than {FGD_MAX_ROWS} rows")
    points = []
    for line, row in enumerate(rows[1:], 2):
        try:
            policy, arrived, median, low, high, seeds = row
            point = PublishedPoint(policy, int(arrived), float(median), float(low), float(high), int(seeds))
        except ValueError:
            raise ValueError(f"{path}:{line}: expected {len(FGD_COLUMNS)} fields, text then numbers") from None
        if (not policy or not 0 <= point.arrived_pct <= 500 or point.seeds < 1
                or not 0 <= point.min_pct <= point.median_pct <= point.max_pct <= 100):
            raise ValueError(f"{path}:{line}: out of range")
        points.append(point)
    return tuple(points)


def published_by_policy(points: Sequence[PublishedPoint]) -> Mapping[str, tuple[PublishedPoint, ...]]:
    """The points of each policy in file order, policies in their first appearance's order."""
    grouped: dict[str, list[PublishedPoint]] = {}
    for point in points:
        grouped.setdefault(point.policy, []).append(point)
    return {policy: tuple(group) for policy, group in grouped.items()}
