"""python -m loadtests.replay end to end on a user's CSV: one JSON object with every policy, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests.replay.__main__ import main


def _csv(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,gpu_model\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_json_holds_the_metrics_of_every_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [f"{i * 10},{300 + i},{(1, 2, 4, 8)[i % 4]},V100" for i in range(24)]
    assert main(["--cluster", "mixed", "--nodes-per-pool", "1", "--workload", str(_csv(tmp_path, rows)),
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert list(result["policies"]) == ["(1) quantity only", "(2) quantity, GPU packing",
                                        "(3) ours, scheduling only", "(4) ours, with delivery"]
    for metrics in result["policies"].values():
        assert metrics["pods"] == 24 and metrics["placed"] + metrics["never_placed"] == 24
        assert metrics["multi_gpu"] == metrics["placed"] - sum(1 for i in range(24) if i % 4 == 0)
    assert main(["--cluster", "mixed", "--nodes-per-pool", "1", "--workload", str(_csv(tmp_path, rows)),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == result  # the same seed, the same numbers


def test_a_job_no_node_can_hold_is_an_error_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cluster", "mixed", "--workload", str(_csv(tmp_path, ["0,10,16,V100"]))]) == 2
    assert "can never run" in capsys.readouterr().err
    assert main(["--cluster", "mixed", "--workload", str(tmp_path / "missing.csv")]) == 2


def test_plots_are_written_as_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [f"{i * 10},{300 + i},{(1, 2, 4)[i % 3]},A6000" for i in range(12)]
    assert main(["--cluster", "mixed", "--nodes-per-pool", "1", "--workload", str(_csv(tmp_path, rows)),
                 "--plots", str(tmp_path / "plots")]) == 0
    written = sorted(path.name for path in (tmp_path / "plots").iterdir())
    assert written == [f"mixed-jobs-seed1-{name}.png" for name in ("efficiency", "fragmentation", "pending")]
    assert all((tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for name in written)


def test_the_topology_wait_is_set_for_our_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A busy L40S node: with the extender's wait some 2- and 4-GPU pods hold out for a socket, without it they
    take what is free at once; the stock policies do not change."""
    rows = [f"{i * 20},{200 + 37 * i % 400},{(1, 1, 2, 4, 1, 2)[i % 6]},L40S" for i in range(60)]
    results = {}
    for wait in ("0", "600"):
        assert main(["--cluster", "mixed", "--nodes-per-pool", "1", "--workload", str(_csv(tmp_path, rows)),
                     "--topology-wait", wait, "--json"]) == 0
        results[wait] = json.loads(capsys.readouterr().out)
        assert results[wait]["topology_wait"] == float(wait)
    stock = ("(1) quantity only", "(2) quantity, GPU packing")
    assert all(results["0"]["policies"][name] == results["600"]["policies"][name] for name in stock)
    assert results["0"]["policies"]["(4) ours, with delivery"] != results["600"]["policies"]["(4) ours, with delivery"]
    assert main(["--cluster", "mixed", "--workload", str(_csv(tmp_path, rows)), "--topology-wait", "-1"]) == 2
    assert "--topology-wait must be 0 to 86400" in capsys.readouterr().err


def test_the_nvl72_fleet_takes_a_multi_node_csv_rescaled_to_a_load(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Rows of num_pods > 1 are multi-node jobs; --load rescales the CSV's arrivals; every policy's JSON holds the
    group metrics, and the gang-aware ones keep every group that fits one NVLink domain in one."""
    shapes = [(4, 18, "GB200"), (4, 4, "GB200"), (4, 1, "GB200"), (8, 2, "H100"), (8, 1, "H100"), (2, 1, "H100"),
              (4, 8, "")]
    path = tmp_path / "multi.csv"
    path.write_text("submit_time_s,duration_s,num_gpus,num_pods,gpu_model\n" + "".join(
        f"{60 * i},{600 + 97 * i % 2400},{gpus},{pods},{model}\n"
        for i, (gpus, pods, model) in enumerate(shapes[i % 7] for i in range(70))), encoding="utf-8")
    assert main(["--cluster", "nvl72", "--workload", str(path), "--load", "0.85", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["load"] == 0.85 and "in 40 multi-node jobs" in result["jobs"]
    policies = result["policies"]
    assert list(policies) == ["(1) quantity only", "(6) Kueue-like, best-fit block",
                              "(7) Slurm-like, EASY backfill, topology/block", "(4) ours, groups required",
                              "(4) ours, groups preferred"]
    assert result["time_limits"] == "duration x U(1, 3) per job"
    for metrics in policies.values():
        assert metrics["groups"] == 40 and metrics["groups_started"] == 40
        assert set(metrics["pending_p95_s_by_pods"]) == {"1", "2-4", "5-8", "9-18"}
        assert 0 < metrics["gpu_utilization_running"] <= metrics["gpu_utilization"] + 1e-9 <= 1  # running is held
    for name in ("(6) Kueue-like, best-fit block", "(4) ours, groups required"):
        assert policies[name]["groups_in_one_domain_share"] == 1.0 and policies[name]["modelled_group_job_time"] == 1.0
    assert policies["(1) quantity only"]["groups_in_one_domain_share"] < 0.5
    assert main(["--cluster", "mixed", "--workload", str(path)]) == 2
    assert "replay on --cluster nvl72" in capsys.readouterr().err
