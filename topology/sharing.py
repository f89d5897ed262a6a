"""How a node shares its GPUs, and what that leaves of topology placement.

On a node whose GPUs are shared the kubelet's devices are not whole GPUs: time-slicing and MPS advertise
replicas of each GPU (`<id>::<n>`), MIG advertises slices, which have no NVLink peer-to-peer. The extender must
not lock such nodes out, count replicas as whole GPUs, or promise a ring there, so it needs to know.

Two sources say it. GPU feature discovery labels the node with the operator's configuration
(`nvidia.com/gpu.sharing-strategy`, and for MIG the product's `-MIG-` suffix or `nvidia.com/mig-<profile>.count`
labels); the node agent observes the kubelet's device ids. The rule: a node shares its GPUs when either says
so. Where both do, the label names the kind (the observation cannot tell time-slicing from MPS); where only one
does, it decides. A node never reverts to whole-GPU placement on one source's word while the other still sees
sharing: the unsafe error is to promise topology on shared devices, the other only costs a placement
preference.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class Sharing(str, Enum):
    NONE = "none"
    TIME_SLICING = "time-slicing"
    MPS = "mps"
    MIG_SINGLE = "mig-single"
    MIG_MIXED = "mig-mixed"
    REPLICAS = "replicas"  # observed by the node agent: replica ids, time-slicing or MPS
    MIG = "mig"  # observed by the node agent: MIG device ids

    @property
    def shared(self) -> bool:
        return self is not Sharing.NONE


SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
GPU_PRODUCT = "nvidia.com/gpu.product"
MIG_STRATEGY = "nvidia.com/mig.strategy"
_MIG_COUNT_PREFIX = "nvidia.com/mig-"
_MAX_LABEL_VALUE = 63  # a label value is at most 63 characters


def from_labels(labels: Mapping[str, object]) -> Sharing:
    """What GPU feature discovery's labels say. `mig.strategy` alone says nothing: GFD sets it on nodes without
    MIG too; MIG is in use when the product carries `-MIG-` (strategy single) or a slice count is positive
    (strategy mixed)."""
    strategy = _text(labels.get(SHARING_STRATEGY))
    if strategy == "time-slicing":
        return Sharing.TIME_SLICING
    if strategy == "mps":
        return Sharing.MPS
    if "-MIG-" in _text(labels.get(GPU_PRODUCT)).upper():
        return Sharing.MIG_SINGLE
    for key, value in labels.items():
        if key.startswith(_MIG_COUNT_PREFIX) and key.endswith(".count") and _text(value).isdigit() \
                and int(_text(value)) > 0:
            return Sharing.MIG_MIXED
    return Sharing.NONE


def combine(labelled: Sharing, observed: Sharing) -> Sharing:
    """The module's rule: shared if either says so; the label names the kind when it says shared."""
    return labelled if labelled.shared else observed


def no_guarantee(sharing: Sharing) -> str:
    """The short, stable reason a pod that requires topology gets on a shared node."""
    return f"GPUs on this node are shared ({sharing.value}): no topology guarantee"


def _text(value: object) -> str:
    return value.strip() if isinstance(value, str) and len(value) <= _MAX_LABEL_VALUE else ""
