"""The node reporter's manifests: its DaemonSet, namespace, RBAC and the ValidatingAdmissionPolicy that confines it.

- Every object validates strictly against the official Kubernetes 1.36 schemas (kubernetes-validate); the
  parametrized schema test of tests/test_manifests.py covers them too, as it covers every file in scheduler-config/.
- The DaemonSet, the namespace and the RBAC are read field by field against what the reporter needs and no more.
- The policy's CEL is not re-implemented here: every expression is taken from reporter-policy.yaml as it is,
  compiled with cel-python (a CEL implementation from PyPI) and evaluated against realistic AdmissionRequests and
  Nodes, in the order the API server applies a ValidatingAdmissionPolicy: matchConstraints, matchConditions,
  variables, validations (failurePolicy Fail: an evaluation error denies). The expressions keep to portable CEL,
  and a test checks that they call no function outside that subset, so cel-python and Kubernetes agree on them.
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
from celpy import celtypes
from kube_api_server import merge_patch  # RFC 7386, as the API server applies the reporter's PATCH
from manifest_checks import (
    CONFIG,
    KUBERNETES_VERSION,
    ROOT,
    Doc,
    container,
    documents,
    flag_values,
    flatten_rules,
    load_yaml,
    obj,
    quantity,
)

REPORTER_FILES = ("reporter-namespace.yaml", "reporter-rbac.yaml", "reporter.yaml", "reporter-policy.yaml")
NAMESPACE = "gpu-topology-node"
EXTENDER_NAMESPACE = "gpu-topology-system"
NAME = "gpu-topology-reporter"
POLICY_NAME = "gpu-topology-reporter-own-node-annotations"
GPU = "nvidia.com/gpu"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"

REPORTER = obj("DaemonSet", NAME, NAMESPACE)
POD = REPORTER["spec"]["template"]["spec"]
MAIN = container(REPORTER)
FLAGS = flag_values(MAIN["args"])
SERVICE_ACCOUNT = obj("ServiceAccount", NAME, NAMESPACE)
POLICY = obj("ValidatingAdmissionPolicy", POLICY_NAME)
BINDING = obj("ValidatingAdmissionPolicyBinding", POLICY_NAME)
EXTENDER = obj("Deployment", "gpu-topology-extender", EXTENDER_NAMESPACE)
REPORTER_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"  # k8s.io/apiserver/pkg/authentication/serviceaccount


# ---------------------------------------------------------------------------------------------------------------
# Schemas and kustomize
# ---------------------------------------------------------------------------------------------------------------


def test_every_reporter_object_validates_strictly_against_the_official_schema() -> None:
    kinds = []
    for file in REPORTER_FILES:
        for doc in load_yaml(CONFIG / file):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            kinds.append(doc["kind"])
    assert sorted(kinds) == sorted([
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
    ])


def test_strict_validation_covers_the_admission_policy() -> None:
    broken = copy.deepcopy(BINDING)
    broken["spec"]["validationAction"] = broken["spec"].pop("validationActions")  # a plausible typo
    with pytest.raises(kubernetes_validate.ValidationError, match="validationAction"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_installs_the_reporter_with_the_extenders_image() -> None:
    (kustomization,) = load_yaml(CONFIG / "kustomization.yaml")
    assert set(REPORTER_FILES) <= set(kustomization["resources"])
    (image,) = kustomization["images"]
    assert MAIN["image"] == container(EXTENDER)["image"]
    assert MAIN["image"].split(":")[0] == image["name"]  # so `images:` rewrites the reporter's image too


# ---------------------------------------------------------------------------------------------------------------
# The DaemonSet
# ---------------------------------------------------------------------------------------------------------------


def test_daemonset_runs_on_gpu_nodes_only_and_tolerates_their_taint() -> None:
    terms = POD["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # One label per term: terms are ORed, the expressions inside one term are ANDed.
    selected = set()
    for term in terms:
        assert set(term) == {"matchExpressions"}
        (expression,) = term["matchExpressions"]
        assert (expression["operator"], expression["values"]) == ("In", ["true"])
        selected.add(expression["key"])
    assert selected == {
        "nvidia.com/gpu.present",
        "feature.node.kubernetes.io/pci-10de.present",
        "feature.node.kubernetes.io/pci-0302_10de.present",
        "feature.node.kubernetes.io/pci-0300_10de.present",
    }
    assert "nodeSelector" not in POD  # it would AND with the affinity
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in POD["tolerations"]
    assert POD["priorityClassName"] == "system-node-critical"


def test_daemonset_mounts_only_the_pod_resources_directory_read_only() -> None:
    host_paths = [volume for volume in POD["volumes"] if "hostPath" in volume]
    (volume,) = host_paths
    assert volume["hostPath"] == {"path": POD_RESOURCES_DIR, "type": "Directory"}
    (mount,) = [m for m in MAIN["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True and mount["mountPath"] == POD_RESOURCES_DIR
    # The socket the reporter dials is inside that mount.
    assert Path(FLAGS["--socket"]).parent.as_posix() == mount["mountPath"]
    assert FLAGS["--socket"] == f"{POD_RESOURCES_DIR}/kubelet.sock"


def test_daemonset_has_requests_and_limits_and_takes_no_gpu() -> None:
    resources = MAIN["resources"]
    for name in ("cpu", "memory"):
        assert 0 < quantity(resources["requests"][name]) <= quantity(resources["limits"][name]), name
    assert GPU not in resources["requests"] and GPU not in resources["limits"]
    # NVML comes from the NVIDIA runtime instead: all device nodes, NVML's "utility" libraries, no CUDA.
    env = {item["name"]: item for item in MAIN["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert POD["runtimeClassName"] == "nvidia"


def test_daemonset_is_root_for_the_socket_but_otherwise_unprivileged() -> None:
    security = POD["securityContext"]
    # The kubelet's socket is root:root 0755 in a 0750 directory: only uid 0 may connect (reporter.yaml).
    assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (0, 0, False)
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(POD)
    own = MAIN["securityContext"]
    assert own["privileged"] is False
    assert own["allowPrivilegeEscalation"] is False
    assert own["readOnlyRootFilesystem"] is True
    assert own["capabilities"] == {"drop": ["ALL"]}


def test_daemonset_command_line_matches_the_extender_and_the_policy() -> None:
    assert MAIN["command"] == ["gpu-topology-agent"]
    known = {"--in-cluster", "--node-name", "--socket", "--interval", "--heartbeat", "--annotation-prefix",
             "--gpu-resource", "--log-level"}
    assert set(FLAGS) <= known, set(FLAGS) - known
    assert FLAGS["--in-cluster"] == ""
    # --node-name comes from the downward API.
    assert FLAGS["--node-name"] == "$(NODE_NAME)"
    env = {item["name"]: item for item in MAIN["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    extender = flag_values(container(EXTENDER)["args"][1:])
    assert FLAGS["--annotation-prefix"] == extender["--annotation-prefix"]
    assert FLAGS["--annotation-prefix"] + "/" == policy_prefix()
    assert FLAGS["--gpu-resource"] == extender["--gpu-resource"] == GPU
    # The heartbeat refreshes the state well before the extender calls it stale.
    assert 0 < float(FLAGS["--interval"]) < float(FLAGS["--heartbeat"]) < float(extender["--stale-after"])


def test_daemonset_serves_nothing_and_has_no_probes() -> None:
    # The reporter has no port; an exec probe could only see that the process exists (reporter.yaml).
    assert "ports" not in MAIN
    assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(MAIN)


def test_daemonset_runs_as_the_reporters_service_account_with_its_token() -> None:
    assert POD["serviceAccountName"] == SERVICE_ACCOUNT["metadata"]["name"]
    assert POD.get("automountServiceAccountToken", True) is True
    assert SERVICE_ACCOUNT.get("automountServiceAccountToken", True) is True
    assert REPORTER["spec"]["selector"]["matchLabels"].items() <= REPORTER["spec"]["template"]["metadata"][
        "labels"].items()


def test_the_reporters_console_script_accepts_the_daemonsets_flags() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("scripts", {})
    # The script's own entry point ("module:function"), run from the source tree, so no reinstall is needed.
    module, function = scripts["gpu-topology-agent"].split(":")
    run = f"import sys; from {module} import {function} as main; sys.exit(main())"
    result = subprocess.run([sys.executable, "-c", run, "--help"], cwd=ROOT, check=False, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    for flag in FLAGS:
        assert flag in result.stdout, flag


# ---------------------------------------------------------------------------------------------------------------
# Namespace (Pod Security) and RBAC
# ---------------------------------------------------------------------------------------------------------------


def test_reporter_lives_in_its_own_namespace_because_pod_security_requires_it() -> None:
    reporter_ns = obj("Namespace", NAMESPACE)["metadata"]["labels"]
    extender_ns = obj("Namespace", EXTENDER_NAMESPACE)["metadata"]["labels"]
    # Pod Security Standards: "baseline" forbids hostPath volumes, "restricted" also requires runAsNonRoot.
    # The reporter needs both, so gpu-topology-system (restricted) would reject its Pods.
    assert any("hostPath" in volume for volume in POD["volumes"])
    assert POD["securityContext"]["runAsNonRoot"] is False
    assert extender_ns["pod-security.kubernetes.io/enforce"] == "restricted"
    assert reporter_ns["pod-security.kubernetes.io/enforce"] == "privileged"
    # Nothing else runs there.
    workloads = {(doc["kind"], doc["metadata"]["name"]) for _, doc in documents()
                 if doc.get("metadata", {}).get("namespace") == NAMESPACE and doc["kind"] != "ServiceAccount"}
    assert workloads == {("DaemonSet", NAME)}


def test_reporter_rbac_is_exactly_get_and_patch_nodes() -> None:
    role = obj("ClusterRole", NAME)
    assert flatten_rules(role["rules"]) == {("", "nodes", "get", ()), ("", "nodes", "patch", ())}
    bindings = [doc for _, doc in documents() if doc.get("kind") in {"RoleBinding", "ClusterRoleBinding"}
                and any(subject.get("namespace") == NAMESPACE and subject["name"] == NAME
                        for subject in doc["subjects"])]
    (binding,) = bindings
    assert binding["kind"] == "ClusterRoleBinding"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]


# ---------------------------------------------------------------------------------------------------------------
# The ValidatingAdmissionPolicy: structure
# ---------------------------------------------------------------------------------------------------------------


def policy_prefix() -> str:
    (prefix,) = [v["expression"] for v in POLICY["spec"]["variables"] if v["name"] == "prefix"]
    match = re.fullmatch(r"'([^'\\]*)'", prefix)
    assert match, prefix
    return match[1]


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

CEL = celpy.Environment()
# Portable CEL: these are the only functions and macros the expressions may call. Kubernetes' CEL libraries
# (strings, lists, optionals, quantity, url, ip, authorizer, ...) are not in cel-python.
PORTABLE_CALLS = {"has", "all", "exists", "exists_one", "filter", "map", "size", "startsWith", "endsWith",
                  "contains", "string", "int"}


def policy_expressions() -> list[tuple[str, str]]:
    spec = POLICY["spec"]
    found = [(f"matchConditions/{c['name']}", c["expression"]) for c in spec["matchConditions"]]
    found += [(f"variables/{v['name']}", v["expression"]) for v in spec["variables"]]
    for i, validation in enumerate(spec["validations"]):
        found.append((f"validations/{i}", validation["expression"]))
        if "messageExpression" in validation:
            found.append((f"validations/{i}/messageExpression", validation["messageExpression"]))
    return found


EXPRESSIONS = policy_expressions()


def program(expression: str) -> Any:
    return CEL.program(CEL.compile(expression))


@pytest.mark.parametrize(("where", "expression"), EXPRESSIONS, ids=[where for where, _ in EXPRESSIONS])
def test_every_expression_compiles_with_cel_python_and_calls_only_portable_cel(where: str, expression: str) -> None:
    program(expression)
    without_strings = re.sub(r"'[^']*'", "''", expression)
    calls = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", without_strings))
    assert calls <= PORTABLE_CALLS, calls - PORTABLE_CALLS
    assert "[?" not in without_strings and ".?" not in without_strings  # no optional field or index syntax


COMPILED_CONDITIONS = [(c["name"], program(c["expression"])) for c in POLICY["spec"]["matchConditions"]]
COMPILED_VARIABLES = [(v["name"], program(v["expression"])) for v in POLICY["spec"]["variables"]]
COMPILED_VALIDATIONS = [
    (
        program(v["expression"]),
        v["message"],
        program(v["messageExpression"]) if "messageExpression" in v else None,
    )
    for v in POLICY["spec"]["validations"]
]


@dataclass
class Verdict:
    applies: bool
    messages: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.messages


def evaluate(compiled: Any, activation: dict[str, Any]) -> Any:
    """A CEL value, or the CELEvalError (cel-python raises some errors and returns others)."""
    try:
        return compiled.evaluate(activation)
    except celpy.CELEvalError as error:
        return error


def matches_constraints(request: Doc) -> bool:
    resource = request["resource"]["resource"] + (f"/{request['subResource']}" if request.get("subResource") else "")
    for rule in POLICY["spec"]["matchConstraints"]["resourceRules"]:
        if (request["resource"]["group"] in rule["apiGroups"] and request["resource"]["version"] in rule["apiVersions"]
                and request["operation"] in rule["operations"] and resource in rule["resources"]):
            return True
    return False


def admit(request: Doc) -> Verdict:
    """The policy applied to one AdmissionRequest as the API server applies it (with validationActions Deny)."""
    if not matches_constraints(request):
        return Verdict(applies=False)
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel(request),
        "object": celpy.json_to_cel(request["object"]),
        "oldObject": celpy.json_to_cel(request["oldObject"]),
    }
    for name, condition in COMPILED_CONDITIONS:
        result = evaluate(condition, activation)
        if isinstance(result, celpy.CELEvalError):  # failurePolicy: Fail
            return Verdict(applies=True, messages=[f"matchCondition {name}: {result}"])
        if not result:
            return Verdict(applies=False)
    variables: dict[celtypes.StringType, Any] = {}
    for name, variable in COMPILED_VARIABLES:
        activation["variables"] = celtypes.MapType(variables)
        variables[celtypes.StringType(name)] = evaluate(variable, activation)
    activation["variables"] = celtypes.MapType(variables)
    messages = []
    for expression, message, message_expression in COMPILED_VALIDATIONS:
        result = evaluate(expression, activation)
        if isinstance(result, celpy.CELEvalError) or not isinstance(result, celtypes.BoolType):
            messages.append(f"evaluation error: {result}")  # failurePolicy: Fail
        elif not result:
            built = evaluate(message_expression, activation) if message_expression is not None else None
            # The API server falls back to `message` when messageExpression fails or is empty.
            messages.append(str(built) if isinstance(built, str) and built else message)
    return Verdict(applies=True, messages=messages)


# A GPU node as the API server holds it (kubectl get node -o json, trimmed), before the reporter's write.
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
            {"manager": "gpu-topology-reporter", "operation": "Update", "apiVersion": "v1",
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
# The same node before the reporter's first write: no annotations of ours, and none at all (the API server leaves
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


def admission_request(change: Callable[[Doc], Doc], *, user: str = REPORTER_USER,
                      extra: dict[str, list[str]] | None = None, old: Doc = NODE, sub_resource: str = "") -> Doc:
    """The AdmissionRequest of one write to a Node; `change` turns the stored Node into the Node after it."""
    new = change(old)
    # What the API server itself changes on every write before admission: the managedFields entry of the writer.
    new = copy.deepcopy(new)
    new["metadata"]["managedFields"][-1]["time"] = "2026-01-12T09:00:35Z"
    user_info: Doc = {"username": user, "uid": "0b8e0c2d-6a59-4d3f-9c1e-5b7a2f4d8e10",
                      "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                 "system:authenticated"]}
    if extra is None and user == REPORTER_USER:
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
    # Status (through nodes/status, which the reporter is not granted either).
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
def test_policy_allows_the_reporter_its_own_annotations_on_its_own_node(case: str) -> None:
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
        f"gpu-topology-reporter may add or change only annotations under {policy_prefix()}, not example.com/owner"
    ]


@pytest.mark.parametrize(
    ("username", "selected"),
    [
        (REPORTER_USER, True),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:gpu-topology-extender", False),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:{NAME}", False),  # same name, another namespace
        (f"system:serviceaccount:{NAMESPACE}:default", False),
        (f"system:serviceaccount:{NAMESPACE}:{NAME}-2", False),
        (f"{REPORTER_USER}x", False),
        (REPORTER_USER.upper(), False),
        (f"system:serviceaccounts:{NAMESPACE}", False),  # the group name, not a user
        (f"system:node:{OWN_NODE}", False),
        ("kubernetes-admin", False),
        ("system:kube-controller-manager", False),
    ],
)
def test_match_condition_selects_exactly_the_reporters_service_account(username: str, selected: bool) -> None:
    (condition,) = POLICY["spec"]["matchConditions"]
    request = admission_request(annotations_patch(), user=username)
    result = program(condition["expression"]).evaluate({"request": celpy.json_to_cel(request)})
    assert isinstance(result, celtypes.BoolType) and bool(result) is selected
    assert REPORTER_USER == f"system:serviceaccount:{SERVICE_ACCOUNT['metadata']['namespace']}:" \
                            f"{SERVICE_ACCOUNT['metadata']['name']}"


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
