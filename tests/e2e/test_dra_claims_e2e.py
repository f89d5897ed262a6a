"""End to end, pods that ask for GPUs through a ResourceClaimTemplate (issue 30): real kube-apiserver,
kube-scheduler and kube-controller-manager's resourceclaim-controller (v1.36), the shipped scheduler configuration,
and scheduler-config/dra-claims-policy.yaml applied as it ships.

Such a pod has no nvidia.com/gpu. The MutatingAdmissionPolicy marks it with gpu-topology.io/dra-claims, which the
scheduler configuration lists among the extender's managedResources, so kube-scheduler sends it to the extender;
the controller makes its claim from the template; the extender counts the claim's 2 GPUs and picks the node whose
DRA first fit is an NVLink pair (the nodes of test_dra_e2e.py: dra-0's first fit crosses sockets, dra-1's are
pairs). Each pod gets exactly the pair predicted, and the extender counts the nodes as the claims do.

Runs only with real binaries (KUBE_BIN_DIR, as test_scheduling_e2e.py); otherwise the module is one skip.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kube_e2e import ROOT, Cluster, ClusterSpec, find_kube_binaries, gpu_pod, skip_reason, wait_until
from test_dra_e2e import ORDERS, PLATFORM, RESOURCE, WAIT, _publish
from test_groups_e2e import empty, node_of

from extender.api.dra import CLAIMS_MARKER, GPU_CLASS

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

CLUSTER_SPEC = ClusterSpec(nodes={name: PLATFORM for name in ORDERS}, dra_nodes=frozenset(ORDERS),
                           extender_args=("--topology-wait", str(WAIT)), controllers=("resourceclaim-controller",))
POLICY = ROOT / "scheduler-config" / "dra-claims-policy.yaml"
TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "two-gpus"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": 2}}]}}}}


def _claim_pod(cluster: Cluster, name: str) -> dict[str, Any]:
    """A pod with no nvidia.com/gpu: its container uses the claim its template makes."""
    pod = gpu_pod(name, 1, scheduler=cluster.scheduler_name, namespace=cluster.namespace)
    container = pod["spec"]["containers"][0]
    container["resources"] = {"requests": {"cpu": "100m", "memory": "64Mi"}, "claims": [{"name": "gpus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}]
    return pod


def _claims(cluster: Cluster) -> dict[str, tuple[str, list[str]]]:
    """Each pod's allocated claim: pod name -> (node, devices), by the claim's owner."""
    found: dict[str, tuple[str, list[str]]] = {}
    for claim in cluster.kube.list_objects(*RESOURCE, "resourceclaims"):
        owners = [ref["name"] for ref in claim["metadata"].get("ownerReferences") or [] if ref.get("kind") == "Pod"]
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        if owners and results:
            found[owners[0]] = (results[0]["pool"], [result["device"] for result in results])
    return found


def test_claim_template_pods_reach_the_extender_and_get_the_nvlink_pair_it_predicted(spec_cluster: Cluster) -> None:
    cluster = spec_cluster
    empty(cluster)
    for document in yaml.safe_load_all(POLICY.read_text()):
        plural = "mutatingadmissionpolicies" if document["kind"] == "MutatingAdmissionPolicy" else \
            "mutatingadmissionpolicybindings"
        cluster.kube.create_cluster_object("admissionregistration.k8s.io", "v1", plural, document)
    _publish(cluster)
    cluster.kube.create_namespaced_object(*RESOURCE, cluster.namespace, "resourceclaimtemplates", TEMPLATE)

    def marked() -> bool:  # the policy takes effect once the API server has loaded it
        probe = cluster.kube.create_pod({**_claim_pod(cluster, "probe"), "spec": {
            **_claim_pod(cluster, "probe")["spec"], "schedulerName": "no-such-scheduler"}})
        cluster.kube.delete_pod("probe", cluster.namespace)
        limits = probe["spec"]["containers"][0]["resources"].get("limits") or {}
        return limits.get(CLAIMS_MARKER) == "1"

    wait_until(marked, 30, "the MutatingAdmissionPolicy marking claim pods", watch=cluster.processes.values())
    expected = {"claim-0": ("dra-1", ["gpu-4", "gpu-5"]), "claim-1": ("dra-1", ["gpu-0", "gpu-1"])}
    for name in expected:
        cluster.kube.create_pod(_claim_pod(cluster, name))
        wait_until(lambda name=name: name in _claims(cluster) and node_of(
            {pod["metadata"]["name"]: pod for pod in cluster.kube.list_pods(cluster.namespace)}.get(name, {})),
            60, f"{name} bound and allocated", watch=cluster.processes.values())
    assert {name: _claims(cluster)[name] for name in expected} == expected
    pod = cluster.kube.get_pod("claim-0", cluster.namespace)
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {CLAIMS_MARKER: "1"}
    assert cluster.extender_metric("gpu_topology_extender_decisions_total", verb="bind", outcome="bound") >= 2
    assert cluster.extender_metric("gpu_topology_extender_dra_mispredicted_total") == 0  # the first fit, as judged
    wait_until(lambda: cluster.extender_metric("gpu_topology_extender_dra_free_gpus") == 16 - 4, 30,
               "the extender counting the claims", watch=cluster.processes.values())


def test_a_claim_pinned_by_uuid_gets_exactly_its_gpus_through_the_extender_without_waiting(
        spec_cluster: Cluster) -> None:
    """A claim whose selector names two GPUs by UUID (the pin a planner would write) on dra-0, whose first fit is
    the crossed 0 and 5: kube-scheduler's allocator gives exactly the pinned pair, and the extender, which reads
    the pin, passes dra-0 at once instead of waiting for a full-bandwidth first fit there."""
    cluster = spec_cluster
    uuids = [gpu.uuid or "" for gpu in cluster.topologies["dra-0"].gpus]
    expression = f"device.attributes['{GPU_CLASS}'].uuid in ['{uuids[2]}', '{uuids[3]}']"
    cluster.kube.create_namespaced_object(*RESOURCE, cluster.namespace, "resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "pinned"},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": GPU_CLASS, "count": 2, "selectors": [{"cel": {"expression": expression}}]}}]}}})
    bound = cluster.extender_metric("gpu_topology_extender_decisions_total", verb="bind", outcome="bound")
    pod = _claim_pod(cluster, "pinned-pod")
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimName": "pinned"}]
    cluster.kube.create_pod(pod)

    def pinned() -> list[str] | None:
        for claim in cluster.kube.list_objects(*RESOURCE, "resourceclaims"):
            if claim["metadata"]["name"] == "pinned":
                results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results")
                return [f"{result['pool']}/{result['device']}" for result in results or []] or None
        return None

    assert wait_until(pinned, WAIT - 1, "the pinned claim allocated before a topology wait could pass",
                      watch=cluster.processes.values()) == ["dra-0/gpu-2", "dra-0/gpu-3"]
    wait_until(lambda: cluster.extender_metric("gpu_topology_extender_decisions_total", verb="bind",
                                               outcome="bound") == bound + 1, 30, "the extender's bind",
               watch=cluster.processes.values())
