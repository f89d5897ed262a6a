"""Run time by placement (issue 29): a job runs duration x ((1 - c) + c x best / got), in the engine, and the figures
a job's owner sees (job_metrics), on real platforms and the NVL72 fleet."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from loadtests.replay.__main__ import main, mean_interval
from loadtests.replay.clusters import nvl72_fleet
from loadtests.replay.engine import Fleet, Outcome, Placement, Run, replay
from loadtests.replay.job_metrics import summarize_jobs
from loadtests.replay.kube_scores import DEFAULT
from loadtests.replay.metrics import summarize
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.policies import StockPolicy
from loadtests.replay.runtime import RunTime, best_ring_gbps
from topology.collectives import ALLREDUCE, slowdown
from topology.compiled import compile_topology
from topology.fabric import CLIQUE_LABEL
from topology.platforms import PLATFORMS
from topology.select import ring_gbps

A6000 = ClusterNode("a6000-a", "rtx-a6000-pairs", "A6000")
H100 = ClusterNode("h100-a", "dgx-h100", "H100")
FLEET = nvl72_fleet()
RACKS = [[node for node in FLEET if dict(node.labels).get(CLIQUE_LABEL) == clique]
         for clique in sorted({dict(node.labels)[CLIQUE_LABEL] for node in FLEET if CLIQUE_LABEL in dict(node.labels)})]


def _a6000_rings() -> tuple[float, float]:
    """An NVLink pair's ring and a pair across bridges on the RTX A6000 board."""
    board = compile_topology(PLATFORMS["rtx-a6000-pairs"].topology())
    rings = sorted({ring_gbps(board, (a, b)) or 0.0 for a in range(8) for b in range(a + 1, 8)})
    return rings[-1], rings[0]


def test_slowdown_is_the_communication_share_stretched_by_the_bandwidth_lost() -> None:
    assert slowdown(0.3, 811.0, 811.0) == pytest.approx(1.0)
    assert slowdown(0.3, 811.0, 85.0) == pytest.approx(0.7 + 0.3 * 811 / 85)
    assert slowdown(0.0, 811.0, 85.0) == 1.0
    assert slowdown(0.3, 100.0, 0.0) == math.inf


def test_a_pod_on_a_slow_pair_runs_longer_and_one_on_the_best_pair_its_duration() -> None:
    model = RunTime([A6000], 0.3)
    pair, apart = _a6000_rings()
    job = Job("p", 0, 1000, 2, "A6000")
    board = compile_topology(PLATFORMS["rtx-a6000-pairs"].topology())
    rings = {(a, b): ring_gbps(board, (a, b)) for a in range(8) for b in range(a + 1, 8)}
    best_pair = next(gpus for gpus, gbps in rings.items() if gbps == pair)
    worst_pair = next(gpus for gpus, gbps in rings.items() if gbps == apart)
    assert pair > apart and best_ring_gbps(("rtx-a6000-pairs", tuple(range(8))), 2) == pair
    assert model.seconds(job, [Placement("a6000-a", best_pair)]) == pytest.approx(1000)
    assert model.seconds(job, [Placement("a6000-a", worst_pair)]) == pytest.approx(1000 * (0.7 + 0.3 * pair / apart))
    assert model.seconds(Job("one", 0, 1000, 1, "A6000"), [Placement("a6000-a", (3,))]) == 1000
    assert RunTime([A6000], 0.0).seconds(job, [Placement("a6000-a", worst_pair)]) == 1000


def test_a_group_across_racks_runs_at_infiniband_speed_and_one_inside_a_rack_at_nvlink_speed() -> None:
    model = RunTime(FLEET, 0.3)
    gang = Job("g", 0, 1000, 4, "GB200", group="g", pods=2)
    inside = [Placement(node.name, (0, 1, 2, 3)) for node in RACKS[0][:2]]
    across = [Placement(RACKS[0][0].name, (0, 1, 2, 3)), Placement(RACKS[1][0].name, (0, 1, 2, 3))]
    gb200 = ALLREDUCE["gb200-node"]
    assert model.bandwidths(gang, inside) == (gb200.domain_gbps, gb200.domain_gbps)
    assert model.seconds(gang, inside) == pytest.approx(1000)
    assert model.seconds(gang, across) > 1000 * (0.7 + 0.3 * gb200.domain_gbps / gb200.leaf_gbps) - 1e-6


def test_a_group_in_intact_segments_pays_only_its_between_segment_traffic() -> None:
    fleet = nvl72_fleet(racks=2, racks_per_leaf=2, hgx_leaves=0)  # two racks on one leaf
    racks = [[node for node in fleet if dict(node.labels)[CLIQUE_LABEL] == clique]
             for clique in sorted({dict(node.labels)[CLIQUE_LABEL] for node in fleet})]
    model = RunTime(fleet, 0.3)
    gang = Job("g", 0, 1000, 4, "GB200", group="g", pods=8)
    whole = ALLREDUCE["gb200-node"]

    def got(per_rack: list[int]) -> float:
        placed = [Placement(node.name, (0, 1, 2, 3)) for rack, count in zip(racks, per_rack) for node in rack[:count]]
        found = model.bandwidths(gang, placed)
        assert found is not None and found[0] == whole.domain_gbps
        return found[1]

    assert got([8]) == whole.domain_gbps
    assert got([4, 4]) == pytest.approx(1 / (1 / 811 + (1 / 85 - 1 / 811) / 4))  # 259 GB/s
    assert got([6, 2]) == pytest.approx(1 / (1 / 811 + (1 / 85 - 1 / 811) / 2))  # equal segments of 2 at most
    assert got([5, 3]) == whole.leaf_gbps  # no equal segments: a flat ring over the network
    assert got([7, 1]) == whole.leaf_gbps
    assert whole.leaf_gbps < got([6, 2]) < got([4, 4]) < whole.domain_gbps


def test_the_engine_runs_each_job_for_its_run_time_and_a_group_for_one() -> None:
    def doubled(job: Job, placements: list[Placement]) -> float:
        return 2 * job.duration_s * len(placements)

    jobs = [Job("a", 0, 10, 8), Job("b", 1, 5, 8)]
    run = replay([H100], jobs, StockPolicy("quantity", DEFAULT), 1, run_seconds=doubled)
    got = {outcome.job.name: outcome for outcome in run.outcomes}
    assert got["a"].run_s == 20 and got["b"].placed_s == 20 and got["b"].run_s == 10  # b waited out a's 20 s
    gang = [Job(f"m{i}", 0, 10, 4, group="g", pods=2) for i in range(2)]
    members = replay([H100], gang, StockPolicy("quantity", DEFAULT), 1, run_seconds=doubled).outcomes
    assert [outcome.run_s for outcome in members] == [40, 40]  # the group's placements, once


class LowestFree:
    """The first node by name with room, its lowest free GPUs: after a 1-GPU pod, a pair straddles two bridges."""

    name = "lowest free"

    def place(self, job: Job, fleet: Fleet, rng: random.Random, now: float) -> Placement | None:
        for node in sorted(fleet.free):
            free = [gpu for gpu in range(fleet.size[node]) if fleet.free[node] >> gpu & 1]
            if len(free) >= job.gpus:
                return Placement(node, tuple(free[:job.gpus]))
        return None

    def release(self, job: Job, placement: Placement) -> None:
        """The fleet is the only state."""


def test_no_communication_share_replays_every_figure_as_before() -> None:
    jobs = [Job(f"j{i}", 13 * i, 200 + 31 * i % 400, (1, 2, 4, 2)[i % 4], "A6000") for i in range(40)]
    nodes = [A6000, ClusterNode("a6000-b", "rtx-a6000-pairs", "A6000")]
    for policy in (StockPolicy("q", DEFAULT), LowestFree()):
        plain = replay(nodes, jobs, policy, 3)
        modelled = replay(nodes, jobs, policy, 3, run_seconds=RunTime(nodes, 0).seconds)
        assert [(o.placed_s, o.placement) for o in modelled.outcomes] == [
            (o.placed_s, o.placement) for o in plain.outcomes]
        assert repr(summarize(modelled)) == repr(summarize(plain))  # NaN figures compare by their text
    model = RunTime(nodes, 0.5)
    slowed = replay(nodes, jobs, LowestFree(), 3, run_seconds=model.seconds)
    straddling = [o for o in slowed.outcomes
                  if (found := model.bandwidths(o.job, [o.placement])) and found[1] < found[0]]
    assert straddling and all(o.run_s > o.job.duration_s for o in straddling)
    assert summarize_jobs(slowed).jct_mean_s > summarize_jobs(replay(nodes, jobs, LowestFree(), 3)).jct_mean_s


def test_job_figures_from_a_hand_made_run() -> None:
    """Two pods of 8 on one DGX H100 (8 GPUs): the first runs 100 s at half its best speed (its duration is 50 s),
    the second waits for it and runs its 10 s; a third never starts."""
    jobs = [Job("a", 0, 50, 8), Job("b", 10, 10, 8), Job("c", 20, 10, 16)]
    outcomes = (Outcome(jobs[0], 0, Placement("h100-a", tuple(range(8))), 100.0),
                Outcome(jobs[1], 100, Placement("h100-a", tuple(range(8))), 10.0),
                Outcome(jobs[2], None, None))
    figures = summarize_jobs(Run("hand", 1, (H100,), outcomes, ()))
    assert figures.jct_mean_s == pytest.approx((100 + 100) / 2)  # a: 0 to 100; b: 10 to 110
    assert figures.bounded_slowdown_mean == pytest.approx((100 / 50 + 100 / 10) / 2)
    assert figures.wait_max_s_by_pods == {"1": 90} and figures.wait_p50_s_by_pods == {"1": 0}
    assert figures.still_waiting == 1
    assert figures.goodput_utilization == pytest.approx(8 * 20 * 0.5 / (8 * 20))  # the horizon is c's arrival, 20 s
    assert math.isnan(figures.free_domains_mean)  # one board is no shared NVLink domain


def test_free_domains_count_whole_racks_over_the_snapshots() -> None:
    rack = [node for node in FLEET if node in RACKS[0]]
    jobs = [Job("one", 0, 100, 4, "GB200"), Job("late", 200, 10, 1, "H100")]
    run = replay(FLEET, jobs, StockPolicy("quantity", DEFAULT), 1, samples=4)
    whole = summarize_jobs(run).free_domains_mean
    assert len(rack) == 18 and len(RACKS) == 4
    assert whole == pytest.approx((3 + 3 + 4 + 4 + 4) / 5)  # samples at 0, 50, 100, 150, 200 s


def test_the_json_names_the_default_policy_and_every_job_figure(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "multi.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,num_pods,gpu_model\n" + "".join(
        f"{90 * i},{900 + 61 * i % 1800},4,{(1, 2, 6, 12)[i % 4]},GB200\n" for i in range(24)), encoding="utf-8")
    assert main(["--cluster", "nvl72", "--workload", str(path), "--json", "--comm-share", "0.3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["default_policy"] == "(4) ours, groups preferred" and result["default_policy"] in result["policies"]
    for metrics in result["policies"].values():
        for key in ("groups_in_one_domain_share", "segments_intact_share", "gpu_utilization", "goodput_utilization",
                    "jct_mean_s", "jct_p95_s", "bounded_slowdown_mean", "wait_p50_s_by_pods", "wait_p95_s_by_pods",
                    "wait_max_s_by_pods", "still_waiting", "free_domains_mean"):
            assert key in metrics, key
        assert 0 < metrics["goodput_utilization"] <= metrics["gpu_utilization"] + 1e-9
        assert set(metrics["wait_p95_s_by_pods"]) == {"1", "2-4", "5-8", "9-18"}
    scattered, whole = result["policies"]["(1) quantity only"], result["policies"]["(4) ours, groups required"]
    assert scattered["groups_in_one_domain_share"] < whole["groups_in_one_domain_share"] == 1.0
    assert scattered["bounded_slowdown_mean"] > 1


def test_seeds_report_means_and_intervals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,gpu_model\n" + "".join(
        f"{7 * i},{120 + 17 * i % 300},{(1, 2, 4)[i % 3]},A6000\n" for i in range(30)), encoding="utf-8")
    args = ["--cluster", "mixed", "--nodes-per-pool", "1", "--workload", str(path), "--json"]
    assert main([*args, "--seeds", "3"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["seeds"] == [1, 2, 3] and set(result["ci95"]) == set(result["policies"])
    assert "wait_p95_s_by_pods.1" in result["policies"]["(4) ours, with delivery"]
    assert main([*args, "--seeds", "2"]) == 0 and main([*args, "--seeds", "0"]) == 2
    assert main(["--cluster", "mixed", "--workload", str(path), "--seeds", "2"]) == 2
    assert "use it with --json" in capsys.readouterr().err


def test_an_interval_is_students_t_over_the_seeds() -> None:
    assert mean_interval([1.0, 3.0]) == (2.0, pytest.approx(12.706 * math.sqrt(2 / 2)))
    assert mean_interval([5.0]) == (5.0, None) and mean_interval([math.nan]) == (None, None)
