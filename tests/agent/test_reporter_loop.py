"""The reporter's loop with its real edges: a real gRPC pod-resources server on a unix socket, the real
`kubernetes` client against the in-process API server, and a fake NVML built from a real capture.

Rounds are driven one by one with a fake monotonic clock where timing is the point (a change shows on the
next round, i.e. within one polling interval; nothing is written until the heartbeat), and the loop runs in
its own thread on real time where the wiring is (occupancy follows allocations, backoff, stop)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import grpc
import pytest
from helpers.fake_nvml import gpu_uuid, make_fake_nvml
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, make_node, wait_until
from kubernetes import client as k8s
from helpers.reporter_fakes import PodResourcesServer, add_health, kubelet_fixture, socket_dir_fixture

from topology.agent.health import NvmlHealth
from topology.agent.kube import NodeApi
from topology.agent.podresources import PodResourcesClient
from topology.agent.reporter import RESTART_HOLD_SECONDS, Reporter
from topology.annotations import AnnotationKeys
from topology.backoff import Backoff
from topology.codec import decode_state, decode_topology
from topology.model import Topology
from topology.platforms import PLATFORMS

__all__ = ["kube_server_fixture", "kubelet_fixture", "socket_dir_fixture"]  # fixtures

NAME = "dgx1-v100"
NODE = "gpu-node-1"
PATH = f"/api/v1/nodes/{NODE}"
KEYS = AnnotationKeys()
INTERVAL = 5.0
HEARTBEAT = 30.0


def uuids_topology() -> Topology:
    parsed = PLATFORMS[NAME].topology()
    return Topology(tuple(replace(g, uuid=gpu_uuid(NAME, g.index)) for g in parsed.gpus), parsed.nvlinks,
                    parsed.nvswitch, parsed.pcie)


TOPOLOGY = uuids_topology()
U = [gpu.uuid for gpu in TOPOLOGY.gpus]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now



@pytest.fixture
def node_api(kube_server: FakeKubeApiServer) -> NodeApi:
    kube_server.add_node(make_node(NODE, annotations={"other.io/keep": "yes"}))
    return NodeApi.from_configuration(k8s.Configuration(host=kube_server.url), NODE, timeout=0.5)


def make_reporter(node_api, socket_path, clock=None, **kwargs) -> Reporter:
    devices = PodResourcesClient(str(socket_path), timeout=1.0)
    options = dict(interval=INTERVAL, heartbeat=HEARTBEAT, api_backoff=Backoff(1.0, 30.0, 0.5, rand=lambda: 0.5),
                   devices_backoff=Backoff(1.0, 30.0, 0.5, rand=lambda: 0.5))
    options.update(kwargs)
    if clock is not None:
        options["monotonic"] = clock
    return Reporter(TOPOLOGY, node_api, devices, **options)


def annotations(kube_server) -> dict[str, str]:
    return kube_server.node(NODE)["metadata"]["annotations"]


def published_state(kube_server):
    return decode_state(annotations(kube_server)[KEYS.state])


def patch_count(kube_server) -> int:
    return sum(1 for r in kube_server.requests if r.method == "PATCH")


# -- occupancy, changes and heartbeats, round by round ----------------------------------------------------


def test_the_first_round_publishes_a_topology_that_decodes_back(kube_server, node_api, kubelet):
    kubelet.allocate("ns", "a", [U[0], U[3]])
    reporter = make_reporter(node_api, kubelet.socket_path, Clock())
    assert reporter.load()
    assert reporter.round() == INTERVAL
    on_node = annotations(kube_server)
    assert decode_topology(on_node[KEYS.topology]) == TOPOLOGY
    state = published_state(kube_server)
    assert state.used == {U[0], U[3]} and state.unhealthy == frozenset() and state.generation == 1
    assert on_node["other.io/keep"] == "yes"
    (patch,) = kube_server.patches
    assert set(patch["patch"]) == {"metadata"} and set(patch["patch"]["metadata"]) == {"annotations"}
    assert set(patch["patch"]["metadata"]["annotations"]) == {KEYS.topology, KEYS.state}


def test_used_follows_allocations_on_the_next_round(kube_server, node_api, kubelet):
    clock = Clock()
    reporter = make_reporter(node_api, kubelet.socket_path, clock)
    reporter.load()
    reporter.round()
    steps = [
        (lambda: kubelet.allocate("ns", "a", [U[0], U[1]]), {U[0], U[1]}),
        (lambda: kubelet.allocate("ns", "b", [f"{U[5]}::0"]), {U[0], U[1], U[5]}),  # a time-sliced replica
        (lambda: kubelet.free("ns", "a"), {U[5]}),
    ]
    for generation, (change, used) in enumerate(steps, start=2):
        change()
        clock.now += INTERVAL  # the next poll: one interval later
        assert reporter.round() == INTERVAL
        state = published_state(kube_server)
        assert (state.used, state.generation) == (used, generation)
    # The List loses its last pod: a kubelet restart looks the same until its first pod list, so the pod's GPU
    # stays used for RESTART_HOLD_SECONDS, then comes free.
    kubelet.free("ns", "b")
    clock.now += INTERVAL
    reporter.round()
    assert published_state(kube_server).used == {U[5]}
    clock.now += RESTART_HOLD_SECONDS
    reporter.round()
    assert published_state(kube_server).used == set()
    # Only the state changes after the first patch; the topology is not sent again.
    assert all(set(p["patch"]["metadata"]["annotations"]) == {KEYS.state} for p in kube_server.patches[1:])


def test_nothing_is_written_when_nothing_changed_but_the_heartbeat(kube_server, node_api, kubelet):
    kubelet.allocate("ns", "a", [U[2]])
    clock = Clock()
    reporter = make_reporter(node_api, kubelet.socket_path, clock)
    reporter.load()
    reporter.round()
    first = published_state(kube_server)
    assert patch_count(kube_server) == 1
    for _ in range(5):  # 25 s of polls with nothing new
        clock.now += INTERVAL
        reporter.round()
    assert patch_count(kube_server) == 1 and kubelet.calls["List"] == 6
    clock.now += INTERVAL  # 30 s: the heartbeat
    reporter.round()
    assert patch_count(kube_server) == 2
    (beat,) = [p["patch"]["metadata"]["annotations"] for p in kube_server.patches[1:]]
    assert set(beat) == {KEYS.state}
    state = published_state(kube_server)
    assert (state.used, state.generation) == (first.used, first.generation)
    assert state.observed >= first.observed


def test_a_restarted_reporter_continues_and_does_not_resend_the_topology(kube_server, node_api, kubelet):
    kubelet.allocate("ns", "a", [U[2]])
    first = make_reporter(node_api, kubelet.socket_path, Clock())
    first.load()
    first.round()
    kubelet.allocate("ns", "b", [U[3]])
    second = make_reporter(node_api, kubelet.socket_path, Clock())
    second.load()
    second.round()
    assert set(kube_server.patches[-1]["patch"]["metadata"]["annotations"]) == {KEYS.state}
    assert published_state(kube_server).generation == 2


def test_unhealthy_gpus_come_from_nvml_and_from_what_the_kubelet_offers(kube_server, node_api, kubelet):
    fake = make_fake_nvml(PLATFORMS[NAME].topology(), NAME)
    faults = add_health(fake, PLATFORMS[NAME].topology(), NAME)
    kubelet.allocatable = {"nvidia.com/gpu": [u for i, u in enumerate(U) if i != 6]}  # the plugin dropped GPU6
    clock = Clock()
    with NvmlHealth(fake) as health:
        reporter = make_reporter(node_api, kubelet.socket_path, clock, health=health)
        reporter.load()
        reporter.round()
        assert published_state(kube_server).unhealthy == {U[6]}
        faults.ecc[1] = 2
        clock.now += INTERVAL
        reporter.round()
        assert published_state(kube_server).unhealthy == {U[1], U[6]}


# -- pod-resources missing --------------------------------------------------------------------------------


def test_a_missing_socket_publishes_the_topology_marks_the_state_unknown_and_backs_off(kube_server, node_api,
                                                                                       socket_dir):
    socket_path = socket_dir / "kubelet.sock"
    clock = Clock()
    reporter = make_reporter(node_api, socket_path, clock)
    reporter.load()
    delays = [reporter.round() for _ in range(6)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0]  # backoff (jitter pinned to its middle), capped
    on_node = annotations(kube_server)
    assert decode_topology(on_node[KEYS.topology]) == TOPOLOGY and KEYS.state not in on_node
    assert patch_count(kube_server) == 1  # the topology, once
    server = PodResourcesServer(socket_path).start()
    try:
        server.allocate("ns", "a", [U[4]])
        assert reporter.round() == INTERVAL
        assert published_state(kube_server).used == {U[4]}
    finally:
        server.stop()


def test_losing_pod_resources_removes_the_state(kube_server, node_api, kubelet):
    clock = Clock()
    reporter = make_reporter(node_api, kubelet.socket_path, clock)
    reporter.load()
    reporter.round()
    assert published_state(kube_server).generation == 1
    kubelet.stop()
    clock.now += INTERVAL
    assert reporter.round() == 1.0
    assert KEYS.state not in annotations(kube_server)
    assert kube_server.patches[-1]["patch"] == {"metadata": {"annotations": {KEYS.state: None}}}


def test_device_ids_naming_no_gpu_make_the_state_unknown(kube_server, node_api, kubelet):
    reporter = make_reporter(node_api, kubelet.socket_path, Clock())
    reporter.load()
    reporter.round()
    kubelet.allocate("ns", "a", ["GPU-from-another-node"])
    reporter.round()
    assert KEYS.state not in annotations(kube_server)


# -- API errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [409, 500, 503])
def test_api_errors_back_off_and_the_retry_sends_the_latest_state(kube_server, node_api, kubelet, status):
    clock = Clock()
    reporter = make_reporter(node_api, kubelet.socket_path, clock)
    reporter.load()
    kube_server.fail("PATCH", PATH, status=status, times=3)
    delays = []
    for used in ([U[0]], [U[1]], [U[2]]):
        kubelet.allocate("ns", f"p{used[0][-4:]}", used)
        delays.append(reporter.round())
        assert reporter.last_error and f"{status} injected" in reporter.last_error
    assert delays == [1.0, 2.0, 4.0]
    assert KEYS.state not in annotations(kube_server)
    assert reporter.round() == INTERVAL and reporter.last_error is None
    assert published_state(kube_server).used == {U[0], U[1], U[2]}
    assert patch_count(kube_server) == 4
    kube_server.fail("PATCH", PATH, status=status)
    kubelet.free("ns", f"p{U[0][-4:]}")
    assert reporter.round() == 1.0  # the backoff started over after the success


def test_a_hanging_api_server_times_out_and_backs_off(kube_server, node_api, kubelet):
    reporter = make_reporter(node_api, kubelet.socket_path, Clock())
    reporter.load()
    kube_server.hang("PATCH", PATH)
    started = time.monotonic()
    assert reporter.round() == 1.0
    assert time.monotonic() - started < 5 and "Timeout" in reporter.last_error
    kube_server.release_hangs()
    assert reporter.round() == INTERVAL and published_state(kube_server).generation == 1


def test_reading_the_node_at_start_retries_with_backoff(kube_server, node_api, kubelet):
    kube_server.fail("GET", PATH, status=500, times=2)
    waits = []
    stop = threading.Event()
    reporter = make_reporter(node_api, kubelet.socket_path, Clock(), stop=stop)
    reporter.stop.wait = lambda seconds: waits.append(seconds) or False  # record instead of sleeping
    assert reporter.load()
    assert waits == [1.0, 2.0]
    gets = sum(r.method == "GET" for r in kube_server.requests)
    kube_server.fail("GET", PATH, status=500)
    assert reporter.load(once=True) is False  # --once: a single attempt, no wait
    assert sum(r.method == "GET" for r in kube_server.requests) == gets + 1 and waits == [1.0, 2.0]


def test_a_failing_api_server_meets_no_tight_loop(kube_server, node_api, kubelet):
    """The real loop, on real time, against an API server that fails every patch for 1.5 s."""
    kube_server.fail("PATCH", PATH, status=500, times=10_000)
    reporter = make_reporter(node_api, kubelet.socket_path, interval=0.05,
                             api_backoff=Backoff(0.05, 30.0, 0.5))
    thread = threading.Thread(target=reporter.run)
    thread.start()
    time.sleep(1.5)
    reporter.stop.set()
    thread.join(5)
    assert not thread.is_alive()
    # 0.05 s doubling: at most ~6 attempts fit in 1.5 s even with jitter at its lowest (0.025, 0.05, ...).
    assert 2 <= patch_count(kube_server) <= 8


# -- the loop on real time --------------------------------------------------------------------------------


def test_occupancy_follows_pod_resources_within_one_interval_and_stop_is_prompt(kube_server, node_api, kubelet):
    interval = 0.3
    reporter = make_reporter(node_api, kubelet.socket_path, interval=interval, heartbeat=60.0)
    thread = threading.Thread(target=reporter.run)
    thread.start()
    try:
        wait_until(lambda: KEYS.state in annotations(kube_server), what="the first state")
        for pod, ids in (("a", [U[0], U[1], U[2], U[3]]), ("b", [U[7]])):
            kubelet.allocate("ns", pod, ids)
            changed = time.monotonic()
            wait_until(lambda ids=ids: set(ids) <= published_state(kube_server).used, what=f"pod {pod} in used")
            # One interval, plus what a loaded CI machine adds to a round's gRPC and HTTP calls.
            assert time.monotonic() - changed < interval + 1.0
        kubelet.free("ns", "a")
        wait_until(lambda: published_state(kube_server).used == {U[7]}, what="pod a freed")
        patches = patch_count(kube_server)
        time.sleep(4 * interval)
        assert patch_count(kube_server) == patches  # quiet: nothing changed
    finally:
        stopped = time.monotonic()
        reporter.stop.set()
        thread.join(5)
    assert not thread.is_alive() and time.monotonic() - stopped < 2.0


# -- the extender reads what the reporter writes ----------------------------------------------------------


@pytest.mark.parametrize("uuids", [True, False], ids=["nvml-uuids", "from-topo-indices"])
def test_the_extender_sees_the_reporters_used_and_unhealthy_gpus(kube_server, node_api, kubelet, uuids):
    from extender.cache.cluster_state import ClusterState

    topology = TOPOLOGY if uuids else PLATFORMS[NAME].topology()
    ids = U if uuids else [f"GPU{i}" for i in range(8)]
    kubelet.allocate("ns", "a", [U[1], U[2]] if uuids else ["1", "2"])
    kubelet.allocatable = {"nvidia.com/gpu": [u for i, u in enumerate(U if uuids else map(str, range(8))) if i != 5]}
    reporter = Reporter(topology, node_api, PodResourcesClient(str(kubelet.socket_path)), interval=INTERVAL)
    reporter.load()
    reporter.round()
    state = ClusterState()
    state.nodes.replace([kube_server.node(NODE)])
    view = state.view(NODE)
    assert view.problem is None and view.ids == tuple(ids)
    assert not state.is_stale(view, time.time())
    assert view.free == 0b11011001  # GPUs 1 and 2 used, GPU 5 not offered by the kubelet
    kubelet.stop()  # pod-resources gone: the state is removed and the extender treats the node as unknown
    reporter.round()
    state.nodes.replace([kube_server.node(NODE)])
    assert state.is_stale(state.view(NODE), time.time())


def test_a_kubelet_down_between_rounds_then_listing_no_pod_keeps_the_pods_gpus_used(kube_server, node_api, kubelet):
    """A restart as the agent may see it: a round that cannot read pod-resources at all, then an empty List while
    the kubelet has not yet listed its pods again. The GPUs stay used until the hold ends or the pods come back."""
    clock = Clock()
    kubelet.allocate("ns", "a", [U[0], U[1]])
    reporter = make_reporter(node_api, kubelet.socket_path, clock)
    reporter.load()
    reporter.round()
    assert published_state(kube_server).used == {U[0], U[1]}
    kubelet.fail(grpc.StatusCode.UNAVAILABLE)
    kubelet.free("ns", "a")  # the restarted kubelet lists nothing yet
    clock.now += INTERVAL
    reporter.round()
    clock.now += INTERVAL
    reporter.round()
    assert published_state(kube_server).used == {U[0], U[1]}
    kubelet.allocate("ns", "a", [U[0], U[1]])  # its first pod list: the pod is back
    clock.now += INTERVAL
    reporter.round()
    assert published_state(kube_server).used == {U[0], U[1]}
