"""The replay's policies on real platforms: go-gpuallocator's published picks for (1), kube-scheduler's spreading
and packing, our extender in-process choosing nodes (3) and delivering GPUs (4), and determinism per seed."""

from __future__ import annotations

import random

import pytest

from loadtests.gpuallocator_baseline import PCIE_LINK_SCORE, pcie_level
from loadtests.replay.clusters import mixed_fleet
from loadtests.replay.engine import replay
from loadtests.replay.kube_scores import DEFAULT, GPU_PACKING
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.device_plugin import gpuallocator
from loadtests.replay.policies import ExtenderPolicy, StockPolicy, standard_policies
from topology.compiled import compile_topology
from topology.platforms import PLATFORMS
from topology.select import ring_gbps

INF = float("inf")
DGX1 = ClusterNode("dgx1-a", "dgx1-v100", "V100")
H100 = ClusterNode("h100-a", "dgx-h100", "H100")


def _placements(nodes: list[ClusterNode], jobs: list[Job], policy,
                seed: int = 1) -> list[tuple[str, tuple[int, ...]] | None]:
    run = replay(nodes, jobs, policy, seed)
    return [None if o.placement is None else (o.placement.node, o.placement.gpus) for o in run.outcomes]


@pytest.mark.parametrize(("size", "expected"), [
    (2, [(0, 3), (1, 2), (4, 7), (5, 6)]),
    (4, [(0, 1, 2, 3), (4, 5, 6, 7)]),
    (1, [(gpu,) for gpu in range(8)]),
])
def test_quantity_only_reproduces_go_gpuallocator_on_the_dgx1(size: int, expected: list[tuple[int, ...]]) -> None:
    jobs = [Job(f"p{i}", i, INF, size) for i in range(len(expected) + 1)]
    got = _placements([DGX1], jobs, StockPolicy("quantity", DEFAULT))
    assert got == [("dgx1-a", gpus) for gpus in expected] + [None]


def test_quantity_only_is_blind_to_the_nvswitch_of_a_dgx_h100() -> None:
    topology = PLATFORMS["dgx-h100"].topology()
    assert topology.nvswitch and all(topology.nvlink_count(i, j) == 18 for i, j in topology.pairs())
    scores = gpuallocator(("dgx-h100", tuple(range(8)))).scores
    # Eighteen NVLinks on every pair, and the pair scores hold only the PCIe term: NODE within a socket, SYS across.
    assert all(scores[i][j] == PCIE_LINK_SCORE[pcie_level(topology, i, j)] for i, j in topology.pairs())
    got = _placements([H100], [Job(f"p{i}", i, INF, 2) for i in range(4)], StockPolicy("quantity", DEFAULT))
    assert [gpus for _, gpus in got] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_defaults_spread_and_gpu_packing_packs() -> None:
    nodes = [ClusterNode(f"h100-{i}", "dgx-h100", "H100") for i in range(3)]
    jobs = [Job(f"p{i}", i, INF, 1) for i in range(3)]
    spread = _placements(nodes, jobs, StockPolicy("quantity", DEFAULT))
    packed = _placements(nodes, jobs, StockPolicy("packing", GPU_PACKING))
    assert len({node for node, _ in spread}) == 3
    assert len({node for node, _ in packed}) == 1 and [gpus for _, gpus in packed] == [(0,), (1,), (2,)]


def test_ours_with_delivery_keeps_nvlink_pairs_whole_where_quantity_only_breaks_them() -> None:
    """A6000 bridge pairs (0,1), (2,3), ...: with GPU 2 alone busy, a 1-GPU pod takes the stock plugin's first
    free GPU 0 and breaks a pair; ours takes 3, beside the busy one, so three 2-GPU pods all get bridged pairs."""
    node = ClusterNode("a6000-a", "rtx-a6000-pairs", "A6000")
    topology = PLATFORMS["rtx-a6000-pairs"].topology()
    compiled = compile_topology(topology)
    assert [pair for pair in topology.pairs() if topology.nvlink_count(*pair)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    jobs = [Job("s0", 0, 10, 1), Job("s1", 1, 9, 1), Job("s2", 2, INF, 1), Job("s3", 3, 7, 1),
            Job("x", 11, INF, 1), Job("y1", 12, INF, 2), Job("y2", 13, INF, 2), Job("y3", 14, INF, 2)]
    bridged = ring_gbps(compiled, (0, 1))
    ours = _placements([node], jobs, ExtenderPolicy("ours", [node], delivery=True))
    stock = _placements([node], jobs, StockPolicy("quantity", DEFAULT))
    assert ours[4] == ("a6000-a", (3,)) and stock[4] == ("a6000-a", (0,))
    assert [ring_gbps(compiled, gpus) == bridged for _, gpus in ours[5:]] == [True, True, True]
    assert [ring_gbps(compiled, gpus) == bridged for _, gpus in stock[5:]] == [True, True, False]


def test_scheduling_only_gets_the_stock_plugins_gpus_and_its_ledger_follows_them() -> None:
    """(3): the node is ours, the GPUs the device plugin's; a long run with departures never double-books a GPU
    (the engine refuses that), so the extender's ledger follows what the kubelet allocated."""
    nodes = [ClusterNode(f"dgx1-{i}", "dgx1-v100", "V100") for i in range(2)]
    rng = random.Random(3)
    jobs = [Job(f"j{i}", i * 2.0, rng.uniform(5, 30), rng.choice((1, 1, 2, 4))) for i in range(120)]
    policy = ExtenderPolicy("scheduling only", nodes, delivery=False)
    run = replay(nodes, jobs, policy, 1)
    placed = [o for o in run.outcomes if o.placement is not None]
    assert len(placed) > 100
    first = next(o for o in placed if o.job.gpus == 1)
    assert first.placement.gpus == (0,)  # the stock plugin's first free GPU
    mismatches = [sample.value for metric in policy.service.metrics.mismatches.collect()
                  for sample in metric.samples if sample.name.endswith("_total")]
    assert sum(mismatches) > 0  # the kubelet gave other GPUs than bound, and the extender counted it


def test_every_policy_is_deterministic_per_seed() -> None:
    nodes = [ClusterNode(f"{platform}-{i}", platform, platform)
             for platform in ("dgx1-v100", "rtx-a6000-pairs", "pcie-l40s") for i in range(2)]
    rng = random.Random(11)
    jobs = [Job(f"j{i}", i * 1.5, rng.uniform(5, 60), rng.choice((1, 1, 2, 4, 8)),
                rng.choice(("dgx1-v100", "rtx-a6000-pairs", "pcie-l40s"))) for i in range(150)]
    runs = [[replay(nodes, jobs, policy, 7).outcomes for policy in standard_policies(nodes)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_a_node_with_part_of_a_board_installed_is_that_part_for_every_policy() -> None:
    """A 4x V100 node is GPUs 0-3 of the DGX-1V: four GPUs for the engine, the stock plugin and the extender;
    an 8-GPU pod never fits, and 2-GPU pods get its NV2 pairs (0,3) and (1,2) from go-gpuallocator."""
    quad = ClusterNode("v100-quad", "dgx1-v100", "V100", (0, 1, 2, 3))
    jobs = [Job("eight", 0, INF, 8), Job("two-a", 1, INF, 2), Job("two-b", 2, INF, 2), Job("two-c", 3, INF, 2)]
    stock = _placements([quad], jobs, StockPolicy("quantity", DEFAULT))
    assert stock == [None, ("v100-quad", (0, 3)), ("v100-quad", (1, 2)), None]
    ours = ExtenderPolicy("ours", [quad], delivery=True)
    got = _placements([quad], jobs, ours)
    assert got[0] is None and got[3] is None and sorted(got[1][1] + got[2][1]) == [0, 1, 2, 3]
    assert ours.cluster.topologies["v100-quad"].size == 4


def test_one_best_places_every_pod_where_the_shortlist_does_run_for_run() -> None:
    """With one-best (the shipped default) the extender takes the one draw among equal best nodes that
    kube-scheduler's selectHost would make, from the same generator (kube_scores.tie_index): on a fleet of twin
    boards, where ties are the rule, every pod lands on the same node with the same GPUs as with the shortlist."""
    nodes = mixed_fleet(2)
    rng = random.Random(7)
    jobs, submit = [], 0.0
    for index in range(300):
        submit += rng.expovariate(2.0)
        jobs.append(Job(f"j{index:03d}", submit, rng.uniform(20.0, 120.0), rng.choice((1, 1, 1, 2, 2, 4, 8))))
    one_best = ExtenderPolicy("one-best", nodes, delivery=True)
    passes: list[int] = []
    real_filter = one_best.service.filter

    def counted_filter(args, compute=True):
        outcome = real_filter(args, compute)
        passes.append(len(outcome.passed))
        return outcome

    one_best.service.filter = counted_filter
    got = _placements(nodes, jobs, one_best, seed=3)
    assert got == _placements(nodes, jobs, ExtenderPolicy("shortlist", nodes, delivery=True, one_best=False), seed=3)
    assert None not in got
    assert passes.count(1) > 200, "one-best passed one node to most pods"
