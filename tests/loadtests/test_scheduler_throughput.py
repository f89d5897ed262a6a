"""What loadtests/scheduler_throughput.py computes without a cluster: quantiles from histogram buckets as Prometheus
computes them, the GPU checks, the three scheduler configurations, the verdict that makes a run exit 1 (issue 18's
targets and every round's checks), and the exit without binaries."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import LOADTESTS, ROOT

sys.path.insert(0, str(LOADTESTS))

import scheduler_throughput as throughput  # noqa: E402

from kube_e2e import Pki  # noqa: E402


def test_quantiles_interpolate_within_a_bucket_as_histogram_quantile_does() -> None:
    buckets = {0.001: 50.0, 0.01: 90.0, 0.1: 100.0, float("inf"): 100.0}
    assert throughput.quantile(buckets, 0.5) == pytest.approx(0.001)
    assert throughput.quantile(buckets, 0.7) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert throughput.quantile(buckets, 0.99) == pytest.approx(0.01 + 0.09 * 9 / 10)
    assert throughput.quantile({0.001: 0.0, float("inf"): 0.0}, 0.5) is None
    assert throughput.quantile({0.001: 0.0, float("inf"): 4.0}, 0.99) == 0.001  # beyond the last finite bound


def test_histograms_are_read_by_label_and_subtracted() -> None:
    text = "\n".join([
        "# TYPE gpu_topology_extender_request_seconds histogram",
        'gpu_topology_extender_request_seconds_bucket{verb="bind",le="0.01"} 3.0',
        'gpu_topology_extender_request_seconds_bucket{verb="bind",le="+Inf"} 4.0',
        'gpu_topology_extender_request_seconds_bucket{verb="filter",le="0.01"} 7.0',
        'gpu_topology_extender_request_seconds_bucket{verb="filter",le="+Inf"} 7.0',
        "gpu_topology_extender_request_seconds_count{verb=\"bind\"} 4.0", ""])
    found = throughput.histograms(text, throughput.EXTENDER_LATENCY, "verb")
    assert found == {"bind": {0.01: 3.0, float("inf"): 4.0}, "filter": {0.01: 7.0, float("inf"): 7.0}}
    assert throughput.subtract(found, {"bind": {0.01: 1.0, float("inf"): 1.0}})["bind"] == {0.01: 2.0,
                                                                                          float("inf"): 3.0}


def _pod(name: str, node: str, size: int, gpus: str | None = None) -> dict:
    annotations = {} if gpus is None else {"gpu-topology.io/gpus": gpus}
    return {"metadata": {"name": name, "annotations": annotations},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(size)}}}]}}


def test_gpus_given_twice_and_nodes_over_count_are_found() -> None:
    pods = [_pod("a", "n1", 2, "G0,G1"), _pod("b", "n1", 1, "G1"), _pod("c", "n2", 2, "G0"),
            _pod("d", "n3", 8, "H0,H1,H2,H3,H4,H5,H6,H7"), _pod("e", "n3", 1, "H8")]
    twice, over = throughput.check_gpus(pods, exact=True)
    assert twice == ["G1 on n1: a and b", "c holds ['G0'] for 2 GPUs"]
    assert over == ["n3: 9 GPUs"]
    assert throughput.check_gpus([_pod("a", "n1", 8), _pod("b", "n2", 8)], exact=False) == ([], [])


def test_the_three_configurations_differ_only_as_described(tmp_path: Path) -> None:
    bench = object.__new__(throughput.Bench)
    bench.args = throughput.parse_args([])
    bench.scheduler_kubeconfig = tmp_path / "scheduler.kubeconfig"
    bench.pki = Pki(tmp_path)
    ours = bench.scheduler_config("extender", "https://127.0.0.1:8443")
    slow = bench.scheduler_config("alone-qps50", None)
    fast = bench.scheduler_config("alone-qps5000", None)
    assert ours["extenders"][0]["urlPrefix"] == "https://127.0.0.1:8443"
    assert "extenders" not in slow and "extenders" not in fast
    assert ours["profiles"] == slow["profiles"] == fast["profiles"]  # the same percentageOfNodesToScore and plugins
    assert "qps" not in slow["clientConnection"]
    assert fast["clientConnection"]["qps"] == fast["clientConnection"]["burst"] == throughput.FAST_QPS
    assert ours["clientConnection"]["kubeconfig"] == str(bench.scheduler_kubeconfig)
    assert (ours["clientConnection"]["qps"], ours["clientConnection"]["burst"]) == (300, 600)  # as shipped


def test_percentage_sets_every_configurations_profiles_alike(tmp_path: Path) -> None:
    bench = object.__new__(throughput.Bench)
    bench.args = throughput.parse_args(["--percentage", "0", "--configs", "extender,alone-qps50"])
    bench.scheduler_kubeconfig = tmp_path / "scheduler.kubeconfig"
    bench.pki = Pki(tmp_path)
    assert bench.args.configs == ("alone-qps50", "extender")
    for config in bench.args.configs:
        profiles = bench.scheduler_config(config, "https://127.0.0.1:8443")["profiles"]
        assert [profile["percentageOfNodesToScore"] for profile in profiles] == [0] * len(profiles)


def test_without_binaries_it_says_it_did_not_run_and_exits_2() -> None:
    done = subprocess.run([sys.executable, str(LOADTESTS / "scheduler_throughput.py")], cwd=ROOT,
                          env={"PATH": "/nonexistent"}, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("scheduler_throughput: not run: KUBE_BIN_DIR is not set")


def test_a_profile_runs_a_whole_round_by_default_and_its_length_is_bounded() -> None:
    assert throughput.parse_args(["--pprof", "p"]).pprof_seconds == throughput.PPROF_SECONDS
    assert throughput.parse_args(["--pprof-seconds", "600"]).pprof_seconds == 600
    for wrong in ("0", "601"):
        with pytest.raises(SystemExit):
            throughput.parse_args(["--pprof-seconds", wrong])


def test_the_null_extender_runs_only_when_its_binary_is_given() -> None:
    assert throughput.parse_args([]).configs == ("alone-qps50", "alone-qps5000", "extender")
    assert throughput.parse_args(["--null-extender", sys.executable]).configs == throughput.CONFIGS
    assert throughput.parse_args(["--null-extender", sys.executable, "--configs", "null-extender,alone-qps5000"]
                                 ).configs == ("alone-qps5000", "null-extender")
    for wrong in (["--configs", "null-extender"], ["--null-extender", str(ROOT / "README.md")],
                  ["--null-extender", str(ROOT)]):
        with pytest.raises(SystemExit):
            throughput.parse_args(wrong)


def _round(config: str, rate: float, cpu: dict[str, float], connections: float = 0.0, bound: int = 1001,
           errors: tuple[str, ...] = ()) -> throughput.RoundResult:
    """A round of 1,001 pods, `bound` of them bound over 1,000 / rate seconds, with `cpu` ms per pod of each role
    (so many CPU seconds over the 1,000 pods after the first), and its bind p99 at 10 ms."""
    window = 1000 / rate
    return throughput.RoundResult(
        config, 0, 1001, bound, throughput.Snapshot(0.0, dict.fromkeys(cpu, 0.0)),
        throughput.Snapshot(window, dict(cpu)), window, {"bind": {0.01: 1001.0, float("inf"): 1001.0}}, {}, [], [],
        bound, [], "300", connections, [], (0.0, 0.0), list(errors))


def test_connections_per_pod_are_shown_for_both_extenders_and_not_for_kube_scheduler_alone() -> None:
    rows = throughput.tables([_round("alone-qps5000", 300.0, {"kube-scheduler": 3.0}),
                              _round("extender", 180.0, {"kube-scheduler": 4.5}, connections=200.0),
                              _round("null-extender", 190.0, {"kube-scheduler": 4.4}, connections=300.3)])
    connections = {row.split(" | ")[0].strip("| "): row.split(" | ")[-2] for row in rows[2:5]}
    assert connections == {"alone-qps5000": "-", "extender": "0.20", "null-extender": "0.30"}


def test_a_ratio_just_over_its_line_reads_as_over_it() -> None:
    results = [_round("alone-qps5000", 300.0, {"kube-scheduler": 3.0}),
               _round("extender", 179.0, {"kube-scheduler": 3.903, "extender": 1.4})]
    table = throughput.ratios(results)
    assert "| pods/s with the extender >= 0.6x alone at qps 5000 | 0.597x | **no** |" in table
    assert ("| kube-scheduler CPU per pod with the extender <= 1.3x alone (qps 5000, same profile) | 1.301x | **no** |"
            in table)


def test_the_floor_compares_both_extenders_with_kube_scheduler_alone() -> None:
    results = [_round("alone-qps5000", 300.0, {"kube-scheduler": 3.0}),
               _round("extender", 180.0, {"kube-scheduler": 4.5, "extender": 1.5}),
               _round("null-extender", 150.0, {"kube-scheduler": 4.8, "extender": 1.0})]
    assert throughput.floor(results) == [
        "| against kube-scheduler alone at qps 5000 | extender | null-extender |", "|---|---:|---:|",
        "| pods/s | 0.60x | 0.50x |", "| kube-scheduler CPU per pod | 1.50x | 1.60x |",
        "| the extender's own CPU, ms per pod | 1.50 | 1.00 |"]
    assert throughput.floor(results[:2]) == []


def _met() -> list[throughput.RoundResult]:
    return [_round("alone-qps5000", 300.0, {"kube-scheduler": 3.0}),
            _round("extender", 200.0, {"kube-scheduler": 3.6, "extender": 1.4})]


def test_a_run_meeting_every_target_passes_and_each_miss_fails_it() -> None:
    assert throughput.missed(throughput.checks(_met())) == []
    cpu = {"kube-scheduler": 3.6, "extender": 1.4}
    misses = {
        "extender CPU <= 1.5 ms per pod: 1.60 ms": _round("extender", 200.0, {**cpu, "extender": 1.6}),
        "every pod bound in every round: extender round 0 1000/1001": _round("extender", 200.0, cpu, bound=1000),
        "no error in the extender's log: 1 lines": _round(
            "extender", 200.0, cpu, errors=("2026-01-01 00:00:00,000 ERROR x: prioritize failed",))}
    for miss, extender in misses.items():
        assert throughput.missed(throughput.checks([_met()[0], extender])) == [miss]
    over = _met()
    over[0].overcommitted.append("n3: 9 GPUs")  # kube-scheduler alone: checked too
    assert throughput.missed(throughput.checks(over)) == [
        "no GPU given twice, no node over its GPUs, in any round: 1 found"]


def test_a_run_that_cannot_judge_issue_18_fails() -> None:
    alone = [_round("alone-qps50", 100.0, {"kube-scheduler": 3.0}), _round("alone-qps5000", 300.0,
                                                                            {"kube-scheduler": 3.0})]
    assert throughput.missed(throughput.checks(alone)) == [
        "issue 18's targets: not measured: they need an extender and an alone-qps5000 round"]


def test_the_extenders_errors_are_read_from_its_log_round_by_round(tmp_path: Path) -> None:
    log = tmp_path / "extender.log"
    tail = throughput.LogTail(log)
    assert tail.new_lines() == []
    log.write_text("2026-01-01 00:00:00,000 ERROR extender.server.app: filter failed\n")
    tail = throughput.LogTail(log)  # the next round's: what came before is not its
    with log.open("a") as sink:
        sink.write("2026-01-01 00:00:01,000 WARNING extender.x: slow\n"
                   "2026-01-01 00:00:02,000 ERROR extender.server.app: prioritize failed\nTraceback (most recent)\n")
    assert [line for line in tail.new_lines() if throughput.EXTENDER_ERROR.match(line)] == [
        "2026-01-01 00:00:02,000 ERROR extender.server.app: prioritize failed"]
