"""The GPU/link model of one node: immutable values that every other module reads.

A pair of GPUs is joined by NVLink (a link count) or else by a PCIe path (a level). `nvidia-smi topo -m`
hides the PCIe level of NVLink pairs, so that entry may be unknown; it is always known for the other pairs,
because their bandwidth depends on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property

from topology import bounds
from topology.catalog import NvLinkGen
from topology.fabric import Domain
from topology.levels import PCIE_LEVELS, Level


class TopologyError(ValueError):
    """The facts do not describe a consistent node."""


@dataclass(frozen=True, slots=True)
class Gpu:
    index: int
    model: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    memory_mib: int | None = None
    nvlink: NvLinkGen | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None


@dataclass(frozen=True, slots=True, order=True)
class NvLinkPair:
    a: int
    b: int
    links: int


@dataclass(frozen=True)
class Topology:
    gpus: tuple[Gpu, ...]
    nvlinks: tuple[NvLinkPair, ...]
    nvswitch: bool
    # pcie[i][j]: the PCIe path level between GPU i and j; None on the diagonal and where unknown.
    pcie: tuple[tuple[Level | None, ...], ...]
    # Where the node sits (topology/fabric.py), None when nothing says (a capture, an older agent). Not a fact of
    # the board: equality, hashing and the fingerprint leave it out, so identical boards in different racks still
    # share one compiled board.
    domain: Domain | None = field(default=None, compare=False)
    _links: dict[tuple[int, int], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n = len(self.gpus)
        if not 1 <= n <= bounds.MAX_GPUS:
            raise TopologyError(f"{n} GPUs; a node has 1 to {bounds.MAX_GPUS}")
        for position, gpu in enumerate(self.gpus):
            if gpu.index != position:
                raise TopologyError(f"GPU at position {position} has index {gpu.index}; indices must be 0..{n - 1}")
            _check_gpu(gpu)
        for what, values in (("UUID", [gpu.uuid for gpu in self.gpus]),
                             ("bus id", [gpu.pci_bus_id for gpu in self.gpus])):
            known = [value for value in values if value is not None]
            if len(set(known)) != len(known):
                twice = next(value for value in known if known.count(value) > 1)
                raise TopologyError(f"{what} {twice!r} belongs to two GPUs")
        links: dict[tuple[int, int], int] = {}
        per_gpu = [0] * n
        link_budget = [bounds.max_nvlinks(gpu.model) for gpu in self.gpus]
        for pair in self.nvlinks:
            if not (0 <= pair.a < pair.b < n):
                raise TopologyError(f"NVLink pair ({pair.a}, {pair.b}) is not a pair of distinct GPUs 0..{n - 1} "
                                    "with a < b")
            budget = min(link_budget[pair.a], link_budget[pair.b])
            if not 1 <= pair.links <= budget:
                raise TopologyError(f"NVLink pair ({pair.a}, {pair.b}) has {pair.links} links; these GPUs have "
                                    f"1 to {budget}")
            if (pair.a, pair.b) in links:
                raise TopologyError(f"NVLink pair ({pair.a}, {pair.b}) is listed twice")
            links[(pair.a, pair.b)] = pair.links
            per_gpu[pair.a] += pair.links
            per_gpu[pair.b] += pair.links
        if not self.nvswitch:
            for index, (count, budget) in enumerate(zip(per_gpu, link_budget)):
                if count > budget:
                    raise TopologyError(f"GPU{index} has {count} NVLinks to its peers, more than the {budget} it "
                                        "has, and there is no NVSwitch")
        if len(self.pcie) != n or any(len(row) != n for row in self.pcie):
            raise TopologyError(f"the PCIe matrix must be {n}x{n}")
        for i in range(n):
            if self.pcie[i][i] is not None:
                raise TopologyError(f"the PCIe matrix has a level on its diagonal at GPU{i}")
            for j in range(i + 1, n):
                level = self.pcie[i][j]
                if level != self.pcie[j][i]:
                    raise TopologyError(f"the PCIe matrix is asymmetric at GPU{i}/GPU{j}")
                if level is not None and level not in PCIE_LEVELS:
                    raise TopologyError(f"GPU{i}/GPU{j}: {level!r} is not a PCIe path level")
                if level is None and (i, j) not in links:
                    raise TopologyError(f"GPU{i}/GPU{j} has neither NVLink nor a known PCIe path")
        object.__setattr__(self, "nvlinks", tuple(sorted(self.nvlinks)))
        object.__setattr__(self, "_links", links)

    @property
    def size(self) -> int:
        return len(self.gpus)

    def nvlink_count(self, i: int, j: int) -> int:
        return self._links.get((i, j) if i < j else (j, i), 0)

    def level(self, i: int, j: int) -> Level:
        """The level a hop between i and j runs at: NVLink where there is any, else its PCIe path."""
        if self.nvlink_count(i, j):
            return Level.NVLINK
        level = self.pcie[i][j]
        assert level is not None, "checked in __post_init__"
        return level

    def pairs(self) -> Iterator[tuple[int, int]]:
        n = self.size
        return ((i, j) for i in range(n) for j in range(i + 1, n))

    @cached_property
    def fingerprint(self) -> str:
        """A digest of the facts that selection depends on, so that identical boards share one memo.

        It covers NUMA, NVLink counts and kinds, PCIe generation and width, and the PCIe level of pairs
        without NVLink. It leaves out identities (UUIDs, bus ids), names and memory, and the bandwidth table
        itself, so that a reporter and an extender of different versions agree on it.
        """
        parts = [f"n={self.size};sw={int(self.nvswitch)}"]
        for gpu in self.gpus:
            nvlink = gpu.nvlink.value if gpu.nvlink else "-"
            parts.append(f"g{gpu.index}:{gpu.numa_node}:{nvlink}:{gpu.pcie_gen}:{gpu.pcie_width}")
        for i, j in self.pairs():
            count = self.nvlink_count(i, j)
            parts.append(f"{i}-{j}:NV{count}" if count else f"{i}-{j}:{self.level(i, j).name}")
        return hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]


def _check_gpu(gpu: Gpu) -> None:
    """Each fact within what real hardware reports (topology/bounds.py), so that nothing downstream overflows."""
    where = f"GPU{gpu.index}"
    if not bounds.MODEL_PATTERN.fullmatch(gpu.model):
        raise TopologyError(f"{where} model: expected 1 to {bounds.MAX_MODEL_LENGTH} printable characters")
    if gpu.uuid is not None and not bounds.valid_id(gpu.uuid):
        raise TopologyError(f"{where} uuid {gpu.uuid[:80]!r}: expected 1 to {bounds.MAX_ID_LENGTH} printable "
                            "characters without spaces or commas")
    if gpu.pci_bus_id is not None and not bounds.BUS_ID_PATTERN.fullmatch(gpu.pci_bus_id):
        raise TopologyError(f"{where} bus id {gpu.pci_bus_id[:80]!r}: expected domain:bus:device.function")
    if gpu.numa_node is not None and not 0 <= gpu.numa_node <= bounds.MAX_NUMA_NODE:
        raise TopologyError(f"{where} NUMA node {gpu.numa_node}: Linux numbers them 0 to {bounds.MAX_NUMA_NODE}")
    if gpu.memory_mib is not None and not 1 <= gpu.memory_mib <= bounds.MAX_MEMORY_MIB:
        raise TopologyError(f"{where} memory {gpu.memory_mib} MiB: expected 1 to {bounds.MAX_MEMORY_MIB}")
    if gpu.pcie_gen is not None and gpu.pcie_gen not in bounds.PCIE_GENERATIONS:
        raise TopologyError(f"{where} PCIe generation {gpu.pcie_gen}: expected {bounds.PCIE_GENERATIONS.start} to "
                            f"{bounds.PCIE_GENERATIONS.stop - 1}")
    if gpu.pcie_width is not None and gpu.pcie_width not in bounds.PCIE_WIDTHS:
        raise TopologyError(f"{where} PCIe width x{gpu.pcie_width}: expected one of "
                            f"{', '.join(f'x{w}' for w in sorted(bounds.PCIE_WIDTHS))}")


def installed_subset(topology: Topology, installed: tuple[int, ...]) -> Topology:
    """The board with only the `installed` GPUs (sorted board indices), re-indexed in board order: a node or VM
    that has some of a platform's GPUs, as its node agent would discover it."""
    if installed == tuple(range(len(topology.gpus))):
        return topology
    position = {gpu: at for at, gpu in enumerate(installed)}
    return Topology(
        gpus=tuple(replace(topology.gpus[gpu], index=position[gpu]) for gpu in installed),
        nvlinks=tuple(NvLinkPair(position[pair.a], position[pair.b], pair.links) for pair in topology.nvlinks
                      if pair.a in position and pair.b in position),
        nvswitch=topology.nvswitch,
        pcie=tuple(tuple(topology.pcie[i][j] for j in installed) for i in installed),
        domain=topology.domain)
