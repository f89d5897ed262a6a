"""A DRA node's free GPUs in the cluster state: what its claims hold is taken, counted once beside the ledger."""

from __future__ import annotations

from extender.cache.assignments import Assignment, Phase
from extender.cache.cluster_state import ClusterState
from extender.cache.node_view import NodeKey
from extender.demo.cluster import with_uuids
from extender.demo.dra_objects import allocated_claim, channel_slice, gpu_device, gpu_slice
from helpers.reported_nodes import ManualClock, reported_cluster
from topology.platforms import PLATFORMS

DRA, PLUGIN = "a6000-dra", "a6000-dp"


def _uuids(node: str) -> list[str]:
    return [gpu.uuid or "" for gpu in with_uuids(node, PLATFORMS["rtx-a6000-pairs"].topology()).gpus]


def _state() -> tuple[ClusterState, ManualClock]:
    clock = ManualClock()
    state = reported_cluster({DRA: ("rtx-a6000-pairs", ()), PLUGIN: ("rtx-a6000-pairs", ())}, clock=clock)
    state.slices.replace([gpu_slice(DRA, _uuids(DRA), seed=11), channel_slice(PLUGIN)])
    state.claims.replace([])
    return state, clock


def _free(state: ClusterState, node: str) -> list[int]:
    view = state.view(node)
    assert view is not None
    return [i for i in range(view.size) if view.free >> i & 1]


def test_the_gpus_a_claim_holds_are_not_free_and_come_back_when_it_goes() -> None:
    state, _ = _state()
    assert _free(state, DRA) == list(range(8))
    claim = allocated_claim("c1", DRA, ["gpu-0", "gpu-5"], pods=["p1"])
    state.claims.apply("ADDED", claim)
    assert _free(state, DRA) == [1, 2, 3, 4, 6, 7]
    assert _free(state, PLUGIN) == list(range(8))  # same device names, another pool: nothing taken there
    state.claims.apply("DELETED", claim)
    assert _free(state, DRA) == list(range(8))


def test_a_pod_bound_with_a_claim_is_counted_once_by_its_claim_and_a_reservation_until_then() -> None:
    state, clock = _state()
    uuids = _uuids(DRA)
    state.ledger.reserve("p1", "ml/p1", DRA, frozenset(uuids[0:2]))  # our bind's choice: the NVLink pair 0-1
    assert _free(state, DRA) == list(range(2, 8))
    # kube-scheduler's allocator gave the pod GPUs 0 and 5: the claim is the truth, the reservation counts no more.
    state.claims.apply("ADDED", allocated_claim("c1", DRA, ["gpu-0", "gpu-5"], pods=["p1"]))
    assert _free(state, DRA) == [1, 2, 3, 4, 6, 7]
    # A plan's open slot on the node is nobody's claim: it still counts.
    state.ledger.hold("slot", "ml/group", DRA, frozenset(uuids[6:8]), clock())
    assert _free(state, DRA) == [1, 2, 3, 4]
    assert state.ledger.get("slot") == Assignment("slot", "ml/group", DRA, frozenset(uuids[6:8]), clock(),
                                                  Phase.PLANNED)


def test_a_pool_not_yet_complete_gives_the_node_no_gpu_and_a_node_report_keeps_what_dra_takes() -> None:
    state, _ = _state()
    state.slices.apply("MODIFIED", gpu_slice(DRA, _uuids(DRA), generation=2, count=2))
    assert _free(state, DRA) == []
    state.slices.apply("MODIFIED", gpu_slice(DRA, _uuids(DRA), generation=3))
    state.claims.apply("ADDED", allocated_claim("c1", DRA, ["gpu-3"]))
    view = state.view(DRA)
    assert view is not None
    state.nodes.apply("MODIFIED", {"metadata": {"name": DRA, "annotations": {
        state.keys.topology: view.raw_topology}}})  # the node changes (a heartbeat, a label): DRA's part stays
    assert _free(state, DRA) == [0, 1, 2, 4, 5, 6, 7]


def test_a_dra_nodes_key_gives_the_first_free_gpus_in_slice_order() -> None:
    state, _ = _state()
    key = state.keys_for([DRA, PLUGIN])
    dra, plugin = key
    assert isinstance(dra, NodeKey) and isinstance(plugin, NodeKey)
    order = [int(device["name"].split("-")[1]) for device in gpu_slice(DRA, _uuids(DRA), seed=11)["spec"]["devices"]]
    assert dra.order == tuple(order) and plugin.order is None
    assert dra.deliverable(3) == sum(1 << gpu for gpu in order[:3])
    assert plugin.deliverable(3) == plugin.free
    state.claims.apply("ADDED", allocated_claim("c1", DRA, [f"gpu-{order[0]}"]))
    dra = state.keys_for([DRA])[0]
    assert isinstance(dra, NodeKey) and dra.deliverable(2) == (1 << order[1]) | (1 << order[2])


def test_dra_nodes_of_other_orders_share_the_key_of_what_their_first_fit_gives() -> None:
    clock = ManualClock()
    nodes = {f"dra-{index}": ("rtx-a6000-pairs", ()) for index in range(3)}
    state = reported_cluster(nodes, clock=clock)
    orders = {"dra-0": (4, 5, 0, 1, 2, 3, 6, 7), "dra-1": (4, 5, 1, 0, 7, 6, 3, 2), "dra-2": (0, 5, 4, 1, 2, 3, 6, 7)}
    for name, order in orders.items():
        uuids = [gpu.uuid or "" for gpu in with_uuids(name, PLATFORMS["rtx-a6000-pairs"].topology()).gpus]
        state.slices.apply("ADDED", gpu_slice(name, (), seed=None, devices=[gpu_device(i, uuids[i]) for i in order]))
    keys = state.keys_for(list(orders))
    assert len(set(keys)) == 3  # three orders, three keys
    given = state.given_keys(2)
    assert given is not None
    assert given[keys[0]] is given[keys[1]] is not given[keys[2]]  # 4-5 first on both, 0-5 on the third
    assert given[keys[0]].deliverable(2) == 0b110000
    sized = state.given_keys(3)
    assert sized is not None and sized[keys[0]] is not given[keys[0]]  # each size has its own
    assert reported_cluster(nodes).given_keys(2) is None  # no DRA node: nothing to read through


def test_forgetting_dead_keys_keeps_what_live_dra_keys_give_and_drops_the_rest() -> None:
    state, _ = _state()
    (before,) = state.keys_for([DRA])
    state.claims.apply("ADDED", allocated_claim("c1", DRA, ["gpu-0"]))  # a new free mask: a new key
    (after,) = state.keys_for([DRA])
    assert isinstance(before, NodeKey) and isinstance(after, NodeKey) and before is not after
    state._forget_dead_keys()  # as when the intern table passes its bound
    table = state.given_keys(2)
    assert table is not None and after in table and before not in table
    assert state._intern(*table[after].value) is table[after]  # still the interned one
