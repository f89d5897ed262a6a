"""The placement policies the replay compares, on identical arrivals.

(1) quantity only: kube-scheduler's defaults choose the node; NVIDIA's device plugin chooses the GPUs with
    go-gpuallocator's best-effort policy (loadtests/gpuallocator_baseline.py: pair scores, partition search,
    blind to NVSwitch, 1 GPU takes the first free one).
(2) as (1) with NodeResourcesFit MostAllocated on nvidia.com/gpu (kube_scores.GPU_PACKING).
(3) our extender chooses the node (its filter, its prioritize combined as kube-scheduler combines it with the
    shipped profile, its bind), the stock device plugin still chooses the GPUs: "scheduling only" (--mode
    report). The extender's ledger follows what the kubelet allocated, as in a real cluster.
(4) as (3) with delivery: the kubelet asks the node agent's device plugin, which answers with the GPUs the
    extender bound (--mode deliver).
(3) and (4) run the extender's own ExtenderService in-process on extender.demo.cluster.DemoCluster, which
plays the API server, the kubelets and the node agents; nothing of the extender's logic is repeated here.

For multi-node jobs (a labelled fleet, spans.py) the replay compares: (1), whose kube-scheduler places each
member on its own; (6) Kueue-like, which admits a group whole into the best-fit block of the narrowest span
that could hold it, or keeps it waiting (kueue_tas.py), and leaves the GPUs to the stock device plugin; and
(4), whose members carry the group annotations (DESIGN §10), asking that span with required or preferred
placement, and meet an extender that knows the fleet's topology levels; and (7) Slurm-like, EASY backfill with
topology/block placement in segments (slurm_like.py). Pods on their own go through (6) as through (1): Kueue hands
them to kube-scheduler.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from extender.api.group_request import NVLINK_DOMAIN
from extender.api.wire import BindingArgs, ExtenderArgs
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.verbs.group_placement import GROUP_AGE_BOUND_SECONDS
from extender.verbs.service import ExtenderService
from extender.verbs.scoring.shortlist import SHORTLIST
from extender.verbs.wait import TOPOLOGY_WAIT_SECONDS
from loadtests.replay.boards import BoardKey, board_key, board_topology
from loadtests.replay.engine import Fleet, Placement
from loadtests.replay.kube_scores import (DEFAULT, GPU_PACKING, Profile, feasible_nodes_to_find, score_gpu_node,
                                          select_host, shipped_profile, tie_index)
from loadtests.replay.device_plugin import stock_device_plugin
from loadtests.replay.kueue_tas import assign
from loadtests.replay.model import LEAF_LABEL, SPINE_LABEL, TOPOLOGY_LEVELS, ClusterNode, Job
from loadtests.replay.slurm_like import SlurmLikePolicy
from loadtests.replay.spans import Span, Spans
from topology.collectives import COMM_SHARE

NAMESPACE = "default"
EPOCH = 1_800_000_000.0
"""The wall-clock instant of the replay's time 0, for the extender, the agents and pods' creationTimestamp."""


def _kube_totals(profile: Profile, job: Job, fleet: Fleet, names: Sequence[str],
                 extender: Sequence[int] | None = None) -> list[tuple[str, int]]:
    """Each node's total; scored once per distinct (GPUs, free, extender score), as thousands of nodes share few."""
    size, free = fleet.size, fleet.free_count
    shapes = [(size[name], free[name], None if extender is None else extender[at]) for at, name in enumerate(names)]
    scores = {shape: score_gpu_node(profile, job.gpus, shape[0] - shape[1], shape[0], shape[2])
              for shape in set(shapes)}
    return [(name, scores[shape]) for name, shape in zip(names, shapes)]


class _KubeSearch:
    """kube-scheduler's search for feasible nodes: percentageOfNodesToScore of them, each pod's search starting
    where the last one stopped."""

    profile: Profile
    next_start: int

    def feasible(self, job: Job, fleet: Fleet) -> list[str]:
        wanted = feasible_nodes_to_find(self.profile.percentage_of_nodes_to_score, len(fleet.nodes))
        names, self.next_start = fleet.find_feasible(job, wanted, self.next_start)
        return names


class StockPolicy(_KubeSearch):
    """kube-scheduler with a profile chooses the node by count; the stock device plugin chooses the GPUs."""

    def __init__(self, name: str, profile: Profile) -> None:
        self.name, self.profile = name, profile
        self.next_start = 0

    def place(self, job: Job, fleet: Fleet, rng: random.Random, now: float) -> Placement | None:
        names = self.feasible(job, fleet)
        if not names:
            return None
        node = select_host(_kube_totals(self.profile, job, fleet, names), rng)
        return Placement(node, stock_device_plugin(fleet.key[node], fleet.free[node], job.gpus))

    def release(self, job: Job, placement: Placement) -> None:
        """Nothing to forget: the fleet is the only state."""


class KueueLikePolicy(StockPolicy):
    """Policy (6): a group is admitted whole, into the nodes Kueue's Topology Aware Scheduling assigns at the
    narrowest span one block of which could hold it empty (required there: it waits while none holds it now);
    the stock device plugin picks each member's GPUs on its node. Pods on their own are kube-scheduler's, as (1)."""

    def __init__(self, name: str, nodes: Sequence[ClusterNode]) -> None:
        super().__init__(name, DEFAULT)
        self.spans = Spans(nodes)
        self.paths = {name: (spine, leaf, domain, name) for name, (domain, leaf, spine) in self.spans.blocks.items()}
        self.admitted: dict[str, list[str]] = {}  # group -> the nodes of its members not yet placed, in order

    def place(self, job: Job, fleet: Fleet, rng: random.Random, now: float) -> Placement | None:
        if job.group is None:
            return super().place(job, fleet, rng, now)
        nodes = self.admitted.get(job.group)
        if nodes is None:
            fits = {name: fleet.free_count[name] // job.gpus for name in fleet.pools.get(job.gpu_model, ())}
            depth = Span.FLEET - self.spans.tightest(job)  # the levels below the fleet: a path's length
            nodes = assign(self.paths, fits, job.pods, depth)
            if nodes is None:
                return None
            self.admitted[job.group] = nodes
        node = nodes.pop(0)
        if not nodes:
            del self.admitted[job.group]
        return Placement(node, stock_device_plugin(fleet.key[node], fleet.free[node], job.gpus))


def demo_cluster(nodes: Sequence[ClusterNode], state: ClusterState, *, delivery: bool = True) -> DemoCluster:
    """The in-memory cluster of these nodes, each with its installed board and labels, on the state's clock;
    with the node agent's device plugin (delivery) or NVIDIA's."""
    boards = {node.name: board_topology(board_key(node)) for node in nodes}
    labels = {node.name: dict(node.labels) for node in nodes if node.labels}
    pairs = [(node.name, node.platform) for node in nodes]
    if delivery:
        return DemoCluster(state, pairs, clock=state.clock, boards=boards, labels=labels)
    return StockPluginCluster(state, pairs, clock=state.clock, boards=boards, labels=labels,
                              keys={node.name: board_key(node) for node in nodes})


class StockPluginCluster(DemoCluster):
    """The demo cluster with NVIDIA's device plugin on every node: the kubelet allocates go-gpuallocator's pick
    among the GPUs no pod holds, whatever the extender bound."""

    def __init__(self, *args: Any, keys: dict[str, BoardKey], **kwargs: Any) -> None:
        self.keys = keys
        super().__init__(*args, **kwargs)

    def _admit(self, node: str, pod: dict[str, Any]) -> None:
        uuids = [gpu.uuid for gpu in self.topologies[node].gpus]
        held = {uuid for uid in self._on_node[node] for ids in self.delivered.get(uid, {}).values() for uuid in ids}
        free = sum(1 << index for index, uuid in enumerate(uuids) if uuid not in held)
        count = int(pod["spec"]["containers"][0]["resources"]["requests"][self.state.resource])
        chosen = stock_device_plugin(self.keys[node], free, count)
        self.delivered[pod["metadata"]["uid"]] = {"main": tuple(uuids[index] for index in chosen)}


GROUP_SPAN: dict[Span, str] = {Span.DOMAIN: NVLINK_DOMAIN, Span.LEAF: LEAF_LABEL, Span.SPINE: SPINE_LABEL,
                               Span.FLEET: SPINE_LABEL}
"""The group-span a group asks for, by the narrowest labelled span that could hold it (spans.Spans.tightest: a
group that fits one HGX node, which no clique label names, asks for its leaf); one that no spine holds asks for
the widest level there is."""


class ExtenderPolicy(_KubeSearch):
    """Our extender in-process: kube-scheduler's count filter, then the extender's filter, prioritize combined
    with the shipped profile's plugins, and bind; the GPUs are what the kubelet then delivered. With
    `topology_levels` (a labelled fleet) the extender knows the fleet's network levels, and a group's members
    carry the group annotations, with `group_placement` (required or preferred)."""

    def __init__(self, name: str, nodes: Sequence[ClusterNode], *, delivery: bool,
                 profile: Profile | None = None, topology_wait: float = TOPOLOGY_WAIT_SECONDS,
                 topology_levels: tuple[str, ...] = (), group_placement: str = "preferred",
                 group_age_bound: float = GROUP_AGE_BOUND_SECONDS, comm_share: float = COMM_SHARE,
                 shortlist: int = SHORTLIST, one_best: bool = True) -> None:
        self.name = name
        self.group_placement = group_placement
        self.profile = profile or shipped_profile()
        self.now = 0.0
        # Real agents republish node state every few seconds, so no node goes stale: the replay's never do.
        self.state = ClusterState(clock=lambda: EPOCH + self.now, stale_after=math.inf, levels=topology_levels)
        self.cluster = demo_cluster(nodes, self.state, delivery=delivery)
        self.rng = random.Random(0)  # the replay's own, each placement's (`place`)
        self.service = ExtenderService(self.state, self.cluster, topology_wait=topology_wait,
                                       group_age_bound=group_age_bound or None, comm_share=comm_share,
                                       shortlist=shortlist, one_best=one_best,
                                       ties=lambda count: tie_index(count, self.rng))
        self.spans = Spans(nodes)
        self.index = {name: {gpu.uuid: gpu.index for gpu in topology.gpus}
                      for name, topology in self.cluster.topologies.items()}
        self.pending: dict[str, dict[str, Any]] = {}  # job name -> its pod, from first attempt to departure
        self.created = 0
        self.next_start = 0

    def place(self, job: Job, fleet: Fleet, rng: random.Random, now: float) -> Placement | None:
        self.now = now
        names = self.feasible(job, fleet)
        if not names:
            return None
        pod = self.pending.get(job.name)
        if pod is None:
            self.created += 1
            pod = self.pending[job.name] = self.cluster.create_pod(f"job-{self.created}", job.gpus,
                                                                   self._group_annotations(job),
                                                                   created=EPOCH + job.submit_s)
        self.rng = rng
        passed = self.service.filter(ExtenderArgs(pod, names, None)).passed
        if not passed:
            return None
        if len(passed) == 1:  # kube-scheduler takes a lone feasible node without scoring or prioritize (schedulePod)
            node = passed[0]
        else:
            scored, scores = self.service.prioritize(ExtenderArgs(pod, list(passed), None))
            node = select_host(_kube_totals(self.profile, job, fleet, scored, scores), rng)
        metadata = pod["metadata"]
        error = self.service.bind(BindingArgs(metadata["name"], NAMESPACE, metadata["uid"], node))
        if error:
            raise RuntimeError(f"the in-process extender refused to bind {job.name} to {node}: {error}")
        index = self.index[node]
        return Placement(node, tuple(sorted(index[uuid] for ids in self.cluster.delivered[metadata["uid"]].values()
                                            for uuid in ids)))

    def release(self, job: Job, placement: Placement) -> None:
        self.cluster.finish_pod(self.pending.pop(job.name)["metadata"]["uid"])

    def _group_annotations(self, job: Job) -> dict[str, str]:
        """A member's annotations: its group, the group's size, the span it fits and the placement asked."""
        if job.group is None:
            return {}
        keys = self.state.keys
        segment = {} if job.segment_pods is None else {keys.group_segment: str(job.segment_pods)}
        return {keys.group: job.group, keys.group_size: str(job.pods),
                keys.group_span: GROUP_SPAN[self.spans.tightest(job, labelled=True)],
                keys.group_placement: self.group_placement, **segment}


OURS = "(4) ours, with delivery"
OURS_GROUPS_PREFERRED = "(4) ours, groups preferred"
"""The policy a pod gets from our extender as shipped: with delivery, and for a group's members that give only
`group` and `group-size`, preferred placement."""


def standard_policies(nodes: Sequence[ClusterNode], topology_wait: float = TOPOLOGY_WAIT_SECONDS,
                      shortlist: int = SHORTLIST, profile: Profile | None = None
                      ) -> tuple[StockPolicy | ExtenderPolicy, ...]:
    """Policies (1) to (4), each fresh: (3) and (4) hold an extender whose state must start empty; they run with
    the extender's --topology-wait and --shortlist, under `profile` (the shipped one by default)."""
    return (StockPolicy("(1) quantity only", DEFAULT),
            StockPolicy("(2) quantity, GPU packing", GPU_PACKING),
            ExtenderPolicy("(3) ours, scheduling only", nodes, delivery=False, topology_wait=topology_wait,
                           shortlist=shortlist, profile=profile),
            ExtenderPolicy(OURS, nodes, delivery=True, topology_wait=topology_wait, shortlist=shortlist,
                           profile=profile))


GROUPS_PROFILE = "gpu-topology-scheduler-groups"
"""The shipped profile a group's members use: it searches every node."""


def group_policies(nodes: Sequence[ClusterNode], topology_wait: float = TOPOLOGY_WAIT_SECONDS,
                   comm_share: float = COMM_SHARE, shortlist: int = SHORTLIST
                   ) -> tuple[StockPolicy | SlurmLikePolicy | ExtenderPolicy, ...]:
    """The policies for multi-node jobs on a labelled fleet, each fresh: (1), (6), (7), and (4), our extender with
    the fleet's topology levels and --topology-wait, once with members asking `required` placement (a group waits
    for a domain of its span) and once `preferred`, the extender's default (after the wait it takes a wider span,
    then places members one by one). The extender is told the workload's communication share (its --comm-share),
    as an operator who knows the fleet's jobs sets it."""
    return (StockPolicy("(1) quantity only", DEFAULT),
            KueueLikePolicy("(6) Kueue-like, best-fit block", nodes),
            SlurmLikePolicy("(7) Slurm-like, EASY backfill, topology/block", nodes),
            *(ExtenderPolicy(f"(4) ours, groups {placement}", nodes, delivery=True, topology_wait=topology_wait,
                             topology_levels=TOPOLOGY_LEVELS, group_placement=placement, comm_share=comm_share,
                             shortlist=shortlist, profile=shipped_profile(name=GROUPS_PROFILE))
              for placement in ("required", "preferred")))
