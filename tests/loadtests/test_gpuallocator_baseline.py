"""The go-gpuallocator baseline behaves as go-gpuallocator does, on the real platforms.

The expected answers on the DGX-1V are go-gpuallocator's own (gpuallocator/besteffort_test.go,
TestBestEffortAllocate and TestBestEffortDGX1Volta*), on our dgx1-v100 capture given NVIDIA's PCIe levels for
the pairs topo -m hides.
"""

from __future__ import annotations

import copy
import sys

import pytest

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

from gpuallocator_baseline import (  # noqa: E402
    DGX1V_HIDDEN_PCIE,
    PCIE_LINK_SCORE,
    BestEffortBaseline,
    PaddingReturned,
    count_combinations,
    count_partitions,
    iterate_partitions,
    pair_score,
    pcie_level,
)
from topology.levels import Level  # noqa: E402
from topology.model import Gpu, NvLinkPair, Topology  # noqa: E402
from topology.platforms import PLATFORMS  # noqa: E402


def _dgx1(hidden: bool = True) -> BestEffortBaseline:
    return BestEffortBaseline(PLATFORMS["dgx1-v100"].topology(), DGX1V_HIDDEN_PCIE if hidden else None)


@pytest.mark.parametrize(("available", "size", "expected"), [
    ((0, 2, 4, 5), 2, (4, 5)),  # single NVLink, prefer same switch
    ((0, 4, 5, 6), 2, (5, 6)),  # single NVLink, prefer same socket
    ((0, 3, 1), 2, (0, 3)),  # prefer dual NVLink, same socket
    ((0, 1, 4), 2, (0, 4)),  # prefer dual NVLink, cross socket
])
def test_dgx1v_policy_cases_of_go_gpuallocator(available: tuple[int, ...], size: int,
                                               expected: tuple[int, ...]) -> None:
    assert _dgx1().allocate(available, size) == expected


@pytest.mark.parametrize(("size", "sequence"), [
    (1, [(0,), (1,), (2,), (3,), (4,), (5,), (6,), (7,)]),
    (2, [(0, 3), (1, 2), (4, 7), (5, 6)]),
    (4, [(0, 1, 2, 3), (4, 5, 6, 7)]),
    (8, [tuple(range(8))]),
])
def test_dgx1v_allocation_sequences_of_go_gpuallocator(size: int, sequence: list[tuple[int, ...]]) -> None:
    baseline, free = _dgx1(), set(range(8))
    for expected in sequence:
        got = baseline.allocate(sorted(free), size)
        assert got == expected
        free -= set(got)
    assert baseline.allocate(sorted(free), size) == ()  # nothing left that fits


@pytest.mark.parametrize("hidden", [True, False])
def test_dgx1v_all_free_pair_is_an_nv2_pair(hidden: bool) -> None:
    topology = PLATFORMS["dgx1-v100"].topology()
    baseline = _dgx1(hidden)
    i, j = baseline.allocate(range(8), 2)
    assert topology.nvlink_count(i, j) == 2
    level = pcie_level(topology, i, j, DGX1V_HIDDEN_PCIE if hidden else None)
    assert baseline.set_score((i, j)) == 200 + PCIE_LINK_SCORE[level]
    # It maximises the partition, not the pair: four NV2 pairs, of which the first.
    assert (i, j) == (0, 3)


def test_nvswitch_board_is_scored_on_pcie_only() -> None:
    topology = PLATFORMS["dgx-a100"].topology()
    assert topology.nvswitch and all(topology.nvlink_count(i, j) == 12 for i, j in topology.pairs())
    for i, j in topology.pairs():
        assert pair_score(topology, i, j) == PCIE_LINK_SCORE[pcie_level(topology, i, j)] < 100
    # The same links seen directly, as on a mesh, would score 100 per link. No real board has 84 direct links a
    # GPU, so the model refuses to build that view: it is made by copying, past the model's checks.
    direct = copy.copy(topology)
    object.__setattr__(direct, "nvswitch", False)
    assert pair_score(direct, 0, 1) == 1200 + PCIE_LINK_SCORE[pcie_level(direct, 0, 1)]
    # Blind to NVLink, it takes a pair inside one NUMA node (NODE beats SYS).
    chosen = BestEffortBaseline(topology).allocate(range(8), 2)
    assert chosen == (0, 1) and topology.gpus[0].numa_node == topology.gpus[1].numa_node


def test_size_one_takes_the_first_available_gpu() -> None:
    baseline = BestEffortBaseline(PLATFORMS["rtx-a6000-pairs"].topology())
    found = baseline.search((5, 2, 7), 1)
    # go-gpuallocator keeps the first of n zero-score single-set partitions: no topology at all.
    assert found.gpus == (5,) and found.partitions == 3 and not found.padded
    assert iterate_partitions((5, 2, 7), 1) == [((5,),), ((2,),), ((7,),)]


def test_partition_order_and_padding_match_go_gpuallocator() -> None:
    assert iterate_partitions(range(4), 2) == [((0, 1), (2, 3)), ((0, 2), (1, 3)), ((0, 3), (1, 2))]
    assert iterate_partitions(range(4), 3) == [((0, 1, 2), (3, None, None)), ((0, 1, 3), (2, None, None)),
                                               ((0, 2, 3), (1, None, None)), ((0, None, None), (1, 2, 3))]
    assert iterate_partitions(range(4), 4) == [((0, 1, 2, 3),)]
    assert iterate_partitions(range(4), 5) == []


@pytest.mark.parametrize("n", range(1, 10))
def test_partition_counts_match_the_formula(n: int) -> None:
    baseline = BestEffortBaseline(PLATFORMS["dgx2-v100"].topology())
    for size in range(1, n + 1):
        partitions = iterate_partitions(range(n), size)
        assert len(partitions) == count_partitions(n, size)
        assert len(set(partitions)) == len(partitions)
        found = baseline.search(range(n), size)
        assert found.partitions == count_partitions(n, size)
        assert found.combinations == count_combinations(n, size)


def test_partition_counts_of_a_16_gpu_node() -> None:
    assert count_partitions(16, 2) == 2_027_025  # 15!!
    assert count_partitions(16, 3) == 22_422_400  # 16 choices of the lone GPU x 15! / (3!^5 5!)
    assert count_partitions(16, 8) == 6_435
    assert count_partitions(16, 15) == 16 and count_combinations(16, 15) == 77_558_760  # C(29, 14)


def test_budget_stops_the_search_and_extrapolates() -> None:
    baseline = BestEffortBaseline(PLATFORMS["dgx2-v100"].topology())
    found = baseline.search(range(16), 3, budget_ns=2_000_000)
    assert not found.complete and found.gpus is None
    assert 0 < found.partitions < found.total == 22_422_400
    assert found.estimate_ns(16, 3) > 100 * found.elapsed_ns


def _board(n: int, nvlinks: list[tuple[int, int, int]], level: Level = Level.PIX) -> Topology:
    return Topology(gpus=tuple(Gpu(i, "test", numa_node=0) for i in range(n)),
                    nvlinks=tuple(NvLinkPair(a, b, links) for a, b, links in nvlinks), nvswitch=False,
                    pcie=tuple(tuple(None if i == j else level for j in range(n)) for i in range(n)))


def test_a_padded_set_can_win_as_in_go_gpuallocator_pr_80() -> None:
    # An NV5 pair outscores a NV1 triangle: the best partition is {0, 1, pad} + {2, 3, 4}, and the best set
    # in it is the padded one, which go-gpuallocator returns with a nil device.
    baseline = BestEffortBaseline(_board(5, [(0, 1, 5), (2, 3, 1), (2, 4, 1), (3, 4, 1)]))
    found = baseline.search(range(5), 3)
    assert found.padded and found.gpus == (0, 1)
    with pytest.raises(PaddingReturned):
        baseline.allocate(range(5), 3)


def test_more_than_twelve_nvlinks_score_nothing() -> None:
    topology = _board(2, [(0, 1, 18)])
    assert pair_score(topology, 0, 1) == PCIE_LINK_SCORE[Level.PIX]
    assert pair_score(_board(2, [(0, 1, 12)]), 0, 1) == 1200 + PCIE_LINK_SCORE[Level.PIX]


def test_hidden_levels_must_not_contradict_the_topology() -> None:
    with pytest.raises(ValueError, match="GPU0/GPU5"):
        BestEffortBaseline(PLATFORMS["dgx1-v100"].topology(), {(0, 5): Level.PIX})
