"""The replay engine on real platforms: arrival, waiting, retry order, departures, pools, snapshots, seeds."""

from __future__ import annotations

import random

import pytest

from loadtests.replay.engine import Fleet, Placement, replay
from loadtests.replay.kube_scores import DEFAULT
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.policies import StockPolicy

H100 = ClusterNode("h100-a", "dgx-h100", "H100")
L40S = ClusterNode("l40s-a", "pcie-l40s", "L40S")
INF = float("inf")


def _run(nodes: list[ClusterNode], jobs: list[Job], seed: int = 1):
    return {outcome.job.name: outcome
            for outcome in replay(nodes, jobs, StockPolicy("quantity", DEFAULT), seed).outcomes}


def test_a_waiting_pod_is_placed_when_a_departure_frees_its_gpus_in_arrival_order() -> None:
    jobs = [Job("big", 0, 10, 8), Job("b", 1, 5, 4), Job("c", 2, 5, 4), Job("d", 3, 5, 8)]
    got = _run([H100], jobs)
    assert got["big"].placed_s == 0
    assert got["b"].placed_s == 10 and got["c"].placed_s == 10  # both retried at the departure, b first
    assert set(got["b"].placement.gpus) | set(got["c"].placement.gpus) == set(range(8))
    assert got["d"].placed_s == 15  # it waits for both to leave


def test_a_small_pod_overtakes_a_waiting_big_one() -> None:
    got = _run([H100], [Job("six", 0, 10, 6), Job("four", 1, 5, 4), Job("two", 2, 5, 2)])
    assert got["two"].placed_s == 2 and got["four"].placed_s == 10


def test_departures_come_before_arrivals_at_the_same_instant() -> None:
    got = _run([H100], [Job("first", 0, 5, 8), Job("second", 5, 5, 8)])
    assert got["second"].placed_s == 5


def test_pods_that_never_leave_fill_the_node_and_the_rest_is_never_placed() -> None:
    got = _run([H100], [Job(f"p{i}", i, INF, 2) for i in range(6)])
    assert [got[f"p{i}"].placed_s for i in range(6)] == [0, 1, 2, 3, None, None]
    assert got["p5"].placement is None


def test_node_selectors_keep_pods_in_their_pool() -> None:
    jobs = [Job(f"h{i}", i, INF, 1, "H100") for i in range(3)] + [Job("l", 3, INF, 1, "L40S"),
                                                                  Job("nowhere", 4, INF, 1, "A100")]
    got = _run([H100, L40S], jobs)
    assert {got[f"h{i}"].placement.node for i in range(3)} == {"h100-a"}
    assert got["l"].placement.node == "l40s-a"
    assert got["nowhere"].placement is None


def test_snapshots_hold_the_free_gpus_at_each_sample() -> None:
    run = replay([H100], [Job("a", 0, 50, 8), Job("b", 100, 10, 1)], StockPolicy("quantity", DEFAULT), 1, samples=4)
    assert [(s.time_s, s.free) for s in run.snapshots] == [(0, (0,)), (25, (0,)), (50, (0xFF,)), (75, (0xFF,)),
                                                           (100, (0xFE,))]


def test_the_same_seed_gives_the_same_run_and_seeds_break_ties_differently() -> None:
    nodes = [ClusterNode(f"h100-{i}", "dgx-h100", "H100") for i in range(6)]
    rng = random.Random(5)
    jobs = [Job(f"j{i}", i * 3.0, rng.uniform(5, 40), rng.choice((1, 2, 4))) for i in range(80)]
    first, again, other = (replay(nodes, jobs, StockPolicy("quantity", DEFAULT), seed) for seed in (1, 1, 2))
    assert first.outcomes == again.outcomes
    assert [o.placement for o in first.outcomes] != [o.placement for o in other.outcomes]


def test_bad_workloads_are_refused() -> None:
    with pytest.raises(ValueError, match="sorted"):
        _run([H100], [Job("late", 5, 1, 1), Job("early", 1, 1, 1)])
    with pytest.raises(ValueError, match="unique"):
        _run([H100], [Job("same", 1, 1, 1), Job("same", 2, 1, 1)])


def test_the_fleet_refuses_a_gpu_taken_twice() -> None:
    fleet = Fleet([H100])
    fleet.take(Placement("h100-a", (0, 1)))
    with pytest.raises(ValueError, match="not free"):
        fleet.take(Placement("h100-a", (1, 2)))
    assert fleet.free_count["h100-a"] == 6


def test_the_filter_pass_stops_at_the_limit_and_the_next_pass_starts_where_it_stopped() -> None:
    nodes = [ClusterNode(f"n{i}", "dgx-h100", "H100" if i % 2 else "A100") for i in range(10)]
    fleet = Fleet(nodes)
    found, start = fleet.find_feasible(Job("p", 0, 1, 1, "H100"), 3, 8)
    assert (found, start) == (["n9", "n1", "n3"], 4)  # n8, n0, n2 are another pool
    found, start = fleet.find_feasible(Job("q", 0, 1, 1, "H100"), 100, start)
    assert (found, start) == (["n5", "n7", "n9", "n1", "n3"], 4)  # every node processed: the start stays


def test_default_kube_scheduler_scores_only_100_of_150_nodes() -> None:
    nodes = [ClusterNode(f"n{i:03d}", "dgx-h100", "H100") for i in range(150)]
    run = replay(nodes, [Job(f"p{i}", i, INF, 1) for i in range(3)], StockPolicy("quantity", DEFAULT), 1)
    first, second, third = (int(o.placement.node[1:]) for o in run.outcomes)
    assert first < 100 and (second >= 100 or second < 50) and 50 <= third < 150


class _DeclineUntil(StockPolicy):
    """Declines the job `name` (as our extender's filter does within the topology wait) until `until`."""

    def __init__(self, name: str, until: float) -> None:
        super().__init__("declining", DEFAULT)
        self.declined, self.until, self.asked = name, until, []

    def place(self, job: Job, fleet: Fleet, rng: random.Random, now: float) -> Placement | None:
        if job.name == self.declined:
            self.asked.append(now)
            if now < self.until:
                return None
        return super().place(job, fleet, rng, now)


def test_a_declined_pod_is_retried_at_the_next_event_after_its_backoff() -> None:
    """kube-scheduler requeues a pod the extender refused on any cluster event, once its backoff (1 s, doubling,
    at most 10 s) has passed; a pod that merely arrives is no cluster event until it is bound."""
    policy = _DeclineUntil("waits", until=20)
    jobs = [Job("waits", 0, 5, 2), Job("a", 0.5, INF, 1), Job("b", 3, INF, 1), Job("c", 12, INF, 1),
            Job("d", 21, INF, 1)]
    got = {o.job.name: o for o in replay([H100], jobs, policy, 1).outcomes}
    # 0.5: backoff (1 s) not over; 3: due, declined (next 2 s); 12: declined (next 4 s); 21: placed.
    assert policy.asked == [0, 3, 12, 21]
    assert got["waits"].placed_s == 21


def test_after_the_last_event_a_declined_pod_is_still_retried() -> None:
    policy = _DeclineUntil("waits", until=20)
    got = replay([H100], [Job("waits", 0, 5, 2)], policy, 1).outcomes[0]
    assert policy.asked[-1] == got.placed_s and 20 <= got.placed_s <= 30  # backoff at most 10 s
