"""Annotations and `topo -m` text are bounded to real hardware (topology/bounds.py): each refusal names the field.

Issue 9, "Why" 3 and 5: implausible NVLink counts, duplicate or comma-holding UUIDs, `true` and `1.0` as
versions, NVLink to a NIC, a CPU range that would fill memory, and a GPU row the header lacks were accepted.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topology.cli import main as gputopo
from topology.codec import MAX_GPUS, CodecError, decode_state, decode_topology, encode_topology
from topology.nvidia_smi import TopoParseError, parse_topo_matrix
from topology.platforms import PLATFORMS

from helpers.paths import CAPTURES

STATE = {"v": 2, "used": [], "unhealthy": [], "pods": {}, "observed": "2026-11-21T19:00:00Z", "generation": 1}


def _document(name: str = "dgx1-v100") -> dict:
    topology = PLATFORMS[name].topology()
    document = orjson.loads(encode_topology(topology))
    for at, gpu in enumerate(document["gpus"]):
        gpu["uuid"] = f"GPU-{at:08x}-1c2d-3e4f-5a6b-7c8d9e0f1a2b"
    return document


def _refit(document: dict) -> bytes:
    """The document with the fingerprint its content has, so that only the bound under test can refuse it."""
    probe = dict(document, fp="0")
    try:
        decode_topology(orjson.dumps(probe))
    except CodecError as error:
        text = str(error)
        if "does not match the content" not in text:
            raise
        document = dict(document, fp=text.split("content (")[1].split(")")[0])
    return orjson.dumps(document)


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d["nvlink"].__setitem__(2, [0, 3, 10 ** 15]), r"NVLink pair \(0, 3\) has 1000000000000000 links"),
    (lambda d: d["nvlink"].__setitem__(2, [0, 3, 7]), r"NVLink pair \(0, 3\) has 7 links; these GPUs have 1 to 6"),
    (lambda d: d["gpus"][1].update(uuid=d["gpus"][0]["uuid"]), "belongs to two GPUs"),
    (lambda d: d["gpus"][1].update(uuid="GPU-a,GPU-b"), "GPU1 uuid 'GPU-a,GPU-b': expected"),
    (lambda d: d["gpus"][1].update(uuid="GPU a"), "without spaces"),
    (lambda d: d["gpus"][1].update(uuid="G" * 65), "1 to 64 printable"),
    (lambda d: d.update(v=True), "version True is not supported"),
    (lambda d: d.update(v=1.0), "version 1.0 is not supported"),
    (lambda d: d["gpus"][2].update(pcie=[4, -16]), "GPU2 PCIe width x-16"),
    (lambda d: d["gpus"][2].update(pcie=[4, 0]), "GPU2 PCIe width x0"),
    (lambda d: d["gpus"][2].update(pcie=[4, 12]), "GPU2 PCIe width x12"),
    (lambda d: d["gpus"][2].update(pcie=[4, 1 << 40]), "PCIe width"),
    (lambda d: d["gpus"][2].update(pcie=[7, 16]), "GPU2 PCIe generation 7: expected 1 to 6"),
    (lambda d: d["gpus"][2].update(pcie=[0, 16]), "PCIe generation 0"),
    (lambda d: d["gpus"][3].update(numa=1024), "GPU3 NUMA node 1024"),
    (lambda d: d["gpus"][3].update(numa=-1), "GPU3 NUMA node -1"),
    (lambda d: d["gpus"][3].update(mem=0), "GPU3 memory 0 MiB"),
    (lambda d: d["gpus"][3].update(mem=1 << 40), "GPU3 memory"),
    (lambda d: d["gpus"][3].update(model="V100\n"), "GPU3 model"),
    (lambda d: d["gpus"][3].update(model="x" * 97), "GPU3 model"),
    (lambda d: d["gpus"][3].update(bus="0000:07:00.0; rm"), "GPU3 bus id"),
])
def test_out_of_bounds_topologies_are_refused_naming_the_field(mutate, message: str) -> None:
    document = _document()
    mutate(document)
    with pytest.raises(CodecError, match=message):
        decode_topology(_refit(document))


def test_nvlink_over_the_per_gpu_budget_needs_an_nvswitch() -> None:
    """A V100 has 6 NVLinks: without a switch, NV2 to four peers is 8 links it does not have."""
    document = _document()
    document["nvlink"] = [pair for pair in document["nvlink"] if pair[0] != 0]
    document["nvlink"] += [[0, j, 2] for j in (1, 2, 3, 4)]
    with pytest.raises(CodecError, match="GPU0 has 8 NVLinks to its peers, more than the 6 it has"):
        decode_topology(_refit(document))
    document["nvswitch"] = True
    assert decode_topology(_refit(document)).nvlink_count(0, 4) == 2


def test_the_bounds_admit_every_real_platform() -> None:
    for name in PLATFORMS:
        assert decode_topology(_refit(_document(name))).size == PLATFORMS[name].topology().size


@pytest.mark.parametrize(("change", "message"), [
    ({"v": True}, "version True is not supported"),
    ({"v": 1.0}, "version 1.0 is not supported"),
    ({"v": 2.0}, "version 2.0 is not supported"),
    ({"used": ["GPU-a", "GPU-a"]}, "state.used: lists a GPU twice"),
    ({"used": ["GPU-a,GPU-b"]}, "is not a GPU id"),
    ({"unhealthy": [f"GPU-{i}" for i in range(MAX_GPUS + 1)]}, "65 entries is more than any node has"),
    ({"generation": 1 << 63}, "state.generation: expected 0 to"),
])
def test_out_of_bounds_states_are_refused(change: dict, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode_state(orjson.dumps(dict(STATE, **change)))


def _capture(name: str, old: str, new: str) -> str:
    text = (CAPTURES / name).read_text()
    assert old in text
    return text.replace(old, new)


def test_topo_m_nvlink_count_beyond_any_gpu_is_refused() -> None:
    text = _capture("rtx-a6000-8gpu-nvlink-bridge-pairs.txt", "GPU0     X      NV4", "GPU0     X      NV999999")
    text = text.replace("GPU1    NV4      X", "GPU1    NV999999 X")
    with pytest.raises(TopoParseError, match=r"NVLink pair \(0, 1\) has 999999 links; these GPUs have 1 to 4"):
        parse_topo_matrix(text, "NVIDIA RTX A6000")


def test_gputopo_refuses_nv999999_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = _capture("rtx-a6000-8gpu-nvlink-bridge-pairs.txt", "GPU0     X      NV4", "GPU0     X      NV999999")
    path = tmp_path / "hostile.txt"
    path.write_text(text.replace("GPU1    NV4      X", "GPU1    NV999999 X"))
    for argv in (["parse", str(path)], ["select", "--topology", str(path), "--count", "2"]):
        assert gputopo(argv) == 2
        assert "has 999999 links; these GPUs have 1 to 18" in capsys.readouterr().err


def test_topo_m_nvlink_to_a_nic_is_refused() -> None:
    text = _capture("rtx-a6000-8gpu-nvlink-bridge-pairs.txt",
                    "GPU6    SYS     SYS     SYS     SYS     NODE    NODE     X      NV4     PHB",
                    "GPU6    SYS     SYS     SYS     SYS     NODE    NODE     X      NV4     NV2")
    text = text.replace("NIC0    SYS     SYS     SYS     SYS     NODE    NODE    PHB",
                        "NIC0    SYS     SYS     SYS     SYS     NODE    NODE    NV2")
    with pytest.raises(TopoParseError, match="row GPU6, column NIC0: NV2 between a GPU and a NIC"):
        parse_topo_matrix(text)


def test_topo_m_cpu_affinity_beyond_linux_is_refused_before_it_is_expanded() -> None:
    text = _capture("gb200-nvl72-node.txt", "72-143  1", "0-20000000  1")
    with pytest.raises(TopoParseError, match="CPU 20000000 is beyond Linux's 8192 CPUs"):
        parse_topo_matrix(text)


def test_topo_m_numa_affinity_beyond_linux_is_refused() -> None:
    text = _capture("gb200-nvl72-node.txt", "72-143  1 ", "72-143  4096 ")
    with pytest.raises(TopoParseError, match="'4096' is not a NUMA node"):
        parse_topo_matrix(text)


def test_topo_m_gpu_row_missing_from_the_header_is_refused() -> None:
    text = _capture("gb200-nvl72-node.txt", "GPU3    NV18    NV18    NV18     X      72-143  1               N/A",
                    "GPU3    NV18    NV18    NV18     X      72-143  1               N/A\n"
                    "GPU4    NV18    NV18    NV18    NV18    72-143  1               N/A")
    with pytest.raises(TopoParseError, match="row GPU4: the header has no column GPU4"):
        parse_topo_matrix(text)


def test_topo_m_more_gpus_than_any_node_is_refused() -> None:
    n = MAX_GPUS + 1
    header = " ".join(f"GPU{i}" for i in range(n))
    rows = [f"GPU{i} " + " ".join("X" if i == j else "SYS" for j in range(n)) for i in range(n)]
    with pytest.raises(TopoParseError, match="65 GPU and 0 other columns; a node has at most 64 GPUs"):
        parse_topo_matrix("\n".join([header, *rows]))


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
                     | st.text(max_size=8), lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None, database=None)
@given(path=st.lists(st.integers(0, 40), min_size=1, max_size=4), value=_JSON)
def test_any_edit_of_a_topology_is_decoded_or_refused_with_a_codec_error(path: list[int], value: object) -> None:
    """Replace one value anywhere in a real annotation: decoding gives a topology or a CodecError, nothing else."""
    document = _document("hgx-h100-4gpu")
    node: object = document
    for step in path[:-1]:
        children = list(node.values()) if isinstance(node, dict) else node if isinstance(node, list) else []
        if not children or not isinstance(children[step % len(children)], dict | list):
            break
        node = children[step % len(children)]
    if isinstance(node, dict):
        node[sorted(node)[path[-1] % len(node)]] = value
    elif isinstance(node, list) and node:
        node[path[-1] % len(node)] = value
    try:
        decode_topology(orjson.dumps(document))
    except CodecError:
        pass
