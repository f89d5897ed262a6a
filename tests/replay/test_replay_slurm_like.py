"""Policy (7), Slurm-like (issue 29, item 3): EASY backfill by time limits, and topology/block segments, on GB200
NVL72 racks through the replay engine; segments a workload declares, and the share of them kept whole."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest

from loadtests.replay.__main__ import main
from loadtests.replay.clusters import nvl72_fleet
from loadtests.replay.engine import Fleet, Outcome, Placement, Run, replay
from loadtests.replay.group_metrics import summarize_groups
from loadtests.replay.model import Job
from loadtests.replay.slurm_like import SlurmLikePolicy, limits_note, segment_pods, time_limit
from loadtests.replay.workloads import read_csv

ONE_RACK = nvl72_fleet(racks=1, racks_per_leaf=1, hgx_leaves=0)
TWO_RACKS = nvl72_fleet(racks=2, racks_per_leaf=2, hgx_leaves=0)


def _gang(name: str, at: float, duration: float, trays: int, limit: float | None = None) -> list[Job]:
    if trays == 1:
        return [Job(name, at, duration, 4, "GB200", time_limit_s=limit)]
    return [Job(f"{name}-{i}", at, duration, 4, "GB200", group=name, pods=trays, time_limit_s=limit)
            for i in range(trays)]


def _placed(nodes, jobs):  # type: ignore[no-untyped-def]
    run = replay(nodes, jobs, SlurmLikePolicy("slurm", nodes), 1)
    return {outcome.job.group or outcome.job.name: outcome for outcome in run.outcomes}


def test_segments_follow_nvidias_guidance_down_to_a_divisor_of_the_nodes() -> None:
    assert segment_pods(_gang("big", 0, 1, 32)[0]) == 16  # 128 GPUs
    assert segment_pods(_gang("mid", 0, 1, 8)[0]) == 4  # 32 GPUs
    assert segment_pods(_gang("odd", 0, 1, 18)[0]) == 3  # 72 GPUs: 4 does not divide 18 trays
    assert segment_pods(_gang("small", 0, 1, 4)[0]) == 1  # 16 GPUs


def test_a_time_limit_is_stated_or_drawn_from_one_to_three_durations() -> None:
    stated, drawn = _gang("s", 0, 100, 1, limit=250)[0], _gang("d", 0, 100, 1)[0]
    assert time_limit(stated) == 250
    assert 100 <= time_limit(drawn) <= 300 and time_limit(drawn) == time_limit(_gang("d", 5, 100, 1)[0])
    assert limits_note([stated]) == "as stated" and limits_note([drawn]).startswith("duration x U(1, 3)")
    assert limits_note([stated, drawn]).startswith("as stated, else")


def test_a_short_job_backfills_before_the_head_and_a_long_one_waits_behind_it() -> None:
    """A holds 10 trays until 100 s (its limit). B, the whole rack, is the head: reserved from 100 s. C ends by
    its limit before then and starts at once; D would not, and every tray is B's, so D waits for B."""
    jobs = [*_gang("A", 0, 100, 10, limit=100), *_gang("B", 1, 50, 18, limit=50), *_gang("C", 2, 40, 1, limit=50),
            *_gang("D", 3, 40, 1, limit=500)]
    got = _placed(ONE_RACK, jobs)
    assert got["A"].placed_s == 0 and got["C"].placed_s == 2
    assert got["B"].placed_s == 100
    assert got["D"].placed_s == 150


def test_without_a_reservation_to_keep_a_job_takes_free_nodes_at_once() -> None:
    jobs = [*_gang("A", 0, 100, 10, limit=100), *_gang("E", 1, 400, 4, limit=900)]
    assert _placed(ONE_RACK, jobs)["E"].placed_s == 1  # no one waits: nothing to protect


def test_a_gang_goes_whole_into_the_rack_it_fills_best_and_its_segments_never_straddle() -> None:
    policy = SlurmLikePolicy("slurm", TWO_RACKS)
    fleet = Fleet(TWO_RACKS)
    first = [node.name for node in TWO_RACKS if node.name.startswith("gb200-r1-")]
    for name in first[:10]:  # rack 1 has 8 trays free, rack 2 all 18
        fleet.take(Placement(name, (0, 1, 2, 3)))
    eight = _gang("eight", 0, 10, 8)  # 32 GPUs: segments of 4; rack 1 holds them with nothing left over
    nodes = [policy.place(member, fleet, random.Random(1), 0).node for member in eight]  # type: ignore[union-attr]
    assert sorted(nodes) == first[10:]
    policy = SlurmLikePolicy("slurm", TWO_RACKS)
    twenty = _gang("twenty", 0, 10, 20)  # 80 GPUs: 5 segments of 4, more than one rack's 4 (rack 2) + 2 (rack 1)
    chosen = [policy.place(member, fleet, random.Random(1), 0) for member in twenty]
    assert all(placement is not None for placement in chosen)
    racks = [placement.node.split("-")[1] for placement in chosen]  # type: ignore[union-attr]
    assert sorted(racks.count(rack) for rack in set(racks)) == [4, 16]
    assert all(len(set(racks[at:at + 4])) == 1 for at in range(0, 20, 4))  # each segment in one rack


@pytest.mark.parametrize("stated", [False, True])
def test_every_job_runs_and_no_gpu_is_given_twice(stated: bool) -> None:
    """A busy mix on two racks, time limits drawn or stated as the durations: the engine refuses a placement of a
    GPU that is not free, so a run is proof."""
    jobs: list[Job] = []
    for i in range(60):
        trays, duration = (1, 2, 4, 8, 12, 18)[i % 6], 60 + 13 * i % 300
        jobs += _gang(f"j{i}", 7 * i, duration, trays, duration if stated else None)
    got = _placed(TWO_RACKS, jobs)
    assert all(outcome.placed_s is not None for outcome in got.values())


def test_a_declared_segment_holds_slurm_to_it_and_the_share_counts_segments_kept_whole() -> None:
    """Two racks with 6 trays free each: 8 trays in segments of 4 fit across them; declared as one segment of 8,
    the job waits, as Slurm's --segment=8 would."""
    fleet = Fleet(TWO_RACKS)
    for rack in ("r1", "r2"):
        for name in [node.name for node in TWO_RACKS if node.name.startswith(f"gb200-{rack}-")][:12]:
            fleet.take(Placement(name, (0, 1, 2, 3)))
    guided = _gang("guided", 0, 10, 8)
    policy = SlurmLikePolicy("slurm", TWO_RACKS)
    placed = [policy.place(member, fleet, random.Random(1), 0) for member in guided]
    assert all(placement is not None for placement in placed)
    declared = [replace(member, segment_pods=8) for member in _gang("declared", 0, 10, 8)]
    assert SlurmLikePolicy("slurm", TWO_RACKS).place(declared[0], fleet, random.Random(1), 0) is None
    racks = [placement.node.split("-")[1] for placement in placed]  # type: ignore[union-attr]
    outcomes = tuple(Outcome(member, 0, placement, 10) for member, placement in zip(guided, placed))
    halves = [replace(member, segment_pods=4) for member in guided]
    assert racks[:4] != racks[4:]  # one segment a rack
    split = summarize_groups(Run("s", 1, TWO_RACKS, tuple(replace(o, job=j) for o, j in zip(outcomes, halves)), ()))
    whole = summarize_groups(Run("s", 1, TWO_RACKS, outcomes, ()))
    assert (split.groups_in_one_domain_share, split.segments_intact_share) == (0.0, 1.0)
    assert (whole.groups_whose_segments_fit, whole.segments_intact_share) == (1, 0.0)


def test_a_csv_declares_segments_that_divide_the_job(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,num_pods,segment_pods,time_limit_s\n0,60,4,8,4,120\n",
                    encoding="utf-8")
    jobs = read_csv(path)
    assert {(job.segment_pods, job.time_limit_s) for job in jobs} == {(4, 120.0)} and len(jobs) == 8
    path.write_text("submit_time_s,duration_s,num_gpus,num_pods,segment_pods\n0,60,4,8,3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="segment_pods 3 does not divide num_pods 8"):
        read_csv(path)


def test_declared_segments_stay_whole_under_slurm_and_our_extender(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Gangs of 24 trays, more than a rack's 18, in segments of 12: our extender (gpu-topology.io/group-segment)
    and Slurm keep every segment in one rack; count-only placement does not. (At --comm-share 0 our preferred
    policy may break them: a split costs its job nothing.)"""
    path = tmp_path / "segments.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,num_pods,segment_pods,gpu_model\n" + "".join(
        f"{600 * i},{900 + 120 * i},4,24,12,GB200\n" for i in range(6)), encoding="utf-8")
    assert main(["--cluster", "nvl72", "--workload", str(path), "--json", "--comm-share", "0.3"]) == 0
    policies = json.loads(capsys.readouterr().out)["policies"]
    for name in ("(7) Slurm-like, EASY backfill, topology/block", "(4) ours, groups required",
                 "(4) ours, groups preferred"):
        assert policies[name]["groups_whose_segments_fit"] == 6 and policies[name]["segments_intact_share"] == 1.0
    assert policies["(1) quantity only"]["segments_intact_share"] < 1.0
