"""Acceptance for exact delivery: four real boards, over 200 pods bound concurrently through the extender's
real bind, every container given exactly the GPUs annotated for it, through a kubelet restart (issue 8).

Each node runs the kubelet stand-in, the node agent's device plugin and its reporter on real sockets; the
extender watches the in-process API server and binds through the real client (`delivery_cluster.py`).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import orjson
import pytest

from helpers.delivery_cluster import DeliveryCluster, gpu_pod, workload
from helpers.reporter_fakes import short_tmpdir

NODES = (("v100", "dgx1-v100"), ("a6000", "rtx-a6000-pairs"), ("tree", "pcie-8gpu-switch-tree"),
         ("h100", "dgx-h100"))
PODS = 210


@pytest.fixture
def cluster() -> Iterator[DeliveryCluster]:
    running = DeliveryCluster(short_tmpdir(), NODES)
    try:
        yield running
    finally:
        running.close()


def _run(cluster: DeliveryCluster, pods: list[dict], *, restart_after: int | None = None,
         binders: int = 8, lifetime: tuple[float, float] = (0.2, 0.8)) -> list[str]:
    """Create and schedule every pod (retrying while nothing fits), finish each a while after admission;
    returns the pods that could not be scheduled in time."""
    rng = random.Random(5)
    stuck: list[str] = []
    done = threading.Event()

    def finisher() -> None:
        finished: set[str] = set()
        while not done.is_set() or len(finished) < sum(1 for a in cluster.admitted() if a.admission.admitted):
            now = time.monotonic()
            for admitted in list(cluster.admitted()):
                uid = admitted.pod["metadata"]["uid"]
                if uid not in finished and admitted.admission.admitted:
                    ends = getattr(admitted, "ends", None)
                    if ends is None:
                        admitted.ends = now + rng.uniform(*lifetime)  # type: ignore[attr-defined]
                    elif now >= ends:
                        finished.add(uid)
                        cluster.server.delete_pod(admitted.pod["metadata"]["namespace"],
                                                  admitted.pod["metadata"]["name"])
            done.wait(0.02)

    def restarter() -> None:
        assert restart_after is not None
        cluster.wait(lambda: sum(1 for _ in cluster.admitted()) >= restart_after, 120, "pods before the restart")
        for name in cluster.rigs:
            cluster.restart_kubelet(name)

    def place(pod: dict) -> None:
        created = cluster.server.add_pod(pod)
        deadline = time.monotonic() + 90
        while (answer := cluster.schedule(created)) != "":
            if time.monotonic() > deadline:
                stuck.append(f"{pod['metadata']['name']}: {answer}")
                return
            time.sleep(0.03)

    helpers = [threading.Thread(target=finisher, daemon=True)]
    if restart_after is not None:
        helpers.append(threading.Thread(target=restarter, daemon=True))
    for thread in helpers:
        thread.start()
    with ThreadPoolExecutor(max_workers=binders) as pool:
        list(pool.map(place, pods))
    cluster.wait(lambda: sum(1 for _ in cluster.admitted()) >= len(pods) - len(stuck), 60, "every admission")
    done.set()
    for thread in helpers:
        thread.join(120)
    return stuck


def _size(pod: dict) -> int:
    """GPUs the pod holds while it runs: its app containers and sidecars."""
    running = pod["spec"]["containers"] + [c for c in pod["spec"].get("initContainers", [])
                                           if c.get("restartPolicy") == "Always"]
    return sum(int(c["resources"]["limits"]["nvidia.com/gpu"]) for c in running)


def _shape(pod: dict) -> str:
    init = pod["spec"].get("initContainers", [])
    if init:
        return "sidecar" if init[0].get("restartPolicy") == "Always" else "init"
    return "two" if len(pod["spec"]["containers"]) == 2 else "one"


def _mismatches(cluster: DeliveryCluster) -> float:
    return sum(sample.value for metric in cluster.service.metrics.mismatches.collect() for sample in metric.samples
               if sample.name.endswith("_total"))


def _annotated(pod: dict) -> dict[str, set[str]]:
    return {name: set(ids)
            for name, ids in orjson.loads(pod["metadata"]["annotations"]["gpu-topology.io/containers"]).items()}


def test_every_container_gets_exactly_its_annotated_gpus_through_a_kubelet_restart(cluster: DeliveryCluster) -> None:
    assert _run(cluster, workload(PODS, seed=3), restart_after=PODS // 2) == []
    admitted = list(cluster.admitted())
    assert len(admitted) == PODS
    assert [a.admission.message for a in admitted if not a.admission.admitted] == []
    wrong = []
    for entry in admitted:
        planned = _annotated(entry.pod)
        got = {c.name: set(c.devices.get("nvidia.com/gpu", ())) for c in entry.admission.containers}
        listed = {name: set(ids) for name, ids in entry.listed.items() if ids}
        if got != planned or any(listed[name] != planned[name] for name in listed):
            wrong.append((entry.pod["metadata"]["name"], planned, got, listed))
        assert set(listed) == {c["name"] for c in entry.pod["spec"]["containers"]
                               + [c for c in entry.pod["spec"].get("initContainers", [])
                                  if c.get("restartPolicy") == "Always"]}
    assert wrong == []
    for rig in cluster.rigs.values():
        assert rig.shared == [], "no GPU held by two live containers"
        calls = rig.kubelet.calls("GetPreferredAllocation")
        assert calls and [call.error for call in calls if call.error] == []
    assert {_size(entry.pod) for entry in admitted} == {1, 2, 4, 8}
    assert {_shape(entry.pod) for entry in admitted} == {"one", "two", "init", "sidecar"}
    assert _mismatches(cluster) == 0
    # Everything ended: the extender's ledger and views are whole again.
    cluster.wait(lambda: len(cluster.state.ledger) == 0 and all(
        view.free == view.compiled.full_mask for view in cluster.state.views().values()), 30, "every GPU free")


def test_scheduling_only_with_a_plugin_that_ignores_us_leaves_no_pod_pending_on_a_usable_node() -> None:
    """The stock plugin stays and picks its own GPUs: the ledger follows the kubelet, so capacity is never
    counted twice and every pod finds its node once the reporter has reported."""
    cluster = DeliveryCluster(short_tmpdir(), NODES, mode="report")
    try:
        pods = workload(80, seed=9)
        assert _run(cluster, pods) == []
        admitted = list(cluster.admitted())
        assert len(admitted) == 80 and all(entry.admission.admitted for entry in admitted)
        differs = [entry for entry in admitted if {c.name: set(c.devices.get("nvidia.com/gpu", ()))
                                                   for c in entry.admission.containers} != _annotated(entry.pod)]
        assert differs, "a plugin that ignores us does not deliver the chosen GPUs"
        assert _mismatches(cluster) > 0
        cluster.wait(lambda: len(cluster.state.ledger) == 0 and all(
            view.free == view.compiled.full_mask for view in cluster.state.views().values()), 30, "every GPU free")
    finally:
        cluster.close()


def test_a_restarted_kubelet_that_lists_no_pod_yet_frees_no_gpu() -> None:
    cluster = DeliveryCluster(short_tmpdir(), (("h100", "dgx-h100"),))
    try:
        for number, size in enumerate((4, 2)):
            assert cluster.schedule(cluster.server.add_pod(gpu_pod(f"held-{number}", "one", size))) == ""
        cluster.wait(lambda: len(list(cluster.admitted())) == 2, 30, "both pods admitted")
        held = {gpu for entry in cluster.admitted() for gpus in entry.admission.container("main").devices.values()
                for gpu in gpus}
        cluster.wait(lambda: cluster.state.views()["h100"].reported_used == held, 30, "the report of both pods")
        cluster.restart_kubelet("h100", readmit=False)
        lost: set[str] = set()
        deadline = time.monotonic() + 2.0  # ten report rounds
        while time.monotonic() < deadline:
            lost |= held - cluster.state.views()["h100"].reported_used
            time.sleep(0.05)
        newcomer = cluster.server.add_pod(gpu_pod("newcomer", "one", 4))
        bound = cluster.schedule(newcomer) == ""
        taken = set(orjson.loads(cluster.server.pod("jobs", "newcomer")["metadata"]["annotations"].get(
            "gpu-topology.io/containers", "{}")).get("main", ())) if bound else set()
        assert not lost, f"after the restart the extender saw {sorted(lost)} free while their pods ran"
        assert not taken & held, f"the newcomer was bound to {sorted(taken & held)}, held by running pods"
    finally:
        cluster.readmit_all("h100")
        cluster.close()
