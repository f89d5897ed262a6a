"""On a DRA node (`--dra-driver`): which pod holds which GPU, from the claims the kubelet prepared.

There NVIDIA's DRA driver (k8s-dra-driver-gpu) hands out the GPUs, not a device plugin: it publishes each GPU as
device `gpu-<minor>` (cmd/gpu-kubelet-plugin/deviceinfo.go), `<minor>` being its /dev/nvidia<minor>, in one pool
named after the node, and a MIG device as `gpu-<minor>-mig-<profile>-<start>-<size>`. pod-resources lists each
container's claims with their devices by driver, pool and device name (`podresources.claim_devices`).

A minor is not an NVML index: both usually follow the PCI order, but nothing promises it. So the agent asks NVML
each GPU's minor and UUID (`read_minors`) and joins the devices to its topology by UUID. With `--from-topo` there is
no NVML: GPU i is taken to be `gpu-i`, as NVIDIA's device plugin's DEVICE_ID_STRATEGY=index takes it.

What a device names decides: a GPU of this node, held by the pod; a MIG device, ignored with a note as in device
plugin mode (the extender reads the claim and keeps its GPU from whole-GPU pods); anything else (another pool, a
name the driver does not give, a minor this node lacks) makes the state unknown with the reason, rather than
publishing a GPU in use as free.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import ModuleType

from topology.agent.devices import ClaimDevice, GpuIds, KubeletDevices, Observation, Unknown
from topology.discover import NvmlUnavailable

DEFAULT_DRIVER = "gpu.nvidia.com"
_GPU = re.compile(r"gpu-(\d{1,4})")
_MIG = re.compile(r"gpu-(\d{1,4})-mig-\d{1,4}-\d{1,4}-\d{1,4}")


def read_minors(nvml: ModuleType, ids: GpuIds) -> dict[int, str]:
    """Minor number -> GPU id, from NVML, joined to the topology by UUID. NvmlUnavailable when NVML cannot say, or
    names GPUs the topology lacks (the driver changed under the agent: the DaemonSet restarts it)."""
    by_uuid = {gpu.lower(): gpu for gpu in ids.ids}
    minors: dict[int, str] = {}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML is not available: {error}") from None
    try:
        for index in range(len(ids.ids)):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            gpu = by_uuid.get(uuid.lower())
            if gpu is None or minor in minors:
                raise NvmlUnavailable(f"NVML GPU {index} ({uuid}, minor {minor}) is not one GPU of the topology")
            minors[minor] = gpu
    except nvml.NVMLError as error:
        raise NvmlUnavailable(f"NVML cannot give the GPUs' minor numbers: {error}") from None
    finally:
        nvml.nvmlShutdown()
    return minors


def index_minors(ids: GpuIds) -> dict[int, str]:
    """Without NVML (`--from-topo`): GPU i is minor i."""
    return dict(enumerate(ids.ids))


class DraDevices:
    """One DRA driver's devices in this node's pool, as this node's GPUs."""

    def __init__(self, driver: str, pool: str, minors: Mapping[int, str]) -> None:
        self.driver = driver
        self.pool = pool
        self._minors = dict(minors)

    def observe(self, devices: KubeletDevices, health: Mapping[str, str]) -> Observation | Unknown:
        """The pods' GPUs from their claims' devices, with NVML health (GPU id -> reason)."""
        pods: dict[str, set[str]] = {}
        mig = 0
        for device in devices.claimed:
            gpu = self.resolve(device)
            if isinstance(gpu, Unknown):
                return gpu
            if gpu is None:
                mig += 1
            else:
                pods.setdefault(f"{device.namespace}/{device.pod}", set()).add(gpu)
        notes = (f"{mig} MIG device(s) of {self.driver} are prepared and ignored: only whole GPUs are reported",) \
            if mig else ()
        return Observation(frozenset(gpu for gpus in pods.values() for gpu in gpus), dict(health), notes,
                           {key: frozenset(gpus) for key, gpus in pods.items()})

    def listed(self, devices: KubeletDevices) -> dict[tuple[str, str], dict[str, tuple[str, ...]]] | Unknown:
        """(namespace, pod) -> container -> the GPU ids of its claims' whole-GPU devices, for `--holders`."""
        listed: dict[tuple[str, str], dict[str, tuple[str, ...]]] = {}
        for device in devices.claimed:
            gpu = self.resolve(device)
            if isinstance(gpu, Unknown):
                return gpu
            containers = listed.setdefault((device.namespace, device.pod), {})
            held = containers.get(device.container, ())
            containers[device.container] = held + (gpu,) if gpu is not None and gpu not in held else held
        return listed

    def resolve(self, device: ClaimDevice) -> str | None | Unknown:
        """The GPU id a whole-GPU device names, None for a MIG device, Unknown for what names no GPU here."""
        held = (f"the kubelet prepared {device.driver} device {device.device!r} of pool {device.pool!r} for "
                f"{device.namespace}/{device.pod} ({device.container}, claim {device.claim})")
        if device.pool != self.pool:
            return Unknown(f"{held}, not of this node's pool {self.pool!r} (is the node name right?)")
        whole, mig = _GPU.fullmatch(device.device), _MIG.fullmatch(device.device)
        found = whole or mig
        gpu = self._minors.get(int(found.group(1))) if found else None
        if gpu is None:
            return Unknown(f"{held}, which names no GPU of this node (its GPUs are "
                           f"{', '.join(f'gpu-{minor}' for minor in sorted(self._minors))})")
        return gpu if whole else None
