"""ClusterState.own_names: a request's names as the node tables' own str objects."""

from __future__ import annotations

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster


def test_own_names_are_the_node_tables_objects_and_others_stay_as_they_are() -> None:
    state = ClusterState()
    DemoCluster(state)
    known = next(iter(state.views()))
    asked = ["".join(known), "no-such-node"]  # equal to a node's name, but another object
    own = state.own_names(asked)
    assert own == asked
    assert own[0] is known and own[0] is not asked[0]
    assert own[1] is asked[1]


def test_a_deleted_node_name_is_no_longer_held() -> None:
    state = ClusterState()
    DemoCluster(state)
    gone = next(iter(state.views()))
    state.nodes.apply("DELETED", {"metadata": {"name": gone}})
    asked = ["".join(gone)]
    assert state.own_names(asked)[0] is asked[0]
