"""What a GPU model implies when the source does not say it.

`nvidia-smi topo -m` prints no model, NVLink generation or PCIe generation, and NVML reports an NVLink
version whose numbering changed between drivers. The model name settles both: the NVLink kind decides the
per-link rate (a GA102 bridge is slower than an SXM NVLink of the same generation) and the link budget tells
a direct NVLink mesh from an NVSwitch board.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class NvLinkGen(str, Enum):
    NVLINK1 = "nvlink1"
    NVLINK2 = "nvlink2"
    NVLINK3 = "nvlink3"
    NVLINK4 = "nvlink4"
    NVLINK5 = "nvlink5"
    BRIDGE_GA102 = "nvlink3-bridge"


@dataclass(frozen=True, slots=True)
class GpuSpec:
    nvlink: NvLinkGen | None
    pcie_gen: int
    max_nvlinks: int


# Matched in order against the upper-cased model name, so more specific names come first.
_CATALOG: tuple[tuple[str, GpuSpec], ...] = (
    ("GB300", GpuSpec(NvLinkGen.NVLINK5, 6, 18)),
    ("B300", GpuSpec(NvLinkGen.NVLINK5, 6, 18)),
    ("GB200", GpuSpec(NvLinkGen.NVLINK5, 5, 18)),
    ("B200", GpuSpec(NvLinkGen.NVLINK5, 5, 18)),
    ("H800", GpuSpec(NvLinkGen.NVLINK4, 5, 8)),
    ("H100", GpuSpec(NvLinkGen.NVLINK4, 5, 18)),
    ("H200", GpuSpec(NvLinkGen.NVLINK4, 5, 18)),
    ("H20", GpuSpec(NvLinkGen.NVLINK4, 5, 18)),
    ("A800", GpuSpec(NvLinkGen.NVLINK3, 4, 8)),
    ("A100", GpuSpec(NvLinkGen.NVLINK3, 4, 12)),
    ("A30", GpuSpec(NvLinkGen.NVLINK3, 4, 4)),
    ("RTX A6000", GpuSpec(NvLinkGen.BRIDGE_GA102, 4, 4)),
    ("A40", GpuSpec(NvLinkGen.BRIDGE_GA102, 4, 4)),
    ("3090", GpuSpec(NvLinkGen.BRIDGE_GA102, 4, 4)),
    ("V100", GpuSpec(NvLinkGen.NVLINK2, 3, 6)),
    ("P100", GpuSpec(NvLinkGen.NVLINK1, 3, 4)),
    ("L40", GpuSpec(None, 4, 0)),
    ("L4", GpuSpec(None, 4, 0)),
    ("A10", GpuSpec(None, 4, 0)),
    ("T4", GpuSpec(None, 3, 0)),
)

UNKNOWN_MODEL = "unknown"

# Without a model we assume the most links any NVIDIA GPU has, so a mesh is only taken for an NVSwitch
# board when no GPU could have that many direct links.
MAX_NVLINKS_ANY_GPU = 18


def lookup(model: str) -> GpuSpec | None:
    name = model.upper()
    for pattern, spec in _CATALOG:
        if pattern in name:
            return spec
    return None


def max_nvlinks(model: str) -> int:
    spec = lookup(model)
    return spec.max_nvlinks if spec and spec.max_nvlinks else MAX_NVLINKS_ANY_GPU
