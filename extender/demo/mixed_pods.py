"""`make demo`: a workload of mixed 1-, 2-, 4- and 8-GPU pods through the real HTTP server, as kube-scheduler
drives an extender, then the same pods placed by count alone, side by side.

The extender run: kube-scheduler's own count check (NodeResourcesFit), then POST /filter, /prioritize and
/bind on the demo cluster's server. The count-only run: the node with the most free GPUs by count
(NodeResourcesFit LeastAllocated on nvidia.com/gpu), then the device plugin's first free GPUs. Both see the
same arrivals and departures; a pod that finds no node is dropped in both.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import orjson

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.demo.count_only import CountOnly
from extender.demo.scheduler import Scheduler, fits_by_count, running_server
from extender.verbs.service import ExtenderService
from topology.compiled import compile_topology
from topology.levels import Level
from topology.select import ring_gbps

SIZES = (1, 1, 1, 1, 2, 2, 2, 4, 4, 8)


@dataclass(frozen=True, slots=True)
class DemoPod:
    name: str
    gpus: int
    arrives: int
    leaves: int
    annotations: dict[str, str]


@dataclass(slots=True)
class Tally:
    placed: int = 0
    dropped: int = 0
    rings: list[tuple[int, float, bool]] = field(default_factory=list)  # (size, GB/s, all hops NVLink)
    exact: int = 0  # pods whose every container got exactly the GPUs chosen for it


def workload(count: int = 48, seed: int = 7) -> list[DemoPod]:
    rng = random.Random(seed)
    pods = []
    for step in range(count):
        gpus = rng.choice(SIZES)
        annotations = {"gpu-topology.io/interconnect": "nvlink"} if gpus >= 4 and rng.random() < 0.5 else {}
        pods.append(DemoPod(f"job-{step:02d}", gpus, step, step + rng.randint(4, 16), annotations))
    return pods


def run_demo(out: Callable[[str], None] = print) -> None:
    pods = workload()
    state = ClusterState()
    cluster = DemoCluster(state)
    # The demo plays its timeline in a second of wall-clock time, so no pod could wait out a departure: a pod
    # that found no full-bandwidth set would be dropped rather than placed a little later.
    service = ExtenderService(state, cluster, topology_wait=0)
    out(f"Demo cluster: {', '.join(f'{n} ({p})' for n, p in cluster.platform_of.items())}")
    out(f"Workload: {len(pods)} pods, sizes {sorted({p.gpus for p in pods})}, half of the 4- and 8-GPU pods "
        "prefer NVLink\n")
    with running_server(service) as port, Scheduler(port) as scheduler:
        ours = _drive_extender(cluster, pods, scheduler, out)
    baseline = _count_only(cluster, pods)
    out("")
    out(_summary({"topology-aware (this extender)": ours, "count-only (kube-scheduler + first free GPUs)": baseline}))
    out(f"\nDelivered by the kubelet exactly as chosen (node agent's device plugin): {ours.exact}/{ours.placed} pods. "
        "Each decision line shows the GPUs chosen at bind and whether the kubelet delivered them.")


def _drive_extender(cluster: DemoCluster, pods: list[DemoPod], scheduler: Scheduler,
                    out: Callable[[str], None]) -> Tally:
    tally = Tally()
    live: dict[str, tuple[DemoPod, str]] = {}
    for pod in pods:
        for uid, (old, _) in list(live.items()):
            if old.leaves <= pod.arrives:
                cluster.finish_pod(uid)
                del live[uid]
        created = cluster.create_pod(pod.name, pod.gpus, pod.annotations)
        uid = created["metadata"]["uid"]
        fits = fits_by_count(cluster, pod.gpus)
        label = f"{pod.name} {pod.gpus} GPU{'s' if pod.gpus > 1 else ' '}{' nvlink' if pod.annotations else '       '}"
        if not fits:
            out(f"{label}  pending: no node has {pod.gpus} free GPUs by count")
            tally.dropped += 1
            cluster.finish_pod(uid)
            continue
        cycle = scheduler.cycle(created, fits)
        if cycle.node is None:
            reasons = "; ".join(sorted(set(cycle.refused.values())))
            out(f"{label}  {f'bind refused: {cycle.error}' if cycle.error else f'pending: {reasons}'}")
            tally.dropped += 1
            cluster.finish_pod(uid)
            continue
        node, scores = cycle.node, cycle.scores
        live[uid] = (pod, node)
        annotations = cluster.pods[uid]["metadata"]["annotations"]
        gpus = cluster.indices(node, annotations["gpu-topology.io/gpus"].split(","))
        chosen = {name: tuple(ids) for name, ids in orjson.loads(annotations["gpu-topology.io/containers"]).items()}
        delivered = cluster.delivered[uid]
        got = cluster.delivered_gpus(uid)
        ring, nvlink = _ring(cluster, node, gpus)
        tally.placed += 1
        tally.exact += chosen == delivered
        if pod.gpus > 1:
            tally.rings.append((pod.gpus, ring, nvlink))
        ranking = " ".join(f"{name}={scores[name]}" for name in sorted(scores, key=lambda n: -scores[n])[:3])
        hop = "" if pod.gpus == 1 else f"  ring {ring:.1f} GB/s {'NVLink' if nvlink else 'over PCIe'}"
        given = "delivered" if chosen == delivered else f"DELIVERED {','.join(map(str, got))}"
        out(f"{label}  -> {node:<12} GPUs {','.join(map(str, gpus)):<16}{given:<10}{hop:<28} scores {ranking}")
    for uid in list(live):
        cluster.finish_pod(uid)
    return tally


def _count_only(cluster: DemoCluster, pods: list[DemoPod]) -> Tally:
    placer = CountOnly({name: topology.size for name, topology in cluster.topologies.items()})
    live: list[tuple[DemoPod, str, tuple[int, ...]]] = []
    tally = Tally()
    for pod in pods:
        for entry in [entry for entry in live if entry[0].leaves <= pod.arrives]:
            live.remove(entry)
            placer.release(entry[1], entry[2])
        placed = placer.place(pod.gpus)
        if placed is None:
            tally.dropped += 1
            continue
        node, gpus = placed
        live.append((pod, node, gpus))
        tally.placed += 1
        if pod.gpus > 1:
            tally.rings.append((pod.gpus, *_ring(cluster, node, gpus)))
    return tally


def _summary(tallies: dict[str, Tally]) -> str:
    lines = [f"{'policy':<48} {'placed':>6} {'dropped':>7} {'multi-GPU on NVLink':>20} {'mean ring GB/s':>15} "
             f"{'4/8-GPU mean ring':>18}"]
    for name, tally in tallies.items():
        multi = tally.rings
        big = [ring for size, ring, _ in multi if size >= 4]
        nvlink = sum(1 for *_, on in multi if on)
        lines.append(f"{name:<48} {tally.placed:>6} {tally.dropped:>7} {f'{nvlink}/{len(multi)}':>20} "
                     f"{_mean([ring for _, ring, _ in multi]):>15.1f} {_mean(big):>18.1f}")
    return "\n".join(lines)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _ring(cluster: DemoCluster, node: str, gpus: tuple[int, ...]) -> tuple[float, bool]:
    """The set's best ring, and whether a ring over NVLink hops alone runs through it."""
    compiled = compile_topology(cluster.topologies[node])
    mask = sum(1 << gpu for gpu in gpus)
    return ring_gbps(compiled, gpus) or 0.0, compiled.has_ring(Level.NVLINK, 0, mask)
