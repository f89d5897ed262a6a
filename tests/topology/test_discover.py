"""NVML discovery, driven by a fake NVML built from each real capture, must give back what the capture says."""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pynvml
import pytest
from helpers.fake_nvml import (GB200_CLIQUE_ID, GB200_CLUSTER_UUID, GB200_FABRICS, Fabric, gpu_uuid, make_fake_nvml,
                       normalised_bus_id, write_sysfs)

from topology import bandwidth
from topology.catalog import NvLinkGen
from topology.discover import FABRIC_INFO_V2, NvmlUnavailable, discover, normalise_bus_id, read_domain
from topology.fabric import Domain
from topology.levels import Level
from topology.model import Topology
from topology.platforms import PLATFORMS

VARIANTS: dict[str, dict[str, Any]] = {
    "str": {},
    "bytes": {"as_bytes": True},
    "remote-type-unsupported": {"remote_type_unsupported": True},
}


def _fake(name: str, **options: Any) -> tuple[Topology, ModuleType]:
    parsed = PLATFORMS[name].topology()
    return parsed, make_fake_nvml(parsed, name, **options)


def _discover(name: str, sysfs: Path, **options: Any) -> Topology:
    parsed, fake = _fake(name, **options)
    return discover(fake, write_sysfs(parsed, sysfs))


def _links_to(fake: ModuleType, gpu: int, peer: int) -> list[int]:
    """The link ids of `gpu` whose far end is `peer`, asked through the fake's own NVML surface."""
    fake.nvmlInit()
    try:
        handle = fake.nvmlDeviceGetHandleByIndex(gpu)
        found = []
        for link in range(fake.NVML_NVLINK_MAX_LINKS):
            try:
                remote = fake.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId
            except pynvml.NVMLError_InvalidArgument:
                break
            if normalise_bus_id(remote) == normalised_bus_id(peer):
                found.append(link)
        return found
    finally:
        fake.nvmlShutdown()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_discovery_gives_back_the_capture(name: str, variant: str, tmp_path: Path) -> None:
    parsed, fake = _fake(name, **VARIANTS[variant])
    found = discover(fake, write_sysfs(parsed, tmp_path))

    assert found.fingerprint == parsed.fingerprint
    assert found.nvlinks == parsed.nvlinks
    assert found.nvswitch == parsed.nvswitch
    assert found.size == parsed.size
    for mine, theirs in zip(found.gpus, parsed.gpus, strict=True):
        assert (mine.model, mine.numa_node, mine.nvlink, mine.pcie_gen, mine.pcie_width, mine.memory_mib) == (
            theirs.model, theirs.numa_node, theirs.nvlink, theirs.pcie_gen, theirs.pcie_width, theirs.memory_mib)
        assert mine.uuid == gpu_uuid(name, mine.index)
        assert mine.pci_bus_id == normalised_bus_id(mine.index)
    assert len({gpu.uuid for gpu in found.gpus}) == found.size
    for i, j in parsed.pairs():
        assert found.level(i, j) == parsed.level(i, j), (i, j)
        assert bandwidth.pair_gbps(found, i, j) == bandwidth.pair_gbps(parsed, i, j), (i, j)
        assert found.pcie[i][j] is not None, "NVML knows the PCIe path of NVLink pairs too"
        if parsed.pcie[i][j] is not None:
            assert found.pcie[i][j] == parsed.pcie[i][j], (i, j)
    assert found.domain == Domain(None, None)  # the fake's GPUs answer NOT_SUPPORTED, as before Hopper
    assert (fake.calls.inits, fake.calls.shutdowns) == (1, 1)


@pytest.mark.parametrize(("name", "gbps"), [("dgx-a100", 12 * 25.0), ("dgx-h100", 18 * 25.0)])
def test_nvswitch_boards_join_every_pair_at_the_full_nvlink_rate(name: str, gbps: float, tmp_path: Path) -> None:
    found = _discover(name, tmp_path)
    assert found.nvswitch
    assert found.size == 8
    for i, j in found.pairs():
        assert found.level(i, j) is Level.NVLINK
        assert bandwidth.pair_gbps(found, i, j) == gbps


def test_dgx1_cube_mesh(tmp_path: Path) -> None:
    found = _discover("dgx1-v100", tmp_path)
    assert not found.nvswitch
    assert found.nvlink_count(0, 3) == 2 and bandwidth.pair_gbps(found, 0, 3) == 50.0
    assert found.nvlink_count(0, 1) == 1 and bandwidth.pair_gbps(found, 0, 1) == 25.0
    assert found.level(0, 5) is Level.SYS
    assert bandwidth.pair_gbps(found, 0, 5) == pytest.approx(15.75 * 0.3)


def test_missing_library_is_one_clear_line() -> None:
    _, fake = _fake("dgx-a100", library_missing=True)
    with pytest.raises(NvmlUnavailable) as caught:
        discover(fake)
    assert str(caught.value) == "NVML is not available: NVML Shared Library Not Found"
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert fake.calls.shutdowns == 0


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_a_driver_says_so() -> None:
    with pytest.raises(NvmlUnavailable, match=r"^NVML is not available: NVML Shared Library Not Found$"):
        discover()


def test_missing_package_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` meets without nvidia-ml-py
    with pytest.raises(NvmlUnavailable, match=r"^NVML is not available: the nvidia-ml-py package is not installed$"):
        discover()


def test_no_gpus_is_a_clear_error_and_nvml_is_shut_down(tmp_path: Path) -> None:
    _, fake = _fake("pcie-l40s")
    fake.nvmlDeviceGetCount = lambda: 0  # type: ignore[attr-defined]
    with pytest.raises(NvmlUnavailable, match=r"^NVML found no GPUs on this node$"):
        discover(fake, tmp_path)
    assert (fake.calls.inits, fake.calls.shutdowns) == (1, 1)


def test_a_failing_query_is_one_line_and_nvml_is_shut_down(tmp_path: Path) -> None:
    _, fake = _fake("dgx-a100")

    def lost(handle: object) -> str:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    fake.nvmlDeviceGetUUID = lost  # type: ignore[attr-defined]
    with pytest.raises(NvmlUnavailable) as caught:
        discover(fake, tmp_path)
    assert str(caught.value) == "NVML query failed: GPU is lost"
    assert caught.value.__suppress_context__
    assert (fake.calls.inits, fake.calls.shutdowns) == (1, 1)


def test_numa_comes_from_the_gpus_pci_device_in_sysfs_before_nvml(tmp_path: Path) -> None:
    parsed, fake = _fake("hgx-h100-4gpu")
    sysfs = write_sysfs(parsed, tmp_path)
    assert [gpu.numa_node for gpu in discover(fake, sysfs).gpus] == [3, 1, 7, 5]  # the capture's NUMA Affinity
    (sysfs / "bus" / "pci" / "devices" / normalised_bus_id(2) / "numa_node").write_text("6\n")
    assert [gpu.numa_node for gpu in discover(fake, sysfs).gpus] == [3, 1, 6, 5]  # NVML would say 7
    (sysfs / "bus" / "pci" / "devices" / normalised_bus_id(2) / "numa_node").write_text("-1\n")
    assert [gpu.numa_node for gpu in discover(fake, sysfs).gpus] == [3, 1, 7, 5]


@pytest.mark.parametrize("sysfs", ["vm", "absent"])
@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_where_sysfs_does_not_know_numa_nvmls_memory_affinity_does(name: str, sysfs: str, tmp_path: Path) -> None:
    """In a VM every numa_node is -1, yet nvidia-smi shows NUMA Affinity: NVML's memory affinity gives it."""
    parsed, fake = _fake(name)
    root = write_sysfs(parsed, tmp_path, vm=True) if sysfs == "vm" else tmp_path / "absent"
    found = discover(fake, root)
    assert [gpu.numa_node for gpu in found.gpus] == [gpu.numa_node for gpu in parsed.gpus]
    assert found.fingerprint == parsed.fingerprint
    assert (fake.calls.inits, fake.calls.shutdowns) == (1, 1)


@pytest.mark.parametrize("affinity", ["not-supported", "absent"])
def test_numa_is_unknown_where_neither_sysfs_nor_nvml_knows_it(affinity: str, tmp_path: Path) -> None:
    parsed, fake = _fake("pcie-l40s", memory_affinity=affinity)
    found = discover(fake, write_sysfs(parsed, tmp_path / "vm", vm=True))
    assert [gpu.numa_node for gpu in found.gpus] == [None] * 8
    assert [gpu.numa_node for gpu in discover(fake, tmp_path / "absent").gpus] == [None] * 8
    present = discover(fake, write_sysfs(parsed, tmp_path / "host"))
    assert [gpu.numa_node for gpu in present.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert (fake.calls.inits, fake.calls.shutdowns) == (3, 3)


@pytest.mark.parametrize(("words", "node"), [
    ({0: 1 << 5}, 5),
    ({1: 1 << 3}, 67),  # the second word holds nodes 64..127
    ({15: 1 << 63}, 1023),  # the last node Linux can number
    ({0: 0b11}, None),  # two nodes: no one of them is the GPU's
    ({0: 1, 3: 1}, None),
    ({}, None),
    ({0: 2**64}, None),  # more than an unsigned long holds
    ({0: -1}, None),
])
def test_the_affinity_mask_must_name_one_node(words: dict[int, int], node: int | None, tmp_path: Path) -> None:
    _, fake = _fake("pcie-l40s")
    asked: list[tuple[int, int]] = []

    def affinity(handle: object, node_set_size: int, scope: int) -> list[int]:
        asked.append((node_set_size, scope))
        return [words.get(word, 0) for word in range(node_set_size)]

    fake.nvmlDeviceGetMemoryAffinity = affinity  # type: ignore[attr-defined]
    assert {gpu.numa_node for gpu in discover(fake, tmp_path).gpus} == {node}
    assert set(asked) == {(16, pynvml.NVML_AFFINITY_SCOPE_NODE)}  # 16 words of 64 bits: nodes 0..1023


@pytest.mark.parametrize("answer", [[1], [1] * 17])
def test_an_affinity_array_of_another_size_is_unknown(answer: list[int], tmp_path: Path) -> None:
    _, fake = _fake("pcie-l40s")
    fake.nvmlDeviceGetMemoryAffinity = lambda handle, size, scope: answer  # type: ignore[attr-defined]
    assert {gpu.numa_node for gpu in discover(fake, tmp_path).gpus} == {None}


def test_any_nvml_error_from_the_affinity_is_unknown_numa(tmp_path: Path) -> None:
    """The fallback only fills a gap sysfs left: it never fails a discovery that would succeed without it."""
    _, fake = _fake("pcie-l40s")

    def broken(handle: object, size: int, scope: int) -> list[int]:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    fake.nvmlDeviceGetMemoryAffinity = broken  # type: ignore[attr-defined]
    assert {gpu.numa_node for gpu in discover(fake, tmp_path).gpus} == {None}
    assert (fake.calls.inits, fake.calls.shutdowns) == (1, 1)


def test_values_no_real_link_has_are_unknown_and_a_duplicate_uuid_is_one_line(tmp_path: Path) -> None:
    """The agent's own annotation stays within topology/bounds.py, whatever the driver answers."""
    _, fake = _fake("pcie-l40s")
    fake.nvmlDeviceGetMaxPcieLinkWidth = lambda handle: 0  # type: ignore[attr-defined]
    fake.nvmlDeviceGetMaxPcieLinkGeneration = lambda handle: 99  # type: ignore[attr-defined]
    found = discover(fake, tmp_path)
    assert {(gpu.pcie_gen, gpu.pcie_width) for gpu in found.gpus} == {(None, None)}
    fake.nvmlDeviceGetUUID = lambda handle: "GPU-same"  # type: ignore[attr-defined]
    with pytest.raises(NvmlUnavailable, match="^NVML describes a node beyond what real hardware has: UUID 'GPU-same' "
                                              "belongs to two GPUs$"):
        discover(fake, tmp_path)


def test_a_downed_direct_link_reduces_the_pair(tmp_path: Path) -> None:
    parsed, fake = _fake("dgx1-v100")
    links = _links_to(fake, 0, 3)
    assert len(links) == 2
    _, fake = _fake("dgx1-v100", down_links=frozenset({(0, links[0])}))
    found = discover(fake, write_sysfs(parsed, tmp_path))
    assert found.nvlink_count(0, 3) == 1
    assert bandwidth.pair_gbps(found, 0, 3) == 25.0
    assert found.nvlink_count(0, 4) == parsed.nvlink_count(0, 4) == 2
    assert found.fingerprint != parsed.fingerprint


def test_a_downed_switch_link_slows_only_that_gpus_pairs(tmp_path: Path) -> None:
    found = _discover("dgx-a100", tmp_path, down_links=frozenset({(0, 0)}))
    assert found.nvswitch
    for i, j in found.pairs():
        assert bandwidth.pair_gbps(found, i, j) == (11 if i == 0 else 12) * 25.0


def test_all_links_of_a_bridge_down_leaves_a_pcie_pair(tmp_path: Path) -> None:
    parsed, fake = _fake("rtx-a6000-pairs")
    down = frozenset((0, link) for link in _links_to(fake, 0, 1))
    assert len(down) == 4
    found = _discover("rtx-a6000-pairs", tmp_path, down_links=down)
    assert found.nvlink_count(0, 1) == 0
    assert found.level(0, 1) is Level.NODE  # both GPUs hang off the same socket
    assert found.gpus[0].nvlink is None
    assert found.gpus[1].nvlink is NvLinkGen.BRIDGE_GA102
    assert found.nvlinks == tuple(pair for pair in parsed.nvlinks if (pair.a, pair.b) != (0, 1))


def test_the_catalog_wins_over_nvmls_version_number(tmp_path: Path) -> None:
    # Some drivers report NVLink 5.0 on H100; the model settles it.
    found = _discover("dgx-h100", tmp_path, nvlink_version=pynvml.NVML_NVLINK_VERSION_5_0)
    assert {gpu.nvlink for gpu in found.gpus} == {NvLinkGen.NVLINK4}
    assert bandwidth.pair_gbps(found, 0, 7) == 18 * 25.0


@pytest.mark.parametrize(("version", "generation"), [
    (pynvml.NVML_NVLINK_VERSION_1_0, NvLinkGen.NVLINK1),
    (pynvml.NVML_NVLINK_VERSION_2_0, NvLinkGen.NVLINK2),
    (pynvml.NVML_NVLINK_VERSION_2_2, NvLinkGen.NVLINK2),
    (pynvml.NVML_NVLINK_VERSION_3_0, NvLinkGen.NVLINK3),
    (pynvml.NVML_NVLINK_VERSION_3_1, NvLinkGen.NVLINK3),
    (pynvml.NVML_NVLINK_VERSION_4_0, NvLinkGen.NVLINK4),
    (pynvml.NVML_NVLINK_VERSION_5_0, NvLinkGen.NVLINK5),
    (pynvml.NVML_NVLINK_VERSION_INVALID, None),
])
def test_nvml_version_names_the_generation_of_a_model_the_catalog_lacks(
        version: int, generation: NvLinkGen | None, tmp_path: Path) -> None:
    parsed = PLATFORMS["dgx-a100"].topology()
    unknown = dataclasses.replace(parsed, gpus=tuple(dataclasses.replace(gpu, model="NVIDIA Future GPU")
                                                     for gpu in parsed.gpus))
    found = discover(make_fake_nvml(unknown, "future", nvlink_version=version), write_sysfs(unknown, tmp_path))
    assert {gpu.nvlink for gpu in found.gpus} == {generation}
    assert found.nvswitch and found.nvlink_count(0, 7) == 12


def test_a_dual_gpu_board_counts_as_one_bridge(tmp_path: Path) -> None:
    parsed, fake = _fake("pcie-l40s")
    fake.nvmlDeviceGetTopologyCommonAncestor = lambda first, second: pynvml.NVML_TOPOLOGY_INTERNAL  # type: ignore[attr-defined]
    found = discover(fake, write_sysfs(parsed, tmp_path))
    assert {found.level(i, j) for i, j in found.pairs()} == {Level.PIX}


def test_an_unknown_path_level_is_one_line(tmp_path: Path) -> None:
    _, fake = _fake("pcie-l40s")
    fake.nvmlDeviceGetTopologyCommonAncestor = lambda first, second: 45  # type: ignore[attr-defined]
    with pytest.raises(NvmlUnavailable, match=r"^NVML reported an unknown PCIe path level 45 for GPU0/GPU1$"):
        discover(fake, tmp_path)
    assert (fake.calls.inits, fake.calls.shutdowns) == (1, 1)


@pytest.mark.parametrize(("raw", "expected"), [
    ("00000000:07:00.0", "0000:07:00.0"),
    (b"00000000:B7:00.0", "0000:b7:00.0"),
    ("0000:BD:00.0", "0000:bd:00.0"),
    ("00010000:01:00.0", "10000:01:00.0"),  # sysfs prints domains wider than 4 digits in full
])
def test_bus_ids_take_the_sysfs_form(raw: str | bytes, expected: str) -> None:
    assert normalise_bus_id(raw) == expected


# -- where the node sits: NVML fabric info (topology/fabric.py) -------------------------------------------

GB200_DOMAIN = f"{GB200_CLUSTER_UUID}.{GB200_CLIQUE_ID}"
IN_PROGRESS = Domain(None, "GPU 2 fabric registration in progress")

EXPECTED_DOMAINS: dict[str, Domain] = {
    "completed": Domain(GB200_DOMAIN),
    "not-started": Domain(None, "GPU 0 fabric registration not started"),
    "gpu2-in-progress": IN_PROGRESS,
    "zero-uuid": Domain(None, None),
    "insufficient-resources": Domain(None, "GPU 0 fabric status is not success"),
    "two-cliques": Domain(None, f"GPUs disagree on their NVLink domain: GPU 0 in {GB200_DOMAIN}, GPU 2 in "
                                f"{GB200_CLUSTER_UUID}.{GB200_CLIQUE_ID + 1}"),
    "two-clusters": Domain(None, f"GPUs disagree on their NVLink domain: GPU 0 in {GB200_DOMAIN}, GPU 3 in "
                                 f"0c6f5af3-53bf-49b5-a436-b66766c413c3.{GB200_CLIQUE_ID}"),
    "gpu3-zero-uuid": Domain(None, "GPU 3 fabric cluster UUID is zero"),
    "not-supported": Domain(None, None),
    "state-not-supported": Domain(None, None),
    "gpu1-not-supported": Domain(None, "GPU 1 has no fabric info while other GPUs of the node do"),
    "gpu0-lost": Domain(None, "GPU 0 fabric info unreadable: NVMLError_GpuIsLost"),
}


def test_every_gb200_case_has_its_expected_domain() -> None:
    assert EXPECTED_DOMAINS.keys() == GB200_FABRICS.keys()


@pytest.mark.parametrize("case", sorted(GB200_FABRICS))
def test_the_gb200_nodes_domain_comes_from_its_gpus_fabric_info(case: str, tmp_path: Path) -> None:
    parsed, fake = _fake("gb200-node", fabric=GB200_FABRICS[case])
    found = discover(fake, write_sysfs(parsed, tmp_path))
    assert found.domain == EXPECTED_DOMAINS[case]
    assert found.fingerprint == parsed.fingerprint  # the board is the board, whatever its rack
    assert (fake.calls.inits, fake.calls.shutdowns) == (1, 1)


@pytest.mark.parametrize(("api", "domain"), [
    ("v", Domain(GB200_DOMAIN)),
    ("legacy", Domain(GB200_DOMAIN)),  # pynvml before 12.550: nvmlDeviceGetGpuFabricInfo only
    ("v-not-in-driver", Domain(GB200_DOMAIN)),  # the driver lacks the V symbol: FUNCTION_NOT_FOUND
    ("v2-refused", Domain(GB200_DOMAIN)),  # the driver refuses the structure version
    ("absent", Domain(None, None)),  # pynvml without either call: nothing to read, nothing claimed
])
def test_every_pynvml_and_driver_gives_the_domain_it_can(api: str, domain: Domain, tmp_path: Path) -> None:
    parsed, fake = _fake("gb200-node", fabric=GB200_FABRICS["completed"], fabric_api=api)
    assert discover(fake, write_sysfs(parsed, tmp_path)).domain == domain


def test_a_registration_state_this_build_does_not_know_is_a_problem_not_a_failure(tmp_path: Path) -> None:
    parsed, fake = _fake("gb200-node", fabric=[Fabric()] * 3 + [Fabric(state=7)])
    found = discover(fake, write_sysfs(parsed, tmp_path))
    assert found.domain == Domain(None, "GPU 3 fabric info unreadable: 7 is not a valid FabricState")


def test_the_domain_is_read_again_on_each_call(tmp_path: Path) -> None:
    """The agent calls read_domain each round: registration finishing, or a GPU falling out, shows at once."""
    answers = list(GB200_FABRICS["gpu2-in-progress"])
    parsed, fake = _fake("gb200-node", fabric=answers)
    assert discover(fake, write_sysfs(parsed, tmp_path)).domain == IN_PROGRESS
    fake.nvmlInit()
    try:
        assert read_domain(fake, 4) == IN_PROGRESS
        answers[2] = Fabric()
        assert read_domain(fake, 4) == Domain(GB200_DOMAIN)
        answers[1] = pynvml.NVML_ERROR_GPU_IS_LOST
        assert read_domain(fake, 4) == Domain(None, "GPU 1 fabric info unreadable: NVMLError_GpuIsLost")
    finally:
        fake.nvmlShutdown()


def test_the_structures_passed_are_nvml_hs() -> None:
    """What the fake's C-like writes rely on, checked against pynvml's own names: the version word is
    nvmlGpuFabricInfo_v2, and every field but the one-byte state sits where pynvml 13's structure has it."""
    import topology.discover as discovery

    assert FABRIC_INFO_V2 == pynvml.nvmlGpuFabricInfo_v2 == 0x02000024
    assert pynvml.c_nvmlGpuFabricInfoV_t is pynvml.c_nvmlGpuFabricInfo_v2_t
    ours, theirs = discovery._FabricInfoV2, pynvml.c_nvmlGpuFabricInfo_v2_t
    assert ctypes.sizeof(ours) == ctypes.sizeof(theirs) == 36
    for name in ("version", "clusterUuid", "status", "cliqueId", "state", "healthMask"):
        assert getattr(ours, name).offset == getattr(theirs, name).offset, name
    assert (ours.state.size, theirs.state.size) == (1, 4)  # nvmlGpuFabricState_t is an unsigned char
    legacy, theirs = discovery._FabricInfo, pynvml.c_nvmlGpuFabricInfo_t
    for name in ("clusterUuid", "status", "cliqueId", "state"):
        assert getattr(legacy, name).offset == getattr(theirs, name).offset, name


def test_pynvmls_int_state_would_misread_what_the_driver_leaves_in_the_padding() -> None:
    """Why discovery passes its own structure: the fake, as a driver may, leaves the bytes after the state alone."""
    parsed, fake = _fake("gb200-node", fabric=GB200_FABRICS["completed"])
    fake.nvmlInit()
    try:
        theirs = pynvml.c_nvmlGpuFabricInfoV_t()
        fake.nvmlDeviceGetGpuFabricInfoV(fake.nvmlDeviceGetHandleByIndex(0), ctypes.byref(theirs))
    finally:
        fake.nvmlShutdown()
    assert theirs.cliqueId == GB200_CLIQUE_ID
    assert theirs.state != pynvml.NVML_GPU_FABRIC_STATE_COMPLETED and theirs.state & 0xFF == 3
