"""Where a node sits: its multi-node NVLink domain (DESIGN §10), from NVML fabric info and GFD's node label.

A GB200 NVL72 rack is one NVLink domain across 18 nodes, which `nvidia-smi topo -m` cannot show: only each GPU's
fabric info names it, by (cluster UUID, clique id), once the fabric manager has registered the GPU. The domain's
name is the value of GPU Feature Discovery's label nvidia.com/gpu.clique, "<clusterUUID>.<cliqueId>" (the UUID as
google/uuid prints it, the clique id in decimal), so the agent's reading and the label compare as text. A clique id
alone is never a key: two racks, two cluster UUIDs, can both have clique 0.

Pure: topology/discover.py translates pynvml's structures into `GpuFabric`, the extender reads the label, and
both meet here.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from topology import bounds

CLIQUE_LABEL = "nvidia.com/gpu.clique"  # GPU Feature Discovery's node label

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_UUID_PATTERN = re.compile(_UUID)
_DOMAIN_PATTERN = re.compile(rf"({_UUID})\.(0|[1-9][0-9]*)")
_PROBLEM_PATTERN = re.compile(rf"[ -~]{{1,{bounds.MAX_DOMAIN_PROBLEM_LENGTH}}}")
_SHOWN = 80  # characters of an untrusted value quoted in a reason


class FabricState(Enum):
    """How far the fabric manager got registering a GPU: nvmlGpuFabricState_t, with NVML's numbers."""

    NOT_SUPPORTED = 0
    NOT_STARTED = 1
    IN_PROGRESS = 2
    COMPLETED = 3


@dataclass(frozen=True, slots=True)
class GpuFabric:
    """One GPU's NVML fabric info, already translated from pynvml."""

    cluster_uuid: str  # canonical lowercase 8-4-4-4-12 text
    clique_id: int  # uint32
    state: FabricState
    status_ok: bool  # NVML's status == NVML_SUCCESS; it means something only once state is COMPLETED

    def __post_init__(self) -> None:
        if not isinstance(self.cluster_uuid, str) or not _UUID_PATTERN.fullmatch(self.cluster_uuid):
            raise ValueError(f"cluster UUID {_shown(self.cluster_uuid)}: expected lowercase 8-4-4-4-12 hex")
        if type(self.clique_id) is not int or not 0 <= self.clique_id <= bounds.MAX_CLIQUE_ID:
            raise ValueError(f"clique id {_shown(self.clique_id)}: expected 0 to {bounds.MAX_CLIQUE_ID}")

    @property
    def attached(self) -> bool:
        """The GPU takes part in fabric registration at all (NVML may also just answer NOT_SUPPORTED)."""
        return self.state is not FabricState.NOT_SUPPORTED


@dataclass(frozen=True, slots=True)
class Domain:
    """A node's NVLink domain, or why it has none.

    `name` is GFD's nvidia.com/gpu.clique value. `problem` says, in one stable line, why a node that does claim
    fabric info has no domain; both None is a node without multi-node NVLink.
    """

    name: str | None
    problem: str | None = None

    def __post_init__(self) -> None:
        if self.name is not None:
            parse_domain(self.name)
            if self.problem is not None:
                raise ValueError("a node has a domain or a problem, not both")
        elif self.problem is not None and not (isinstance(self.problem, str)
                                               and _PROBLEM_PATTERN.fullmatch(self.problem)):
            raise ValueError(f"expected 1 to {bounds.MAX_DOMAIN_PROBLEM_LENGTH} printable ASCII characters")


_STATE_PROBLEMS = {FabricState.NOT_STARTED: "fabric registration not started",
                   FabricState.IN_PROGRESS: "fabric registration in progress"}


def node_domain(gpus: Sequence[GpuFabric | None]) -> Domain:
    """The node's domain from every GPU's fabric info (None: NVML says the GPU has none).

    A domain only when every GPU is registered (COMPLETED), with status success, a non-zero cluster UUID and the same
    (cluster UUID, clique id) as every other GPU: a pod placed by domain may get any GPU of the node. No GPU
    attached to a fabric is a node without multi-node NVLink, and no problem. Neither is a zero cluster UUID on every
    GPU, registered with success: that is how NVML describes an NVSwitch fabric that ends at the node (HGX H100), and
    go-nvlib's IsFabricAttached, behind GFD's label, reads it as no fabric too. A zero UUID beside non-zero ones is
    a problem, as is registration not finished, a failed status (e.g. Insufficient Resources) or disagreement.
    """
    if not any(gpu is not None and gpu.attached for gpu in gpus):
        return Domain(None)
    for index, gpu in enumerate(gpus):
        if gpu is None or not gpu.attached:
            return Domain(None, f"GPU {index} has no fabric info while other GPUs of the node do")
        if gpu.state in _STATE_PROBLEMS:
            return Domain(None, f"GPU {index} {_STATE_PROBLEMS[gpu.state]}")
        if not gpu.status_ok:
            return Domain(None, f"GPU {index} fabric status is not success")
    registered = [gpu for gpu in gpus if gpu is not None]
    zero = [index for index, gpu in enumerate(registered) if gpu.cluster_uuid == _ZERO_UUID]
    if len(zero) == len(registered):
        return Domain(None)
    if zero:
        return Domain(None, f"GPU {zero[0]} fabric cluster UUID is zero")
    names = [f"{gpu.cluster_uuid}.{gpu.clique_id}" for gpu in registered]
    for index, name in enumerate(names):
        if name != names[0]:
            return Domain(None, f"GPUs disagree on their NVLink domain: GPU 0 in {names[0]}, GPU {index} in {name}")
    return Domain(names[0])


def reconcile(reported: Domain | None, label: object) -> Domain:
    """The node's domain from its agent's annotation and GFD's label value.

    `reported` is None when the annotation says nothing (an older agent, a capture instead of NVML, a node without
    fabric info); `label` is the label's value, None when the node has none, and untrusted otherwise. Only one
    present: that one. Both present and different: no domain, with a reason naming both. A malformed label is
    doubt too: no domain, whatever the agent read.
    """
    if label is None:
        return reported if reported is not None else Domain(None)
    try:
        labelled = parse_domain(label)
    except ValueError as error:
        return Domain(None, _fit(f"label {CLIQUE_LABEL}: {error}"))
    if reported is None or reported.name == labelled:
        return Domain(labelled)
    return Domain(None, _fit(f"the node agent reads {_reading(reported)} in NVML, label {CLIQUE_LABEL} says "
                             f"{labelled}"))


def parse_domain(text: object) -> str:
    """`text` if it is a domain name in canonical form, else ValueError saying why.

    Canonical is what both sources write: lowercase UUID, decimal clique id without leading zeros. Anything else
    (upper case included) is refused rather than normalised, since only a hand-edited label can hold it.
    """
    if not isinstance(text, str):
        raise ValueError(f"expected <clusterUUID>.<cliqueId> text, found {type(text).__name__}")
    if len(text) > bounds.MAX_DOMAIN_LENGTH:
        raise ValueError(f"{len(text)} characters; a domain has at most {bounds.MAX_DOMAIN_LENGTH}")
    match = _DOMAIN_PATTERN.fullmatch(text)
    if match is None:
        case = " (lowercase)" if _DOMAIN_PATTERN.fullmatch(text.lower()) else ""
        raise ValueError(f"{_shown(text)} is not <clusterUUID>.<cliqueId>: a UUID{case}, a dot and a decimal clique "
                         "id without leading zeros")
    cluster_uuid, clique = match.groups()
    if int(clique) > bounds.MAX_CLIQUE_ID:
        raise ValueError(f"clique id {clique} is beyond NVML's unsigned int ({bounds.MAX_CLIQUE_ID})")
    if cluster_uuid == _ZERO_UUID:
        raise ValueError("the cluster UUID is zero, which no multi-node NVLink domain has")
    return text


def describe(domain: Domain | None) -> str:
    """One line for people: the domain, why there is none, or that nothing was said."""
    if domain is None:
        return "NVLink domain not reported"
    if domain.name is not None:
        return f"NVLink domain {domain.name}"
    return f"no NVLink domain: {domain.problem}" if domain.problem else "no multi-node NVLink"


def _reading(reported: Domain) -> str:
    if reported.name is not None:
        return reported.name
    return f"no domain ({reported.problem})" if reported.problem else "no multi-node NVLink"


def _fit(reason: str) -> str:
    """A reason within the problem bound: long quotes of a label can push it over."""
    limit = bounds.MAX_DOMAIN_PROBLEM_LENGTH
    return reason if len(reason) <= limit else reason[:limit - 3] + "..."


def _shown(value: object) -> str:
    """An untrusted value quoted in a reason: printable ASCII, bounded."""
    text = ascii(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN - 3] + "..."
