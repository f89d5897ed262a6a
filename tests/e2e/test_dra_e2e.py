"""End to end, DRA nodes (issue 30): a real kube-apiserver and kube-scheduler (v1.36), NVIDIA's DeviceClass with
`extendedResourceName: nvidia.com/gpu` (KEP-5004, beta and on by default), and NVIDIA-shaped ResourceSlices for
two 8 x RTX A6000 nodes (NVLink bridges on pairs 0-1, 2-3, 4-5, 6-7), their devices listed in a shuffled order as
NVIDIA's driver lists them. The nodes have no nvidia.com/gpu in their allocatable: kube-scheduler's DRA plugin
allocates every GPU, first-fit over the slice's order, in a claim it makes for each pod.

Node dra-0 lists gpu-0 then gpu-5, so its first fit for 2 GPUs crosses sockets over PCIe; dra-1 lists 4, 5, 0, 1,
2, 3, 6, 7, so each of its first fits is an NVLink pair. Pods asking `nvidia.com/gpu: 2` must land on dra-1, four
of them, each given exactly the pair the extender predicted; the fifth waits out its topology wait (5 s here) and
lands on dra-0. No device is allocated twice, and the extender counts each node as its claims do.

Runs only with real binaries (KUBE_BIN_DIR, as test_scheduling_e2e.py); otherwise the module is one skip.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
import time
from typing import Any

import pytest
from extender.demo.dra_objects import gpu_device, gpu_slice
from kube_e2e import Cluster, ClusterSpec, find_kube_binaries, gpu_pod, skip_reason, wait_until
from test_groups_e2e import empty, node_of

from extender.api.dra import EXTENDED_RESOURCE_CLAIM, GPU_CLASS, GPU_DRIVER

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

PLATFORM = "rtx-a6000-pairs"
ORDERS = {"dra-0": (0, 5, 1, 2, 3, 4, 6, 7), "dra-1": (4, 5, 0, 1, 2, 3, 6, 7)}
WAIT = 5
CLUSTER_SPEC = ClusterSpec(nodes={name: PLATFORM for name in ORDERS}, dra_nodes=frozenset(ORDERS),
                           extender_args=("--topology-wait", str(WAIT)))
RESOURCE = ("resource.k8s.io", "v1")
DEVICE_CLASS = {
    "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": GPU_CLASS},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{GPU_DRIVER}' && "
                                                  f"device.attributes['{GPU_DRIVER}'].type == 'gpu'"}}],
             "extendedResourceName": "nvidia.com/gpu"}}


def _publish(cluster: Cluster, orders: Mapping[str, Sequence[int]] = ORDERS) -> None:
    """NVIDIA's chart's DeviceClass, and each node's slice as its kubelet plugin would publish it."""
    cluster.kube.create_cluster_object(*RESOURCE, "deviceclasses", DEVICE_CLASS)
    for node, order in orders.items():
        uuids = [gpu.uuid or "" for gpu in cluster.topologies[node].gpus]
        devices = [gpu_device(index, uuids[index]) for index in order]
        cluster.kube.create_cluster_object(*RESOURCE, "resourceslices", gpu_slice(node, (), seed=None,
                                                                                  devices=devices))


def _allocations(cluster: Cluster) -> dict[str, tuple[str, list[str]]]:
    """Each pod's KEP-5004 claim, as kube-scheduler wrote it: pod name -> (node, devices allocated)."""
    found: dict[str, tuple[str, list[str]]] = {}
    for claim in cluster.kube.list_objects(*RESOURCE, "resourceclaims"):
        metadata = claim["metadata"]
        if (metadata.get("annotations") or {}).get(EXTENDED_RESOURCE_CLAIM) != "true":
            continue
        owner = next(ref["name"] for ref in metadata.get("ownerReferences") or [] if ref.get("kind") == "Pod")
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
        if results:
            found[owner] = (results[0]["pool"], [result["device"] for result in results])
    return found


def _pods(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {pod["metadata"]["name"]: pod for pod in cluster.kube.list_pods(cluster.namespace)}


def test_kep_5004_pods_land_where_the_first_fit_is_an_nvlink_pair_and_get_the_pair_predicted(
        spec_cluster: Cluster) -> None:
    cluster = spec_cluster
    empty(cluster)
    _publish(cluster)
    time.sleep(2)  # the extender's watches deliver the slices
    expected = {"pair-0": ("dra-1", ["gpu-4", "gpu-5"]), "pair-1": ("dra-1", ["gpu-0", "gpu-1"]),
                "pair-2": ("dra-1", ["gpu-2", "gpu-3"]), "pair-3": ("dra-1", ["gpu-6", "gpu-7"])}
    for name in expected:
        cluster.kube.create_pod(gpu_pod(name, 2, scheduler=cluster.scheduler_name, namespace=cluster.namespace))
        wait_until(lambda name=name: node_of(_pods(cluster).get(name, {})) and name in _allocations(cluster), 60,
                   f"{name} bound and allocated", watch=cluster.processes.values())
    assert _allocations(cluster) == expected
    started = time.monotonic()
    cluster.kube.create_pod(gpu_pod("crossed", 2, scheduler=cluster.scheduler_name, namespace=cluster.namespace))
    wait_until(lambda: "crossed" in _allocations(cluster), 60 + WAIT, "the fifth pod allocated",
               watch=cluster.processes.values())
    assert time.monotonic() - started >= WAIT - 1  # it waited for a pair before it took the crossed first fit
    assert _allocations(cluster)["crossed"] == ("dra-0", ["gpu-0", "gpu-5"])
    taken = [(node, device) for node, devices in _allocations(cluster).values() for device in devices]
    assert len(taken) == len(set(taken)) == 10
    wait_until(lambda: cluster.extender_metric("gpu_topology_extender_dra_free_gpus") == 16 - 10, 30,
               "the extender counting the DRA nodes as their claims do", watch=cluster.processes.values())
    assert cluster.extender_metric("gpu_topology_extender_nodes_by_class", **{"class": "dra-gpu"}) == 2
