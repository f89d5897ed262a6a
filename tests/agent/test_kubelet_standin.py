"""The kubelet stand-in against a small fake device plugin speaking the real v1beta1 wire protocol: each test is
one kubelet behaviour a device plugin or a pod-resources client relies on."""

from __future__ import annotations

import queue
import shutil
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from helpers.kubelet_standin import DeviceManagerError, KubeletStandIn, is_extended_resource_name
from helpers.reporter_fakes import short_tmpdir
from topology.agent import deviceplugin_v1beta1 as dp
from topology.agent import podresources_v1 as pr

GPU = "example.com/gpu"
Prefer = Callable[[object], list[str]]


def device(device_id: str, numa: int | None = None, healthy: bool = True) -> object:
    topology = dp.TopologyInfo(nodes=[dp.NUMANode(ID=numa)]) if numa is not None else None
    return dp.Device(ID=device_id, health=dp.HEALTHY if healthy else dp.UNHEALTHY, topology=topology)


def first_ids(request: object) -> list[str]:
    """A plugin's plain preference: what must be included, then the lowest ids."""
    rest = sorted(set(request.available_deviceIDs) - set(request.must_include_deviceIDs))
    return [*request.must_include_deviceIDs, *rest][: request.allocation_size]


class FakePlugin:
    """A device plugin serving on `<device-plugins>/<socket>`. ListAndWatch sends `devices` (nothing until
    set_devices if None), `prefer` answers GetPreferredAllocation (a RuntimeError fails the call), Allocate
    answers FAKE_DEVICES=<ids>, or fails (`allocate_fault` "error") or answers nothing ("empty")."""

    def __init__(self, plugin_dir: Path, devices: list[object] | None, *, socket: str = "fake.sock",
                 preferred: bool = True, pre_start: bool = False, prefer: Prefer = first_ids) -> None:
        self.path = plugin_dir / socket
        self.preferred = preferred
        self.pre_start = pre_start
        self.prefer = prefer
        self.allocate_fault: str | None = None
        self._devices = devices
        self._streams: list[queue.Queue] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        handlers = {
            "GetDevicePluginOptions": grpc.unary_unary_rpc_method_handler(
                lambda request, context: dp.DevicePluginOptions(get_preferred_allocation_available=self.preferred,
                                                                pre_start_required=self.pre_start),
                request_deserializer=dp.Empty.FromString, response_serializer=dp.DevicePluginOptions.SerializeToString),
            "ListAndWatch": grpc.unary_stream_rpc_method_handler(
                self._list_and_watch, request_deserializer=dp.Empty.FromString,
                response_serializer=dp.ListAndWatchResponse.SerializeToString),
            "GetPreferredAllocation": grpc.unary_unary_rpc_method_handler(
                self._preferred, request_deserializer=dp.PreferredAllocationRequest.FromString,
                response_serializer=dp.PreferredAllocationResponse.SerializeToString),
            "Allocate": grpc.unary_unary_rpc_method_handler(
                self._allocate, request_deserializer=dp.AllocateRequest.FromString,
                response_serializer=dp.AllocateResponse.SerializeToString),
            "PreStartContainer": grpc.unary_unary_rpc_method_handler(
                lambda request, context: dp.PreStartContainerResponse(),
                request_deserializer=dp.PreStartContainerRequest.FromString,
                response_serializer=dp.PreStartContainerResponse.SerializeToString),
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(dp.DEVICE_PLUGIN, handlers),))
        assert self._server.add_insecure_port(f"unix://{self.path}") != 0
        self._server.start()

    def register(self, kubelet_socket: Path, *, resource: str = GPU, version: str = dp.VERSION) -> None:
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            channel.unary_unary(dp.REGISTER, request_serializer=dp.RegisterRequest.SerializeToString,
                                response_deserializer=dp.Empty.FromString)(
                dp.RegisterRequest(version=version, endpoint=self.path.name, resource_name=resource), timeout=5)

    def set_devices(self, devices: list[object]) -> None:
        with self._lock:
            self._devices = devices
            for stream in self._streams:
                stream.put(devices)

    def stop(self) -> None:
        self._stopping.set()
        self._server.stop(grace=None).wait(5)

    def _list_and_watch(self, request: object, context: grpc.ServicerContext) -> Iterator[object]:
        updates: queue.Queue = queue.Queue()
        with self._lock:
            self._streams.append(updates)
            if self._devices is not None:
                updates.put(self._devices)
        while context.is_active() and not self._stopping.is_set():
            try:
                devices = updates.get(timeout=0.05)
            except queue.Empty:
                continue
            yield dp.ListAndWatchResponse(devices=devices)

    def _preferred(self, request: object, context: grpc.ServicerContext) -> object:
        try:
            ids = self.prefer(request.container_requests[0])
        except RuntimeError as error:
            context.abort(grpc.StatusCode.INTERNAL, str(error))
        return dp.PreferredAllocationResponse(container_responses=[
            dp.ContainerPreferredAllocationResponse(deviceIDs=ids)])

    def _allocate(self, request: object, context: grpc.ServicerContext) -> object:
        if self.allocate_fault == "error":
            context.abort(grpc.StatusCode.INTERNAL, "allocate refused")
        if self.allocate_fault == "empty":
            return dp.AllocateResponse()
        return dp.AllocateResponse(container_responses=[dp.ContainerAllocateResponse(
            envs={"FAKE_DEVICES": ",".join(sorted(r.devices_ids))}) for r in request.container_requests])


def container(name: str, gpus: int, *, sidecar: bool = False) -> dict:
    spec: dict = {"name": name, "resources": {"limits": {GPU: gpus}, "requests": {GPU: gpus}}}
    if sidecar:
        spec["restartPolicy"] = "Always"
    return spec


def pod(name: str, *containers: dict, init: tuple[dict, ...] = ()) -> dict:
    return {"metadata": {"uid": f"uid-{name}", "name": name, "namespace": "default"},
            "spec": {"initContainers": list(init), "containers": list(containers)}}


def pod_resources(kubelet: KubeletStandIn, method: str = pr.LIST) -> object:
    request, answer = ((pr.ListPodResourcesRequest, pr.ListPodResourcesResponse) if method == pr.LIST
                       else (pr.AllocatableResourcesRequest, pr.AllocatableResourcesResponse))
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        return channel.unary_unary(method, request_serializer=request.SerializeToString,
                                   response_deserializer=answer.FromString)(request(), timeout=5)


def listed(kubelet: KubeletStandIn) -> dict[str, dict[str, set[str]]]:
    """pod-resources List as {pod: {container: device ids}}."""
    return {p.name: {c.name: {i for d in c.devices for i in d.device_ids} for c in p.containers}
            for p in pod_resources(kubelet).pod_resources}


FOUR = [device(f"gpu-{i}", numa=i // 2) for i in range(4)]


@pytest.fixture(name="root")
def root_fixture() -> Iterator[Path]:
    directory = short_tmpdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(name="kubelet")
def kubelet_fixture(root: Path) -> Iterator[KubeletStandIn]:
    with KubeletStandIn(root, dial_timeout=1.0) as kubelet:
        yield kubelet


@pytest.fixture(name="plugins")
def plugins_fixture() -> Iterator[list[FakePlugin]]:
    started: list[FakePlugin] = []
    yield started
    for plugin in started:
        plugin.stop()


@pytest.fixture(name="plugin_for")
def plugin_for_fixture(kubelet: KubeletStandIn, plugins: list[FakePlugin]) -> Callable[..., FakePlugin]:
    """Start a fake plugin on the kubelet, register it and wait for its device list."""
    def start(devices: list[object] = FOUR, **options: object) -> FakePlugin:
        plugin = FakePlugin(kubelet.plugin_dir, devices, **options)
        plugins.append(plugin)
        plugin.register(kubelet.kubelet_socket)
        kubelet.wait_registered(GPU)
        return plugin
    return start


def test_registration_refuses_other_versions_and_non_extended_names(kubelet: KubeletStandIn,
                                                                    plugins: list[FakePlugin]) -> None:
    plugin = FakePlugin(kubelet.plugin_dir, FOUR)
    plugins.append(plugin)
    with pytest.raises(grpc.RpcError, match="not supported by kubelet"):
        plugin.register(kubelet.kubelet_socket, version="v1alpha1")
    for name in ("gpu", "kubernetes.io/gpu", "gpu.kubernetes.io/x", "requests.example.com/gpu", "Example.com/gpu",
                 "example.com/gpu/x", "example.com/-gpu", f"example.com/{'g' * 64}"):
        assert not is_extended_resource_name(name)
        with pytest.raises(grpc.RpcError, match="is invalid"):
            plugin.register(kubelet.kubelet_socket, resource=name)
    assert kubelet.calls() == []  # refused before dialling the plugin
    plugin.register(kubelet.kubelet_socket)
    kubelet.wait_registered(GPU)


def test_register_fails_when_the_endpoint_cannot_be_dialled(kubelet: KubeletStandIn) -> None:
    with grpc.insecure_channel(f"unix://{kubelet.kubelet_socket}") as channel:
        with pytest.raises(grpc.RpcError, match="failed to dial device plugin"):
            channel.unary_unary(dp.REGISTER, request_serializer=dp.RegisterRequest.SerializeToString,
                                response_deserializer=dp.Empty.FromString)(
                dp.RegisterRequest(version=dp.VERSION, endpoint="absent.sock", resource_name=GPU), timeout=5)


def test_devices_appear_after_list_and_watch_with_their_numa_nodes(kubelet: KubeletStandIn,
                                                                  plugin_for: Callable[..., FakePlugin]) -> None:
    assert kubelet.healthy(GPU) == frozenset()
    plugin_for()
    assert kubelet.healthy(GPU) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    assert [c.method for c in kubelet.calls()] == ["GetDevicePluginOptions"]
    allocatable = pod_resources(kubelet, pr.GET_ALLOCATABLE_RESOURCES).devices
    assert sorted((d.device_ids[0], d.topology.nodes[0].ID) for d in allocatable) == [
        ("gpu-0", 0), ("gpu-1", 0), ("gpu-2", 1), ("gpu-3", 1)]


def test_health_updates_replace_the_device_list(kubelet: KubeletStandIn,
                                               plugin_for: Callable[..., FakePlugin]) -> None:
    plugin = plugin_for()
    plugin.set_devices([device("gpu-0"), device("gpu-1", healthy=False), device("gpu-2")])
    kubelet.wait_for(lambda: kubelet.unhealthy(GPU) == {"gpu-1"})
    assert kubelet.healthy(GPU) == {"gpu-0", "gpu-2"}  # gpu-3 left the list: gone, not unhealthy
    allocatable = pod_resources(kubelet, pr.GET_ALLOCATABLE_RESOURCES).devices
    assert sorted(d.device_ids[0] for d in allocatable) == ["gpu-0", "gpu-2"]
    assert all(not d.HasField("topology") for d in allocatable)


def test_plugin_death_makes_every_device_unhealthy(kubelet: KubeletStandIn,
                                                   plugin_for: Callable[..., FakePlugin]) -> None:
    plugin_for().stop()
    kubelet.wait_for(lambda: kubelet.healthy(GPU) == frozenset())
    assert kubelet.unhealthy(GPU) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    admission = kubelet.admit(pod("late", container("main", 1)))
    assert not admission.admitted
    assert admission.message == ("Allocate failed due to no healthy devices present; cannot allocate unhealthy "
                                 "devices example.com/gpu, which is unexpected")


def test_newest_registration_wins_and_keeps_devices_until_its_first_list(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin], plugins: list[FakePlugin]) -> None:
    old = plugin_for()
    new = FakePlugin(kubelet.plugin_dir, None, socket="new.sock", preferred=False)
    plugins.append(new)
    new.register(kubelet.kubelet_socket)
    assert kubelet.healthy(GPU) == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}  # the new stream has sent nothing yet
    new.set_devices([device("gpu-9")])
    kubelet.wait_for(lambda: kubelet.healthy(GPU) == {"gpu-9"})
    admission = kubelet.admit(pod("p", container("main", 1)))
    assert admission.container("main").devices == {GPU: ("gpu-9",)}
    assert kubelet.calls("GetPreferredAllocation") == []  # the new plugin's options apply
    # The kubelet's quirk: when the replaced plugin's stream ends, it disconnects the current client.
    old.stop()
    kubelet.wait_for(lambda: kubelet.unhealthy(GPU) == {"gpu-9"})


def test_preference_is_honoured_when_available(kubelet: KubeletStandIn,
                                               plugin_for: Callable[..., FakePlugin]) -> None:
    plugin_for(prefer=lambda request: ["gpu-3", "gpu-1"])
    admission = kubelet.admit(pod("p", container("main", 2)))
    assert admission.admitted
    assert admission.container("main").devices == {GPU: ("gpu-1", "gpu-3")}
    assert admission.container("main").responses[GPU].envs["FAKE_DEVICES"] == "gpu-1,gpu-3"
    (call,) = kubelet.calls("GetPreferredAllocation")
    (request,) = call.request.container_requests
    assert (set(request.available_deviceIDs), list(request.must_include_deviceIDs), request.allocation_size) == (
        {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}, [], 2)
    (allocate,) = kubelet.calls("Allocate")
    assert allocate.started >= call.finished
    assert listed(kubelet) == {"p": {"main": {"gpu-1", "gpu-3"}}}


def test_preference_partly_unavailable_is_intersected_then_filled(kubelet: KubeletStandIn,
                                                                  plugin_for: Callable[..., FakePlugin]) -> None:
    plugin = plugin_for(prefer=lambda request: ["gpu-0"])
    kubelet.admit(pod("first", container("main", 1)))
    plugin.prefer = lambda request: ["gpu-0", "gpu-9", "gpu-3"]  # gpu-0 is taken, gpu-9 does not exist
    (got,) = kubelet.admit(pod("second", container("main", 2))).container("main").devices.values()
    assert "gpu-3" in got and len(got) == 2 and set(got) <= {"gpu-1", "gpu-2", "gpu-3"}
    request = kubelet.calls("GetPreferredAllocation")[-1].request.container_requests[0]
    assert set(request.available_deviceIDs) == {"gpu-1", "gpu-2", "gpu-3"}


def test_preference_error_rejects_the_pod_and_frees_what_it_held(kubelet: KubeletStandIn,
                                                                  plugin_for: Callable[..., FakePlugin]) -> None:
    def broken_for_three(request: object) -> list[str]:
        if request.allocation_size == 3:
            raise RuntimeError("topology lost")
        return first_ids(request)
    plugin_for(prefer=broken_for_three)
    admission = kubelet.admit(pod("p", container("a", 1), container("b", 3)))
    assert not admission.admitted and admission.reason == "UnexpectedAdmissionError"
    assert admission.message == ("Allocate failed due to device plugin GetPreferredAllocation rpc failed with err: "
                                 "rpc error: code = Internal desc = topology lost, which is unexpected")
    assert admission.container("a").devices == {GPU: ("gpu-0",)} and admission.container("b").devices == {}
    assert len(kubelet.calls("Allocate")) == 1  # b never reached Allocate
    assert listed(kubelet) == {} and kubelet.in_use(GPU) == frozenset()
    assert kubelet.admit(pod("q", container("main", 4))).admitted


def test_allocate_error_is_rolled_back_but_an_empty_answer_leaks_until_a_pod_leaves(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin]) -> None:
    plugin = plugin_for()
    plugin.allocate_fault = "error"
    refused = kubelet.admit(pod("refused", container("main", 2)))
    assert refused.message == ("Allocate failed due to rpc error: code = Internal desc = allocate refused, "
                               "which is unexpected")
    assert kubelet.in_use(GPU) == frozenset()
    plugin.allocate_fault = "empty"
    empty = kubelet.admit(pod("empty", container("main", 2)))
    assert not empty.admitted and "no containers return in allocation response" in empty.message
    assert len(kubelet.in_use(GPU)) == 2  # the kubelet does not roll back on an empty answer
    plugin.allocate_fault = None
    assert not kubelet.admit(pod("big", container("main", 3))).admitted
    small = kubelet.admit(pod("small", container("main", 1)))
    kubelet.remove(small.uid)  # a pod leaving rebuilds the in-use set from recorded allocations
    assert kubelet.in_use(GPU) == frozenset()


def test_no_preference_call_when_the_plugin_does_not_offer_it(kubelet: KubeletStandIn,
                                                              plugin_for: Callable[..., FakePlugin]) -> None:
    plugin_for(preferred=False)
    admission = kubelet.admit(pod("p", container("main", 2)))
    assert admission.admitted and len(admission.container("main").devices[GPU]) == 2
    assert kubelet.calls("GetPreferredAllocation") == []


def test_init_container_devices_are_reused_by_app_containers(kubelet: KubeletStandIn,
                                                             plugin_for: Callable[..., FakePlugin]) -> None:
    plugin_for(prefer=lambda request: ["gpu-3", "gpu-2"][: request.allocation_size])
    same = kubelet.admit(pod("same", container("main", 2), init=(container("setup", 2),)))
    assert same.container("main").devices == same.container("setup").devices == {GPU: ("gpu-2", "gpu-3")}
    assert len(kubelet.calls("GetPreferredAllocation")) == 1  # the pool covered the app container
    assert [set(c.request.container_requests[0].devices_ids) for c in kubelet.calls("Allocate")] == [
        {"gpu-2", "gpu-3"}] * 2  # but Allocate is called for it all the same
    kubelet.remove(same.uid)
    smaller = kubelet.admit(pod("smaller", container("a", 1), container("b", 1), init=(container("setup", 2),)))
    a, b = smaller.container("a").devices[GPU], smaller.container("b").devices[GPU]
    assert {*a, *b} == {"gpu-2", "gpu-3"}  # each app container drew one from the pool


def test_sidecars_keep_their_devices_and_plain_init_containers_are_not_listed(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin]) -> None:
    plugin_for()
    admission = kubelet.admit(pod("p", container("main", 1),
                                  init=(container("setup", 1), container("proxy", 1, sidecar=True))))
    proxy, main = admission.container("proxy").devices[GPU], admission.container("main").devices[GPU]
    assert admission.container("setup").devices[GPU] == proxy  # the sidecar took the init device...
    assert not set(proxy) & set(main)  # ...and kept it from the app container
    assert listed(kubelet) == {"p": {"proxy": set(proxy), "main": set(main)}}


def test_list_shows_the_pod_while_its_preference_is_in_flight(kubelet: KubeletStandIn,
                                                              plugin_for: Callable[..., FakePlugin]) -> None:
    seen: list[dict[str, dict[str, set[str]]]] = []

    def prefer_after_list(request: object) -> list[str]:
        seen.append(listed(kubelet))  # would deadlock if the kubelet held its lock across this call
        return first_ids(request)
    plugin_for(prefer=prefer_after_list)
    kubelet.admit(pod("old", container("main", 1)))
    admission = kubelet.admit(pod("new", container("a", 1), container("b", 1)))
    assert admission.admitted
    assert seen[1] == {"old": {"main": {"gpu-0"}}, "new": {"a": set(), "b": set()}}
    assert seen[2]["new"] == {"a": {"gpu-1"}, "b": set()}


def test_remove_frees_the_devices(kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin]) -> None:
    plugin_for()
    first = kubelet.admit(pod("first", container("main", 4)))
    assert not kubelet.admit(pod("blocked", container("main", 1))).admitted
    kubelet.remove(first.uid)
    assert kubelet.devices(first.uid) == {} and kubelet.in_use(GPU) == frozenset()
    assert kubelet.admit(pod("next", container("main", 4))).admitted


def test_restart_keeps_allocations_from_the_checkpoint_and_needs_reregistration(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin], plugins: list[FakePlugin]) -> None:
    plugin = plugin_for(prefer=lambda request: ["gpu-0", "gpu-1"][: request.allocation_size])
    kept = kubelet.admit(pod("kept", container("main", 2)))
    kubelet.restart()
    assert not plugin.path.exists() and kubelet.kubelet_socket.exists()  # the plugin must register again
    assert kubelet.devices(kept.uid) == {"main": ("gpu-0", "gpu-1")}
    assert kubelet.healthy(GPU) == frozenset()
    assert listed(kubelet) == {}  # no pod known before its first pod list, as kubelet v1.36 in the e2e suite
    (again,) = kubelet.readmit({kept.uid: ["main"]})
    assert again.admitted and listed(kubelet) == {"kept": {"main": {"gpu-0", "gpu-1"}}}
    refused = kubelet.admit(pod("early", container("main", 1)))
    assert "no healthy devices present" in refused.message
    plugin.stop()
    plugin_for()
    admission = kubelet.admit(pod("after", container("main", 2)))
    assert admission.container("main").devices == {GPU: ("gpu-2", "gpu-3")}
    assert kubelet.start_container(kept.uid, "main")[GPU].envs["FAKE_DEVICES"] == "gpu-0,gpu-1"


def test_a_restarted_kubelet_readmits_running_containers_unchecked_and_rejects_a_pod_still_starting(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin]) -> None:
    """As kubelet v1.36 did in the e2e suite: re-admitted before the plugin registered again, the pod whose app
    container waited behind its init container was rejected, the running one kept its devices."""
    plugin_for()
    running = kubelet.admit(pod("running", container("main", 1)))
    starting = kubelet.admit(pod("starting", container("main", 1), init=(container("setup", 1),)))
    leaving = kubelet.admit(pod("leaving", container("main", 1)))
    allocations = len(kubelet.calls("Allocate"))
    kubelet.restart()
    kubelet.remove(leaving.uid)
    assert kubelet.in_use(GPU) >= set(leaving.container("main").devices[GPU])  # not freed before the sources are ready
    kept, refused = kubelet.readmit({running.uid: ["main"], starting.uid: ["setup"]})
    assert kept.admitted and kept.container("main").devices == running.container("main").devices
    assert not refused.admitted and refused.reason == "UnexpectedAdmissionError"
    assert "no healthy devices present" in refused.message
    assert len(kubelet.calls("Allocate")) == allocations  # nothing asked of the (unregistered) plugin
    assert listed(kubelet) == {"running": {"main": set(running.container("main").devices[GPU])}}
    assert kubelet.in_use(GPU) == frozenset(running.container("main").devices[GPU])


def test_a_pod_still_starting_survives_a_restart_when_its_plugin_registers_first(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin]) -> None:
    plugin = plugin_for()
    starting = kubelet.admit(pod("starting", container("main", 1), init=(container("setup", 2),)))
    allocations = len(kubelet.calls("Allocate"))
    kubelet.restart()
    plugin.stop()
    plugin_for()
    (again,) = kubelet.readmit({starting.uid: ["setup"]})
    assert again.admitted
    assert again.container("main").devices == starting.container("main").devices  # as recorded, no new choice
    assert len(kubelet.calls("Allocate")) == allocations


def test_restart_with_a_lost_checkpoint_reallocates_when_the_container_starts(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin]) -> None:
    plugin = plugin_for(prefer=lambda request: ["gpu-2"])
    kept = kubelet.admit(pod("kept", container("main", 1)))
    kubelet.restart(lose_checkpoint=True)
    assert kubelet.devices(kept.uid) == {}
    assert kubelet.readmit({kept.uid: ["main"]})[0].admitted  # running: nothing to check, nothing recorded
    assert listed(kubelet) == {"kept": {"main": set()}}
    plugin.stop()
    plugin_for(prefer=lambda request: ["gpu-3"])
    response = kubelet.start_container(kept.uid, "main")
    assert response[GPU].envs["FAKE_DEVICES"] == "gpu-3"
    assert kubelet.devices(kept.uid) == {"main": ("gpu-3",)}
    assert kubelet.calls("GetPreferredAllocation")[-1].request.container_requests[0].allocation_size == 1


def test_pre_start_container_gets_the_devices_and_needs_them_recorded(
        kubelet: KubeletStandIn, plugin_for: Callable[..., FakePlugin]) -> None:
    plugin = plugin_for(pre_start=True)
    started = kubelet.admit(pod("p", container("main", 2)))
    kubelet.start_container(started.uid, "main")
    (call,) = kubelet.calls("PreStartContainer")
    assert set(call.request.devices_ids) == set(started.container("main").devices[GPU])
    kubelet.restart(lose_checkpoint=True)
    plugin.stop()
    plugin_for(pre_start=True)
    kubelet.readmit({started.uid: ["main"]})
    with pytest.raises(DeviceManagerError, match="no devices found allocated in local cache"):
        kubelet.start_container(started.uid, "main")  # PreStartContainer comes before any re-allocation


def test_numa_hint_restricts_the_choice(root: Path, plugins: list[FakePlugin]) -> None:
    def hint(pod: dict, container: str) -> set[int] | None:
        return {1}
    with KubeletStandIn(root, numa_affinity=hint) as kubelet:
        plugin = FakePlugin(kubelet.plugin_dir, FOUR)
        plugins.append(plugin)
        plugin.register(kubelet.kubelet_socket)
        kubelet.wait_registered(GPU)
        one = kubelet.admit(pod("one", container("main", 1)))
        assert one.container("main").devices[GPU][0] in {"gpu-2", "gpu-3"}
        request = kubelet.calls("GetPreferredAllocation")[-1].request.container_requests[0]
        assert set(request.available_deviceIDs) == {"gpu-2", "gpu-3"}  # only the aligned devices
        kubelet.remove(one.uid)
        three = kubelet.admit(pod("three", container("main", 3)))
        assert {"gpu-2", "gpu-3"} <= set(three.container("main").devices[GPU])  # all aligned first
        request = kubelet.calls("GetPreferredAllocation")[-1].request.container_requests[0]
        assert set(request.must_include_deviceIDs) == {"gpu-2", "gpu-3"}
        numa = {d.device_ids[0]: d.topology.nodes[0].ID
                for p in pod_resources(kubelet).pod_resources for c in p.containers for d in c.devices}
        assert numa == {"gpu-0": 0, "gpu-2": 1, "gpu-3": 1}
