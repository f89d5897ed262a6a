"""A fake `pynvml` module built from a Topology, so discovery runs in tests against the real captures.

It answers like NVML on a real board: NVSwitch GPUs spread their links over a few switches, direct pairs
get one link per NVLink with the peer's bus id at the far end, link ids past a GPU's last link answer
INVALID_ARGUMENT and GPUs without NVLink NOT_SUPPORTED. Memory affinity at node scope names the capture's NUMA
node, which a VM's sysfs does not know (write_sysfs with vm=True). Fabric info is written into the caller's memory
at nvml.h's offsets, as the C library does, whatever structure the caller passes. Constants and NVMLError classes
are the real pynvml ones, so discovery cannot rely on anything the real module would not give it.
"""

from __future__ import annotations

import ctypes
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any, Literal, NoReturn

import pynvml

from topology.catalog import NvLinkGen
from topology.levels import Level
from topology.model import Topology

_ANCESTORS: dict[Level, int] = {
    Level.PIX: pynvml.NVML_TOPOLOGY_SINGLE,
    Level.PXB: pynvml.NVML_TOPOLOGY_MULTIPLE,
    Level.PHB: pynvml.NVML_TOPOLOGY_HOSTBRIDGE,
    Level.NODE: pynvml.NVML_TOPOLOGY_NODE,
    Level.SYS: pynvml.NVML_TOPOLOGY_SYSTEM,
}

_NVLINK_VERSIONS: dict[NvLinkGen, int] = {
    NvLinkGen.NVLINK1: pynvml.NVML_NVLINK_VERSION_1_0,
    NvLinkGen.NVLINK2: pynvml.NVML_NVLINK_VERSION_2_0,
    NvLinkGen.NVLINK3: pynvml.NVML_NVLINK_VERSION_3_0,
    NvLinkGen.BRIDGE_GA102: pynvml.NVML_NVLINK_VERSION_3_0,
    NvLinkGen.NVLINK4: pynvml.NVML_NVLINK_VERSION_4_0,
    NvLinkGen.NVLINK5: pynvml.NVML_NVLINK_VERSION_5_0,
}

# NVSwitch chips per board: DGX-2 baseboards and DGX/HGX A100 have 6, Hopper HGX boards 4 (18 links spread over them),
# and a GB200 GPU reaches 18 switch chips, one link each.
_SWITCHES: dict[NvLinkGen | None, int] = {NvLinkGen.NVLINK4: 4, NvLinkGen.NVLINK5: 18}
_DEFAULT_SWITCHES = 6

# How the driver and pynvml answer nvmlDeviceGetMemoryAffinity: with the node, NOT_SUPPORTED, or not at all
# (a pynvml without the function or the NVML_AFFINITY_SCOPE_* constants).
MemoryAffinity = Literal["node", "not-supported", "absent"]

# Which fabric info calls there are: both (pynvml from 12.550 on a current driver), only the older one (pynvml
# before 12.550), V in pynvml but not in the driver (FUNCTION_NOT_FOUND) or refusing version 2
# (ARGUMENT_VERSION_MISMATCH), or neither (pynvml before 12.535).
FabricApi = Literal["v", "legacy", "v-not-in-driver", "v2-refused", "absent"]

# A real GB200 node's fabric info (leptonai/gpud PR #1106), the same on its four GPUs.
GB200_CLUSTER_UUID = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
GB200_CLIQUE_ID = 4026
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True, slots=True)
class Fabric:
    """What one GPU's fabric info query fills in."""

    cluster_uuid: str = GB200_CLUSTER_UUID
    clique_id: int = GB200_CLIQUE_ID
    state: int = pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = pynvml.NVML_SUCCESS


# Per GPU: the fabric info, or the NVML error its query fails with.
FabricAnswer = Fabric | int

_REGISTERING = Fabric(ZERO_UUID, 0, pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS)

# The cases of a GB200 node (4 GPUs) the agent must tell apart.
GB200_FABRICS: dict[str, tuple[FabricAnswer, ...]] = {
    "completed": (Fabric(),) * 4,
    "not-started": (Fabric(ZERO_UUID, 0, pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED),) * 4,
    "gpu2-in-progress": (Fabric(), Fabric(), _REGISTERING, Fabric()),
    # HGX H100: registered with its node's own NVSwitches, in no cluster (meta-pytorch/torchcomms PR #1385).
    "zero-uuid": (Fabric(ZERO_UUID, 0),) * 4,
    # Registration failed (Azure/azhpc-images PR #506).
    "insufficient-resources": (Fabric(ZERO_UUID, 0, status=pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES),) * 4,
    "two-cliques": (Fabric(), Fabric(), Fabric(clique_id=GB200_CLIQUE_ID + 1), Fabric(clique_id=GB200_CLIQUE_ID + 1)),
    "two-clusters": (Fabric(),) * 3 + (Fabric(cluster_uuid="0c6f5af3-53bf-49b5-a436-b66766c413c3"),),
    "gpu3-zero-uuid": (Fabric(),) * 3 + (Fabric(ZERO_UUID),),
    "not-supported": (pynvml.NVML_ERROR_NOT_SUPPORTED,) * 4,
    "state-not-supported": (Fabric(ZERO_UUID, 0, pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED),) * 4,
    "gpu1-not-supported": (Fabric(), pynvml.NVML_ERROR_NOT_SUPPORTED, Fabric(), Fabric()),
    "gpu0-lost": (pynvml.NVML_ERROR_GPU_IS_LOST,) + (Fabric(),) * 3,
}

_BY_REFERENCE = type(ctypes.byref(ctypes.c_int()))
_FABRIC_VERSIONS = frozenset({pynvml.nvmlGpuFabricInfo_v2, pynvml.nvmlGpuFabricInfo_v3})


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


@dataclass(frozen=True, slots=True)
class _Link:
    remote: str
    kind: int


@dataclass
class Calls:
    """How often the fake was initialised and shut down, so tests can check discovery always shuts down."""

    inits: int = 0
    shutdowns: int = 0


def gpu_bus_id(index: int) -> str:
    """NVML's own form: 8-hex-digit domain, upper case."""
    return f"00000000:{0x07 + 8 * index:02X}:00.0"


def normalised_bus_id(index: int) -> str:
    """The form sysfs uses, and that discovery reports."""
    return f"0000:{0x07 + 8 * index:02x}:00.0"


def _switch_bus_id(switch: int) -> str:
    return f"0000:{0xC4 + switch:02X}:00.0"


def gpu_uuid(name: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"fake-nvml/{name}/{index}"))


def write_sysfs(topology: Topology, root: Path, *, vm: bool = False) -> Path:
    """The numa_node files the kernel would show for the GPUs' PCI devices (-1 where NUMA is unknown).

    vm: -1 for every GPU, as in a VM whose firmware gives PCI devices no NUMA locality.
    """
    for gpu in topology.gpus:
        device = root / "bus" / "pci" / "devices" / normalised_bus_id(gpu.index)
        device.mkdir(parents=True, exist_ok=True)
        node = -1 if vm or gpu.numa_node is None else gpu.numa_node
        (device / "numa_node").write_text(f"{node}\n")
    return root


def _nvlinks(topology: Topology, index: int) -> list[_Link]:
    gpu = topology.gpus[index]
    peers = [j for j in range(topology.size) if j != index]
    if topology.nvswitch:
        count = max((topology.nvlink_count(index, j) for j in peers), default=0)
        switches = _SWITCHES.get(gpu.nvlink, _DEFAULT_SWITCHES)
        return [_Link(_switch_bus_id(link % switches), pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH) for link in range(count)]
    return [_Link(normalised_bus_id(j).upper(), pynvml.NVML_NVLINK_DEVICE_TYPE_GPU)
            for j in peers for _ in range(topology.nvlink_count(index, j))]


def make_fake_nvml(topology: Topology, name: str, *, library_missing: bool = False,
                   remote_type_unsupported: bool = False, down_links: frozenset[tuple[int, int]] = frozenset(),
                   nvlink_version: int | None = None, as_bytes: bool = False,
                   memory_affinity: MemoryAffinity = "node", fabric: Sequence[FabricAnswer] | None = None,
                   fabric_api: FabricApi = "v", minors: Sequence[int] | None = None) -> ModuleType:
    """A module with pynvml's surface describing `topology`.

    library_missing: nvmlInit fails as on a node without the driver. remote_type_unsupported: the driver
    lacks nvmlDeviceGetNvLinkRemoteDeviceType. down_links: (gpu, link) pairs whose link state is disabled.
    nvlink_version: what every link reports instead of its generation's enum. as_bytes: strings come back
    as bytes, as older pynvml releases return them. memory_affinity: how nvmlDeviceGetMemoryAffinity answers.
    fabric: each GPU's fabric info, read at each call (a list may change while the agent runs); None: NOT_SUPPORTED
    on every GPU, as before Hopper. fabric_api: which fabric info calls there are. minors: each GPU's
    /dev/nvidia<minor> (default: its index); the driver numbers GPUs as it probes them, not by NVML's PCI order.
    """
    fake = ModuleType(f"fake_nvml[{name}]")
    for attribute in dir(pynvml):
        if attribute.startswith(("NVML_", "NVMLError")):
            setattr(fake, attribute, getattr(pynvml, attribute))
    if memory_affinity == "absent":
        del fake.NVML_AFFINITY_SCOPE_NODE, fake.NVML_AFFINITY_SCOPE_SOCKET  # type: ignore[attr-defined]
    links = [_nvlinks(topology, i) for i in range(topology.size)]
    calls = Calls()
    fake.calls = calls  # type: ignore[attr-defined]

    def text(value: str) -> str | bytes:
        return value.encode() if as_bytes else value

    def link_of(handle: _Handle, link: int) -> _Link:
        if not links[handle.index]:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(links[handle.index]):
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[handle.index][link]

    def nvmlInit() -> None:
        if library_missing:
            _fail(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        calls.inits += 1

    def nvmlShutdown() -> None:
        calls.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        if not 0 <= index < topology.size:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetPciInfo(handle: _Handle) -> Any:
        return SimpleNamespace(busId=text(gpu_bus_id(handle.index)))

    def nvmlDeviceGetMemoryInfo(handle: _Handle) -> Any:
        total = _or_not_supported(topology.gpus[handle.index].memory_mib) * 2**20
        return SimpleNamespace(total=total, free=total, used=0)

    def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
        return _or_not_supported(topology.gpus[handle.index].pcie_gen)

    def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
        return _or_not_supported(topology.gpus[handle.index].pcie_width)

    def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
        link_of(handle, link)
        down = (handle.index, link) in down_links
        return pynvml.NVML_FEATURE_DISABLED if down else pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkVersion(handle: _Handle, link: int) -> int:
        link_of(handle, link)
        generation = topology.gpus[handle.index].nvlink
        if nvlink_version is not None:
            return nvlink_version
        return _NVLINK_VERSIONS[generation] if generation else pynvml.NVML_NVLINK_VERSION_INVALID

    def nvmlDeviceGetNvLinkRemotePciInfo(handle: _Handle, link: int) -> Any:
        return SimpleNamespace(busId=text(link_of(handle, link).remote))

    def nvmlDeviceGetNvLinkRemoteDeviceType(handle: _Handle, link: int) -> int:
        if remote_type_unsupported:
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return link_of(handle, link).kind

    def nvmlDeviceGetMemoryAffinity(handle: _Handle, node_set_size: int, scope: int) -> list[int]:
        """One bit, the capture's node, in words of 64 bits; a node the capture lacks is NOT_SUPPORTED.

        Only node scope is answered: the captures do not say which nodes share a socket.
        """
        node = topology.gpus[handle.index].numa_node
        if memory_affinity == "not-supported" or node is None:
            _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if scope != pynvml.NVML_AFFINITY_SCOPE_NODE:
            _fail(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if node >= 64 * node_set_size:
            _fail(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        return [(1 << node >> (64 * word)) & (2**64 - 1) for word in range(node_set_size)]

    def fabric_info(handle: _Handle, info: Any, *, versioned: bool) -> int:
        """As the C library: the fields land at nvml.h's offsets in the memory `info` points to."""
        answer = pynvml.NVML_ERROR_NOT_SUPPORTED if fabric is None else fabric[handle.index]
        if isinstance(answer, int):
            _fail(answer)
        _write_fabric(info, answer, versioned)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(handle: _Handle, info: Any) -> int:
        if fabric_api == "v-not-in-driver":
            _fail(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if fabric_api == "v2-refused":
            _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        return fabric_info(handle, info, versioned=True)

    def nvmlDeviceGetTopologyCommonAncestor(first: _Handle, second: _Handle) -> int:
        i, j = first.index, second.index
        level = topology.pcie[i][j]
        if level is None:  # the capture hides the PCIe path of NVLink pairs: NVML would still know it
            same_node = topology.gpus[i].numa_node == topology.gpus[j].numa_node
            return pynvml.NVML_TOPOLOGY_NODE if same_node else pynvml.NVML_TOPOLOGY_SYSTEM
        return _ANCESTORS[level]

    def initialised(function: Callable[..., Any]) -> Callable[..., Any]:
        """As NVML: every call but nvmlInit fails with UNINITIALIZED outside nvmlInit ... nvmlShutdown."""
        def call(*args: Any) -> Any:
            if calls.inits <= calls.shutdowns:
                _fail(pynvml.NVML_ERROR_UNINITIALIZED)
            return function(*args)
        return call

    functions: dict[str, Callable[..., Any]] = {
        "nvmlShutdown": nvmlShutdown,
        "nvmlDeviceGetCount": lambda: topology.size,
        "nvmlDeviceGetHandleByIndex": nvmlDeviceGetHandleByIndex,
        "nvmlDeviceGetName": lambda handle: text(topology.gpus[handle.index].model),
        "nvmlDeviceGetUUID": lambda handle: text(gpu_uuid(name, handle.index)),
        "nvmlDeviceGetMinorNumber": lambda handle: handle.index if minors is None else minors[handle.index],
        "nvmlDeviceGetPciInfo": nvmlDeviceGetPciInfo,
        "nvmlDeviceGetMemoryInfo": nvmlDeviceGetMemoryInfo,
        "nvmlDeviceGetMaxPcieLinkGeneration": nvmlDeviceGetMaxPcieLinkGeneration,
        "nvmlDeviceGetMaxPcieLinkWidth": nvmlDeviceGetMaxPcieLinkWidth,
        "nvmlDeviceGetNvLinkState": nvmlDeviceGetNvLinkState,
        "nvmlDeviceGetNvLinkVersion": nvmlDeviceGetNvLinkVersion,
        "nvmlDeviceGetNvLinkRemotePciInfo": nvmlDeviceGetNvLinkRemotePciInfo,
        "nvmlDeviceGetNvLinkRemoteDeviceType": nvmlDeviceGetNvLinkRemoteDeviceType,
        "nvmlDeviceGetTopologyCommonAncestor": nvmlDeviceGetTopologyCommonAncestor,
    }
    if memory_affinity != "absent":
        functions["nvmlDeviceGetMemoryAffinity"] = nvmlDeviceGetMemoryAffinity
    if fabric_api != "absent":
        functions["nvmlDeviceGetGpuFabricInfo"] = lambda handle, info: fabric_info(handle, info, versioned=False)
    if fabric_api not in ("legacy", "absent"):
        functions["nvmlDeviceGetGpuFabricInfoV"] = nvmlDeviceGetGpuFabricInfoV
    fake.nvmlInit = nvmlInit  # type: ignore[attr-defined]
    for function_name, function in functions.items():
        setattr(fake, function_name, initialised(function))
    return fake


def _write_fabric(info: Any, answer: Fabric, versioned: bool) -> None:
    """nvmlGpuFabricInfo_t, or after the version word _v2_t/_v3_t: clusterUuid[16], status, cliqueId, the one-byte
    state, then padding, which the driver leaves as it finds it (here: not zero)."""
    if type(info) is not _BY_REFERENCE:
        raise TypeError("NVML fills the structure a pointer names: pass ctypes.byref(structure)")
    base = ctypes.addressof(info._obj)
    if versioned:
        if ctypes.c_uint.from_address(base).value not in _FABRIC_VERSIONS:
            _fail(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        base += ctypes.sizeof(ctypes.c_uint)
    if ctypes.sizeof(info._obj) < base - ctypes.addressof(info._obj) + 28:
        raise TypeError("the structure is smaller than nvml.h's: NVML would write past its end")
    ctypes.memmove(base, uuid.UUID(answer.cluster_uuid).bytes, 16)
    ctypes.c_uint.from_address(base + 16).value = answer.status
    ctypes.c_uint32.from_address(base + 20).value = answer.clique_id
    ctypes.memmove(base + 24, bytes([answer.state, 0xA5, 0xA5, 0xA5]), 4)


def _or_not_supported(value: int | None) -> int:
    """Where the capture does not know a figure, answer as NVML does for a query a GPU cannot answer."""
    if value is None:
        _fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
    return value


def _fail(code: int) -> NoReturn:
    raise pynvml.NVMLError(code)
