"""The group scenario of issue 17, item 7 (tests/helpers/group_scenario.py), in CI without Kubernetes binaries.

The in-process API server (tests/helpers/kube_api_server.py) holds the 36 GB200 trays, with their clique, leaf and spine
labels, and the pods. The extender runs as `serve` wires it (tests/helpers/extender_harness.py: the real client, the
reflectors, the service with --topology-levels) behind its real HTTP server (tests/helpers/extender_server.py). This
module plays kube-scheduler, as the real one does in tests/e2e/test_groups_e2e.py: the pods in arrival order, for each
its own count check (NodeResourcesFit: a tray's 4 GPUs less what the pods bound there request), then the extender's
filter over every tray that fits, prioritize, and bind to the best score, over HTTP (extender/demo/scheduler.py's
cycle). A pod the extender refuses is tried again after the next cluster event (a bind, a deletion), as its Extender
rejector makes kube-scheduler retry it then.

After every cycle the pods are checked as the end-to-end test checks them at every poll: no group's bound members
span two domains, and no member of the group that cannot be placed is bound. The scenario runs twice: with no
report since the trays were created, and with the node agents' reports of the bound pods' GPUs read before the
deletion, as the end-to-end test has them: a plan laid on GPUs freed since the node's last report must bind.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from helpers.extender_harness import Extender, board, node_annotations, start
from helpers.extender_server import running_server
from helpers.group_scenario import (
    FIRST_WAVE,
    FREES_ROOM,
    GPUS_PER_MEMBER,
    KEYS,
    LEVELS,
    PLATFORM,
    WAITING,
    Arrival,
    bound_members,
    domains_of_groups,
    first_wave,
    gpus_given_twice,
    members_without_a_tray,
    moment_problems,
    plan_problems,
    tray_labels,
    waiting_group,
)
from helpers.kube_api_server import FakeKubeApiServer, make_node, make_pod, wait_until

from extender.api.pod_request import DEFAULT_GPU_RESOURCE, effective_gpu_request
from extender.demo.scheduler import Scheduler

NAMESPACE = "ml"
LABELS = tray_labels()


class KubeScheduler:
    """kube-scheduler's side, reduced to what the scenario needs (the module's docstring says what)."""

    def __init__(self, server: FakeKubeApiServer, calls: Scheduler) -> None:
        self.server = server
        self.calls = calls  # filter, prioritize and bind over HTTP
        self.live: list[str] = []  # the pods' names, in arrival order
        self.pending: list[str] = []
        self.waiting: set[str] = set()  # groups that cannot be placed now: none of their members may be bound
        self.cycles = 0

    def add(self, arrivals: Iterable[Arrival]) -> list[str]:
        names = []
        for arrival in arrivals:
            self.server.add_pod(make_pod(arrival.pod, NAMESPACE, gpus=arrival.gpus, annotations=arrival.annotations()))
            names.append(arrival.pod)
        self.live += names
        self.pending += names
        return names

    def delete(self, names: Iterable[str]) -> None:
        for name in names:
            self.server.delete_pod(NAMESPACE, name)
            self.live.remove(name)

    def run(self) -> None:
        """Rounds over the pending pods in arrival order, until a round binds none: each bind is a cluster event
        after which the pods refused before it are tried again."""
        while [name for name in list(self.pending) if self._cycle(name)]:
            pass

    def pods(self) -> list[dict[str, Any]]:
        return [self.server.pod(NAMESPACE, name) for name in self.live]

    def _cycle(self, name: str) -> bool:
        pod = self.server.pod(NAMESPACE, name)
        fitting = self._fitting(effective_gpu_request(pod["spec"], DEFAULT_GPU_RESOURCE))
        node = self.calls.cycle(pod, fitting).node if fitting else None
        self.cycles += 1
        self._check()
        if node is not None:
            self.pending.remove(name)
        return node is not None

    def _fitting(self, gpus: int) -> list[str]:
        return [tray for tray in LABELS if GPUS_PER_MEMBER - sum(
            effective_gpu_request(pod["spec"], DEFAULT_GPU_RESOURCE) for pod in self.server.pods_on(tray)) >= gpus]

    def _check(self) -> None:
        problems = moment_problems(self.pods(), LABELS, self.waiting)
        assert not problems, f"after cycle {self.cycles}: {problems}"


@pytest.fixture(name="cluster")
def cluster_fixture() -> Iterator[tuple[FakeKubeApiServer, Extender, KubeScheduler]]:
    with FakeKubeApiServer() as server:
        for tray, labels in LABELS.items():
            server.add_node(make_node(tray, annotations=node_annotations(tray, platform=PLATFORM),
                                      gpus=GPUS_PER_MEMBER, labels=labels))
        extender = start(server, stale_after=3600.0, levels=LEVELS)
        try:
            with running_server(extender.service) as port, Scheduler(port) as scheduler:
                yield server, extender, KubeScheduler(server, scheduler)
        finally:
            extender.stop()


def report(server: FakeKubeApiServer, extender: Extender) -> None:
    """What each tray's node agent publishes: the GPUs the pods bound there hold, observed now; once the extender
    has read every report."""
    used: dict[str, frozenset[str]] = {}
    for tray in LABELS:
        used[tray] = frozenset(gpu for pod in server.pods_on(tray)
                               for gpu in (pod["metadata"].get("annotations") or {}).get(KEYS.gpus, "").split(",")
                               if gpu)
        node = server.node(tray)
        node["metadata"]["annotations"] = node_annotations(tray, platform=PLATFORM, used=used[tray],
                                                           observed=datetime.now(UTC), generation=2)
        server.update_node(node)
    wait_until(lambda: all((view := extender.state.view(tray)) is not None and view.reported_used == used[tray]
                           for tray in LABELS), what="the extender to read the reports")


@pytest.mark.parametrize("reported", [
    False,
    True,
], ids=["before-any-report", "reported-before-the-deletion"])
def test_groups_land_whole_and_a_waiting_group_takes_the_domain_a_deleted_group_frees(
        cluster: tuple[FakeKubeApiServer, Extender, KubeScheduler], reported: bool) -> None:
    server, extender, scheduler = cluster
    scheduler.add(first_wave())
    scheduler.run()
    assert scheduler.pending == [], f"not placed: {scheduler.pending}"

    group, size = WAITING
    scheduler.waiting.add(group)
    waiting = scheduler.add(waiting_group())
    scheduler.run()
    pods = scheduler.pods()
    assert set(scheduler.pending) == set(waiting)
    verdict = scheduler.calls.cycle(server.pod(NAMESPACE, waiting[0]), list(LABELS))
    assert set(verdict.refused.values()) == {f"no NVLink domain with room for {size} pods of {GPUS_PER_MEMBER} GPUs"}
    for name, members in FIRST_WAVE:
        assert plan_problems(pods, name, members) == []
    (freed,) = domains_of_groups(pods, LABELS)[FREES_ROOM]
    if reported:
        report(server, extender)

    scheduler.waiting.discard(group)
    gone = [pod["metadata"] for pod in bound_members(pods, FREES_ROOM)]
    scheduler.delete(meta["name"] for meta in gone)
    wait_until(lambda: all(extender.state.ledger.get(meta["uid"]) is None for meta in gone),
               what=f"the extender to see {FREES_ROOM}'s pods go")
    scheduler.run()

    pods = scheduler.pods()
    assert scheduler.pending == [], f"not placed: {scheduler.pending}"
    assert domains_of_groups(pods, LABELS)[group] == {freed}
    assert plan_problems(pods, group, size) == []
    assert gpus_given_twice(pods) == {}
    assert members_without_a_tray(pods, {tray: frozenset(gpu.uuid for gpu in board(tray, PLATFORM).gpus)
                                         for tray in LABELS}) == []
