"""loadtests/hostile_node.py exits 1 when an answer takes kube-scheduler's timeout or is an error: the client reads
filter's Error and the errors the extender logged (against a stub extender, no load run)."""

from __future__ import annotations

import argparse
import sys

from conftest import StubServer

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import hostile_node  # noqa: E402
from load_extender import Samples  # noqa: E402

STATS = {"errors_logged": 0}


def _run(measured: hostile_node.Measured, shape: str = "circulant-40") -> hostile_node.Run:
    return hostile_node.Run(shape, True, "", 40, 14525, measured, 3)


def _fast() -> hostile_node.Measured:
    samples = Samples()
    for verb in ("filter", "prioritize"):
        samples.http_ns[verb] = [2_000_000] * 3
        samples.server_ms[verb] = [1.5] * 3
    return hostile_node.Measured(samples, 2, [], 0)


def test_a_fast_run_without_errors_passes_and_a_slow_one_fails() -> None:
    refused = hostile_node.Run("bipartite-20x20", False, "too many NVLinks")
    assert hostile_node.missed(hostile_node.checks([_run(_fast()), refused])) == []
    slow = _fast()
    slow.samples.http_ns["prioritize"].append(3_000_000_000)
    assert hostile_node.missed(hostile_node.checks([_run(_fast()), _run(slow)])) == [
        "slowest answer over HTTP < kube-scheduler's 3000 ms: 3000.0 ms"]


def test_filter_errors_are_read_and_fail_the_run(stub_server: StubServer) -> None:
    """The issue's mutant: filter made to raise for the hostile node answered fast, with an Error, and passed."""
    port = stub_server({"/filter": {"NodeNames": None, "FailedNodes": {}, "Error": "internal error in filter"},
                        "/loadtest/hostile-rotate": {"free": 3}, "/loadtest/stats": STATS})
    measured = hostile_node.measure(port, 3, with_hostile=True)
    assert (measured.errors, measured.hostile_passed, measured.logged) == (["internal error in filter"] * 3, 0, 0)
    runs = [_run(_fast(), "(no hostile node)"), _run(measured)]
    assert hostile_node.missed(hostile_node.checks(runs)) == [
        "no error answer (filter's Error) and no error logged by the extender: 3 error answers, 0 errors logged"]
    text = hostile_node.render(argparse.Namespace(cycles=3), [], 1.0, runs)
    assert "| 3 / 0 |" in text and "circulant-40: internal error in filter" in text


def test_errors_the_extender_logged_fail_the_run(stub_server: StubServer) -> None:
    """A prioritize that failed answers `[]`: only the extender's log says so."""
    port = stub_server({"/filter": {"NodeNames": ["hostile-0"], "FailedNodes": {}, "Error": ""}, "/prioritize": [],
                        "/loadtest/hostile-rotate": {"free": 3}, "/loadtest/stats": {"errors_logged": 3}})
    measured = hostile_node.measure(port, 3, with_hostile=True)
    assert (measured.errors, measured.hostile_passed, measured.logged) == ([], 3, 3)
    assert hostile_node.verdict("hostile_node", hostile_node.missed(hostile_node.checks([_run(measured)]))) == 1
