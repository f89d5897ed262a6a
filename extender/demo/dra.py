"""The fourth part of `make demo`: nodes whose GPUs a DRA driver hands out.

Two 8 x RTX A6000 nodes (NVLink bridges on pairs 0-1, 2-3, 4-5, 6-7) publish their GPUs in ResourceSlices shaped as
NVIDIA's driver writes them, in a shuffled order; kube-scheduler's DRA plugin gives a pod the first free devices in
that order (first fit), after its nodes are chosen, and writes them in the pod's claim before the extender's bind.
So the extender cannot pick the pair on a DRA node; it picks the node whose first fit is a pair. Pods ask
`nvidia.com/gpu: 2` (KEP-5004 turns that into a claim on a DRA node). Beside them, the same pods placed by DRA
alone: kube-scheduler counts no GPUs on a DRA node, so every node ties and the first is taken.
"""

from __future__ import annotations

from collections.abc import Callable

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.demo.scheduler import Scheduler, running_server
from extender.verbs.service import ExtenderService
from topology.compiled import compile_topology
from topology.platforms import PLATFORMS
from topology.select import ring_gbps

PLATFORM = "rtx-a6000-pairs"
ORDERS = {"a6000-dra-0": (0, 5, 1, 2, 3, 4, 6, 7), "a6000-dra-1": (4, 5, 0, 1, 2, 3, 6, 7)}
PODS = 4
GPUS = 2
BOARD = compile_topology(PLATFORMS[PLATFORM].topology())


def run_dra_demo(out: Callable[[str], None] = print) -> None:
    state = ClusterState()
    cluster = DemoCluster(state, [(name, PLATFORM) for name in ORDERS], dra=ORDERS)
    service = ExtenderService(state, cluster, topology_wait=0)
    out(f"\nDRA nodes: {', '.join(ORDERS)} (8 x RTX A6000, NVLink pairs 0-1 2-3 4-5 6-7); each slice lists its GPUs "
        f"shuffled: {'; '.join(f'{name} {order}' for name, order in ORDERS.items())}")
    alone = DemoCluster(ClusterState(), [(name, PLATFORM) for name in ORDERS], dra=ORDERS)
    lines = [f"{'pod':<8} {'with the extender':<37} DRA alone"]
    with running_server(service) as port, Scheduler(port) as scheduler:
        for number in range(PODS):
            name = f"pair-{number}"
            uid = cluster.create_pod(name, GPUS)["metadata"]["uid"]
            candidates = [node for node in ORDERS if cluster.first_fit(node, GPUS) is not None]
            cycle = scheduler.cycle(cluster.pods[uid], candidates, lambda node, uid=uid: cluster.allocate(uid, node))
            ours = _placed(cluster, uid) if cycle.node else f"pending: {cycle.error or cycle.refused}"
            other = alone.create_pod(name, GPUS)["metadata"]["uid"]
            alone.allocate(other, next(node for node in ORDERS if alone.first_fit(node, GPUS) is not None))
            lines.append(f"{name:<8} {ours:<37} {_placed(alone, other)}")
    out("\n".join(lines))
    out("The extender reads each DRA node as its allocator will give: the first free GPUs in slice order. It counts "
        "their claims, not the pods' requests, and its bind carries no GPU of its own: kube-scheduler wrote them.")


def _placed(cluster: DemoCluster, uid: str) -> str:
    node, gpus = cluster.claims[uid]
    return f"{node} GPUs {','.join(map(str, gpus))} ({ring_gbps(BOARD, gpus) or 0:.0f} GB/s ring)"
