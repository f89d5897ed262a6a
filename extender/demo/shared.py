"""The second part of `make demo`: nodes whose GPUs are shared, next to a node of whole GPUs.

A time-sliced H100 (one GPU, four replicas) and a MIG A100 (one GPU as seven 1g.10gb slices) carry GPU feature
discovery's labels, and their agents see replica and MIG device ids. Pods that ask nothing of topology are placed
there as kube-scheduler alone would place them (a plain Binding; the kubelet picks the replicas or slices); a pod
that requires an NVLink ring is refused there and goes to the whole-GPU node (the stable reason is answered, and
shown, only when no node passes: kube-scheduler reads it only then, extender/api/wire.py).
"""

from __future__ import annotations

from collections.abc import Callable

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster, SharedNode, single_gpu
from extender.demo.scheduler import Scheduler, fits_by_count, running_server
from extender.verbs.service import ExtenderService

NODES = (("h100-sliced", "dgx-h100"), ("a100-mig", "dgx-a100"), ("a6000-whole", "rtx-a6000-pairs"))
SHARED = {
    "h100-sliced": SharedNode({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4",
                               "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"}, 4),
    "a100-mig": SharedNode({"nvidia.com/mig.strategy": "single",
                            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"}, 7, mig=True),
}
NVLINK_REQUIRED = {"gpu-topology.io/interconnect": "nvlink", "gpu-topology.io/placement": "required"}
PODS: tuple[tuple[str, int, dict[str, str]], ...] = (
    ("notebook", 1, {}), ("inference", 2, {}), ("allreduce", 2, NVLINK_REQUIRED), ("batch", 3, {}),
    ("sweep", 1, {}),
)


def run_shared_demo(out: Callable[[str], None] = print) -> None:
    state = ClusterState()
    cluster = DemoCluster(state, NODES, boards={name: single_gpu(platform) for name, platform in NODES
                                                if name in SHARED}, shared=SHARED)
    service = ExtenderService(state, cluster, topology_wait=0)
    out("\nShared GPUs: h100-sliced (time-slicing, 1 GPU as 4 replicas), a100-mig (MIG single, 1 GPU as 7 "
        "slices), a6000-whole (8 whole GPUs, NVLink pairs)")
    with running_server(service) as port, Scheduler(port) as scheduler:
        for name, gpus, wanted in PODS:
            out(_place(cluster, scheduler, name, gpus, wanted))
    out("On a shared node the extender chooses, reserves and annotates no GPU: the kubelet gives out replicas or "
        "slices, and the ledger never counts one as a whole GPU.")


def _place(cluster: DemoCluster, scheduler: Scheduler, name: str, gpus: int, annotations: dict[str, str]) -> str:
    created = cluster.create_pod(name, gpus, annotations)
    uid = created["metadata"]["uid"]
    label = f"{name:<10} {gpus} GPU{'s' if gpus > 1 else ' '}{' nvlink required' if annotations else ''}"
    candidates = fits_by_count(cluster, gpus)
    cycle = scheduler.cycle(created, candidates)
    refused = cycle.refused or {node: "" for node in candidates if node not in cycle.scores}
    why = "".join(f"; {node} refused{f': {reason}' if reason else ''}" for node, reason in refused.items())
    if cycle.error:
        return f"{label:<28} bind refused: {cycle.error}{why}"
    if cycle.node is None:
        return f"{label:<28} pending{why}"
    devices = ",".join(_short(device) for ids in cluster.delivered[uid].values() for device in ids)
    chosen = cluster.pods[uid]["metadata"]["annotations"].get("gpu-topology.io/gpus")
    how = "GPUs chosen by the extender" if chosen else "plain binding, the kubelet gave"
    ranked = " ".join(f"{candidate}={score}" for candidate, score in cycle.scores.items())
    return f"{label:<28} -> {cycle.node:<12} {how} {devices}  (scores {ranked}){why}"


def _short(device: str) -> str:
    """A device id as a person reads it: GPU-45dd4874…::2."""
    gpu, _, replica = device.partition("::")
    return (gpu[:12] + "…" if gpu.startswith("GPU-") else gpu) + (f"::{replica}" if replica else "")
