"""The third part of `make demo`: whole groups on GB200 NVL72 racks, where this extender puts them and where
count-only placement scatters them.

Three racks of 18 GB200 compute trays (4 GPUs behind NVSwitch each) are three NVLink domains, named as GPU feature
discovery labels them (`nvidia.com/gpu.clique: <clusterUUID>.<cliqueId>`), under Topograph's leaf and spine labels.
Small pods already run on a few trays of every rack. Then groups of 4, 8, 18 and 12 trays (one pod of 4 GPUs per
tray) arrive between 1-GPU pods, and every pod goes through the extender's own filter, prioritize and bind over
HTTP as kube-scheduler calls them (extender/demo/scheduler.py); a pod the extender refuses waits and is tried
again at the next step, after that step's pods end, as kube-scheduler retries it on cluster events. Then the same
arrivals are placed by count alone (extender/demo/count_only.py), where a group's member is just another pod of
4 GPUs. A pod runs for its own length from the step it is placed, in both runs.

A group's all-reduce runs at the speed of its slowest hop: multi-node NVLink inside one domain, the network across.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.demo.count_only import CountOnly
from extender.demo.mixed_pods import DemoPod
from extender.demo.scheduler import Scheduler, fits_by_count, running_server
from extender.verbs.service import ExtenderService
from topology.annotations import AnnotationKeys
from topology.collectives import ALLREDUCE
from topology.fabric import CLIQUE_LABEL

SPINE, LEAF = "network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"
CLUSTER_UUID = "5b7c2e1a-9f4d-4c8b-a3e6-1d0f7b2c9e84"
RACKS = 3
TRAYS = 18  # compute trays of a GB200 NVL72 rack
GPUS_PER_TRAY = 4
STEPS = 12
WIDTH = 116  # columns of the prose lines

MNNVL_ALLREDUCE_GBPS = ALLREDUCE["gb200-node"].domain_gbps
"""NCCL all_reduce bus bandwidth measured on 2 trays x 4 GB200 of one NVL72 rack over multi-node NVLink."""
NETWORK_ALLREDUCE_GBPS = ALLREDUCE["gb200-node"].leaf_gbps
"""The same test on the same 8 GPUs over InfiniBand: what a group gets once a hop leaves its NVLink domain."""
NVLINK_GBPS_PER_GPU = 1800.0
"""NVIDIA's rate of NVLink 5 per Blackwell GPU, to every GPU of the rack (GB200 NVL72: 1.8 TB/s)."""
NETWORK_GBPS_PER_GPU = 50.0
"""One 400 Gb/s NIC per GPU on a GB200 tray: about 50 GB/s per GPU across racks."""

RUNNING: tuple[tuple[str, int, str, int], ...] = (
    # (pod, GPUs, tray, steps it runs on): already running at step 0, spread as kube-scheduler spreads small pods.
    ("notebook-1", 1, "r1-t03", STEPS), ("infer-1", 2, "r1-t08", STEPS), ("notebook-2", 1, "r1-t12", STEPS),
    ("infer-2", 1, "r1-t16", STEPS), ("notebook-3", 1, "r2-t05", STEPS), ("infer-3", 2, "r2-t11", STEPS),
    ("eval-1", 1, "r3-t09", 5),
)
GROUPS: tuple[tuple[str, int, int, int, bool], ...] = (
    # (group, trays, arrives at step, runs for, one NVLink domain required)
    ("train-16", 4, 0, STEPS, False), ("train-32", 8, 2, STEPS, False), ("train-72", 18, 4, 4, True),
    ("train-48", 12, 6, STEPS, False),
)
SINGLES: tuple[tuple[int, int], ...] = ((1, 6), (1, 3), (3, 4), (3, 9), (5, 4), (7, 5), (9, 3), (10, 2), (11, 1))
"""1-GPU pods: (arrives at step, runs for)."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """A pod's try: the tray and GPUs it got, or None and why it waits."""

    node: str | None
    gpus: tuple[int, ...] = ()
    why: str = ""


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpus: tuple[int, ...]
    start: int  # the step it was placed at
    end: int  # the step it ended at; STEPS if it still runs at the end


@dataclass(frozen=True, slots=True)
class Run:
    """One policy's timeline: where each pod ran and when, and for each pod that waited, its first refusal."""

    placed: Mapping[str, Placement]
    waited: Mapping[str, tuple[int, str]]

    def racks(self, group: str) -> Counter[int]:
        """The racks the group's placed members sit in, with how many trays in each."""
        return Counter(rack_of(placement.node) for placement in _members(self, group))

    def whole_racks(self) -> list[int]:
        """Racks where nothing runs at the end: what a group of 18 trays could still get."""
        busy = {rack_of(placement.node) for placement in self.placed.values() if placement.end >= STEPS}
        return [rack for rack in range(1, RACKS + 1) if rack not in busy]


@dataclass(frozen=True, slots=True)
class Comparison:
    ours: Run
    count_only: Run


def trays() -> list[tuple[str, str]]:
    return [(f"r{rack}-t{tray:02d}", "gb200-node") for rack in range(1, RACKS + 1) for tray in range(1, TRAYS + 1)]


def rack_of(node: str) -> int:
    return int(node[1:node.index("-")])


def labels() -> dict[str, dict[str, str]]:
    """GPU feature discovery's clique label and Topograph's network levels: a leaf per rack, one spine."""
    return {name: {CLIQUE_LABEL: f"{CLUSTER_UUID}.{rack_of(name)}", LEAF: f"leaf-{rack_of(name)}",
                   SPINE: "spine-1"} for name, _ in trays()}


def arrivals(keys: AnnotationKeys) -> list[DemoPod]:
    """Every pod that arrives, in arrival order: a group's members together, 1-GPU pods between groups."""
    pods = [DemoPod(f"{group}-{member:02d}", GPUS_PER_TRAY, step, step + runs,
                    {keys.group: group, keys.group_size: str(size)}
                    | ({keys.group_placement: "required"} if required else {}))
            for group, size, step, runs, required in GROUPS for member in range(size)]
    pods += [DemoPod(f"single-{index}", 1, step, step + runs, {}) for index, (step, runs) in enumerate(SINGLES)]
    return sorted(pods, key=lambda pod: pod.arrives)


def play(pods: list[DemoPod], running: Mapping[str, Placement], place: Callable[[DemoPod], Outcome],
         finish: Callable[[str], None]) -> Run:
    """The timeline, step by step: pods end, the waiting ones are tried again in arrival order, then the new
    ones arrive."""
    placed = dict(running)
    waited: dict[str, tuple[int, str]] = {}
    waiting: list[DemoPod] = []
    for step in range(STEPS):
        for name, placement in placed.items():
            if placement.end == step:
                finish(name)
        tried, waiting = waiting + [pod for pod in pods if pod.arrives == step], []
        for pod in tried:
            outcome = place(pod)
            if outcome.node is None:
                waiting.append(pod)
                waited.setdefault(pod.name, (step, outcome.why))
            else:
                placed[pod.name] = Placement(outcome.node, outcome.gpus, step,
                                             min(step + pod.leaves - pod.arrives, STEPS))
    return Run(placed, waited)


def compare() -> Comparison:
    """The same arrivals through this extender over HTTP, then by count alone."""
    state = ClusterState(levels=(SPINE, LEAF))
    cluster = DemoCluster(state, trays(), labels=labels())
    # As in the other parts, the timeline plays in wall-clock seconds: no topology wait, so a group that no domain
    # holds now waits only if it requires one; a preferred one is planned across the network at once.
    service = ExtenderService(state, cluster, topology_wait=0)
    uids: dict[str, str] = {}
    running: dict[str, Placement] = {}
    for name, gpus, node, runs in RUNNING:
        uids[name] = cluster.create_pod(name, gpus)["metadata"]["uid"]
        cluster.bind("default", name, uids[name], node, {})
        running[name] = Placement(node, cluster.delivered_gpus(uids[name]), 0, runs)

    def ours(pod: DemoPod) -> Outcome:
        if pod.name not in uids:
            uids[pod.name] = cluster.create_pod(pod.name, pod.gpus, pod.annotations)["metadata"]["uid"]
        fits = fits_by_count(cluster, pod.gpus)
        if not fits:
            return Outcome(None, why=f"no tray has {pod.gpus} GPUs free by count")
        cycle = scheduler.cycle(cluster.pods[uids[pod.name]], fits)
        if cycle.node is None:
            return Outcome(None, why=cycle.error or "; ".join(sorted(set(cycle.refused.values()))))
        return Outcome(cycle.node, cluster.delivered_gpus(uids[pod.name]))

    pods = arrivals(state.keys)
    with running_server(service) as port, Scheduler(port) as scheduler:
        extender = play(pods, running, ours, lambda name: cluster.finish_pod(uids[name]))
    placer = CountOnly({name: GPUS_PER_TRAY for name, _ in trays()})
    for placement in running.values():
        placer.take(placement.node, placement.gpus)
    given: dict[str, tuple[str, tuple[int, ...]]] = {name: (p.node, p.gpus) for name, p in running.items()}

    def count_only(pod: DemoPod) -> Outcome:
        found = placer.place(pod.gpus)
        if found is None:
            return Outcome(None, why=f"no tray has {pod.gpus} GPUs free")
        given[pod.name] = found
        return Outcome(*found)

    return Comparison(extender, play(pods, running, count_only, lambda name: placer.release(*given[name])))


def run_groups_demo(out: Callable[[str], None] = print) -> None:
    sizes = [str(size) for _, size, *_ in GROUPS]
    out("\n" + textwrap.fill(
        f"Groups on GB200 NVL72 racks: {RACKS} NVLink domains ({CLIQUE_LABEL} {CLUSTER_UUID[:8]}….1 to .{RACKS}) of "
        f"{TRAYS} trays x {GPUS_PER_TRAY} GPUs, leaf-1..{RACKS} under spine-1. At step 0, {len(RUNNING)} small pods "
        f"run on trays of all {RACKS} racks; then groups of {', '.join(sizes[:-1])} and {sizes[-1]} trays (a 4-GPU pod "
        f"per tray) arrive between {len(SINGLES)} 1-GPU pods. Count-only takes the first of equal trays by name, which "
        "keeps a group's trays together better than kube-scheduler's random pick among equals.", WIDTH))
    result = compare()
    ours, baseline = result.ours, result.count_only
    for group, size, arrives, _, required in GROUPS:
        label = f"{group:<9}{size:>3} trays, step {arrives:<2} {'required' if required else '':<8}"
        refused = ours.waited.get(f"{group}-00")
        if refused is not None:
            out(f"{label}  ours: waits: {refused[1]}{_made_room(ours, group)}")
            label = " " * len(label)
        out(f"{label}  ours: {_where(ours, group, size):<36} count-only: {_spread(baseline, group, size)}")
    out("")
    out(_table(result))
    out(textwrap.fill(
        f"All-reduce modelled as NCCL's bus bandwidth measured on 2 trays x 4 GB200: {MNNVL_ALLREDUCE_GBPS:.0f} GB/s "
        f"over multi-node NVLink, {NETWORK_ALLREDUCE_GBPS:.0f} GB/s over InfiniBand (NVIDIA rates NVLink 5 at "
        f"{NVLINK_GBPS_PER_GPU / 1000:.1f} TB/s per GPU inside the rack, the network at ~{NETWORK_GBPS_PER_GPU:.0f} "
        f"GB/s per GPU across). {_short_groups()}", WIDTH))


def _short_groups() -> str:
    """Why a rack can be whole at the end: a group that ends gives its rack back whole if it had it alone."""
    short = [f"{group} runs {runs} steps" for group, _, _, runs, _ in GROUPS if runs < STEPS]
    if not short:
        return ""
    return f"{', '.join(short)}: when it ends, its rack is whole again only if it had the rack to itself."


def _table(result: Comparison) -> str:
    runs = (result.ours, result.count_only)
    lines = [f"{'':<15}{'this extender':>22}{'count-only':>22}",
             f"{'group':<9}{'GPUs':>6}{'racks':>11}{'all-reduce':>11}{'racks':>11}{'all-reduce':>11}"]
    for group, size, *_ in GROUPS:
        cells = ""
        for run in runs:
            racks = run.racks(group)
            whole = racks.total() == size
            cells += f"{len(racks) if whole else 'waiting':>11}{f'{_allreduce(racks):.0f} GB/s' if whole else '-':>11}"
        lines.append(f"{group:<9}{size * GPUS_PER_TRAY:>6}{cells}")
    placed = [f"{_in_one_domain(run)}/{len(GROUPS)}" for run in runs]
    lines.append(f"{'in one NVLink domain':<22}{placed[0]:>4}{placed[1]:>22}")
    kept = [len(run.whole_racks()) for run in runs]
    lines.append(f"{'racks whole at the end':<22}{kept[0]:>4}{kept[1]:>22}")
    return "\n".join(lines)


def _in_one_domain(run: Run) -> int:
    """Groups placed whole in one rack."""
    return sum(1 for group, size, *_ in GROUPS if (racks := run.racks(group)).total() == size and len(racks) == 1)


def _allreduce(racks: Counter[int]) -> float:
    return MNNVL_ALLREDUCE_GBPS if len(racks) == 1 else NETWORK_ALLREDUCE_GBPS


def _where(run: Run, group: str, size: int) -> str:
    """Where this extender put the group: its rack and trays, and the step if it waited."""
    members = _members(run, group)
    if len(members) < size:
        return f"waiting ({len(members)}/{size} placed)"
    racks = sorted({rack_of(placement.node) for placement in members})
    trays = _ranges([int(placement.node.rsplit("t", 1)[1]) for placement in members])
    where = f"rack {racks[0]} trays {trays}" if len(racks) == 1 else f"racks {'+'.join(map(str, racks))}"
    return where + (f" at step {min(p.start for p in members)}" if f"{group}-00" in run.waited else "")


def _made_room(run: Run, group: str) -> str:
    """The pods whose end let a waiting group in: those that ended in its racks at the step it was placed."""
    members = _members(run, group)
    if not members:
        return ""
    start = min(placement.start for placement in members)
    racks = {rack_of(placement.node) for placement in members}
    ended = sorted(name for name, placement in run.placed.items()
                   if placement.end == start and rack_of(placement.node) in racks)
    return f", until {', '.join(ended)} ends at step {start}" if ended else ""


def _members(run: Run, group: str) -> list[Placement]:
    return [placement for name, placement in run.placed.items() if _member(name, group)]


def _spread(run: Run, group: str, size: int) -> str:
    """Where count-only put the group: how many racks, and how many trays in each."""
    racks = run.racks(group)
    placed = racks.total()
    where = (f"rack {next(iter(racks))}" if len(racks) == 1 else
             f"{len(racks)} racks ({'+'.join(str(racks[rack]) for rack in sorted(racks))} trays)")
    return where + ("" if placed == size else f", {size - placed} members waiting")


def _ranges(numbers: list[int]) -> str:
    """1,2,3,5 as 01-03,05."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ",".join(f"{low:02d}" if low == high else f"{low:02d}-{high:02d}" for low, high in spans)


def _member(name: str, group: str) -> bool:
    return name.rsplit("-", 1)[0] == group
