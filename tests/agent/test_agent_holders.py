"""`gpu-topology-agent --holders`: the node's own view of which container holds which GPUs."""

from __future__ import annotations

from helpers.reporter_fakes import kubelet_fixture, socket_dir_fixture

from topology.agent import cli

__all__ = ["kubelet_fixture", "socket_dir_fixture"]


def test_holders_lists_each_container_with_its_gpus_and_ring(kubelet, capsys) -> None:
    kubelet.allocate("team", "train-0", ["GPU0", "GPU1"], container="main")
    kubelet.allocate("team", "train-0", ["GPU2"], container="side")
    kubelet.allocate("team", "other", [], container="idle")
    code = cli.main(["--holders", "--from-topo", "rtx-a6000-pairs", "--socket", str(kubelet.socket_path)])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["POD", "CONTAINER", "GPUS", "RING"]
    assert lines[1].split() == ["team/train-0", "main", "0,1", "56", "GPU0,GPU1"]  # an NVLink bridge pair
    assert lines[2].split() == ["team/train-0", "side", "2", "-", "GPU2"]
    assert lines[3].split() == ["(no", "container)", "3,4,5,6,7"]
    assert len(lines) == 4, "a container without GPUs is not listed"


def test_holders_without_a_kubelet_is_one_line_and_exit_1(socket_dir, capsys) -> None:
    code = cli.main(["--holders", "--from-topo", "dgx-h100", "--socket", str(socket_dir / "absent.sock")])
    assert code == 1
    assert capsys.readouterr().err.startswith("gpu-topology-agent: error: the pod-resources socket")
