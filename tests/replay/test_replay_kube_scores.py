"""kube_scores against cases of kube-scheduler's own tests (noderesources most_allocated_test.go,
least_allocated_test.go, balanced_allocation_test.go): the same inputs give the same integer scores."""

from __future__ import annotations

import random

from loadtests.replay.kube_scores import (DEFAULT, GPU_PACKING, balanced_score, feasible_nodes_to_find, fit_score,
                                          score_gpu_node, select_host, shipped_profile)

CPU_MEM = (("cpu", 1), ("memory", 1))
POD = {"cpu": 3000, "memory": 5000}


def test_most_allocated_matches_upstream_cases() -> None:
    assert fit_score("MostAllocated", CPU_MEM, POD, {}, {"cpu": 4000, "memory": 10000}) == 62
    assert fit_score("MostAllocated", CPU_MEM, POD, {}, {"cpu": 6000, "memory": 10000}) == 50
    assert fit_score("MostAllocated", CPU_MEM, POD, {"cpu": 3000, "memory": 5000},
                     {"cpu": 10000, "memory": 20000}) == 55
    assert fit_score("MostAllocated", (("memory", 2), ("cpu", 1)), POD, {}, {"cpu": 4000, "memory": 10000}) == 58
    # An extended resource the pod does not request is left out; one it requests is scored.
    extended = (("example.com/x", 2), ("cpu", 1), ("memory", 1))
    assert fit_score("MostAllocated", extended, {"cpu": 3000, "memory": 4000}, {},
                     {"cpu": 6000, "memory": 10000, "example.com/x": 4}) == 45
    assert fit_score("MostAllocated", (("cpu", 1), ("memory", 1), ("example.com/x", 1)),
                     {"cpu": 3000, "memory": 5000, "example.com/x": 2}, {},
                     {"cpu": 6000, "memory": 10000, "example.com/x": 10}) == 40


def test_least_allocated_and_balanced_allocation_match_upstream_cases() -> None:
    assert fit_score("LeastAllocated", CPU_MEM, POD, {}, {"cpu": 4000, "memory": 10000}) == 37
    assert fit_score("LeastAllocated", CPU_MEM, POD, {}, {"cpu": 6000, "memory": 10000}) == 50
    assert balanced_score(POD, {}, {"cpu": 4000, "memory": 10000}) == 87  # fractions 0.75 and 0.5
    assert balanced_score(POD, {}, {"cpu": 6000, "memory": 10000}) == 100


def test_gpu_jobs_rank_nodes_by_gpu_share_in_the_strategys_direction() -> None:
    # cpu and memory in proportion to GPUs: BalancedAllocation is even everywhere, the fit is the GPU share.
    assert score_gpu_node(DEFAULT, 1, 0, 8) == 87 + 100 and score_gpu_node(DEFAULT, 1, 6, 8) == 12 + 100
    assert score_gpu_node(GPU_PACKING, 1, 0, 8) == 12 + 100 and score_gpu_node(GPU_PACKING, 1, 6, 8) == 87 + 100


def test_the_shipped_profile_is_read_from_scheduler_config_and_adds_the_extender_times_weight_times_ten() -> None:
    shipped = shipped_profile()
    assert shipped.strategy == "MostAllocated" and not shipped.balanced and shipped.extender_weight is not None
    assert dict(shipped.resources)["nvidia.com/gpu"] > dict(shipped.resources)["cpu"]
    gpu_fit = score_gpu_node(shipped, 1, 3, 8)
    assert score_gpu_node(shipped, 1, 3, 8, 7) == gpu_fit + 7 * shipped.extender_weight * 10


def test_select_host_takes_the_best_and_breaks_ties_by_the_seeded_draw() -> None:
    assert select_host([("a", 5), ("b", 9), ("c", 7)], random.Random(1)) == "b"
    picks = {select_host([("a", 9), ("b", 9), ("c", 1)], random.Random(seed)) for seed in range(20)}
    assert picks == {"a", "b"}


def test_feasible_nodes_to_find_is_kube_schedulers_adaptive_share() -> None:
    assert [feasible_nodes_to_find(0, n) for n in (99, 150, 1213, 5000, 10000)] == [99, 100, 497, 500, 500]
    assert feasible_nodes_to_find(100, 1213) == 1213 and feasible_nodes_to_find(10, 5000) == 500
    # scheduler-config searches kube-scheduler's adaptive share for pods, every node for groups' members
    assert shipped_profile().percentage_of_nodes_to_score == 0
    assert shipped_profile(name="gpu-topology-scheduler-groups").percentage_of_nodes_to_score == 100
