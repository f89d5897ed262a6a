"""End to end, pinned claims on a non-uniform DRA board (issue 30, C1): real kube-apiserver, kube-scheduler and
kube-controller-manager v1.36, the extender with --pin-claims, scheduler-config/dra-pin-webhook.yaml and
dra-claims-policy.yaml applied as they ship (the webhook pointed at the local extender).

Both nodes are 8x RTX A6000 with NVLink bridges on pairs, their slices listing GPUs so that kube-scheduler's first
fit of two crosses sockets on each (0 and 5, then 1 and 2, ...). Pods made by generateName (no name at admission)
ask two GPUs through a ResourceClaimTemplate. The webhook names each pod's claim, the planner makes it pinned to an
NVLink pair, and kube-scheduler allocates exactly that pair: every pod's allocation is the set the extender chose,
no device is allocated twice, and the extender's free count equals what the claims leave.

Runs only with real binaries (KUBE_BIN_DIR, as test_scheduling_e2e.py); otherwise the module is one skip.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
import yaml
from kube_e2e import ROOT, Cluster, ClusterSpec, find_kube_binaries, gpu_pod, skip_reason, wait_until
from test_dra_e2e import PLATFORM, RESOURCE, _publish
from test_groups_e2e import empty

from extender.api.dra import GPU_CLASS, parse_claim
from extender.server.app import ADMISSION_PATH
from topology.annotations import AnnotationKeys

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

CROSSED = {"dra-0": (0, 5, 1, 2, 3, 4, 6, 7), "dra-1": (1, 6, 0, 3, 2, 5, 4, 7)}
CLUSTER_SPEC = ClusterSpec(nodes={name: PLATFORM for name in CROSSED}, dra_nodes=frozenset(CROSSED),
                           extender_args=("--pin-claims",), controllers=("resourceclaim-controller",),
                           webhook_client=True)
CONFIG = ROOT / "scheduler-config"
NVLINK_PAIRS = ({0, 1}, {2, 3}, {4, 5}, {6, 7})
PODS = 6
TEMPLATE = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "gpus-2"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": 2}}]}}}}


def _install(cluster: Cluster) -> None:
    """The marker policy and the pin webhook as shipped, the webhook's clientConfig pointed at this extender."""
    for document in yaml.safe_load_all((CONFIG / "dra-claims-policy.yaml").read_text()):
        plural = "mutatingadmissionpolicies" if document["kind"] == "MutatingAdmissionPolicy" else \
            "mutatingadmissionpolicybindings"
        cluster.kube.create_cluster_object("admissionregistration.k8s.io", "v1", plural, document)
    webhook = yaml.safe_load((CONFIG / "dra-pin-webhook.yaml").read_text())
    webhook["metadata"].pop("annotations")
    for hook in webhook["webhooks"]:
        hook["clientConfig"] = {"url": cluster.extender_url + ADMISSION_PATH,
                                "caBundle": base64.b64encode(cluster.pki.ca.read_bytes()).decode()}
    cluster.kube.create_cluster_object("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations", webhook)


def _pod(cluster: Cluster, name: str) -> dict[str, Any]:
    pod = gpu_pod(name, 1, scheduler=cluster.scheduler_name, namespace=cluster.namespace)
    pod["metadata"] = {"generateName": f"{name}-", "namespace": cluster.namespace}
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "100m", "memory": "64Mi"},
                                                 "claims": [{"name": "gpus"}]}
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": "gpus-2"}]
    return pod


def test_every_pinned_pod_is_allocated_the_nvlink_pair_the_extender_chose(spec_cluster: Cluster) -> None:
    cluster = spec_cluster
    empty(cluster)
    _install(cluster)
    _publish(cluster, CROSSED)
    cluster.kube.create_namespaced_object(*RESOURCE, cluster.namespace, "resourceclaimtemplates", TEMPLATE)
    key = AnnotationKeys().claim_templates

    def named() -> bool:  # the webhook takes effect once the API server has loaded it and the template is seen
        probe = cluster.kube.create_pod({**_pod(cluster, "probe"), "spec": {
            **_pod(cluster, "probe")["spec"], "schedulerName": "no-such-scheduler"}})
        cluster.kube.delete_pod(probe["metadata"]["name"], cluster.namespace)
        return (probe["metadata"].get("annotations") or {}).get(key) == "gpus=gpus-2"

    wait_until(named, 60, "the webhook naming template claims", watch=cluster.processes.values())
    made = [cluster.kube.create_pod(_pod(cluster, f"train{i}"))["metadata"]["name"] for i in range(PODS)]

    def claims() -> dict[str, dict[str, Any]]:
        return {claim["metadata"]["name"]: claim for claim in cluster.kube.list_objects(*RESOURCE, "resourceclaims")}

    def allocated() -> dict[str, dict[str, Any]] | None:
        pods = {pod["metadata"]["name"]: pod for pod in cluster.kube.list_pods(cluster.namespace)}
        found = claims()
        out = {}
        for name in made:
            claim_name = pods[name]["spec"]["resourceClaims"][0].get("resourceClaimName")
            claim = found.get(claim_name or "")
            if claim is None or not pods[name]["spec"].get("nodeName") or not (
                    (claim.get("status") or {}).get("allocation")):
                return None
            out[name] = {"pod": pods[name], "claim": claim}
        return out

    done = wait_until(allocated, 120, f"{PODS} pods bound with their pinned claims allocated",
                      watch=cluster.processes.values())
    given: list[tuple[str, str]] = []
    for name, found in done.items():
        pod, claim = found["pod"], found["claim"]
        assert pod["metadata"]["annotations"][key] == "gpus=gpus-2"
        assert claim["metadata"]["ownerReferences"][0]["uid"] == pod["metadata"]["uid"]
        pinned = parse_claim(claim).requests[0].pinned
        assert pinned, f"{name}: its claim is not pinned"
        results = claim["status"]["allocation"]["devices"]["results"]
        node = pod["spec"]["nodeName"]
        uuids = [gpu.uuid for gpu in cluster.topologies[node].gpus]
        devices = {int(result["device"].removeprefix("gpu-")) for result in results}
        assert {result["pool"] for result in results} == {node}
        assert {uuids[i] for i in devices} == pinned  # allocated exactly the set the extender chose
        assert devices in NVLINK_PAIRS  # an NVLink pair, where the first fit crosses sockets
        given += [(node, result["device"]) for result in results]
    assert len(given) == len(set(given)) == 2 * PODS  # no device allocated twice
    wait_until(lambda: cluster.extender_metric("gpu_topology_extender_dra_free_gpus") == 16 - 2 * PODS, 30,
               "the extender counting the claims", watch=cluster.processes.values())
