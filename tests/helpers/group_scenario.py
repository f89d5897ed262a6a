"""Whole groups on GB200 trays (issue 17, item 7): the cluster, the arrivals and the checks, shared by the test with a
real kube-scheduler (tests/e2e/test_groups_e2e.py) and its in-process version for CI
(tests/extender/groups/test_groups_cluster.py), so that both run one scenario and judge it by one rule.

The cluster: 36 GB200 compute trays (4 GPUs behind NVSwitch each), 18 in each of two NVLink domains, labelled as
GPU feature discovery labels them (`nvidia.com/gpu.clique: <clusterUUID>.<cliqueId>`), each domain under its own
leaf of one spine (Topograph's labels). Every member of a group asks for 4 GPUs, so it takes a whole tray.

The arrivals: required groups of 9, 7, 5, 4, 3 and 2 members (30 trays), in that order, with a 1-GPU pod between
the first two members of each of the first four groups; then, once all of them are placed, a required group of 8.

Why the outcome does not depend on where kube-scheduler puts the 1-GPU pods:
- four 1-GPU pods break at most four trays. When a group is planned (at its first member), the groups before it
  hold U trays and the 1-GPU pods at most 4, so at least 36 - U - 4 trays are whole, and one domain has at least
  half of them: 32, 23, 16, 11, 7 and 4 whole trays for the groups of 9, 7, 5, 4, 3 and 2, of which half is each
  time at least the group's size. Every group of the first wave is placed, whichever domain best fit picks;
- then at most 36 - 30 = 6 trays are whole, so the group of 8 fits no domain: none of its members may bind;
- deleting the group of 9 makes its 9 trays whole again, all in one domain, while the other domain keeps at most 6:
  the group of 8 must then land whole in the domain the group of 9 left.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from topology.annotations import AnnotationKeys
from topology.fabric import CLIQUE_LABEL

KEYS = AnnotationKeys()
SPINE, LEAF = "network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf"
LEVELS = (SPINE, LEAF)  # --topology-levels, outermost first
CLUSTER_UUID = "9c6f5af3-53bf-49b5-a436-b66766c413c3"
DOMAINS = {"a": f"{CLUSTER_UUID}.1", "b": f"{CLUSTER_UUID}.2"}  # tray name prefix: the domain's clique
PLATFORM = "gb200-node"
TRAYS_PER_DOMAIN = 18
GPUS_PER_MEMBER = 4  # a whole tray

FIRST_WAVE: tuple[tuple[str, int], ...] = (("g9", 9), ("g7", 7), ("g5", 5), ("g4", 4), ("g3", 3), ("g2", 2))
SINGLES = 4  # 1-GPU pods, one after the first member of each of the first SINGLES groups
WAITING: tuple[str, int] = ("w8", 8)
FREES_ROOM = "g9"  # the group whose deletion makes a domain whole enough for WAITING
REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class Arrival:
    """One pod of the scenario: its name, its GPUs, and its group (None for a 1-GPU pod) of `size` members."""

    pod: str
    gpus: int
    group: str | None = None
    size: int = 0

    def annotations(self) -> dict[str, str]:
        if self.group is None:
            return {}
        return {KEYS.group: self.group, KEYS.group_size: str(self.size), KEYS.group_placement: REQUIRED}


def tray_labels() -> dict[str, dict[str, str]]:
    """Each tray by name, with its NVLink domain (GFD's clique label) and network levels (one spine, a leaf per
    domain)."""
    return {f"gb200-{key}{index:02d}": {CLIQUE_LABEL: clique, SPINE: "spine-1", LEAF: f"leaf-{key}"}
            for key, clique in DOMAINS.items() for index in range(TRAYS_PER_DOMAIN)}


def members(group: str, size: int) -> list[Arrival]:
    return [Arrival(f"{group}-{index}", GPUS_PER_MEMBER, group, size) for index in range(size)]


def first_wave() -> list[Arrival]:
    """The groups in order, each with a 1-GPU pod after its first member while there are 1-GPU pods left."""
    arrivals: list[Arrival] = []
    for number, (group, size) in enumerate(FIRST_WAVE):
        pods = members(group, size)
        if number < SINGLES:
            pods.insert(1, Arrival(f"single-{number}", 1))
        arrivals += pods
    return arrivals


def waiting_group() -> list[Arrival]:
    return members(*WAITING)


# The checks, on pods as the API server serves them.

def group_of(pod: Mapping[str, Any]) -> str | None:
    """The pod's group: our annotation, else kube-scheduler's own pod group (`spec.schedulingGroup`)."""
    named = ((pod.get("metadata") or {}).get("annotations") or {}).get(KEYS.group)
    scheduling_group = (pod.get("spec") or {}).get("schedulingGroup") or {}
    return named or scheduling_group.get("podGroupName")


def node_of(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def bound_members(pods: Iterable[Mapping[str, Any]], group: str) -> list[Mapping[str, Any]]:
    return [pod for pod in pods if group_of(pod) == group and node_of(pod)]


def domains_of_groups(pods: Iterable[Mapping[str, Any]], labels: Mapping[str, Mapping[str, str]]
                      ) -> dict[str, set[str]]:
    """Each group with a bound member: the NVLink domains (by the nodes' clique labels) its bound members are in."""
    found: dict[str, set[str]] = {}
    for pod in pods:
        group, node = group_of(pod), node_of(pod)
        if group is not None and node:
            found.setdefault(group, set()).add(labels[node].get(CLIQUE_LABEL, f"no clique on {node}"))
    return found


def moment_problems(pods: list[Mapping[str, Any]], labels: Mapping[str, Mapping[str, str]],
                    waiting: Iterable[str], segments: Mapping[str, int] | None = None) -> list[str]:
    """What must hold at every moment of the run: no group's bound members in more NVLink domains than it has
    segments (`segments`: a segmented group's count; else one), and no bound member of a group that cannot be
    placed now (`waiting`)."""
    problems = [f"bound members of group {group} span {len(domains)} NVLink domains: {sorted(domains)}"
                for group, domains in domains_of_groups(pods, labels).items()
                if len(domains) > (segments or {}).get(group, 1)]
    return problems + [f"{pod['metadata']['name']} bound while its group {group} cannot be placed"
                       for group in waiting for pod in bound_members(pods, group)]


def gpus_given_twice(pods: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
    """Per node, the GPUs that more than one live bound pod holds (`gpu-topology.io/gpus`)."""
    held: dict[str, Counter[str]] = {}
    for pod in pods:
        node = node_of(pod)
        if node:
            gpus = ((pod.get("metadata") or {}).get("annotations") or {}).get(KEYS.gpus, "")
            held.setdefault(node, Counter()).update(gpu for gpu in gpus.split(",") if gpu)
    return {node: sorted(gpu for gpu, count in counts.items() if count > 1)
            for node, counts in held.items() if any(count > 1 for count in counts.values())}


def members_without_a_tray(pods: Iterable[Mapping[str, Any]], uuids: Mapping[str, frozenset[str]]) -> list[str]:
    """The bound group members that did not get 4 distinct GPUs of the node they are bound to."""
    wrong = []
    for pod in pods:
        node = node_of(pod)
        if group_of(pod) is None or not node:
            continue
        gpus = ((pod.get("metadata") or {}).get("annotations") or {}).get(KEYS.gpus, "").split(",")
        if len(set(gpus)) != GPUS_PER_MEMBER or not set(gpus) <= uuids.get(node, frozenset()):
            wrong.append(f"{pod['metadata']['name']} on {node}: {gpus}")
    return wrong


def plan_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The group plan sealed on a bound member (`gpu-topology.io/group-plan`: the seal, a space, the plan)."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(KEYS.group_plan)
    return orjson.loads(value.partition(" ")[2]) if value else None


def plan_problems(pods: Iterable[Mapping[str, Any]], group: str, size: int) -> list[str]:
    """What breaks "planned once, whole, at the first member": the group's bound members carry one plan (the same
    planning time and slots) of `size` slots, and each holds the slot of that plan on its node, GPU for GPU."""
    problems, plans = [], set()
    for pod in bound_members(pods, group):
        name, plan = pod["metadata"]["name"], plan_of(pod)
        if plan is None:
            problems.append(f"{name}: bound without its group's plan")
            continue
        slots = {(node, frozenset(gpus.split(","))) for node, gpus in plan["slots"]}
        plans.add((plan["at"], frozenset(slots)))
        gpus = frozenset(((pod["metadata"].get("annotations") or {}).get(KEYS.gpus) or "").split(","))
        if len(slots) != size:
            problems.append(f"{name}: its plan has {len(slots)} slots, not {size}")
        if (node_of(pod), gpus) not in slots:
            problems.append(f"{name}: bound to {node_of(pod)} off its plan's slots")
    if len(plans) > 1:
        problems.append(f"group {group} was planned {len(plans)} times: {sorted(at for at, _ in plans)}")
    return problems
