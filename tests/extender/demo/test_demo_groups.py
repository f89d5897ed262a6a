"""The demo's third part: groups on NVL72 racks through the real HTTP server, against count-only placement."""

from __future__ import annotations

import re
from itertools import combinations

import pytest

from extender.demo.groups import GROUPS, RUNNING, STEPS, Comparison, Run, arrivals, compare, run_groups_demo
from topology.annotations import AnnotationKeys


@pytest.fixture(scope="module")
def result() -> Comparison:
    return compare()


def test_every_group_lands_whole_in_one_nvlink_domain_where_count_only_scatters_one(result: Comparison) -> None:
    for group, size, *_ in GROUPS:
        racks = result.ours.racks(group)
        assert racks.total() == size and len(racks) == 1, (group, racks)
    scattered = [group for group, *_ in GROUPS if len(result.count_only.racks(group)) > 1]
    assert scattered, "count-only keeps every group in one rack"


def test_the_required_group_waits_for_a_whole_rack_and_gets_it_once_the_pod_there_ends(result: Comparison) -> None:
    step, reason = result.ours.waited["train-72-00"]
    assert reason == "no NVLink domain with room for 18 pods of 4 GPUs"
    assert {p.start for name, p in result.ours.placed.items() if name.startswith("train-72-")} == {step + 1}
    assert result.ours.whole_racks() and not result.count_only.whole_racks()


def test_no_gpu_is_given_twice_and_every_pod_gets_its_count(result: Comparison) -> None:
    counts = {pod.name: pod.gpus for pod in arrivals(AnnotationKeys())} | {name: gpus for name, gpus, *_ in RUNNING}
    for run in (result.ours, result.count_only):
        assert set(run.placed) == set(counts)
        assert all(len(set(placement.gpus)) == counts[name] for name, placement in run.placed.items())
        _check_exclusive(run)


def test_the_printed_table_says_the_same() -> None:
    lines: list[str] = []
    run_groups_demo(lines.append)
    out = "\n".join(lines)
    row = re.search(r"in one NVLink domain\s+(\d+)/(\d+)\s+(\d+)/(\d+)", out)
    assert row is not None
    ours, total, count_only, _ = map(int, row.groups())
    assert ours == total == len(GROUPS) and count_only < total
    assert re.search(r"train-72\s+72\s+1\s+811 GB/s\s+[23]\s+85 GB/s", out)


def _check_exclusive(run: Run) -> None:
    """Pods that run on one tray at the same time hold disjoint GPUs."""
    assert all(placement.start < placement.end <= STEPS for placement in run.placed.values())
    for (one, a), (other, b) in combinations(run.placed.items(), 2):
        if a.node == b.node and a.start < b.end and b.start < a.end:
            assert not set(a.gpus) & set(b.gpus), (one, other, a, b)
