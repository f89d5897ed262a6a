"""A node as the extender sees it, and the key its verdicts and scores are remembered by: values only.

The cluster state builds them from the watches (extender/cache/cluster_state.py) and the ledger keeps their free
masks (extender/cache/ledger.py); everything that decides reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from extender.api.preferences import Taint
from topology.compiled import CompiledTopology
from topology.fabric import Domain
from topology.sharing import Sharing


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    compiled: CompiledTopology | None = None
    ids: tuple[str, ...] = ()  # GPU id per index: the UUID, or GPU<index> when the topology has none
    index_of: Mapping[str, int] = field(default_factory=dict)
    unhealthy: int = 0  # mask
    reported_used: frozenset[str] = frozenset()
    reported_pods: Mapping[str, frozenset[str]] = field(default_factory=dict)  # "namespace/name" -> its GPUs
    observed: float | None = None  # when the reporter last looked, epoch seconds
    free: int = 0  # mask of free, healthy GPUs
    problem: str | None = None  # why the node's topology cannot be used
    refused: str | None = None  # the short, stable class of a refused annotation (REFUSED), for the metric
    raw_topology: str | None = None
    sharing: Sharing = Sharing.NONE  # from GFD's labels and the agent's observation (topology/sharing.py)
    reported_domain: Domain | None = None  # the NVLink domain in the agent's topology annotation
    domain: Domain = Domain(None, None)  # that and GFD's nvidia.com/gpu.clique label, reconciled
    dra_taken: int = 0  # mask of GPUs DRA gives no pod now: allocated by a claim, unpublished, MIG, tainted
    dra_pinned: int = 0  # of those, the GPUs held only by an unallocated claim's pin: its own pod may have them
    dra_pods: frozenset[str] = frozenset()  # UIDs of the pods DRA claims on this node are reserved for
    dra_order: tuple[int, ...] | None = None  # its GPUs in the order DRA's allocator tries them; None: not DRA's
    soft_taints: tuple[Taint, ...] | None = ()  # its PreferNoSchedule taints; None: unreadable here

    @property
    def size(self) -> int:
        return len(self.ids)

    def mask(self, gpu_ids: Iterable[str]) -> int:
        return sum(1 << self.index_of[gpu] for gpu in set(gpu_ids) if gpu in self.index_of)

    def gpu_ids(self, mask: int) -> tuple[str, ...]:
        return tuple(gpu for index, gpu in enumerate(self.ids) if mask >> index & 1)


KeyValue = tuple[CompiledTopology, int, int, bool, tuple[int, ...] | None, int | None, int]
"""(board, free, unhealthy, whole, order, given, pinned): what a NodeKey is interned on."""


@dataclass(frozen=True, slots=True, eq=False)
class NodeKey:
    """What a node's verdict and score depend on: its board, free mask and unhealthy mask, whether its
    domain is whole (extender/verbs/scoring/domains.py), and on a DRA node the order its GPUs are given in.

    Nodes with equal keys get equal answers, so a request over 5,000 nodes decides once per distinct key.
    Keys are interned (one object per distinct value), so hashing one is hashing a pointer.
    """

    compiled: CompiledTopology
    free: int
    unhealthy: int
    whole: bool = False  # its NVLink domain (else innermost block) has every GPU free
    order: tuple[int, ...] | None = None  # a DRA node's GPUs in its slice's order: the allocator's first-fit
    given: int | None = None  # a DRA node's key for one request size: what its first fit gives (cluster_state.py)
    pinned: int = 0  # a DRA node's GPUs held only by unallocated pins: not free to us, free to kube-scheduler

    def deliverable(self, count: int) -> int:
        """The free GPUs a pod of `count` GPUs can be given here: any free one where the extender picks the set
        (the node agent delivers it), but only the first `count` free in slice order where kube-scheduler's DRA
        allocator picks: it is first-fit over the devices as the driver lists them, and for a request of whole
        GPUs with no constraint its first fit is those (research/dra.md §3.2)."""
        if self.given is not None:
            return self.given
        return self.free if self.order is None else allocator_pick(self.free, self.pinned, self.order, count)

    @property
    def value(self) -> KeyValue:
        """What makes two keys the same key (they are interned on it)."""
        return self.compiled, self.free, self.unhealthy, self.whole, self.order, self.given, self.pinned


def allocator_pick(free: int, pinned: int, order: tuple[int, ...], count: int) -> int:
    """What kube-scheduler's allocator gives a claim of `count` whole GPUs: its first fit over the GPUs it sees free,
    which include those an unallocated pin holds (extender/pinning/). A first fit that takes one of those would take
    another pod's pinned GPU: nothing is deliverable then, until the pin is allocated and the first fit moves on."""
    given = first_fit(free | pinned, order, count)
    return 0 if given & pinned else given


def first_fit(free: int, order: tuple[int, ...], count: int) -> int:
    """The first `count` GPUs of `free` in `order`, as a mask (fewer if fewer are free)."""
    mask = 0
    for gpu in order:
        if count <= 0:
            break
        if free >> gpu & 1:
            mask |= 1 << gpu
            count -= 1
    return mask


@dataclass(frozen=True, slots=True)
class SharedKey:
    """The key of a node whose GPUs are shared: kube-scheduler's count decides, topology promises nothing."""

    sharing: Sharing


# A node's key, or for a node without a usable topology the reason.
Key = NodeKey | SharedKey | str

# Refused annotations: the metric's reason class -> the filter reason the node's pods are shown.
REFUSED: dict[str, str] = {
    "topology-invalid": "GPU topology annotation is invalid",
    "state-invalid": "GPU state annotation is invalid",
    "state-future": "GPU state annotation is dated in the future",
}
