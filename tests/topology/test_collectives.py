"""The step-time model and the multi-node figures the extender and the replay share (topology/collectives.py)."""

from __future__ import annotations

import math

import pytest

from topology.collectives import ALLREDUCE, slowdown, split_slowdown
from topology.platforms import PLATFORMS


def test_every_figure_is_of_a_bundled_board_and_a_domain_is_faster_than_its_network() -> None:
    assert set(ALLREDUCE) <= set(PLATFORMS)
    for figures in ALLREDUCE.values():
        assert figures.domain_gbps > figures.leaf_gbps > 0 and "measured" in figures.source


@pytest.mark.parametrize(("share", "expected"), [(0.0, 1.0), (0.3, 0.7 + 0.3 * 811 / 85), (1.0, 811 / 85)])
def test_a_split_costs_the_worst_platforms_slowdown_and_nothing_at_no_communication(share: float,
                                                                                     expected: float) -> None:
    h100 = ALLREDUCE["dgx-h100"]
    assert split_slowdown(share) == pytest.approx(expected)
    assert split_slowdown(share) >= slowdown(share, h100.domain_gbps, h100.leaf_gbps)


def test_a_placement_with_no_bandwidth_never_finishes() -> None:
    assert slowdown(0.3, 811.0, 0.0) == math.inf
    assert slowdown(0.0, 811.0, 85.0) == 1.0
