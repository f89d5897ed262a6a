"""How two GPUs are connected, ranked from worst to best.

One ordered scale serves three uses: the PCIe path level of `nvidia-smi topo -m`, the level of a hop in a
ring, and the pod's minimum interconnect requirement. A hop satisfies a requirement when its level is at
least the required one.
"""

from __future__ import annotations

from enum import Enum, IntEnum


class Level(IntEnum):
    SYS = 0
    NODE = 1
    PHB = 2
    PXB = 3
    PIX = 4
    NVLINK = 5


PCIE_LEVELS: frozenset[Level] = frozenset(level for level in Level if level is not Level.NVLINK)

# Older drivers printed SOC where newer ones print SYS.
PCIE_CODES: dict[str, Level] = {"PIX": Level.PIX, "PXB": Level.PXB, "PHB": Level.PHB, "NODE": Level.NODE,
                                "SYS": Level.SYS, "SOC": Level.SYS}


class Interconnect(str, Enum):
    """The pod's `interconnect` annotation: the weakest hop its ring may use."""

    NVLINK = "nvlink"
    PCIE_SWITCH = "pcie-switch"
    HOST_BRIDGE = "host-bridge"
    NUMA = "numa"
    ANY = "any"

    @property
    def min_level(self) -> Level:
        return _MIN_LEVEL[self]

    @classmethod
    def parse(cls, value: str) -> Interconnect:
        try:
            return cls(value.strip().lower())
        except ValueError:
            allowed = " | ".join(member.value for member in cls)
            raise ValueError(f"unknown interconnect {value!r}; expected one of {allowed}") from None


_MIN_LEVEL: dict[Interconnect, Level] = {
    Interconnect.NVLINK: Level.NVLINK,
    Interconnect.PCIE_SWITCH: Level.PXB,
    Interconnect.HOST_BRIDGE: Level.PHB,
    Interconnect.NUMA: Level.NODE,
    Interconnect.ANY: Level.SYS,
}
