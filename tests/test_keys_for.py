"""ClusterState.keys_for: names that stand in order among the last lookup's are found there, and only while no
node's key has changed since (a report of other busy GPUs, a node removed); what it answers is always what a fresh
lookup would."""

from __future__ import annotations

from datetime import UTC, datetime

from extender.demo_cluster import with_uuids
from extender.state import ClusterState, NodeKey
from topology.codec import NodeState, encode_state, encode_topology
from topology.platforms import PLATFORMS

NAMES = ["a", "b", "c", "d"]


def _node(state: ClusterState, name: str, used: tuple[int, ...] = ()) -> dict:
    """The node as its reporter publishes it: an RTX A6000 board with `used` GPUs busy."""
    topology = with_uuids(name, PLATFORMS["rtx-a6000-pairs"].topology())
    reported = NodeState(frozenset(topology.gpus[i].uuid for i in used), frozenset(), datetime.now(UTC), 1)
    return {"metadata": {"name": name, "annotations": {state.keys.topology: encode_topology(topology),
                                                       state.keys.state: encode_state(reported)}}}


def _state() -> ClusterState:
    state = ClusterState()
    state.nodes.replace([_node(state, name) for name in NAMES])
    return state


def _fresh(state: ClusterState, names: list[str]) -> list:
    """What a lookup answers now, past anything keys_for remembers."""
    return [state._keys.get(name) for name in names]


def test_the_names_filter_passed_are_found_among_its_own() -> None:
    state = _state()
    everything = state.keys_for(list(NAMES))
    passed = ["a", "c", "d"]  # a new list of new strings, as prioritize's body parses
    assert state.keys_for(["".join(name) for name in passed]) == [everything[0], everything[2], everything[3]]
    assert state.keys_for(["d", "a"]) == _fresh(state, ["d", "a"])  # out of order: looked up
    assert state.keys_for(["a", "nowhere"]) == [everything[0], None]


def test_a_key_that_changed_since_is_looked_up_again() -> None:
    state = _state()
    before = state.keys_for(list(NAMES))
    state.nodes.apply("MODIFIED", _node(state, "c", used=(0, 1)))
    after = state.keys_for(["a", "c"])
    assert after == _fresh(state, ["a", "c"]) and after[1] is not before[2]
    assert isinstance(after[1], NodeKey) and after[1].free.bit_count() == 6


def test_a_node_removed_since_is_none() -> None:
    state = _state()
    state.keys_for(list(NAMES))
    state.nodes.apply("DELETED", {"metadata": {"name": "b"}})
    assert state.keys_for(["a", "b"]) == [_fresh(state, ["a"])[0], None]


def test_a_heartbeat_leaves_every_key_as_it_was() -> None:
    state = _state()
    before = state.keys_for(list(NAMES))
    state.nodes.apply("MODIFIED", _node(state, "b"))  # the same state, republished
    assert state.keys_for(["b", "c"]) == before[1:3] == _fresh(state, ["b", "c"])
