"""What every benchmark shares from loadtests/bench_select.py (the commit a section names, the exit status of a
miss), and bench_select's own verdicts: a missed target, or a wrong answer, exits non-zero."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import bench_select  # noqa: E402

from topology.budget import BudgetExhausted  # noqa: E402

TINY = ["--masks", "1", "--masks16", "1", "--repeat", "1", "--budget", "0.01"]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout.strip()


def test_a_section_names_its_commit_dirty_only_for_changes_to_what_runs(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    for path in ("extender/a.py", "loadtests/plots/p.png", "README.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    monkeypatch.setattr(bench_select, "ROOT", tmp_path)
    (tmp_path / "README.md").write_text("2\n")
    (tmp_path / "loadtests/plots/p.png").write_text("2\n")  # what a run writes
    assert bench_select.measured_commit() == f"`{head}`"
    assert f"- Commit: `{head}`." in bench_select.run_header("T", "t.py", [], 1.0)
    (tmp_path / "extender/a.py").write_text("2\n")
    assert bench_select.measured_commit() == f"`{head}+dirty` (uncommitted changes to what runs)"
    monkeypatch.setattr(bench_select, "ROOT", tmp_path / "nowhere")
    assert bench_select.measured_commit() == "unknown (not a git work tree)"


def test_the_header_keeps_the_command_last() -> None:
    """replay/bench.py writes its own command line in place of the last one."""
    assert bench_select.run_header("T", "t.py", ["--x"], 1.0)[-1] == "- Command: `python loadtests/t.py --x`"


def test_a_miss_is_said_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_select.verdict("bench", []) == 0
    assert bench_select.verdict("bench", ["p99: 6 ms"]) == 1
    assert capsys.readouterr().err == "bench: missed: p99: 6 ms\n"
    checks = [bench_select.Check("a <= 1", "0.5", True), bench_select.Check("b <= 1", "2", False, "**missed** by 1")]
    assert bench_select.missed(checks) == ["b <= 1: 2"]
    assert [check.row() for check in checks] == ["| a <= 1 | 0.5 | **met** |", "| b <= 1 | 2 | **missed** by 1 |"]


def test_each_target_of_bench_select_is_judged() -> None:
    assert bench_select.Targets(4.9, 0.9, 0).missed() == []
    assert bench_select.Targets(5.1, 0.9, 0).missed() == ["cold 16-GPU p99 5.100 ms, target <= 5 ms"]
    assert bench_select.Targets(4.9, 1.0, 0).missed() == ["slowest precompute 1.000 s, target < 1 s"]
    assert bench_select.Targets(4.9, 0.9, 2).missed() == ["the baseline's ring beat our exact selector's on 2 queries"]


def test_a_run_that_misses_exits_1(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(bench_select, "COLD_P99_TARGET_MS", 1e-6)
    assert bench_select.main(TINY) == 1
    assert "bench_select: missed: cold 16-GPU p99" in capsys.readouterr().err


def test_the_adversarial_run_exits_1_when_the_honest_board_is_not_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The honest board (16 bridge pairs, under 28,000 steps) stays exact; with a budget of 1,000 steps it cannot."""
    assert bench_select.main(["--adversarial", "--repeat", "1"]) == 0
    spend = bench_select._CountedBudget.spend

    def small(self: bench_select._CountedBudget, steps: int) -> None:
        spend(self, steps)
        if bench_select._CountedBudget.used[self.index] > 1000:
            raise BudgetExhausted

    monkeypatch.setattr(bench_select._CountedBudget, "spend", small)
    assert bench_select.main(["--adversarial", "--repeat", "1"]) == 1
