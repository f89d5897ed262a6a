"""The board a replayed node has: its platform's topology, restricted to the GPUs it has installed.

A 4x V100 node of the Alibaba fleet is GPUs 0-3 of the DGX-1V capture (ClusterNode.installed). Its node agent
would publish a 4-GPU board, indexed 0-3, so every part of the replay (the engine's free masks, the stock
device plugin, the extender, the metrics) sees that board and nothing of the absent GPUs.
"""

from __future__ import annotations

from dataclasses import replace
from functools import cache

from loadtests.replay.clusters import installed_gpus
from loadtests.replay.model import ClusterNode
from topology.compiled import CompiledTopology, compile_topology
from topology.model import NvLinkPair, Topology
from topology.platforms import PLATFORMS

BoardKey = tuple[str, tuple[int, ...]]
"""(platform, installed board GPUs): nodes with equal keys have equal boards."""


def board_key(node: ClusterNode) -> BoardKey:
    return node.platform, installed_gpus(node)


@cache
def board_topology(key: BoardKey) -> Topology:
    """The platform's topology with only the installed GPUs, re-indexed in board order."""
    platform, installed = key
    whole = PLATFORMS[platform].topology()
    if installed == tuple(range(whole.size)):
        return whole
    position = {gpu: at for at, gpu in enumerate(installed)}
    return Topology(
        gpus=tuple(replace(whole.gpus[gpu], index=position[gpu]) for gpu in installed),
        nvlinks=tuple(NvLinkPair(position[pair.a], position[pair.b], pair.links) for pair in whole.nvlinks
                      if pair.a in position and pair.b in position),
        nvswitch=whole.nvswitch,
        pcie=tuple(tuple(whole.pcie[i][j] for j in installed) for i in installed))


@cache
def board(key: BoardKey) -> CompiledTopology:
    return compile_topology(board_topology(key))
