"""The load tests' cluster (loadtests/large_cluster_server.py) keeps working as the extender and DemoCluster
change: the soak, the load test and the hostile-node benchmark all stand on it, and none of them runs in CI."""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import large_cluster_server as load  # noqa: E402
from hostile_node import SHAPES  # noqa: E402

from extender.api.wire import BindingArgs, ExtenderArgs  # noqa: E402
from topology.codec import decode_state, encode_topology  # noqa: E402


def held_twice(cluster: load.LoadCluster) -> list[str]:
    counts = Counter(gpu for containers in cluster.delivered.values() for held in containers.values() for gpu in held)
    return [gpu for gpu, count in counts.items() if count > 1]


def test_pods_bind_churn_and_boards_are_replaced_with_no_gpu_twice() -> None:
    service, cluster, churn, facts = load.build(60, 0.45, 50, seed=1)
    assert facts["used_gpus"] >= 0.45 * facts["gpus"]
    churn.thread.start()
    rng = random.Random(2)
    names = load.node_names(60)
    bound = 0
    for index in range(40):
        pod = load.load_pod(index)
        node = rng.choice(names)
        if not service.bind(BindingArgs(pod["metadata"]["name"], load.LOAD_NAMESPACE, pod["metadata"]["uid"], node)):
            bound += 1
        if index % 5 == 0:
            boards = {name: service.state.view(name).compiled for name in names}
            replaced = cluster.replace_board(rng)
            assert replaced is not None, "some node holds no pod at this fill"
            assert service.state.view(replaced).compiled is not boards[replaced], "the extender sees the new board"
            with cluster._lock:  # the churn thread adds and ends pods meanwhile
                assert not any(pod["spec"].get("nodeName") == replaced for pod in cluster.pods.values())
    assert bound > 0 and cluster.api_calls >= bound
    assert cluster.boards_replaced > 0
    with cluster._lock:  # the churn thread changes pods and deliveries under this lock
        assert held_twice(cluster) == []
        delivered = {uid: dict(containers) for uid, containers in cluster.delivered.items()}
        annotations = {uid: cluster.pods[uid]["metadata"]["annotations"] for uid in delivered}
    # Every pod the kubelet admitted got exactly the GPUs the extender annotated.
    for uid, containers in delivered.items():
        annotated = annotations[uid][service.state.keys.gpus].split(",")
        assert sorted(gpu for held in containers.values() for gpu in held) == sorted(annotated)


def test_a_pod_is_copied_when_admitted_unless_the_caller_hands_it_over() -> None:
    _, cluster, _, _ = load.build(20, 0.45, 0, seed=1)
    kept, handed = load.load_pod(900), load.load_pod(901)
    stored = cluster.add_pod(kept)
    assert stored is not kept and stored["spec"] is not kept["spec"] and stored == kept
    adopted = cluster.add_pod(handed, adopt=True)
    assert adopted["spec"] is handed["spec"] and adopted["metadata"] is handed["metadata"], "not copied"
    assert cluster.pods[handed["metadata"]["uid"]] is adopted


def test_the_hostile_node_publishes_a_new_used_set_each_rotation(tmp_path: Path) -> None:
    path = tmp_path / "hostile.json"
    path.write_text(encode_topology(SHAPES["circulant-40"][1]()), encoding="utf-8")
    service, cluster, _, _ = load.build(20, 0.45, 10, seed=1, hostile=path)
    view = service.state.view(load.HOSTILE_NODE)
    assert view is not None and view.compiled is not None and view.compiled.size == 40
    rng = random.Random(3)
    seen = set()
    for _ in range(5):
        free = cluster.rotate_hostile(rng)
        node = cluster._node(load.HOSTILE_NODE)
        used = decode_state(node["metadata"]["annotations"][service.state.keys.state]).used
        assert len(used) == 40 - free
        seen.add(used)
    assert len(seen) > 1


def test_planned_groups_hold_their_slots_against_the_load_and_do_not_expire() -> None:
    service, cluster, churn, facts = load.build(200, 0.45, 20, seed=1, leaf_nodes=20, plans=12)
    assert facts["plans"] == 12 and facts["planned_slots"] == sum(load.plan_members(group) for group in range(12))
    assert facts["planned_gpus"] == load.PLAN_GPUS * facts["planned_slots"]
    held = {gpu for entry in service.state.ledger.pods() if entry.pod_uid.startswith("plan:") for gpu in entry.gpus}
    assert len(held) == facts["planned_gpus"]
    churn.thread.start()
    names = load.node_names(200)
    for index in range(30):
        pod = load.load_pod(index)
        passed = service.filter(ExtenderArgs(pod, names, None)).passed
        if passed:
            service.bind(BindingArgs(pod["metadata"]["name"], load.LOAD_NAMESPACE, pod["metadata"]["uid"], passed[0]))
    with cluster._lock:
        delivered = {gpu for containers in cluster.delivered.values() for ids in containers.values() for gpu in ids}
    assert not delivered & held, "a load pod got a planned GPU"
    assert len(service.plans) == 12
