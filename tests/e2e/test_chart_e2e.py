"""End to end: Helm (helm-python-sdk, Helm v4's Go SDK) installs the chart into a real kube-apiserver (v1.36), a real
kube-scheduler runs the configuration the chart rendered and places a GPU pod through our extender, which runs with
the chart's own certificates, seal key and ServiceAccount (its RBAC and admission policies enforcing); then an upgrade
with the same values keeps the certificates and the seal key, and an uninstall leaves nothing of ours.

No kubelet runs, and of kube-controller-manager only the policies' status and the namespace controllers, so the
chart's Deployments and DaemonSets make no Pods:
the extender runs here as a process, with the Deployment's own flags but for where it listens and what it reads
from files (the Secrets' content). Runs only with KUBE_BIN_DIR (kube_e2e.skip_reason).

    cd tests && KUBE_BIN_DIR=/work/kube-bin ../.venv/bin/python -m pytest -q e2e/test_chart_e2e.py
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from helpers.chart_render import RELEASE, chart, containers, find, parse, pod_spec
from helm_python import _native
from kube_e2e import (
    NODES,
    ROOT,
    FakeReporter,
    Kube,
    Process,
    create_gpu_nodes,
    derive_scheduler_config,
    find_kube_binaries,
    free_ports,
    gpu_pod,
    make_pki,
    node_topologies,
    scheduler_name,
    skip_reason,
    start_apiserver,
    start_controller_manager,
    start_etcd,
    start_scheduler,
    wait_for_https,
    wait_until,
    write_kubeconfig,
)

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

NAMESPACE = "gpu-topology-system"
PODS = "gpu-chart-e2e"
# The CRDs of the other monitoring objects are not installed here.
VALUES: dict[str, Any] = {"monitoring": {"grafanaDashboard": True}, "scheduler": {"sendGpuPods": True}}
SECRETS = ("gpu-topology-ca", "gpu-topology-extender-tls", "gpu-topology-scheduler-client-tls", "gpu-topology-seal")
BIND_SECONDS = 180.0


def helm(action: str, config: helm_python.Config, values: dict[str, Any]) -> dict[str, Any]:
    """helm install or upgrade, as Config.install/upgrade do, with Helm's client-side OpenAPI validation off: it
    downloads the server's OpenAPI v2 as protobuf, which this kube-apiserver answers 503 ("Error in OpenAPI
    handler"), while the server still validates every object it admits. helm_python exposes no such option, the
    library takes it (`disable_openapi_validation`, as `helm install --disable-openapi-validation`)."""
    payload = _native.call_string(f"helm_{action}", config._raw(), _native.HANDLE(0), chart()._raw(), None, RELEASE,
                                  json.dumps(values), json.dumps({"disable_openapi_validation": True,
                                                                  "timeout_seconds": 120}))
    return json.loads(payload)


def kubectl(cluster: ChartCluster, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run([str(cluster.kubectl), f"--kubeconfig={cluster.admin}", *args], input=stdin,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def secrets(kube: Kube) -> dict[str, dict[str, str]]:
    found = {}
    for name in SECRETS:
        raw = kube.core.read_namespaced_secret(name, NAMESPACE, _preload_content=False)
        found[name] = json.loads(raw.data)["data"]
    return found


@dataclass
class ChartCluster:
    workdir: Path
    kube: Kube
    admin: Path
    scheduler_kubeconfig: Path
    server: str
    ca: Path
    config: helm_python.Config
    kubectl: Path
    stack: ExitStack
    release: dict[str, Any]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartCluster]:
    assert _BINARIES is not None
    workdir = tmp_path_factory.mktemp("chart-e2e")
    with ExitStack() as stack:
        pki = make_pki(workdir / "pki")
        _, etcd_url = start_etcd(_BINARIES.etcd, workdir, stack)
        _, port = start_apiserver(_BINARIES.apiserver, workdir, etcd_url, pki, stack)
        server = f"https://127.0.0.1:{port}"
        admin = write_kubeconfig(workdir / "admin.kubeconfig", server, pki, "admin")
        # The policies' type checking, and the deletion of the agent's namespace at the uninstall.
        start_controller_manager(_BINARIES.controller_manager, workdir, admin, stack,
                                 ["validatingadmissionpolicy-status-controller", "namespace-controller"])
        kube = Kube(admin)
        stack.callback(kube.close)
        # The release's namespace, made as the chart's README says: before the install, with its Pod Security
        # level (a chart cannot own the namespace its release is stored in).
        kube.core.create_namespace({"metadata": {"name": NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted", "app.kubernetes.io/part-of": "gpu-topology"}}})
        config = helm_python.Config(kubeconfig_path=str(admin), namespace=NAMESPACE)
        stack.callback(config.close)
        kubectl_binary = Path(os.environ["KUBE_BIN_DIR"]) / "kubectl"
        if not kubectl_binary.exists():
            kubectl_binary = Path(shutil.which("kubectl") or "kubectl")
        release = helm("install", config, VALUES)
        yield ChartCluster(workdir, kube, admin, write_kubeconfig(workdir / "scheduler.kubeconfig", server, pki,
                                                                  "scheduler"),
                           server, pki.ca, config, kubectl_binary, stack, release)


def manifest_file(cluster: ChartCluster, release: dict[str, Any], name: str) -> Path:
    path = cluster.workdir / name
    path.write_text(release["manifest"])
    return path


def test_every_object_is_accepted(cluster) -> None:
    docs = [doc for doc in yaml.safe_load_all(cluster.release["manifest"]) if doc]
    listed = kubectl(cluster, "get", "-f", str(manifest_file(cluster, cluster.release, "installed.yaml")),
                     "-o", "name").split()
    assert len(listed) == len(docs) > 30
    assert "validatingadmissionpolicy.admissionregistration.k8s.io/gpu-topology-bind-annotations" in listed


def test_admission_policies_type_check_clean(cluster) -> None:
    def checked() -> list[dict[str, Any]]:
        policies = cluster.kube.objects.list_cluster_custom_object(
            "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies")["items"]
        ours = [p for p in policies if p["metadata"]["name"].startswith("gpu-topology-")]
        return ours if ours and all("typeChecking" in p.get("status", {}) for p in ours) else []
    wait_until(checked, 60, "the API server's type checking of our policies")
    warnings = {p["metadata"]["name"]: p["status"]["typeChecking"].get("expressionWarnings") for p in checked()}
    assert len(warnings) >= 3
    assert {name: found for name, found in warnings.items() if found} == {}


def tls_files(cluster: ChartCluster, secret: str) -> dict[str, Path]:
    data = secrets(cluster.kube)[secret]
    directory = cluster.workdir / secret
    directory.mkdir(exist_ok=True)
    paths = {}
    for name in ("tls.crt", "tls.key", "ca.crt"):
        paths[name] = directory / name
        paths[name].write_bytes(base64.b64decode(data[name]))
        paths[name].chmod(0o600)
    return paths


def service_account_kubeconfig(cluster: ChartCluster) -> Path:
    """A kubeconfig with a token of the chart's ServiceAccount gpu-topology-extender: the extender below has the
    chart's RBAC, and the chart's policies treat its Bindings as the extender's."""
    raw = cluster.kube.core.create_namespaced_service_account_token(
        "gpu-topology-extender", NAMESPACE, {"spec": {"expirationSeconds": 3600}}, _preload_content=False)
    token = json.loads(raw.data)["status"]["token"]
    path = cluster.workdir / "extender.kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "extender",
        "clusters": [{"name": "e2e", "cluster": {"server": cluster.server, "certificate-authority": str(cluster.ca)}}],
        "users": [{"name": "extender", "user": {"token": token}}],
        "contexts": [{"name": "extender", "context": {"cluster": "e2e", "user": "extender"}}]}))
    return path


LOCAL_FLAGS = ("--in-cluster", "--host", "--port", "--tls-cert", "--tls-key", "--client-ca", "--seal-key-file",
               "--leader-elect")


def test_a_gpu_pod_is_placed_through_the_extender_with_the_rendered_configuration(cluster) -> None:
    assert _BINARIES is not None
    docs = [doc for doc in yaml.safe_load_all(cluster.release["manifest"]) if doc]
    deployment = find(docs, "Deployment", "gpu-topology-extender")
    args = [arg for arg in pod_spec(deployment)["containers"][0]["args"][1:]
            if not arg.startswith(LOCAL_FLAGS)]
    serving = tls_files(cluster, "gpu-topology-extender-tls")
    seal = cluster.workdir / "seal.key"
    seal.write_bytes(base64.b64decode(secrets(cluster.kube)["gpu-topology-seal"]["key"]))
    (port,) = free_ports(1)
    extender = Process("extender", [
        sys.executable, "-m", "extender.cli", "serve", "--kubeconfig", service_account_kubeconfig(cluster),
        "--host", "127.0.0.1", "--port", str(port), "--tls-cert", serving["tls.crt"], "--tls-key", serving["tls.key"],
        "--client-ca", serving["ca.crt"], "--seal-key-file", seal, *args,
    ], cluster.workdir / "logs" / "extender.log", env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=ROOT)
    cluster.stack.callback(extender.stop)
    # Its probes' way: its own certificate, which the chart's --client-name pins.
    probe = ssl.create_default_context(cafile=str(serving["ca.crt"]))
    probe.check_hostname = False
    probe.load_cert_chain(str(serving["tls.crt"]), str(serving["tls.key"]))
    wait_for_https(extender, port, "/readyz", probe)

    client = tls_files(cluster, "gpu-topology-scheduler-client-tls")
    source = yaml.safe_load(find(docs, "ConfigMap", "gpu-topology-scheduler-config")["data"]["config.yaml"])
    host = source["extenders"][0]["urlPrefix"].removeprefix("https://").split(":")[0]
    config = derive_scheduler_config(source, kubeconfig=cluster.scheduler_kubeconfig,
                                     extender_url=f"https://127.0.0.1:{port}",
                                     tls={"caFile": str(client["ca.crt"]), "certFile": str(client["tls.crt"]),
                                          "keyFile": str(client["tls.key"]), "serverName": host})
    config_path = cluster.workdir / "kube-scheduler-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    start_scheduler(_BINARIES.scheduler, cluster.workdir, config_path, cluster.scheduler_kubeconfig, cluster.stack)

    nodes = dict(list(NODES.items())[:2])
    topologies = node_topologies(nodes)
    create_gpu_nodes(cluster.kube, topologies, nodes)
    reporter = FakeReporter(cluster.kube, topologies).start()
    cluster.stack.callback(reporter.stop)
    # A namespace that opts in to the chart's MutatingAdmissionPolicy: its GPU pod, written for the default
    # scheduler, is sent to ours.
    cluster.kube.core.create_namespace({"metadata": {"name": PODS, "labels": {"gpu-topology.io/scheduler": "enabled"}}})
    cluster.kube.create_service_account(PODS)
    created = cluster.kube.create_pod(gpu_pod("two-gpus", 2, scheduler="default-scheduler", namespace=PODS))
    assert created["spec"]["schedulerName"] == scheduler_name(config) == "gpu-topology-scheduler"

    def bound() -> dict[str, Any] | None:
        pod = cluster.kube.get_pod("two-gpus", PODS)
        return pod if pod["spec"].get("nodeName") else None
    wait_until(bound, BIND_SECONDS, "the pod bound")
    pod = bound()
    assert pod is not None and pod["spec"]["nodeName"] in nodes
    annotations = pod["metadata"]["annotations"]
    assert len(annotations["gpu-topology.io/gpus"].split(",")) == 2
    assert annotations["gpu-topology.io/seal"]  # sealed with the chart's key


def test_an_upgrade_keeps_the_certificates_and_the_seal_key(cluster) -> None:
    before = secrets(cluster.kube)
    upgraded = helm("upgrade", cluster.config, VALUES)
    assert upgraded.get("revision", 2) == 2
    assert secrets(cluster.kube) == before
    docs = parse({"upgraded": upgraded["manifest"]})
    seal = find(docs, "Secret", "gpu-topology-seal")["data"]["key"]
    assert seal == before["gpu-topology-seal"]["key"]
    assert {c["name"] for c in containers(find(docs, "DaemonSet", "gpu-topology-agent-deliver"))} >= {"agent"}


def test_an_uninstall_leaves_nothing_of_ours(cluster) -> None:
    manifest = manifest_file(cluster, cluster.config.status(RELEASE), "last.yaml")
    cluster.config.uninstall(RELEASE, timeout=120)

    def gone() -> bool:
        return kubectl(cluster, "get", "-f", str(manifest), "--ignore-not-found", "-o", "name").strip() == ""
    wait_until(gone, 120, "every object of the release deleted (the agent's namespace emptied by its controller)")
    left = kubectl(cluster, "get", "-f", str(manifest), "--ignore-not-found", "-o", "name")
    assert left.strip() == ""
    assert cluster.kube.core.list_namespaced_secret(NAMESPACE).items == []
    assert cluster.config.list() == []
