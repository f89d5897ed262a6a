"""End to end: Helm (helm-python-sdk, Helm v4's Go SDK) installs the chart into a real kube-apiserver (v1.36), a real
kube-scheduler runs the configuration the chart rendered and places a GPU pod through our extender, which runs with
the chart's own certificates, seal key and ServiceAccount (its RBAC and admission policies enforcing); the chart's
extender Deployment rolls on two real kubelets; then an upgrade with the same values keeps the certificates and the
seal key, and an uninstall leaves nothing of ours.

Until the rollout, no kubelet runs, and of kube-controller-manager only the policies' status and the namespace
controllers, so the chart's Deployments and DaemonSets make no Pods: for the GPU pod, the extender runs as a process,
with the Deployment's own flags but for where it listens and what it reads from files (the Secrets' content). For
the rollout (kubelets.py's two nodes: each its fake runtime, which pulls the chart's image by name and answers the
exec probes with 0, and our agent; root, and `kubelet` and `fakecri` in KUBE_BIN_DIR, else those tests skip),
kube-scheduler with its defaults, the Deployment, ReplicaSet, quota, disruption and garbage-collector controllers
start, and the nodes without a kubelet are cordoned: the chart's two replicas become ready on the two nodes,
`kubectl rollout restart` completes with one replica ready throughout, and the strategy the chart had (maxSurge 1,
maxUnavailable 0) stalls there on the anti-affinity. Runs only with KUBE_BIN_DIR (kube_e2e.skip_reason).

kubectl runs with --validate=false and Helm without its client-side OpenAPI validation: the v1.36.2 kube-apiserver
built for these tests answers 503 on /openapi/v2 (the server still validates every object it admits).

    cd tests && KUBE_BIN_DIR=/work/kube-bin ../.venv/bin/python -m pytest -q e2e/test_chart_e2e.py
"""

from __future__ import annotations

import base64
import json
import os
import ssl
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
    ControlPlane,
    FakeReporter,
    Kube,
    Process,
    create_gpu_nodes,
    derive_scheduler_config,
    find_kube_binaries_and_kubectl,
    free_ports,
    gpu_pod,
    node_topologies,
    scheduler_name,
    skip_reason,
    start_control_plane,
    start_scheduler,
    wait_for_https,
    wait_until,
    write_kubeconfig,
)
from kubelets import (
    EXTENDER_DEPLOYMENT,
    ROLLOUT_CONTROLLERS,
    ROLLOUT_SECONDS,
    TWO_NODES,
    extender_state,
    publish_root_ca,
    restart_rolls_with_one_ready,
    rollout_status,
    start_two_nodes,
    surge_stalls,
    wait_both_ready,
)

_BINARIES, _KUBECTL, _PROBLEM = find_kube_binaries_and_kubectl()
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


def kubectl(cluster: ChartCluster, *args: str) -> str:
    return cluster.plane.kubectl(*args, timeout=120).stdout


def secrets(kube: Kube) -> dict[str, dict[str, str]]:
    found = {}
    for name in SECRETS:
        raw = kube.core.read_namespaced_secret(name, NAMESPACE, _preload_content=False)
        found[name] = json.loads(raw.data)["data"]
    return found


@dataclass
class ChartCluster:
    plane: ControlPlane
    kube: Kube
    scheduler_kubeconfig: Path
    config: helm_python.Config
    stack: ExitStack
    release: dict[str, Any]

    @property
    def workdir(self) -> Path:
        return self.plane.workdir


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartCluster]:
    assert _BINARIES is not None and _KUBECTL is not None
    with ExitStack() as stack:
        # The policies' type checking, and the deletion of the agent's namespace at the uninstall.
        plane = start_control_plane(_BINARIES, _KUBECTL, tmp_path_factory.mktemp("chart-e2e"), stack,
                                    ["validatingadmissionpolicy-status-controller", "namespace-controller"])
        kube = Kube(plane.kubeconfig)
        stack.callback(kube.close)
        # The release's namespace, made as the chart's README says: before the install, with its Pod Security
        # level (a chart cannot own the namespace its release is stored in).
        kube.core.create_namespace({"metadata": {"name": NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted", "app.kubernetes.io/part-of": "gpu-topology"}}})
        config = helm_python.Config(kubeconfig_path=str(plane.kubeconfig), namespace=NAMESPACE)
        stack.callback(config.close)
        release = helm("install", config, VALUES)
        yield ChartCluster(plane, kube, write_kubeconfig(plane.workdir / "scheduler.kubeconfig", plane.server,
                                                         plane.pki, "scheduler"),
                           config, stack, release)


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
        "clusters": [{"name": "e2e", "cluster": {"server": cluster.plane.server,
                                                  "certificate-authority": str(cluster.plane.pki.ca)}}],
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


@pytest.fixture(scope="module")
def two_nodes(cluster: ChartCluster) -> ChartCluster:
    """The installed chart's control plane with two real kubelets, kube-scheduler (its defaults) and the controllers
    that make and roll the chart's Pods (and, at the uninstall, delete them with their Deployments). The nodes
    without a kubelet (the GPU pod's) are cordoned first: only these two may host the extender, whose anti-affinity
    wants one replica on each. They run until the module ends, the upgrade and the uninstall included."""
    plane = cluster.plane
    for node in cluster.kube.core.list_node().items:
        if node.metadata.name not in TWO_NODES:
            plane.kubectl("cordon", node.metadata.name)
    publish_root_ca(plane, NAMESPACE)
    start_two_nodes(plane, cluster.stack, (*ROLLOUT_CONTROLLERS, "garbage-collector-controller"))
    return cluster


def test_the_extender_rolls_on_two_nodes_with_a_replica_ready_throughout(two_nodes: ChartCluster) -> None:
    plane = two_nodes.plane
    wait_both_ready(plane, "the chart's two extender replicas ready, one a node")
    restart_rolls_with_one_ready(plane)


def test_the_surge_strategy_the_chart_replaced_stalls_there(two_nodes: ChartCluster) -> None:
    """maxSurge 1 / maxUnavailable 0, as the chart had it: the surge Pod finds no node (anti-affinity) and no old
    replica goes. The chart's own strategy put back finishes the same rollout."""
    plane = two_nodes.plane
    surge_stalls(plane)
    rendered = find(parse({"installed": two_nodes.release["manifest"]}), "Deployment", "gpu-topology-extender")
    plane.kubectl("-n", NAMESPACE, "patch", EXTENDER_DEPLOYMENT, "--type=merge",
                  "-p", json.dumps({"spec": {"strategy": rendered["spec"]["strategy"]}}))
    done = rollout_status(plane, ROLLOUT_SECONDS)
    assert done.returncode == 0, done.stdout + done.stderr + extender_state(plane)
    wait_both_ready(plane, "both replicas again")


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
        return (kubectl(cluster, "get", "-f", str(manifest), "--ignore-not-found", "-o", "name").strip() == ""
                and not cluster.kube.core.list_namespaced_pod(NAMESPACE).items)
    wait_until(gone, 120, "every object of the release deleted (the agent's namespace emptied by its controller) "
               "and the Deployments' Pods gone from the kubelets")
    left = kubectl(cluster, "get", "-f", str(manifest), "--ignore-not-found", "-o", "name")
    assert left.strip() == ""
    assert cluster.kube.core.list_namespaced_pod(NAMESPACE).items == []
    assert cluster.kube.core.list_namespaced_secret(NAMESPACE).items == []
    assert cluster.config.list() == []
