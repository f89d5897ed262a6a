"""Reads the topology of this node from NVML (DESIGN §2): the reporter's only source of facts.

Only the `pynvml` function surface is used, and the module is passed in, so that tests drive the same code
with a fake NVML built from real captures. The real `pynvml` (package nvidia-ml-py) is imported only when
discovery runs, so the pure core never loads it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from topology import bounds, catalog
from topology.catalog import NvLinkGen
from topology.fabric import Domain, FabricState, GpuFabric, node_domain
from topology.levels import Level
from topology.model import Gpu, NvLinkPair, Topology, TopologyError

# nvmlNvlinkVersion_t as current drivers report it (2.2 and 3.1 are revisions with the rate of 2.0 and 3.0).
# Drivers from before the enum numbered versions differently, and some report 5.0 on Hopper, so this is used
# only for models the catalog does not know. 6.0 (8) has no NvLinkGen yet, so it gives None.
_NVLINK_VERSIONS: dict[int, NvLinkGen] = {
    1: NvLinkGen.NVLINK1,  # NVML_NVLINK_VERSION_1_0
    2: NvLinkGen.NVLINK2,  # NVML_NVLINK_VERSION_2_0
    3: NvLinkGen.NVLINK2,  # NVML_NVLINK_VERSION_2_2
    4: NvLinkGen.NVLINK3,  # NVML_NVLINK_VERSION_3_0
    5: NvLinkGen.NVLINK3,  # NVML_NVLINK_VERSION_3_1
    6: NvLinkGen.NVLINK4,  # NVML_NVLINK_VERSION_4_0
    7: NvLinkGen.NVLINK5,  # NVML_NVLINK_VERSION_5_0
}

SYSFS_ROOT = Path("/sys")

# Words of the node bitmask nvmlDeviceGetMemoryAffinity fills, 64 nodes a word (unsigned long on 64-bit Linux):
# room for every node id Linux can have.
_NODE_SET_WORDS = (bounds.MAX_NUMA_NODE + 64) // 64

T = TypeVar("T")

_FABRIC_UUID_LEN = 16  # NVML_GPU_FABRIC_UUID_LEN


class _FabricInfo(ctypes.Structure):
    """nvmlGpuFabricInfo_t as nvml.h lays it out (nvmlGpuFabricState_t is an unsigned char)."""

    _fields_ = [("clusterUuid", ctypes.c_uint8 * _FABRIC_UUID_LEN), ("status", ctypes.c_uint),
                ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8)]


class _FabricInfoV2(ctypes.Structure):
    """nvmlGpuFabricInfo_v2_t as nvml.h lays it out."""

    _fields_ = [("version", ctypes.c_uint), ("clusterUuid", ctypes.c_uint8 * _FABRIC_UUID_LEN),
                ("status", ctypes.c_uint), ("cliqueId", ctypes.c_uint32), ("state", ctypes.c_uint8),
                ("healthMask", ctypes.c_uint32)]


# NVML_STRUCT_VERSION(GpuFabricInfo, 2): the size, with the version in the top byte; pynvml's nvmlGpuFabricInfo_v2.
FABRIC_INFO_V2 = ctypes.sizeof(_FabricInfoV2) | 2 << 24


class NvmlUnavailable(RuntimeError):
    """NVML cannot describe this node: no library or driver, no GPU, or a query failed. The message is one line."""


@dataclass(frozen=True, slots=True)
class _Links:
    """What one GPU's active NVLinks reach: peer GPUs by bus id, and how many links go to NVSwitches."""

    to_gpus: Counter[str]
    to_switches: int
    version: int | None


def discover(nvml: ModuleType | None = None, sysfs: Path = SYSFS_ROOT) -> Topology:
    """Describe the GPUs NVML sees. `nvml` defaults to the real `pynvml`; `sysfs` is where NUMA nodes are read."""
    if nvml is None:
        nvml = _import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML is not available: {error}") from None
    try:
        return _read(nvml, sysfs)
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML query failed: {error}") from None
    except TopologyError as error:
        raise NvmlUnavailable(f"NVML describes a node beyond what real hardware has: {error}") from None
    finally:
        # A failing shutdown cannot change what was read.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()


def _import_pynvml() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError:
        raise NvmlUnavailable("NVML is not available: the nvidia-ml-py package is not installed") from None


def _read(nvml: ModuleType, sysfs: Path) -> Topology:
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        raise NvmlUnavailable("NVML found no GPUs on this node")
    handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(count)]
    bus_ids = [normalise_bus_id(nvml.nvmlDeviceGetPciInfo(handle).busId) for handle in handles]
    links = [_links(nvml, handle, frozenset(bus_ids)) for handle in handles]
    gpus = tuple(_gpu(nvml, index, handle, bus_ids[index], links[index], sysfs)
                 for index, handle in enumerate(handles))
    levels = _pcie_levels(nvml)
    pairs: list[NvLinkPair] = []
    pcie: list[list[Level | None]] = [[None] * count for _ in range(count)]
    for i in range(count):
        for j in range(i + 1, count):
            # A link counts only when both ends see it active.
            direct = min(links[i].to_gpus[bus_ids[j]], links[j].to_gpus[bus_ids[i]])
            # Behind NVSwitches every pair gets the links of its less-connected GPU.
            switched = min(links[i].to_switches, links[j].to_switches)
            if direct + switched:
                pairs.append(NvLinkPair(i, j, direct + switched))
            ancestor = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
            if ancestor not in levels:
                raise NvmlUnavailable(f"NVML reported an unknown PCIe path level {ancestor} for GPU{i}/GPU{j}")
            pcie[i][j] = pcie[j][i] = levels[ancestor]
    return Topology(gpus=gpus, nvlinks=tuple(pairs), nvswitch=any(link.to_switches for link in links),
                    pcie=tuple(tuple(row) for row in pcie), domain=read_domain(nvml, count))


def read_domain(nvml: ModuleType, count: int) -> Domain:
    """The node's NVLink domain from the fabric info of GPUs 0 to count - 1; NVML must be initialised.

    The agent asks again each round: the fabric manager registers GPUs after boot. An NVML error on one GPU makes
    the domain doubtful (a problem), never the discovery: the node's GPUs are there whether or not its rack is.
    """
    gpus: list[GpuFabric | None] = []
    for index in range(count):
        try:
            gpus.append(_gpu_fabric(nvml, nvml.nvmlDeviceGetHandleByIndex(index)))
        except nvml.NVMLError as error:
            return Domain(None, f"GPU {index} fabric info unreadable: {type(error).__name__}")
        except ValueError as error:  # a registration state this build does not know
            return Domain(None, f"GPU {index} fabric info unreadable: {error}")
    return node_domain(gpus)


def _gpu_fabric(nvml: ModuleType, handle: object) -> GpuFabric | None:
    """One GPU's fabric info, None where the driver or pynvml has none.

    pynvml (nvidia-ml-py 13.615) has nvmlDeviceGetGpuFabricInfoV(device, gpuFabricInfo) for c_nvmlGpuFabricInfoV_t
    (= c_nvmlGpuFabricInfo_v2_t, version nvmlGpuFabricInfo_v2), and the older nvmlDeviceGetGpuFabricInfo(device,
    gpuFabricInfo) for c_nvmlGpuFabricInfo_t, deprecated. Both hand their second argument to the C function as it
    is, so the structures passed by reference are this module's: pynvml's own differ from nvml.h by release
    (12.535 to 12.575 declare clusterUuid as char[80] in c_nvmlGpuFabricInfo_t, misplacing every later field;
    12.570's V struct holds it as char[16], which a zero byte cuts short) and read the one-byte state as an int.
    V is asked first; without it (pynvml before 12.550, a driver without the symbol, or one that refuses version 2)
    the older call is.
    """
    queries = (("nvmlDeviceGetGpuFabricInfoV", _FabricInfoV2(version=FABRIC_INFO_V2)),
               ("nvmlDeviceGetGpuFabricInfo", _FabricInfo()))
    for name, info in queries:
        query = getattr(nvml, name, None)
        if query is None:
            continue
        try:
            query(handle, ctypes.byref(info))
        except nvml.NVMLError as error:
            if error.value == nvml.NVML_ERROR_NOT_SUPPORTED:
                return None
            if error.value in (nvml.NVML_ERROR_FUNCTION_NOT_FOUND, nvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                continue
            raise
        return _translate(nvml, info)
    return None


def _translate(nvml: ModuleType, info: _FabricInfo | _FabricInfoV2) -> GpuFabric:
    """The cluster UUID as google/uuid prints it, which GFD's label holds."""
    return GpuFabric(cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))), clique_id=info.cliqueId,
                     state=FabricState(info.state), status_ok=info.status == nvml.NVML_SUCCESS)


def _pcie_levels(nvml: ModuleType) -> dict[int, Level]:
    # INTERNAL is the two GPUs of one dual-GPU board (K80, Grid K2): closer than one bridge, so PIX.
    return {nvml.NVML_TOPOLOGY_INTERNAL: Level.PIX, nvml.NVML_TOPOLOGY_SINGLE: Level.PIX,
            nvml.NVML_TOPOLOGY_MULTIPLE: Level.PXB, nvml.NVML_TOPOLOGY_HOSTBRIDGE: Level.PHB,
            nvml.NVML_TOPOLOGY_NODE: Level.NODE, nvml.NVML_TOPOLOGY_SYSTEM: Level.SYS}


def _gpu(nvml: ModuleType, index: int, handle: object, bus_id: str, links: _Links, sysfs: Path) -> Gpu:
    model = _text(nvml.nvmlDeviceGetName(handle))
    memory = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    memory_mib = memory.total // 2**20 if memory is not None else None
    generation = _optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkGeneration, handle)
    width = _optional(nvml, nvml.nvmlDeviceGetMaxPcieLinkWidth, handle)
    # A value no real link has (0 from a virtual GPU, say) is unknown, as if the query had no answer.
    return Gpu(index=index, model=model, uuid=_text(nvml.nvmlDeviceGetUUID(handle)), pci_bus_id=bus_id,
               numa_node=_numa_node(nvml, handle, sysfs, bus_id),
               memory_mib=memory_mib if memory_mib and memory_mib <= bounds.MAX_MEMORY_MIB else None,
               nvlink=_nvlink_gen(model, links),
               pcie_gen=generation if generation in bounds.PCIE_GENERATIONS else None,
               pcie_width=width if width in bounds.PCIE_WIDTHS else None)


def _links(nvml: ModuleType, handle: object, gpu_bus_ids: frozenset[str]) -> _Links:
    """Walk every link id: GPUs without NVLink, and ids past a GPU's last link, answer with an error."""
    to_gpus: Counter[str] = Counter()
    to_switches = 0
    version: int | None = None
    for link in range(nvml.NVML_NVLINK_MAX_LINKS):
        try:
            active = nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED
        except nvml.NVMLError as error:
            if error.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT):
                continue
            raise
        if not active:
            continue
        if version is None:
            version = _optional(nvml, nvml.nvmlDeviceGetNvLinkVersion, handle, link)
        remote = normalise_bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
        kind = _optional(nvml, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        if remote in gpu_bus_ids:
            to_gpus[remote] += 1
        elif kind in (None, nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, nvml.NVML_NVLINK_DEVICE_TYPE_UNKNOWN):
            # Drivers that cannot name the remote end run NVSwitch boards (DGX-2 era): a non-GPU end is a switch.
            to_switches += 1
        # Anything else is a CPU (IBM NPU) or a GPU this node does not show: no GPU pair gains from it.
    return _Links(to_gpus, to_switches, version)


def _nvlink_gen(model: str, links: _Links) -> NvLinkGen | None:
    """The catalog wins: it knows GA102 bridges, and NVML's version numbering changed between drivers."""
    if not (links.to_gpus or links.to_switches):
        return None
    spec = catalog.lookup(model)
    if spec is not None and spec.nvlink is not None:
        return spec.nvlink
    return _NVLINK_VERSIONS.get(links.version) if links.version is not None else None


def _numa_node(nvml: ModuleType, handle: object, sysfs: Path, bus_id: str) -> int | None:
    """The CPU-side NUMA node of the GPU, as `nvidia-smi topo -m` shows under NUMA Affinity.

    The kernel's numa_node of the GPU's PCI device comes first. It is -1 where the firmware gives PCIe devices no
    locality (VMs, some ACPI tables) although the driver still knows it, so there NVML is asked.
    nvmlDeviceGetNumaNodeId is not used: where it is supported (Grace systems) it names the NUMA node of the
    GPU's own memory, nvidia-smi's "GPU NUMA ID" column, not the node of the CPUs next to the GPU.
    """
    node = _sysfs_numa_node(sysfs, bus_id)
    return node if node is not None else _nvml_numa_node(nvml, handle)


def _sysfs_numa_node(sysfs: Path, bus_id: str) -> int | None:
    try:
        node = int((sysfs / "bus" / "pci" / "devices" / bus_id / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if 0 <= node <= bounds.MAX_NUMA_NODE else None


def _nvml_numa_node(nvml: ModuleType, handle: object) -> int | None:
    """The one node in NVML's memory affinity at node scope, or None.

    Any NVML error is unknown, as the node was before this fallback: it must not fail a discovery that sysfs
    alone let through. Several nodes (NVML falls back to the nearest non-I/O ancestor where node scope does not
    apply) are unknown too: no one of them is the GPU's, and a wrong node would misplace the device plugin's
    NUMA hints.
    """
    query = getattr(nvml, "nvmlDeviceGetMemoryAffinity", None)
    scope = getattr(nvml, "NVML_AFFINITY_SCOPE_NODE", None)
    if query is None or scope is None:  # a pynvml from before affinity scopes
        return None
    try:
        words = list(query(handle, _NODE_SET_WORDS, scope))
    except nvml.NVMLError:
        return None
    if len(words) != _NODE_SET_WORDS or not all(isinstance(word, int) and 0 <= word < 2**64 for word in words):
        return None
    mask = sum(word << (64 * position) for position, word in enumerate(words))
    if mask == 0 or mask & (mask - 1):
        return None
    node = mask.bit_length() - 1
    return node if node <= bounds.MAX_NUMA_NODE else None


def _optional(nvml: ModuleType, query: Callable[..., T], *args: object) -> T | None:
    """A query some GPUs or drivers do not answer (vGPU guests, unified-memory boards, older drivers)."""
    try:
        return query(*args)
    except nvml.NVMLError as error:
        if error.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return None
        raise


def normalise_bus_id(raw: str | bytes) -> str:
    """NVML gives "00000000:07:00.0" or "0000:07:00.0", bytes or str; sysfs and peers need "0000:07:00.0"."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    domain, rest = text.strip().split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def _text(value: str | bytes) -> str:
    """Older pynvml releases return bytes where newer ones return str."""
    return value.decode() if isinstance(value, bytes) else value
