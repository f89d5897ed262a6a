"""End to end, a group past its age bound (issue 29): a real kube-scheduler (v1.36) and our extender with
`--group-age-bound 10` on 8 GB200 trays in two NVLink domains of 4.

A required group of 4 whole trays finds no domain with room: domain a has one old 1-GPU pod, domain b two young
ones. After 10 s of waiting it drains the domain predicted to free soonest, b (its pods have run for less time,
and a running pod is predicted to run as long again as it has), though a has more GPUs free. Its members'
PodScheduled reason says so. 1-GPU pods created meanwhile keep landing, in domain a only: b's free GPUs are held
for the group. When b's pods end, the group lands whole in b. Throughout, no member of the group is bound before
it can be placed whole, nothing is given twice and no bind is refused.

Runs only with real binaries (KUBE_BIN_DIR, as test_scheduling_e2e.py); otherwise the module is one skip.
"""

from __future__ import annotations

import logging
import time

import pytest
from helpers.group_scenario import CLUSTER_UUID, GPUS_PER_MEMBER, KEYS, LEAF, LEVELS, PLATFORM, REQUIRED, SPINE
from kube_e2e import Cluster, ClusterSpec, find_kube_binaries, gpu_pod, skip_reason, wait_until
from test_groups_e2e import Observer, all_bound, check_placements, empty

from extender.verbs.group_placement import AGE_DRAINING
from topology.fabric import CLIQUE_LABEL

_BINARIES, _PROBLEM = find_kube_binaries()
if _PROBLEM is not None:
    pytest.skip(skip_reason(_PROBLEM), allow_module_level=True)

log = logging.getLogger("e2e")

AGE_BOUND = 10
TRAYS = 4
LABELS = {f"gb200-{key}{index:02d}": {CLIQUE_LABEL: f"{CLUSTER_UUID}.{number}", SPINE: "spine-1", LEAF: f"leaf-{key}"}
          for number, key in enumerate("ab", 1) for index in range(TRAYS)}
CLUSTER_SPEC = ClusterSpec(nodes={name: PLATFORM for name in LABELS}, labels=LABELS,
                           extender_args=("--topology-levels", ",".join(LEVELS),
                                          "--group-age-bound", str(AGE_BOUND)))
GROUP = {KEYS.group: "aged", KEYS.group_size: str(TRAYS), KEYS.group_placement: REQUIRED}


def single(cluster: Cluster, name: str, node: str | None = None) -> None:
    cluster.kube.create_pod(gpu_pod(name, 1, scheduler=cluster.scheduler_name, namespace=cluster.namespace,
                                    node=node))


def reasons(cluster: Cluster, names: list[str]) -> list[str]:
    """kube-scheduler's latest PodScheduled message for each of these pods (updated at every failed attempt)."""
    found = []
    for pod in cluster.kube.list_pods(cluster.namespace):
        if pod["metadata"]["name"] in names:
            found += [condition.get("message", "") for condition in (pod.get("status") or {}).get("conditions") or []
                      if condition.get("type") == "PodScheduled"]
    return found


def test_a_group_past_its_age_bound_drains_the_domain_predicted_to_free_soonest(spec_cluster: Cluster) -> None:
    cluster = spec_cluster
    empty(cluster)
    run = Observer(cluster)
    single(cluster, "old", "gb200-a00")
    run.until("the old pod bound", all_bound(["old"]))
    cluster.reporter.refresh()  # its node agent reports it: running since this report
    time.sleep(3)
    single(cluster, "young-0", "gb200-b00")
    single(cluster, "young-1", "gb200-b01")
    run.until("the young pods bound", all_bound(["young-0", "young-1"]))
    members = [f"aged-{index}" for index in range(TRAYS)]
    run.waiting.add("aged")
    for name in members:
        cluster.kube.create_pod(gpu_pod(name, GPUS_PER_MEMBER, scheduler=cluster.scheduler_name,
                                        namespace=cluster.namespace, annotations=GROUP))
    run.until("the group refused: no domain has room", lambda _: any(
        "no NVLink domain with room for 4 pods of 4 GPUs" in reason for reason in reasons(cluster, members)))
    assert cluster.extender_metric("gpu_topology_extender_drains") == 0
    time.sleep(AGE_BOUND + 1)
    single(cluster, "nudge", "gb200-a01")  # a cluster event: kube-scheduler tries the waiting group again
    run.until("the group drains past its age bound",
              lambda _: any(AGE_DRAINING in reason for reason in reasons(cluster, members)))
    assert cluster.extender_metric("gpu_topology_extender_drains") == 1
    singles = [f"single-{index}" for index in range(3)]
    for name in singles:
        single(cluster, name)
    pods = run.until("1-GPU pods land meanwhile", all_bound(singles + ["nudge"]))
    nodes = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in pods if pod["spec"].get("nodeName")}
    assert {nodes[name][len("gb200-")] for name in singles} == {"a"}, nodes  # b's free GPUs are held for the group
    assert not set(members) & set(nodes)
    cluster.reporter.refresh()
    run.waiting.discard("aged")
    for name in ("young-0", "young-1"):
        cluster.kube.delete_pod(name, cluster.namespace)
    pods = run.until("the group lands whole in the drained domain", all_bound(members))
    nodes = {pod["metadata"]["name"]: pod["spec"]["nodeName"] for pod in pods if pod["spec"].get("nodeName")}
    assert sorted(nodes[name] for name in members) == [f"gb200-b{index:02d}" for index in range(TRAYS)]
    check_placements(run, pods)
    wait_until(lambda: cluster.extender_metric("gpu_topology_extender_drains") == 0, 30, "the drain ended",
               watch=cluster.processes.values())
