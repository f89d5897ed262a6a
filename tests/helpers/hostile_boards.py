"""Boards within every bound that are as hard as possible for selection: the issue's bipartite NVLink graph,
a 64-GPU full mesh with the most links, and 64 GPUs tied on every pair. Shared by the tests and
loadtests/bench_select.py --adversarial."""

from __future__ import annotations

from topology.levels import Level
from topology.model import Gpu, NvLinkPair, Topology


def bipartite(half: int = 20) -> Topology:
    """The issue's 12 KB annotation: NVLink as a complete half x half bipartite graph (NVSwitch claimed, so that
    the link budget admits it), SYS inside each side. No ring of odd length runs on NVLink alone."""
    n = 2 * half
    gpus = tuple(Gpu(i, "NVIDIA H100 80GB HBM3", uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000", numa_node=0,
                     pcie_gen=5, pcie_width=16) for i in range(n))
    pairs = tuple(NvLinkPair(i, j, 1) for i in range(half) for j in range(half, n))
    pcie = tuple(tuple(None if i == j or (i < half) != (j < half) else Level.SYS for j in range(n)) for i in range(n))
    return Topology(gpus, pairs, True, pcie)


def mesh(n: int = 64, links: int = 18) -> Topology:
    """Every pair of n GPUs on the most NVLinks any GPU has, on two NUMA nodes (even and odd indices)."""
    gpus = tuple(Gpu(i, "NVIDIA B200", numa_node=i % 2, pcie_gen=5, pcie_width=16) for i in range(n))
    pairs = tuple(NvLinkPair(i, j, links) for i in range(n) for j in range(i + 1, n))
    return Topology(gpus, pairs, True, tuple(tuple(None for _ in range(n)) for _ in range(n)))


def ties(n: int = 64) -> Topology:
    """Every pair the same PCIe bandwidth: nothing to tell sets apart but their indices."""
    gpus = tuple(Gpu(i, "NVIDIA L4", numa_node=0, pcie_gen=4, pcie_width=16) for i in range(n))
    return Topology(gpus, (), False, tuple(tuple(None if i == j else Level.SYS for j in range(n)) for i in range(n)))


def bridge_pairs(n: int = 16) -> Topology:
    """A plausible real board with many ties: 16 RTX A6000 on NVLink bridge pairs, NODE per socket, SYS across.
    The hardest honest board found for the search (about 28,000 steps for 9 GPUs)."""
    gpus = tuple(Gpu(i, "NVIDIA RTX A6000", numa_node=i // 8, pcie_gen=4, pcie_width=16) for i in range(n))
    pairs = tuple(NvLinkPair(i, i + 1, 4) for i in range(0, n, 2))
    pcie = tuple(tuple(None if i == j or (i // 2 == j // 2) else (Level.NODE if i // 8 == j // 8 else Level.SYS)
                       for j in range(n)) for i in range(n))
    return Topology(gpus, pairs, False, pcie)
