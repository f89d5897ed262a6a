"""Multi-node jobs in the replay's workloads and engine (issue 17): a CSV's num_pods, the load a CSV is rescaled
to, a group no pool could hold, and the gang: a group runs from its last placement and leaves together."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtests.replay.clusters import mixed_fleet
from loadtests.replay.engine import replay
from loadtests.replay.kube_scores import DEFAULT
from loadtests.replay.metrics import job_starts, summarize
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.policies import StockPolicy
from loadtests.replay.workloads import at_load, offered_load, read_csv, unplaceable

QUANTITY = StockPolicy("quantity", DEFAULT)


def _csv(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_csv_row_of_num_pods_is_a_group_of_that_many_member_pods(tmp_path: Path) -> None:
    jobs = read_csv(_csv(tmp_path, "submit_time_s,duration_s,num_gpus,gpu_model,num_pods\n"
                                   "5,100,4,GB200,3\n0,50,8,H100,\n5,10,2,,1\n"))
    assert [(job.name, job.submit_s, job.gpus, job.gpu_model, job.group, job.pods) for job in jobs] == [
        ("csv-3", 0.0, 8, "H100", None, 1),
        ("csv-2-0", 5.0, 4, "GB200", "csv-2", 3), ("csv-2-1", 5.0, 4, "GB200", "csv-2", 3),
        ("csv-2-2", 5.0, 4, "GB200", "csv-2", 3),
        ("csv-4", 5.0, 2, None, None, 1)]
    plain = read_csv(_csv(tmp_path, "submit_time_s,duration_s,num_gpus,num_pods\n0,1,8,2\n"))
    assert {job.group for job in plain} == {"csv-2"} and len(plain) == 2


@pytest.mark.parametrize(("header", "row", "message"), [
    ("submit_time_s,duration_s,num_gpus,num_pods", "0,1,4,0", "num_pods '0' is not a whole number from 1 to 1024"),
    ("submit_time_s,duration_s,num_gpus,num_pods", "0,1,4,1025", "num_pods '1025'"),
    ("submit_time_s,duration_s,num_gpus,num_pods,num_pods", "0,1,4,2,2", ":1: header"),
    ("submit_time_s,duration_s,num_gpus,pods", "0,1,4,2", ":1: header"),
])
def test_a_bad_num_pods_is_one_line_naming_file_and_line(tmp_path: Path, header: str, row: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_csv(_csv(tmp_path, f"{header}\n{row}\n"))


def test_load_rescales_a_csv_with_groups_to_its_target_and_keeps_each_group_together(tmp_path: Path) -> None:
    fleet = mixed_fleet(2)
    rows = "".join(f"{10 * i},{600 + 37 * i},{(4, 8)[i % 2]},{(3, 2)[i % 2]},{('A100', 'H100')[i % 2]}\n"
                   for i in range(40))
    jobs = read_csv(_csv(tmp_path, "submit_time_s,duration_s,num_gpus,num_pods,gpu_model\n" + rows))
    for load in (0.85, 0.3):
        scaled = at_load(jobs, fleet, load)
        assert offered_load(scaled, fleet) == pytest.approx(load, rel=1e-9)
        assert [job.duration_s for job in scaled] == [job.duration_s for job in jobs]
        assert len({(job.group, job.submit_s) for job in scaled if job.group}) == 40 // 2 + 40 // 2


def test_a_group_no_pool_could_hold_at_once_is_named() -> None:
    fleet = mixed_fleet(2)
    assert unplaceable([Job("g-0", 0, 1, 8, "H100", group="g", pods=3)], fleet) == (
        "g: 3 pods of 8 GPUs, more than its pool holds at once (2)")
    assert unplaceable([Job("h-0", 0, 1, 4, "H100", group="h", pods=4)], fleet) is None
    assert unplaceable([Job("i-0", 0, 1, 4, None, group="i", pods=24)], fleet) is None  # any pool: 12 nodes


def test_a_group_runs_from_its_last_placement_and_its_members_leave_together() -> None:
    """Count alone: the first member takes the 4 GPUs free at its arrival and holds them while the second waits
    for the lone pod to leave; then both run 50 s and leave together, so a pod asking for 8 waits for both."""
    node = ClusterNode("h100-a", "dgx-h100", "H100")
    jobs = [Job("lone", 0, 100, 4), Job("g-0", 1, 50, 4, group="g", pods=2), Job("g-1", 1, 50, 4, group="g", pods=2),
            Job("eight", 120, 10, 8)]
    run = replay([node], jobs, QUANTITY, 1)
    assert [outcome.placed_s for outcome in run.outcomes] == [0, 1, 100, 150]
    assert job_starts(run.outcomes) == [0, 100, 100, 150]
    summary = summarize(run)  # GPUs held within [0, 120]: the lone 4 x 100, g-0 4 x 119 from 1, g-1 4 x 20
    assert summary.gpu_utilization == pytest.approx((400 + 476 + 80) / (8 * 120))


def test_the_engine_refuses_a_group_whose_members_are_not_together() -> None:
    node = ClusterNode("h100-a", "dgx-h100", "H100")
    apart = [Job("g-0", 0, 5, 1, group="g", pods=2), Job("x", 0, 5, 1), Job("g-1", 0, 5, 1, group="g", pods=2)]
    with pytest.raises(ValueError, match="consecutive"):
        replay([node], apart, QUANTITY, 1)
    with pytest.raises(ValueError, match="consecutive"):
        replay([node], [Job("g-0", 0, 5, 1, group="g", pods=3)], QUANTITY, 1)
