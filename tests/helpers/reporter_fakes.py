"""Test doubles for the reporter: a real in-process gRPC server speaking the kubelet's pod-resources API v1
on a unix socket, a health surface added to the fake NVML, and the shared captures.

The gRPC server serves the same method paths and messages as the kubelet (`/v1.PodResourcesLister/List`,
`/v1.PodResourcesLister/GetAllocatableResources`), so the reporter's client cannot tell it from a kubelet.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import grpc
import pynvml
import pytest

from helpers import paths

from topology.agent import podresources_v1 as api
from topology.model import Topology
from topology.platforms import PLATFORMS, Platform

SHARED = paths.SHARED / "topologies"
PARTIAL_CAPTURE = "dgx2-v100-partial.txt"


def shared_captures() -> list[tuple[str, Path, Platform | None]]:
    """Every complete shared capture (FACTS files and the partial DGX-2 left out), with its bundled platform.

    Without ../shared beside the checkout, the bundled copies stand in (they are verbatim copies, checked
    by test_nvidia_smi)."""
    bundled = {platform.capture: platform for platform in PLATFORMS.values()}
    if SHARED.is_dir():
        files = sorted(p for p in SHARED.glob("*.txt") if not p.name.startswith("FACTS-") and p.name != PARTIAL_CAPTURE)
        return [(path.stem, path, bundled.get(path.name)) for path in files]
    return [(platform.name, paths.CAPTURES / platform.capture,
             platform) for platform in PLATFORMS.values() if platform.capture != "dgx2-v100.txt"]


def short_tmpdir() -> Path:
    """A unix socket path must stay under 108 bytes; pytest's tmp_path can be longer."""
    return Path(tempfile.mkdtemp(prefix="pr-"))


@dataclass
class PodResourcesServer:
    """A kubelet pod-resources endpoint. `allocate`/`free` change what List answers; `prepare` adds a claim's
    devices to a container's dynamic resources, as the kubelet lists a prepared ResourceClaim, whatever they are;
    `allocatable` is what GetAllocatableResources answers. `fail(code, times)` makes the next calls fail with that
    gRPC status; `allocatable_unimplemented` answers UNIMPLEMENTED as kubelets before 1.23 did; `stall` delays List."""

    socket_path: Path
    allocatable: dict[str, list[str]] = field(default_factory=dict)
    allocatable_unimplemented: bool = False
    stall: float = 0.0  # seconds each List waits before it answers
    calls: dict[str, int] = field(default_factory=lambda: {"List": 0, "GetAllocatableResources": 0})
    _pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = field(default_factory=dict)
    _claims: dict[tuple[str, str], dict[str, list]] = field(default_factory=dict)  # pod -> container -> claims
    _faults: list[list] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: grpc.Server | None = None

    def start(self) -> PodResourcesServer:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=api.ListPodResourcesRequest.FromString,
                response_serializer=api.ListPodResourcesResponse.SerializeToString),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                self._get_allocatable, request_deserializer=api.AllocatableResourcesRequest.FromString,
                response_serializer=api.AllocatableResourcesResponse.SerializeToString),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(api.SERVICE, handlers),))
        if server.add_insecure_port(f"unix://{self.socket_path}") == 0:
            raise RuntimeError(f"cannot listen on {self.socket_path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait(5)
            self._server = None
        if self.socket_path.exists():
            os.unlink(self.socket_path)

    # -- controls ----------------------------------------------------------------------------------------

    def allocate(self, namespace: str, pod: str, device_ids: list[str], *, container: str = "main",
                 resource: str = "nvidia.com/gpu") -> None:
        with self._lock:
            containers = self._pods.setdefault((namespace, pod), {})
            containers.setdefault(container, {}).setdefault(resource, []).extend(device_ids)

    def prepare(self, namespace: str, pod: str, claim: str, devices: list[tuple[str, str, str]], *,
                container: str = "main", claim_namespace: str | None = None) -> None:
        """List shows `claim` in the container's dynamic resources with these (driver, pool, device), each with the
        CDI device NVIDIA's driver names it by."""
        resources = [api.ClaimResource(driver_name=driver, pool_name=pool, device_name=device,
                                       cdi_devices=[api.CDIDevice(name=f"k8s.{driver}/device={device}")])
                     for driver, pool, device in devices]
        with self._lock:
            self._pods.setdefault((namespace, pod), {}).setdefault(container, {})
            self._claims.setdefault((namespace, pod), {}).setdefault(container, []).append(api.DynamicResource(
                claim_name=claim, claim_namespace=namespace if claim_namespace is None else claim_namespace,
                claim_resources=resources))

    def free(self, namespace: str, pod: str) -> None:
        with self._lock:
            self._pods.pop((namespace, pod), None)
            self._claims.pop((namespace, pod), None)

    def fail(self, code: grpc.StatusCode, times: int = 1, method: str | None = None) -> None:
        with self._lock:
            self._faults.append([code, times, method])

    # -- the service -------------------------------------------------------------------------------------

    def _fault(self, method: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            for fault in self._faults:
                if fault[2] in (None, method):
                    fault[1] -= 1
                    if fault[1] <= 0:
                        self._faults.remove(fault)
                    context.abort(fault[0], f"injected {fault[0].name}")

    def _list(self, request, context):
        self._fault("List", context)
        if self.stall:
            time.sleep(self.stall)
        with self._lock:
            self.calls["List"] += 1
            pods = [api.PodResources(name=pod, namespace=namespace, containers=[
                api.ContainerResources(name=container, devices=[
                    api.ContainerDevices(resource_name=resource, device_ids=ids)
                    for resource, ids in resources.items()],
                    dynamic_resources=self._claims.get((namespace, pod), {}).get(container, []))
                for container, resources in containers.items()])
                for (namespace, pod), containers in sorted(self._pods.items())]
        return api.ListPodResourcesResponse(pod_resources=pods)

    def _get_allocatable(self, request, context):
        if self.allocatable_unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "unknown method GetAllocatableResources")
        self._fault("GetAllocatableResources", context)
        with self._lock:
            self.calls["GetAllocatableResources"] += 1
            # The kubelet answers one ContainerDevices per device, with its NUMA node.
            devices = [api.ContainerDevices(resource_name=resource, device_ids=[device_id],
                                            topology=api.TopologyInfo(nodes=[api.NUMANode(ID=0)]))
                       for resource, ids in self.allocatable.items() for device_id in ids]
        return api.AllocatableResourcesResponse(devices=devices)


@pytest.fixture(name="socket_dir")
def socket_dir_fixture():
    """A short temporary directory for unix sockets. A test module imports this function to use it."""
    directory = short_tmpdir()
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(name="kubelet")
def kubelet_fixture(socket_dir: Path):
    """A started PodResourcesServer on socket_dir/kubelet.sock, stopped after the test."""
    server = PodResourcesServer(socket_dir / "kubelet.sock").start()
    yield server
    server.stop()


@dataclass
class HealthFaults:
    """What the fake NVML's health queries answer, per GPU index; mutable while the reporter runs."""

    lost: set[int] = field(default_factory=set)
    ecc: dict[int, int] = field(default_factory=dict)
    remap_failed: set[int] = field(default_factory=set)
    ecc_unsupported: bool = False
    remap_unsupported: bool = False
    driver_gone: bool = False


def add_health(fake: ModuleType, topology: Topology, name: str) -> HealthFaults:
    """Give a fake NVML (tests/helpers/fake_nvml.py) the queries health.py makes, answering from a HealthFaults."""
    from helpers.fake_nvml import gpu_uuid

    faults = HealthFaults()
    by_uuid = {gpu_uuid(name, gpu.index): gpu.index for gpu in topology.gpus}

    def fail(code: int) -> None:
        raise pynvml.NVMLError(code)

    def check(index: int) -> None:
        if faults.driver_gone:
            fail(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if index in faults.lost:
            fail(pynvml.NVML_ERROR_GPU_IS_LOST)

    def handle_by_uuid(uuid: str | bytes):
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        if faults.driver_gone:
            fail(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        if text not in by_uuid:
            fail(pynvml.NVML_ERROR_NOT_FOUND)
        check(by_uuid[text])
        return fake.nvmlDeviceGetHandleByIndex(by_uuid[text])

    def total_ecc_errors(handle, error_type: int, counter_type: int) -> int:
        check(handle.index)
        assert (error_type, counter_type) == (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)
        if faults.ecc_unsupported:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return faults.ecc.get(handle.index, 0)

    def remapped_rows(handle) -> tuple[int, int, int, int]:
        check(handle.index)
        if faults.remap_unsupported:
            fail(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return (0, 0, 0, 1 if handle.index in faults.remap_failed else 0)

    fake.nvmlDeviceGetHandleByUUID = handle_by_uuid
    fake.nvmlDeviceGetTotalEccErrors = total_ecc_errors
    fake.nvmlDeviceGetRemappedRows = remapped_rows
    return faults
