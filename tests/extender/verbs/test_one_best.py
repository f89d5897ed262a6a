"""filter passes one node, the shortlist's first, to a pod for which kube-scheduler's scoring weighs nothing of its
own (api/preferences.py), so kube-scheduler takes it without scoring and calls no prioritize; every other pod
gets the shortlist."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender import cli
from extender.api.wire import ExtenderArgs
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.verbs.scoring import KUBE_PACKING, prioritize_nodes
from extender.verbs.scoring.shortlist import OUTRANKED
from extender.verbs.service import ExtenderService
from extender.verbs.wait import WAITING
from helpers.reported_nodes import ManualClock, reported_cluster, reported_node
from test_shortlist import fleet, pod

PREFERRED = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}


def service_over(nodes: dict[str, tuple[str, tuple[int, ...]]], shortlist: int = 100,
                 one_best: bool = True) -> ExtenderService:
    return ExtenderService(reported_cluster(nodes), DemoCluster(ClusterState(), ()), shortlist=shortlist,
                           one_best=one_best)


def with_spec(body: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {**body, "spec": {**body["spec"], **spec}}


@settings(max_examples=60, deadline=None)
@given(fleet, st.sampled_from([1, 2, 4, 8]), st.randoms(use_true_random=False))
def test_the_one_node_passed_is_the_best_ranked_fit(boards: list[tuple[str, tuple[int, ...]]], gpus: int,
                                                   order: random.Random) -> None:
    nodes = {f"n{i:02d}": board for i, board in enumerate(boards)}
    names = sorted(nodes)
    order.shuffle(names)
    everyone = service_over(nodes, shortlist=0)
    full = everyone.filter(ExtenderArgs(pod("p", gpus), names, None))
    one = service_over(nodes).filter(ExtenderArgs(pod("p", gpus), names, None))
    if len(full.passed) <= 1:
        assert (one.passed, one.failed, one.unresolvable) == (full.passed, full.failed, full.unresolvable)
        return
    assert len(one.passed) == 1 and one.passed[0] in full.passed
    assert one.unlisted[OUTRANKED, True] == len(full.passed) - 1
    scores = dict(zip(full.passed, prioritize_nodes(everyone.state, everyone.selector,
                                                    everyone.pod_request(pod("p", gpus)), full.passed)))

    def total(name: str) -> float:
        """Our score and kube-scheduler's GPU packing, as the shipped profile adds them up."""
        view = everyone.state.view(name)
        assert view is not None
        return scores[name] + KUBE_PACKING * min(1.0, (view.size - view.free.bit_count() + gpus) / view.size)

    assert total(one.passed[0]) >= max(map(total, full.passed)) - 0.01, "never a node the profile ranks lower"


def test_a_pod_that_states_a_preference_or_belongs_to_a_group_gets_the_shortlist() -> None:
    nodes = {f"n{i}": ("dgx-h100", held) for i, held in enumerate(((), (0,), (0, 1), (0, 1, 2)))}
    names = list(nodes)
    service = service_over(nodes)
    assert service.filter(ExtenderArgs(pod("plain", 1), names, None)).passed == ["n3"]  # the fullest
    preferring = with_spec(pod("preferring", 1), affinity=PREFERRED)
    assert service.filter(ExtenderArgs(preferring, names, None)).passed == names  # K or fewer fit: every one
    replicated = pod("replica", 1)
    replicated["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "serve-7f", "uid": "rs"}]
    assert len(service.filter(ExtenderArgs(replicated, names, None)).passed) == 4
    member = pod("member", 1)  # of a PodGroup not seen yet, so of no known size: placed as a single pod, as before
    member["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "job"}
    assert service.filter(ExtenderArgs(member, names, None)).passed == names
    assert service_over(nodes, one_best=False).filter(ExtenderArgs(pod("plain", 1), names, None)).passed == names
    assert service_over(nodes, shortlist=2, one_best=False).filter(
        ExtenderArgs(preferring, names, None)).passed == ["n3", "n2"]
    assert service_over(nodes, shortlist=0).filter(ExtenderArgs(pod("plain", 1), names, None)).passed == names


def test_kube_scheduler_gets_the_shortlist_where_the_one_node_has_a_prefer_no_schedule_taint_not_tolerated() -> None:
    nodes = {f"n{i}": ("dgx-h100", held) for i, held in enumerate(((), (0,), (0, 1, 2)))}
    names = list(nodes)
    service = service_over(nodes)
    node = reported_node(service.state, "n2", "dgx-h100", (0, 1, 2))
    node["spec"] = {"taints": [{"key": "draining", "value": "soon", "effect": "PreferNoSchedule"}]}
    service.state.nodes.apply("MODIFIED", node)
    assert service.filter(ExtenderArgs(pod("plain", 1), names, None)).passed == names
    tolerant = with_spec(pod("tolerant", 1), tolerations=[{"key": "draining", "operator": "Exists"}])
    assert service.filter(ExtenderArgs(tolerant, names, None)).passed == ["n2"]
    other = with_spec(pod("other", 1), tolerations=[{"key": "draining", "value": "later",
                                                     "effect": "PreferNoSchedule"}])
    assert service.filter(ExtenderArgs(other, names, None)).passed == names
    node["spec"] = {"taints": [{"key": "gpu", "effect": "NoSchedule"}]}  # kube-scheduler's filter judges that one
    service.state.nodes.apply("MODIFIED", node)
    assert service.filter(ExtenderArgs(pod("plain", 1), names, None)).passed == ["n2"]


def test_where_a_node_of_shared_gpus_passes_kube_schedulers_plugins_choose() -> None:
    """A shared node scores level with the best whole-GPU node for a pod that asks nothing of topology
    (scoring.grade_scores), so kube-scheduler's own plugins choose among them: the shortlist passes."""
    state = reported_cluster({"whole": ("dgx-h100", (0,)), "other": ("dgx-h100", ())},
                             labels={"sliced": {"nvidia.com/gpu.sharing-strategy": "time-slicing",
                                                "nvidia.com/gpu.replicas": "4"}})
    state.nodes.apply("ADDED", reported_node(state, "sliced", "dgx-h100", (), labels={
        "nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4"}))
    service = ExtenderService(state, DemoCluster(ClusterState(), ()), one_best=True)
    assert len(service.filter(ExtenderArgs(pod("plain", 1), ["whole", "other", "sliced"], None)).passed) == 3
    assert service.filter(ExtenderArgs(pod("plain", 1), ["whole", "other"], None)).passed == ["whole"]


def test_while_gpus_are_drained_for_a_waiting_pod_kube_scheduler_chooses_from_the_shortlist() -> None:
    """Drained GPUs count as used in our keys, not in kube-scheduler's packing: its plugins choose then."""
    clock = ManualClock()
    nodes = {"a": ("pcie-l40s", (0, 1, 2, 7)), "b": ("pcie-l40s", ()), "c": ("pcie-l40s", (0,))}
    service = ExtenderService(reported_cluster(nodes, clock=clock, stale_after=1e6), DemoCluster(ClusterState(), ()),
                              topology_wait=300.0, one_best=True)
    assert len(service.filter(ExtenderArgs(pod("small", 1), ["a", "b", "c"], None)).passed) == 1
    assert service.filter(ExtenderArgs(pod("train", 4), ["a"], None)).failed == {WAITING: ["a"]}  # drains a's 4-7
    assert len(service.drains) == 1
    assert service.filter(ExtenderArgs(pod("small", 1), ["a", "b", "c"], None)).passed == ["a", "b", "c"]


@pytest.mark.parametrize(("flags", "passed"), [((), 1), (("--one-best",), 1), (("--no-one-best",), 3)])
def test_serve_passes_one_node_unless_told_not_to(monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...],
                                                  passed: int) -> None:
    served: list[ExtenderService] = []
    monkeypatch.setattr(cli, "serve", lambda service, options: served.append(service))
    assert cli.main(["serve", "--demo", "--shortlist=3", *flags]) == 0
    [service] = served
    names = [name for name, view in service.state.views().items() if view.size >= 8]
    assert len(names) > 3
    assert len(service.filter(ExtenderArgs(pod("plain", 1), names, None)).passed) == passed
