"""Policy (5), the real extender app over HTTP, makes policy (4)'s decisions pod for pod (issue 10, item 4)."""

from __future__ import annotations

import random

import pytest

from loadtests.replay.clusters import mixed_fleet
from loadtests.replay.engine import replay
from loadtests.replay.http_check import compare, http_check, policy_over_http
from loadtests.replay.model import Job
from loadtests.replay.policies import ExtenderPolicy

NODES = mixed_fleet(1)  # one board of each bundled platform: DGX H100, DGX A100, DGX-1 V100, A6000, L40S, tree
POOLS = (None, *sorted({node.gpu_model for node in NODES}))


def _jobs(count: int, seed: int) -> tuple[Job, ...]:
    """A busy mix: pods select a pool or none, and run long enough that many wait for a departure."""
    rng = random.Random(seed)
    jobs, submit = [], 0.0
    for index in range(count):
        submit += rng.expovariate(1.0)
        jobs.append(Job(f"j{index:03d}", submit, rng.uniform(20.0, 200.0), rng.choice((1, 1, 1, 2, 2, 4, 8)),
                        rng.choice(POOLS)))
    return tuple(jobs)


def test_over_http_the_decisions_are_the_in_process_ones() -> None:
    check = http_check(NODES, _jobs(150, seed=3), seed=5, sample=120)
    assert check.mismatches == ()
    assert check.jobs == 120 and check.placed == 120
    # The sample exercised what could differ: multi-GPU rings, pods retried after departures, and drains for
    # pods waiting for a full set (state the HTTP server keeps between requests, on the replay's clock).
    assert check.multi_gpu_placed > 40 and check.waited > 40 and check.drained > 0, check.summary()


def test_the_comparison_sees_other_gpus_chosen() -> None:
    """Against policy (3), whose GPUs the stock device plugin picks, the HTTP run differs on some pods."""
    jobs = _jobs(60, seed=4)
    with policy_over_http(NODES) as policy:
        over_http = replay(NODES, jobs, policy, seed=1)
    scheduling_only = replay(NODES, jobs, ExtenderPolicy("(3)", NODES, delivery=False), seed=1)
    mismatches = compare(scheduling_only.outcomes, over_http.outcomes)
    assert mismatches
    assert all(m.in_process.placement != m.over_http.placement or m.in_process.placed_s != m.over_http.placed_s
               for m in mismatches)


def test_an_empty_sample_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one job"):
        http_check(NODES, _jobs(5, seed=1), seed=1, sample=0)
