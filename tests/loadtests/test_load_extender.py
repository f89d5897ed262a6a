"""What loadtests/load_extender.py adds for DRA (issue 30) without a load run: the pod that asks no GPU, and the
verdict and report of the DRA phases read from a result."""

from __future__ import annotations

import sys

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
            "before": {"with": stats}, "after": {"with": stats}, "bind_errors": []}
    routed = {"size": 5000, "pods": 100, "warmup": 50, "samples": {"no GPU": _samples(0.2), "GPU": _samples(0.8)},
              "cpu_ns": {"no GPU": 30_000_000, "GPU": 90_000_000}, "passed": {"no GPU": 500_000, "GPU": 300_000},
              "ratios": [0.3, 0.35]}
    facts = {"distinct_node_keys": 76, "nodes": 5000}
    return load_extender.DraComparison(data, facts, {**facts, "dra_nodes": 2500, "dra_share": 0.5, "dra_claims": 9,
                                                     "distinct_node_keys": 2600}, routed)


def test_the_dra_phase_misses_when_a_verb_p99_with_dra_nodes_passes_one_millisecond() -> None:
    assert _comparison(0.9).missed() == []
    missed = _comparison(1.2)
    assert missed.missed() == ["filter", "prioritize"]
    assert all("**missed**" in row for row in missed.target_rows())
    section, routing = missed.sections()
    assert "| filter | 100 / 100 | 0.500 / 1.200 | 2.40x |" in section and "60 bound to a DRA node" in section
    assert "| asks no GPU | 0.300 |" in routing and "| ratio, no GPU over GPU | 0.33x | 0.25x / 0.25x |" in routing
