"""filter's shortlist (verbs/scoring/shortlist.py): where more than K nodes fit, the K that prioritize ranks best
pass, the rest are refused as OUTRANKED (counted, not listed, as every refusal then), and the pod's prioritize
scores them as it would have scored them among every fit."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.wire import ExtenderArgs, filter_result
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.verbs.filter import NOT_ENOUGH_FREE
from extender.verbs.scoring import prioritize_nodes
from extender.verbs.service import ExtenderService
from extender.verbs.scoring.shortlist import OUTRANKED, Shortlists
from helpers.reported_nodes import reported_cluster

PLATFORMS = ("rtx-a6000-pairs", "dgx-h100", "dgx1-v100", "pcie-l40s", "hgx-a100-8gpu")
HELD = ((), (0,), (0, 1), (0, 2, 4), (1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5, 6, 7))


def pod(uid: str, gpus: int, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": version},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def service_over(nodes: dict[str, tuple[str, tuple[int, ...]]], shortlist: int) -> ExtenderService:
    """Filter and prioritize only: the API (a demo cluster of its own, no node) is never called."""
    return ExtenderService(reported_cluster(nodes), DemoCluster(ClusterState(), ()), shortlist=shortlist,
                           one_best=False)


fleet = st.lists(st.tuples(st.sampled_from(PLATFORMS), st.sampled_from(HELD)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None)
@given(fleet, st.sampled_from([1, 2, 4, 8]), st.integers(1, 12), st.randoms(use_true_random=False))
def test_the_shortlist_is_the_best_ranked_fits_and_prioritize_scores_them_as_among_all(
        boards: list[tuple[str, tuple[int, ...]]], gpus: int, k: int, order: random.Random) -> None:
    nodes = {f"n{i:02d}": board for i, board in enumerate(boards)}
    names = sorted(nodes)
    order.shuffle(names)
    everyone, short = service_over(nodes, 0), service_over(nodes, k)
    full = everyone.filter(ExtenderArgs(pod("p", gpus), names, None))
    cut = short.filter(ExtenderArgs(pod("p", gpus), names, None))
    full_scores = dict(zip(full.passed, prioritize_nodes(everyone.state, everyone.selector,
                                                         everyone.pod_request(pod("p", gpus)), full.passed)))
    if len(full.passed) <= k:
        assert (cut.passed, cut.failed, cut.unresolvable, cut.unlisted) == (full.passed, full.failed,
                                                                           full.unresolvable, {})
        return
    # The refused names are counted, not listed: the answer writes none while a node passes.
    assert cut.failed == cut.unresolvable == {}
    assert cut.unlisted == {**{(reason, True): len(names) for reason, names in full.failed.items()},
                            **{(reason, False): len(names) for reason, names in full.unresolvable.items()},
                            (OUTRANKED, True): len(full.passed) - k}
    assert len(cut.passed) == k == len(set(cut.passed)) and set(cut.passed) <= set(full.passed)
    outranked = [name for name in full.passed if name not in cut.passed]
    # No node left out scores above one kept; a pod is never left without the best placement on offer.
    assert min(full_scores[name] for name in cut.passed) >= max(full_scores[name] for name in outranked)
    assert max(full_scores[name] for name in cut.passed) == max(full_scores.values())
    kept, scores = short.prioritize(ExtenderArgs(pod("p", gpus), list(reversed(cut.passed)), None))
    assert scores == [full_scores[name] for name in kept]


def test_among_equal_scores_the_fuller_node_is_kept_then_kube_schedulers_order() -> None:
    """A 1-GPU pod on DGX H100s: packing decides among equal scores, the fuller first (5 GPUs held before 3),
    then the order kube-scheduler sent the names in (h3b before h3, h2 before h2b, or the reverse)."""
    nodes = {"h1": ("dgx-h100", (0,)), "h3b": ("dgx-h100", (0, 2, 4)), "h2": ("dgx-h100", (0, 1)),
             "h3": ("dgx-h100", (0, 1, 2)), "h5": ("dgx-h100", (0, 1, 2, 3, 4)), "h2b": ("dgx-h100", (0, 2))}
    names = list(nodes)
    assert dict(zip(*service_over(nodes, 0).prioritize(ExtenderArgs(pod("p", 1), names, None)))) == {
        "h1": 9, "h3b": 10, "h2": 6, "h3": 10, "h5": 10, "h2b": 6}
    assert service_over(nodes, 2).filter(ExtenderArgs(pod("p", 1), names, None)).passed == ["h5", "h3b"]
    outcome = service_over(nodes, 5).filter(ExtenderArgs(pod("p", 1), names, None))
    assert outcome.passed == ["h5", "h3b", "h3", "h1", "h2"] and outcome.unlisted == {(OUTRANKED, True): 1}
    outcome = service_over(nodes, 5).filter(ExtenderArgs(pod("p", 1), names[::-1], None))
    assert outcome.passed == ["h5", "h3", "h3b", "h1", "h2b"] and outcome.unlisted == {(OUTRANKED, True): 1}


def test_the_answer_writes_no_reason_while_one_passes_and_every_reason_when_none_does() -> None:
    """kube-scheduler reads the refused nodes' reasons only when none passes (api/wire.py)."""
    nodes = {"two-pairs": ("rtx-a6000-pairs", (0, 1, 2, 3)), "pair": ("rtx-a6000-pairs", (0, 1, 2, 3, 4, 5)),
             "full": ("rtx-a6000-pairs", tuple(range(8)))}
    service = service_over(nodes, 1)
    args = ExtenderArgs(pod("p", 2), ["two-pairs", "full", "pair"], None)
    outcome = service.filter(args)
    assert outcome.passed == ["pair"]
    assert outcome.unlisted == {(NOT_ENOUGH_FREE, True): 1, (OUTRANKED, True): 1} and outcome.failed == {}
    assert {decision: service.metrics.registry.get_sample_value(
        "gpu_topology_extender_decisions_total", {"verb": "filter", "outcome": decision})
        for decision in ("pass", "outranked", "fail", "unresolvable")} == {
        "pass": 1, "outranked": 1, "fail": 1, "unresolvable": 0}
    assert filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable) == (
        b'{"NodeNames":["pair"],"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}')
    args = ExtenderArgs(pod("q", 8), ["two-pairs", "full", "pair"], None)
    outcome = service.filter(args)
    assert b'"two-pairs":"not enough free GPUs"' in filter_result(args, outcome.passed, outcome.failed,
                                                                 outcome.unresolvable)


def test_a_pod_asking_no_gpu_and_a_pod_that_fits_k_nodes_or_fewer_pass_every_fit() -> None:
    nodes = {f"n{i}": ("dgx-h100", ()) for i in range(5)}
    service = service_over(nodes, 2)
    no_gpu = {"metadata": {"name": "web", "namespace": "ml", "uid": "w"}, "spec": {"containers": [{"name": "c"}]}}
    assert len(service.filter(ExtenderArgs(no_gpu, sorted(nodes), None)).passed) == 5
    assert service.filter(ExtenderArgs(pod("p", 8), ["n0", "n1"], None)).passed == ["n0", "n1"]


def test_prioritize_scores_anew_for_a_new_pod_version_or_a_name_not_shortlisted() -> None:
    nodes = {"pair": ("rtx-a6000-pairs", (0, 1, 2, 3, 4, 5)), "split": ("rtx-a6000-pairs", (0, 2, 4, 6)),
             "h100": ("dgx-h100", ())}
    service = service_over(nodes, 1)
    assert service.filter(ExtenderArgs(pod("p", 2), sorted(nodes), None)).passed == ["h100"]
    fresh = service_over(nodes, 0)
    for names, version in ((["h100", "split"], "1"), (["h100"], "2")):
        expected = fresh.prioritize(ExtenderArgs(pod("p", 2, version), names, None))
        assert service.prioritize(ExtenderArgs(pod("p", 2, version), names, None)) == expected


def test_shortlists_are_bounded_and_forget_the_oldest_pod() -> None:
    lists = Shortlists(size=2)
    for uid in ("a", "b", "c"):
        lists.keep((uid, "1"), ["n"], [3])
    assert lists.scores(("a", "1"), ["n"]) is None
    assert lists.scores(("c", "1"), ["n"]) == [3]
    lists.keep(("", "1"), ["n"], [3])
    assert lists.scores(("", "1"), ["n"]) is None


def test_prioritize_reads_the_shortlist_in_filters_order_or_in_any_order_of_its_names() -> None:
    lists = Shortlists()
    lists.keep(("p", "1"), ["a", "b", "c"], [9, 9, 7])
    assert lists.scores(("p", "1"), ["a", "b", "c"]) == [9, 9, 7]
    assert lists.scores(("p", "1"), ["c", "a"]) == [7, 9]
    assert lists.scores(("p", "1"), ["c", "d"]) is None
    assert lists.scores(("p", "1"), ["a", "b", "c", "c"]) is None
    answer = lists.scores(("p", "1"), ["a", "b", "c"])
    assert answer is not None
    answer.append(1)  # the answer is the caller's: what is kept does not change
    assert lists.scores(("p", "1"), ["a", "b", "c"]) == [9, 9, 7]
