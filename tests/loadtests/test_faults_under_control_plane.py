"""What loadtests/faults.py and loadtests/ledger_probe.py work out without a cluster: a fault's figures from the moments
pods were created and bound, the proxies' routing and cut, the ledger compared with the pods' sealed annotations, the
probe's view of a ledger, the arguments it refuses, and the exit without binaries. The run itself is
tests/e2e/test_faults_e2e.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from helpers.paths import LOADTESTS, ROOT
from helpers.reported_nodes import reported_cluster

sys.path.insert(0, str(LOADTESTS))

import faults  # noqa: E402
import ledger_probe  # noqa: E402

from extender.cache.seal import Seal  # noqa: E402
from kube_e2e import local_get, node_topologies  # noqa: E402

KEYS = faults.KEYS


def test_a_fault_s_figures_are_its_rates_pause_backlog_and_catch_up() -> None:
    # A pod created and bound every second until 10 s; binds stop from 10 s to 16 s while pods keep coming; the
    # backlog of 6 is bound at 16.5 s, then one a second again.
    created = [float(second) for second in range(30)]
    binds = [second + 0.1 for second in range(10)] + [16.5] * 7 + [second + 0.1 for second in range(17, 30)]
    found = faults.figures(binds, created, start=10.0, back=10.0, window=8.0)
    assert found.before == pytest.approx(8 / 8)  # 2.1 .. 9.1
    assert found.around == pytest.approx((7 + 1) / 8)  # 16.5 x 7 and 17.1, from 10 to 18
    assert found.pause == pytest.approx(6.5)  # 10.0 -> 16.5
    assert found.backlog == 7  # pods 10 .. 16 created, none bound
    assert found.caught_up == pytest.approx(6.5)
    # A window that ends before the binds come back: the largest backlog is the window's, caught up after it, but
    # only if that is before the next fault
    assert faults.figures(binds, created, 10.0, 10.0, 4.0).caught_up == pytest.approx(6.5)
    assert faults.figures(binds, created, 10.0, 10.0, 4.0, horizon=15.0).caught_up is None


def test_the_pause_counts_from_the_control_plane_back_and_to_the_window_s_end() -> None:
    created = [float(second) for second in range(40)]
    binds = [second + 0.1 for second in range(10)] + [25.0]
    # kube-apiserver down from 10 to 20 s: the pause counts from 20 s; nothing after 25 s, so up to 28 s
    found = faults.figures(binds, created, start=10.0, back=20.0, window=8.0)
    assert found.pause == pytest.approx(5.0)
    assert found.around == pytest.approx(1 / 18)
    assert found.caught_up is None  # the backlog never came back to its size at the fault


def test_a_fault_that_costs_nothing_caught_up_at_once() -> None:
    created = [float(second) for second in range(20)]
    binds = [second + 0.1 for second in range(20)]
    found = faults.figures(binds, created, start=10.05, back=10.05, window=5.0)
    assert (found.backlog, found.caught_up) == (1, 0.0)  # pod 10, created at 10.0 and bound at 10.1
    assert found.pause == pytest.approx(1.0, abs=0.06)


@pytest.fixture
def echo() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that answers each chunk with itself."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=lambda c=connection: [c.sendall(d) for d in iter(lambda: c.recv(4096), b"")],
                             daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    server.close()


def test_the_proxy_forwards_to_its_route_refuses_without_one_and_cuts_every_connection(echo: int) -> None:
    route: list[int | None] = [echo]
    proxy = faults.TcpProxy(lambda: route[0])
    try:
        kept = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
        kept.sendall(b"ping")
        assert kept.recv(4) == b"ping"
        route[0] = None  # no leader: a new connection is refused, the one made stays
        try:
            refused = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
            assert refused.recv(1) == b""  # closed at once, with a reset or without
        except ConnectionResetError:
            pass
        kept.sendall(b"pong")
        assert kept.recv(4) == b"pong"
        assert proxy.cut() == 1
        assert kept.recv(4) == b""  # closed by the cut
    finally:
        proxy.close()


def _pod(name: str, uid: str, node: str, gpus: list[str], seal: Seal) -> dict:
    text = ",".join(gpus)
    containers = f"main={text}"
    return {"metadata": {"name": name, "uid": uid, "annotations": {
                KEYS.gpus: text, KEYS.containers: containers, KEYS.seal: seal.sign(uid, node, text, containers)}},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(len(gpus))}}}]}}


def test_the_ledger_is_compared_with_the_pods_entry_by_entry_and_by_each_node_s_free_gpus() -> None:
    topologies = node_topologies({"n1": "dgx2-v100"})
    uuids = [gpu.uuid for gpu in topologies["n1"].gpus]
    seal = Seal(b"k" * 32)
    bound = [_pod("a", "uid-a", "n1", uuids[:2], seal), _pod("b", "uid-b", "n1", uuids[2:3], seal)]
    ledger = {"leads": True, "free": {"n1": uuids[3:]},
              "entries": [{"uid": "uid-a", "pod": "faults/a", "node": "n1", "gpus": uuids[1::-1], "phase": "bound"},
                          {"uid": "uid-b", "pod": "faults/b", "node": "n1", "gpus": uuids[2:3], "phase": "bound"}]}
    assert faults.ledger_differences(ledger, bound, topologies) == []
    assert faults.misplaced(bound, topologies, seal) == []

    wrong = json.loads(json.dumps(ledger))
    wrong["entries"][1]["gpus"] = uuids[5:6]  # b held elsewhere on the board
    wrong["entries"].append({"uid": "uid-c", "pod": "faults/c", "node": "n1", "gpus": uuids[6:7], "phase": "binding"})
    wrong["free"]["n1"] = uuids[4:]
    found = faults.ledger_differences(wrong, bound, topologies)
    assert any(line.startswith("uid-b:") for line in found)
    assert any(line.startswith("uid-c:") and "None" in line for line in found)
    assert "uid-c: binding" in found
    assert "n1: free 12 GPUs, 13 expected" in found


def test_a_pod_whose_seal_or_gpus_are_not_the_extender_s_is_found() -> None:
    topologies = node_topologies({"n1": "dgx2-v100", "n2": "dgx2-v100"})
    uuids = [gpu.uuid for gpu in topologies["n1"].gpus]
    seal = Seal(b"k" * 32)
    forged = _pod("forged", "uid-f", "n1", uuids[:1], Seal(b"x" * 32))
    elsewhere = _pod("elsewhere", "uid-e", "n2", uuids[1:2], seal)  # n1's GPU on n2
    assert faults.misplaced([forged, elsewhere], topologies, seal) == [
        "forged: seal does not check out", f"elsewhere: GPUs {uuids[1]!r} not of n2"]


def test_the_probe_shows_the_ledger_and_each_node_s_free_gpus() -> None:
    state = reported_cluster({"n1": ("dgx2-v100", ())})
    ids = state.view("n1").ids
    state.ledger.bound(state.ledger.reserve("uid-a", "faults/a", "n1", frozenset(ids[:2])))
    state.ledger.reserve("uid-b", "faults/b", "n1", frozenset(ids[2:3]))
    services = [SimpleNamespace(state=state, leads=lambda: True)]
    server = ledger_probe.serve_probe(0, services)  # type: ignore[arg-type] - the probe reads these two
    try:
        status, body = local_get(server.server_address[1], "/ledger")
        assert status == 200
        shown = json.loads(body)
        assert shown["leads"] is True
        assert sorted((e["uid"], e["phase"], tuple(e["gpus"])) for e in shown["entries"]) == [
            ("uid-a", "bound", tuple(sorted(ids[:2]))), ("uid-b", "binding", (ids[2],))]
        assert shown["free"] == {"n1": list(ids[3:])}
        assert local_get(server.server_address[1], "/other")[0] == 404
    finally:
        server.shutdown()


def test_the_probe_answers_503_until_the_extender_built_its_service() -> None:
    server = ledger_probe.serve_probe(0, [])
    try:
        assert local_get(server.server_address[1], "/ledger")[0] == 503
    finally:
        server.shutdown()


@pytest.mark.parametrize(("argv", "says"), [
    (["--pods", "200", "--rate", "10"], "faults 5 s apart"),
    (["--nodes", "10", "--pods", "2000", "--rate", "5"], "more than 90% of 10 nodes' GPUs"),
    (["--faults", "kill-leader,unplug"], "--faults"),
])
def test_arguments_that_cannot_give_each_fault_its_windows_are_refused(
        argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        faults.parse_args(argv)
    assert says in capsys.readouterr().err


def test_the_window_defaults_to_the_lease_plus_one_retry_and_three_seconds() -> None:
    args = faults.parse_args(["--lease", "8", "--renew", "4", "--retry", "1"])
    assert args.window == 12
    assert faults.Timings(args.lease, args.renew, args.retry).bound == 9


def test_without_binaries_it_says_why_and_exits_2() -> None:
    env = {key: value for key, value in os.environ.items() if key != "KUBE_BIN_DIR"}
    done = subprocess.run([sys.executable, str(LOADTESTS / "faults.py")], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert "KUBE_BIN_DIR is not set" in done.stderr
