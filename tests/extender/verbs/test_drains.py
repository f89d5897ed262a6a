"""Draining (extender/verbs/drains.py): a pod that every candidate refused only to wait for a full-bandwidth set gets
the full set nearest to free drained for it; other pods' filter, prioritize and bind no longer see its free GPUs.
On the real PCIe L40S board: GPUs 0-3 on one socket, 4-7 on the other (a full set of four is a socket)."""

from __future__ import annotations

from extender.api.wire import BindingArgs, ExtenderArgs
from extender.cache.cluster_state import ClusterState, NodeKey
from extender.demo.cluster import DemoCluster
from extender.verbs.drains import Drains
from extender.verbs.filter import NOT_ENOUGH_FREE
from extender.verbs.service import ExtenderService
from extender.verbs.wait import WAITING
from helpers.reported_nodes import ManualClock, reported_cluster
from topology.full_sets import full_set_masks
from topology.select import Selector

WAIT = 300.0
SOCKET_1 = 0b11110000


Clock = ManualClock


def _pod(uid: str, gpus: int) -> dict:
    return {"metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1"},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def _service(clock: Clock, used: dict[str, tuple[str, tuple[int, ...]]]) -> ExtenderService:
    state = reported_cluster(used, clock=clock, stale_after=100 * WAIT)
    unused = DemoCluster(ClusterState(), [])  # filter and prioritize never call the API server
    return ExtenderService(state, unused, topology_wait=WAIT, one_best=False)


# Node a: GPUs 0, 1, 2 and 7 busy, so 3-6 are free but no socket is: the 4-GPU pod must wait.
SPLIT = {"a": ("pcie-l40s", (0, 1, 2, 7))}


def test_a_waiting_pod_drains_the_socket_nearest_to_free() -> None:
    service = _service(Clock(), SPLIT)
    outcome = service.filter(ExtenderArgs(_pod("train", 4), ["a"], None))
    assert outcome.failed == {WAITING: ["a"]}
    # Socket 4-7 has three GPUs free, socket 0-3 one: 4-7 is drained, its busy GPU7 as it frees up.
    assert service.drains.held("a", "someone-else", service.state.clock()) == SOCKET_1
    assert service.drains.held("a", "train", service.state.clock()) == 0


def test_other_pods_no_longer_see_the_drained_gpus() -> None:
    service = _service(Clock(), SPLIT)
    service.filter(ExtenderArgs(_pod("train", 4), ["a"], None))
    assert service.filter(ExtenderArgs(_pod("small", 1), ["a"], None)).passed == ["a"]  # GPU3 is still free
    assert service.filter(ExtenderArgs(_pod("pair", 2), ["a"], None)).failed == {NOT_ENOUGH_FREE: ["a"]}


def test_the_drain_ends_with_the_wait() -> None:
    clock = Clock()
    service = _service(clock, SPLIT)
    service.filter(ExtenderArgs(_pod("train", 4), ["a"], None))
    clock.now += WAIT
    assert service.drains.held("a", "pair", clock.now) == 0
    assert service.filter(ExtenderArgs(_pod("pair", 2), ["a"], None)).passed == ["a"]
    # The waiting pod now takes the best set on offer.
    assert service.filter(ExtenderArgs(_pod("train", 4), ["a"], None)).passed == ["a"]


def test_bind_gives_other_pods_no_drained_gpu_and_the_drain_ends_when_its_pod_binds() -> None:
    clock = Clock()
    state = ClusterState(clock=clock, stale_after=100 * WAIT)
    cluster = DemoCluster(state, [("a", "pcie-l40s")], clock=clock)
    service = ExtenderService(state, cluster, topology_wait=WAIT, one_best=False)
    (key,) = state.keys_for(["a"])
    assert isinstance(key, NodeKey)
    drain = service.drains.start("waiting", [("a", key)], service.selector, 4, clock.now + WAIT, clock.now)
    assert drain is not None and drain.nodes == {"a"} and dict(drain.targets)["a"] in (0b00001111, SOCKET_1)
    index = {gpu.uuid: gpu.index for gpu in cluster.topologies["a"].gpus}
    for number in range(4):
        pod = cluster.create_pod(f"small-{number}", 1)
        assert service.bind(BindingArgs(pod["metadata"]["name"], "default", pod["metadata"]["uid"], "a")) == ""
        (gpus,) = cluster.delivered[pod["metadata"]["uid"]].values()
        assert not dict(drain.targets)["a"] >> index[gpus[0]] & 1, "a drained GPU went to another pod"
    pod = cluster.create_pod("waiting-pod", 4)
    service.drains.end("waiting")
    uid = pod["metadata"]["uid"]
    service.drains.start(uid, [("a", state.keys_for(["a"])[0])], service.selector, 4, clock.now + WAIT, clock.now)
    assert service.bind(BindingArgs("waiting-pod", "default", uid, "a")) == ""
    assert len(service.drains) == 0


def test_drains_are_bounded_and_never_overlap() -> None:
    clock = Clock()
    state = reported_cluster({"a": ("pcie-l40s", ())}, clock=clock)
    (key,) = state.keys_for(["a"])
    assert isinstance(key, NodeKey)
    drains = Drains(state, limit=2)
    first = drains.start("p1", [("a", key)], Selector(), 4, clock.now + WAIT, clock.now)
    second = drains.start("p2", [("a", key)], Selector(), 4, clock.now + WAIT, clock.now)
    assert first is not None and second is not None and not dict(first.targets)["a"] & dict(second.targets)["a"]
    assert drains.start("p3", [("a", key)], Selector(), 2, clock.now + WAIT, clock.now) is None  # the bound
    assert drains.start("p1", [("a", key)], Selector(), 4, clock.now + WAIT, clock.now) == first  # kept


def test_many_drained_nodes_are_hidden_from_every_other_pod_and_shown_to_their_own() -> None:
    clock = Clock()
    nodes = {f"n{index:02d}": ("pcie-l40s", (0, 1, 2, 7)) for index in range(40)}
    service = _service(clock, nodes)
    names = sorted(nodes)
    for name in names[::2]:  # 20 pods each drain socket 4-7 of a node of their own
        assert service.filter(ExtenderArgs(_pod(f"wait-{name}", 4), [name], None)).failed == {WAITING: [name]}
    assert len(service.drains) == 20
    seen = service.drains.seen(names, "someone-else", clock.now)
    for name, key in zip(names, seen, strict=True):
        assert isinstance(key, NodeKey)
        assert key.free == (0b00001000 if name in names[::2] else 0b01111000), name  # only GPU3 left where drained
    own = service.drains.seen(names, f"wait-{names[4]}", clock.now)
    assert [key.free for key in own if isinstance(key, NodeKey)] == [
        0b01111000 if name == names[4] or name not in names[::2] else 0b00001000 for name in names]
    assert service.filter(ExtenderArgs(_pod("pair", 2), names, None)).passed == names[1::2]
    service.drains.end(f"wait-{names[0]}")
    assert service.filter(ExtenderArgs(_pod("pair", 2), names, None)).passed == sorted([names[0], *names[1::2]])
    clock.now += WAIT  # every drain's wait is over: nothing is held back any more
    assert service.filter(ExtenderArgs(_pod("pair", 2), names, None)).passed == names
    assert len(service.drains) == 0


SOCKET_0 = 0b00001111


def test_a_groups_sets_that_share_a_gpu_with_a_drain_in_force_are_refused_whole() -> None:
    """README: drains never overlap. A group's sets come from the planner's view, where other drains' free GPUs are
    hidden but their busy ones are not: a pod's drain of socket 4-7 on node a holds busy GPU7 too. A group whose sets
    share any GPU with it drains nothing, on no node, and the pod's drain keeps what it holds."""
    clock = Clock()
    state = reported_cluster({"a": ("pcie-l40s", (0, 1, 2, 7)), "b": ("pcie-l40s", ())}, clock=clock)
    drains = Drains(state)
    (key,) = state.keys_for(["a"])
    assert isinstance(key, NodeKey)
    pod = drains.start("pod", [("a", key)], Selector(), 4, clock.now + WAIT, clock.now)
    assert pod is not None and pod.targets == (("a", SOCKET_1),)
    (seen,) = drains.seen(["a"], "group", clock.now)
    assert isinstance(seen, NodeKey) and seen.free == 0b00001000  # GPU7 is busy, not hidden: the planner may pick it
    assert drains.start_sets("group", [("b", SOCKET_0), ("a", SOCKET_1)], clock.now + WAIT, clock.now) is None
    assert drains.in_force() == [pod]
    assert drains.held("a", "someone", clock.now) == SOCKET_1 and drains.held("b", "someone", clock.now) == 0
    # Sets clear of every drain are drained.
    group = drains.start_sets("group", [("b", SOCKET_0), ("a", SOCKET_0)], clock.now + WAIT, clock.now)
    assert group is not None and group.nodes == {"a", "b"}
    assert drains.held("a", "someone", clock.now) == SOCKET_0 | SOCKET_1


def test_two_groups_never_drain_the_same_gpus() -> None:
    """Groups of 2-GPU members: a second group's pairs that share one GPU with the first group's are refused whole;
    the first keeps its own. The pairs are the board's full-bandwidth sets of two (a socket's GPUs)."""
    clock = Clock()
    state = reported_cluster({"a": ("pcie-l40s", ()), "b": ("pcie-l40s", ())}, clock=clock)
    (key,) = state.keys_for(["a"])
    assert isinstance(key, NodeKey)
    pairs = list(full_set_masks(Selector(), key.compiled, key.compiled.full_mask, 2))
    assert 0b0011 in pairs and 0b0110 in pairs and 0b1100 in pairs
    drains = Drains(state)
    first = drains.start_sets("first", [("a", 0b0011), ("b", 0b0011)], clock.now + WAIT, clock.now)
    assert first is not None
    assert drains.start_sets("second", [("a", 0b1100), ("b", 0b0110)], clock.now + WAIT, clock.now) is None  # GPU1
    assert drains.in_force() == [first]
    assert [drains.held(node, "someone", clock.now) for node in ("a", "b")] == [0b0011, 0b0011]
    assert drains.held("b", "first", clock.now) == 0  # its own sets are not held from its members
    second = drains.start_sets("second", [("a", 0b1100), ("b", 0b1100)], clock.now + WAIT, clock.now)
    assert second is not None and len(drains) == 2
    assert [drains.held(node, "someone", clock.now) for node in ("a", "b")] == [0b1111, 0b1111]


def test_a_second_drain_on_a_node_skips_the_set_nearest_to_free_when_it_is_drained_already() -> None:
    """GPUs 0, 1, 2 and 7 busy: socket 4-7 is nearest to free and goes to the first pod. For the second, that socket
    is still nearest to free, but drained: it gets socket 0-3, however far, never a share of the first's (found by
    make mutate: an overlap check that only held while no set had been picked yet, issue 31)."""
    clock = Clock()
    state = reported_cluster(SPLIT, clock=clock)
    (key,) = state.keys_for(["a"])
    assert isinstance(key, NodeKey)
    drains = Drains(state, limit=2)
    first = drains.start("p1", [("a", key)], Selector(), 4, clock.now + WAIT, clock.now)
    second = drains.start("p2", [("a", key)], Selector(), 4, clock.now + WAIT, clock.now)
    assert first is not None and dict(first.targets)["a"] == SOCKET_1
    assert second is not None and dict(second.targets)["a"] == SOCKET_0
