"""`gputopo` as a person uses it: DESIGN §8 output shapes, and one clear line with exit 2 on bad input."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import orjson
import pytest

from topology.cli import main
from topology.codec import decode_topology, encode_topology
from topology.fabric import Domain
from topology.platforms import PLATFORMS

from helpers.paths import CAPTURES, FIXTURES



def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_parse_prints_the_annotation_schema(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "parse", str(CAPTURES / "dgx-a100.txt"), "--gpu-model", "NVIDIA A100-SXM4-40GB")
    assert code == 0
    topology = decode_topology(out)
    assert topology.size == 8 and topology.nvswitch and topology.nvlink_count(2, 5) == 12


def test_select_json_is_exactly_the_contract(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "select", "--topology", "dgx1-v100", "--free", "0,1,4,5", "--count", "2", "--json")
    assert code == 0 and err == ""
    # NV2 pairs 0-4 and 1-5 both cross the sockets and tie on every key; the lower indices win.
    assert orjson.loads(out) == {"gpus": [0, 4], "ring_bandwidth": 50.0, "total_bandwidth": 50.0, "numa_nodes": 2}


def test_select_accepts_topology_json_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, json_text, _ = _run(capsys, "parse", "rtx-a6000-pairs")
    path = tmp_path / "node.json"
    path.write_text(json_text)
    code, out, _ = _run(capsys, "select", "--topology", str(path), "--count", "2", "--interconnect", "nvlink",
                        "--json")
    assert code == 0 and orjson.loads(out)["gpus"] == [0, 1]


def test_no_fit_is_a_json_error_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "select", "--topology", "dgx1-v100", "--free", "0,1,4,6", "--count", "4",
                          "--interconnect", "nvlink", "--json")
    assert code == 2 and err == ""
    assert orjson.loads(out) == {"error": "best ring with 4 free GPUs is 4.7 GB/s over SYS; "
                                          "nvlink needs 4 GPUs on an NVLink ring, 2 free"}


def _asymmetric(tmp_path: Path) -> Path:
    path = tmp_path / "asymmetric.txt"
    path.write_text((CAPTURES / "dgx1-v100.txt").read_text().replace("GPU3    NV2     NV1", "GPU3    NV1     NV1"))
    return path


def _partial(tmp_path: Path) -> Path:
    return FIXTURES / "dgx2-v100-partial.txt"


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "garbage.bin"
    path.write_bytes(bytes(range(256)))
    return path


def _missing(tmp_path: Path) -> Path:
    return tmp_path / "nowhere.txt"


def _bad_json(tmp_path: Path) -> Path:
    path = tmp_path / "bad.json"
    path.write_text('{"v": 1, "gpus": "many"}')
    return path


@pytest.mark.parametrize("make", [_asymmetric, _partial, _garbage, _missing, _bad_json])
def test_bad_input_is_one_line_and_exit_2(make, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "select", "--topology", str(make(tmp_path)), "--count", "2")
    assert code == 2 and out == ""
    assert err.startswith("gputopo: error: ") and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["--free", "0,x", "--count", "2"],
    ["--free", "0,9", "--count", "2"],
    ["--count", "0"],
    ["--count", "2", "--interconnect", "infiniband"],
    ["--count", "2", "--min-bandwidth", "nan"],
])
def test_bad_requests_are_one_line_and_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "select", "--topology", "dgx1-v100", *argv)
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_show_prints_matrix_bandwidths_and_best_sets(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "show", "rtx-a6000-pairs")
    assert code == 0
    lines = out.splitlines()
    assert any(line.split() == ["GPU0", "X", "NV4", "NODE", "NODE", "SYS", "SYS", "SYS", "SYS", "0"] for line in lines)
    assert any(line.split()[:3] == ["GPU0", "-", "56.0"] for line in lines)
    assert "NVLink islands: {0,1}  {2,3}  {4,5}  {6,7}" in out
    best = {line.split()[0]: line.split()[1] for line in lines if line.startswith("   ") and line.split()[0].isdigit()}
    assert best["2"] == "0,1" and best["4"] == "0,1,2,3" and len(best) == PLATFORMS["rtx-a6000-pairs"].topology().size


@pytest.mark.parametrize(("domain", "line"), [
    (Domain("9c6f5af3-53bf-49b5-a436-b66766c413c3.4026"),
     "  NVLink domain 9c6f5af3-53bf-49b5-a436-b66766c413c3.4026"),
    (Domain(None, "GPU 2 fabric registration in progress"),
     "  no NVLink domain: GPU 2 fabric registration in progress"),
])
def test_show_names_the_domain_an_agent_read(domain: Domain, line: str, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "gb200.json"
    path.write_text(encode_topology(replace(PLATFORMS["gb200-node"].topology(), domain=domain)))
    code, out, _ = _run(capsys, "show", str(path))
    assert code == 0 and out.splitlines()[2] == line
    _, capture, _ = _run(capsys, "show", "gb200-node")
    assert "NVLink domain" not in capture  # topo -m cannot say where a node sits


def test_demo_shows_the_fragmentation_difference(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "demo")
    assert code == 0
    assert "least-cut   b=2; c=3; d=0,1 NVLink 56.0 GB/s" in out
    assert "first-free  b=2; c=0; d=1,3 NODE 15.8 GB/s" in out


def test_discover_without_a_gpu_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(capsys, "discover")
    assert code == 2 and out == ""
    assert err.startswith("gputopo: error: NVML is not available") and err.count("\n") == 1


TOPO_M = FIXTURES / "topo_m"


def test_parse_dash_reads_the_r580_capture_from_stdin(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((TOPO_M / "r580-h100-vm.txt").read_text()))
    code, out, err = _run(capsys, "parse", "-", "--gpu-model", "NVIDIA H100 80GB HBM3")
    assert code == 0 and err == ""
    topology = decode_topology(out)
    assert topology.size == 1 and topology.gpus[0].numa_node == 0


def test_show_dash_reads_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((TOPO_M / "r580-dgx-h100.txt").read_text()))
    code, out, err = _run(capsys, "show", "-")
    assert code == 0 and err == ""
    assert out.startswith("<stdin>\n")
    assert any(line.split() == ["GPU0", "X", *["NV18"] * 7, "0"] for line in out.splitlines())


def test_bad_stdin_is_one_line_naming_stdin(monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("GPU0\t X \tNV18\n"))
    code, out, err = _run(capsys, "show", "-")
    assert code == 2 and out == ""
    assert err == ("gputopo: error: <stdin>: no header line: the first line starting with GPU0 is the GPU0 row "
                   "(GPU0 X ...), so the line of column labels above it is missing or unreadable\n")


@pytest.mark.parametrize("command", ["parse", "show"])
def test_missing_nic_rows_are_a_note_line(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = TOPO_M / "no-nic-rows-dgx-a100.txt"
    code, out, err = _run(capsys, command, str(path))
    assert code == 0 and out
    assert err == (f"gputopo: note: {path}: no row for NIC0, NIC1, NIC2, NIC3 and 6 more of the 10 NIC columns; "
                   "every GPU row is there, so the GPU links are complete\n")
