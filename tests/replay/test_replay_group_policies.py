"""Multi-node jobs under the replay's policies on a labelled fleet (issue 17): count-only scattering a rack-sized
group that Kueue-like keeps whole and that our extender places at once, Kueue's best fit, the per-job metrics on
placements known by hand, and the synthetic multi-node mix."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from loadtests.replay.clusters import nvl72_fleet
from loadtests.replay.engine import Outcome, Placement, Run, replay
from loadtests.replay.group_metrics import summarize_groups
from loadtests.replay.group_mix import GROUP_MIX, group_workload
from loadtests.replay.kube_scores import DEFAULT
from loadtests.replay.kueue_tas import assign
from loadtests.replay.model import LEAF_LABEL, SPINE_LABEL, TOPOLOGY_LEVELS, ClusterNode, Job
from loadtests.replay.policies import ExtenderPolicy, KueueLikePolicy, StockPolicy
from loadtests.replay.runtime import segmented_gbps
from loadtests.replay.spans import Span, Spans, allreduce_gbps
from loadtests.replay.workloads import offered_load, unplaceable
from topology.fabric import CLIQUE_LABEL

QUANTITY = StockPolicy("quantity", DEFAULT)


def _rack_scenario() -> tuple[tuple[ClusterNode, ...], list[Job]]:
    """Two NVL72 racks: 18 one-GPU pods spread one a node by kube-scheduler's defaults, then a rack-sized group
    of 18 trays x 4 GPUs: 18 whole trays are free, but over both racks."""
    fleet = nvl72_fleet(racks=2, racks_per_leaf=1, hgx_leaves=0)
    singles = [Job(f"s{i:02d}", float(i), 100.0, 1, "GB200") for i in range(18)]
    group = [Job(f"g-{m}", 20.0, 500.0, 4, "GB200", group="g", pods=18) for m in range(18)]
    return fleet, singles + group


def test_count_only_scatters_a_rack_sized_group_that_kueue_like_keeps_in_one_rack() -> None:
    fleet, jobs = _rack_scenario()
    spans = Spans(fleet)
    count_only = replay(fleet, jobs, QUANTITY, 1)
    members = [outcome for outcome in count_only.outcomes if outcome.job.group == "g"]
    assert {outcome.placed_s for outcome in members} == {20.0}
    assert spans.span_of(outcome.placement.node for outcome in members) is Span.SPINE  # both racks, two leaves
    kueue = replay(fleet, jobs, KueueLikePolicy("kueue", fleet), 1)
    held = [outcome for outcome in kueue.outcomes if outcome.job.group == "g"]
    assert spans.span_of(outcome.placement.node for outcome in held) is Span.DOMAIN
    rack = spans.blocks[held[0].placement.node][Span.DOMAIN]
    singles = [outcome for outcome in kueue.outcomes if outcome.job.group is None]
    assert [outcome.placement for outcome in singles] == [outcome.placement for outcome in count_only.outcomes
                                                          if outcome.job.group is None]
    freed = max(100.0 + outcome.placed_s for outcome in singles
                if spans.blocks[outcome.placement.node][Span.DOMAIN] == rack)
    assert {outcome.placed_s for outcome in held} == {freed}  # once the last single pod of its rack has left
    one, whole = summarize_groups(count_only), summarize_groups(kueue)
    assert (one.groups_in_one_domain_share, whole.groups_in_one_domain_share) == (0.0, 1.0)
    assert whole.pending_p95_s_by_pods == {"1": 0.0, "9-18": freed - 20.0}
    assert one.pending_p95_s_by_pods["9-18"] == 0.0
    halves = Counter(spans.blocks[outcome.placement.node][Span.DOMAIN] for outcome in members)
    assert sorted(halves.values()) == [9, 9]  # two racks of 9: a hierarchical all-reduce crosses the spine on 1/9
    assert one.modelled_group_job_time == pytest.approx(0.7 + 0.3 * 811 / segmented_gbps("gb200-node", Span.SPINE, 9))
    assert one.modelled_group_job_time > 1.5


def test_ours_keeps_a_rack_whole_so_the_group_starts_at_once_in_it() -> None:
    """Our extender packs the one-GPU pods into one rack (it keeps empty NVLink domains whole), so the rack-sized
    group lands whole in the other at its arrival, whether its members ask required or preferred placement."""
    fleet, jobs = _rack_scenario()
    spans = Spans(fleet)
    for placement in ("required", "preferred"):
        run = replay(fleet, jobs, ExtenderPolicy("ours", fleet, delivery=True, topology_levels=TOPOLOGY_LEVELS,
                                                 group_placement=placement), 1)
        singles = [outcome.placement.node for outcome in run.outcomes if outcome.job.group is None]
        members = [outcome for outcome in run.outcomes if outcome.job.group == "g"]
        assert len({spans.blocks[node][Span.DOMAIN] for node in singles}) == 1
        assert {outcome.placed_s for outcome in members} == {20.0}
        assert spans.span_of(outcome.placement.node for outcome in members) is Span.DOMAIN
        assert summarize_groups(run).groups_in_one_domain_share == 1.0


def test_a_group_that_fits_one_hgx_node_asks_ours_for_its_leaf_and_is_placed() -> None:
    """No clique label names an HGX node's NVLink domain, so the extender sees none there: a group small enough
    for one node asks for the narrowest labelled span, its leaf, and is placed even when it requires it."""
    fleet = nvl72_fleet(racks=1, hgx_leaves=1, hgx_per_leaf=2)
    group = [Job(f"g-{m}", 0.0, 50.0, 2, "H100", group="g", pods=2) for m in range(2)]
    spans = Spans(fleet)
    assert (spans.tightest(group[0]), spans.tightest(group[0], labelled=True)) == (Span.DOMAIN, Span.LEAF)
    run = replay(fleet, group, ExtenderPolicy("ours", fleet, delivery=True, topology_levels=TOPOLOGY_LEVELS,
                                              group_placement="required"), 1)
    assert [outcome.placed_s for outcome in run.outcomes] == [0.0, 0.0]
    assert spans.span_of(outcome.placement.node for outcome in run.outcomes) <= Span.LEAF


def test_kueue_takes_the_best_fit_block_then_fills_its_nodes_most_free_first() -> None:
    paths = {"a1": ("s", "a", "a1"), "a2": ("s", "a", "a2"), "b1": ("s", "b", "b1"), "c1": ("s", "c", "c1"),
             "c2": ("s", "c", "c2")}
    fits = {"a1": 3, "a2": 2, "b1": 3, "c1": 1, "c2": 3}
    assert assign(paths, fits, 3, 2) == ["b1"] * 3  # blocks hold 5, 3 and 4: the least that holds 3
    assert assign(paths, fits, 4, 2) == ["c1", "c2", "c2", "c2"]  # c holds 4: its 3-node, then the best fit of 1
    assert assign(paths, fits, 6, 2) is None and assign(paths, fits, 6, 1) is not None


def _labelled(name: str, rack: str, leaf: str) -> ClusterNode:
    return ClusterNode(name, "gb200-node", "GB200",
                       labels=((CLIQUE_LABEL, rack), (SPINE_LABEL, "s"), (LEAF_LABEL, leaf)))


def test_the_group_metrics_on_placements_known_by_hand() -> None:
    """Racks A to D of 2 trays each, in one leaf; members of 4 GPUs, so a rack holds 2 and the leaf 8. G1 sits in
    rack A, its second member 20 s late; G2 straddles B and C; G3 (3 pods) fits no rack, so only the leaf share
    counts it; G4 never got its second member."""
    nodes = tuple(_labelled(f"{rack}{tray}", f"{rack.upper()}.1", "l") for rack in "abcd" for tray in (1, 2))

    def member(group: str, pods: int, submit: float, at: float, node: str | None, duration: float = 100.0
               ) -> Outcome:
        job = Job(f"{group}-{node}", submit, duration, 4, "GB200", group=group, pods=pods)
        return Outcome(job, None if node is None else at, None if node is None else Placement(node, (0, 1, 2, 3)))

    outcomes = (Outcome(Job("s", 0.0, 50.0, 1, "GB200"), 0.0, Placement("c1", (0,))),
                member("g1", 2, 10.0, 10.0, "a1"), member("g1", 2, 10.0, 30.0, "a2"),
                member("g2", 2, 20.0, 20.0, "b1", 300.0), member("g2", 2, 20.0, 20.0, "c2", 300.0),
                member("g3", 3, 40.0, 40.0, "b2"), member("g3", 3, 40.0, 40.0, "d1"),
                member("g3", 3, 40.0, 40.0, "d2"),
                member("g4", 2, 100.0, 100.0, "c1"), member("g4", 2, 100.0, 100.0, None))
    summary = summarize_groups(Run("by hand", 1, nodes, outcomes, ()))
    assert (summary.jobs, summary.groups, summary.groups_started) == (5, 4, 3)
    assert (summary.groups_fitting_one_domain, summary.groups_in_one_domain_share) == (2, 0.5)
    assert (summary.groups_fitting_one_leaf, summary.groups_in_one_leaf_share) == (3, 1.0)
    assert summary.pending_p95_s_by_pods == {"1": 0.0, "2-4": 20.0}
    # Running within [0, 100]: s 1 GPU x 50, g1 8 x 70 from 30, g2 8 x 80 from 20, g3 12 x 60 from 40; of 32 GPUs.
    assert summary.gpu_utilization_running == pytest.approx((50 + 560 + 640 + 720) / (32 * 100))
    stretched = 0.7 + 0.3 * allreduce_gbps("gb200-node", Span.DOMAIN) / allreduce_gbps("gb200-node", Span.LEAF)
    assert summary.modelled_group_job_time == pytest.approx((100 + 300 * stretched + 100) / 500)
    assert math.isnan(summarize_groups(Run("none", 1, nodes, outcomes[:1], ())).groups_in_one_domain_share)


def test_the_group_mix_hits_its_load_with_groups_of_its_shapes() -> None:
    fleet = nvl72_fleet()
    jobs = group_workload(fleet, 0.9, jobs=400, seed=3)
    assert offered_load(jobs, fleet) == pytest.approx(0.9, rel=1e-9)
    shapes = {(job.gpu_model, job.pods, job.gpus) for job in jobs}
    assert shapes <= {(pool, pods, gpus) for pool, mix in GROUP_MIX.items() for pods, gpus in mix}
    assert {pods for _, pods, _ in shapes} >= {1, 2, 18} and unplaceable(jobs, fleet) is None
    assert jobs == group_workload(fleet, 0.9, jobs=400, seed=3) != group_workload(fleet, 0.9, jobs=400, seed=4)
