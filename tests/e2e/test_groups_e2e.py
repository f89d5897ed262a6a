"""End to end, whole groups (issue 17, item 7): a real kube-scheduler (v1.36) and our extender place groups of 4-GPU
pods on 36 GB200 trays in two NVLink domains, interleaved with 1-GPU pods. tests/helpers/group_scenario.py holds the
cluster, the arrivals and the checks (shared with the in-process version, tests/extender/groups/test_groups_cluster.py),
and says why the outcome is certain wherever kube-scheduler puts the 1-GPU pods.

Runs only with real binaries (KUBE_BIN_DIR, as test_scheduling_e2e.py); otherwise the module is one skip. It has a
cluster of its own (CLUSTER_SPEC, conftest's spec_cluster): the trays with their clique, leaf and spine labels, the
extender with --topology-levels, and kube-scheduler's own pod groups switched on (the GenericWorkload and
GangScheduling gates on kube-apiserver and kube-scheduler, scheduling.k8s.io/v1alpha2 served).

The namespace's pods are listed every half second all through each test, and every listing is checked: no group's
bound members span two domains, and no member of a group that cannot be placed is bound. At the end, each group
was planned once and every member holds its slot of that plan, nothing is given twice, and no bind was refused.
Before a group is deleted to make room, the fake node agents report the bound pods' GPUs, as real ones would have
by then: the freed trays are free only through the extender's record of what ended since the report. Each test
starts from an empty namespace, so each also runs alone.

- Groups named by our annotations (`gpu-topology.io/group`, `group-size`, `group-placement: required`): kube-
  scheduler takes their pods one at a time; the extender plans a group whole at its first member's filter.
- A group larger than a domain in segments (`group-segment`, across the spine): one whole segment in each domain.
- kube-scheduler's own pod group (`spec.schedulingGroup.podGroupName` naming a PodGroup with a gang policy): v1.36
  with both gates schedules the group's pods together in one pod-group cycle (our filter and prioritize for each
  member in turn, then a binding cycle for each, through our bind, once the gang's minCount is met) and records
  the outcome in the PodGroup's `PodGroupScheduled` condition; the extender reads the group's size from the
  PodGroup (its gang minCount) through its watch. While a gang cannot be placed and nothing else is queued, v1.36
  tries it again back to back: a pod-group member is requeued by backoff alone (no event-based requeueing for pod
  groups yet), and SchedulerPopFromBackoffQ pops the backoff queue whenever the active queue is empty. That is
  about a hundred pod-group cycles a second, each calling our filter once per member.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from helpers.group_scenario import (
    DOMAINS,
    FIRST_WAVE,
    FREES_ROOM,
    GPUS_PER_MEMBER,
    KEYS,
    LEVELS,
    PLATFORM,
    REQUIRED,
    WAITING,
    Arrival,
    bound_members,
    domains_of_groups,
    first_wave,
    gpus_given_twice,
    members_without_a_tray,
    moment_problems,
    node_of,
    plan_of,
    plan_problems,
    tray_labels,
    waiting_group,
)
from topology.fabric import CLIQUE_LABEL
from kube_e2e import (
    POD_GROUP_GATES,
    POD_GROUP_RUNTIME_CONFIG,
    Cluster,
    ClusterSpec,
    find_kube_binaries,
    gpu_pod,
    pod_group,
    skip_reason,
    wait_until,
)

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

log = logging.getLogger("e2e")

LABELS = tray_labels()
CLUSTER_SPEC = ClusterSpec(nodes={name: PLATFORM for name in LABELS}, labels=LABELS,
                           extender_args=("--topology-levels", ",".join(LEVELS)), feature_gates=POD_GROUP_GATES,
                           runtime_config=POD_GROUP_RUNTIME_CONFIG)
BIND_SECONDS = 300.0  # a shared 2-core VM; the scheduler's backoff alone can reach 10 s
HOLD_SECONDS = 15.0  # longer than kube-scheduler's longest backoff: the waiting group is tried again meanwhile
POLL_SECONDS = 0.5
DECISIONS = "gpu_topology_extender_decisions_total"
FILTER_CALLS = "gpu_topology_extender_request_seconds_count"


class Observer:
    """The namespace's pods, listed at every poll; each listing is checked against what must hold at every moment."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.waiting: set[str] = set()  # groups that cannot be placed now: none of their members may be bound
        self.segments: dict[str, int] = {}  # segmented groups: how many segments, the domains they may span
        self.polls = 0
        self.started = time.monotonic()
        self.bind_errors = self.refused_binds()

    def refused_binds(self) -> float:
        """The binds the extender has refused so far (kube-scheduler's Events do not show them: a pod's second
        FailedScheduling within minutes only updates the series of its first)."""
        return self.cluster.extender_metric(DECISIONS, verb="bind", outcome="error")

    def pods(self) -> list[dict[str, Any]]:
        pods = self.cluster.kube.list_pods(self.cluster.namespace)
        self.polls += 1
        problems = moment_problems(pods, LABELS, self.waiting, self.segments)
        assert not problems, f"poll {self.polls}: {problems}"
        return pods

    def until(self, what: str, done: Callable[[list[dict[str, Any]]], bool],
              timeout: float = BIND_SECONDS) -> list[dict[str, Any]]:
        """Poll until `done(pods)`; the pods of the last poll."""
        def check() -> list[dict[str, Any]] | None:
            pods = self.pods()
            return pods if done(pods) else None

        pods = wait_until(check, timeout, what, watch=self.cluster.processes.values(), interval=POLL_SECONDS,
                          diagnose=self.pending)
        log.info("%6.1f s  %s (%d polls)", time.monotonic() - self.started, what, self.polls)
        return pods

    def hold(self, seconds: float, what: str) -> list[dict[str, Any]]:
        """Keep polling for `seconds`; logs how often kube-scheduler called the extender's filter meanwhile."""
        filters = self.cluster.extender_metric(FILTER_CALLS, verb="filter")
        deadline = time.monotonic() + seconds
        pods = self.until(what, lambda _: time.monotonic() >= deadline, seconds + BIND_SECONDS)
        log.info("filter calls while holding: %.0f a second",
                 (self.cluster.extender_metric(FILTER_CALLS, verb="filter") - filters) / seconds)
        return pods

    def pending(self) -> str:
        """kube-scheduler's last word on each pending pod (its PodScheduled condition)."""
        lines = []
        for pod in self.cluster.kube.list_pods(self.cluster.namespace):
            if not node_of(pod):
                conditions = [condition for condition in (pod.get("status") or {}).get("conditions") or []
                              if condition.get("type") == "PodScheduled"]
                said = conditions[0].get("message", "") if conditions else "never tried"
                lines.append(f"pending {pod['metadata']['name']}: {said}")
        return "\n".join(lines) or "no pod pending"


def empty(cluster: Cluster) -> None:
    """Delete every pod of the namespace, and wait until they are gone."""
    for pod in cluster.kube.list_pods(cluster.namespace):
        cluster.kube.delete_pod(pod["metadata"]["name"], cluster.namespace)
    wait_until(lambda: not cluster.kube.list_pods(cluster.namespace), 60, "an empty namespace",
               watch=cluster.processes.values())
    cluster.reporter.refresh()


def create(cluster: Cluster, arrivals: Iterable[Arrival]) -> list[str]:
    names = []
    for arrival in arrivals:
        cluster.kube.create_pod(gpu_pod(arrival.pod, arrival.gpus, scheduler=cluster.scheduler_name,
                                        namespace=cluster.namespace, annotations=arrival.annotations()))
        names.append(arrival.pod)
    return names


def create_gang(cluster: Cluster, name: str, size: int) -> list[str]:
    """kube-scheduler's own PodGroup with a gang of `size`, then its members (4 GPUs each, placement required)."""
    cluster.kube.create_pod_group(pod_group(name, size, namespace=cluster.namespace))
    names = [f"{name}-{index}" for index in range(size)]
    for pod in names:
        cluster.kube.create_pod(gpu_pod(pod, GPUS_PER_MEMBER, scheduler=cluster.scheduler_name,
                                        namespace=cluster.namespace, annotations={KEYS.group_placement: REQUIRED},
                                        pod_group=name))
    return names


def all_bound(names: Iterable[str]) -> Callable[[list[dict[str, Any]]], bool]:
    wanted = set(names)
    return lambda pods: wanted <= {pod["metadata"]["name"] for pod in pods if node_of(pod)}


def refused(cluster: Cluster, names: Iterable[str], reason: str) -> Callable[[list[dict[str, Any]]], bool]:
    """Whether kube-scheduler has told one of these pods (a FailedScheduling event) the extender's `reason`."""
    wanted = set(names)

    def seen(_: list[dict[str, Any]]) -> bool:
        return any(event.get("reason") == "FailedScheduling" and reason in (event.get("message") or "")
                   and (event.get("involvedObject") or {}).get("name") in wanted
                   for event in cluster.kube.list_events(cluster.namespace))

    return seen


def domain_of(pods: list[dict[str, Any]], group: str) -> str:
    (domain,) = domains_of_groups(pods, LABELS)[group]
    return domain


def check_placements(run: Observer, pods: list[dict[str, Any]]) -> None:
    """Nothing given twice on any node, each bound member holds 4 GPUs of the tray it is bound to, and the extender
    refused no bind (a plan holds its members' GPUs)."""
    assert gpus_given_twice(pods) == {}
    assert run.refused_binds() == run.bind_errors, "the extender refused binds (its log says which and why)"
    uuids = {name: frozenset(gpu.uuid for gpu in topology.gpus) for name, topology in run.cluster.topologies.items()}
    assert members_without_a_tray(pods, uuids) == []


def scheduled_condition(cluster: Cluster, name: str) -> dict[str, Any]:
    """The PodGroupScheduled condition kube-scheduler wrote on the PodGroup (empty before its first cycle)."""
    conditions = (cluster.kube.get_pod_group(name, cluster.namespace).get("status") or {}).get("conditions") or []
    return next((condition for condition in conditions if condition.get("type") == "PodGroupScheduled"), {})


def test_groups_land_whole_and_a_waiting_group_takes_the_domain_a_deleted_group_frees(spec_cluster: Cluster) -> None:
    cluster = spec_cluster
    empty(cluster)
    run = Observer(cluster)
    wave = first_wave()
    run.until("the first wave bound", all_bound(create(cluster, wave)))
    cluster.reporter.refresh()  # the node agents report the bound pods' GPUs before the deletion below, as they would

    group, size = WAITING
    run.waiting.add(group)
    waiting = create(cluster, waiting_group())
    run.until(f"{group} refused by the extender",
              refused(cluster, waiting, f"no NVLink domain with room for {size} pods of {GPUS_PER_MEMBER} GPUs"))
    pods = run.hold(HOLD_SECONDS, f"{group} still waiting with no member bound")
    freed = domain_of(pods, FREES_ROOM)
    for name, members in FIRST_WAVE:
        assert plan_problems(pods, name, members) == []
    check_placements(run, pods)

    run.waiting.discard(group)
    for pod in bound_members(pods, FREES_ROOM):
        cluster.kube.delete_pod(pod["metadata"]["name"], cluster.namespace)
    pods = run.until(f"{group} bound after {FREES_ROOM} was deleted", all_bound(waiting))

    assert domain_of(pods, group) == freed
    check_placements(run, pods)
    assert plan_problems(pods, group, size) == []


def test_a_segmented_group_larger_than_a_domain_lands_one_whole_segment_in_each(spec_cluster: Cluster) -> None:
    """24 trays in segments of 12, across the spine: 12 in each NVLink domain, where a plan without segments puts
    18 in one and 6 in the other."""
    cluster = spec_cluster
    empty(cluster)
    run = Observer(cluster)
    run.segments["seg"] = 2
    annotations = {KEYS.group: "seg", KEYS.group_size: "24", KEYS.group_span: LEVELS[0],
                   KEYS.group_segment: "12", KEYS.group_placement: REQUIRED}
    names = [f"seg-{index}" for index in range(24)]
    for name in names:
        cluster.kube.create_pod(gpu_pod(name, GPUS_PER_MEMBER, scheduler=cluster.scheduler_name,
                                        namespace=cluster.namespace, annotations=annotations))
    pods = run.until("the segmented group bound", all_bound(names))
    per_domain = Counter(LABELS[node_of(pod)][CLIQUE_LABEL] for pod in bound_members(pods, "seg"))
    assert sorted(per_domain.values()) == [12, 12]
    check_placements(run, pods)
    assert plan_problems(pods, "seg", 24) == []


def test_kube_schedulers_own_pod_group_lands_whole_and_waits_whole(spec_cluster: Cluster) -> None:
    """Gangs of 9, then 18 (only the other domain is whole), then 10: the 10 fit nowhere until the 9 are deleted."""
    cluster = spec_cluster
    empty(cluster)
    run = Observer(cluster)
    nine = create_gang(cluster, "pg-9", 9)
    pods = run.until("gang pg-9 bound", all_bound(nine))
    home = domain_of(pods, "pg-9")
    eighteen = create_gang(cluster, "pg-18", 18)
    pods = run.until("gang pg-18 bound", all_bound(eighteen))
    assert domain_of(pods, "pg-18") == ({*DOMAINS.values()} - {home}).pop()
    cluster.reporter.refresh()

    run.waiting.add("pg-10")
    ten = create_gang(cluster, "pg-10", 10)
    run.until("gang pg-10 refused by the extender",
              refused(cluster, ten, f"no NVLink domain with room for 10 pods of {GPUS_PER_MEMBER} GPUs"))
    pods = run.hold(HOLD_SECONDS, "gang pg-10 still waiting with no member bound")
    waiting = scheduled_condition(cluster, "pg-10")
    assert (waiting.get("status"), waiting.get("reason")) == ("False", "Unschedulable"), waiting
    check_placements(run, pods)

    run.waiting.discard("pg-10")
    for pod in nine:
        cluster.kube.delete_pod(pod, cluster.namespace)
    pods = run.until("gang pg-10 bound after pg-9 was deleted", all_bound(ten))

    assert domain_of(pods, "pg-10") == home
    check_placements(run, pods)
    for name, size in (("pg-18", 18), ("pg-10", 10)):
        assert scheduled_condition(cluster, name).get("status") == "True", name
        # The extender knew the group by spec.schedulingGroup, and its size by the PodGroup's gang minCount.
        plans = [plan_of(pod) for pod in bound_members(pods, name)]
        assert all(plan is not None and plan["group"] == f"{cluster.namespace}/scheduling-group:{name}"
                   for plan in plans), plans
        assert plan_problems(pods, name, size) == []
