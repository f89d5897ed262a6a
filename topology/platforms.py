"""Bundled real platforms: a `nvidia-smi topo -m` capture plus the GPU model the capture cannot state.

The captures in `topology/captures/` are verbatim copies of public outputs (each cites its source on its
first line); only `dgx2-v100.txt` is reconstructed, from a partial capture, as its header explains.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

from topology.model import Topology
from topology.nvidia_smi import parse_topo_matrix


@dataclass(frozen=True, slots=True)
class Platform:
    name: str
    capture: str
    gpu_model: str
    memory_mib: int | None
    description: str

    def capture_text(self) -> str:
        return resources.files("topology").joinpath("captures", self.capture).read_text(encoding="utf-8")

    def topology(self) -> Topology:
        return _parsed(self.name)


PLATFORMS: dict[str, Platform] = {p.name: p for p in (
    Platform("dgx1-v100", "dgx1-v100.txt", "Tesla V100-SXM2-16GB", 16384,
             "DGX-1V: 8x V100, hybrid cube-mesh NVLink2 (NV1/NV2), 2 sockets"),
    Platform("dgx2-v100", "dgx2-v100.txt", "Tesla V100-SXM3-32GB", 32768,
             "DGX-2: 16x V100, NVSwitch gen1 (NV6 on every pair), 2 sockets"),
    Platform("dgx-a100", "dgx-a100.txt", "NVIDIA A100-SXM4-40GB", 40960,
             "DGX A100: 8x A100, NVSwitch (NV12), 8 NUMA nodes"),
    Platform("hgx-a100-8gpu", "hgx-a100-8gpu-1nic.txt", "NVIDIA A100-SXM4-80GB", 81920,
             "HGX A100 8-GPU: 8x A100, NVSwitch (NV12), 8 NUMA nodes"),
    Platform("dgx-h100", "dgx-h100-13nic.txt", "NVIDIA H100 80GB HBM3", 81559,
             "DGX H100: 8x H100, NVSwitch (NV18), 2 NUMA nodes"),
    Platform("hgx-h20", "hgx-h20.txt", "NVIDIA H20", 97871,
             "HGX H20: 8x H20, NVSwitch (NV18), 2 NUMA nodes"),
    Platform("hgx-h100-4gpu", "hgx-h100-4gpu-nv6.txt", "NVIDIA H100 80GB HBM3", 81559,
             "HGX H100 4-GPU: direct NVLink full mesh (NV6), no NVSwitch"),
    Platform("pcie-8gpu-switch-tree", "pcie-8gpu-2level-switch-tree.txt", "unknown", None,
             "8-GPU PCIe server, two-level PCIe switch tree per socket, no NVLink (model not stated)"),
    Platform("pcie-l40s", "pcie-l40s-8gpu-2socket.txt", "NVIDIA L40S", 46068,
             "8x L40S, PCIe only, NODE within a socket, SYS across"),
    Platform("rtx-a6000-pairs", "rtx-a6000-8gpu-nvlink-bridge-pairs.txt", "NVIDIA RTX A6000", 49140,
             "8x RTX A6000 with NVLink bridges on pairs (NV4), PCIe NODE/SYS otherwise"),
    Platform("gb200-node", "gb200-nvl72-node.txt", "NVIDIA GB200", 189471,
             "GB200 NVL72 compute tray: 4x GB200, NVLink5 through NVSwitch (NV18)"),
)}


@cache
def _parsed(name: str) -> Topology:
    platform = PLATFORMS[name]
    return parse_topo_matrix(platform.capture_text(), platform.gpu_model, platform.memory_mib)
