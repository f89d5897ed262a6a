"""What Allocate tells the container runtime about a container's GPUs, in the forms NVIDIA's device plugin
offers (its `--device-list-strategy`, `internal/plugin/server.go` in NVIDIA/k8s-device-plugin): pure.

- `envvar`: NVIDIA_VISIBLE_DEVICES=<id>,<id>; the NVIDIA runtime (or its hook) mounts those GPUs;
- `volume-mounts`: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices and one read-only mount of
  /dev/null at /var/run/nvidia-container-devices/<id> per GPU, which only a privileged path can forge;
- `cdi-annotations`: one annotation `cdi.k8s.io/<plugin>_<response id>` = "<kind>=<id>,<kind>=<id>", which a
  CDI-enabled runtime reads;
- `cdi-cri`: the CRI `CDIDevice` names "<kind>=<id>", which the kubelet hands to the runtime.

The default is `cdi-annotations,cdi-cri` with the kind `k8s.device-plugin.nvidia.com/gpu`: what the GPU
operator configures for NVIDIA's plugin now that CDI is its default (`transformDevicePluginCtrForCDI` in
NVIDIA/gpu-operator controllers/object_controls.go), with the kind of the CDI spec that plugin writes
(`cdi.WithVendor("k8s.device-plugin.nvidia.com")`, class `gpu`). That setup leaves `nvidia` off as the
default runtime, so an environment variable alone reaches no container. topology/agent/README.md says more.

A GPU the plugin names `GPU<index>` (a topology without UUIDs, `--from-topo`) goes to the runtime as its
index, as NVIDIA's plugin does with DEVICE_ID_STRATEGY=index.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CDI_ANNOTATION_PREFIX = "cdi.k8s.io/"
CDI_PLUGIN_NAME = "gpu-topology"  # the <plugin> of the CDI annotation key
DEFAULT_CDI_KIND = "k8s.device-plugin.nvidia.com/gpu"

# The CDI rules (tags.cncf.io/container-device-interface, parser and producer): a vendor and a class start
# with a letter and end with a letter or digit; a device name and an annotation name start and end with one.
_CDI_KIND = re.compile(r"[A-Za-z]([A-Za-z0-9_.-]*[A-Za-z0-9])?/[A-Za-z]([A-Za-z0-9_-]*[A-Za-z0-9])?$")
_CDI_DEVICE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")
_CDI_ANNOTATION_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_INDEX_ID = re.compile(r"GPU(\d+)$")


class Strategy(str, Enum):
    ENVVAR = "envvar"
    VOLUME_MOUNTS = "volume-mounts"
    CDI_ANNOTATIONS = "cdi-annotations"
    CDI_CRI = "cdi-cri"

    @property
    def cdi(self) -> bool:
        return self in (Strategy.CDI_ANNOTATIONS, Strategy.CDI_CRI)


DEFAULT_STRATEGIES = (Strategy.CDI_ANNOTATIONS, Strategy.CDI_CRI)


def parse_strategies(text: str) -> tuple[Strategy, ...]:
    """A comma list such as `cdi-annotations,cdi-cri`; ValueError names what is wrong."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise ValueError("no device list strategy given")
    known = {strategy.value: strategy for strategy in Strategy}
    for name in names:
        if name not in known:
            raise ValueError(f"unknown device list strategy {name!r}; choose from {', '.join(known)}")
    return tuple(dict.fromkeys(known[name] for name in names))


@dataclass(frozen=True, slots=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class ContainerAnswer:
    """One ContainerAllocateResponse, as plain values."""

    envs: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Delivery:
    """How GPUs are handed to the runtime: the strategies, and the CDI kind their CDI names use."""

    strategies: tuple[Strategy, ...] = DEFAULT_STRATEGIES
    cdi_kind: str = DEFAULT_CDI_KIND

    def __post_init__(self) -> None:
        if not self.strategies:
            raise ValueError("no device list strategy given")
        if not _CDI_KIND.match(self.cdi_kind):
            raise ValueError(f"CDI kind {self.cdi_kind!r} is not <vendor>/<class>, e.g. {DEFAULT_CDI_KIND}")

    @property
    def uses_cdi(self) -> bool:
        return any(strategy.cdi for strategy in self.strategies)

    def answer(self, gpu_ids: Sequence[str], response_id: str) -> ContainerAnswer:
        """The answer for one container getting `gpu_ids`; `response_id` makes the CDI annotation key unique
        (NVIDIA's plugin uses a fresh UUID per response). ValueError for an id no runtime could take."""
        names = [runtime_id(gpu) for gpu in gpu_ids]
        for name in names:
            if not _CDI_DEVICE.match(name):
                raise ValueError(f"{name[:80]!r} cannot be handed to a container runtime")
        envs: dict[str, str] = {}
        mounts: tuple[Mount, ...] = ()
        annotations: dict[str, str] = {}
        cdi_devices: tuple[str, ...] = ()
        qualified = tuple(f"{self.cdi_kind}={name}" for name in names)
        if Strategy.CDI_ANNOTATIONS in self.strategies and qualified:
            annotation = f"{CDI_PLUGIN_NAME}_{response_id}"
            if not _CDI_ANNOTATION_NAME.match(annotation):
                raise ValueError(f"{annotation!r} is not a CDI annotation name")
            annotations[CDI_ANNOTATION_PREFIX + annotation] = ",".join(qualified)
        if Strategy.CDI_CRI in self.strategies:
            cdi_devices = qualified
        # As NVIDIA's plugin: the variable and the mounts only when some strategy is not CDI, and
        # volume-mounts, applied after envvar, sets the variable last.
        if Strategy.ENVVAR in self.strategies:
            envs[VISIBLE_DEVICES] = ",".join(names)
        if Strategy.VOLUME_MOUNTS in self.strategies:
            envs[VISIBLE_DEVICES] = VOLUME_MOUNTS_ROOT
            mounts = tuple(Mount(f"{VOLUME_MOUNTS_ROOT}/{name}", VOLUME_MOUNTS_HOST_PATH, True) for name in names)
        return ContainerAnswer(envs, mounts, annotations, cdi_devices)


def runtime_id(gpu_id: str) -> str:
    """How the runtime names a GPU: its UUID, or its index for `GPU<index>`."""
    index = _INDEX_ID.match(gpu_id)
    return index.group(1) if index else gpu_id
