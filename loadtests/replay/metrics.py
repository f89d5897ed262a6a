"""What a replay run yields per policy (issue 10, item 5; the FGD allocation-ratio curve is elsewhere).

- NVLink ring share: of the placed multi-GPU pods, those whose GPUs form a ring over NVLink hops alone.
- Bandwidth efficiency: a multi-GPU pod's ring bandwidth over the best ring that a pod of its size gets on an
  empty node of the same platform (median, p10, share at 100%). Against the node's own best, not the fleet's, so
  a pod on slower hardware is not counted as badly placed.
- Pending time (placement minus arrival) of placed pods, mean and p95 (nearest rank), and pods never placed.
- GPU utilization: GPU-seconds held within [0, last arrival] over all GPUs times that span. A member of a
  multi-node job holds its GPUs from its own placement until its group leaves (`job_starts`).
- Fragmentation at each snapshot, for 2, 4 and 8 GPUs: the share of free GPUs that are in no free set of that
  size with an NVLink ring on their node, over the nodes whose board has such a set when empty (a PCIe-only
  board is not fragmented, it never had one).
- Modelled job time: a multi-GPU pod's duration with its communication share scaled by best/granted bandwidth,
  duration * ((1 - share) + share * best / granted). The share is an assumption, settable, not a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from itertools import combinations

from loadtests.replay.boards import BoardKey, board, board_key
from loadtests.replay.engine import Outcome, Run, groups_of
from loadtests.replay.runtime import best_ring_gbps
from topology.collectives import COMM_SHARE, slowdown
from topology.compiled import bits
from topology.levels import Level
from topology.select import ring_gbps

FRAGMENTATION_SIZES = (2, 4, 8)
FULL = 1 - 1e-9
"""Efficiency that counts as 100% (granted and best are the same float computed two ways)."""


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    pods: int
    placed: int
    never_placed: int
    fractional: int
    """Pods that asked for a share of a GPU and were counted as 1 GPU."""
    multi_gpu: int
    nvlink_ring_share: float
    efficiency_median: float
    efficiency_p10: float
    efficiency_full_share: float
    pending_mean_s: float
    pending_p95_s: float
    gpu_utilization: float
    fragmentation_mean: dict[int, float]
    """Per request size, the mean over snapshots that had free GPUs."""
    modelled_slowdown: float
    """Multi-GPU pods' modelled job time summed, over their durations summed (1.0: every ring at its best)."""
    comm_share: float


@dataclass(frozen=True, slots=True)
class PodBandwidth:
    gpus: int
    granted_gbps: float
    best_gbps: float
    nvlink_ring: bool

    @property
    def efficiency(self) -> float:
        return self.granted_gbps / self.best_gbps


def pod_bandwidth(key_of: dict[str, BoardKey], outcome: Outcome) -> PodBandwidth | None:
    """Bandwidth facts of a placed multi-GPU pod; None for the others."""
    placement = outcome.placement
    if placement is None or len(placement.gpus) < 2:
        return None
    key = key_of[placement.node]
    compiled = board(key)
    granted = ring_gbps(compiled, placement.gpus) or 0.0
    mask = sum(1 << gpu for gpu in placement.gpus)
    return PodBandwidth(len(placement.gpus), granted, best_ring_gbps(key, len(placement.gpus)),
                        compiled.has_ring(Level.NVLINK, 0, mask))


@cache
def nvlink_servable(key: BoardKey, free: int, size: int) -> int:
    """The free GPUs that sit in some free set of `size` GPUs with an NVLink ring."""
    compiled = board(key)
    servable = 0
    for chosen in combinations(bits(free), size):
        mask = sum(1 << gpu for gpu in chosen)
        if mask & ~servable and compiled.has_ring(Level.NVLINK, 0, mask):
            servable |= mask
    return servable


def fragmentation(run: Run, size: int) -> list[tuple[float, float | None]]:
    """(time, share of free GPUs that cannot serve a `size`-GPU NVLink request), None where nothing is free."""
    keys = [board_key(node) for node in run.nodes]
    able = [nvlink_servable(key, board(key).full_mask, size) != 0 for key in keys]
    series: list[tuple[float, float | None]] = []
    for snapshot in run.snapshots:
        free = stranded = 0
        for key, mask, counted in zip(keys, snapshot.free, able):
            if not counted:
                continue
            count = mask.bit_count()
            free += count
            stranded += count - nvlink_servable(key, mask, size).bit_count() if count >= size else count
        series.append((snapshot.time_s, stranded / free if free else None))
    return series


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def job_starts(outcomes: Sequence[Outcome]) -> list[float | None]:
    """When each pod's job began to run: a pod's own placement, a member's group's last placement; None for a
    job not started (a pod never placed, a group with a member never placed)."""
    last: dict[str, float | None] = {}
    for outcome in outcomes:
        group = outcome.job.group
        if group is not None:
            seen = last.get(group, -math.inf)
            last[group] = None if seen is None or outcome.placed_s is None else max(seen, outcome.placed_s)
    return [outcome.placed_s if outcome.job.group is None else last[outcome.job.group] for outcome in outcomes]


def job_firsts(outcomes: Sequence[Outcome]) -> list[int]:
    """Each job's first pod, by index: a pod on its own, a group's first member."""
    members = groups_of([outcome.job for outcome in outcomes])
    return [index for index, outcome in enumerate(outcomes)
            if outcome.job.group is None or members[outcome.job.group][0] == index]


def run_seconds(outcome: Outcome) -> float:
    """How long the pod's job ran once started: the engine's run-time model's figure, else its duration."""
    return outcome.job.duration_s if outcome.run_s is None else outcome.run_s


def summarize(run: Run, comm_share: float = COMM_SHARE) -> Summary:
    if not 0 <= comm_share <= 1:
        raise ValueError(f"the communication share must be within 0..1, not {comm_share}")
    outcomes = run.outcomes
    key_of = {node.name: board_key(node) for node in run.nodes}
    placed = [o for o in outcomes if o.placement is not None]
    multi = [(o, pod) for o in placed if (pod := pod_bandwidth(key_of, o)) is not None]
    bandwidth = [pod for _, pod in multi]
    efficiencies = [pod.efficiency for pod in bandwidth]
    pending = [o.placed_s - o.job.submit_s for o in placed if o.placed_s is not None]
    horizon = max((o.job.submit_s for o in outcomes), default=0.0)
    total_gpus = sum(board(key).size for key in key_of.values())
    held = 0.0
    for outcome, start in zip(outcomes, job_starts(outcomes)):
        if outcome.placement is not None and outcome.placed_s is not None and outcome.placed_s < horizon:
            end = math.inf if start is None else start + run_seconds(outcome)
            held += len(outcome.placement.gpus) * max(0.0, min(end, horizon) - outcome.placed_s)
    finite = [(o, pod) for o, pod in multi if math.isfinite(o.job.duration_s)]
    durations = sum(o.job.duration_s for o, _ in finite)
    modelled = sum(o.job.duration_s * slowdown(comm_share, pod.best_gbps, pod.granted_gbps) for o, pod in finite)
    fragmentation_mean = {}
    for size in FRAGMENTATION_SIZES:
        shares = [share for _, share in fragmentation(run, size) if share is not None]
        fragmentation_mean[size] = sum(shares) / len(shares) if shares else math.nan
    return Summary(
        policy=run.policy, pods=len(outcomes), placed=len(placed), never_placed=len(outcomes) - len(placed),
        fractional=sum(o.job.fractional for o in outcomes), multi_gpu=len(bandwidth),
        nvlink_ring_share=_share([pod.nvlink_ring for pod in bandwidth]),
        efficiency_median=percentile(efficiencies, 0.5), efficiency_p10=percentile(efficiencies, 0.1),
        efficiency_full_share=_share([value >= FULL for value in efficiencies]),
        pending_mean_s=sum(pending) / len(pending) if pending else math.nan,
        pending_p95_s=percentile(pending, 0.95),
        gpu_utilization=held / (total_gpus * horizon) if total_gpus and horizon else math.nan,
        fragmentation_mean=fragmentation_mean,
        modelled_slowdown=modelled / durations if durations else math.nan, comm_share=comm_share)


def _share(flags: Sequence[bool]) -> float:
    return sum(flags) / len(flags) if flags else math.nan
