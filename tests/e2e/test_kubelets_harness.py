"""Self-tests of the kubelet harness (kubelets.py) that run without the binaries, so CI checks what it can: the
skip names what is missing, the host sysctls a kubelet changes come back, and each kubelet's configuration keeps
it to itself on a shared host."""

from __future__ import annotations

from pathlib import Path

import yaml
from kube_e2e import HOW_TO_RUN, Pki
from kubelets import (
    KERNEL_TUNABLES,
    KubeletBinaries,
    KubeletNode,
    Tunables,
    find_kubelet_binaries,
    kubelet_skip_reason,
)

from topology.platforms import PLATFORMS


def _executables(directory: Path, names: tuple[str, ...]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        (directory / name).write_text("#!/bin/sh\nexit 0\n")
        (directory / name).chmod(0o755)
    return directory


def _environment(tmp_path: Path, kube: tuple[str, ...],
                 tools: tuple[str, ...] = ("unshare", "mount")) -> dict[str, str]:
    bins = _executables(tmp_path / "bins", ("etcd", "kube-apiserver", "kube-scheduler", *kube))
    return {"KUBE_BIN_DIR": str(bins), "PATH": str(_executables(tmp_path / "usr-bin", tools))}


def test_the_control_plane_is_named_first() -> None:
    assert find_kubelet_binaries({}, root=True) == (None, "KUBE_BIN_DIR is not set")


def test_the_kubelet_and_fakecri_are_named_when_missing(tmp_path: Path) -> None:
    env = _environment(tmp_path, ("kubelet",))
    _, problem = find_kubelet_binaries(env, root=True)
    assert problem == (f"KUBE_BIN_DIR={env['KUBE_BIN_DIR']} has no executable fakecri "
                       "(fakecri: a main over k8s.io/cri-client/pkg/fake)")
    reason = kubelet_skip_reason(problem)
    assert all(name in reason for name in ("kubelet", "fakecri", "root", HOW_TO_RUN))


def test_host_tools_and_root_are_needed(tmp_path: Path) -> None:
    env = _environment(tmp_path, ("kubelet", "fakecri"), tools=("mount",))
    assert find_kubelet_binaries(env, root=True)[1] == (
        "no unshare on PATH (util-linux), needed for each kubelet's mount namespace")
    env = _environment(tmp_path, ("kubelet", "fakecri"))
    assert "needs root" in (find_kubelet_binaries(env, root=False)[1] or "")
    bins = Path(env["KUBE_BIN_DIR"]).resolve()
    assert find_kubelet_binaries(env, root=True) == (KubeletBinaries(bins / "kubelet", bins / "fakecri"), None)


def test_the_sysctls_a_kubelet_sets_come_back(tmp_path: Path) -> None:
    before = {"vm/overcommit_memory": "0", "kernel/panic": "1", "kernel/panic_on_oops": "0"}
    for name, value in before.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(value + "\n")
    tunables = Tunables(tmp_path)
    assert tunables.saved == before and set(before) <= set(KERNEL_TUNABLES)
    kubelet = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}
    for name, value in kubelet.items():
        (tmp_path / name).write_text(value + "\n")
    assert tunables.restore() == {name: (kubelet[name], before[name]) for name in before}
    assert {name: (tmp_path / name).read_text().strip() for name in before} == before
    assert tunables.restore() == {}


def test_each_kubelet_is_configured_to_itself(tmp_path: Path) -> None:
    """Its own ports on loopback, its own runtime, no cgroups of its own, and it runs on a cgroup v1 host."""
    node = KubeletNode("a", PLATFORMS["dgx-h100"].topology(), tmp_path / "a",
                       KubeletBinaries(Path("kubelet"), Path("fakecri")), tmp_path / "admin.kubeconfig",
                       Pki(tmp_path / "pki"), Tunables(tmp_path / "sys"), tmp_path / "logs")
    node.base.mkdir()
    node.write_config()
    config = yaml.safe_load((node.base / "kubelet-config.yaml").read_text())
    assert config["containerRuntimeEndpoint"] == config["imageServiceEndpoint"] == f"unix://{node.runtime_socket}"
    assert config["address"] == config["healthzBindAddress"] == "127.0.0.1" and config["readOnlyPort"] == 0
    assert config["healthzPort"] == node.healthz_port != config["port"]
    assert config["failCgroupV1"] is False and config["cgroupsPerQOS"] is False
