"""`gpu-topology-agent` end to end: the fake NVML driven by every shared capture, `--from-topo` against
`gputopo parse`, the partial capture, exit codes, the API server through a kubeconfig, and SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from helpers.fake_nvml import gpu_uuid, make_fake_nvml, write_sysfs
from helpers.kube_api_server import kube_server_fixture, make_node, wait_until
from helpers.reporter_fakes import (
    PARTIAL_CAPTURE,
    SHARED,
    add_health,
    kubelet_fixture,
    shared_captures,
    socket_dir_fixture,
)

from topology import cli as gputopo
from topology.agent import cli
from topology.annotations import AnnotationKeys
from topology.codec import decode_state, decode_topology
from topology.discover import discover
from topology.nvidia_smi import parse_topo_matrix

__all__ = ["kube_server_fixture", "kubelet_fixture", "socket_dir_fixture"]  # fixtures

KEYS = AnnotationKeys()
CAPTURES = shared_captures()
NODE = "gpu-node-1"



def lines(text: str) -> list[dict]:
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def reporter_command() -> list[str]:
    """The installed console script where there is one, else the module."""
    script = Path(sys.executable).with_name("gpu-topology-agent")
    return [str(script)] if script.exists() else [sys.executable, "-m", "topology.agent.cli"]


# -- NVML discovery, driven by every capture --------------------------------------------------------------


@pytest.mark.parametrize(("name", "path", "platform"), CAPTURES, ids=[c[0] for c in CAPTURES])
def test_the_fake_nvml_of_every_capture_gives_annotations_that_decode_back(name, path, platform, kubelet,
                                                                          tmp_path, capsys):
    captured = parse_topo_matrix(path.read_text(), platform.gpu_model if platform else None,
                                 platform.memory_mib if platform else None)
    fake = make_fake_nvml(captured, name)
    add_health(fake, captured, name)
    sysfs = write_sysfs(captured, tmp_path / "sys")
    uuids = [gpu_uuid(name, index) for index in range(captured.size)]
    kubelet.allocate("ns", "a", uuids[:2])
    kubelet.allocate("ns", "b", ["0::1"] if captured.size > 2 else [])  # an index id, a shared replica
    code = cli.main(["--once", "--dry-run", "--socket", str(kubelet.socket_path)], nvml=fake, sysfs=sysfs)
    assert code == 0
    (written,) = lines(capsys.readouterr().out)
    assert set(written) == {KEYS.topology, KEYS.state}
    topology = decode_topology(written[KEYS.topology])
    assert topology == discover(fake, sysfs)
    assert [gpu.uuid for gpu in topology.gpus] == uuids
    assert topology.nvlinks == captured.nvlinks and topology.nvswitch == captured.nvswitch
    for i, j in captured.pairs():
        if not captured.nvlink_count(i, j):
            assert topology.pcie[i][j] == captured.pcie[i][j]
    assert topology.fingerprint == captured.fingerprint
    state = decode_state(written[KEYS.state])
    assert state.used == set(uuids[:2]) and state.unhealthy == frozenset() and state.generation == 1
    assert fake.calls.inits == fake.calls.shutdowns  # discovery and health both shut NVML down


def test_nvml_missing_is_a_clear_error_and_exit_1(tmp_path, capsys):
    name = CAPTURES[0][0]
    fake = make_fake_nvml(parse_topo_matrix(CAPTURES[0][1].read_text()), name, library_missing=True)
    assert cli.main(["--once", "--dry-run"], nvml=fake, sysfs=tmp_path) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpu-topology-agent: error: NVML is not available:")
    assert not any("Traceback" in line for line in err)


# -- --from-topo against gputopo parse ----------------------------------------------------------------------


@pytest.mark.parametrize(("name", "path", "platform"), CAPTURES, ids=[c[0] for c in CAPTURES])
def test_from_topo_prints_what_gputopo_parse_prints(name, path, platform, socket_dir, capsys):
    """The acceptance: `gpu-topology-agent --once --dry-run --from-topo F` for every shared capture."""
    result = subprocess.run([*reporter_command(), "--once", "--dry-run", "--from-topo", str(path),
                             "--socket", str(socket_dir / "absent.sock")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    (written,) = lines(result.stdout)
    assert gputopo.main(["parse", str(path)]) == 0
    parsed = capsys.readouterr().out.strip()
    assert written == {KEYS.topology: parsed}  # pod-resources is absent here: the state is unknown, not written
    topology = decode_topology(written[KEYS.topology])
    assert topology == decode_topology(parsed)
    assert "GPU state unknown: the pod-resources socket" in result.stderr


NAMED = [capture for capture in CAPTURES if capture[2]]  # captures whose GPU model a bundled platform names


@pytest.mark.parametrize(("name", "path", "platform"), NAMED, ids=[c[0] for c in NAMED])
def test_from_topo_with_a_gpu_model_matches_gputopo_parse(name, path, platform, kubelet, capsys):
    kubelet.allocate("ns", "a", ["1", "GPU0"])  # index ids: the capture has no UUIDs
    argv = ["--once", "--dry-run", "--from-topo", str(path), "--gpu-model", platform.gpu_model,
            "--socket", str(kubelet.socket_path)]
    assert cli.main(argv) == 0
    (written,) = lines(capsys.readouterr().out)
    assert gputopo.main(["parse", str(path), "--gpu-model", platform.gpu_model]) == 0
    assert written[KEYS.topology] == capsys.readouterr().out.strip()
    assert decode_state(written[KEYS.state]).used == {"GPU0", "GPU1"}  # the extender's ids for UUID-less GPUs


@pytest.mark.skipif(not (SHARED / PARTIAL_CAPTURE).exists(), reason="../shared/topologies is not beside this checkout")
def test_the_partial_dgx2_capture_is_one_line_and_exit_2(socket_dir):
    result = subprocess.run([*reporter_command(), "--once", "--dry-run", "--from-topo", str(SHARED / PARTIAL_CAPTURE),
                             "--socket", str(socket_dir / "absent.sock")],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"gpu-topology-agent: error: {SHARED / PARTIAL_CAPTURE}: row GPU4:")


@pytest.mark.parametrize(("argv", "message"), [
    (["--once"], "no node name: set NODE_NAME"),
    (["--once", "--dry-run", "--gpu-model", "NVIDIA H100"], "--gpu-model only applies with --from-topo"),
    (["--once", "--dry-run", "--from-topo", "/nonexistent/capture.txt"], "no such file"),
    (["--once", "--dry-run", "--from-topo", "dgx1-v100", "--annotation-prefix", "Not A Prefix"], "not a DNS subdomain"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("NODE_NAME", raising=False)
    assert cli.main(argv) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("gpu-topology-agent: error:") and message in line


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_intervals_must_be_positive_seconds(value, capsys):
    with pytest.raises(SystemExit) as caught:
        cli.main(["--dry-run", "--interval", value])
    assert caught.value.code == 2


# -- the API server, through a kubeconfig -----------------------------------------------------------------


def test_once_patches_the_node_named_by_node_name(kube_server, kubelet, tmp_path, monkeypatch):
    kube_server.add_node(make_node(NODE))
    kubelet.allocate("ns", "a", ["2"])
    monkeypatch.setenv("NODE_NAME", NODE)
    config = kube_server.write_kubeconfig(tmp_path / "kubeconfig")
    argv = ["--once", "--kubeconfig", str(config), "--from-topo", "rtx-a6000-pairs", "--socket",
            str(kubelet.socket_path)]
    assert cli.main(argv) == 0
    annotations = kube_server.node(NODE)["metadata"]["annotations"]
    assert decode_state(annotations[KEYS.state]).used == {"GPU2"}
    assert decode_topology(annotations[KEYS.topology]).size == 8
    assert kube_server.requests[-1].headers["authorization"] == "Bearer test-token"


def test_once_fails_with_exit_1_when_the_patch_fails(kube_server, kubelet, tmp_path, capsys):
    kube_server.add_node(make_node(NODE))
    kube_server.fail("PATCH", f"/api/v1/nodes/{NODE}", status=503)
    config = kube_server.write_kubeconfig(tmp_path / "kubeconfig")
    argv = ["--once", "--node-name", NODE, "--kubeconfig", str(config), "--from-topo", "dgx1-v100",
            "--socket", str(kubelet.socket_path)]
    assert cli.main(argv) == 1
    assert "patch node gpu-node-1: 503" in capsys.readouterr().err


# -- SIGTERM ----------------------------------------------------------------------------------------------


def start(argv: list[str], env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([*reporter_command(), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


def stop_with_sigterm(process: subprocess.Popen) -> tuple[int, str, float]:
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        _, err = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, err, time.monotonic() - sent


def test_sigterm_ends_a_dry_run_cleanly(socket_dir):
    process = start(["--dry-run", "--from-topo", "dgx-h100", "--interval", "0.2",
                     "--socket", str(socket_dir / "absent")])
    first = process.stdout.readline()  # the topology, then it waits
    assert KEYS.topology in orjson.loads(first)
    code, err, took = stop_with_sigterm(process)
    assert code == 0 and took < 3.0, err
    assert "SIGTERM: stopping" in err and "Traceback" not in err


def test_the_daemon_follows_pod_resources_and_ends_on_sigterm(kube_server, kubelet, tmp_path):
    """The real process, as the DaemonSet runs it: NODE_NAME from the environment, a kubeconfig, the socket."""
    kube_server.add_node(make_node(NODE))
    config = kube_server.write_kubeconfig(tmp_path / "kubeconfig")
    process = start(["--kubeconfig", str(config), "--from-topo", "hgx-h100-4gpu", "--socket", str(kubelet.socket_path),
                     "--interval", "0.2", "--heartbeat", "60"],
                    env={"NODE_NAME": NODE})
    try:
        def state():
            raw = kube_server.node(NODE)["metadata"]["annotations"].get(KEYS.state)
            return decode_state(raw) if raw else None

        wait_until(lambda: state() is not None, what="the first state")
        kubelet.allocate("ns", "a", ["0", "3"])
        wait_until(lambda: state().used == {"GPU0", "GPU3"}, what="the allocation")
        kubelet.free("ns", "a")
        wait_until(lambda: state().used == frozenset(), what="the free")
        assert state().generation == 3
    finally:
        code, err, took = stop_with_sigterm(process)
    assert code == 0 and took < 5.0, err


def test_the_console_script_is_installed() -> None:
    """`pip install` (make test's) puts gpu-topology-agent beside the interpreter, as the image's DaemonSets run it."""
    script = Path(sys.executable).with_name("gpu-topology-agent")
    assert script.exists(), f"{script} is missing: pyproject.toml's [project.scripts] is not installed"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0
    for flag in ("--node-name", "--kubeconfig", "--in-cluster", "--socket", "--interval", "--heartbeat", "--from-topo",
                 "--gpu-model", "--dry-run", "--once", "--annotation-prefix", "--gpu-resource", "--log-level"):
        assert flag in result.stdout


def test_nvml_failing_while_running_is_a_clear_error_and_exit_1(kubelet, tmp_path, capsys):
    name, path, platform = CAPTURES[0]
    captured = parse_topo_matrix(path.read_text(), platform.gpu_model if platform else None)
    fake = make_fake_nvml(captured, name)
    add_health(fake, captured, name).driver_gone = True  # discovery works, the first health check does not
    code = cli.main(["--dry-run", "--socket", str(kubelet.socket_path)], nvml=fake,
                    sysfs=write_sysfs(captured, tmp_path / "sys"))
    assert code == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        "gpu-topology-agent: error: NVML query failed: Driver Not Loaded"
    assert fake.calls.inits == fake.calls.shutdowns


def test_a_topology_over_its_budget_is_refused():
    from topology.codec import TOPOLOGY_MAX_BYTES, CodecError
    from topology.levels import Level
    from topology.model import Gpu, Topology
    from topology.agent.reporter import PrintingNode, Reporter
    n = 64
    gpus = tuple(Gpu(i, "M" * 96, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000") for i in range(n))
    pcie = tuple(tuple(None if i == j else Level.SYS for j in range(n)) for i in range(n))
    big = Topology(gpus, (), False, pcie)
    with pytest.raises(CodecError, match=f"over its {TOPOLOGY_MAX_BYTES}-byte budget"):
        Reporter(big, PrintingNode(), None)
