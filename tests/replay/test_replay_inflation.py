"""FGD's allocation-ratio curve of an inflation run, the published FGD points it is set against, and its plot."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from loadtests.replay.clusters import mixed_fleet
from loadtests.replay.engine import Outcome, Placement, Run, replay
from loadtests.replay.inflation_curve import (FGD_COLUMNS, CurvePoint, allocation_curve, discrete,
                                              published_by_policy, read_published)
from loadtests.replay.kube_scores import DEFAULT
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.plots import write_inflation_plot
from loadtests.replay.policies import StockPolicy
from loadtests.replay.workloads import alibaba_trace, inflation

H100 = ClusterNode("h100-a", "dgx-h100", "H100")
INF = math.inf


def test_a_point_counts_the_pods_placed_by_its_arrival_and_a_late_pod_at_its_placement() -> None:
    jobs = [Job("a", 0.0, INF, 4), Job("b", 1.0, INF, 2), Job("c", 2.0, INF, 1), Job("d", 3.0, INF, 8)]
    outcomes = (Outcome(jobs[0], 0.0, Placement("h100-a", (0, 1, 2, 3))),
                Outcome(jobs[1], 2.0, Placement("h100-a", (4, 5))),  # declined at 1, placed at c's arrival
                Outcome(jobs[2], 2.0, Placement("h100-a", (6,))),
                Outcome(jobs[3], None, None))
    curve = allocation_curve(Run("p", 1, (H100,), outcomes, ()))
    assert curve == (CurvePoint(4 / 8, 4 / 8), CurvePoint(6 / 8, 4 / 8), CurvePoint(7 / 8, 7 / 8),
                     CurvePoint(15 / 8, 7 / 8))


def test_the_curve_of_a_replayed_inflation_follows_the_ideal_until_the_fleet_fills() -> None:
    nodes = mixed_fleet(1)
    jobs = inflation(alibaba_trace(), nodes, seed=1)
    run = replay(nodes, jobs, StockPolicy("quantity", DEFAULT), 1)
    curve = allocation_curve(run)
    assert len(curve) == len(jobs) and curve[-1].arrived >= 1.3
    assert all(point.allocated <= min(point.arrived, 1.0) + 1e-12 for point in curve)
    assert all(later.allocated >= earlier.allocated for earlier, later in zip(curve, curve[1:]))
    # Nothing leaves: until the first pod is refused, every GPU asked for is allocated.
    first_refused = next(index for index, outcome in enumerate(run.outcomes) if outcome.placed_s is None)
    assert all(point.allocated == point.arrived for point in curve[:first_refused])
    placed = sum(outcome.job.gpus for outcome in run.outcomes if outcome.placed_s is not None)
    assert curve[-1].allocated == placed / 48


def test_a_run_whose_pods_leave_has_no_allocation_curve() -> None:
    run = replay([H100], [Job("a", 0.0, 10.0, 1)], StockPolicy("quantity", DEFAULT), 1)
    with pytest.raises(ValueError, match="inflation"):
        allocation_curve(run)


def test_discrete_takes_fgds_rounding_and_its_one_percent_fallback() -> None:
    curve = [CurvePoint(0.996, 0.90), CurvePoint(1.004, 0.92), CurvePoint(1.021, 0.93), CurvePoint(1.20, 0.95)]
    values = discrete(curve, (100, 101, 103, 110))
    assert values[100] == pytest.approx(91.0)  # 99.6 and 100.4 round to 100
    assert values[101] == pytest.approx(91.0 + 2 / 3)  # none rounds to 101: the mean of those at 100 to 102
    assert values[103] == pytest.approx(93.0) and values[110] is None


def test_the_shipped_fgd_points_are_the_openb_default_medians() -> None:
    by_policy = published_by_policy(read_published())
    assert list(by_policy) == ["Random", "DotProd", "Clustering", "Packing", "BestFit", "FGD"]
    at_100 = {policy: next(p for p in points if p.arrived_pct == 100) for policy, points in by_policy.items()}
    assert at_100["FGD"].median_pct == 95.23 and at_100["FGD"].seeds == 10
    assert at_100["BestFit"].median_pct == 92.91 and at_100["Random"].median_pct == 86.25
    assert all(len(points) == 27 for points in by_policy.values())


@pytest.mark.parametrize("text, error", [
    ("policy,arrived\nFGD,100\n", "header"),
    (",".join(FGD_COLUMNS) + "\nFGD,100,95,96,97,10\n", "out of range"),
    (",".join(FGD_COLUMNS) + "\nFGD,100,x,1,2,10\n", "fields"),
])
def test_a_bad_published_file_is_one_clear_error(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "fgd.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=error):
        read_published(path)


def test_the_inflation_plot_is_a_png_with_a_fixed_name(tmp_path: Path) -> None:
    curve = (CurvePoint(0.5, 0.5), CurvePoint(1.0, 0.9), CurvePoint(1.3, 0.92))
    path = write_inflation_plot({"(1) quantity only": curve}, read_published(), tmp_path, "fleet")
    assert path == tmp_path / "fleet-inflation.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = write_inflation_plot({"(1) quantity only": curve}, read_published(), tmp_path / "again", "fleet")
    assert again.read_bytes() == path.read_bytes()
