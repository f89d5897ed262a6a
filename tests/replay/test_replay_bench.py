"""The replay's standard set (python -m loadtests.replay.bench, `make bench`) and the Alibaba fleet scale."""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from pathlib import Path

import pytest

from loadtests.replay import bench
from loadtests.replay.__main__ import main as replay_main
from loadtests.replay.clusters import alibaba_fleet, pool_capacity
from loadtests.replay.derive_alibaba import DATA, NODES
from loadtests.replay.metrics import Summary


def _trace_nodes() -> list[tuple[str, tuple[str, int]]]:
    with open(DATA / NODES, newline="", encoding="utf-8") as handle:
        return [(row["sn"], (row["model"], int(row["gpu"]))) for row in csv.DictReader(handle)]


def test_a_scaled_fleet_keeps_the_first_nodes_of_every_model_and_size() -> None:
    rows = _trace_nodes()
    groups = Counter(key for _, key in rows)
    fleet = alibaba_fleet(scale=0.1)
    assert len(fleet) == sum(max(1, round(count * 0.1)) for count in groups.values()) == 124
    kept = Counter()
    expected = []
    for name, key in rows:
        kept[key] += 1
        if kept[key] <= max(1, round(groups[key] * 0.1)):
            expected.append(name)
    assert [node.name for node in fleet] == expected  # the first ones, in file order
    assert {node.gpu_model for node in fleet} == {node.gpu_model for node in alibaba_fleet()}  # A10's 2 nodes: 1
    assert pool_capacity(fleet)["G2"] == 440 and alibaba_fleet(scale=1.0) == alibaba_fleet()


@pytest.mark.parametrize("scale", [0.0, -0.5, 1.01, math.nan])
def test_a_fleet_scale_out_of_bounds_is_refused(scale: float) -> None:
    with pytest.raises(ValueError, match="fleet scale"):
        alibaba_fleet(scale=scale)


def test_the_cli_replays_a_scaled_fleet_and_bounds_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert replay_main(["--cluster", "alibaba", "--fleet-scale", "0.02", "--workload", "synthetic", "--jobs", "300",
                        "--load", "0.5", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert all(metrics["pods"] == 300 for metrics in result["policies"].values())
    for bad in ("0", "1.5", "nan", "tenth"):
        with pytest.raises(SystemExit):
            replay_main(["--cluster", "alibaba", "--fleet-scale", bad])
        assert "--fleet-scale" in capsys.readouterr().err


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> tuple[bench.Bench, Path]:
    root = tmp_path_factory.mktemp("first")
    return bench.run_bench(root / "plots", quick=True), root


def test_the_set_holds_every_run_of_the_issue() -> None:
    keys = [spec.key for spec in bench.standard_set()]
    assert keys == ["mixed-synthetic-trace-mix-load0.8", "mixed-synthetic-trace-mix-load0.9",
                    "mixed-synthetic-stress-mix-load0.8", "mixed-synthetic-stress-mix-load0.9", "mixed-alibaba-load0.8",
                    "alibaba0.1-synthetic-trace-mix-load0.8", "alibaba0.1-synthetic-trace-mix-load0.9",
                    "alibaba0.1-alibaba-load0.8", "alibaba-inflation", "mixed-inflation", "nvl72-groups-load0.8",
                    "nvl72-groups-load0.9"]
    jobs = {spec.key: spec.jobs for spec in bench.standard_set()}
    assert jobs["mixed-synthetic-trace-mix-load0.9"] == 10_000 and jobs["mixed-synthetic-stress-mix-load0.8"] == 3_000
    assert jobs["alibaba-inflation"] is None and jobs["alibaba0.1-alibaba-load0.8"] is None  # whole workloads
    assert jobs["nvl72-groups-load0.9"] == bench.NVL72_JOBS


def test_the_same_seed_gives_the_same_tables_and_figures(quick: tuple[bench.Bench, Path],
                                                         tmp_path: Path) -> None:
    first, first_root = quick
    second = bench.run_bench(tmp_path / "plots", quick=True)
    assert bench.render(second, tmp_path, times=False) == bench.render(first, first_root, times=False)
    for before, after in zip((p for r in first.results for p in r.plots), (p for r in second.results for p in r.plots),
                             strict=True):
        assert before.name == after.name and before.read_bytes() == after.read_bytes()
    assert second.http.matches and second.http.jobs == bench.QUICK_SAMPLE


def test_the_section_shows_each_run_its_verdict_pools_curve_and_plots(quick: tuple[bench.Bench, Path]) -> None:
    result, root = quick
    text = bench.render(result, root)
    for spec in bench.standard_set():
        assert f"### {spec.title}" in text
    assert text.count("(4) against (3) at 100%") == 8  # every run at load 0.8 or 0.9
    assert text.count("Per pool: multi-GPU pods") == 2  # the mixed synthetic runs at 0.9
    assert text.count("started groups that fit one NVLink domain into one (target >= 99%") == 2  # nvl72 runs
    assert text.count("| (4) ours, groups preferred |") == 2 and "assumed mix (not a trace statistic)" in text
    assert text.count(bench.COMPARABILITY) == 2 and "FGD paper: FGD (median of its seeds)" in text
    assert "assumed training-heavy stress mix" in text and "Total wall time" in text
    assert "0 mismatches" in text
    names = {path.name for r in result.results for path in r.plots}
    assert {"alibaba-inflation-inflation.png", "mixed-inflation-inflation.png", "nvl72-groups-load0.9-group-spans.png",
            "nvl72-groups-load0.9-group-pending.png"} <= names
    assert all(f"(plots/{name})" in text for name in names)


def _summary(policy: str, full: float, utilization: float, p95: float) -> Summary:
    return Summary(policy, 10, 10, 0, 0, 4, 1.0, 1.0, 1.0, full, 1.0, p95, utilization, {2: 0.0, 4: 0.0, 8: 0.0},
                   1.0, 0.3)


def test_the_acceptance_names_every_figure_that_falls_short() -> None:
    met = bench.acceptance([_summary("1", 0.5, 0.70, 30), _summary("2", 0.6, 0.71, 20), _summary("3", 0.9, 0.71, 20),
                            _summary("4", 0.995, 0.71, 20)])
    assert "(+9.50 points)" in met and "meets the acceptance" in met
    short = bench.acceptance([_summary("1", 0.5, 0.70, 30), _summary("2", 0.6, 0.72, 20),
                              _summary("3", 0.9, 0.71, 20), _summary("4", 0.98, 0.71, 25)])
    assert ("falls short" in short and "at 100% 98.0%" in short
            and "GPU utilization 71.00% against 70.00% (1) and 72.00% (2)" in short)
    assert "p95 pending 25 s" in short


def test_write_replaces_the_section_or_appends_it(quick: tuple[bench.Bench, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    result, _ = quick
    monkeypatch.setattr(bench, "run_bench", lambda plots, quick: result)
    target = tmp_path / "BENCHMARKS.md"
    target.write_text(f"# Benchmarks\n\n{bench.BEGIN}\nold\n{bench.END}\n\n## after\n", encoding="utf-8")
    assert bench.main(["--write", str(target), "--quick"]) == 0
    text = target.read_text(encoding="utf-8")
    assert "\nold\n" not in text and text.endswith("## after\n") and text.count(bench.BEGIN) == 1
    assert "`python -m loadtests.replay.bench --write" in text
    other = tmp_path / "OTHER.md"
    other.write_text("# Other\n", encoding="utf-8")
    assert bench.main(["--write", str(other), "--quick"]) == 0
    assert other.read_text(encoding="utf-8").startswith("# Other\n\n" + bench.BEGIN)
