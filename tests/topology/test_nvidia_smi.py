"""The topo -m parser on every real capture, and its refusals on broken ones."""

from __future__ import annotations

import pytest

from topology.levels import Level
from topology.model import Topology
from topology.nvidia_smi import TopoParseError, parse_topo_capture, parse_topo_matrix
from topology.platforms import PLATFORMS

from helpers import paths

FIXTURES = paths.FIXTURES
SHARED = paths.SHARED / "topologies"
CAPTURES = paths.CAPTURES


def _capture(name: str) -> str:
    return (CAPTURES / name).read_text()


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/topologies is not beside this checkout")
def test_bundled_captures_are_verbatim_copies_of_the_shared_ones() -> None:
    for platform in PLATFORMS.values():
        shared = SHARED / platform.capture
        if shared.exists():
            assert shared.read_bytes() == (CAPTURES / platform.capture).read_bytes(), platform.capture
    assert (SHARED / "dgx2-v100-partial.txt").read_bytes() == (FIXTURES / "dgx2-v100-partial.txt").read_bytes()


@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_every_platform_parses_to_a_full_symmetric_matrix(name: str) -> None:
    topology = PLATFORMS[name].topology()
    text = PLATFORMS[name].capture_text()
    header = next(line for line in text.splitlines() if line.split()[:1] == ["GPU0"])
    assert topology.size == sum(1 for token in header.split() if token.startswith("GPU") and token[3:].isdigit())
    for i, j in topology.pairs():
        assert topology.level(i, j) == topology.level(j, i)


def test_dgx1_v100_cube_mesh() -> None:
    topology = PLATFORMS["dgx1-v100"].topology()
    assert not topology.nvswitch
    assert topology.nvlink_count(0, 3) == 2 and topology.nvlink_count(0, 1) == 1
    assert topology.level(0, 5) is Level.SYS
    # 12 GPU pairs without NVLink, as the capture's note says; NUMA inferred from CPU Affinity.
    assert sum(1 for i, j in topology.pairs() if not topology.nvlink_count(i, j)) == 12
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_nvswitch_boards_are_told_from_direct_meshes() -> None:
    assert PLATFORMS["dgx-a100"].topology().nvswitch
    assert PLATFORMS["dgx-h100"].topology().nvswitch
    assert PLATFORMS["gb200-node"].topology().nvswitch
    assert PLATFORMS["dgx2-v100"].topology().nvswitch
    # NV6 to each of 3 peers is 18 links: exactly what an H100 has, so a direct mesh.
    assert not PLATFORMS["hgx-h100-4gpu"].topology().nvswitch
    assert not PLATFORMS["rtx-a6000-pairs"].topology().nvswitch


def test_numa_affinity_column_wins_over_cpu_affinity() -> None:
    assert [g.numa_node for g in PLATFORMS["dgx-a100"].topology().gpus] == [3, 3, 1, 1, 7, 7, 5, 5]
    assert [g.numa_node for g in PLATFORMS["hgx-h100-4gpu"].topology().gpus] == [3, 1, 7, 5]


def test_tab_separated_tree_with_trailing_tab() -> None:
    topology = PLATFORMS["pcie-8gpu-switch-tree"].topology()
    assert topology.level(0, 1) is Level.PIX
    assert topology.level(0, 2) is Level.PXB
    assert topology.level(3, 4) is Level.SYS
    assert [g.numa_node for g in topology.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]


def test_header_without_leading_whitespace_and_legend_glued_to_rows() -> None:
    topology = PLATFORMS["dgx-h100"].topology()
    assert topology.size == 8 and topology.nvlink_count(6, 7) == 18


def test_without_a_model_the_text_alone_still_parses() -> None:
    topology = parse_topo_matrix(_capture("dgx1-v100.txt"))
    assert topology.gpus[0].model == "unknown" and topology.gpus[0].nvlink is None
    assert topology.fingerprint != PLATFORMS["dgx1-v100"].topology().fingerprint


def test_partial_dgx2_capture_is_refused_naming_row_and_column() -> None:
    with pytest.raises(TopoParseError) as error:
        parse_topo_matrix((FIXTURES / "dgx2-v100-partial.txt").read_text())
    assert "row GPU4" in str(error.value) and "CPU Affinity" in str(error.value)


def _edit(name: str, old: str, new: str, count: int = 1) -> str:
    text = _capture(name)
    assert old in text
    return text.replace(old, new, count)


def test_missing_rows_are_named() -> None:
    text = "\n".join(line for line in _capture("dgx1-v100.txt").splitlines() if not line.startswith("GPU6"))
    with pytest.raises(TopoParseError, match="partial matrix: no row for GPU6"):
        parse_topo_matrix(text)


def test_asymmetric_pair_is_named() -> None:
    text = _edit("dgx1-v100.txt", "GPU3    NV2     NV1", "GPU3    NV1     NV1")
    with pytest.raises(TopoParseError, match="asymmetric pair: row GPU0, column GPU3 says NV2 but row GPU3, "
                                             "column GPU0 says NV1"):
        parse_topo_matrix(text)


def test_unknown_code_is_named() -> None:
    text = _edit("pcie-l40s-8gpu-2socket.txt", "GPU1    NODE     X      NODE", "GPU1    NODE     X      QPI")
    with pytest.raises(TopoParseError, match="row GPU1, column GPU2: unknown code 'QPI'"):
        parse_topo_matrix(text)


def test_short_row_is_named() -> None:
    text = _edit("hgx-h100-4gpu-nv6.txt", "GPU2    NV6     NV6      X      NV6     SYS     SYS     PIX     SYS     "
                 "7,15,23,31      7               N/A", "GPU2    NV6     NV6      X")
    with pytest.raises(TopoParseError, match="row GPU2: 3 entries for 8 columns"):
        parse_topo_matrix(text)


def test_bad_affinity_is_named() -> None:
    text = _edit("gb200-nvl72-node.txt", "72-143  1", "72-14x  1")
    with pytest.raises(TopoParseError, match="row GPU2, column CPU Affinity: cannot read '72-14x'"):
        parse_topo_matrix(text)


@pytest.mark.parametrize("garbage", ["", "hello\nworld", "\x00\x01\x02", "GPU1 X\n", "{\"v\": 1}"])
def test_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(TopoParseError):
        parse_topo_matrix(garbage)


def test_legacy_soc_code_reads_as_sys() -> None:
    text = _edit("pcie-l40s-8gpu-2socket.txt", "SYS", "SOC", count=-1)
    topology = parse_topo_matrix(text, "NVIDIA L40S")
    assert topology.level(0, 4) is Level.SYS
    assert topology.fingerprint == PLATFORMS["pcie-l40s"].topology().fingerprint


TOPO_M = FIXTURES / "topo_m"
_DGX1 = ["X NV1 NV1 NV2 NV2 SYS SYS SYS", "NV1 X NV2 NV1 SYS NV2 SYS SYS", "NV1 NV2 X NV2 SYS SYS NV1 SYS",
         "NV2 NV1 NV2 X SYS SYS SYS NV1", "NV2 SYS SYS SYS X NV1 NV1 NV2", "SYS NV2 SYS SYS NV1 X NV2 NV1",
         "SYS SYS NV1 SYS NV1 NV2 X NV2", "SYS SYS SYS NV1 NV2 NV1 NV2 X"]


def _mesh(n: int, code: str) -> list[str]:
    return [" ".join("X" if i == j else code for j in range(n)) for i in range(n)]


def _codes(topology: Topology) -> list[str]:
    """The GPU part of the matrix as topo -m prints it, one string a row."""
    def code(i: int, j: int) -> str:
        if i == j:
            return "X"
        links = topology.nvlink_count(i, j)
        return f"NV{links}" if links else topology.level(i, j).name
    return [" ".join(code(i, j) for j in range(topology.size)) for i in range(topology.size)]


@pytest.mark.parametrize(("name", "matrix", "numa"), [
    ("r470-dgx1-v100.txt", _DGX1, [0, 0, 0, 0, 1, 1, 1, 1]),
    ("r535-dgx-h100.txt", _mesh(8, "NV18"), [0, 0, 0, 0, 1, 1, 1, 1]),
    ("r580-dgx-h100.txt", _mesh(8, "NV18"), [0, 0, 0, 0, 1, 1, 1, 1]),
    ("r580-h100-vm.txt", ["X"], [0]),
    ("tabs-hgx-h100-4gpu.txt", _mesh(4, "NV6"), [3, 1, 7, 5]),
    ("no-nic-rows-dgx-a100.txt", _mesh(8, "NV12"), [3, 3, 1, 1, 7, 7, 5, 5]),
    ("na-cells-vm.txt", ["X PHB", "PHB X"], [None, None]),
    ("run-together-header-hgx-a100.txt", _mesh(8, "NV12"), [3, 3, 1, 1, 7, 7, 5, 5]),
])
def test_every_driver_layout_reads_to_the_gpu_matrix_and_numa_nodes(name: str, matrix: list[str],
                                                                     numa: list[int | None]) -> None:
    topology = parse_topo_matrix((TOPO_M / name).read_text())
    assert _codes(topology) == matrix
    assert [gpu.numa_node for gpu in topology.gpus] == numa


def test_the_reported_r580_vm_capture_parses_as_printed() -> None:
    text = "\x1b[4m\tGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n"
    topology = parse_topo_matrix(text, "NVIDIA H100 80GB HBM3")
    assert topology.size == 1 and topology.gpus[0].numa_node == 0


def test_escapes_anywhere_are_ignored() -> None:
    text = (TOPO_M / "r535-dgx-h100.txt").read_text().replace("NV18", "\x1b[1mNV18\x1b[0m")
    text = text.replace("GPU3\t", "\x1b[32mGPU3\x1b[m\t")
    assert _codes(parse_topo_matrix(text)) == _mesh(8, "NV18")


def test_missing_nic_rows_are_a_note_not_an_error() -> None:
    parsed = parse_topo_capture((TOPO_M / "no-nic-rows-dgx-a100.txt").read_text())
    assert parsed.notes == ("no row for NIC0, NIC1, NIC2, NIC3 and 6 more of the 10 NIC columns; every GPU row is "
                            "there, so the GPU links are complete",)
    assert parse_topo_capture((TOPO_M / "r535-dgx-h100.txt").read_text()).notes == ()


def test_a_missing_gpu_row_stays_an_error_even_without_nic_rows() -> None:
    text = "\n".join(line for line in (TOPO_M / "no-nic-rows-dgx-a100.txt").read_text().splitlines()
                     if not line.startswith("GPU5"))
    with pytest.raises(TopoParseError, match="partial matrix: no row for GPU5"):
        parse_topo_matrix(text)


def test_asymmetry_and_unknown_codes_stay_errors_in_new_layouts() -> None:
    text = (TOPO_M / "r580-dgx-h100.txt").read_text()
    with pytest.raises(TopoParseError, match="asymmetric pair: row GPU0, column GPU1 says NV12 but row GPU1, "
                                             "column GPU0 says NV18"):
        parse_topo_matrix(text.replace("GPU0\t X \tNV18", "GPU0\t X \tNV12"))
    with pytest.raises(TopoParseError, match="row GPU0, column GPU1: unknown code 'NVX'"):
        parse_topo_matrix(text.replace("GPU0\t X \tNV18", "GPU0\t X \tNVX"))


def test_a_run_together_header_is_read_by_its_row_labels_and_its_affinity_columns() -> None:
    text = (TOPO_M / "run-together-header-hgx-a100.txt").read_text()
    parsed = parse_topo_capture(text)
    assert parsed.notes == () and parsed.topology.size == 8
    assert parse_topo_matrix(text.replace("CPU AffinityNUMA Affinity", "\tCPU Affinity\tNUMA Affinity")).size == 8


def test_a_run_together_header_whose_rows_do_not_square_is_still_refused() -> None:
    text = (TOPO_M / "run-together-header-hgx-a100.txt").read_text()
    without_nic_row = "\n".join(line for line in text.splitlines() if not line.startswith("mlx5_0"))
    with pytest.raises(TopoParseError, match="header: the labels run together and 'mlx5_0CPUAffinity"):
        parse_topo_matrix(without_nic_row)
    without_gpu_row = "\n".join(line for line in text.splitlines() if not line.startswith("GPU5"))
    with pytest.raises(TopoParseError, match="header: the labels run together and 'GPU5GPU6"):
        parse_topo_matrix(without_gpu_row)


def test_a_matrix_without_its_header_says_so() -> None:
    text = "\n".join((TOPO_M / "r535-dgx-h100.txt").read_text().splitlines()[4:])
    assert text.startswith("GPU0\t X ")
    with pytest.raises(TopoParseError, match="no header line: the first line starting with GPU0 is the GPU0 row"):
        parse_topo_matrix(text)


def test_a_repeated_header_label_is_named() -> None:
    text = _capture("gb200-nvl72-node.txt").replace("GPU2    GPU3    CPU", "GPU2    GPU2    CPU")
    with pytest.raises(TopoParseError, match="header: column label GPU2 appears twice"):
        parse_topo_matrix(text)


def test_bad_gpu_numa_id_is_named() -> None:
    text = (TOPO_M / "r580-h100-vm.txt").read_text().replace("\t\tN/A", "\t\tzero")
    with pytest.raises(TopoParseError, match="row GPU0, column GPU NUMA ID: 'zero' is not a NUMA node"):
        parse_topo_matrix(text)


def test_affinity_values_that_fit_two_ways_are_refused() -> None:
    text = (TOPO_M / "r580-h100-vm.txt").read_text().replace("0-15\t0\t\tN/A", "0-15\t0\t\t")
    with pytest.raises(TopoParseError, match="row GPU0: the values '0-15 0' fit the columns CPU Affinity \\| "
                                             "NUMA Affinity \\| GPU NUMA ID in more than one way"):
        parse_topo_matrix(text)
