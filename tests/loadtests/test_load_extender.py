"""What loadtests/load_extender.py judges without a load run: the pod that asks no GPU, the verdict and report of
the DRA phases read from a result, every target and error answer that makes the run exit 1 (only bound cycles
count), the client reading an extender's error answers, and one tiny run whose injected miss exits 1."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest import StubServer

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import large_cluster_server as load  # noqa: E402
import load_extender  # noqa: E402

from extender.api.wire import ExtenderArgs  # noqa: E402


def test_a_pod_that_asks_no_gpu_passes_every_node() -> None:
    service, _, _, _ = load.build(20, 0.45, 4, seed=1, dra_share=0.5)
    pod = load_extender.no_gpu_pod(0)
    request = service.pod_request(pod)
    assert (request.gpus, request.request, request.problem) == (0, None, None)
    names = load.node_names(20)
    assert service.filter(ExtenderArgs(pod, names, None)).passed == names


def _samples(server_ms: float, count: int = 100) -> dict:
    """A side's samples: every request of each verb took `server_ms` on the server, 0.3 ms more over HTTP."""
    return {"server_ms": {verb: [server_ms] * count for verb in load_extender.VERBS},
            "http_ns": {verb: [int((server_ms + 0.3) * 1e6)] * count for verb in load_extender.VERBS},
            "floor_ns": {verb: [] for verb in load_extender.VERBS[:2]}}


def _comparison(dra_p99_ms: float) -> load_extender.DraComparison:
    usage = {"extender": 0.0, "dra": 0.0, "floor": 0.0, "client": 0.0, "machine_busy": 0.0}
    stats = {"dra_claims": 10}
    data = {"size": 5000, "samples": {"without": _samples(0.5), "with": _samples(dra_p99_ms)},
            "outcomes": {"without": {"bound": 100}, "with": {"bound": 40, "bound to a DRA node": 60}},
            "passed": {"without": [4000], "with": [3000]}, "rounds": [{"without": {"filter": 0.5, "prioritize": 0.5},
                                                                        "with": {"filter": 0.6, "prioritize": 0.6}}],
            "round": 50, "warmup": 50, "seconds": 1.0, "usage": [usage, {**usage, "extender": 0.2, "dra": 0.3}],
            "before": {"with": stats}, "after": {"with": stats}, "errors": []}
    routed = {"size": 5000, "pods": 100, "warmup": 50, "samples": {"no GPU": _samples(0.2), "GPU": _samples(0.8)},
              "cpu_ns": {"no GPU": 30_000_000, "GPU": 90_000_000}, "passed": {"no GPU": 500_000, "GPU": 300_000},
              "ratios": [0.3, 0.35]}
    facts = {"distinct_node_keys": 76, "nodes": 5000}
    return load_extender.DraComparison(data, facts, {**facts, "dra_nodes": 2500, "dra_share": 0.5, "dra_claims": 9,
                                                     "distinct_node_keys": 2600}, routed)


def test_the_dra_phase_misses_when_a_verb_p99_with_dra_nodes_passes_one_millisecond() -> None:
    assert all(check.met for check in _comparison(0.9).checks())
    missed = _comparison(1.2)
    assert [check.met for check in missed.checks()] == [False, False]
    assert all("**missed**" in check.row() for check in missed.checks())
    section, routing = missed.sections()
    assert "| filter | 100 / 100 | 0.500 / 1.200 | 2.40x |" in section and "60 bound to a DRA node" in section
    assert "| asks no GPU | 0.300 |" in routing and "| ratio, no GPU over GPU | 0.33x | 0.25x / 0.25x |" in routing


def _run(server_ms: float, floor_ms: float, seconds: float, outcomes: dict[str, int], extender_cpu_s: float) -> dict:
    """A latency point or sustained run: `server_ms` per verb on the server, 0.3 ms more over HTTP, `floor_ms` at
    the floor; the extender process used `extender_cpu_s` over it."""
    usage = {"extender": 0.0, "extender_loop": 0.0, "floor": 0.0, "client": 0.0, "machine_busy": 0.0,
             "machine_steal": 0.0}
    return {**_samples(server_ms), "floor_ns": {verb: [int(floor_ms * 1e6)] * 100 for verb in load_extender.VERBS[:2]},
            "outcomes": outcomes, "seconds": seconds,
            "usage": [usage, {**usage, "extender": extender_cpu_s, "machine_busy": extender_cpu_s}],
            "stats": [{"api_calls": 0, "api_seconds": 0.0, "pending_created": 0, "pods_ended": 0, "gc": []}] * 2}


def _report(server_ms: float = 0.5, floor_ms: float = 0.6, outcomes: dict[str, int] | None = None,
            **result: Any) -> load_extender.Report:
    """A run at 5,000 names that meets every target of load_extender (4,000 cycles bound in 10 s, 2 ms of the
    extender's CPU each), but for what the arguments change."""
    outcomes = {"bound": 4000} if outcomes is None else outcomes
    point = _run(server_ms, floor_ms, 10.0, outcomes, 8.0)
    found = {"latency": {"5000": point}, "sustained": {"5000": point}, "errors": [], "error_count": 0,
             "errors_logged": {"extender": 0}, **result}
    return load_extender.Report(None, found, {"nodes": 5000}, None)  # type: ignore[arg-type]


def test_a_run_that_meets_every_target_passes_and_each_miss_fails_it() -> None:
    assert _report().missed() == []
    assert load_extender.verdict("load_extender", _report().missed()) == 0
    for report, miss in ((_report(server_ms=1.2), "filter: server-side p99 <= 1 ms: 1.200 ms"),
                         (_report(floor_ms=0.5), "filter: HTTP p99 <= 1.5x the floor's: 1.60x"),
                         (_report(outcomes={"bound": 2000}), ">= 300 cycles/s (filter + prioritize + bind, bound), "
                                                             "sustained: 200 cycles/s"),
                         (_report(error_count=1), "no error answer (filter, PreBind, bind) and no error logged by an "
                                                  "extender: 1 error answers, 0 errors logged"),
                         (_report(errors_logged={"extender": 0, "dra": 2}), "2 errors logged")):
        assert any(miss in found for found in report.missed()), report.missed()
        assert load_extender.verdict("load_extender", report.missed()) == 1


def test_only_bound_cycles_count_as_cycles() -> None:
    """The issue's run: every bind failed, and 2,503 cycles in 10 s counted as 250 cycles/s and 'met'."""
    report = _report(outcomes={"bind-error": 2503}, error_count=2503)
    rows = {check.target: check for check in report.checks()}
    sustained = rows[">= 300 cycles/s (filter + prioritize + bind, bound), sustained"]
    per_cpu = rows["the same, per CPU-second of the extender process (one core of its own)"]
    assert (sustained.measured, sustained.met) == ("0 cycles/s", False)
    assert (per_cpu.measured, per_cpu.met) == ("0 cycles/s", False)
    assert "| 2503 (0 / 0 / 2503) | 0 |" in report.sustained_table()


def test_a_target_not_measured_is_missed() -> None:
    report = _report()
    del report.latency[5000]
    assert [check.measured for check in report.checks()[:4]] == ["not measured"] * 4
    assert len(report.missed()) == 4


def _client(port: int) -> load_extender.Client:
    client = load_extender.Client(port, None, 20)
    return client


def test_the_client_reads_filter_errors_and_failed_binds(stub_server: StubServer) -> None:
    names = load.node_names(20)
    refused = _client(stub_server({"/filter": {"NodeNames": None, "FailedNodes": {}, "Error": "internal error"}}))
    cycle = refused.cycle(names, load_extender.orjson.dumps(names), None)
    assert (cycle.outcome, refused.errors, refused.error_count) == ("filter-error", ["filter: internal error"], 1)
    answers = {"/filter": {"NodeNames": names, "FailedNodes": {}, "Error": ""}, "/prioritize": [],
               "/bind": {"Error": "the ledger refused"}}
    failing = _client(stub_server(answers))
    cycle = failing.cycle(names, load_extender.orjson.dumps(names), None)
    assert (cycle.outcome, failing.errors) == ("bind-error", ["bind: the ledger refused"])
    answers["/bind"] = {"Error": ""}
    bound = _client(stub_server(answers))
    assert bound.cycle(names, load_extender.orjson.dumps(names), None).outcome == "bound"
    assert bound.error_count == 0


def test_a_tiny_run_exits_1_on_an_injected_miss(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """The whole run, servers and load generator, on 200 nodes with its targets judged at 100 names: a server p99
    target of 1 us is missed, and the run says so and exits 1."""
    monkeypatch.setattr(load_extender, "TARGET_NAMES", 100)
    monkeypatch.setattr(load_extender, "SERVER_P99_TARGET_MS", 0.001)
    monkeypatch.setattr(load_extender, "FLOOR_RATIO_TARGET", 1e9)
    monkeypatch.setattr(load_extender, "CYCLES_TARGET", 1.0)
    code = load_extender.main(["--nodes", "200", "--sizes", "100", "--samples", "20", "--warmup", "5",
                               "--sustain-sizes", "100", "--sustain-seconds", "1", "--profile-seconds", "0",
                               "--plans", "0", "--dra-share", "0"])
    err = capsys.readouterr().err
    assert code == 1
    assert "load_extender: missed: filter: server-side p99 <= 0.001 ms" in err
    assert "error answer" not in err and "cycles/s" not in err  # the rest was met: only the injected miss


def test_a_profile_with_nothing_on_the_verbs_thread_writes_no_empty_table() -> None:
    rows = [{"function": "verbs/filter.py:1 filter_nodes", "calls": 10, "own": 0.01, "cumulative": 0.02}]
    report = _report(profile={"size": 5000, "cycles": 10, "rows": rows, "verbs": []})
    table = report.profile_table()
    assert "| `verbs/filter.py:1 filter_nodes` | 1 | 1.000 | 2.000 |" in table
    assert "| function (filter and prioritize)" not in table
    assert "No call of filter and prioritize was profiled on its thread in these cycles" in table
