"""loadtests/soak.py's verdict, from what a soak is for: no leak (RSS flat over the second half), no tail that
drifts, the pace held, no error. Each miss, injected into its intervals, fails the run; a short real run with an
injected miss exits 1."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pytest

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import soak  # noqa: E402

ARGS = argparse.Namespace(rate=20.0, seconds=600.0)


def _intervals(rss_per_minute: float = 0.0, drift: float = 1.0) -> list[soak.Interval]:
    """Ten minutes in 10-s intervals of 200 bound cycles each, RSS growing by `rss_per_minute` and every p99 taking
    `drift` times its value in the second half of the minutes after the first."""
    found = []
    for step in range(1, 61):
        at = 10.0 * step
        p99 = 1.0 * (drift if at > 330 else 1.0)
        found.append(soak.Interval(at, 100.0 + rss_per_minute * at / 60, 200, {"bound": 200},
                                   dict.fromkeys(soak.VERBS, 0.5), dict.fromkeys(soak.VERBS, p99),
                                   dict.fromkeys(soak.VERBS, p99 + 0.3), step, 0))
    return found


def test_a_steady_soak_passes_and_each_miss_fails_it() -> None:
    assert soak.missed(soak.checks(ARGS, _intervals(rss_per_minute=0.4, drift=1.4))) == []
    leak = soak.missed(soak.checks(ARGS, _intervals(rss_per_minute=0.6)))
    assert leak == ["RSS slope over the second half after the first minute <= 0.5 MB/min: +0.60 MB/min"]
    drift = soak.missed(soak.checks(ARGS, _intervals(drift=1.6)))
    assert len(drift) == 3 and drift[0] == "filter: median p99 of the second half <= 1.5x the first half's: 1.60x " \
                                          "(1.000 / 1.600 ms)"
    slow = [dataclasses.replace(interval, cycles=180) for interval in _intervals()]
    assert soak.missed(soak.checks(ARGS, slow)) == ["cycles done >= 95% of 20/s over 600 s: 10,800 of 12,000"]
    failed = _intervals()
    failed[30] = dataclasses.replace(failed[30], outcomes={"bound": 199, "bind-error": 1})
    failed[-1] = dataclasses.replace(failed[-1], errors_logged=2)
    assert soak.missed(soak.checks(ARGS, failed)) == [
        "no error answer (filter, bind) and no error logged by the extender: 1 error answers, 2 errors logged"]


def test_a_soak_too_short_to_judge_fails() -> None:
    assert any("not measured" in miss for miss in soak.missed(soak.checks(ARGS, _intervals()[:2])))


def test_a_short_run_with_an_injected_miss_exits_1(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """100 nodes for 3 s: the run's own figures, and an RSS limit no run can meet."""
    monkeypatch.setattr(soak, "RSS_SLOPE_LIMIT", -1e9)
    assert soak.main(["--nodes", "100", "--seconds", "3", "--interval", "1", "--rate", "10",
                      "--plot", str(tmp_path / "soak.png")]) == 1
    assert "soak: missed: RSS slope" in capsys.readouterr().err
