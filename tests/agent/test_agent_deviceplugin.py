"""The agent's device plugin over real gRPC on unix sockets: against the kubelet stand-in
(tests/helpers/kubelet_standin.py, the device manager's admission, registration and pod-resources), with the pods bound
by the extender in the in-process API server, read through the real `kubernetes` client.

End to end: pods bound with their per-container assignment are admitted by the stand-in in an order of its
choosing, and each container gets exactly its planned GPUs; unit-level: registration again after a kubelet
restart, ListAndWatch health, GetPreferredAllocation that never fails, Allocate's checks, and the CLI."""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from helpers.fake_nvml import gpu_uuid
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, make_node, wait_until
from helpers.kubelet_standin import KubeletStandIn
from kubernetes import client as k8s
from helpers.reporter_fakes import short_tmpdir

from topology.agent import deviceplugin_v1beta1 as dp
from topology.agent import pods as pods_module
from topology.agent.allocate import DEFAULT_CDI_KIND, Delivery, Strategy
from topology.agent.claims import Board
from topology.agent.deviceplugin import DevicePlugin, SharedHealth, cdi_kind_defined
from topology.agent.kube import NodeApiError
from topology.agent.podresources import PodResourcesClient
from topology.agent.pods import NodePods
from topology.annotations import AnnotationKeys
from topology.assignment import encode_containers
from topology.compiled import bits
from topology.containers import container_needs, split
from topology.model import Topology
from topology.platforms import PLATFORMS
from topology.select import Choice, Request, Selector, mask_of

__all__ = ["kube_server_fixture"]  # fixtures

KEYS = AnnotationKeys()
GPU = "nvidia.com/gpu"
NODE = "gpu-node-1"


def uuids(name: str) -> Topology:
    parsed = PLATFORMS[name].topology()
    return Topology(tuple(replace(g, uuid=gpu_uuid(name, g.index)) for g in parsed.gpus), parsed.nvlinks,
                    parsed.nvswitch, parsed.pcie)


class Listing:
    """A pod-resources answer given by the test, or a failure."""

    def __init__(self, answer: dict | None = None) -> None:
        self.answer = answer or {}
        self.down = False

    def listed(self, resource: str, timeout: float | None = None) -> dict:
        if self.down:
            raise OSError("pod-resources is down")
        return self.answer


class Pods:
    def __init__(self, pods: list[dict] | None = None) -> None:
        self.items = pods or []

    def pods(self) -> list[dict]:
        return self.items


@pytest.fixture
def root() -> Iterator[Path]:
    directory = short_tmpdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


class Running:
    """A DevicePlugin whose `run` loop is in a thread; stopped at the end of the test."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.plugin = plugin
        self.stop = threading.Event()
        self.thread = threading.Thread(target=plugin.run, args=(self.stop,), daemon=True)
        self.thread.start()
        wait_until(lambda: os.path.exists(plugin.socket_path), 10, "the plugin's socket")

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive()

    def channel(self) -> grpc.Channel:
        return grpc.insecure_channel(f"unix://{self.plugin.socket_path}")

    def call(self, method: str, request: Any, answer: type) -> Any:
        with self.channel() as channel:
            return channel.unary_unary(method, request_serializer=type(request).SerializeToString,
                                       response_deserializer=answer.FromString)(request, timeout=10)


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for item in started:
        item.close()


def start(running: list[Running], topology: Topology, plugin_dir: Path, listing: Any, pods: Any,
          **kwargs: Any) -> Running:
    plugin_dir.mkdir(parents=True, exist_ok=True)
    kwargs.setdefault("poll", 0.05)
    item = Running(DevicePlugin(topology, listing, pods, plugin_dir=str(plugin_dir), **kwargs))
    running.append(item)
    return item


# -- binding pods as the extender does --------------------------------------------------------------------


def bound(kube: FakeKubeApiServer, board: Board, name: str, gpus: list[str] | None, *,
          containers: list[tuple[str, int]] | None = None,
          init: list[tuple[str, int, str | None]] | None = None) -> dict:
    """A pod on NODE in the API server; with `gpus`, carrying the extender's assignment of that set. An init
    container is (name, count, restartPolicy): "Always" makes it a sidecar."""
    spec: dict[str, Any] = {"nodeName": NODE, "containers": [
        {"name": c, "image": "cuda", "resources": {"limits": {GPU: str(n)}, "requests": {GPU: str(n)}}}
        for c, n in containers or [("main", len(gpus or []))]]}
    if init:
        spec["initContainers"] = [{"name": c, "image": "cuda", "resources": {"limits": {GPU: str(n)}},
                                   **({"restartPolicy": restart} if restart else {})} for c, n, restart in init]
    annotations = {}
    if gpus is not None:
        parts = split(board.selector, board.compiled, mask_of(board.index[g] for g in gpus),
                      container_needs(spec, GPU))
        annotations = {KEYS.gpus: ",".join(gpus), KEYS.containers: encode_containers(
            [(part.need.name, [board.ids[i] for i in bits(part.gpus)]) for part in parts])}
    return kube.add_pod({"metadata": {"name": name, "namespace": "team", "annotations": annotations},
                         "spec": spec, "status": {"phase": "Pending"}})


def planned(pod: dict) -> dict[str, set[str]]:
    return {name: set(ids) for name, ids in orjson.loads(pod["metadata"]["annotations"][KEYS.containers]).items()}


def best(board: Board, free: list[str], count: int) -> list[str]:
    choice = board.selector.select(board.compiled, mask_of(board.index[g] for g in free), Request(count))
    assert isinstance(choice, Choice)
    return [board.ids[i] for i in choice.gpus]


@pytest.fixture
def kubelet(root: Path) -> Iterator[KubeletStandIn]:
    with KubeletStandIn(root / "kubelet", seed=7) as standin:
        yield standin


def deliver(running: list[Running], kubelet: KubeletStandIn, kube: FakeKubeApiServer, topology: Topology,
            **kwargs) -> Running:
    api = NodePods.from_configuration(k8s.Configuration(host=kube.url), NODE, timeout=2.0)
    listing = PodResourcesClient(str(kubelet.pod_resources_socket), timeout=2.0)
    item = start(running, topology, kubelet.plugin_dir, listing, api, **kwargs)
    kubelet.wait_registered(GPU, timeout=10)
    return item


# -- end to end against the kubelet stand-in ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["dgx1-v100", "rtx-a6000-pairs", "dgx-h100"])
def test_equal_pods_bound_at_once_each_get_exactly_their_planned_gpus(name, kubelet, kube_server, running):
    topology = uuids(name)
    board = Board(topology, Selector())
    item = deliver(running, kubelet, kube_server, topology)
    free = list(board.ids)
    pods = []
    for k in range(4):  # the extender binds four 2-GPU pods before the kubelet reaches any
        gpus = best(board, free, 2)
        free = [g for g in free if g not in gpus]
        pods.append(bound(kube_server, board, f"p{k}", gpus))
    random.Random(name).shuffle(pods)
    for pod in pods:
        admission = kubelet.admit(pod)
        assert admission.admitted, admission.message
        assert set(admission.container("main").devices[GPU]) == planned(pod)["main"]
        response = admission.container("main").responses[GPU]
        assert {d.name for d in response.cdi_devices} == {f"{DEFAULT_CDI_KIND}={g}" for g in planned(pod)["main"]}
    stats = item.plugin.stats
    assert stats["GetPreferredAllocation:planned"] == 4 and stats["Allocate:planned"] == 4
    assert stats["mismatch"] == stats["ambiguous"] == 0


def test_init_containers_sidecars_and_app_containers_get_their_parts(kubelet, kube_server, running):
    topology = uuids("dgx1-v100")
    board = Board(topology, Selector())
    item = deliver(running, kubelet, kube_server, topology)
    gpus = best(board, list(board.ids), 4)
    # prep's two GPUs go to the pool; the sidecar draws the whole pool; train gets two new ones.
    pod = bound(kube_server, board, "staged", gpus, init=[("prep", 2, None), ("proxy", 2, "Always")],
                containers=[("train", 2)])
    other = bound(kube_server, board, "waiting", best(board, [g for g in board.ids if g not in gpus], 2))
    admission = kubelet.admit(pod)
    assert admission.admitted, admission.message
    for container, gpus_planned in planned(pod).items():
        assert set(admission.container(container).devices[GPU]) == gpus_planned, container
    assert item.plugin.stats["mismatch"] == 0
    assert set(kubelet.admit(other).container("main").devices[GPU]) == planned(other)["main"]


def test_a_container_the_kubelet_serves_from_the_pool_keeps_the_pods_set_whole(kubelet, kube_server, running):
    """loader's one GPU is drawn from prep's two by the kubelet, in map order: no plugin can choose it
    (topology/containers.py), so train is told the rest of the pool and completes it with its planned new GPUs."""
    topology = uuids("dgx1-v100")
    board = Board(topology, Selector())
    deliver(running, kubelet, kube_server, topology)
    gpus = best(board, list(board.ids), 4)
    pod = bound(kube_server, board, "staged", gpus, init=[("prep", 2, None)],
                containers=[("loader", 1), ("train", 3)])
    admission = kubelet.admit(pod)
    assert admission.admitted, admission.message
    plan = planned(pod)
    got = {c.name: set(c.devices[GPU]) for c in admission.containers}
    assert got["prep"] == plan["prep"] and got["loader"] <= plan["prep"]
    assert got["train"] - plan["prep"] == plan["train"] - plan["prep"]
    assert set().union(*got.values()) == set(gpus)


def test_a_pod_without_assignment_gets_our_best_set_away_from_bound_pods(kubelet, kube_server, running):
    topology = uuids("rtx-a6000-pairs")
    board = Board(topology, Selector())
    item = deliver(running, kubelet, kube_server, topology)
    waiting = bound(kube_server, board, "waiting", best(board, list(board.ids), 4))
    foreign = bound(kube_server, board, "foreign", None, containers=[("main", 2)])
    admission = kubelet.admit(foreign)
    got = set(admission.container("main").devices[GPU])
    assert got == set(best(board, [g for g in board.ids if g not in planned(waiting)["main"]], 2))
    assert item.plugin.stats["GetPreferredAllocation:foreign"] == 1
    assert set(kubelet.admit(waiting).container("main").devices[GPU]) == planned(waiting)["main"]


def test_a_planned_gpu_gone_unhealthy_is_replaced_and_the_mismatch_counted(kubelet, kube_server, running):
    topology = uuids("dgx-h100")
    board = Board(topology, Selector())
    item = deliver(running, kubelet, kube_server, topology)
    late = bound(kube_server, board, "late", list(board.ids[:2]))
    item.plugin.update_health({board.ids[1]: "lost"})
    kubelet.wait_for(lambda: kubelet.unhealthy(GPU) == {board.ids[1]})
    admission = kubelet.admit(late)
    assert admission.admitted, admission.message
    got = set(admission.container("main").devices[GPU])
    assert board.ids[0] in got and board.ids[1] not in got and len(got) == 2
    stats = item.plugin.stats
    assert stats["GetPreferredAllocation:adjusted"] == 1 and stats["mismatch"] == 1


def test_the_plugin_registers_again_after_the_kubelet_restarts(kubelet, kube_server, running, caplog):
    topology = uuids("dgx1-v100")
    item = deliver(running, kubelet, kube_server, topology)
    options = kubelet.calls("GetDevicePluginOptions")[-1].response
    assert options.get_preferred_allocation_available and not options.pre_start_required
    assert kubelet.healthy(GPU) == frozenset(Board(topology).ids)
    with caplog.at_level(logging.INFO, logger="gpu-topology-agent.deviceplugin"):
        kubelet.restart()  # removes every socket in device-plugins/, ours too, and serves kubelet.sock anew
        kubelet.wait_registered(GPU, timeout=10)
    assert item.plugin.stats["registrations"] == 2
    assert "serving again" in caplog.text
    assert kubelet.healthy(GPU) == frozenset(Board(topology).ids)


def test_after_a_kubelet_restart_that_lost_its_checkpoint_a_restarted_container_gets_its_set_again(
        kubelet, kube_server, running):
    topology = uuids("dgx1-v100")
    board = Board(topology, Selector())
    item = deliver(running, kubelet, kube_server, topology)
    pod = bound(kube_server, board, "running", best(board, list(board.ids), 2))
    assert set(kubelet.admit(pod).container("main").devices[GPU]) == planned(pod)["main"]
    pod["status"] = {"phase": "Running", "containerStatuses": [
        {"name": "main", "state": {"running": {"startedAt": "2026-01-01T00:00:09Z"}}}]}
    kube_server.update_pod(pod)
    waiting = bound(kube_server, board, "waiting", best(board, [g for g in board.ids if g not in planned(pod)["main"]],
                                                        2))
    kubelet.restart(lose_checkpoint=True)
    kubelet.wait_registered(GPU, timeout=10)
    kubelet.readmit({pod["metadata"]["uid"]: ["main"]})  # its first pod list: running, nothing recorded to check
    responses = kubelet.start_container(pod["metadata"]["uid"], "main")
    assert {d.name for d in responses[GPU].cdi_devices} == {f"{DEFAULT_CDI_KIND}={g}" for g in planned(pod)["main"]}
    assert set(kubelet.devices(pod["metadata"]["uid"])["main"]) == planned(pod)["main"]
    assert item.plugin.stats["GetPreferredAllocation:planned"] == 2 and item.plugin.stats["mismatch"] == 0
    assert set(kubelet.admit(waiting).container("main").devices[GPU]) == planned(waiting)["main"]


def test_without_a_kubelet_it_serves_and_retries_registration_with_backoff(root, running):
    topology = uuids("dgx-h100")
    item = start(running, topology, root / "device-plugins", Listing(), Pods())
    time.sleep(0.3)
    assert item.plugin.stats["registrations"] == 0 and item.plugin.backoff.failures >= 1
    with KubeletStandIn(root, seed=1) as standin:  # the kubelet comes: it removes our socket, we serve again
        standin.wait_registered(GPU, timeout=40)
        assert item.plugin.stats["registrations"] == 1


class Registrar:
    """A bare Registration service on kubelet.sock that records each RegisterRequest and dials nothing."""

    def __init__(self, plugin_dir: Path) -> None:
        self.requests: list[Any] = []
        self.server = grpc.server(ThreadPoolExecutor(max_workers=2))
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(dp.REGISTRATION, {
            "Register": grpc.unary_unary_rpc_method_handler(
                lambda request, context: self.requests.append(request) or dp.Empty(),
                request_deserializer=dp.RegisterRequest.FromString, response_serializer=dp.Empty.SerializeToString)}),))
        assert self.server.add_insecure_port(f"unix://{plugin_dir / dp.KUBELET_SOCKET}")
        self.server.start()

    def stop(self) -> None:
        self.server.stop(None).wait(5)


def test_a_recreated_kubelet_socket_alone_is_registered_with_again(root, running):
    plugin_dir = root / "device-plugins"
    plugin_dir.mkdir()
    first = Registrar(plugin_dir)
    item = start(running, uuids("dgx-h100"), plugin_dir, Listing(), Pods(), resource="example.com/gpu")
    wait_until(lambda: first.requests, 10, "the first registration")
    request = first.requests[0]
    assert (request.version, request.endpoint, request.resource_name) == ("v1beta1", "gpu-topology.sock",
                                                                          "example.com/gpu")
    assert request.options.get_preferred_allocation_available and not request.options.pre_start_required
    served = os.stat(item.plugin.socket_path).st_ino
    first.stop()
    (plugin_dir / dp.KUBELET_SOCKET).unlink(missing_ok=True)
    second = Registrar(plugin_dir)
    try:
        wait_until(lambda: second.requests, 10, "the registration with the new kubelet socket")
    finally:
        second.stop()
    assert item.plugin.stats["registrations"] == 2 and os.stat(item.plugin.socket_path).st_ino == served


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")
def test_a_restarted_kubelet_is_registered_with_at_once_not_at_the_next_poll(root, running):
    """The kubelet re-admits its pods right after it starts: the directory watch, not the poll, must wake us."""
    plugin_dir = root / "device-plugins"
    plugin_dir.mkdir()
    first = Registrar(plugin_dir)
    item = start(running, uuids("dgx-h100"), plugin_dir, Listing(), Pods(), poll=120.0)
    wait_until(lambda: first.requests, 10, "the first registration")
    first.stop()
    for entry in plugin_dir.iterdir():  # what a starting kubelet does: every socket removed, its own made anew
        entry.unlink()
    second = Registrar(plugin_dir)
    try:
        wait_until(lambda: second.requests, 10, "the registration with the restarted kubelet, long before 120 s")
    finally:
        second.stop()
    assert item.plugin.stats["registrations"] == 2 and os.path.exists(item.plugin.socket_path)


# -- ListAndWatch -------------------------------------------------------------------------------------------------


def follow(stream: Iterator[Any], into: queue.Queue) -> None:
    with contextlib.suppress(grpc.RpcError):  # cancelled at the end of the test
        for response in stream:
            into.put(response)


def test_health_changes_reach_the_kubelet_and_only_changes_are_sent(root, running):
    topology = uuids("dgx1-v100")
    ids = Board(topology).ids
    item = start(running, topology, root / "device-plugins", Listing(), Pods())
    received: queue.Queue = queue.Queue()
    channel = item.channel()
    stream = channel.unary_stream(dp.LIST_AND_WATCH, request_serializer=dp.Empty.SerializeToString,
                                  response_deserializer=dp.ListAndWatchResponse.FromString)(dp.Empty())
    threading.Thread(target=follow, args=(stream, received), daemon=True).start()
    first = received.get(timeout=5)
    assert [(d.ID, d.health) for d in first.devices] == [(gpu, dp.HEALTHY) for gpu in ids]
    assert not any(d.HasField("topology") for d in first.devices)

    class Nvml:
        reasons: dict[str, str] = {}

        def check(self, topology: Topology) -> dict[str, str]:
            return dict(self.reasons)

    nvml = Nvml()
    shared = SharedHealth(nvml, item.plugin)
    nvml.reasons = {ids[3]: "2 uncorrectable ECC error(s) since its last reset"}
    assert shared.check(topology) == nvml.reasons  # the reporter gets the same answer
    second = received.get(timeout=5)
    assert {d.ID for d in second.devices if d.health == dp.UNHEALTHY} == {ids[3]}
    shared.check(topology)  # unchanged: nothing is sent
    with pytest.raises(queue.Empty):
        received.get(timeout=1.5)
    nvml.reasons = {}
    shared.check(topology)
    assert all(d.health == dp.HEALTHY for d in received.get(timeout=5).devices)
    stream.cancel()
    channel.close()


def test_unhealthy_gpus_are_unhealthy_in_the_kubelet(kubelet, kube_server, running):
    topology = uuids("dgx-h100")
    ids = Board(topology).ids
    item = deliver(running, kubelet, kube_server, topology)
    item.plugin.update_health({ids[0]: "lost", "GPU-not-here": "ignored"})
    kubelet.wait_for(lambda: kubelet.unhealthy(GPU) == {ids[0]})
    item.plugin.update_health({})
    kubelet.wait_for(lambda: not kubelet.unhealthy(GPU))


def test_numa_topology_is_reported_only_when_asked():
    topology = uuids("dgx-h100")
    directory = short_tmpdir()
    try:
        plain = DevicePlugin(topology, Listing(), Pods(), plugin_dir=str(directory))
        numa = DevicePlugin(topology, Listing(), Pods(), plugin_dir=str(directory), numa_topology=True)
        assert not any(d.HasField("topology") for d in plain.devices())
        assert [[n.ID for n in d.topology.nodes] for d in numa.devices()] == [[g.numa_node] for g in topology.gpus]
        assert {g.numa_node for g in topology.gpus} == {0, 1}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# -- GetPreferredAllocation never fails ---------------------------------------------------------------------


def preferred(available: list[str], must: list[str], size: int) -> Any:
    return dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest(
        available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)])


def test_preferred_allocation_never_errors_with_pod_resources_down_and_the_api_unreachable(root, running,
                                                                                            kube_server):
    topology = uuids("dgx1-v100")
    board = Board(topology)
    kube_server.stop()
    api = NodePods.from_configuration(k8s.Configuration(host=kube_server.url), NODE, timeout=0.5)
    listing = PodResourcesClient(str(root / "absent.sock"), timeout=0.5)
    item = start(running, topology, root / "device-plugins", listing, api)
    answer = item.call(dp.GET_PREFERRED_ALLOCATION, preferred(list(board.ids), [], 4),
                       dp.PreferredAllocationResponse)
    assert set(answer.container_responses[0].deviceIDs) == set(best(board, list(board.ids), 4))
    assert item.plugin.stats["GetPreferredAllocation:blind"] == 1


@pytest.mark.parametrize("request_", [
    preferred(["GPU-x" * 30] * 5000, [], 3),
    preferred(["", "\x00"], ["nonsense"], -4),
    preferred([], [], 8),
    preferred(["a"] * 10, ["b"], 2**31 - 1),
    dp.PreferredAllocationRequest(container_requests=[dp.ContainerPreferredAllocationRequest()] * 100),
    dp.PreferredAllocationRequest(),
], ids=["huge", "junk", "empty", "size-max", "many-containers", "no-containers"])
def test_preferred_allocation_answers_junk_without_an_error(root, running, request_):
    topology = uuids("dgx-h100")
    listing = Listing()
    listing.down = True
    item = start(running, topology, root / "device-plugins", listing, Pods())
    answer = item.call(dp.GET_PREFERRED_ALLOCATION, request_, dp.PreferredAllocationResponse)
    assert len(answer.container_responses) == min(len(request_.container_requests), 16)


def test_an_oversized_message_is_refused_by_grpc_and_the_server_lives_on(root, running):
    topology = uuids("dgx-h100")
    item = start(running, topology, root / "device-plugins", Listing(), Pods())
    with pytest.raises(grpc.RpcError) as refused:
        item.call(dp.GET_PREFERRED_ALLOCATION, preferred(["x" * 1000] * 2000, [], 1),
                  dp.PreferredAllocationResponse)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    answer = item.call(dp.GET_PREFERRED_ALLOCATION, preferred(list(Board(topology).ids), [], 1),
                       dp.PreferredAllocationResponse)
    assert len(answer.container_responses[0].deviceIDs) == 1


# -- Allocate ---------------------------------------------------------------------------------------------------


def allocate(*containers: list[str]) -> Any:
    return dp.AllocateRequest(container_requests=[dp.ContainerAllocateRequest(devices_ids=ids) for ids in containers])


def api_pod(board: Board, name: str, gpus: list[str]) -> dict:
    return {"metadata": {"name": name, "namespace": "team", "uid": f"uid-{name}",
                         "annotations": {KEYS.gpus: ",".join(gpus),
                                         KEYS.containers: encode_containers([("main", gpus)])}},
            "spec": {"nodeName": NODE,
                     "containers": [{"name": "main", "resources": {"limits": {GPU: str(len(gpus))}}}]},
            "status": {"phase": "Pending"}}


def test_allocate_of_unknown_ids_is_an_error(root, running):
    topology = uuids("dgx1-v100")
    ids = Board(topology).ids
    item = start(running, topology, root / "device-plugins", Listing(), Pods())
    for request in (allocate([ids[0], "GPU-00000000-0000-0000-0000-000000000000"]), allocate([]),
                    allocate(*[[ids[0]]] * 17), allocate(["x" * 100])):
        with pytest.raises(grpc.RpcError) as refused:
            item.call(dp.ALLOCATE, request, dp.AllocateResponse)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert item.plugin.stats["refused"] == 4
    answer = item.call(dp.ALLOCATE, allocate([ids[1]]), dp.AllocateResponse)  # it still serves
    assert answer.container_responses[0].cdi_devices[0].name == f"{DEFAULT_CDI_KIND}={ids[1]}"


def test_allocate_of_other_ids_than_planned_succeeds_and_counts_a_mismatch(root, running, caplog):
    topology = uuids("dgx1-v100")
    board = Board(topology)
    ids = board.ids
    pods = Pods([api_pod(board, "p", [ids[0], ids[1]])])
    listing = Listing({("team", "p"): {"main": ()}})
    item = start(running, topology, root / "device-plugins", listing, pods,
                 delivery=Delivery((Strategy.ENVVAR, Strategy.VOLUME_MOUNTS, Strategy.CDI_ANNOTATIONS)))
    with caplog.at_level(logging.WARNING, logger="gpu-topology-agent.deviceplugin"):
        answer = item.call(dp.ALLOCATE, allocate([ids[5], ids[0]]), dp.AllocateResponse)
    response = answer.container_responses[0]
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert [m.container_path for m in response.mounts] == [f"/var/run/nvidia-container-devices/{ids[0]}",
                                                          f"/var/run/nvidia-container-devices/{ids[5]}"]
    assert list(response.annotations.values()) == [f"{DEFAULT_CDI_KIND}={ids[0]},{DEFAULT_CDI_KIND}={ids[5]}"]
    assert item.plugin.stats["mismatch"] == 1
    assert "team/p (main)" in caplog.text and "not as planned" in caplog.text


def test_the_cdi_spec_check_finds_a_kind_in_json_or_yaml(tmp_path):
    assert cdi_kind_defined(DEFAULT_CDI_KIND, [str(tmp_path / "absent")]) is None
    (tmp_path / "management.nvidia.com-gpu.yaml").write_text('cdiVersion: 0.5.0\nkind: management.nvidia.com/gpu\n')
    assert cdi_kind_defined(DEFAULT_CDI_KIND, [str(tmp_path)]) is False
    (tmp_path / "k8s.device-plugin.nvidia.com-gpu.json").write_text(
        '{"cdiVersion":"0.5.0","kind":"k8s.device-plugin.nvidia.com/gpu","devices":[]}')
    assert cdi_kind_defined(DEFAULT_CDI_KIND, [str(tmp_path)]) is True


# -- this node's pods (pods.py) --------------------------------------------------------------------------------


def test_node_pods_are_this_nodes_only_and_failures_say_what_to_fix(kube_server, monkeypatch):
    kube_server.add_pod({"metadata": {"name": "here", "namespace": "a"}, "spec": {"nodeName": NODE, "containers": []}})
    kube_server.add_pod({"metadata": {"name": "there", "namespace": "a"},
                         "spec": {"nodeName": "other", "containers": []}})
    kube_server.add_pod({"metadata": {"name": "pending", "namespace": "a"}, "spec": {"containers": []}})
    api = NodePods.from_configuration(k8s.Configuration(host=kube_server.url), NODE, timeout=1.0)
    assert [pod["metadata"]["name"] for pod in api.pods()] == ["here"]
    kube_server.fail("GET", "/api/v1/pods", status=403)
    with pytest.raises(NodeApiError, match="403 .*needs list on pods") as forbidden:
        api.pods()
    assert forbidden.value.status == 403
    monkeypatch.setattr(pods_module, "MAX_ANSWER_BYTES", 100)
    with pytest.raises(NodeApiError, match="over 100 bytes") as too_large:
        api.pods()
    assert too_large.value.status is None
    monkeypatch.setattr(pods_module, "MAX_ANSWER_BYTES", 1 << 20)
    assert len(api.pods()) == 1  # the connection cut off mid-answer was not reused
    kube_server.stop()
    with pytest.raises(NodeApiError, match="list pods on node gpu-node-1"):
        api.pods()


# -- the command line ----------------------------------------------------------------------------------------


def agent_command() -> list[str]:
    script = Path(sys.executable).with_name("gpu-topology-agent")
    return [str(script)] if script.exists() else [sys.executable, "-m", "topology.agent.cli"]


def test_the_agent_in_deliver_mode_reports_delivers_and_stops_on_sigterm(root, kubelet, kube_server):
    kube_server.add_node(make_node(NODE))
    board = Board(PLATFORMS["rtx-a6000-pairs"].topology())
    process = subprocess.Popen(
        [*agent_command(), "--mode", "deliver", "--node-name", NODE, "--from-topo", "rtx-a6000-pairs",
         "--kubeconfig", str(kube_server.write_kubeconfig(root / "kubeconfig")), "--interval", "0.2",
         "--socket", str(kubelet.pod_resources_socket), "--device-plugin-dir", str(kubelet.plugin_dir),
         "--device-list-strategy", "envvar"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        kubelet.wait_registered(GPU, timeout=30)
        pod = bound(kube_server, board, "p", ["GPU2", "GPU3"])
        admission = kubelet.admit(pod)
        assert set(admission.container("main").devices[GPU]) == {"GPU2", "GPU3"}
        assert admission.container("main").responses[GPU].envs["NVIDIA_VISIBLE_DEVICES"] == "2,3"
        wait_until(lambda: '"GPU2"' in kube_server.node(NODE)["metadata"]["annotations"].get(KEYS.state, ""), 20,
                   "the reporter's state")
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "SIGTERM: stopping" in err and "Traceback" not in err
    assert not (kubelet.plugin_dir / "gpu-topology.sock").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--mode", "deliver", "--once", "--node-name", NODE], "cannot run with --once or --dry-run"),
    (["--mode", "deliver", "--dry-run"], "cannot run with --once or --dry-run"),
    (["--device-list-strategy", "envvar,nope", "--dry-run"], "unknown device list strategy 'nope'"),
    (["--cdi-kind", "nvidia.com", "--dry-run"], "is not <vendor>/<class>"),
])
def test_bad_deliver_arguments_are_one_line_and_exit_2(argv, message, capsys):
    from topology.agent import cli

    try:
        code = cli.main([*argv, "--from-topo", "dgx-h100"])
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2 and message in capsys.readouterr().err
