"""Whole groups in one NVLink domain (extender/verbs/group_placement.py, extender/groups/layouts.py and plans.py).

The cluster: GB200 NVL72 compute trays (the real 4-GPU capture, NVSwitch) in two NVLink domains named as GPU
feature discovery names them (`nvidia.com/gpu.clique`), under two leaves of one spine. Pods go through the
extender's own filter, prioritize and bind, as kube-scheduler calls them; the API server is a recorder that
shows each Binding to the watch, as the real one does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from extender.api.group_request import COSCHEDULING, SCHEDULING_GROUP
from extender.api.pod_request import parse_pod
from extender.api.wire import BindingArgs, ExtenderArgs
from extender.cache.cluster_state import ClusterState
from extender.cache.ledger import Phase
from extender.cache.node_view import first_fit
from extender.demo.cluster import with_uuids
from extender.cache.seal import Seal
from extender.groups.layouts import fewest_blocks
from extender.groups.sizes import GroupSizes
from extender.verbs.group_placement import DRAIN_HORIZON_SECONDS, ELSEWHERE
from extender.verbs.service import ExtenderService
from extender.demo.dra_objects import allocated_claim, gpu_slice
from helpers.reported_nodes import ManualClock, reported_cluster
from topology.annotations import AnnotationKeys
from topology.collectives import split_slowdown
from topology.platforms import PLATFORMS

SPINE, LEAF = "network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"
CLUSTER_UUID = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
DOMAINS = {"a": f"{CLUSTER_UUID}.1", "b": f"{CLUSTER_UUID}.2"}
NODES_PER_DOMAIN = 6
SEAL = Seal(b"k" * 32)


def _names(domain: str) -> list[str]:
    return [f"{domain}{index:02d}" for index in range(NODES_PER_DOMAIN)]


ALL = _names("a") + _names("b")


class _Kube:
    """Records Bindings and shows each to the watch (nodeName and annotations set in one write)."""

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.pods: dict[str, dict[str, Any]] = {}
        self.refuse: set[str] = set()

    def bind_soon(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        return None

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        from extender.kube.client import KubeError
        if name in self.refuse:
            raise KubeError(f"pods {name!r} is forbidden", 403)
        pod = self.pods[uid]
        pod["spec"]["nodeName"] = node
        pod["metadata"]["annotations"].update(annotations)
        assert self.state is not None
        self.state.pods.apply("MODIFIED", pod)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("bind read the pod from the watch")

    def emit_event(self, *args: Any, **kwargs: Any) -> None:
        pass


def _cluster(clock: ManualClock, busy: Mapping[str, tuple[int, ...]] | None = None,
             seal: Seal = SEAL) -> tuple[ExtenderService, _Kube]:
    used = {name: ("gb200-node", (busy or {}).get(name, ())) for name in ALL}
    labels = {name: {"nvidia.com/gpu.clique": DOMAINS[name[0]], SPINE: "s1", LEAF: f"leaf-{name[0]}"}
              for name in ALL}
    state = reported_cluster(used, clock=clock, stale_after=1e9, labels=labels, levels=(SPINE, LEAF), seal=seal)
    kube = _Kube()
    kube.state = state
    return ExtenderService(state, kube, topology_wait=600.0, one_best=False), kube  # type: ignore[arg-type]


def _pod(kube: _Kube, name: str, gpus: int, group: str | None = None, size: int | str = 4, deadline: int | None = None,
         **extra: str) -> dict[str, Any]:
    annotations = dict(extra)
    if group is not None:
        annotations |= {"gpu-topology.io/group": group, "gpu-topology.io/group-size": str(size)}
    pod = {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "resourceVersion": "1",
                        "annotations": annotations},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}
    if deadline is not None:
        pod["spec"]["activeDeadlineSeconds"] = deadline
    kube.pods[pod["metadata"]["uid"]] = pod
    assert kube.state is not None
    kube.state.pods.apply("ADDED", pod)
    return pod


def _schedule(service: ExtenderService, pod: dict[str, Any]) -> str | None:
    """One scheduling cycle as kube-scheduler runs it: filter, prioritize, bind to the best; the node or None."""
    outcome = service.filter(ExtenderArgs(pod, list(ALL), None))
    if not outcome.passed:
        return None
    names, scores = service.prioritize(ExtenderArgs(pod, outcome.passed, None))
    node = max(zip(scores, names), key=lambda pair: (pair[0], [-ord(c) for c in pair[1]]))[1]
    meta = pod["metadata"]
    error = service.bind(BindingArgs(meta["name"], meta["namespace"], meta["uid"], node))
    return None if error else node


def _domain(node: str) -> str:
    return node[0]


def _held(service: ExtenderService) -> dict[str, list[str]]:
    """GPU ids held per node by every ledger entry (plans' and pods'), to check nothing is held twice."""
    held: dict[str, list[str]] = {}
    for entry in service.state.ledger.pods():
        held.setdefault(entry.node, []).extend(entry.gpus)
    return held


def test_a_group_is_planned_whole_at_its_first_member_and_lands_in_one_domain() -> None:
    service, kube = _cluster(ManualClock())
    first = _pod(kube, "w0", 4, group="train")
    outcome = service.filter(ExtenderArgs(first, ALL, None))
    assert len(outcome.passed) == 4 and len({_domain(node) for node in outcome.passed}) == 1
    assert outcome.unresolvable == {ELSEWHERE: [node for node in ALL if node not in outcome.passed]}
    planned = [entry for entry in service.state.ledger.pods() if entry.phase is Phase.PLANNED]
    assert sorted(entry.node for entry in planned) == sorted(outcome.passed)
    # Another pod no longer sees the planned GPUs as free.
    single = _pod(kube, "solo", 1)
    assert not set(service.filter(ExtenderArgs(single, ALL, None)).passed) & set(outcome.passed)
    nodes = [_schedule(service, first)] + [_schedule(service, _pod(kube, f"w{i}", 4, group="train"))
                                           for i in range(1, 4)]
    assert sorted(nodes) == sorted(outcome.passed)  # type: ignore[type-var]
    assert not [entry for entry in service.state.ledger.pods() if entry.phase is Phase.PLANNED]
    for gpus in _held(service).values():
        assert len(gpus) == len(set(gpus))


def test_best_fit_fills_a_partly_used_domain_before_breaking_an_empty_one() -> None:
    # Domain a has two nodes busy, so four trays are left there: a group of four fits it exactly.
    service, kube = _cluster(ManualClock(), busy={"a00": (0, 1, 2, 3), "a01": (0,)})
    outcome = service.filter(ExtenderArgs(_pod(kube, "w0", 4, group="fit"), ALL, None))
    assert {_domain(node) for node in outcome.passed} == {"a"}
    assert "a00" not in outcome.passed and "a01" not in outcome.passed


def test_a_group_that_fits_no_domain_now_waits_on_every_node_and_holds_nothing() -> None:
    service, kube = _cluster(ManualClock(), busy={name: (0,) for name in ALL[::2]})  # 3 whole trays per domain
    outcome = service.filter(ExtenderArgs(_pod(kube, "w0", 4, group="big"), ALL, None))
    assert outcome.passed == []
    assert outcome.unresolvable == {"no NVLink domain with room for 4 pods of 4 GPUs": ALL}
    assert not service.state.ledger.pods()
    assert len(service.drains) == 0  # no age bound: waiting holds no free GPU back


def test_a_preferred_group_no_domain_holds_splits_into_the_largest_equal_segments_at_once() -> None:
    service, kube = _cluster(ManualClock())
    members = [_pod(kube, f"w{i}", 4, group="wide", size=8) for i in range(8)]
    nodes = [_schedule(service, pod) for pod in members]
    assert None not in nodes
    assert sorted(Counter(_domain(node) for node in nodes if node).values()) == [4, 4]  # not 6 + 2: two racks of 4


@pytest.mark.parametrize("deadline", [None, 100])
def test_a_preferred_group_waits_for_one_domain_unless_its_deadline_says_a_split_finishes_sooner(
        deadline: int | None) -> None:
    clock = ManualClock()
    busy = {name: (0,) for name in ["a00", "a01", "a02", "b00", "b01", "b02"]}  # 3 whole trays free in each domain
    service, kube = _cluster(clock, busy=busy)
    members = [_pod(kube, f"w{i}", 4, group="six", size=6, deadline=deadline) for i in range(6)]
    assert _schedule(service, members[0]) is None
    clock.now += 601  # past the extender's 600 s, and past 2.56 x a 100 s deadline
    nodes = [_schedule(service, pod) for pod in members]
    if deadline is None:  # no run time stated: a split would run slower for its whole run, so it waits on
        assert nodes == [None] * 6
    else:
        assert sorted(Counter(_domain(node) for node in nodes if node).values()) == [3, 3]


@pytest.mark.parametrize("stated, extender, waits", [("0", 0.3, False), (None, 0.0, False), ("0.3", 0.0, True),
                                                     (None, 0.3, True), ("1", 0.3, True)])
def test_a_preferred_group_without_a_deadline_splits_at_once_only_where_a_split_costs_it_nothing(
        stated: str | None, extender: float, waits: bool) -> None:
    busy = {name: (0,) for name in ["a00", "a01", "a02", "b00", "b01", "b02"]}  # 3 whole trays free in each domain
    service, kube = _cluster(ManualClock(), busy=busy)
    service.groups.split_cost = split_slowdown(extender) - 1  # as --comm-share sets it
    share = {} if stated is None else {"gpu-topology.io/comm-share": stated}
    nodes = [_schedule(service, _pod(kube, f"w{i}", 4, group="six", size=6, **share)) for i in range(6)]
    if waits:
        assert nodes == [None] * 6
    else:
        assert sorted(Counter(_domain(node) for node in nodes if node).values()) == [3, 3]


def test_a_stated_deadline_waits_as_long_as_a_split_would_cost_it_at_its_communication_share() -> None:
    clock = ManualClock()
    busy = {name: (0,) for name in ["a00", "a01", "a02", "b00", "b01", "b02"]}
    service, kube = _cluster(clock, busy=busy)
    service.wait.wait_seconds = 1.0
    members = [_pod(kube, f"w{i}", 4, group="six", size=6, deadline=1000, **{"gpu-topology.io/comm-share": "0.1"})
               for i in range(6)]
    wait = 1000 * (split_slowdown(0.1) - 1)  # 0.1 x (811 / 85 - 1) x 1000 s: about 854 s
    assert 850 < wait < 860
    assert _schedule(service, members[0]) is None
    clock.now += wait - 5
    assert _schedule(service, members[0]) is None
    clock.now += 10
    assert None not in [_schedule(service, pod) for pod in members]


@pytest.mark.parametrize("share, kept", [("0.3", True), ("0", False)])
def test_a_preferred_group_keeps_a_declared_segment_whole_while_a_split_costs_it_anything(share: str,
                                                                                           kept: bool) -> None:
    clock = ManualClock()
    busy = {name: (0,) for name in ["a00", "a01", "a02", "b00", "b01", "b02"]}  # 3 whole trays free in each domain
    service, kube = _cluster(clock, busy=busy)
    annotations = {"gpu-topology.io/group-segment": "2", "gpu-topology.io/comm-share": share}
    first = _pod(kube, "w0", 4, group="pairs", size=8, deadline=100, **annotations)
    service.filter(ExtenderArgs(first, ALL, None))
    clock.now += 601  # past its wait: 600 s, the extender's, beyond 2.56 x its 100 s deadline at 0.3
    outcome = service.filter(ExtenderArgs(first, ALL, None))
    # 3 + 3 whole trays hold no 4 segments of 2 that cover 8: kept, it waits; at c = 0, member by member.
    assert (outcome.passed == []) is kept
    assert not service.state.ledger.pods()  # nothing held either way: member by member, each pod is placed alone
    plain = _pod(kube, "v0", 4, group="loose", size=8, deadline=100, **{"gpu-topology.io/comm-share": "0.3"})
    service.filter(ExtenderArgs(plain, ALL, None))
    clock.now += 601
    assert service.filter(ExtenderArgs(plain, ALL, None)).passed  # without a segment: member by member


def _bind_to(service: ExtenderService, pod: dict[str, Any], node: str) -> None:
    meta = pod["metadata"]
    assert service.filter(ExtenderArgs(pod, [node], None)).passed == [node]
    assert not service.bind(BindingArgs(meta["name"], meta["namespace"], meta["uid"], node))


def test_a_group_past_its_age_bound_drains_no_domain_predicted_to_free_beyond_the_horizon() -> None:
    clock = ManualClock()
    service, kube = _cluster(clock)
    service.groups.age_bound = 600.0
    for node in ("a00", "b00"):
        _bind_to(service, _pod(kube, f"long-{node}", 1), node)
    clock.now += DRAIN_HORIZON_SECONDS + 1  # each has run past the horizon: predicted to run as long again
    members = [_pod(kube, f"w{i}", 4, group="late", size=NODES_PER_DOMAIN) for i in range(NODES_PER_DOMAIN)]
    waiting = {"no NVLink domain with room for 6 pods of 4 GPUs": ALL}
    assert service.filter(ExtenderArgs(members[0], ALL, None)).unresolvable == waiting
    clock.now += 601
    assert service.filter(ExtenderArgs(members[0], ALL, None)).unresolvable == waiting
    assert len(service.drains) == 0


def test_the_group_waiting_longest_past_its_age_bound_drains_the_domain_predicted_to_free_soonest() -> None:
    clock = ManualClock()
    service, kube = _cluster(clock)
    service.groups.age_bound = 600.0
    _bind_to(service, _pod(kube, "old", 1), "a00")  # domain a: one pod, running for an hour by the time it matters
    clock.now += 3000
    for node in ("b00", "b01"):  # domain b: two pods, just started; a has more GPUs free, b frees sooner
        _bind_to(service, _pod(kube, f"young-{node}", 1), node)
    first = [_pod(kube, f"f{i}", 4, group="first", size=NODES_PER_DOMAIN) for i in range(NODES_PER_DOMAIN)]
    second = [_pod(kube, f"s{i}", 4, group="second", size=NODES_PER_DOMAIN) for i in range(NODES_PER_DOMAIN)]
    waiting = {"no NVLink domain with room for 6 pods of 4 GPUs": ALL}
    assert service.filter(ExtenderArgs(first[0], ALL, None)).unresolvable == waiting
    clock.now += 100
    assert service.filter(ExtenderArgs(second[0], ALL, None)).unresolvable == waiting
    assert len(service.drains) == 0  # within the age bound
    clock.now += 550  # the first past its bound, the second not yet
    drained = {"no NVLink domain with room for 6 pods of 4 GPUs; past its age bound, a domain is drained for it": ALL}
    assert service.filter(ExtenderArgs(first[0], ALL, None)).unresolvable == drained
    (drain,) = service.drains.in_force()
    assert drain.nodes == frozenset(_names("b"))  # predicted soonest: its pods are 650 s old, a's 3,650 s
    clock.now += 100  # both past the bound: only the one waiting longest drains
    assert service.filter(ExtenderArgs(second[0], ALL, None)).unresolvable == waiting
    registry = service.metrics.registry
    assert registry.get_sample_value("gpu_topology_extender_drains") == 1
    assert registry.get_sample_value("gpu_topology_extender_drains_started_total") == 1
    single = _pod(kube, "single", 1)  # single pods keep landing, outside the drained domain
    passed = service.filter(ExtenderArgs(single, ALL, None)).passed
    assert passed and {_domain(node) for node in passed} == {"a"}
    # A pod bound to end (activeDeadlineSeconds, and 30 s to stop) before the group is predicted to start there,
    # 650 s from now, backfills the drained domain; one that may run longer does not.
    short = _pod(kube, "short", 1, deadline=300)
    assert {_domain(node) for node in service.filter(ExtenderArgs(short, ALL, None)).passed} == {"a", "b"}
    _bind_to(service, short, "b05")
    long = _pod(kube, "long", 1, deadline=3600)
    assert {_domain(node) for node in service.filter(ExtenderArgs(long, ALL, None)).passed} == {"a"}
    assert kube.state is not None
    meta = long["metadata"]
    assert service.bind(BindingArgs(meta["name"], meta["namespace"], meta["uid"], "b04"))  # refused: drained
    for name in ("young-b00", "young-b01", "short"):  # they end: the first group gets the domain drained for it
        kube.state.pods.apply("DELETED", kube.pods[f"uid-{name}"])
    planned = service.filter(ExtenderArgs(first[0], ALL, None)).passed
    assert {_domain(node) for node in planned} == {"b"} and len(service.drains) == 0
    clock.now += 10  # and the second, now the longest waiting, drains next
    assert service.filter(ExtenderArgs(second[0], ALL, None)).unresolvable == drained
    assert len(service.drains) == 1


def test_two_groups_racing_for_the_last_free_domain_never_both_end_half_placed() -> None:
    service, kube = _cluster(ManualClock(), busy={name: (0, 1, 2, 3) for name in _names("a")})
    first = [_pod(kube, f"x{i}", 4, group="x", size=NODES_PER_DOMAIN) for i in range(NODES_PER_DOMAIN)]
    second = [_pod(kube, f"y{i}", 4, group="y", size=NODES_PER_DOMAIN) for i in range(NODES_PER_DOMAIN)]
    placed: dict[str, list[str | None]] = {"x": [], "y": []}
    for x, y in zip(first, second):  # their members interleave in the queue
        placed["x"].append(_schedule(service, x))
        placed["y"].append(_schedule(service, y))
    assert all(node is not None for node in placed["x"]) and {_domain(n) for n in placed["x"]} == {"b"}  # type: ignore[arg-type]
    assert placed["y"] == [None] * NODES_PER_DOMAIN  # not one member bound while its group cannot be placed


def test_an_extender_restart_between_members_rebuilds_the_plan_and_gives_nothing_twice() -> None:
    clock = ManualClock()
    service, kube = _cluster(clock)
    members = [_pod(kube, f"w{i}", 4, group="train") for i in range(4)]
    bound = [_schedule(service, pod) for pod in members[:2]]
    planned = set(service.filter(ExtenderArgs(members[2], ALL, None)).passed)
    # A new extender process (same seal key) lists the same nodes and pods.
    restarted, kube2 = _cluster(clock)
    kube2.pods = kube.pods
    restarted.state.pods.replace(list(kube.pods.values()))
    restored = restarted.plans.get("ml/train")
    assert restored is not None and {slot.node for slot in restored.slots} == planned | set(bound)  # type: ignore[operator]
    assert set(restarted.filter(ExtenderArgs(members[2], ALL, None)).passed) == planned
    rest = [_schedule(restarted, _pod(kube2, "intruder", 4))]  # another pod cannot take the planned trays
    assert rest[0] not in planned
    nodes = bound + [_schedule(restarted, pod) for pod in members[2:]]
    assert None not in nodes and len(set(nodes)) == 4 and len({_domain(n) for n in nodes}) == 1  # type: ignore[arg-type]
    for gpus in _held(restarted).values():
        assert len(gpus) == len(set(gpus))


def test_a_plan_whose_members_do_not_come_expires_and_frees_its_gpus() -> None:
    clock = ManualClock()
    service, kube = _cluster(clock)
    service.filter(ExtenderArgs(_pod(kube, "w0", 4, group="late"), ALL, None))
    assert service.state.ledger.pods()
    clock.now += service.plans.timeout + 1
    with service.state.ledger.lock:
        service.plans.expire(clock.now)
    assert not service.state.ledger.pods()
    assert all(service.state.view(name).free == 0b1111 for name in ALL)  # type: ignore[union-attr]


def test_a_refused_binding_gives_the_slot_back_to_the_plan() -> None:
    service, kube = _cluster(ManualClock())
    pod = _pod(kube, "w0", 4, group="train")
    node = service.filter(ExtenderArgs(pod, ALL, None)).passed[0]
    kube.refuse.add("w0")
    assert service.bind(BindingArgs("w0", "ml", "uid-w0", node))
    planned = [entry for entry in service.state.ledger.pods() if entry.phase is Phase.PLANNED]
    assert len(planned) == 4 and node in {entry.node for entry in planned}


@pytest.mark.parametrize(("annotations", "reason"), [
    ({"gpu-topology.io/group": "g", "gpu-topology.io/group-size": "1000000000"},
     "gpu-topology.io/group-size: '1000000000' is not a whole number of members from 1 to 1024"),
    ({"gpu-topology.io/group": "g"}, "gpu-topology.io/group-size: missing"),
    ({"gpu-topology.io/group": "Not_A_Name", "gpu-topology.io/group-size": "2"}, "is not a group name"),
    ({"gpu-topology.io/group-size": "2"}, "set without gpu-topology.io/group"),
    ({"gpu-topology.io/group": "g", "gpu-topology.io/group-size": "2", "gpu-topology.io/group-placement": "maybe"},
     "gpu-topology.io/group-placement: unknown value 'maybe'"),
    ({"gpu-topology.io/group": "g", "gpu-topology.io/group-size": "6", "gpu-topology.io/group-segment": "4"},
     "gpu-topology.io/group-segment: 4 does not divide the group's 6 members"),
    ({"gpu-topology.io/group": "g", "gpu-topology.io/group-size": "6", "gpu-topology.io/group-segment": "0"},
     "gpu-topology.io/group-segment: '0' is not a whole number of members from 1 to"),
    ({"gpu-topology.io/group-segment": "2"}, "gpu-topology.io/group-segment: set without gpu-topology.io/group"),
])
def test_a_hostile_group_annotation_gets_a_clear_reason_and_holds_nothing(annotations: dict[str, str],
                                                                          reason: str) -> None:
    service, kube = _cluster(ManualClock())
    pod = _pod(kube, "bad", 4, **annotations)
    outcome = service.filter(ExtenderArgs(pod, ALL, None))
    assert outcome.passed == [] and len(outcome.unresolvable) == 1
    assert reason in next(iter(outcome.unresolvable))
    assert not service.state.ledger.pods() and not len(service.plans)


def test_a_span_naming_no_level_is_refused_with_the_levels_there_are() -> None:
    service, kube = _cluster(ManualClock())
    pod = _pod(kube, "bad", 4, group="g", size=2, **{"gpu-topology.io/group-span": "topology.kubernetes.io/zone"})
    outcome = service.filter(ExtenderArgs(pod, ALL, None))
    assert outcome.unresolvable == {
        "gpu-topology.io/group-span: 'topology.kubernetes.io/zone' names no topology level; expected "
        f"nvlink-domain | {LEAF} | {SPINE}": ALL}
    assert not service.state.ledger.pods()


def test_a_group_may_span_a_leaf_and_members_without_gpus_pass_everywhere() -> None:
    service, kube = _cluster(ManualClock())
    pod = _pod(kube, "w0", 4, group="leafy", size=3, **{"gpu-topology.io/group-span": LEAF})
    assert len({_domain(node) for node in service.filter(ExtenderArgs(pod, ALL, None)).passed}) == 1
    launcher = _pod(kube, "launcher", 0, group="leafy", size=3, **{"gpu-topology.io/group-span": LEAF})
    assert service.filter(ExtenderArgs(launcher, ALL, None)).passed == ALL


def _planned(service: ExtenderService, kube: _Kube, group: str, segment: int | None, span: str = SPINE,
             placement: str = "required") -> list[str]:
    """The nodes the first member's filter passes: the plan's slots for a group of 8 trays of 4 GPUs."""
    extra = {"gpu-topology.io/group-span": span, "gpu-topology.io/group-placement": placement}
    if segment is not None:
        extra["gpu-topology.io/group-segment"] = str(segment)
    return service.filter(ExtenderArgs(_pod(kube, f"{group}-0", 4, group=group, size=8, **extra), ALL, None)).passed


def test_a_segment_keeps_its_members_in_one_nvlink_domain_when_the_group_spans_more() -> None:
    """Eight trays across a spine of two 6-tray domains: unsegmented, the fullest-first layout takes one domain
    whole and two trays of the other; in segments of 4, four and four."""
    service, kube = _cluster(ManualClock())
    assert sorted(_domain(node) for node in _planned(service, kube, "plain", None)) == ["a"] * 6 + ["b"] * 2
    service, kube = _cluster(ManualClock())
    assert sorted(_domain(node) for node in _planned(service, kube, "halves", 4)) == ["a"] * 4 + ["b"] * 4
    assert all(len(nodes) == len(set(nodes)) for nodes in _held(service).values())


def test_a_group_whose_segments_fit_no_domain_now_waits_though_its_members_would_fit() -> None:
    """Three trays free in domain a, six in b: eight members fit, but not two segments of four."""
    busy = {name: (0, 1, 2, 3) for name in _names("a")[:3]}
    service, kube = _cluster(ManualClock(), busy=busy)
    assert len(_planned(service, kube, "plain", None)) == 8
    service, kube = _cluster(ManualClock(), busy=busy)
    assert _planned(service, kube, "halves", 4) == [] and not len(service.plans)


def test_a_group_larger_than_any_domain_is_refused_when_required_and_placed_alone_when_preferred() -> None:
    service, kube = _cluster(ManualClock())
    required = _pod(kube, "r0", 4, group="huge", size=20, **{"gpu-topology.io/group-placement": "required"})
    outcome = service.filter(ExtenderArgs(required, ALL, None))
    assert outcome.unresolvable == {"no NVLink domain can hold the group's pods of 4 GPUs": ALL}
    preferred = _pod(kube, "p0", 4, group="wide", size=20)
    assert service.filter(ExtenderArgs(preferred, ALL, None)).passed == ALL


def test_single_pods_go_to_a_partly_used_domain_and_keep_empty_ones_whole() -> None:
    service, kube = _cluster(ManualClock(), busy={"a00": (0,)})
    single = _pod(kube, "solo", 1)
    names, scores = service.prioritize(ExtenderArgs(single, ALL, None))
    by_node = dict(zip(names, scores))
    assert min(by_node[name] for name in _names("a")) > max(by_node[name] for name in _names("b"))
    assert _domain(_schedule(service, single) or "") == "a"
    assert service.state.domains.whole == set(_names("b"))


def _pod_group(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec, "kind": kind}


def test_a_coscheduling_pod_group_gives_the_size_and_the_group_is_planned_whole() -> None:
    service, kube = _cluster(ManualClock())
    sizes = GroupSizes(COSCHEDULING, service.state.group_sizes)
    labelled = _pod(kube, "w0", 4)
    labelled["metadata"]["labels"] = {"scheduling.x-k8s.io/pod-group": "pg"}
    kube.state.pods.apply("MODIFIED", labelled)  # type: ignore[union-attr]
    # No PodGroup yet: a preferred group without a size is placed as single pods.
    assert service.filter(ExtenderArgs(labelled, ALL, None)).passed == ALL
    labelled["metadata"]["resourceVersion"] = "2"
    sizes.replace([_pod_group("PodGroup", "pg", {"minMember": 3}), _pod_group("PodGroup", "bad", {"minMember": 10**9})])
    assert service.state.group_sizes == {"ml/coscheduling:pg": 3}
    outcome = service.filter(ExtenderArgs(labelled, ALL, None))
    assert len(outcome.passed) == 3 and len({_domain(node) for node in outcome.passed}) == 1
    sizes.apply("DELETED", _pod_group("PodGroup", "pg", {"minMember": 3}))
    assert service.state.group_sizes == {}


def test_kube_schedulers_own_pod_group_gives_its_gang_min_count() -> None:
    sizes: dict[str, int] = {}
    sink = GroupSizes(SCHEDULING_GROUP, sizes)
    sink.replace([_pod_group("PodGroup", "gang", {"schedulingPolicy": {"gang": {"minCount": 5}}}),
                  _pod_group("PodGroup", "basic", {"schedulingPolicy": {"basic": {}}})])
    assert sizes == {"ml/scheduling-group:gang": 5}
    pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"},
           "spec": {"schedulingGroup": {"podGroupName": "gang"},
                    "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    request = parse_pod(pod, AnnotationKeys())
    assert request.group_key == "ml/scheduling-group:gang" and request.group is not None
    assert request.group.span == "nvlink-domain" and not request.group.required


def test_a_member_asking_another_gpu_count_than_its_group_plan_is_told_why() -> None:
    service, kube = _cluster(ManualClock())
    service.filter(ExtenderArgs(_pod(kube, "w0", 4, group="train"), ALL, None))
    outcome = service.filter(ExtenderArgs(_pod(kube, "w1", 2, group="train"), ALL, None))
    assert outcome.unresolvable == {
        "group train: its members must request the same number of GPUs (the group's plan gives 4 to each)": ALL}


def test_a_group_of_one_gpu_members_is_planned_on_single_gpus() -> None:
    service, kube = _cluster(ManualClock(), busy={name: (0, 1) for name in _names("a")})
    outcome = service.filter(ExtenderArgs(_pod(kube, "w0", 1, group="tiny", size=8,
                                               **{"gpu-topology.io/group-placement": "required"}), ALL, None))
    assert outcome.passed and {_domain(node) for node in outcome.passed} == {"a"}  # best fit: the used rack
    assert sum(len(entry.gpus) for entry in service.state.ledger.pods() if entry.phase is Phase.PLANNED) == 8


def test_a_node_without_multi_node_nvlink_is_an_nvlink_domain_of_its_own() -> None:
    # DGX H100s with no clique label and no levels: a group of two 4-GPU members spanning an NVLink domain shares
    # one node's NVSwitch, and the fuller node is filled first.
    state = reported_cluster({"h1": ("dgx-h100", (0,)), "h2": ("dgx-h100", ())}, clock=ManualClock(), seal=SEAL)
    kube = _Kube()
    kube.state = state
    service = ExtenderService(state, kube, topology_wait=600.0, one_best=False)  # type: ignore[arg-type]
    pod = _pod(kube, "w0", 3, group="pair", size=2)
    assert service.filter(ExtenderArgs(pod, ["h1", "h2"], None)).passed == ["h1"]
    assert not state.domains.whole  # a node's own domain is no rack to keep whole


def test_a_waiting_group_is_searched_again_only_once_a_node_changes_or_a_second_passes() -> None:
    clock = ManualClock()
    service, kube = _cluster(clock, busy={name: (0,) for name in ALL[::2]})
    searches: list[str] = []
    search = service.groups._plan
    service.groups._plan = lambda *args: searches.append("plan") or search(*args)  # type: ignore[method-assign]
    pod = _pod(kube, "w0", 4, group="big", **{"gpu-topology.io/group-placement": "required"})
    for _ in range(5):  # kube-scheduler retrying a waiting gang back to back
        assert not service.filter(ExtenderArgs(pod, ALL, None)).passed
    assert len(searches) == 1
    clock.now += 1.0
    service.filter(ExtenderArgs(pod, ALL, None))
    assert len(searches) == 2
    service.state.ledger.release("nobody", freed=True)  # no view changes: still remembered
    service.filter(ExtenderArgs(pod, ALL, None))
    assert len(searches) == 2
    assert _schedule(service, _pod(kube, "solo2", 1)) is not None  # a bind changes a node's view
    service.filter(ExtenderArgs(pod, ALL, None))
    assert len(searches) == 3


def test_a_group_is_planned_only_on_the_nodes_kube_scheduler_passed_for_its_member() -> None:
    # Rack a is the best fit, but the member's node selector (which kube-scheduler applies, not the extender)
    # leaves only rack b's trays among the candidates.
    service, kube = _cluster(ManualClock(), busy={"a00": (0, 1, 2, 3)})
    pod = _pod(kube, "w0", 4, group="picky", size=3)
    outcome = service.filter(ExtenderArgs(pod, _names("b"), None))
    assert len(outcome.passed) == 3 and {_domain(node) for node in outcome.passed} == {"b"}
    assert {entry.node[0] for entry in service.state.ledger.pods()} == {"b"}


def test_segments_go_to_the_domain_they_fill_best_then_to_the_roomiest() -> None:
    assert fewest_blocks({"a": 2, "b": 4}, 2) == [("a", 2)]  # a is left with nothing spare; b would keep 2
    assert fewest_blocks({"a": 2, "b": 4}, 5) == [("b", 4), ("a", 1)]
    assert fewest_blocks({"a": 2, "b": 4, "c": 0}, 7) is None


def test_a_segment_no_nvlink_domain_of_the_candidates_can_hold_is_refused_not_waited_for() -> None:
    service, kube = _cluster(ManualClock())
    # 6 trays a domain hold 6 members of 4 GPUs: a segment of 8 never fits, however long the group waits.
    pod = _pod(kube, "w0", 4, group="wide", size=8, **{"gpu-topology.io/group-segment": "8",
                                                       "gpu-topology.io/group-span": SPINE,
                                                       "gpu-topology.io/group-placement": "required"})
    reason = "gpu-topology.io/group-segment: no NVLink domain of these nodes holds 8 pods of 4 GPUs"
    assert service.filter(ExtenderArgs(pod, ALL, None)).unresolvable == {reason: ALL}
    fits = _pod(kube, "v0", 4, group="fits", size=8, **{"gpu-topology.io/group-segment": "4",
                                                        "gpu-topology.io/group-span": SPINE,
                                                        "gpu-topology.io/group-placement": "required"})
    assert len(service.filter(ExtenderArgs(fits, ALL, None)).passed) == 8


def test_a_preferred_group_whose_segment_no_domain_holds_is_planned_as_if_it_set_none() -> None:
    service, kube = _cluster(ManualClock())
    members = [_pod(kube, f"w{i}", 4, group="wide", size=8, **{"gpu-topology.io/group-segment": "8",
                                                                "gpu-topology.io/group-span": SPINE})
               for i in range(8)]
    assert len(service.filter(ExtenderArgs(members[0], ALL, None)).passed) == 8  # its plan's 8 nodes, not all 12
    nodes = [_schedule(service, pod) for pod in members]
    assert None not in nodes and len(set(nodes)) == 8  # planned whole across both domains, not refused


def test_a_group_on_dra_trays_is_planned_on_the_first_fits_and_binds_no_gpu_of_ours() -> None:
    """Each member as kube-scheduler runs it on DRA nodes: filter, prioritize, then its DRA plugin's PreBind
    allocates the claim (first fit in slice order) before the extender's bind sees the pod."""
    service, kube = _cluster(ManualClock())
    for name in ALL:
        uuids = [gpu.uuid or "" for gpu in with_uuids(name, PLATFORMS["gb200-node"].topology()).gpus]
        service.state.slices.apply("ADDED", gpu_slice(name, uuids, seed=len(name) + int(name[1:])))
    members = [_pod(kube, f"w{i}", 2, group="halves", size=4) for i in range(4)]
    for index, pod in enumerate(members):
        outcome = service.filter(ExtenderArgs(pod, list(ALL), None))
        names, scores = service.prioritize(ExtenderArgs(pod, outcome.passed, None))
        node = max(zip(scores, names))[1]
        view = service.state.view(node)
        assert view is not None and view.compiled is not None and view.dra_order is not None
        # What kube-scheduler's allocator gives: the first fit among the devices no claim holds (it knows
        # nothing of the extender's plans).
        given = first_fit(view.compiled.full_mask & ~view.dra_taken, view.dra_order, 2)
        planned = {view.mask(entry.gpus) for entry in service.state.ledger.entries(node)
                   if entry.phase is Phase.PLANNED}
        assert given in planned  # the plan foresaw the allocator's pick
        claim = allocated_claim(f"c{index}", node, [f"gpu-{gpu}" for gpu in range(4) if given >> gpu & 1],
                                pods=[pod["metadata"]["uid"]])
        service.state.claims.apply("ADDED", claim)  # kube-scheduler's PreBind
        meta = pod["metadata"]
        assert not service.bind(BindingArgs(meta["name"], meta["namespace"], meta["uid"], node))
        assert "gpu-topology.io/gpus" not in meta["annotations"]
        held = service.state.ledger.get(meta["uid"])
        view = service.state.view(node)
        assert held is not None and view is not None and view.mask(held.gpus) == given
    nodes = {service.state.ledger.get(pod["metadata"]["uid"]).node for pod in members}  # type: ignore[union-attr]
    assert len({_domain(node) for node in nodes}) == 1


def test_a_member_whose_planned_gpus_another_pod_took_meanwhile_gets_none_of_them() -> None:
    """The kubelet gave one GPU of a planned slot to another pod (a plugin that ignores us) before the member's
    bind: the bind fails, the plan is dropped for its members to be planned again, and the member holds nothing;
    never the slot's GPUs beside the other pod's (found by make mutate: a check that needed the count to differ
    too, issue 31)."""
    from datetime import datetime, timezone

    from topology.codec import NodeState, encode_state, encode_topology

    clock = ManualClock()
    service, kube = _cluster(clock)
    pod = _pod(kube, "w0", 4, group="train")
    node = service.filter(ExtenderArgs(pod, ALL, None)).passed[0]
    topology = with_uuids(node, PLATFORMS["gb200-node"].topology())
    report = NodeState(frozenset({topology.gpus[0].uuid}), frozenset(), datetime.fromtimestamp(clock(), timezone.utc),
                       2, {"ml/other": frozenset({topology.gpus[0].uuid})})
    state = service.state
    state.nodes.apply("MODIFIED", {"metadata": {"name": node, "labels": {
        "nvidia.com/gpu.clique": DOMAINS[node[0]], SPINE: "s1", LEAF: f"leaf-{node[0]}"}, "annotations": {
        state.keys.topology: encode_topology(topology), state.keys.state: encode_state(report)}}})
    answer = service.bind(BindingArgs("w0", "ml", "uid-w0", node))
    assert "no longer free" in answer, answer
    assert state.ledger.get("uid-w0") is None and service.plans.get("train") is None
    assert "spec" not in kube.pods["uid-w0"] or "nodeName" not in kube.pods["uid-w0"]["spec"]
