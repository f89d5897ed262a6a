"""The node agent's manifests: its two DaemonSets (mode b "scheduling only", --mode report, agent.yaml; mode a
"scheduling plus delivery", --mode deliver, agent-deliver.yaml), namespace, RBAC, and the ValidatingAdmissionPolicy
that confines it to its own Node's annotations.

- Every object validates strictly against the official Kubernetes 1.36 schemas (kubernetes-validate); the
  parametrized schema test of tests/test_manifests.py covers them too, as it covers every file in scheduler-config/.
- Which nodes each DaemonSet runs on is computed from its nodeSelector and node affinity, for every combination of
  the labels involved: each GPU node runs exactly one agent, and the deliver agent never runs where the GPU
  operator's device plugin does (its DaemonSet's own nodeSelector, quoted below).
- The DaemonSets, the namespace and the RBAC are read field by field against what each mode needs and no more; the
  deliver agent's init container is run for real against a live and a stale Unix socket.
- The policy's CEL is not re-implemented here: every expression is taken from agent-policy.yaml as it is, compiled
  with cel-python (a CEL implementation from PyPI) and evaluated against realistic AdmissionRequests and Nodes, in
  the order the API server applies a ValidatingAdmissionPolicy (manifest_checks.AdmissionPolicy). The expressions
  keep to portable CEL, and a test checks that they call no function outside that subset, so cel-python and
  Kubernetes agree on them.
"""

from __future__ import annotations

import copy
import itertools
import os
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import celpy
import kubernetes_validate
import pytest
from celpy import celtypes
from kube_api_server import merge_patch  # RFC 7386, as the API server applies the agent's PATCH
from manifest_checks import (
    CONFIG,
    KUBERNETES_VERSION,
    ROOT,
    AdmissionPolicy,
    Doc,
    Verdict,
    container,
    documents,
    flag_values,
    flatten_rules,
    load_yaml,
    non_portable_calls,
    obj,
    policy_expressions,
    policy_variable,
    program,
    quantity,
    runs_on,
)

AGENT_FILES = ("agent-namespace.yaml", "agent-rbac.yaml", "agent.yaml", "agent-deliver.yaml", "agent-policy.yaml")
NAMESPACE = "gpu-topology-node"
EXTENDER_NAMESPACE = "gpu-topology-system"
NAME = "gpu-topology-agent"  # the report agent's DaemonSet and ServiceAccount
DELIVER_NAME = "gpu-topology-agent-deliver"  # the deliver agent's
POLICY_NAME = "gpu-topology-agent-own-node-annotations"
GPU = "nvidia.com/gpu"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 DevicePluginPath
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # CDI's default spec directories

# Our opt-in label, and the GPU operator's own switch for its device plugin on a node. The operator's DaemonSet runs
# its plugin where that label is "true": NVIDIA/gpu-operator assets/state-device-plugin/0500_daemonset.yaml line 20
# (`nodeSelector: nvidia.com/gpu.deploy.device-plugin: "true"`); it sets the label to "true" only where it is absent
# or empty, and keeps any other value an admin set (controllers/state_manager.go, addGPUStateLabels);
# k8s-driver-manager leaves "false" as it is while it pauses operands for a driver upgrade (cmd/driver-manager/main.go,
# maybeSetPaused) and turns "true" into "paused-for-driver-upgrade".
DELIVERY_LABEL = "gpu-topology.io/agent-mode"
OPERATOR_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
OPERATOR_PLUGIN_POD: Doc = {"nodeSelector": {OPERATOR_PLUGIN_LABEL: "true"}}
GPU_NODE_LABELS = (
    "nvidia.com/gpu.present",
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)

REPORT = obj("DaemonSet", NAME, NAMESPACE)
DELIVER = obj("DaemonSet", DELIVER_NAME, NAMESPACE)
AGENTS = {"report": REPORT, "deliver": DELIVER}
POD = REPORT["spec"]["template"]["spec"]
MAIN = container(REPORT)
FLAGS = flag_values(MAIN["args"])
DELIVER_POD = DELIVER["spec"]["template"]["spec"]
DELIVER_MAIN = container(DELIVER)
DELIVER_FLAGS = flag_values(DELIVER_MAIN["args"])
(WAIT,) = DELIVER_POD["initContainers"]
SERVICE_ACCOUNT = obj("ServiceAccount", NAME, NAMESPACE)
DELIVER_SERVICE_ACCOUNT = obj("ServiceAccount", DELIVER_NAME, NAMESPACE)
POLICY = obj("ValidatingAdmissionPolicy", POLICY_NAME)
BINDING = obj("ValidatingAdmissionPolicyBinding", POLICY_NAME)
EXTENDER = obj("Deployment", "gpu-topology-extender", EXTENDER_NAMESPACE)
EXTENDER_FLAGS = flag_values(container(EXTENDER)["args"][1:])
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
DELIVER_USER = f"system:serviceaccount:{NAMESPACE}:{DELIVER_NAME}"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"  # k8s.io/apiserver/pkg/authentication/serviceaccount


def all_containers(daemonset: Doc) -> list[Doc]:
    spec = daemonset["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def host_path_mounts(daemonset: Doc, main: Doc) -> dict[str, tuple[str, str, bool]]:
    """The hostPath volumes that the container `main` mounts, as {host path: (hostPath type, mount path,
    read-only)}. Every hostPath volume of the Pod is mounted by some container."""
    pod = daemonset["spec"]["template"]["spec"]
    mounted = {m["name"] for each in all_containers(daemonset) for m in each.get("volumeMounts", [])}
    found = {}
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            assert volume["name"] in mounted, volume["name"]
            mounts = [m for m in main.get("volumeMounts", []) if m["name"] == volume["name"]]
            assert len(mounts) <= 1
            for mount in mounts:
                found[volume["hostPath"]["path"]] = (volume["hostPath"].get("type", ""), mount["mountPath"],
                                                     mount.get("readOnly", False))
    return found


# ---------------------------------------------------------------------------------------------------------------
# Schemas and kustomize
# ---------------------------------------------------------------------------------------------------------------


def test_every_agent_object_validates_strictly_against_the_official_schema() -> None:
    kinds = []
    for file in AGENT_FILES:
        for doc in load_yaml(CONFIG / file):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            kinds.append(doc["kind"])
    assert sorted(kinds) == sorted([
        "Namespace", "ServiceAccount", "ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
        "ClusterRoleBinding", "DaemonSet", "DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ])


def test_strict_validation_covers_the_admission_policy() -> None:
    broken = copy.deepcopy(BINDING)
    broken["spec"]["validationAction"] = broken["spec"].pop("validationActions")  # a plausible typo
    with pytest.raises(kubernetes_validate.ValidationError, match="validationAction"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_no_reporter_names_are_left() -> None:
    # The reporter became the agent: old names would install a second, unconfined copy next to it. (README.md
    # names them once, in the steps that remove an old installation.)
    for path in [*CONFIG.glob("*.yaml"), *CONFIG.glob("*.sh")]:
        assert "gpu-topology-reporter" not in path.read_text(), path.name
    assert not list(CONFIG.glob("reporter*"))


def test_kustomization_installs_both_agents_with_the_extenders_image() -> None:
    (kustomization,) = load_yaml(CONFIG / "kustomization.yaml")
    assert set(AGENT_FILES) <= set(kustomization["resources"])
    (image,) = kustomization["images"]
    for daemonset in AGENTS.values():
        for each in all_containers(daemonset):
            assert each["image"] == container(EXTENDER)["image"], each["name"]
            assert each["image"].split(":")[0] == image["name"]  # so `images:` rewrites the agents' images too


# ---------------------------------------------------------------------------------------------------------------
# Where each agent runs
# ---------------------------------------------------------------------------------------------------------------

NODE_LABEL_CASES = list(itertools.product(
    # GPU labels: none, each one alone, two at once.
    [(), *((label,) for label in GPU_NODE_LABELS), GPU_NODE_LABELS[:2]],
    # Our label: absent, the value that switches delivery on, other values.
    [None, "deliver", "report", "Deliver", ""],
    # The operator's plugin label: absent, on, off, paused by k8s-driver-manager, empty.
    [None, "true", "false", "paused-for-driver-upgrade", ""],
))


def node_labels(gpu: tuple[str, ...], mode: str | None, plugin: str | None) -> dict[str, str]:
    labels = {"kubernetes.io/os": "linux", **{label: "true" for label in gpu}}
    if mode is not None:
        labels[DELIVERY_LABEL] = mode
    if plugin is not None:
        labels[OPERATOR_PLUGIN_LABEL] = plugin
    return labels


@pytest.mark.parametrize(("gpu", "mode", "plugin"), NODE_LABEL_CASES)
def test_every_gpu_node_runs_exactly_one_agent(gpu: tuple[str, ...], mode: str | None, plugin: str | None) -> None:
    labels = node_labels(gpu, mode, plugin)
    report, deliver = runs_on(POD, labels), runs_on(DELIVER_POD, labels)
    if not gpu:
        assert not report and not deliver
        return
    assert report != deliver  # one agent, never two (they would both write the node's state)
    # Delivery exactly where the admin switched it on and the operator's plugin is off.
    assert deliver == (mode == "deliver" and plugin == "false")


@pytest.mark.parametrize(("gpu", "mode", "plugin"), NODE_LABEL_CASES)
def test_the_deliver_agent_never_runs_beside_the_operators_device_plugin(
        gpu: tuple[str, ...], mode: str | None, plugin: str | None) -> None:
    labels = node_labels(gpu, mode, plugin)
    assert not (runs_on(DELIVER_POD, labels) and runs_on(OPERATOR_PLUGIN_POD, labels))


def test_node_selection_is_readable() -> None:
    # The report agent: affinity only (a nodeSelector would AND with it). The deliver agent: its two switches in
    # the nodeSelector, where an operator looks first, and the GPU-node affinity.
    assert "nodeSelector" not in POD
    assert DELIVER_POD["nodeSelector"] == {DELIVERY_LABEL: "deliver", OPERATOR_PLUGIN_LABEL: "false"}
    for term in DELIVER_POD["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]:
        (expression,) = term["matchExpressions"]
        assert expression["key"] in GPU_NODE_LABELS and expression["operator"] == "In"


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_tolerates_the_gpu_taint_and_is_node_critical(mode: str) -> None:
    pod = AGENTS[mode]["spec"]["template"]["spec"]
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"


def test_the_two_daemonsets_never_adopt_each_others_pods() -> None:
    for one, other in ((REPORT, DELIVER), (DELIVER, REPORT)):
        selector = one["spec"]["selector"]["matchLabels"]
        assert selector.items() <= one["spec"]["template"]["metadata"]["labels"].items()
        assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()


# ---------------------------------------------------------------------------------------------------------------
# Mounts
# ---------------------------------------------------------------------------------------------------------------


def test_report_agent_mounts_only_the_pod_resources_directory_read_only() -> None:
    assert host_path_mounts(REPORT, MAIN) == {POD_RESOURCES_DIR: ("Directory", POD_RESOURCES_DIR, True)}
    # The socket the agent dials is inside that mount.
    assert FLAGS["--socket"] == f"{POD_RESOURCES_DIR}/kubelet.sock"


def test_deliver_agent_mounts_the_device_plugins_directory_and_nothing_else_writable() -> None:
    assert host_path_mounts(DELIVER, DELIVER_MAIN) == {
        POD_RESOURCES_DIR: ("Directory", POD_RESOURCES_DIR, True),
        # Read-write: it creates its socket there and connects to the kubelet's kubelet.sock.
        DEVICE_PLUGIN_DIR: ("Directory", DEVICE_PLUGIN_DIR, False),
        # Read-only, for the check that a CDI spec defines the kind it hands out.
        **{path: ("DirectoryOrCreate", path, True) for path in CDI_SPEC_DIRS},
    }
    assert DELIVER_FLAGS["--socket"] == f"{POD_RESOURCES_DIR}/kubelet.sock"
    assert DELIVER_FLAGS["--device-plugin-dir"].rstrip("/") == DEVICE_PLUGIN_DIR
    # The CDI directories are where the agent looks for specs (topology/agent/deviceplugin.py).
    from topology.agent.deviceplugin import CDI_SPEC_DIRS as AGENTS_CDI_DIRS

    assert tuple(AGENTS_CDI_DIRS) == CDI_SPEC_DIRS


def test_the_init_container_watches_nvidias_plugin_socket_read_only() -> None:
    assert host_path_mounts(DELIVER, WAIT) == {DEVICE_PLUGIN_DIR: ("Directory", DEVICE_PLUGIN_DIR, True)}
    command = WAIT["command"]
    assert command[:2] == ["python", "-c"]
    # NVIDIA's plugin serves resource <vendor>/<name> on nvidia-<name>.sock (internal/plugin/server.go,
    # getPluginSocketPath): for our --gpu-resource, in the mounted directory.
    resource_name = DELIVER_FLAGS["--gpu-resource"].split("/", 1)[1]
    assert command[3] == f"{DEVICE_PLUGIN_DIR}/nvidia-{resource_name}.sock"
    # Not our own socket (topology/agent/deviceplugin.py DEFAULT_SOCKET_NAME).
    from topology.agent.deviceplugin import DEFAULT_SOCKET_NAME

    assert PurePosixPath(command[3]).name != DEFAULT_SOCKET_NAME


def _wait(path: str) -> subprocess.Popen[str]:
    script = WAIT["command"][2]
    return subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_the_init_container_waits_only_while_a_plugin_listens() -> None:
    directory = tempfile.mkdtemp(prefix="dp-", dir="/tmp")  # short: a Unix socket path holds 107 bytes
    path = os.path.join(directory, "nvidia-gpu.sock")
    try:
        # No socket at all: go at once.
        assert _wait(path).wait(timeout=30) == 0
        # A socket file nobody listens on (a killed plugin's): go at once.
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)
        stale.close()
        assert _wait(path).wait(timeout=30) == 0
        os.unlink(path)
        # A live plugin: wait, say why once, and go when it stops.
        live = socket.socket(socket.AF_UNIX)
        live.bind(path)
        live.listen()
        waiting = _wait(path)
        try:
            time.sleep(1.5)
            assert waiting.poll() is None
            live.close()
            os.unlink(path)
            assert waiting.wait(timeout=30) == 0
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait(timeout=10)
        out = waiting.stdout.read() if waiting.stdout else ""
        assert out.count("waiting for NVIDIA's device plugin to stop") == 1, out
    finally:
        for leftover in Path(directory).iterdir():
            leftover.unlink()
        os.rmdir(directory)


# ---------------------------------------------------------------------------------------------------------------
# Resources, NVML, security
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_has_requests_and_limits_and_takes_no_gpu(mode: str) -> None:
    daemonset = AGENTS[mode]
    for each in all_containers(daemonset):
        resources = each["resources"]
        for name in ("cpu", "memory"):
            assert 0 < quantity(resources["requests"][name]) <= quantity(resources["limits"][name]), name
        assert GPU not in resources["requests"] and GPU not in resources["limits"]
    # NVML comes from the NVIDIA runtime instead: all device nodes, NVML's "utility" libraries, no CUDA.
    env = {item["name"]: item for item in container(daemonset)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert daemonset["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_is_root_for_the_sockets_but_otherwise_unprivileged(mode: str) -> None:
    pod = AGENTS[mode]["spec"]["template"]["spec"]
    security = pod["securityContext"]
    # The kubelet's sockets are root:root in 0750 directories: only uid 0 may connect, and create one there.
    assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (0, 0, False)
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(security) == {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"}
    assert not {"hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace"} & set(pod)
    for each in all_containers(AGENTS[mode]):
        own = each["securityContext"]
        assert own == {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}, each["name"]


def test_command_lines_run_the_agent() -> None:
    for daemonset in AGENTS.values():
        assert container(daemonset)["command"] == ["gpu-topology-agent"]


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_command_line_matches_the_extender_and_the_policy(mode: str) -> None:
    main = container(AGENTS[mode])
    flags = flag_values(main["args"])
    assert flags["--in-cluster"] == ""
    # --node-name comes from the downward API.
    assert flags["--node-name"] == "$(NODE_NAME)"
    env = {item["name"]: item for item in main["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert flags["--annotation-prefix"] == EXTENDER_FLAGS["--annotation-prefix"]
    assert flags["--annotation-prefix"] + "/" == policy_variable(POLICY, "prefix")
    assert flags["--gpu-resource"] == EXTENDER_FLAGS["--gpu-resource"] == GPU
    # The heartbeat refreshes the state well before the extender calls it stale.
    assert 0 < float(flags["--interval"]) < float(flags["--heartbeat"]) < float(EXTENDER_FLAGS["--stale-after"])


def test_report_agent_flags() -> None:
    known = {"--in-cluster", "--node-name", "--socket", "--interval", "--heartbeat", "--annotation-prefix",
             "--gpu-resource", "--log-level"}
    # No --mode: report is the default, so this DaemonSet also runs an agent built before the flag existed.
    assert set(FLAGS) <= known, set(FLAGS) - known


def test_deliver_agent_flags() -> None:
    assert DELIVER_FLAGS["--mode"] == "deliver"
    assert set(FLAGS) <= set(DELIVER_FLAGS)  # everything the report agent does, plus delivery
    assert set(DELIVER_FLAGS) - set(FLAGS) == {"--mode", "--device-plugin-dir", "--device-list-strategy"}
    assert "--numa-topology" not in DELIVER_FLAGS  # the Topology Manager must not override the extender's GPUs
    from topology.agent.allocate import parse_strategies

    strategies = parse_strategies(DELIVER_FLAGS["--device-list-strategy"])
    assert [s.value for s in strategies] == ["cdi-annotations", "cdi-cri"]


def _agent_help() -> str:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("scripts", {})
    # The script's own entry point ("module:function"), run from the source tree, so no reinstall is needed.
    module, function = scripts["gpu-topology-agent"].split(":")
    run = f"import sys; from {module} import {function} as main; sys.exit(main())"
    result = subprocess.run([sys.executable, "-c", run, "--help"], cwd=ROOT, check=False, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_the_agents_console_script_accepts_the_report_daemonsets_flags() -> None:
    help_text = _agent_help()
    for flag in FLAGS:
        assert flag in help_text, flag


def test_the_agents_console_script_accepts_the_deliver_daemonsets_flags() -> None:
    help_text = _agent_help()
    if "--mode" not in help_text:
        pytest.skip("gpu-topology-agent has no --mode yet (the device plugin has not landed): agent-deliver.yaml "
                    "passes --mode, --device-plugin-dir and --device-list-strategy")
    for flag in DELIVER_FLAGS:
        assert flag in help_text, flag
    assert "deliver" in help_text


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_serves_no_port_and_has_no_probes(mode: str) -> None:
    # The report agent serves nothing; the deliver agent serves a Unix socket to the kubelet only (agent*.yaml).
    for each in all_containers(AGENTS[mode]):
        assert "ports" not in each
        assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(each)


@pytest.mark.parametrize(("daemonset", "account"), [(REPORT, SERVICE_ACCOUNT), (DELIVER, DELIVER_SERVICE_ACCOUNT)],
                         ids=["report", "deliver"])
def test_agent_runs_as_its_own_service_account_with_its_token(daemonset: Doc, account: Doc) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == daemonset["metadata"]["namespace"] == NAMESPACE
    assert pod.get("automountServiceAccountToken", True) is True
    assert account.get("automountServiceAccountToken", True) is True


# ---------------------------------------------------------------------------------------------------------------
# Namespace (Pod Security) and RBAC
# ---------------------------------------------------------------------------------------------------------------


def test_agent_lives_in_its_own_namespace_because_pod_security_requires_it() -> None:
    agent_ns = obj("Namespace", NAMESPACE)["metadata"]["labels"]
    extender_ns = obj("Namespace", EXTENDER_NAMESPACE)["metadata"]["labels"]
    # Pod Security Standards: "baseline" forbids hostPath volumes, "restricted" also requires runAsNonRoot.
    # The agents need both, so gpu-topology-system (restricted) would reject their Pods.
    for daemonset in AGENTS.values():
        pod = daemonset["spec"]["template"]["spec"]
        assert any("hostPath" in volume for volume in pod["volumes"])
        assert pod["securityContext"]["runAsNonRoot"] is False
    assert extender_ns["pod-security.kubernetes.io/enforce"] == "restricted"
    assert agent_ns["pod-security.kubernetes.io/enforce"] == "privileged"
    # Nothing else runs there.
    workloads = {(doc["kind"], doc["metadata"]["name"]) for _, doc in documents()
                 if doc.get("metadata", {}).get("namespace") == NAMESPACE and doc["kind"] != "ServiceAccount"}
    assert workloads == {("DaemonSet", NAME), ("DaemonSet", DELIVER_NAME)}


def granted(account: str) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Every rule the ServiceAccount gets, through every binding in scheduler-config/ that names it."""
    rules: set[tuple[str, str, str, tuple[str, ...]]] = set()
    for _, doc in documents():
        if doc.get("kind") not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        if not any((s["kind"], s["name"], s.get("namespace")) == ("ServiceAccount", account, NAMESPACE)
                   for s in doc["subjects"]):
            continue
        assert doc["kind"] == "ClusterRoleBinding" and doc["roleRef"]["kind"] == "ClusterRole"
        assert doc["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        rules |= flatten_rules(obj("ClusterRole", doc["roleRef"]["name"])["rules"])
    return rules


def test_agent_rbac_is_exactly_what_each_mode_needs() -> None:
    node = {("", "nodes", "get", ()), ("", "nodes", "patch", ())}
    # report: its own Node's annotations, nothing else.
    assert granted(NAME) == node
    # deliver: the same, and list (read-only) on pods for the pods bound to its node (topology/agent/pods.py).
    assert granted(DELIVER_NAME) == node | {("", "pods", "list", ())}
    roles = {doc["metadata"]["name"] for _, doc in documents() if doc.get("kind") == "ClusterRole"
             and doc["metadata"]["name"].startswith(NAME)}
    assert roles == {NAME, DELIVER_NAME}


def test_only_the_deliver_agent_may_list_pods() -> None:
    # list on pods reads every Pod of the cluster (RBAC cannot restrict it to a field selector): the report agent
    # runs under a ServiceAccount without it.
    assert ("", "pods", "list", ()) not in granted(NAME)
    assert REPORT["spec"]["template"]["spec"]["serviceAccountName"] == NAME


# ---------------------------------------------------------------------------------------------------------------
# The ValidatingAdmissionPolicy: structure
# ---------------------------------------------------------------------------------------------------------------


def policy_prefix() -> str:
    return policy_variable(POLICY, "prefix")


def test_policy_watches_node_updates_and_fails_closed() -> None:
    spec = POLICY["spec"]
    assert POLICY["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert spec["failurePolicy"] == "Fail"
    assert "paramKind" not in spec
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"]
    assert rule["operations"] == ["UPDATE"]  # PATCH arrives as UPDATE; create and delete are not granted
    assert set(rule["resources"]) == {"nodes", "nodes/status"}
    assert all(validation.get("reason") == "Forbidden" for validation in spec["validations"])


def test_binding_denies_with_the_policy() -> None:
    spec = BINDING["spec"]
    assert spec["policyName"] == POLICY["metadata"]["name"]
    assert spec["validationActions"] == ["Deny"]
    assert "paramRef" not in spec and "matchResources" not in spec


# ---------------------------------------------------------------------------------------------------------------
# The policy's CEL, evaluated with cel-python
# ---------------------------------------------------------------------------------------------------------------

EXPRESSIONS = policy_expressions(POLICY)
CONFINED = AdmissionPolicy(POLICY)


@pytest.mark.parametrize(("where", "expression"), EXPRESSIONS, ids=[where for where, _ in EXPRESSIONS])
def test_every_expression_compiles_with_cel_python_and_calls_only_portable_cel(where: str, expression: str) -> None:
    program(expression)
    assert not non_portable_calls(expression)


def admit(request: Doc) -> Verdict:
    return CONFINED.admit(request)


def matches_constraints(request: Doc) -> bool:
    return CONFINED.matches_constraints(request)


# A GPU node as the API server holds it (kubectl get node -o json, trimmed), before the agent's write.
OWN_NODE = "gpu-node-1"
NODE: Doc = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": OWN_NODE,
        "uid": "5c1d7f4e-2b8a-4a8e-9d55-0c3e1f0a9b21",
        "resourceVersion": "48151623",
        "creationTimestamp": "2026-01-12T08:31:07Z",
        "labels": {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": OWN_NODE,
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "p4d.24xlarge",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            "feature.node.kubernetes.io/pci-10de.present": "true",
        },
        "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            "csi.volume.kubernetes.io/nodeid": '{"ebs.csi.aws.com":"i-0a1b2c3d4e5f60718"}',
            "nfd.node.kubernetes.io/feature-labels": "pci-10de.present",
            "gpu-topology.io/topology": '{"v":1,"gpus":[],"fingerprint":"3f9a"}',
            "gpu-topology.io/state": '{"v":1,"used":[],"unhealthy":[],"observed":"2026-01-12T09:00:00Z",'
                                     '"generation":41}',
        },
        "managedFields": [
            {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-01-12T08:31:07Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:capacity": {}}}},
            {"manager": "gpu-topology-agent", "operation": "Update", "apiVersion": "v1",
             "time": "2026-01-12T09:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:gpu-topology.io/state": {}}}}},
        ],
    },
    "spec": {
        "podCIDR": "10.244.7.0/24",
        "podCIDRs": ["10.244.7.0/24"],
        "providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718",
        "taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}],
    },
    "status": {
        "capacity": {"cpu": "96", "memory": "1176481280Ki", GPU: "8", "pods": "110"},
        "allocatable": {"cpu": "95690m", "memory": "1163855360Ki", GPU: "8", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": "2026-01-12T09:00:03Z", "lastTransitionTime": "2026-01-12T08:31:37Z"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.7.21"}, {"type": "Hostname", "address": OWN_NODE}],
        "nodeInfo": {"kubeletVersion": "v1.36.2", "containerRuntimeVersion": "containerd://2.1.4",
                     "architecture": "amd64", "operatingSystem": "linux"},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    },
}
# The same node before the agent's first write: no annotations of ours, and none at all (the API server leaves
# out an empty map).
FRESH_NODE: Doc = copy.deepcopy(NODE)
del FRESH_NODE["metadata"]["annotations"]


def annotations_patch(**annotations: str | None) -> Callable[[Doc], Doc]:
    return lambda node: merge_patch(node, {"metadata": {"annotations": annotations}})


def edit(change: Callable[[Doc], None]) -> Callable[[Doc], Doc]:
    def apply(node: Doc) -> Doc:
        changed = copy.deepcopy(node)
        change(changed)
        return changed
    return apply


def pod_bound_extra(node_name: str) -> dict[str, list[str]]:
    """userInfo.extra of a Pod-bound service-account token on Kubernetes 1.32+ (ServiceAccountTokenPodNodeInfo)."""
    return {
        "authentication.kubernetes.io/credential-id": ["JTI=7b0f3c52-1d4e-4a2f-8f0e-3c9d2b1a6e57"],
        NODE_NAME_CLAIM: [node_name],
        "authentication.kubernetes.io/node-uid": ["5c1d7f4e-2b8a-4a8e-9d55-0c3e1f0a9b21"],
        "authentication.kubernetes.io/pod-name": [f"{NAME}-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["0e6f7a1b-93c4-4d2e-b5a8-6f1c2d3e4a5b"],
    }


def admission_request(change: Callable[[Doc], Doc], *, user: str = AGENT_USER,
                      extra: dict[str, list[str]] | None = None, old: Doc = NODE, sub_resource: str = "") -> Doc:
    """The AdmissionRequest of one write to a Node; `change` turns the stored Node into the Node after it."""
    new = change(old)
    # What the API server itself changes on every write before admission: the managedFields entry of the writer.
    new = copy.deepcopy(new)
    new["metadata"]["managedFields"][-1]["time"] = "2026-01-12T09:00:35Z"
    user_info: Doc = {"username": user, "uid": "0b8e0c2d-6a59-4d3f-9c1e-5b7a2f4d8e10",
                      "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                 "system:authenticated"]}
    if extra is None and user == AGENT_USER:
        extra = pod_bound_extra(OWN_NODE)
    if extra:  # left out, not empty, when the credential carries none (omitempty)
        user_info["extra"] = extra
    request = {
        "uid": "f3c5b1a2-9e8d-4c7b-a6f5-e4d3c2b1a098",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "requestKind": {"group": "", "version": "v1", "kind": "Node"},
        "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": old["metadata"]["name"],
        "operation": "UPDATE",
        "userInfo": user_info,
        "object": new,
        "oldObject": old,
        "dryRun": False,
        "options": {"kind": "PatchOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": NAME},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return request


ALLOWED: dict[str, Doc] = {
    "first write of topology and state on a node without annotations": admission_request(
        annotations_patch(**{"gpu-topology.io/topology": '{"v":1}', "gpu-topology.io/state": '{"v":1}'}),
        old=FRESH_NODE),
    "state changed": admission_request(
        annotations_patch(**{"gpu-topology.io/state": '{"v":1,"used":["GPU-1"],"generation":42}'})),
    "state removed": admission_request(annotations_patch(**{"gpu-topology.io/state": None})),
    "both removed, leaving the other annotations": admission_request(
        annotations_patch(**{"gpu-topology.io/state": None, "gpu-topology.io/topology": None})),
    "a new annotation of ours": admission_request(annotations_patch(**{"gpu-topology.io/health": "ok"})),
    "heartbeat that changes nothing": admission_request(annotations_patch()),
    "same value written again by a PUT with a new resourceVersion": admission_request(
        edit(lambda n: n["metadata"].update(resourceVersion="48151624"))),
}


def set_label(key: str, value: str | None) -> Callable[[Doc], Doc]:
    return lambda node: merge_patch(node, {"metadata": {"labels": {key: value}}})


DENIED: dict[str, tuple[Doc, list[str]]] = {
    # Not its own Node.
    "another node's name in the claim": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra=pod_bound_extra("gpu-node-2")),
        ["its token is bound to node gpu-node-2, not to node gpu-node-1"]),
    "no extra at all (a legacy Secret token)": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra={}),
        ["its token is bound to no node, not to node gpu-node-1"]),
    "pod claims without the node claim (before Kubernetes 1.30)": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra={
            key: value for key, value in pod_bound_extra(OWN_NODE).items() if "node-" not in key}),
        ["bound to no node"]),
    "an empty node claim": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra={NODE_NAME_CLAIM: []}),
        ["bound to no node"]),
    "two node names in the claim": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}),
                          extra={NODE_NAME_CLAIM: [OWN_NODE, "gpu-node-2"]}),
        ["bound to several nodes"]),
    # Labels.
    "a label added": (admission_request(set_label("gpu-topology.io/nvlink", "true")), ["labels"]),
    "a label changed": (admission_request(set_label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")), ["labels"]),
    "a label removed": (admission_request(set_label("nvidia.com/gpu.present", None)), ["labels"]),
    "a label together with our annotation": (
        admission_request(lambda n: merge_patch(n, {"metadata": {
            "labels": {"kubernetes.io/hostname": "gpu-node-9"}, "annotations": {"gpu-topology.io/state": "{}"}}})),
        ["labels"]),
    # Spec.
    "the GPU taint removed": (admission_request(edit(lambda n: n["spec"].pop("taints"))), ["spec"]),
    "a taint added": (
        admission_request(edit(lambda n: n["spec"]["taints"].append(
            {"key": "gpu-topology.io/broken", "effect": "NoExecute"}))),
        ["spec"]),
    "cordoned": (admission_request(edit(lambda n: n["spec"].update(unschedulable=True))), ["spec"]),
    # Status (through nodes/status, which the agent is not granted either).
    "more GPUs in capacity": (
        admission_request(edit(lambda n: n["status"]["capacity"].update({GPU: "16"})), sub_resource="status"),
        ["status"]),
    "a condition changed": (
        admission_request(edit(lambda n: n["status"]["conditions"][0].update(status="False")),
                          sub_resource="status"),
        ["status"]),
    # Other metadata.
    "a finalizer added": (
        admission_request(edit(lambda n: n["metadata"].update(finalizers=["gpu-topology.io/keep"]))),
        ["finalizers"]),
    "an owner reference added": (
        admission_request(edit(lambda n: n["metadata"].update(ownerReferences=[
            {"apiVersion": "v1", "kind": "Namespace", "name": NAMESPACE, "uid": "1"}]))),
        ["finalizers, owner references"]),
    # Annotations that are not ours.
    "a foreign annotation changed": (
        admission_request(annotations_patch(**{"node.alpha.kubernetes.io/ttl": "30"})),
        ["may add or change only annotations under gpu-topology.io/, not node.alpha.kubernetes.io/ttl"]),
    "a foreign annotation added": (
        admission_request(annotations_patch(**{"example.com/owner": "me"})),
        ["not example.com/owner"]),
    "a foreign annotation removed": (
        admission_request(annotations_patch(**{"csi.volume.kubernetes.io/nodeid": None})),
        ["may remove only annotations under gpu-topology.io/, not csi.volume.kubernetes.io/nodeid"]),
    "a kubernetes.io annotation changed": (
        admission_request(annotations_patch(**{"volumes.kubernetes.io/controller-managed-attach-detach": "false"})),
        ["not volumes.kubernetes.io/controller-managed-attach-detach"]),
    "a kubernetes.io annotation added": (
        admission_request(annotations_patch(**{"kubernetes.io/description": "x"})),
        ["not kubernetes.io/description"]),
    "every annotation replaced by ours (a PUT)": (
        admission_request(edit(lambda n: n["metadata"].update(annotations={"gpu-topology.io/state": "{}"}))),
        ["may remove only annotations under gpu-topology.io/, not node.alpha.kubernetes.io/ttl"]),
    # Keys that only look like ours.
    "a lookalike domain": (
        admission_request(annotations_patch(**{"gpu-topology.io.evil.example/state": "{}"})),
        ["not gpu-topology.io.evil.example/state"]),
    "a subdomain of ours": (
        admission_request(annotations_patch(**{"x.gpu-topology.io/state": "{}"})), ["not x.gpu-topology.io/state"]),
    "a longer name": (
        admission_request(annotations_patch(**{"gpu-topology.iox/state": "{}"})), ["not gpu-topology.iox/state"]),
    "the bare domain without a slash": (
        admission_request(annotations_patch(**{"gpu-topology.io": "{}"})), ["not gpu-topology.io"]),
    # Several at once: every broken rule is reported.
    "another node and a foreign annotation": (
        admission_request(annotations_patch(**{"example.com/owner": "me"}), extra=pod_bound_extra("gpu-node-2")),
        ["bound to node gpu-node-2", "not example.com/owner"]),
}


@pytest.mark.parametrize("case", list(ALLOWED))
def test_policy_allows_the_agent_its_own_annotations_on_its_own_node(case: str) -> None:
    verdict = admit(ALLOWED[case])
    assert verdict.applies
    assert verdict.allowed, verdict.messages


@pytest.mark.parametrize("case", list(DENIED))
def test_policy_denies_everything_else_with_a_clear_message(case: str) -> None:
    request, expected = DENIED[case]
    verdict = admit(request)
    assert verdict.applies and not verdict.allowed
    assert not [m for m in verdict.messages if m.startswith("evaluation error")], verdict.messages
    assert len(verdict.messages) == len(expected), verdict.messages
    for part in expected:
        assert any(part in message for message in verdict.messages), (part, verdict.messages)


def test_messages_name_the_prefix_of_the_manifests() -> None:
    verdict = admit(DENIED["a foreign annotation added"][0])
    assert verdict.messages == [
        f"gpu-topology-agent may add or change only annotations under {policy_prefix()}, not example.com/owner"
    ]


@pytest.mark.parametrize(
    ("username", "selected"),
    [
        (AGENT_USER, True),
        (DELIVER_USER, True),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:gpu-topology-extender", False),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:{NAME}", False),  # same name, another namespace
        (f"system:serviceaccount:{NAMESPACE}:default", False),
        (f"system:serviceaccount:{NAMESPACE}:{NAME}-2", False),
        (f"{AGENT_USER}x", False),
        (AGENT_USER.upper(), False),
        (f"system:serviceaccounts:{NAMESPACE}", False),  # the group name, not a user
        (f"system:node:{OWN_NODE}", False),
        ("kubernetes-admin", False),
        ("system:kube-controller-manager", False),
    ],
)
def test_match_condition_selects_exactly_the_agents_service_accounts(username: str, selected: bool) -> None:
    (condition,) = POLICY["spec"]["matchConditions"]
    request = admission_request(annotations_patch(), user=username)
    result = program(condition["expression"]).evaluate({"request": celpy.json_to_cel(request)})
    assert isinstance(result, celtypes.BoolType) and bool(result) is selected
    for account in (SERVICE_ACCOUNT, DELIVER_SERVICE_ACCOUNT):
        assert f"system:serviceaccount:{account['metadata']['namespace']}:{account['metadata']['name']}" in (
            AGENT_USER, DELIVER_USER)


@pytest.mark.parametrize(
    ("user", "change", "sub_resource"),
    [
        (f"system:node:{OWN_NODE}", edit(lambda n: n["status"]["capacity"].update({GPU: "7"})), "status"),
        ("kubernetes-admin", set_label("nvidia.com/gpu.product", "x"), ""),
        ("kubernetes-admin", annotations_patch(**{"example.com/owner": "me"}), ""),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:gpu-topology-extender", edit(
            lambda n: n["spec"].update(unschedulable=True)), ""),
    ],
    ids=["kubelet status", "admin label", "admin annotation", "another service account's cordon"],
)
def test_policy_leaves_everyone_else_alone(user: str, change: Callable[[Doc], Doc], sub_resource: str) -> None:
    verdict = admit(admission_request(change, user=user, extra={}, sub_resource=sub_resource))
    assert not verdict.applies and verdict.allowed


def test_policy_is_not_consulted_for_other_resources_or_operations() -> None:
    request = admission_request(annotations_patch())
    assert matches_constraints(request)
    assert not matches_constraints({**request, "operation": "DELETE"})
    assert not matches_constraints({**request, "resource": {"group": "", "version": "v1", "resource": "pods"}})
    assert not matches_constraints({**request, "subResource": "proxy"})


def test_an_evaluation_error_denies() -> None:
    # failurePolicy Fail: a request the expressions cannot read (here, a Node without metadata.name) is refused,
    # not let through.
    broken = admission_request(annotations_patch())
    del broken["object"]["metadata"]["name"]
    verdict = admit(broken)
    assert verdict.applies and not verdict.allowed
    assert any(message.startswith("evaluation error") for message in verdict.messages)


def as_deliver_agent(request: Doc) -> Doc:
    """The same request, made by the deliver agent's ServiceAccount (its Pod-bound token, same node claim)."""
    changed = copy.deepcopy(request)
    changed["userInfo"]["username"] = DELIVER_USER
    changed["userInfo"]["groups"] = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                     "system:authenticated"]
    return changed


@pytest.mark.parametrize("case", ["state changed", "a new annotation of ours", "state removed"])
def test_the_deliver_agent_may_write_its_own_annotations_too(case: str) -> None:
    verdict = admit(as_deliver_agent(ALLOWED[case]))
    assert verdict.applies and verdict.allowed, verdict.messages


@pytest.mark.parametrize("case", ["another node's name in the claim", "no extra at all (a legacy Secret token)",
                                  "a label added", "cordoned", "a foreign annotation added", "a lookalike domain"])
def test_the_deliver_agent_is_confined_the_same_way(case: str) -> None:
    request, expected = DENIED[case]
    verdict = admit(as_deliver_agent(request))
    assert verdict.applies and not verdict.allowed
    for part in expected:
        assert any(part in message for message in verdict.messages), (part, verdict.messages)
