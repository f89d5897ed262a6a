"""scheduler-config/'s manifests on a real control plane: what only the API server itself can say about them.

A control plane of its own for this module: etcd, kube-apiserver and kube-controller-manager running only the
controller that type-checks ValidatingAdmissionPolicies (no Deployment, ReplicaSet or disruption controller, so no
controller writes a status that would move an object's resourceVersion between two applies). Objects are applied
with the real kubectl from KUBE_BIN_DIR, as README.md says to:

- every admission policy we ship is accepted, and each ValidatingAdmissionPolicy's `status.typeChecking` (the API
  server's type check of its CEL against the schemas of what it matches) is empty;
- the agent's policy enforces on the real API server what tests/manifests/test_agent_manifests.py shows with
  cel-python: the agent's own annotations on its own Node pass, the rest is denied with its message;
- a second `kubectl apply -k scheduler-config/` changes nothing: server-side (README.md's command) no object's
  resourceVersion moves and no line says `configured`; client-side, only the PodDisruptionBudget is reported
  `configured` (kubectl's three-way patch always carries its selector, whose patch strategy is `replace`) and the
  API server changes nothing there either;
- the MutatingAdmissionPolicy of scheduler-name-policy.yaml gives a GPU pod created in a labelled namespace our
  scheduler, and leaves every other pod alone;
- with two real kubelets (kubelets.py: each its fake runtime and our agent; root, and `kubelet` and `fakecri` in
  KUBE_BIN_DIR, else those two tests skip), kube-scheduler and the Deployment, ReplicaSet, quota and disruption
  controllers: the extender installed as README.md says (make-certs.sh's Secrets) runs a replica on each node,
  `kubectl rollout restart` completes with a replica ready throughout, a drain evicts one replica, a drain of the
  other node then waits on the budget until the first is uncordoned, and the surge strategy extender.yaml had
  stalls on the anti-affinity.

kubectl runs with --validate=false: its own schema check fetches the API server's OpenAPI v2, which the v1.36.2
kube-apiserver built for these tests fails to serve (503, "$root has invalid property: Extensions" in its log). The
manifests are validated strictly against the 1.36 schemas in tests/manifests.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import pytest
import yaml
from kube_e2e import (
    ROOT,
    ControlPlane,
    find_kube_binaries_and_kubectl,
    skip_reason,
    start_control_plane,
    wait_until,
)
from kubelets import (
    EXTENDER_NAMESPACE,
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

CONFIG = ROOT / "scheduler-config"
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy",
                "MutatingAdmissionPolicyBinding")
# The optional files that need no CRD (kustomization.yaml lists them commented out).
OPTIONAL_WITHOUT_CRDS = ("dra-claims-policy.yaml", "dra-pin-webhook.yaml", "scheduler-name-policy.yaml")
AGENT = "system:serviceaccount:gpu-topology-node:gpu-topology-agent"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"
GPU_SCHEDULER = "gpu-topology-scheduler"
OPT_IN = {"gpu-topology.io/scheduler": "enabled"}

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    binaries, kubectl, problem = find_kube_binaries_and_kubectl()
    if problem is not None:
        pytest.skip(skip_reason(problem))
    assert binaries is not None and kubectl is not None
    with ExitStack() as stack:
        yield start_control_plane(binaries, kubectl, tmp_path_factory.mktemp("manifests-e2e"), stack,
                                  ["validatingadmissionpolicy-status-controller"])


def documents(file: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all((CONFIG / file).read_text()) if doc]


def type_checked(plane: ControlPlane, names: set[str] | None = None) -> list[Doc]:
    """The ValidatingAdmissionPolicies (those named, or all), once the controller has type-checked the generation of
    each: until then its status write would still move their resourceVersions."""
    def checked() -> tuple[list[Doc]] | None:
        items = [item for item in plane.get_json("validatingadmissionpolicies")["items"]
                 if names is None or item["metadata"]["name"] in names]
        done = (names is None or len(items) == len(names)) and all(
            (item.get("status") or {}).get("observedGeneration") == item["metadata"]["generation"] for item in items)
        return (items,) if done else None

    (items,) = wait_until(checked, 60, "the type check of every ValidatingAdmissionPolicy", interval=1.0)
    return items


def object_versions(plane: ControlPlane, *sources: str) -> dict[str, str]:
    """kind/namespace/name: resourceVersion of every object the sources (`-k DIR` or `-f FILE` arguments) name."""
    found = plane.get_json(*sources)
    items = found["items"] if "items" in found else [found]  # one object is not wrapped in a List
    return {f"{item['kind']}/{item['metadata'].get('namespace', '')}/{item['metadata']['name']}":
            item["metadata"]["resourceVersion"] for item in items}


# ---------------------------------------------------------------------------------------------------------------
# A second apply changes nothing
# ---------------------------------------------------------------------------------------------------------------

def test_a_second_client_side_apply_changes_nothing_but_reports_the_budget(control_plane: ControlPlane) -> None:
    """Client-side apply sends a three-way strategic merge patch. A list without a merge key (resourceRules) is
    replaced whole, so a field the API server defaults inside it (scope) and the manifest leaves out made every
    admission policy `configured` at every apply; the manifests now write it. The PodDisruptionBudget's selector has
    patch strategy `replace` (PodDisruptionBudgetSpec in k8s.io/api/policy/v1), so kubectl's patch always carries it
    and kubectl says `configured` although the API server changes nothing: README.md's command is server-side."""
    control_plane.apply("-k", str(CONFIG))
    type_checked(control_plane)
    before = object_versions(control_plane, "-k", str(CONFIG))
    second = control_plane.apply("-k", str(CONFIG))
    configured = [line for line in second if not line.endswith(" unchanged")]
    assert configured == ["poddisruptionbudget.policy/gpu-topology-extender configured"], second
    assert object_versions(control_plane, "-k", str(CONFIG)) == before


def test_a_second_server_side_apply_changes_nothing(control_plane: ControlPlane) -> None:
    control_plane.apply("--server-side", "-k", str(CONFIG))
    type_checked(control_plane)
    before = object_versions(control_plane, "-k", str(CONFIG))
    second = control_plane.apply("--server-side", "-k", str(CONFIG))
    assert len(second) == len(before) and not [line for line in second if "configured" in line], second
    assert object_versions(control_plane, "-k", str(CONFIG)) == before


@pytest.mark.parametrize("file", OPTIONAL_WITHOUT_CRDS)
def test_a_second_apply_of_an_optional_file_changes_nothing(control_plane: ControlPlane, file: str) -> None:
    control_plane.apply("-f", str(CONFIG / file))
    type_checked(control_plane)
    before = object_versions(control_plane, "-f", str(CONFIG / file))
    second = control_plane.apply("-f", str(CONFIG / file))
    assert all(line.endswith(" unchanged") for line in second), second
    assert object_versions(control_plane, "-f", str(CONFIG / file)) == before


# ---------------------------------------------------------------------------------------------------------------
# The admission policies type-check clean
# ---------------------------------------------------------------------------------------------------------------

def shipped_policies() -> list[Doc]:
    """Every admission policy and binding of every file, the optional ones (cert-manager.yaml's too) included."""
    return [doc for file in sorted(path.name for path in CONFIG.glob("*.yaml")) for doc in documents(file)
            if doc.get("kind") in POLICY_KINDS]


def test_every_admission_policy_is_accepted_and_type_checks_clean(control_plane: ControlPlane) -> None:
    policies = shipped_policies()
    validating = {doc["metadata"]["name"] for doc in policies if doc["kind"] == "ValidatingAdmissionPolicy"}
    mutating = {doc["metadata"]["name"] for doc in policies if doc["kind"] == "MutatingAdmissionPolicy"}
    assert len(validating) == 4 and len(mutating) == 2, (validating, mutating)
    # The API server compiles every expression at create and refuses one that does not compile.
    control_plane.apply("-f", "-", stdin=yaml.safe_dump_all(policies))

    items = type_checked(control_plane, validating)
    warnings = {item["metadata"]["name"]: item["status"].get("typeChecking") for item in items
                if (item["status"].get("typeChecking") or {}).get("expressionWarnings")}
    assert not warnings, json.dumps(warnings, indent=1)
    # A MutatingAdmissionPolicy has no status (admissionregistration.k8s.io/v1): accepted means compiled.
    present = {item["metadata"]["name"] for item in control_plane.get_json("mutatingadmissionpolicies")["items"]}
    assert mutating <= present


# ---------------------------------------------------------------------------------------------------------------
# The agent's policy, enforced by the real API server
# ---------------------------------------------------------------------------------------------------------------

def as_agent(node: str) -> list[str]:
    """kubectl's impersonation of the report agent's Pod-bound token on `node` (its node-name claim)."""
    return [f"--as={AGENT}", f"--as-user-extra={NODE_NAME_CLAIM}={node}"]


def test_the_agent_policy_enforces_on_the_api_server(control_plane: ControlPlane) -> None:
    control_plane.apply("-f", str(CONFIG / "agent-namespace.yaml"), "-f", str(CONFIG / "agent-rbac.yaml"),
                        "-f", str(CONFIG / "agent-policy.yaml"))
    control_plane.kubectl("create", "--validate=false", "-f", "-", stdin=json.dumps({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "gpu-node-1", "labels": {"kubernetes.io/hostname": "gpu-node-1"},
                     "annotations": {"example.com/owner": "ops"}}}))
    # The binding takes effect once the API server's policy informer has it: until the first denial.
    def enforcing() -> bool:
        return "may not change a Node's labels" in control_plane.kubectl(
            *as_agent("gpu-node-1"), "label", "node", "gpu-node-1", "x=y", check=False).stderr

    wait_until(enforcing, 30, "the agent policy enforcing", interval=1.0)
    allowed = control_plane.kubectl(*as_agent("gpu-node-1"), "annotate", "node", "gpu-node-1",
                                    "gpu-topology.io/state={}", check=False)
    assert allowed.returncode == 0, allowed.stderr
    denied = {
        "label": (as_agent("gpu-node-1") + ["label", "node", "gpu-node-1", "x=y"], "may not change a Node's labels"),
        "other node": (as_agent("gpu-node-2") + ["annotate", "--overwrite", "node", "gpu-node-1",
                                                 "gpu-topology.io/state=x"],
                       "its token is bound to node gpu-node-2, not to node gpu-node-1"),
        "foreign annotation": (as_agent("gpu-node-1") + ["annotate", "--overwrite", "node", "gpu-node-1",
                                                         "example.com/owner=me"],
                               "may add or change only annotations under gpu-topology.io/, not example.com/owner"),
        "cordon": (as_agent("gpu-node-1") + ["patch", "node", "gpu-node-1", "--type=merge",
                                             "-p", '{"spec":{"unschedulable":true}}'], "may not change a Node's spec"),
        "finalizer": (as_agent("gpu-node-1") + ["patch", "node", "gpu-node-1", "--type=merge",
                                                "-p", '{"metadata":{"finalizers":["example.com/keep"]}}'],
                      "may change only a Node's annotations"),
    }
    for case, (args, message) in denied.items():
        done = control_plane.kubectl(*args, check=False)
        assert done.returncode != 0 and message in done.stderr, (case, done.stderr)


# ---------------------------------------------------------------------------------------------------------------
# GPU pods sent to our scheduler
# ---------------------------------------------------------------------------------------------------------------

def pod(name: str, *, gpus: int = 0, init_gpus: int = 0, scheduler: str | None = None) -> Doc:
    def container(container_name: str, count: int) -> Doc:
        return {"name": container_name, "image": "registry.k8s.io/pause:3.10",
                "resources": {"limits": {"nvidia.com/gpu": str(count)}} if count else {}}
    spec: Doc = {"containers": [container("main", gpus)]}
    if init_gpus:
        spec["initContainers"] = [container("init", init_gpus)]
    if scheduler:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


PODS = {"gpu": pod("gpu", gpus=2), "init-gpu": pod("init-gpu", init_gpus=1), "cpu": pod("cpu"),
        "default-named": pod("default-named", gpus=1, scheduler="default-scheduler"),
        "groups": pod("groups", gpus=8, scheduler="gpu-topology-scheduler-groups"),
        "other": pod("other", gpus=1, scheduler="volcano")}


def created_schedulers(plane: ControlPlane, namespace: str, labels: dict[str, str]) -> dict[str, str]:
    plane.apply("-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": namespace, "labels": labels}}))
    # No service-account controller runs here: the ServiceAccount admission plugin wants the default one.
    plane.apply("-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "ServiceAccount",
                                             "metadata": {"name": "default", "namespace": namespace}}))
    for doc in PODS.values():
        plane.kubectl("create", "--validate=false", "-n", namespace, "-f", "-", stdin=json.dumps(doc))
    return {item["metadata"]["name"]: item["spec"]["schedulerName"]
            for item in plane.get_json("pods", "-n", namespace)["items"]}


def test_gpu_pods_in_a_labelled_namespace_get_our_scheduler(control_plane: ControlPlane) -> None:
    control_plane.apply("-f", str(CONFIG / "scheduler-name-policy.yaml"))
    probe = "scheduler-name-probe"
    # The binding takes effect once the API server's policy informer has it.
    created_schedulers(control_plane, probe, OPT_IN)

    def mutating() -> bool:
        control_plane.kubectl("delete", "pod", "-n", probe, "gpu", "--wait=false", check=False)
        control_plane.kubectl("create", "--validate=false", "-n", probe, "-f", "-", stdin=json.dumps(PODS["gpu"]))
        return control_plane.get_json("pod", "-n", probe, "gpu")["spec"]["schedulerName"] == GPU_SCHEDULER

    try:
        wait_until(mutating, 30, "the scheduler-name policy in force", interval=1.0)
        assert created_schedulers(control_plane, "gpu-team", OPT_IN) == {
            "gpu": GPU_SCHEDULER, "init-gpu": GPU_SCHEDULER, "default-named": GPU_SCHEDULER,
            "cpu": "default-scheduler", "groups": "gpu-topology-scheduler-groups", "other": "volcano"}
        assert set(created_schedulers(control_plane, "not-opted-in", {}).values()) == {
            "default-scheduler", "gpu-topology-scheduler-groups", "volcano"}
    finally:  # unbound, they go at once; a scheduler started later must find none of them
        for namespace in (probe, "gpu-team", "not-opted-in"):
            control_plane.kubectl("delete", "pods", "--all", "-n", namespace, "--wait=false", check=False)


# ---------------------------------------------------------------------------------------------------------------
# Two nodes for two replicas: a rollout and a drain finish (real kubelets, kubelets.py)
# ---------------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_nodes(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """The control plane with kube-scheduler, the rollout's controllers and two real kubelets (kubelets.py). Only
    these two nodes may host the extender, whose anti-affinity wants one replica on each."""
    with ExitStack() as stack:
        start_two_nodes(control_plane, stack)
        yield control_plane


def install_extender(plane: ControlPlane) -> None:
    """The extender as README.md installs it: the namespace, the Secrets make-certs.sh prints, its RBAC and
    Deployment."""
    plane.apply("--server-side", "-f", str(CONFIG / "namespace.yaml"))
    out = plane.workdir / "certs"
    made = subprocess.run(["bash", str(CONFIG / "make-certs.sh"), str(out)], capture_output=True, text=True,
                          timeout=120, check=True).stdout
    # The lines after "Create the Secrets (...):" and before option A's: three kubectl commands.
    commands = made.split("Create the Secrets", 1)[1].split("\n", 1)[1].split("Option A", 1)[0]
    subprocess.run(["bash", "-euo", "pipefail", "-c", commands], check=True, capture_output=True, text=True,
                   timeout=120, env={**os.environ, "KUBECONFIG": str(plane.kubeconfig),
                                     "PATH": f"{plane.kubectl_binary.parent}:{os.environ['PATH']}"})
    publish_root_ca(plane, EXTENDER_NAMESPACE)
    plane.apply("--server-side", "-f", str(CONFIG / "extender-rbac.yaml"), "-f", str(CONFIG / "extender.yaml"))


def test_a_rollout_and_a_drain_finish_on_two_nodes(two_nodes: ControlPlane) -> None:
    plane = two_nodes
    install_extender(plane)
    wait_both_ready(plane, "two extender replicas ready, one a node")
    restart_rolls_with_one_ready(plane)
    # A drain evicts one replica (the budget allows one while both are ready); its successor waits for a node.
    drained = plane.kubectl("drain", TWO_NODES[0], "--ignore-daemonsets", "--delete-emptydir-data",
                            "--timeout=120s", check=False)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    # A drain of the other node then waits on the budget (1 healthy, minAvailable 1), as README.md says ...
    blocked = plane.kubectl("drain", TWO_NODES[1], "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=20s",
                            check=False)
    assert blocked.returncode != 0 and "disruption budget" in blocked.stdout + blocked.stderr, blocked.stderr
    # ... until the first node is back and its replica with it.
    plane.kubectl("uncordon", TWO_NODES[0])
    wait_both_ready(plane, "the evicted replica back on its node")
    drained = plane.kubectl("drain", TWO_NODES[1], "--ignore-daemonsets", "--delete-emptydir-data",
                            "--timeout=120s", check=False)
    assert drained.returncode == 0, drained.stdout + drained.stderr
    plane.kubectl("uncordon", TWO_NODES[1])
    wait_both_ready(plane, "both replicas again")


def test_the_surge_strategy_it_replaces_stalls_there(two_nodes: ControlPlane) -> None:
    """maxSurge 1 / maxUnavailable 0, as extender.yaml had it: the surge Pod finds no node (anti-affinity) and no
    old replica goes. Put back, the manifest's strategy finishes the same rollout."""
    plane = two_nodes
    surge_stalls(plane)
    plane.apply("--server-side", "--force-conflicts", "-f", str(CONFIG / "extender.yaml"))
    done = rollout_status(plane, ROLLOUT_SECONDS)
    assert done.returncode == 0, done.stdout + done.stderr + extender_state(plane)
