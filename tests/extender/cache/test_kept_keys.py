"""The keys kept for name lists that requests repeat (cache/kept_keys.py) are the keys a fresh lookup gives, as nodes
come, change, hold GPUs back for drains and go."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.wire import RecentNames
from extender.cache.kept_keys import KEEP_FROM
from helpers.reported_nodes import reported_cluster, reported_node

PLATFORMS = ("rtx-a6000-pairs", "dgx-h100", "dgx1-v100")

change = st.tuples(st.integers(0, 7), st.sampled_from(["report", "delete", "hold back"]), st.sampled_from(PLATFORMS),
                   st.sets(st.integers(0, 7), max_size=8))  # node, what happens, its board, its GPUs in use


@settings(max_examples=60, deadline=None)
@given(st.lists(change, max_size=15), st.sampled_from([1, 2, 4]))
def test_kept_keys_follow_every_node_that_comes_changes_and_goes(changes: list[tuple[int, str, str, set[int]]],
                                                                  count: int) -> None:
    state = reported_cluster({f"n{index}": (PLATFORMS[index % 3], ()) for index in range(4)})
    listed = [f"n{index}" for index in range(8)] + [f"absent-{index}" for index in range(KEEP_FROM)]
    kept = RecentNames(listed, listed)
    assert state.keys_given(kept, count) == state.keys_given(list(listed), count)
    assert state.keys_held_back(kept) == state.keys_held_back(list(listed))
    for index, kind, platform, held in changes:
        name = f"n{index}"
        if kind == "delete":
            state.nodes.apply("DELETED", {"metadata": {"name": name}})
        elif kind == "hold back":  # a drain for another pod (verbs/drains.py)
            state.hold_back(name, sum(1 << gpu for gpu in held))
        else:
            state.nodes.apply("ADDED", reported_node(state, name, platform, sorted(held)))
        assert state.keys_given(kept, count) == state.keys_given(list(listed), count)
        assert state.keys_held_back(kept) == state.keys_held_back(list(listed))


def test_a_list_that_names_a_node_twice_is_read_but_not_kept() -> None:
    state = reported_cluster({"a": ("dgx-h100", ())})
    listed = ["a"] * (KEEP_FROM + 1)
    twice = RecentNames(listed, listed)
    first = state.keys_given(twice, 1)
    assert first == [state.keys_for(["a"])[0]] * len(listed)
    state.nodes.apply("DELETED", {"metadata": {"name": "a"}})
    assert state.keys_given(twice, 1) == [None] * len(listed)
