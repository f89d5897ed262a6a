"""The serving extender's collector settings: applied once the first lists are in, not before."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from extender.cache.cluster_state import ClusterState
from extender.server.gc_freeze import YOUNG_THRESHOLD, settle_when_synced


@pytest.fixture
def collector() -> Iterator[None]:
    """The test process's own settings, back as they were afterwards."""
    threshold = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*threshold)


def test_the_synced_state_is_frozen_and_young_collections_made_rare(collector: None) -> None:
    state = ClusterState()
    older = gc.get_threshold()[1:]
    settling = threading.Thread(target=settle_when_synced, args=(state, 0.01))
    settling.start()
    settling.join(0.1)
    assert settling.is_alive() and gc.get_threshold()[0] != YOUNG_THRESHOLD, "nothing before the first lists"
    for sink in (state.nodes, state.pods):
        sink.replace([])
        sink.synced()
    settling.join(5)
    assert not settling.is_alive()
    assert gc.get_freeze_count() > 0
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *older)
