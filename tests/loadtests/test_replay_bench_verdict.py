"""`python -m loadtests.replay.bench` (make bench) exits 1 when a run falls short of its acceptance or policy (5)
over HTTP disagrees with (4) in-process; a quick run's verdicts are shown, not judged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from loadtests.replay import bench
from loadtests.replay.group_metrics import GroupSummary
from loadtests.replay.http_check import HttpCheck
from loadtests.replay.metrics import Summary


def _summary(policy: str, full: float, utilization: float, p95: float) -> Summary:
    return Summary(policy, 10, 10, 0, 0, 4, 1.0, 1.0, 1.0, full, 1.0, p95, utilization, {2: 0.0, 4: 0.0, 8: 0.0},
                   1.0, 0.3)


def _groups(share: float) -> list[GroupSummary]:
    summary = GroupSummary("(4)", 10, 5, 5, 5, share, 5, 1.0, 5, 1.0, 0.7, {"2": 10.0}, 1.0, 0.3)
    return [summary] * 5


def test_each_acceptance_target_is_judged() -> None:
    one, two, three = _summary("1", 0.5, 0.70, 30), _summary("2", 0.6, 0.71, 20), _summary("3", 0.9, 0.71, 20)
    assert bench.acceptance_met([one, two, three, _summary("4", 0.995, 0.71, 20)])
    for short in (_summary("4", 0.98, 0.71, 20), _summary("4", 0.995, 0.705, 20), _summary("4", 0.995, 0.71, 25)):
        assert not bench.acceptance_met([one, two, three, short])
        assert "falls short" in bench.acceptance([one, two, three, short])
    none_placed = dataclasses.replace(_summary("4", 1.0, 0.71, 20), multi_gpu=0)
    assert not bench.acceptance_met([one, two, three, none_placed])  # nothing to judge is not a pass
    assert bench.group_met(_groups(0.99)) and not bench.group_met(_groups(0.98))


def _result(met: bool | None) -> bench.Result:
    spec = bench.standard_set()[0]
    return bench.Result(spec, 4, 32, "10 jobs", (), 1.0, (), "(4) falls short: at 100% 98.0%", met, None, None, ())


def _bench(results: tuple[bench.Result, ...], mismatches: int = 0, quick: bool = False) -> bench.Bench:
    http = HttpCheck(40, 40, 20, 3, 1, (None,) * mismatches)  # type: ignore[arg-type]
    return bench.Bench(results, http, 1.0, 1.0, quick)


def test_a_run_that_falls_short_or_differs_over_http_exits_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.missed(_bench((_result(True), _result(None)))) == []
    assert bench.missed(_bench((_result(False),))) == [
        "Mixed fleet, synthetic (trace mix), load 0.8: (4) falls short: at 100% 98.0%"]
    assert bench.missed(_bench((_result(False),), quick=True)) == []  # a smoke run: shown, not judged
    assert len(bench.missed(_bench((_result(True),), mismatches=2, quick=True))) == 1
    monkeypatch.setattr(bench, "run_bench", lambda plots, quick: _bench((_result(False),)))
    monkeypatch.setattr(bench, "render", lambda found, root: "")
    assert bench.main(["--write", str(tmp_path / "B.md")]) == 1
    assert "replay/bench: missed: Mixed fleet" in capsys.readouterr().err
