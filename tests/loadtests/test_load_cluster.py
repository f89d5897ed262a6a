"""The load tests' cluster (loadtests/large_cluster_server.py) keeps working as the extender and DemoCluster
change: the soak, the load test and the hostile-node benchmark all stand on it, and none of them runs in CI."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import large_cluster_server as load  # noqa: E402
from hostile_node import SHAPES  # noqa: E402

from extender.api.dra import CLAIMS_MARKER  # noqa: E402
from extender.api.wire import BindingArgs, ExtenderArgs  # noqa: E402
from extender.cache.dra_inventory import NodeClass  # noqa: E402
from extender.demo.dra_objects import gpu_slice  # noqa: E402
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


def dra_held(cluster: load.LoadCluster, node: str) -> frozenset[str]:
    """The UUIDs of the node's GPUs that the cluster's allocated claims hold."""
    gpus = cluster.topologies[node].gpus
    return frozenset(gpus[index].uuid or "" for where, held in cluster.claims.values() if where == node
                     for index in held)


def test_a_dra_share_makes_that_share_dra_nodes_whose_fill_is_held_by_claims() -> None:
    service, cluster, _, facts = load.build(100, 0.45, 40, seed=1, dra_share=0.3)
    names = load.node_names(100)
    dra = load.dra_names(names, 0.3)
    assert facts["dra_nodes"] == len(dra) == 30
    assert {cluster.platform_of[name] for name in dra} == set(cluster.platform_of.values())
    classes = {name: service.state.dra.node_class(name) for name in names}
    assert {name for name, found in classes.items() if found is NodeClass.DRA_GPU} == set(dra)
    # The slices `make bench-dra` built before: gpu_slice shuffled with a seed per node, drawn in name order.
    seeds = random.Random(load.DRA_SEED)
    for name in dra:
        uuids = [gpu.uuid or "" for gpu in cluster.topologies[name].gpus]
        shuffled = gpu_slice(name, uuids, seed=seeds.randrange(1 << 30))["spec"]["devices"]
        assert service.state.dra.order(name) == tuple(device["attributes"]["uuid"]["string"] for device in shuffled)
        assert cluster._node(name)["status"]["allocatable"][service.state.resource] == "0"
    assert len({service.state.dra.order(name) for name in dra}) > 25, "each node's order its own"
    # The fill's GPUs on DRA nodes: held by claims, each reserved for the pod the kubelet gave them to.
    assert facts["dra_claims"] == len(cluster.claims) > 0
    assert {node for node, _ in cluster.claims.values()} <= set(dra)
    for name in dra:
        view = service.state.view(name)
        assert service.state.dra.taken(name, view.ids) == dra_held(cluster, name)
    for uid, (node, held) in cluster.claims.items():
        assert cluster.delivered_gpus(uid) == tuple(sorted(held))
        assert service.state.dra.held_by(uid, node) == frozenset(cluster.topologies[node].gpus[i].uuid for i in held)


def test_dra_load_pods_ask_through_a_shipped_template_or_nvidia_gpu_and_parse_with_their_count() -> None:
    service, cluster, _, _ = load.build(40, 0.45, 16, seed=1, dra_share=0.5)
    templates = load.claim_templates()
    for index in range(16):
        pod = load.load_pod(index, dra=True)
        request = service.pod_request(pod)
        size = load.LOAD_SIZES[index % len(load.LOAD_SIZES)]
        assert (request.gpus, request.problem) == (size, None), index
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        if index % 4 >= 2:
            assert load.claims_only(pod) and request.containers == ()
            assert limits[CLAIMS_MARKER] == "1" and service.state.resource not in limits
            assert pod["spec"]["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": f"gpus-{size}"}]
            assert cluster.made[pod["metadata"]["uid"]]["spec"] == templates[f"gpus-{size}"]
        else:
            assert not load.claims_only(pod) and limits[service.state.resource] == str(size)
        assert load.load_pod(index) != pod or index % 4 < 2
    assert "resourceClaims" not in load.load_pod(3)["spec"], "without DRA nodes the load's pods are as before"


def test_dra_churn_ends_and_makes_claims_with_their_pods() -> None:
    service, cluster, churn, _ = load.build(60, 0.05, 30, seed=1, dra_share=0.5)  # few fill pods: load pods end
    churn.thread.start()
    names = load.node_names(60)
    dra = set(load.dra_names(names, 0.5))
    bound = 0
    for index in range(40):
        pod = load.load_pod(index, dra=True)
        uid = pod["metadata"]["uid"]
        passed = [name for name in service.filter(ExtenderArgs(pod, names, None)).passed
                  if name in dra or not load.claims_only(pod)]
        if not passed:
            continue
        node = passed[index % len(passed)]
        if not (cluster.prebind(uid, node) or service.bind(BindingArgs(pod["metadata"]["name"], load.LOAD_NAMESPACE,
                                                                       uid, node))):
            bound += 1
    deadline = time.monotonic() + 10
    while churn.ended < bound and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bound > 20 and churn.ended == bound
    with cluster._lock:
        assert held_twice(cluster) == []
        for name in dra:  # what the claims hold is what the running pods hold, no more
            view = service.state.view(name)
            assert service.state.dra.taken(name, view.ids) == dra_held(cluster, name)
        assert set(cluster.claims) <= set(cluster.pods) and set(cluster.made) <= set(cluster.pods)
        requested = service.state.dra._requested
        made = {f"{claim['metadata']['namespace']}/{claim['metadata']['name']}" for claim in cluster.made.values()}
        assert made <= requested.keys()
        ended = [load.made_claim(load.load_pod(index, dra=True)) for index in range(40)]
        gone = {f"{claim['metadata']['namespace']}/{claim['metadata']['name']}" for claim in ended
                if claim is not None and claim["metadata"]["ownerReferences"][0]["uid"] not in cluster.pods}
        assert gone and not gone & requested.keys(), "an ended pod's claim is deleted with it"
