"""A DRA cluster of 8x RTX A6000 nodes (NVLink bridges on pairs 0-1, 2-3, 4-5, 6-7), each slice listing its GPUs in a
given order, as NVIDIA's driver does in the order of a Go map walk."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from extender.api.dra import GPU_CLASS
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import with_uuids
from extender.demo.dra_objects import gpu_device, gpu_slice
from helpers.reported_nodes import reported_cluster
from topology.platforms import PLATFORMS

PLATFORM = "rtx-a6000-pairs"
CROSSED = (0, 5, 1, 2, 3, 4, 6, 7)  # first fit of 2: GPUs 0 and 5, across sockets
PAIRED = (4, 5, 0, 1, 2, 3, 6, 7)  # first fit of 2: the NVLink pair 4-5


def uuids(node: str) -> list[str]:
    return [gpu.uuid or "" for gpu in with_uuids(node, PLATFORMS[PLATFORM].topology()).gpus]


def dra_cluster(orders: Mapping[str, Sequence[int]], labels: Mapping[str, Mapping[str, str]] | None = None
                ) -> ClusterState:
    state = reported_cluster({name: (PLATFORM, ()) for name in orders}, labels=labels)
    for name, order in orders.items():
        ids = uuids(name)
        state.slices.apply("ADDED", gpu_slice(name, (), seed=None, devices=[gpu_device(i, ids[i]) for i in order]))
    return state


def template(name: str = "two-gpus", count: int = 2, namespace: str = "ml", **exactly: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": namespace, "uid": f"t-{name}"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpus", "exactly": {"deviceClassName": GPU_CLASS, "count": count, **exactly}}]}}}}
