"""The board a replayed node has: its platform's topology, restricted to the GPUs it has installed.

A 4x V100 node of the Alibaba fleet is GPUs 0-3 of the DGX-1V capture (ClusterNode.installed). Its node agent
would publish a 4-GPU board, indexed 0-3, so every part of the replay (the engine's free masks, the stock
device plugin, the extender, the metrics) sees that board and nothing of the absent GPUs.
"""

from __future__ import annotations

from functools import cache

from loadtests.replay.clusters import installed_gpus
from loadtests.replay.model import ClusterNode
from topology.compiled import CompiledTopology, compile_topology
from topology.model import Topology, installed_subset
from topology.platforms import PLATFORMS

BoardKey = tuple[str, tuple[int, ...]]
"""(platform, installed board GPUs): nodes with equal keys have equal boards."""


def board_key(node: ClusterNode) -> BoardKey:
    return node.platform, installed_gpus(node)


@cache
def board_topology(key: BoardKey) -> Topology:
    """The platform's topology with only the installed GPUs, re-indexed in board order."""
    platform, installed = key
    return installed_subset(PLATFORMS[platform].topology(), installed)


@cache
def board(key: BoardKey) -> CompiledTopology:
    return compile_topology(board_topology(key))
