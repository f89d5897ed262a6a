"""The node annotation codec (DESIGN §6): versioned, compact, strict.

Annotations are written by one program and read by another, possibly of a different version, and anyone
with node-patch rights can edit them. So decoding checks every field and the fingerprint, and any fault is
a `CodecError` that says which field is wrong; it never yields a half-read topology.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import orjson

from topology import bounds
from topology.bounds import MAX_GPUS, STATE_MAX_BYTES, TOPOLOGY_MAX_BYTES
from topology.catalog import NvLinkGen
from topology.fabric import Domain, parse_domain
from topology.levels import PCIE_CODES, Level
from topology.model import Gpu, NvLinkPair, Topology, TopologyError
from topology.sharing import Sharing

VERSION = 1  # of the topology annotation
DOMAIN_VERSION = 2  # v2 adds `domain` and `domain_problem`, written only by nodes whose GPUs report NVLink fabric
# info, so v1 readers keep reading every other node through a rolling upgrade
STATE_VERSION = 2  # v2 adds `pods`; v1 (without it) is still read
SHARED_STATE_VERSION = 3  # v3 adds `sharing`, written only by nodes that share their GPUs, so v2 readers keep
# reading every whole-GPU node through a rolling upgrade

_TOPOLOGY_KEYS = {1: frozenset({"v", "fp", "nvswitch", "gpus", "nvlink", "pcie"}),
                  2: frozenset({"v", "fp", "nvswitch", "gpus", "nvlink", "pcie", "domain", "domain_problem"})}
_GPU_KEYS = frozenset({"i", "uuid", "bus", "numa", "model", "mem", "nvl", "pcie"})
_STATE_KEYS = {1: frozenset({"v", "used", "unhealthy", "observed", "generation"}),
               2: frozenset({"v", "used", "unhealthy", "pods", "observed", "generation"}),
               3: frozenset({"v", "used", "unhealthy", "pods", "observed", "generation", "sharing"})}


class CodecError(ValueError):
    """An annotation that cannot be trusted, with the reason."""


class StateAheadError(CodecError):
    """A state observed later than the reader's clock allows: it would never go stale."""


@dataclass(frozen=True, slots=True)
class NodeState:
    """What the kubelet had allocated when the agent looked: `used` GPUs, and by whom (`pods`, keyed
    `namespace/name` as pod-resources names them), and which GPUs must not be given out."""

    used: frozenset[str]
    unhealthy: frozenset[str]
    observed: datetime
    generation: int
    pods: Mapping[str, frozenset[str]] = field(default_factory=dict)
    sharing: Sharing = Sharing.NONE  # what the agent saw of the kubelet's device ids (topology/sharing.py)

    def __post_init__(self) -> None:
        if self.observed.tzinfo is None:
            raise CodecError("state: observed must carry a time zone")


def encode_topology(topology: Topology) -> str:
    gpus = [{"i": g.index, "uuid": g.uuid, "bus": g.pci_bus_id, "numa": g.numa_node, "model": g.model,
             "mem": g.memory_mib, "nvl": g.nvlink.value if g.nvlink else None,
             "pcie": [g.pcie_gen, g.pcie_width] if g.pcie_gen is not None else None} for g in topology.gpus]
    n = topology.size
    document = {
        "v": VERSION,
        "fp": topology.fingerprint,
        "nvswitch": topology.nvswitch,
        "gpus": gpus,
        "nvlink": [[p.a, p.b, p.links] for p in topology.nvlinks],
        "pcie": [[_pcie_code(topology.pcie[i][j]) for j in range(i + 1, n)] for i in range(n - 1)],
    }
    domain = topology.domain
    # Without fabric info (or without NVML) a node writes v1, which says nothing of a domain; the extender then goes
    # by GFD's label alone, as for an agent from before domains.
    if domain is not None and (domain.name or domain.problem):
        document.update(v=DOMAIN_VERSION, domain=domain.name, domain_problem=domain.problem)
    text = orjson.dumps(document).decode()
    if len(text) > TOPOLOGY_MAX_BYTES:
        raise CodecError(f"topology annotation would be {len(text)} bytes, over its {TOPOLOGY_MAX_BYTES}-byte budget")
    return text


def decode_topology(text: str | bytes) -> Topology:
    document = _load(text, TOPOLOGY_MAX_BYTES, "topology")
    version = _version(document, "topology", tuple(_TOPOLOGY_KEYS))
    _exact_keys(document, _TOPOLOGY_KEYS[version], "topology")
    raw_gpus = _list(document["gpus"], "topology.gpus")
    if not 1 <= len(raw_gpus) <= MAX_GPUS:
        raise CodecError(f"topology.gpus: {len(raw_gpus)} GPUs; expected 1 to {MAX_GPUS}")
    gpus = tuple(_gpu(raw, f"topology.gpus[{at}]") for at, raw in enumerate(raw_gpus))
    pairs = []
    for at, raw in enumerate(_list(document["nvlink"], "topology.nvlink")):
        where = f"topology.nvlink[{at}]"
        triple = _list(raw, where)
        if len(triple) != 3:
            raise CodecError(f"{where}: expected [a, b, links]")
        pairs.append(NvLinkPair(*(_int(value, where) for value in triple)))
    n = len(gpus)
    rows = _list(document["pcie"], "topology.pcie")
    if len(rows) != n - 1:
        raise CodecError(f"topology.pcie: {len(rows)} rows for {n} GPUs; expected {n - 1}")
    pcie: list[list[Level | None]] = [[None] * n for _ in range(n)]
    for i, raw in enumerate(rows):
        row = _list(raw, f"topology.pcie[{i}]")
        if len(row) != n - 1 - i:
            raise CodecError(f"topology.pcie[{i}]: {len(row)} entries; expected {n - 1 - i}")
        for offset, code in enumerate(row):
            pcie[i][i + 1 + offset] = pcie[i + 1 + offset][i] = _pcie_level(code, f"topology.pcie[{i}][{offset}]")
    nvswitch = document["nvswitch"]
    if not isinstance(nvswitch, bool):
        raise CodecError("topology.nvswitch: expected true or false")
    domain = _domain(document["domain"], document["domain_problem"]) if version >= 2 else None
    try:
        topology = Topology(gpus=gpus, nvlinks=tuple(pairs), nvswitch=nvswitch,
                            pcie=tuple(tuple(row) for row in pcie), domain=domain)
    except TopologyError as error:
        raise CodecError(f"topology: {error}") from None
    if document["fp"] != topology.fingerprint:
        raise CodecError(f"topology.fp: {document['fp']!r} does not match the content ({topology.fingerprint}); "
                         "the annotation was edited or corrupted")
    return topology


def encode_state(state: NodeState) -> str:
    at = state.observed.astimezone(timezone.utc)
    # Milliseconds when there are any: the extender orders reports against its own binds by this time.
    observed = at.strftime("%Y-%m-%dT%H:%M:%S") + (f".{at.microsecond // 1000:03d}Z" if at.microsecond else "Z")
    pods = {key: sorted(gpus) for key, gpus in sorted(state.pods.items())}
    document: dict[str, object] = {"v": STATE_VERSION, "used": sorted(state.used),
                                   "unhealthy": sorted(state.unhealthy), "pods": pods, "observed": observed,
                                   "generation": state.generation}
    if state.sharing.shared:
        document.update(v=SHARED_STATE_VERSION, sharing=state.sharing.value)
    return orjson.dumps(document).decode()


def decode_state(text: str | bytes) -> NodeState:
    document = _load(text, STATE_MAX_BYTES, "state")
    version = _version(document, "state", tuple(_STATE_KEYS))
    _exact_keys(document, _STATE_KEYS[version], "state")
    used = _uuids(document["used"], "state.used")
    unhealthy = _uuids(document["unhealthy"], "state.unhealthy")
    pods = _pods(document["pods"], used) if version >= 2 else {}
    observed_text = document["observed"]
    if not isinstance(observed_text, str):
        raise CodecError("state.observed: expected an RFC 3339 time")
    try:
        observed = datetime.fromisoformat(observed_text)
    except ValueError:
        raise CodecError(f"state.observed: {observed_text!r} is not an RFC 3339 time") from None
    if observed.tzinfo is None:
        raise CodecError(f"state.observed: {observed_text!r} has no time zone")
    generation = _int(document["generation"], "state.generation")
    if not 0 <= generation <= bounds.MAX_GENERATION:
        raise CodecError(f"state.generation: expected 0 to {bounds.MAX_GENERATION}")
    sharing = Sharing.NONE
    if version >= 3:
        observed_sharing = document["sharing"]
        if observed_sharing not in (Sharing.REPLICAS.value, Sharing.MIG.value):
            raise CodecError(f"state.sharing: expected {Sharing.REPLICAS.value!r} or {Sharing.MIG.value!r}, "
                             f"got {str(observed_sharing)[:40]!r}")
        sharing = Sharing(observed_sharing)
    return NodeState(used, unhealthy, observed, generation, pods, sharing)


def check_state(state: NodeState, gpu_ids: Collection[str], now: float) -> None:
    """The state against the node it describes and the reader's clock: it may name only the topology's GPUs,
    and may not be observed further ahead than clocks drift, or the node would never go stale."""
    unknown = (state.used | state.unhealthy) - frozenset(gpu_ids)
    if unknown:
        raise CodecError(f"state: names GPU {min(unknown)!r}, which the node's topology does not have")
    ahead = state.observed.timestamp() - now
    if ahead > bounds.MAX_OBSERVED_AHEAD_SECONDS:
        raise StateAheadError(f"state.observed: {ahead:.0f} s ahead of this clock; at most "
                              f"{bounds.MAX_OBSERVED_AHEAD_SECONDS:.0f} s is allowed")


def _pods(value: Any, used: frozenset[str]) -> dict[str, frozenset[str]]:
    if not isinstance(value, dict):
        raise CodecError("state.pods: expected an object from namespace/name to GPU ids")
    if len(value) > bounds.MAX_STATE_PODS:
        raise CodecError(f"state.pods: {len(value)} pods is more than any node's GPUs can hold")
    pods = {}
    for key, gpus in value.items():
        namespace, slash, name = key.partition("/")
        if not slash or not namespace or not name or len(key) > bounds.MAX_POD_KEY_LENGTH:
            raise CodecError(f"state.pods: {key[:80]!r} is not a namespace/name")
        held = _uuids(gpus, f"state.pods[{key}]")
        if not held <= used:
            raise CodecError(f"state.pods[{key}]: lists GPUs that state.used does not")
        pods[key] = held
    return pods


def _load(text: str | bytes, limit: int, what: str) -> Mapping[str, Any]:
    if len(text) > limit:
        raise CodecError(f"{what}: {len(text)} bytes, over the {limit}-byte limit")
    try:
        document = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        raise CodecError(f"{what}: not JSON ({error})") from None
    if not isinstance(document, dict):
        raise CodecError(f"{what}: expected a JSON object")
    return document


def _exact_keys(document: Mapping[str, Any], expected: frozenset[str], where: str) -> None:
    missing = sorted(expected - document.keys())
    unknown = sorted(document.keys() - expected)
    if missing:
        raise CodecError(f"{where}: missing {', '.join(missing)}")
    if unknown:
        raise CodecError(f"{where}: unknown field {', '.join(unknown)}")


def _version(document: Mapping[str, Any], where: str, supported: tuple[int, ...]) -> int:
    version = document.get("v")
    # `type is int`: JSON true and 1.0 compare equal to 1 in Python.
    if type(version) is not int or version not in supported:
        raise CodecError(f"{where}: version {version!r} is not supported (this build reads "
                         f"{' and '.join(map(str, supported))})")
    return version


def _gpu(raw: Any, where: str) -> Gpu:
    if not isinstance(raw, dict):
        raise CodecError(f"{where}: expected an object")
    _exact_keys(raw, _GPU_KEYS, where)
    nvl = raw["nvl"]
    try:
        nvlink = None if nvl is None else NvLinkGen(nvl)
    except ValueError:
        raise CodecError(f"{where}.nvl: unknown NVLink kind {nvl!r}") from None
    pcie = raw["pcie"]
    if pcie is None:
        pcie_gen = pcie_width = None
    else:
        pair = _list(pcie, f"{where}.pcie")
        if len(pair) != 2:
            raise CodecError(f"{where}.pcie: expected [generation, width]")
        pcie_gen, pcie_width = (_int(value, f"{where}.pcie") for value in pair)
    return Gpu(index=_int(raw["i"], f"{where}.i"), model=_text(raw["model"], f"{where}.model"),
               uuid=_optional_text(raw["uuid"], f"{where}.uuid"), pci_bus_id=_optional_text(raw["bus"], f"{where}.bus"),
               numa_node=_optional_int(raw["numa"], f"{where}.numa"),
               memory_mib=_optional_int(raw["mem"], f"{where}.mem"),
               nvlink=nvlink, pcie_gen=pcie_gen, pcie_width=pcie_width)


def _domain(name: Any, problem: Any) -> Domain:
    """The node's NVLink domain reading; v2 carries one of the two, never neither."""
    if name is None and problem is None:
        raise CodecError("topology: version 2 carries a domain or a domain_problem; both are null")
    if name is not None:
        try:
            parse_domain(name)
        except ValueError as error:
            raise CodecError(f"topology.domain: {error}") from None
    try:
        return Domain(name, problem)
    except ValueError as error:
        raise CodecError(f"topology.domain_problem: {error}") from None


def _pcie_code(level: Level | None) -> str | None:
    return None if level is None else level.name


def _pcie_level(code: Any, where: str) -> Level | None:
    if code is None:
        return None
    if not isinstance(code, str) or code not in PCIE_CODES:
        raise CodecError(f"{where}: unknown PCIe level {code!r}")
    return PCIE_CODES[code]


def _list(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise CodecError(f"{where}: expected a list")
    return value


def _int(value: Any, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise CodecError(f"{where}: expected an integer, found {value!r}")
    return value


def _optional_int(value: Any, where: str) -> int | None:
    return None if value is None else _int(value, where)


def _text(value: Any, where: str) -> str:
    """A string; what it may hold is the model's to check (topology/bounds.py)."""
    if not isinstance(value, str):
        raise CodecError(f"{where}: expected a string")
    return value


def _optional_text(value: Any, where: str) -> str | None:
    return None if value is None else _text(value, where)


def _uuids(value: Any, where: str) -> frozenset[str]:
    items = _list(value, where)
    if len(items) > MAX_GPUS:
        raise CodecError(f"{where}: {len(items)} entries is more than any node has GPUs ({MAX_GPUS})")
    for item in items:
        if not isinstance(item, str) or not bounds.valid_id(item):
            raise CodecError(f"{where}: {str(item)[:80]!r} is not a GPU id (1 to {bounds.MAX_ID_LENGTH} printable "
                             "characters without spaces or commas)")
    ids = frozenset(items)
    if len(ids) != len(items):
        raise CodecError(f"{where}: lists a GPU twice")
    return ids
