"""The bandwidth model (DESIGN §3): the one table, per direction, in GB/s.

Figures are an ordinal model of what a ring all-reduce can reach over each kind of hop, not a measurement.
Selection works on whole MB/s (`pair_mbps`) so that sums are exact and ties break the same way everywhere.
"""

from __future__ import annotations

from topology.catalog import NvLinkGen
from topology.levels import Level
from topology.model import Gpu, Topology

NVLINK_GBPS_PER_LINK: dict[NvLinkGen, float] = {
    NvLinkGen.NVLINK1: 20.0,
    NvLinkGen.NVLINK2: 25.0,
    NvLinkGen.NVLINK3: 25.0,
    NvLinkGen.NVLINK4: 25.0,
    NvLinkGen.NVLINK5: 50.0,
    NvLinkGen.BRIDGE_GA102: 14.0,
}

PCIE_X16_GBPS: dict[int, float] = {1: 4.0, 2: 8.0, 3: 15.75, 4: 31.5, 5: 63.0, 6: 121.0}

PCIE_PATH_FACTOR: dict[Level, float] = {
    Level.PIX: 1.0,
    Level.PXB: 0.9,
    Level.PHB: 0.75,
    Level.NODE: 0.5,
    Level.SYS: 0.3,
}

# What an unknown GPU model is taken to have: the NVLink 2-4 per-link rate and PCIe Gen3, the slowest
# generation still found in GPU servers, so that an unknown PCIe path is never overrated.
DEFAULT_NVLINK_GBPS_PER_LINK = 25.0
DEFAULT_PCIE_GEN = 3
DEFAULT_PCIE_WIDTH = 16


def nvlink_gbps_per_link(gpu: Gpu) -> float:
    return NVLINK_GBPS_PER_LINK[gpu.nvlink] if gpu.nvlink else DEFAULT_NVLINK_GBPS_PER_LINK


def pcie_gbps(gpu: Gpu) -> float:
    generation = gpu.pcie_gen or DEFAULT_PCIE_GEN
    width = gpu.pcie_width or DEFAULT_PCIE_WIDTH
    return PCIE_X16_GBPS[generation] * min(width, 16) / 16


def pair_gbps(topology: Topology, i: int, j: int) -> float:
    """Per-direction bandwidth between GPU i and GPU j.

    NVLink (direct or through NVSwitch): links x per-link rate, at the slower GPU's rate. Otherwise the
    slower GPU's PCIe rate times the path factor of the level between them.
    """
    a, b = topology.gpus[i], topology.gpus[j]
    links = topology.nvlink_count(i, j)
    if links:
        return links * min(nvlink_gbps_per_link(a), nvlink_gbps_per_link(b))
    return min(pcie_gbps(a), pcie_gbps(b)) * PCIE_PATH_FACTOR[topology.level(i, j)]


def pair_mbps(topology: Topology, i: int, j: int) -> int:
    return round(pair_gbps(topology, i, j) * 1000)
