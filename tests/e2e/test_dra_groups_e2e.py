"""End to end, groups on GB200 trays where DRA hands out the GPUs (issue 30): a real kube-apiserver and
kube-scheduler (v1.36), NVIDIA's DeviceClass with `extendedResourceName: nvidia.com/gpu`, and three NVLink domains:
a and b of 4 DRA trays each (their GPUs published in shuffled ResourceSlices, none in allocatable), and c of 2 trays
whose GPUs the device plugin serves while a ComputeDomain driver publishes their IMEX channels (the common GB200
setup).

A 1-GPU pod on a00 leaves domain a 3 whole trays. A required group of 4 trays must then land whole in domain b,
each member given a whole tray by kube-scheduler's allocator; a group of 2 trays lands whole in c, the domain it
fills exactly, through the device plugin's path (our bind's GPUs). The extender classes the nodes as they are, and
counts the DRA trays' free GPUs as their claims do.

Runs only with real binaries (KUBE_BIN_DIR, as test_scheduling_e2e.py); otherwise the module is one skip.
"""

from __future__ import annotations

import pytest
from extender.demo.dra_objects import channel_slice, gpu_slice
from helpers.group_scenario import CLUSTER_UUID, GPUS_PER_MEMBER, KEYS, LEAF, LEVELS, PLATFORM, REQUIRED, SPINE
from kube_e2e import Cluster, ClusterSpec, find_kube_binaries, gpu_pod, skip_reason, wait_until
from test_dra_e2e import DEVICE_CLASS, RESOURCE, _allocations, _pods
from test_groups_e2e import empty, node_of

from topology.fabric import CLIQUE_LABEL

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

TRAYS = {"a": 4, "b": 4, "c": 2}
LABELS = {f"gb200-{key}{index:02d}": {CLIQUE_LABEL: f"{CLUSTER_UUID}.{number}", SPINE: "spine-1", LEAF: f"leaf-{key}"}
          for number, (key, count) in enumerate(TRAYS.items(), 1) for index in range(count)}
DRA = frozenset(name for name in LABELS if name[6] in "ab")
CLUSTER_SPEC = ClusterSpec(nodes={name: PLATFORM for name in LABELS}, labels=LABELS, dra_nodes=DRA,
                           extender_args=("--topology-levels", ",".join(LEVELS)))


def _group(cluster: Cluster, name: str, size: int) -> list[str]:
    members = [f"{name}-{index}" for index in range(size)]
    annotations = {KEYS.group: name, KEYS.group_size: str(size), KEYS.group_placement: REQUIRED}
    for member in members:
        cluster.kube.create_pod(gpu_pod(member, GPUS_PER_MEMBER, scheduler=cluster.scheduler_name,
                                        namespace=cluster.namespace, annotations=annotations))
    return members


def test_groups_land_whole_in_one_clique_on_dra_and_compute_domain_only_trays(spec_cluster: Cluster) -> None:
    cluster = spec_cluster
    empty(cluster)
    cluster.kube.create_cluster_object(*RESOURCE, "deviceclasses", DEVICE_CLASS)
    for node in LABELS:
        uuids = [gpu.uuid or "" for gpu in cluster.topologies[node].gpus]
        piece = gpu_slice(node, uuids, seed=sum(map(ord, node))) if node in DRA else channel_slice(node)
        cluster.kube.create_cluster_object(*RESOURCE, "resourceslices", piece)
    wait_until(lambda: cluster.extender_metric("gpu_topology_extender_nodes_by_class", **{"class": "dra-gpu"}) == 8,
               30, "the extender classing the DRA trays", watch=cluster.processes.values())
    assert cluster.extender_metric("gpu_topology_extender_nodes_by_class", **{"class": "compute-domain-only"}) == 2
    cluster.kube.create_pod(gpu_pod("single", 1, scheduler=cluster.scheduler_name, namespace=cluster.namespace,
                                    node="gb200-a00"))
    wait_until(lambda: "single" in _allocations(cluster), 60, "the single pod allocated",
               watch=cluster.processes.values())
    four = _group(cluster, "four", 4)
    wait_until(lambda: all(name in _allocations(cluster) for name in four), 90, "the group of 4 allocated",
               watch=cluster.processes.values())
    allocations = _allocations(cluster)
    assert {allocations[name][0][6] for name in four} == {"b"}  # whole in domain b: a has 3 whole trays
    assert len({allocations[name][0] for name in four}) == 4
    assert all(len(allocations[name][1]) == GPUS_PER_MEMBER for name in four)
    two = _group(cluster, "two", 2)
    wait_until(lambda: all(node_of(_pods(cluster).get(name, {})) for name in two), 90, "the group of 2 bound",
               watch=cluster.processes.values())
    pods = _pods(cluster)
    assert {node_of(pods[name])[6] for name in two} == {"c"}  # fills domain c exactly: best fit
    for name in two:  # the device plugin's path: the GPUs are ours, in the Binding
        assert len(pods[name]["metadata"]["annotations"][KEYS.gpus].split(",")) == GPUS_PER_MEMBER
        assert name not in _allocations(cluster)
    taken = [(node, device) for node, devices in _allocations(cluster).values() for device in devices]
    assert len(taken) == len(set(taken)) == 1 + 4 * GPUS_PER_MEMBER
    wait_until(lambda: cluster.extender_metric("gpu_topology_extender_dra_free_gpus") == 8 * 4 - 17, 30,
               "the extender counting the DRA trays as their claims do", watch=cluster.processes.values())
