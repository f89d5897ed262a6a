"""The planner makes the named claims pinned to the set it chose, holds that set against other pods until it is
allocated, and replans, never giving a GPU twice, when the pin cannot be allocated."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from helpers.dra_board import CROSSED, PAIRED, dra_cluster, template, uuids

from extender.api.dra import GPU_DRIVER, parse_claim, pin_selector
from extender.api.wire import ExtenderArgs
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.demo.dra_objects import allocated_claim
from extender.kube.client import KubeError
from extender.pinning.planner import MAX_ATTEMPTS, POD_CLAIM_ANNOTATION, PinPlanner
from extender.verbs.filter import NOT_ENOUGH_FREE, PINNED_TAKEN
from extender.verbs.service import ExtenderService
from topology.select import Selector

NVLINK_PAIRS = ({0, 1}, {2, 3}, {4, 5}, {6, 7})


class FakeApi:
    """Claims as the API server keeps them: a uid and resourceVersion each, a delete that checks both."""

    def __init__(self, state: ClusterState, lag: bool = False) -> None:
        self.state = state
        self.lag = lag  # the watch has not delivered what was created yet
        self.claims: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.version = 0
        self.refuse_delete = False

    def create_resource_claim(self, namespace: str, claim: dict[str, Any]) -> dict:
        name = claim["metadata"]["name"]
        if name in self.claims:
            raise KubeError(f"resourceclaims {name} already exists", 409)
        self.version += 1
        made = copy.deepcopy(claim)
        made["metadata"].update(uid=f"uid-{name}-{self.version}", resourceVersion=str(self.version))
        self.claims[name] = made
        if not self.lag:
            self.state.claims.apply("ADDED", made)  # the watch
        return made

    def delete_resource_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        found = self.claims.get(name)
        if self.refuse_delete or found is None or found["metadata"]["resourceVersion"] != resource_version:
            raise KubeError("Precondition failed", 409)
        assert found["metadata"]["uid"] == uid
        del self.claims[name]
        self.deleted.append(name)
        self.state.claims.apply("DELETED", found)

    def allocate(self, name: str) -> set[int]:
        """kube-scheduler's allocation of a pinned claim: exactly its pinned GPUs, on their node."""
        claim = self.claims[name]
        pinned = parse_claim(claim).requests[0].pinned
        node = next(node for node in ("a", "b", "c") if pinned <= set(uuids(node)))
        indexes = {uuids(node).index(gpu) for gpu in pinned}
        claim["status"] = allocated_claim("x", node, [f"gpu-{i}" for i in sorted(indexes)])["status"]
        self.version += 1
        claim["metadata"]["resourceVersion"] = str(self.version)
        self.state.claims.apply("MODIFIED", claim)
        return indexes


def _pod(uid: str = "p1", claim: str = "train-gpus-x7k2p", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"train-{uid}", "namespace": "ml", "uid": uid,
                         "annotations": {"gpu-topology.io/claim-templates": "gpus=two-gpus"}},
            "spec": {"containers": [{"name": "c"}], "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
                     **spec},
            "status": {"phase": "Pending"}}


def _node(name: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": name}}, "spec": spec}


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _planner(orders: dict[str, tuple[int, ...]], **nodes: dict[str, Any]) -> tuple[PinPlanner, FakeApi, Clock]:
    state = dra_cluster(orders)
    state.templates.apply("ADDED", template())
    api, clock = FakeApi(state), Clock()
    planner = PinPlanner(state, Selector(), api, state.keys, clock, timeout=30.0)
    planner.nodes.replace([_node(name, **nodes.get(name, {})) for name in orders])
    return planner, api, clock


def _pinned(api: FakeApi, name: str = "train-gpus-x7k2p") -> tuple[str, set[int]]:
    pinned = parse_claim(api.claims[name]).requests[0].pinned
    node = next(node for node in ("a", "b", "c") if pinned <= set(uuids(node)))
    return node, {uuids(node).index(gpu) for gpu in pinned}


def test_the_claim_is_the_templates_pinned_to_an_nvlink_pair_and_owned_by_the_pod() -> None:
    planner, api, _ = _planner({"a": CROSSED, "b": CROSSED})
    planner.pods.apply("ADDED", _pod())
    planner.tick()
    claim = api.claims["train-gpus-x7k2p"]
    assert claim["metadata"]["annotations"] == {POD_CLAIM_ANNOTATION: "gpus"}
    assert claim["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "train-p1", "uid": "p1", "controller": True}]
    request = claim["spec"]["devices"]["requests"][0]["exactly"]
    assert (request["deviceClassName"], request["count"]) == ("gpu.nvidia.com", 2)
    assert request["selectors"][0]["cel"]["expression"].startswith(f"device.attributes['{GPU_DRIVER}'].uuid in [")
    node, pair = _pinned(api)
    assert pair in NVLINK_PAIRS
    # Until allocated, the pinned pair is not free to any other pod; allocated, the claim holds it.
    view = planner.state.view(node)
    assert view is not None and not view.free & view.mask(uuids(node)[i] for i in pair)
    assert api.allocate("train-gpus-x7k2p") == pair
    view = planner.state.view(node)
    assert view is not None and not view.free & view.mask(uuids(node)[i] for i in pair)
    planner.tick()
    assert len(api.claims) == 1 and not api.deleted  # allocated: nothing more to do


def test_the_pinned_pod_passes_filter_on_its_pair_while_another_pod_is_kept_off_it() -> None:
    planner, api, _ = _planner({"a": CROSSED})
    service = ExtenderService(planner.state, DemoCluster(ClusterState(), []))
    planner.pods.apply("ADDED", _pod())
    planner.tick()
    _, pair = _pinned(api)
    outcome = service.filter(ExtenderArgs(_pod(), ["a"], None))
    assert outcome.passed == ["a"], outcome.reasons()
    # Another pod pinning one GPU of that pair (a claim of someone else's) finds it taken until the first is done.
    other = copy.deepcopy(api.claims["train-gpus-x7k2p"])
    other["metadata"].update(name="other", uid="u-other")
    other["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [
        pin_selector(GPU_DRIVER, [uuids("a")[min(pair)]])]
    other["spec"]["devices"]["requests"][0]["exactly"]["count"] = 1
    planner.state.claims.apply("ADDED", other)
    blocked = _pod("p2", "other")
    assert service.filter(ExtenderArgs(blocked, ["a"], None)).passed == ["a"]  # pins alone: kube-scheduler decides
    api.allocate("train-gpus-x7k2p")
    assert service.filter(ExtenderArgs(_pod("p2", "other", ), ["a"], None)).failed == {PINNED_TAKEN: ["a"]}


def test_pods_planned_before_the_watch_shows_their_claims_get_disjoint_pairs() -> None:
    planner, api, _ = _planner({"a": CROSSED})
    api.lag = True
    planner.pods.apply("ADDED", _pod("p1", "c1"))
    planner.pods.apply("ADDED", _pod("p2", "c2"))
    planner.tick()
    (_, first), (_, second) = _pinned(api, "c1"), _pinned(api, "c2")
    assert first in NVLINK_PAIRS and second in NVLINK_PAIRS and not first & second


def test_a_claim_is_pinned_even_where_a_first_fit_gives_a_pair() -> None:
    """An unpinned claim holds nothing until allocated: the next pods planned would count on the same first fit."""
    planner, api, _ = _planner({"a": PAIRED})
    for i in range(4):
        planner.pods.apply("ADDED", _pod(f"p{i}", f"c{i}"))
    planner.tick()
    pairs = [_pinned(api, f"c{i}")[1] for i in range(4)]
    assert sorted(map(sorted, pairs)) == [[0, 1], [2, 3], [4, 5], [6, 7]] and planner.counts["pinned"] == 4


def test_a_pinned_gpu_allocated_to_another_claim_replans_on_another_node() -> None:
    planner, api, _ = _planner({"a": CROSSED, "b": CROSSED})
    planner.pods.apply("ADDED", _pod())
    planner.tick()
    node, pair = _pinned(api)
    # A KEP-5004 pod's claim, allocated by kube-scheduler's first fit, takes one of the pinned GPUs.
    planner.state.claims.apply("ADDED", allocated_claim("thief", node, [f"gpu-{min(pair)}"]))
    planner.tick()
    assert api.deleted == ["train-gpus-x7k2p"] and planner.counts["replanned"] == 1
    other, again = _pinned(api)
    assert other != node and again in NVLINK_PAIRS


def test_a_claim_allocated_meanwhile_is_not_deleted() -> None:
    planner, api, clock = _planner({"a": CROSSED, "b": CROSSED})
    planner.pods.apply("ADDED", _pod())
    planner.tick()
    api.refuse_delete = True  # its resourceVersion changed: the delete's precondition fails
    clock.now += 31
    planner.tick()
    assert "train-gpus-x7k2p" in api.claims and not api.deleted and planner.counts["replanned"] == 0


def test_a_pin_not_allocated_in_time_moves_and_after_its_attempts_goes_unpinned() -> None:
    planner, api, clock = _planner({"a": CROSSED, "b": CROSSED, "c": CROSSED})
    planner.pods.apply("ADDED", _pod())
    planner.tick()
    nodes = [_pinned(api)[0]]
    for _ in range(MAX_ATTEMPTS - 1):
        clock.now += 31
        planner.tick()
        nodes.append(_pinned(api)[0])
    assert len(set(nodes)) == MAX_ATTEMPTS  # each replan leaves the node that did not schedule it
    clock.now += 31
    planner.tick()
    assert "selectors" not in api.claims["train-gpus-x7k2p"]["spec"]["devices"]["requests"][0]["exactly"]


@pytest.mark.parametrize("spec, node", [
    ({"nodeSelector": {"pool": "b"}}, "b"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["a"]}]}]}}}}, "b"),
    ({}, "b"),  # node a carries a taint the pod does not tolerate
])
def test_the_pin_goes_only_where_the_pod_may_go(spec: dict[str, Any], node: str) -> None:
    planner, api, _ = _planner({"a": CROSSED, "b": CROSSED},
                               a={"taints": [{"key": "gpu", "effect": "NoSchedule"}]} if not spec else {})
    planner.pods.apply("ADDED", _pod(**spec))
    planner.tick()
    assert _pinned(api)[0] == node


def test_a_pod_that_tolerates_the_taint_may_go_there() -> None:
    planner, api, _ = _planner({"a": CROSSED}, a={"taints": [{"key": "gpu", "effect": "NoSchedule"}]})
    planner.pods.apply("ADDED", _pod(tolerations=[{"key": "gpu", "operator": "Exists"}]))
    planner.tick()
    assert _pinned(api)[0] == "a"


def test_a_pod_bound_or_gone_or_not_named_by_the_webhook_is_not_planned() -> None:
    planner, api, _ = _planner({"a": CROSSED})
    bound = _pod("p1", "c1", nodeName="a")
    unnamed = _pod("p2", "c2")
    del unnamed["metadata"]["annotations"]
    gone = _pod("p3", "c3")
    for pod in (bound, unnamed, gone):
        planner.pods.apply("ADDED", pod)
    planner.pods.apply("DELETED", gone)
    planner.tick()
    assert api.claims == {}


def test_a_claim_made_by_someone_else_is_left_alone() -> None:
    planner, api, _ = _planner({"a": CROSSED})
    other = allocated_claim("theirs", "a", [])
    other["metadata"]["name"] = "train-gpus-x7k2p"
    del other["status"]
    planner.state.claims.apply("ADDED", other)
    planner.pods.apply("ADDED", _pod())
    planner.tick()
    assert api.claims == {}


def test_a_first_fit_that_would_take_a_pinned_gpu_is_not_promised_until_the_pin_is_allocated() -> None:
    """kube-scheduler's allocator sees an unallocated pin's GPUs as free: where its first fit for another claim
    would take one, the extender passes no node until the pin is allocated and that first fit moves on."""
    planner, api, _ = _planner({"a": CROSSED})
    service = ExtenderService(planner.state, DemoCluster(ClusterState(), []))
    pin = allocated_claim("pin", "a", [])
    pin["metadata"]["name"] = "pinned"
    del pin["status"]
    pin["spec"]["devices"]["requests"][0]["exactly"].update(
        count=2, selectors=[pin_selector(GPU_DRIVER, [uuids("a")[0], uuids("a")[1]])])
    planner.state.claims.apply("ADDED", pin)
    plain = allocated_claim("plain", "a", [])
    plain["metadata"]["name"] = "plain"
    del plain["status"]
    plain["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    planner.state.claims.apply("ADDED", plain)
    pod = _pod("p9", "plain")
    pod["metadata"]["annotations"] = {"gpu-topology.io/topology-wait": "0"}
    outcome = service.filter(ExtenderArgs(pod, ["a"], None))
    assert outcome.passed == [] and outcome.failed == {NOT_ENOUGH_FREE: ["a"]}  # its first fit is 0 and 5
    pin["status"] = allocated_claim("pin", "a", ["gpu-0", "gpu-1"])["status"]
    planner.state.claims.apply("MODIFIED", pin)
    pod["metadata"]["resourceVersion"] = "2"
    assert service.filter(ExtenderArgs(pod, ["a"], None)).passed == ["a"]  # now 5 and 2
