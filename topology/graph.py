"""A networkx view of a topology, for analysis and drawing; the hot path never uses it."""

from __future__ import annotations

import networkx as nx

from topology.bandwidth import pair_gbps
from topology.levels import Level
from topology.model import Topology


def to_networkx(topology: Topology) -> nx.Graph:
    """GPUs as nodes (with their facts), every pair as an edge with its level, NVLink count and bandwidth."""
    graph = nx.Graph(nvswitch=topology.nvswitch, fingerprint=topology.fingerprint)
    for gpu in topology.gpus:
        graph.add_node(gpu.index, model=gpu.model, uuid=gpu.uuid, numa=gpu.numa_node)
    for i, j in topology.pairs():
        graph.add_edge(i, j, level=topology.level(i, j), nvlinks=topology.nvlink_count(i, j),
                       gbps=pair_gbps(topology, i, j))
    return graph


def nvlink_islands(topology: Topology) -> list[list[int]]:
    """Groups of GPUs that reach each other over NVLink alone, largest first."""
    graph = to_networkx(topology)
    nvlink = graph.edge_subgraph((i, j) for i, j, level in graph.edges(data="level") if level is Level.NVLINK)
    islands = [sorted(component) for component in nx.connected_components(nvlink)]
    linked = {gpu for island in islands for gpu in island}
    islands += [[gpu] for gpu in graph.nodes if gpu not in linked]
    return sorted(islands, key=lambda island: (-len(island), island))
