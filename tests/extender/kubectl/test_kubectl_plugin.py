"""`kubectl gputopo` against the in-process API server, holding the demo's nodes and pods as the extender left them.

The cluster: the demo's DemoCluster (real captures, GPU UUIDs, each node agent's report of what the kubelet
delivered), with pods placed by the extender's own filter, prioritize and bind. Then a few objects are changed as
real clusters change them: one node's report is ten minutes old, one node's state annotation is garbage, one
node's report shows the kubelet gave a pod other GPUs and does not list another pod yet; one node carries GPU
feature discovery's clique label, another a label that disagrees with its agent's reading.

Figures checked by hand against the bundled captures (topology/captures/): on the RTX A6000 board each bridged
pair is NV4 at 14 GB/s per link, 56 GB/s; a ring of four over two pairs on one socket runs at PCIe Gen4 x16 times
NODE, 31.5 x 0.5 = 15.75 GB/s; on the DGX H100 every pair is NV18 through NVSwitch, 18 x 25 = 450 GB/s.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson
import pytest

from extender.api.wire import BindingArgs, ExtenderArgs
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.demo.dra_objects import allocated_claim, gpu_slice
from extender.kubectl.plugin import main
from extender.verbs.service import ExtenderService
from helpers.kube_api_server import CLAIMS, SLICES, FakeKubeApiServer, now_rfc3339
from topology.cli import render
from topology.codec import NodeState, decode_topology, encode_state
from topology.fabric import CLIQUE_LABEL, Domain
from topology.platforms import PLATFORMS

NODES = (("dgx-h100-1", "dgx-h100"), ("dgx-h100-2", "dgx-h100"), ("a6000-1", "rtx-a6000-pairs"),
         ("a6000-2", "rtx-a6000-pairs"), ("l40s-1", "pcie-l40s"), ("dgx1-v100-1", "dgx1-v100"))
CLUSTER_UUID = "0b1c2d3e-4f50-4172-8394-a5b6c7d8e9f0"
LABELLED = f"{CLUSTER_UUID}.1"  # dgx-h100-1's clique label
READ, LABEL = f"{CLUSTER_UUID}.2", f"{CLUSTER_UUID}.3"  # dgx-h100-2: its agent reads one domain, its label says another
NVLINK = {"gpu-topology.io/interconnect": "nvlink", "gpu-topology.io/placement": "required"}
WAITING = {"gpu-topology.io/min-bandwidth": "500", "gpu-topology.io/group": "trainers",
           "gpu-topology.io/group-size": "2"}
STALE_SECONDS = 600


@dataclass(frozen=True)
class Loaded:
    server: FakeKubeApiServer
    kubeconfig: Path
    cluster: DemoCluster


def _place(cluster: DemoCluster, service: ExtenderService, name: str, gpus: int, candidates: list[str],
           annotations: dict[str, str] | None = None) -> str:
    """One scheduling cycle as kube-scheduler runs it; the node bound to."""
    pod = cluster.create_pod(name, gpus, annotations)
    verdict = service.filter(ExtenderArgs(pod, candidates, None))
    _, scores = service.prioritize(ExtenderArgs(pod, verdict.passed, None))
    node = max(zip(verdict.passed, scores, strict=True), key=lambda scored: scored[1])[0]
    assert service.bind(BindingArgs(name, "default", pod["metadata"]["uid"], node)) == ""
    return node


def _failed_scheduling(cluster: DemoCluster, service: ExtenderService, pod: dict[str, Any]) -> dict[str, Any]:
    """The Event kube-scheduler writes when every node failed the extender's filter, with its reasons."""
    verdict = service.filter(ExtenderArgs(pod, [name for name, _ in NODES], None))
    assert not verdict.passed
    failed = {**verdict.failed, **verdict.unresolvable}
    message = f"0/{len(NODES)} nodes are available: " + ", ".join(
        f"{len(names)} {reason}" for reason, names in sorted(failed.items())) + "."
    meta = pod["metadata"]
    return {"metadata": {"name": f"{meta['name']}.fs", "namespace": meta["namespace"]}, "type": "Warning",
            "reason": "FailedScheduling", "message": message, "count": 3, "lastTimestamp": now_rfc3339(),
            "source": {"component": "gpu-topology-scheduler"},
            "involvedObject": {"kind": "Pod", "name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}}


def _with_state(node: dict[str, Any], state: str) -> dict[str, Any]:
    node["metadata"]["annotations"]["gpu-topology.io/state"] = state
    return node


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    state = ClusterState()
    h100 = PLATFORMS["dgx-h100"].topology()
    cluster = DemoCluster(state, NODES, boards={"dgx-h100-2": replace(h100, domain=Domain(READ))},
                          labels={"dgx-h100-1": {CLIQUE_LABEL: LABELLED}, "dgx-h100-2": {CLIQUE_LABEL: LABEL}})
    service = ExtenderService(state, cluster, topology_wait=0)
    assert _place(cluster, service, "pair", 2, ["a6000-1"], NVLINK) == "a6000-1"
    assert _place(cluster, service, "quad", 4, ["a6000-1"]) == "a6000-1"
    assert _place(cluster, service, "h100-job", 4, ["dgx-h100-1"]) == "dgx-h100-1"
    assert _place(cluster, service, "swapped", 2, ["a6000-2"]) == "a6000-2"
    assert _place(cluster, service, "early", 2, ["a6000-2"]) == "a6000-2"
    waiting = cluster.create_pod("waiting", 4, WAITING)
    cluster.create_pod("notebook", 1, namespace="team-a")
    events = [_failed_scheduling(cluster, service, waiting)]

    nodes = {node["metadata"]["name"]: node for node in cluster.list_nodes()[0]}
    now = datetime.now(timezone.utc)
    ids = cluster.topologies["a6000-2"].gpus
    # a6000-2's agent: the kubelet gave `swapped` GPUs 4 and 5, and has not admitted `early` yet.
    _with_state(nodes["a6000-2"], encode_state(NodeState(
        frozenset({ids[4].uuid, ids[5].uuid}), frozenset(), now, 7, {"default/swapped": frozenset({ids[4].uuid,
                                                                                                    ids[5].uuid})})))
    _with_state(nodes["l40s-1"], encode_state(NodeState(frozenset(), frozenset(),
                                                        datetime.fromtimestamp(time.time() - STALE_SECONDS,
                                                                               timezone.utc), 3)))
    _with_state(nodes["dgx1-v100-1"], "{not json")

    server = FakeKubeApiServer().start()
    for node in nodes.values():
        server.add_node(node)
    for pod in cluster.pods.values():
        server.add_pod(pod)
    for event in events:
        server.create_event(event["metadata"]["namespace"], event)
    server.create_event("default", {**events[0], "metadata": {"name": "other.fs", "namespace": "default"},
                                    "involvedObject": {"kind": "Pod", "name": "pair", "namespace": "default"},
                                    "message": "not about the waiting pod"})
    kubeconfig = server.write_kubeconfig(tmp_path_factory.mktemp("kubectl") / "kubeconfig")
    try:
        yield Loaded(server, kubeconfig, cluster)
    finally:
        server.stop()


def run(loaded: Loaded, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--kubeconfig", str(loaded.kubeconfig)])
    out, err = capsys.readouterr()
    return code, out, err


def rows(text: str) -> dict[str, dict[str, str]]:
    """A kubectl table by its first column; columns are three or more spaces apart."""
    header, *lines = text.strip().splitlines()
    names = re.split(r" {3,}", header.strip())
    return {cells[0]: dict(zip(names, cells, strict=True))
            for cells in (re.split(r" {3,}", line.strip()) for line in lines)}


def section(text: str, title: str) -> str:
    """The indented table under a title line of `kubectl gputopo node` or `pod`."""
    lines = text.splitlines()
    start = next(index for index, line in enumerate(lines) if line.startswith(title)) + 1
    end = next((index for index in range(start, len(lines)) if not lines[index].startswith("  ")), len(lines))
    return "\n".join(lines[start:end])


def holder_of(text: str) -> dict[str, tuple[str, str]]:
    return {gpu: (row["HOLDER"], row["SOURCE"]) for gpu, row in rows(section(text, "GPUs and their holders")).items()}


# ---------------------------------------------------------------------------------------------------------
# kubectl gputopo nodes
# ---------------------------------------------------------------------------------------------------------

def test_nodes_shows_free_gpus_rings_whole_sets_domains_and_state(loaded: Loaded, capsys) -> None:
    code, out, err = run(loaded, capsys, "nodes")
    assert code == 0 and err == ""
    table = rows(out)
    assert list(table) == sorted(name for name, _ in NODES)
    a6000 = table["a6000-1"]
    # pair took bridge pair 0-1 and quad 4-7 (two pairs on one socket): bridge pair 2-3 is all that is left.
    assert (a6000["MODEL"], a6000["FREE"], a6000["RING-2"], a6000["RING-4"], a6000["RING-8"], a6000["WHOLE"]) == \
        ("NVIDIA RTX A6000", "2/8", "56.0", "-", "-", "2:1 4:0 8:0")
    h100 = table["dgx-h100-1"]
    assert (h100["FREE"], h100["RING-2"], h100["RING-4"], h100["WHOLE"], h100["DOMAIN"], h100["STATE"]) == \
        ("4/8", "450.0", "450.0", "2:2 4:1 8:0", LABELLED, "ok")
    assert table["dgx-h100-2"]["FREE"] == "8/8" and table["dgx-h100-2"]["DOMAIN"] == "refused"
    assert table["dgx-h100-2"]["WHOLE"] == "2:4 4:2 8:1"
    assert re.fullmatch(r"stale: GPU state is 6\d\d s old \(over 120 s\)", table["l40s-1"]["STATE"])
    assert table["dgx1-v100-1"]["STATE"].startswith("refused: GPU state annotation is invalid: state: not JSON")
    assert table["dgx1-v100-1"]["FREE"] == "-/8" and table["dgx1-v100-1"]["WHOLE"] == "-"


def test_nodes_wide_adds_unhealthy_observed_and_why_a_domain_was_refused(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "nodes", "-o", "wide")
    table = rows(out)
    assert code == 0 and table["a6000-1"]["UNHEALTHY"] == "0"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", table["a6000-1"]["OBSERVED"])
    assert table["dgx-h100-2"]["DOMAIN"] == (f"refused: the node agent reads {READ} in NVML, label {CLIQUE_LABEL} "
                                             f"says {LABEL}")


def test_nodes_json_is_a_list_of_figures(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "nodes", "-o", "json")
    document = orjson.loads(out)
    assert code == 0 and document["kind"] == "GPUTopologyNodeList"
    items = {item["name"]: item for item in document["items"]}
    assert items["a6000-1"] == {**items["a6000-1"], "gpus": 8, "free": 2, "unhealthy": 0,
                                "rings": {"2": 56.0, "4": None, "8": None}, "whole": {"2": 1, "4": 0, "8": 0},
                                "domain": None, "domainProblem": None, "state": "ok", "reason": None}
    assert items["dgx-h100-1"]["rings"] == {"2": 450.0, "4": 450.0, "8": None}
    assert items["dgx-h100-1"]["domain"] == LABELLED
    assert items["dgx-h100-2"]["domain"] is None and LABEL in items["dgx-h100-2"]["domainProblem"]
    assert items["l40s-1"]["state"] == "stale" and items["dgx1-v100-1"]["state"] == "refused"
    assert items["dgx1-v100-1"]["free"] is None


# ---------------------------------------------------------------------------------------------------------
# kubectl gputopo node NAME
# ---------------------------------------------------------------------------------------------------------

def test_node_prints_the_matrix_as_gputopo_show_then_holders_and_free_sets(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "node", "a6000-1")
    assert code == 0
    topology = decode_topology(loaded.server.node("a6000-1")["metadata"]["annotations"]["gpu-topology.io/topology"])
    assert out.startswith(render("node a6000-1", topology) + "\n")
    holders = holder_of(out)
    assert {gpu: holders[gpu] for gpu in "01"} == {gpu: ("default/pair/main", "kubelet") for gpu in "01"}
    assert {gpu: holders[gpu] for gpu in "4567"} == {gpu: ("default/quad/main", "kubelet") for gpu in "4567"}
    assert {gpu: holders[gpu] for gpu in "23"} == {gpu: ("-", "free") for gpu in "23"}
    free = rows(section(out, "Best free set for each k (2 free)"))
    assert free["2"] == {"K": "2", "GPUS": "2,3", "RING GB/S": "56.0", "WEAKEST HOP": "NVLink", "FULL BANDWIDTH": "yes"}
    assert "Full-bandwidth sets still whole: 2:1 4:0 8:0" in out


def test_node_holders_say_who_the_kubelet_gave_what_and_what_is_only_bound(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "node", "a6000-2")
    holders = holder_of(out)
    assert code == 0
    # The kubelet gave `swapped` GPUs 4 and 5, not the 0 and 1 it was bound to: the container is not known for
    # either, and the bound ones stay counted until a report covers them, as the extender's ledger does.
    assert {gpu: holders[gpu] for gpu in "45"} == {gpu: ("default/swapped", "kubelet") for gpu in "45"}
    assert {gpu: holders[gpu] for gpu in "01"} == {gpu: ("default/swapped", "bound") for gpu in "01"}
    assert {gpu: holders[gpu] for gpu in "23"} == {gpu: ("default/early/main", "bound") for gpu in "23"}
    assert {gpu: holders[gpu] for gpu in "67"} == {gpu: ("-", "free") for gpu in "67"}


def test_node_json_and_wide(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "node", "dgx-h100-2", "-o", "json")
    document = orjson.loads(out)
    assert code == 0 and document["kind"] == "GPUTopologyNode"
    assert (document["name"], document["free"], document["cliqueLabel"], document["reportedDomain"]) == \
        ("dgx-h100-2", 8, LABEL, READ)
    assert [held["source"] for held in document["holders"]] == [None] * 8
    assert document["freeSets"][3] == {"count": 4, "gpus": [0, 1, 2, 3], "ringGbps": 450.0, "weakest": "NVLink",
                                       "full": True}
    _, wide, _ = run(loaded, capsys, "node", "dgx-h100-1", "-o", "wide")
    uuids = [gpu.uuid for gpu in loaded.cluster.topologies["dgx-h100-1"].gpus]
    assert [row["UUID"] for row in rows(section(wide, "GPUs and their holders")).values()] == uuids


def test_a_refused_node_shows_its_board_and_why_but_no_holders(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "node", "dgx1-v100-1")
    assert code == 0 and out.startswith("node dgx1-v100-1\n  8x Tesla V100-SXM2-16GB")
    assert "\nState: refused: GPU state annotation is invalid: state: not JSON" in out
    assert "GPUs and their holders" not in out and "Best free set" not in out


def test_node_not_found_is_one_line_and_exit_1(loaded: Loaded, capsys) -> None:
    assert run(loaded, capsys, "node", "nope") == (1, "", "error: node nope not found\n")


# ---------------------------------------------------------------------------------------------------------
# kubectl gputopo pod NAME
# ---------------------------------------------------------------------------------------------------------

def test_pod_shows_its_gpus_ring_and_that_the_kubelet_delivered_them(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "pod", "pair")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "Pod default/pair (Pending), on node a6000-1"
    assert lines[1] == "Request: 2 GPUs, interconnect nvlink, placement required"
    assert lines[2].startswith("GPUs: 0,1 (GPU-")
    assert "  container main: 0,1" in lines
    assert "Ring: 56.0 GB/s (the extender wrote 56)" in lines
    assert "Delivered: yes: the node agent reports exactly these GPUs for the pod; reported: 0,1" in lines


def test_pod_delivered_other_gpus_or_not_yet(loaded: Loaded, capsys) -> None:
    _, swapped, _ = run(loaded, capsys, "pod", "swapped")
    assert "Delivered: NO: the kubelet gave it other GPUs; reported: 4,5" in swapped.splitlines()
    _, early, _ = run(loaded, capsys, "pod", "early", "-o", "json")
    placement = orjson.loads(early)["placement"]
    assert (placement["gpus"], placement["delivery"], placement["delivered"], placement["sealed"]) == \
        ([2, 3], "not-reported", [], True)
    assert placement["containers"] == [{"name": "main", "gpus": [2, 3]}]
    assert placement["ringGbps"] == 56.0


def test_a_waiting_pod_gets_the_extenders_reasons_and_the_closest_nodes(loaded: Loaded, capsys) -> None:
    code, out, _ = run(loaded, capsys, "pod", "waiting")
    assert code == 0 and out.startswith("Pod default/waiting (Pending), not bound to a node\n")
    assert "Request: 4 GPUs, interconnect any, min-bandwidth 500 GB/s, placement required" in out
    why = next(line for line in out.splitlines() if line.startswith("Why it waits: "))
    assert why.startswith(f"Why it waits: 0/{len(NODES)} nodes are available: ")
    assert "Group: trainers (annotation; size 2, span nvlink-domain, preferred); members: default/waiting on " \
           "(not bound)" in out
    closest = rows(section(out, "Closest nodes"))
    assert list(closest) == ["dgx-h100-2", "dgx-h100-1", "a6000-1"]  # the best ring, then the most free GPUs
    assert closest["dgx-h100-2"]["FREE"] == "8/8" and closest["dgx-h100-2"]["RING GB/S"] == "450.0"
    assert closest["dgx-h100-2"]["MEETS ITS REQUEST"] == \
        "no: best ring with 4 free GPUs is 450.0 GB/s over NVLink; the pod needs at least 500.0 GB/s"
    assert closest["a6000-1"]["BEST SET"] == "-"
    assert closest["a6000-1"]["MEETS ITS REQUEST"] == "no: needs 4 GPUs, 2 free"
    events = rows(section(out, "Events"))
    assert list(events) == ["Warning"] and events["Warning"]["REASON"] == "FailedScheduling"


def test_a_waiting_pod_as_json(loaded: Loaded, capsys) -> None:
    _, out, _ = run(loaded, capsys, "pod", "waiting", "-o", "json")
    document = orjson.loads(out)
    assert document["kind"] == "GPUTopologyPod" and document["placement"] is None
    assert document["failedScheduling"].startswith(f"0/{len(NODES)} nodes are available")
    assert [offer["node"] for offer in document["closest"]] == ["dgx-h100-2", "dgx-h100-1", "a6000-1"]
    assert document["closest"][0] == {"node": "dgx-h100-2", "free": 8, "total": 8, "gpus": [0, 1, 2, 3],
                                      "ringGbps": 450.0, "weakest": "NVLink", "full": True, "fits": False,
                                      "why": "best ring with 4 free GPUs is 450.0 GB/s over NVLink; the pod needs "
                                             "at least 500.0 GB/s"}
    assert document["group"] == {"name": "trainers", "source": "annotation", "size": 2, "span": "nvlink-domain",
                                 "required": False, "members": [{"pod": "default/waiting", "node": None}]}


def test_pod_namespace_from_the_flag_or_the_context(loaded: Loaded, capsys, tmp_path: Path) -> None:
    assert run(loaded, capsys, "pod", "notebook") == (1, "", "error: pod default/notebook not found\n")
    for argv in (("pod", "notebook", "-n", "team-a"), ("-n", "team-a", "pod", "notebook")):  # flags go anywhere
        code, out, _ = run(loaded, capsys, *argv)
        assert code == 0 and out.startswith("Pod team-a/notebook (Pending), not bound to a node")
    kubeconfig = tmp_path / "contexts"
    kubeconfig.write_text(loaded.kubeconfig.read_text().replace(
        "contexts: [", "contexts: [{name: team, context: {cluster: test, user: client, namespace: team-a}}, "))
    assert main(["pod", "notebook", "--kubeconfig", str(kubeconfig), "--context", "team"]) == 0
    assert capsys.readouterr().out.startswith("Pod team-a/notebook")


# ---------------------------------------------------------------------------------------------------------
# kubectl's conventions: errors, exit codes, the installed executable
# ---------------------------------------------------------------------------------------------------------

def test_an_unreachable_api_server_is_one_line_and_exit_1(capsys, tmp_path: Path) -> None:
    server = FakeKubeApiServer().start()
    kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
    server.stop()
    assert main(["nodes", "--kubeconfig", str(kubeconfig)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"error: the API server at {server.url} cannot be reached: list nodes: ")
    assert "Connection refused" in err


def test_a_missing_kubeconfig_or_a_bad_flag_is_one_line_and_exit_1(capsys, tmp_path: Path) -> None:
    assert main(["nodes", "--kubeconfig", str(tmp_path / "none")]) == 1
    _, err = capsys.readouterr()
    assert err.startswith(f"error: kubeconfig {tmp_path / 'none'}: ") and err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["nodes", "-o", "yaml"])
    assert exit_.value.code == 1 and "error: argument -o/--output: invalid choice: 'yaml'" in capsys.readouterr().err
    assert main(["nodes", "--annotation-prefix", "Not_A_Prefix"]) == 1
    assert capsys.readouterr().err.startswith("error: annotation prefix 'Not_A_Prefix' is not a DNS subdomain")


def test_the_executable_kubectl_finds_is_installed(loaded: Loaded) -> None:
    executable = Path(sys.executable).parent / "kubectl-gputopo"
    done = subprocess.run([str(executable), "nodes", "--kubeconfig", str(loaded.kubeconfig)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert rows(done.stdout)["a6000-1"]["FREE"] == "2/8"


def test_a_dra_node_shows_where_its_gpus_come_from_and_what_its_claims_hold(tmp_path: Path, capsys) -> None:
    cluster = DemoCluster(ClusterState(), (("a6000-dra", "rtx-a6000-pairs"),))
    uuids = [gpu.uuid or "" for gpu in cluster.topologies["a6000-dra"].gpus]
    with FakeKubeApiServer() as server:
        server.add_node(cluster.list_nodes()[0][0])
        server.put(SLICES, gpu_slice("a6000-dra", uuids, seed=3))
        server.put(CLAIMS, allocated_claim("c1", "a6000-dra", ["gpu-0", "gpu-5", "gpu-6"]))
        kubeconfig = server.write_kubeconfig(tmp_path / "kubeconfig")
        code = main(["nodes", "-o", "json", "--kubeconfig", str(kubeconfig)])
        (item,) = orjson.loads(capsys.readouterr().out)["items"]
        assert code == 0 and (item["gpusFrom"], item["free"]) == ("dra-gpu", 5)
        assert main(["node", "a6000-dra", "--kubeconfig", str(kubeconfig)]) == 0
        assert "GPUs from: a DRA driver's ResourceSlices (kube-scheduler's DRA plugin picks them, first fit)" in \
            capsys.readouterr().out
