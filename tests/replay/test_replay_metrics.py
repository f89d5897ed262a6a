"""Replay metrics on runs of real platforms whose placements are known: ring share, efficiency, pending time,
utilization, fragmentation and modelled job time."""

from __future__ import annotations

import math

import pytest

from loadtests.replay.engine import replay
from loadtests.replay.kube_scores import DEFAULT
from loadtests.replay.metrics import fragmentation, nvlink_servable, percentile, summarize
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.policies import StockPolicy

INF = float("inf")
A6000 = ClusterNode("a6000-a", "rtx-a6000-pairs", "A6000")
H100 = ClusterNode("h100-a", "dgx-h100", "H100")
DGX1 = ClusterNode("dgx1-a", "dgx1-v100", "V100")
QUANTITY = StockPolicy("quantity", DEFAULT)


def test_the_stock_plugin_breaking_an_a6000_bridge_pair_shows_in_ring_share_efficiency_and_job_time() -> None:
    # GPU 2 stays busy; the 1-GPU pod x takes GPU 0, so the third 2-GPU pod gets GPUs 1 and 3 over PCIe (NODE).
    jobs = [Job("s0", 0, 10, 1), Job("s1", 1, 9, 1), Job("s2", 2, INF, 1), Job("s3", 3, 7, 1),
            Job("x", 11, INF, 1), Job("y1", 12, 100, 2), Job("y2", 13, 100, 2), Job("y3", 14, 100, 2)]
    run = replay([A6000], jobs, QUANTITY, 1)
    assert run.outcomes[-1].placement.gpus == (1, 3)
    summary = summarize(run, comm_share=0.3)
    assert summary.multi_gpu == 3 and summary.nvlink_ring_share == pytest.approx(2 / 3)
    assert summary.efficiency_full_share == pytest.approx(2 / 3)
    assert summary.efficiency_p10 == pytest.approx(15.75 / 56)  # Gen4 x16 at NODE 0.5 against 4 bridges of 14
    assert summary.efficiency_median == 1.0
    assert summary.modelled_slowdown == pytest.approx((1 + 1 + 0.7 + 0.3 * 56 / 15.75) / 3)


def test_every_dgx1_pair_of_go_gpuallocator_is_a_best_nvlink_pair() -> None:
    summary = summarize(replay([DGX1], [Job(f"p{i}", i, 50, 2) for i in range(4)], QUANTITY, 1))
    assert (summary.nvlink_ring_share, summary.efficiency_full_share, summary.modelled_slowdown) == (1.0, 1.0, 1.0)


def test_pending_time_and_never_placed() -> None:
    jobs = [Job("big", 0, 10, 8), Job("b", 1, 5, 4), Job("c", 2, 5, 4), Job("d", 3, 5, 8), Job("huge", 4, 5, 16)]
    summary = summarize(replay([H100], jobs, QUANTITY, 1))
    assert (summary.placed, summary.never_placed) == (4, 1)
    assert summary.pending_mean_s == pytest.approx((0 + 9 + 8 + 12) / 4)
    assert summary.pending_p95_s == 12


def test_utilization_counts_gpu_seconds_up_to_the_last_arrival() -> None:
    summary = summarize(replay([H100], [Job("a", 0, 50, 8), Job("b", 100, 10, 1)], QUANTITY, 1))
    assert summary.gpu_utilization == pytest.approx(0.5)


def test_fragmentation_counts_free_gpus_outside_every_free_nvlink_set() -> None:
    free = 0b11111010  # GPUs 0 and 2 busy: bridge pairs (4,5) and (6,7) whole, GPUs 1 and 3 stranded
    assert nvlink_servable(("rtx-a6000-pairs", tuple(range(8))), free, 2) == 0b11110000
    assert nvlink_servable(("rtx-a6000-pairs", tuple(range(8))), free, 4) == 0  # bridges join pairs only
    assert nvlink_servable(("dgx1-v100", tuple(range(8))), 0xFF, 8) == 0xFF
    assert nvlink_servable(("pcie-l40s", tuple(range(8))), 0xFF, 2) == 0
    run = replay([A6000], [Job("a", 0, INF, 1), Job("b", 1, INF, 1), Job("c", 2, INF, 1)], QUANTITY, 1, samples=2)
    # The stock plugin takes GPUs 0, 1, 2: GPU 3 is stranded among five free.
    assert fragmentation(run, 2)[-1] == (2, pytest.approx(1 / 5))
    assert fragmentation(run, 8)[-1] == (2, None)  # bridge pairs never make an 8-GPU NVLink ring: not counted
    dgx1 = replay([DGX1, A6000], [Job("one", 0, INF, 1, "V100")], QUANTITY, 1, samples=1)
    assert fragmentation(dgx1, 8)[-1] == (0, 1.0)  # seven free V100s, no 8-GPU ring left; the A6000 is left out


def test_percentile_is_nearest_rank_and_the_share_is_checked() -> None:
    assert percentile([5, 1, 3, 2, 4], 0.5) == 3 and percentile([1, 2], 0.95) == 2 and math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError, match="share"):
        summarize(replay([H100], [Job("a", 0, 1, 1)], QUANTITY, 1), comm_share=1.5)
