"""ResourceSlices and ResourceClaims shaped as NVIDIA's DRA driver and kube-scheduler v1.36 write them.

A full GPU is `gpu-<minor>` with the attributes of cmd/gpu-kubelet-plugin/deviceinfo.go (`type`, `uuid`,
`productName`, `brand`, `architecture`, three versions, the standard PCIe and NUMA attributes) and its memory as
capacity; the driver publishes one pool per node, named after the node, in one slice, its devices in the order of a
Go map walk (random per publish). kube-scheduler writes a claim's allocation as results of (request, driver, pool,
device) with a node selector on the node's name.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from extender.api.dra import COMPUTE_DOMAIN_DRIVER, EXTENDED_RESOURCE_CLAIM, GPU_DRIVER


def gpu_device(minor: int, uuid: str, product: str = "NVIDIA RTX A6000", numa: int = 0) -> dict[str, Any]:
    return {"name": f"gpu-{minor}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid}, "productName": {"string": product},
                           "brand": {"string": "Nvidia"}, "architecture": {"string": "Ampere"},
                           "cudaComputeCapability": {"version": "8.6.0"}, "driverVersion": {"version": "580.65.6"},
                           "cudaDriverVersion": {"version": "13.0.0"},
                           "resource.kubernetes.io/pcieRoot": {"string": f"pci0000:{0x10 + minor * 3:02x}"},
                           "resource.kubernetes.io/pciBusID": {"string": f"0000:{0x10 + minor * 3:02x}:00.0"},
                           "resource.kubernetes.io/numaNode": {"int": numa}},
            "capacity": {"memory": {"value": "48Gi"}}}


def mig_device(parent_minor: int, parent_uuid: str, uuid: str) -> dict[str, Any]:
    return {"name": f"gpu-{parent_minor}-mig-1g10gb-19-0",
            "attributes": {"type": {"string": "mig"}, "uuid": {"string": uuid}, "parentUUID": {"string": parent_uuid},
                           "profile": {"string": "1g.10gb"}},
            "capacity": {"memory": {"value": "10Gi"}}}


def gpu_slice(node: str, uuids: Sequence[str], seed: int | None = 0, generation: int = 1, count: int = 1,
              devices: Sequence[dict[str, Any]] | None = None, index: int = 0) -> dict[str, Any]:
    """The slice NVIDIA's driver publishes for `node`, GPU i being `gpu-i` with uuids[i]; `seed` shuffles the
    devices as its map walk does (None keeps them in order)."""
    listed = list(devices) if devices is not None else [gpu_device(i, uuid) for i, uuid in enumerate(uuids)]
    if seed is not None:
        random.Random(seed).shuffle(listed)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{GPU_DRIVER}-{index}", "uid": f"slice-{node}-{index}"},
            "spec": {"driver": GPU_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
                     "devices": listed}}


def channel_slice(node: str) -> dict[str, Any]:
    """The ComputeDomain driver's slice: IMEX channels and a daemon, no GPU."""
    devices = [{"name": f"channel-{i}", "attributes": {"type": {"string": "channel"}, "id": {"int": i}}}
               for i in range(2)] + [{"name": "daemon-0", "attributes": {"type": {"string": "daemon"},
                                                                         "id": {"int": 0}}}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{COMPUTE_DOMAIN_DRIVER}-0", "uid": f"cd-{node}"},
            "spec": {"driver": COMPUTE_DOMAIN_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}


def allocated_claim(uid: str, node: str, devices: Sequence[str], pods: Sequence[str] = (), extended: bool = False,
                    driver: str = GPU_DRIVER, admin: bool = False) -> dict[str, Any]:
    """A claim as kube-scheduler's PreBind leaves it: allocated on `node`, reserved for `pods` (their UIDs)."""
    annotations = {EXTENDED_RESOURCE_CLAIM: "true"} if extended else {}
    results = [{"request": "gpus", "driver": driver, "pool": node, "device": device,
                **({"adminAccess": True} if admin else {})} for device in devices]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"claim-{uid}", "namespace": "ml", "uid": uid, "annotations": annotations},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": len(devices) or 1}}]}},
            "status": {"allocation": {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                "reservedFor": [{"resource": "pods", "name": f"pod-{pod}", "uid": pod} for pod in pods]}}
