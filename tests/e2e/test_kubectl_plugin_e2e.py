"""End to end: the real `kubectl` finds `kubectl-gputopo` on PATH and runs its three commands against the e2e
cluster (a real kube-apiserver, kube-scheduler and our extender; kube_e2e.py).

Runs when KUBE_BIN_DIR holds the suite's binaries and `kubectl`; otherwise one skip that says what is missing. The
pods it creates are deleted at the end, so the scheduling suite that shares the cluster finds it as it was.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from kube_e2e import Cluster, find_kube_binaries, gpu_pod, skip_reason, wait_until

from topology.cli import render

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)
KUBECTL = Path(os.environ["KUBE_BIN_DIR"]).expanduser() / "kubectl"
if not os.access(KUBECTL, os.X_OK):
    pytest.skip(skip_reason("KUBE_BIN_DIR has no executable kubectl (the plugin's tests run it)"),
                allow_module_level=True)

WAIT_SECONDS = 180.0  # a shared 2-core VM; the scheduler's backoff alone can reach 10 s
PINNED = "node-v100"  # the bound pod's node, so that node-h100-a stays whole for the waiting pod
PLUGIN_DIR = Path(sys.executable).parent.resolve()  # where the package installed kubectl-gputopo, as kubectl prints it


def kubectl(cluster: Cluster, *args: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{PLUGIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
    config = kubeconfig or cluster.workdir / "admin.kubeconfig"
    return subprocess.run([str(KUBECTL), *args, "--kubeconfig", str(config)], capture_output=True, text=True,
                          timeout=120, env=env, check=False)


def gputopo(cluster: Cluster, *args: str) -> Any:
    done = kubectl(cluster, "gputopo", *args, "-o", "json")
    assert done.returncode == 0, done.stderr
    return orjson.loads(done.stdout)


def _annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


@pytest.fixture(scope="module")
def pods(e2e_cluster: Cluster) -> Iterator[dict[str, dict[str, Any]]]:
    """A pod bound to PINNED and one that waits: no board has a ring of 1,000 GB/s."""
    cluster = e2e_cluster
    created = {"plugin-bound": gpu_pod("plugin-bound", 2, scheduler=cluster.scheduler_name,
                                       namespace=cluster.namespace, node=PINNED),
               "plugin-waiting": gpu_pod("plugin-waiting", 4, scheduler=cluster.scheduler_name,
                                         namespace=cluster.namespace,
                                         annotations={"gpu-topology.io/min-bandwidth": "1000"})}
    try:
        for pod in created.values():
            cluster.kube.create_pod(pod)

        def bound() -> dict[str, Any] | None:
            pod = cluster.kube.get_pod("plugin-bound", cluster.namespace)
            return pod if pod["spec"].get("nodeName") else None

        wait_until(bound, WAIT_SECONDS, "plugin-bound to be bound", watch=cluster.processes.values())
        wait_until(lambda: any(event.get("reason") == "FailedScheduling"
                               and (event.get("involvedObject") or {}).get("name") == "plugin-waiting"
                               for event in cluster.kube.list_events(cluster.namespace)),
                   WAIT_SECONDS, "a FailedScheduling event on plugin-waiting", watch=cluster.processes.values())
        yield {name: cluster.kube.get_pod(name, cluster.namespace) for name in created}
    finally:
        for name in created:
            try:
                cluster.kube.delete_pod(name, cluster.namespace)
            except Exception:  # noqa: BLE001 - it may never have been created
                pass


def test_kubectl_finds_the_plugin_on_path(e2e_cluster: Cluster) -> None:
    done = kubectl(e2e_cluster, "plugin", "list")
    assert str(PLUGIN_DIR / "kubectl-gputopo") in done.stdout, done.stdout + done.stderr


def test_nodes_lists_every_gpu_node_with_the_extenders_free_count(e2e_cluster: Cluster, pods) -> None:
    document = gputopo(e2e_cluster, "nodes")
    items = {item["name"]: item for item in document["items"]}
    assert set(items) == set(e2e_cluster.topologies)
    held = {name: 0 for name in e2e_cluster.topologies}
    for pod in e2e_cluster.kube.list_pods():
        node = pod["spec"].get("nodeName")
        if node in held and pod["status"].get("phase") not in ("Succeeded", "Failed"):
            held[node] += len(_annotations(pod).get("gpu-topology.io/gpus", "").split(","))
    for name, item in items.items():
        assert (item["gpus"], item["free"], item["state"]) == (8, 8 - held[name], "ok"), item
    assert items["node-h100-a"]["rings"] == {"2": 450.0, "4": 450.0, "8": 450.0}


def test_node_prints_the_matrix_and_the_pods_holding_gpus(e2e_cluster: Cluster, pods) -> None:
    done = kubectl(e2e_cluster, "gputopo", "node", PINNED)
    assert done.returncode == 0, done.stderr
    topology = e2e_cluster.topologies[PINNED]
    assert done.stdout.startswith(render(f"node {PINNED}", topology))
    index = e2e_cluster.uuid_index(PINNED)
    bound = {index[gpu] for gpu in _annotations(pods["plugin-bound"])["gpu-topology.io/gpus"].split(",")}
    holders = {held["gpu"]: held["holder"] for held in gputopo(e2e_cluster, "node", PINNED)["holders"]}
    assert {gpu for gpu, holder in holders.items()
            if (holder or "").startswith(f"{e2e_cluster.namespace}/plugin-bound")} == bound, holders


def test_pod_shows_the_bound_gpus_and_their_ring(e2e_cluster: Cluster, pods) -> None:
    pod = pods["plugin-bound"]
    report = gputopo(e2e_cluster, "pod", "plugin-bound", "-n", e2e_cluster.namespace)
    placement = report["placement"]
    annotations = _annotations(pod)
    assert placement["node"] == pod["spec"]["nodeName"] == PINNED
    assert sorted(placement["gpuIds"]) == sorted(annotations["gpu-topology.io/gpus"].split(","))
    assert placement["ringGbps"] == pytest.approx(float(annotations["gpu-topology.io/ring-bandwidth"]))
    # The harness's reporter counts GPUs used but names no pods (no kubelet): delivery is not reported.
    assert placement["delivery"] == "not-reported" and placement["sealed"]


def test_a_waiting_pod_shows_the_extenders_reason_and_the_closest_nodes(e2e_cluster: Cluster, pods) -> None:
    done = kubectl(e2e_cluster, "gputopo", "pod", "plugin-waiting", "-n", e2e_cluster.namespace)
    assert done.returncode == 0, done.stderr
    why = next(line for line in done.stdout.splitlines() if line.startswith("Why it waits: "))
    assert "ring bandwidth below 1000 GB/s" in why, done.stdout
    report = gputopo(e2e_cluster, "pod", "plugin-waiting", "-n", e2e_cluster.namespace)
    best = report["closest"][0]
    assert (best["node"], best["ringGbps"], best["fits"]) == ("node-h100-a", 450.0, False)
    assert "the pod needs at least 1000.0 GB/s" in best["why"]


def test_errors_are_one_line_and_exit_1_through_kubectl(e2e_cluster: Cluster, tmp_path: Path) -> None:
    missing = kubectl(e2e_cluster, "gputopo", "pod", "no-such-pod", "-n", e2e_cluster.namespace)
    assert (missing.returncode, missing.stdout) == (1, "")
    assert missing.stderr == f"error: pod {e2e_cluster.namespace}/no-such-pod not found\n"
    closed = tmp_path / "closed.kubeconfig"
    closed.write_text(re.sub(r"https://127\.0\.0\.1:\d+", "https://127.0.0.1:1",
                             (e2e_cluster.workdir / "admin.kubeconfig").read_text()))
    unreachable = kubectl(e2e_cluster, "gputopo", "nodes", kubeconfig=closed)
    assert unreachable.returncode == 1 and unreachable.stderr.count("\n") == 1, unreachable.stderr
    assert unreachable.stderr.startswith("error: the API server at https://127.0.0.1:1 cannot be reached: ")
