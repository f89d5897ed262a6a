"""A ClusterState fed nodes as their reporters publish them: real boards, the GPUs their pods hold, the GPUs
NVML calls unhealthy, observed at the state's own clock (a live reporter)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from extender.cache.cluster_state import ClusterState
from extender.cache.seal import Seal
from extender.demo.cluster import with_uuids
from topology.codec import NodeState, encode_state, encode_topology
from topology.platforms import PLATFORMS
from topology.sharing import Sharing


class ManualClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def reported_cluster(used: Mapping[str, tuple[str, tuple[int, ...]]], *, clock: Callable[[], float] = time.time,
                     stale_after: float = 120.0, unhealthy: Mapping[str, tuple[int, ...]] | None = None,
                     labels: Mapping[str, Mapping[str, str]] | None = None,
                     observed: Mapping[str, Sharing] | None = None, levels: Sequence[str] = (),
                     seal: Seal | None = None) -> ClusterState:
    """`used` maps node name -> (platform, GPUs held); `unhealthy` node name -> sick GPUs; `labels` node name ->
    its labels (GPU feature discovery's, the network levels'); `observed` node name -> the sharing its agent
    saw; `levels` the extender's --topology-levels."""
    state = ClusterState(clock=clock, stale_after=stale_after, levels=levels, seal=seal)
    state.nodes.replace([reported_node(state, name, platform, held, clock=clock, unhealthy=(unhealthy or {}).get(name, ()),
                                       labels=(labels or {}).get(name, {}),
                                       sharing=(observed or {}).get(name, Sharing.NONE))
                         for name, (platform, held) in used.items()])
    state.nodes.synced()
    state.pods.replace([])
    state.pods.synced()
    return state


def reported_node(state: ClusterState, name: str, platform: str, held: Sequence[int], *,
                  clock: Callable[[], float] = time.time, unhealthy: Sequence[int] = (),
                  labels: Mapping[str, str] | None = None, sharing: Sharing = Sharing.NONE) -> dict[str, Any]:
    """The Node object of a node whose agent reports the platform's board with GPUs `held` in use."""
    topology = with_uuids(name, PLATFORMS[platform].topology())
    reported = NodeState(frozenset(topology.gpus[i].uuid for i in held),
                         frozenset(topology.gpus[i].uuid for i in unhealthy),
                         datetime.fromtimestamp(clock(), timezone.utc), 1, sharing=sharing)
    return {"metadata": {"name": name, "labels": dict(labels or {}),
                         "annotations": {state.keys.topology: encode_topology(topology),
                                         state.keys.state: encode_state(reported)}}}
