"""The bandwidth table (DESIGN §3) on real boards."""

from __future__ import annotations

import pytest

from topology import bounds
from topology.bandwidth import PCIE_X16_GBPS, pair_gbps, pcie_gbps
from topology.model import Gpu
from topology.platforms import PLATFORMS


@pytest.mark.parametrize(("name", "i", "j", "expected"), [
    ("dgx1-v100", 0, 3, 50.0),        # NV2, NVLink2: 2 x 25
    ("dgx1-v100", 0, 1, 25.0),        # NV1
    ("dgx1-v100", 0, 5, 15.75 * 0.3),  # SYS over PCIe Gen3
    ("dgx-a100", 0, 7, 300.0),        # NVSwitch: 12 x 25 on every pair
    ("dgx-h100", 3, 4, 450.0),        # NVSwitch: 18 x 25
    ("gb200-node", 0, 3, 900.0),      # NVLink5: 18 x 50
    ("hgx-h100-4gpu", 0, 2, 150.0),   # direct NV6
    ("rtx-a6000-pairs", 0, 1, 56.0),  # GA102 bridge: 4 x 14
    ("rtx-a6000-pairs", 0, 2, 31.5 * 0.5),  # NODE over Gen4
    ("pcie-l40s", 0, 4, 31.5 * 0.3),  # SYS over Gen4
    ("pcie-8gpu-switch-tree", 0, 1, 15.75),  # PIX; unknown model -> Gen3
    ("pcie-8gpu-switch-tree", 0, 2, 15.75 * 0.9),  # PXB
])
def test_pair_bandwidth(name: str, i: int, j: int, expected: float) -> None:
    assert pair_gbps(PLATFORMS[name].topology(), i, j) == pytest.approx(expected)


def test_nvlink_always_beats_pcie_on_the_same_board() -> None:
    for platform in PLATFORMS.values():
        topology = platform.topology()
        nvlink = [pair_gbps(topology, i, j) for i, j in topology.pairs() if topology.nvlink_count(i, j)]
        pcie = [pair_gbps(topology, i, j) for i, j in topology.pairs() if not topology.nvlink_count(i, j)]
        if nvlink and pcie:
            assert min(nvlink) > max(pcie), platform.name


def test_every_pcie_link_within_the_bounds_has_a_positive_rate_no_faster_than_x16() -> None:
    """Generations 1 and 2 are slower than Gen3, not taken for it; widths only ever lower the rate."""
    for generation in bounds.PCIE_GENERATIONS:
        for width in bounds.PCIE_WIDTHS:
            rate = pcie_gbps(Gpu(0, "unknown", pcie_gen=generation, pcie_width=width))
            assert 0 < rate <= PCIE_X16_GBPS[generation]
    assert pcie_gbps(Gpu(0, "unknown", pcie_gen=1, pcie_width=16)) < pcie_gbps(Gpu(0, "unknown", pcie_gen=3))
