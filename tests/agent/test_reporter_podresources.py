"""The pod-resources edge against a real in-process gRPC server on a unix socket, as the kubelet serves it."""

from __future__ import annotations

import time

import grpc
import pytest
from helpers.reporter_fakes import PodResourcesServer, kubelet_fixture, socket_dir_fixture

from topology.agent import podresources_v1 as api
from topology.agent.devices import ContainerDevices, DevicesUnavailable
from topology.agent.podresources import DEFAULT_SOCKET, PodResourcesClient, PodResourcesUnavailable

__all__ = ["kubelet_fixture", "socket_dir_fixture"]  # fixtures

GPU_A = "GPU-0c1f4b6e-54f5-4c53-a0c6-4a6a8e0c1a01"
GPU_B = "GPU-0c1f4b6e-54f5-4c53-a0c6-4a6a8e0c1a02"



@pytest.fixture
def client(kubelet: PodResourcesServer):
    reader = PodResourcesClient(str(kubelet.socket_path), timeout=2.0)
    yield reader
    reader.close()


def test_the_default_socket_is_the_kubelets():
    assert DEFAULT_SOCKET == "/var/lib/kubelet/pod-resources/kubelet.sock"


def test_list_gives_every_containers_devices(kubelet, client):
    kubelet.allocate("team-a", "train", [GPU_A, GPU_B])
    kubelet.allocate("team-a", "train", ["0000:3b:00.0"], container="sidecar", resource="rdma/hca")
    kubelet.allocate("team-b", "serve", [f"{GPU_A}::1"])
    kubelet.allocatable = {"nvidia.com/gpu": [GPU_A, GPU_B], "rdma/hca": ["0000:3b:00.0"]}
    devices = client.read()
    assert set(devices.assigned) == {
        ContainerDevices("team-a", "train", "main", "nvidia.com/gpu", (GPU_A, GPU_B)),
        ContainerDevices("team-a", "train", "sidecar", "rdma/hca", ("0000:3b:00.0",)),
        ContainerDevices("team-b", "serve", "main", "nvidia.com/gpu", (f"{GPU_A}::1",)),
    }
    assert devices.allocatable == {"nvidia.com/gpu": (GPU_A, GPU_B), "rdma/hca": ("0000:3b:00.0",)}


def test_allocations_and_frees_show_on_the_next_read(kubelet, client):
    assert client.read().assigned == ()
    kubelet.allocate("ns", "p", [GPU_A])
    assert [c.device_ids for c in client.read().assigned] == [(GPU_A,)]
    kubelet.free("ns", "p")
    assert client.read().assigned == ()


def test_a_missing_socket_is_one_clear_error(socket_dir):
    reader = PodResourcesClient(str(socket_dir / "absent.sock"))
    with pytest.raises(PodResourcesUnavailable) as caught:
        reader.read()
    assert isinstance(caught.value, DevicesUnavailable)
    assert str(caught.value) == (f"the pod-resources socket {socket_dir / 'absent.sock'} does not exist (is the "
                                 "kubelet running, and its pod-resources directory mounted?)")


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                                  grpc.StatusCode.RESOURCE_EXHAUSTED])
def test_a_failing_list_is_unavailable_and_the_next_read_recovers(kubelet, client, code):
    kubelet.fail(code, method="List")
    with pytest.raises(PodResourcesUnavailable, match=f"pod-resources List on .* failed: {code.name}: injected"):
        client.read()
    kubelet.allocate("ns", "p", [GPU_A])
    assert client.read().assigned[0].device_ids == (GPU_A,)


def test_a_slow_kubelet_times_out(kubelet):
    kubelet.stall = 1.5
    reader = PodResourcesClient(str(kubelet.socket_path), timeout=0.3)
    started = time.monotonic()
    try:
        with pytest.raises(PodResourcesUnavailable, match="DEADLINE_EXCEEDED"):
            reader.read()
        assert time.monotonic() - started < 1.2
    finally:
        reader.close()


def test_a_kubelet_restart_is_picked_up_at_once(socket_dir):
    first = PodResourcesServer(socket_dir / "kubelet.sock").start()
    reader = PodResourcesClient(str(first.socket_path), timeout=2.0)
    try:
        first.allocate("ns", "p", [GPU_A])
        assert reader.read().assigned
        first.stop()
        with pytest.raises(PodResourcesUnavailable):
            reader.read()
        second = PodResourcesServer(socket_dir / "kubelet.sock").start()
        try:
            second.allocate("ns", "q", [GPU_B])
            assert [c.pod for c in reader.read().assigned] == ["q"]  # no wait for gRPC's reconnect backoff
        finally:
            second.stop()
    finally:
        reader.close()


def test_a_kubelet_without_get_allocatable_resources_is_asked_once(kubelet, client, caplog):
    kubelet.allocatable_unimplemented = True
    kubelet.allocate("ns", "p", [GPU_A])
    assert client.read().allocatable is None
    assert client.read().allocatable is None
    assert kubelet.calls["List"] == 2
    assert sum("does not serve GetAllocatableResources" in r.message for r in caplog.records) == 1


def test_a_failing_get_allocatable_resources_does_not_fail_the_read(kubelet, client):
    kubelet.allocate("ns", "p", [GPU_A])
    kubelet.fail(grpc.StatusCode.INTERNAL, method="GetAllocatableResources")
    devices = client.read()
    assert devices.assigned and devices.allocatable is None
    kubelet.allocatable = {"nvidia.com/gpu": [GPU_A]}
    assert client.read().allocatable == {"nvidia.com/gpu": (GPU_A,)}


def test_large_answers_fit(kubelet, client):
    for pod in range(3000):  # ~5 MiB, past gRPC's 4 MiB default
        kubelet.allocate("ns", f"pod-{pod:05d}", [f"GPU-{pod:08d}-{'0' * 1600}"])
    assert len(client.read().assigned) == 3000


# -- the wire format -------------------------------------------------------------------------------------

# (message, field, number, type) as in k8s.io/kubelet/pkg/apis/podresources/v1/api.proto.
KUBELET_FIELDS = [
    ("ListPodResourcesResponse", "pod_resources", 1, "PodResources"),
    ("PodResources", "name", 1, None),
    ("PodResources", "namespace", 2, None),
    ("PodResources", "containers", 3, "ContainerResources"),
    ("ContainerResources", "name", 1, None),
    ("ContainerResources", "devices", 2, "ContainerDevices"),
    ("ContainerResources", "dynamic_resources", 5, "DynamicResource"),
    ("DynamicResource", "claim_name", 2, None),
    ("DynamicResource", "claim_namespace", 3, None),
    ("DynamicResource", "claim_resources", 4, "ClaimResource"),
    ("ClaimResource", "cdi_devices", 1, "CDIDevice"),
    ("ClaimResource", "driver_name", 2, None),
    ("ClaimResource", "pool_name", 3, None),
    ("ClaimResource", "device_name", 4, None),
    ("ClaimResource", "share_id", 5, None),
    ("CDIDevice", "name", 1, None),
    ("ContainerDevices", "resource_name", 1, None),
    ("ContainerDevices", "device_ids", 2, None),
    ("ContainerDevices", "topology", 3, "TopologyInfo"),
    ("TopologyInfo", "nodes", 1, "NUMANode"),
    ("NUMANode", "ID", 1, None),
    ("AllocatableResourcesResponse", "devices", 1, "ContainerDevices"),
]


@pytest.mark.parametrize(("message", "name", "number", "kind"), KUBELET_FIELDS)
def test_messages_have_the_kubelets_field_numbers(message, name, number, kind):
    descriptor = getattr(api, message).DESCRIPTOR
    assert descriptor.full_name == f"v1.{message}"
    field = descriptor.fields_by_name[name]
    assert field.number == number
    assert (field.message_type.full_name if field.message_type else None) == (f"v1.{kind}" if kind else None)


def test_the_service_paths_are_the_kubelets():
    assert api.LIST == "/v1.PodResourcesLister/List"
    assert api.GET_ALLOCATABLE_RESOURCES == "/v1.PodResourcesLister/GetAllocatableResources"


def test_fields_the_reporter_does_not_model_are_skipped():
    """The kubelet also sends cpu_ids (3) and memory (4) per container."""
    extra = bytes([0x1A, 0x02, 0x05, 0x07, 0x22, 0x00])  # field 3: packed [5, 7]; field 4: an empty message
    container = api.ContainerResources.FromString(api.ContainerResources(name="main").SerializeToString() + extra)
    assert container.name == "main" and list(container.devices) == []


@pytest.mark.parametrize("package", ["podresources_v1", "deviceplugin_v1beta1"])
def test_the_committed_descriptor_is_api_proto_compiled(package: str) -> None:
    """grpcio-tools, of the test extras, compiles api.proto: without it this fails on the import, it never skips."""
    from topology.agent.regenerate import HERE, render
    assert (HERE / package / "descriptor.py").read_text() == render(package), \
        f"{package}/descriptor.py is stale: run python topology/agent/regenerate.py"
