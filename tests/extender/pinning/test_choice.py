"""The planner's choice on DRA nodes: the best free set, pinned only where no first fit gives as much."""

from __future__ import annotations

import pytest
from helpers.dra_board import CROSSED, PAIRED, dra_cluster, uuids

from extender.demo.dra_objects import allocated_claim
from extender.pinning.choice import choose_pin
from topology.select import Selector

NVLINK_PAIRS = ({0, 1}, {2, 3}, {4, 5}, {6, 7})


def _indexes(node: str, gpus: tuple[str, ...]) -> set[int]:
    return {uuids(node).index(gpu) for gpu in gpus}


@pytest.mark.parametrize("second", [CROSSED, PAIRED])
def test_the_choice_is_an_nvlink_pair_whatever_the_first_fits_give(second: tuple[int, ...]) -> None:
    state = dra_cluster({"a": CROSSED, "b": second})
    choice = choose_pin(state, Selector(), 2, ["a", "b"])
    assert choice is not None and _indexes(choice.node, choice.gpus) in NVLINK_PAIRS


def test_the_pin_avoids_taken_gpus_and_packs_a_broken_pair_first() -> None:
    state = dra_cluster({"a": CROSSED, "b": CROSSED})
    # Node a: GPUs 1 and 3 taken, so only pairs 4-5 and 6-7 are whole; node b is all free. A 1-GPU pod packs into a
    # broken pair (GPU 0 or 2 of node a) rather than break a whole one.
    state.claims.apply("ADDED", allocated_claim("busy", "a", ["gpu-1", "gpu-3"]))
    one = choose_pin(state, Selector(), 1, ["a", "b"])
    assert one is not None and one.node == "a" and _indexes("a", one.gpus) <= {0, 2}
    two = choose_pin(state, Selector(), 2, ["a", "b"])
    assert two is not None and _indexes(two.node, two.gpus) in NVLINK_PAIRS
    assert not (two.node == "a" and _indexes("a", two.gpus) & {1, 3})


def test_no_node_with_the_gpus_free_is_no_choice() -> None:
    state = dra_cluster({"a": CROSSED})
    state.claims.apply("ADDED", allocated_claim("busy", "a", [f"gpu-{i}" for i in range(7)]))
    assert choose_pin(state, Selector(), 2, ["a"]) is None
    assert choose_pin(state, Selector(), 2, ["not-a-node"]) is None
