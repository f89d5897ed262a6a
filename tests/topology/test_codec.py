"""The node annotation codec: round trips on every platform, and strict refusals."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import orjson
import pytest

from topology.annotations import AnnotationKeys
from topology.codec import CodecError, NodeState, decode_state, decode_topology, encode_state, encode_topology
from topology.compiled import compile_topology
from topology.fabric import Domain
from topology.model import Topology, installed_subset
from topology.platforms import PLATFORMS
from topology.sharing import Sharing


def _with_identities(topology: Topology) -> Topology:
    gpus = tuple(replace(g, uuid=f"GPU-{g.index:08x}-1c2d-3e4f-5a6b-7c8d9e0f1a2b",
                         pci_bus_id=f"00000000:{0x10 + g.index * 0x08:02X}:00.0") for g in topology.gpus)
    return replace(topology, gpus=gpus)


@pytest.mark.parametrize("name", sorted(PLATFORMS))
def test_round_trip(name: str) -> None:
    topology = _with_identities(PLATFORMS[name].topology())
    decoded = decode_topology(encode_topology(topology))
    assert decoded == topology
    assert decoded.fingerprint == topology.fingerprint


def test_sixteen_gpus_fit_in_8_kib() -> None:
    text = encode_topology(_with_identities(PLATFORMS["dgx2-v100"].topology()))
    assert len(text.encode()) <= 8 * 1024


def _document(name: str = "dgx1-v100") -> dict:
    return orjson.loads(encode_topology(PLATFORMS[name].topology()))


@pytest.mark.parametrize(("mutate", "message"), [
    (lambda d: d.update(v=3), "version 3 is not supported"),
    (lambda d: d.pop("nvswitch"), "missing nvswitch"),
    (lambda d: d.update(extra=1), "unknown field extra"),
    (lambda d: d["gpus"][0].update(numa="0"), r"topology.gpus\[0\].numa: expected an integer"),
    (lambda d: d["gpus"][1].update(nvl="nvlink9"), r"gpus\[1\].nvl: unknown NVLink kind"),
    (lambda d: d["nvlink"].append([0, 0, 2]), r"NVLink pair \(0, 0\)"),
    (lambda d: d["pcie"][0].__setitem__(4, "QPI"), r"pcie\[0\]\[4\]: unknown PCIe level 'QPI'"),
    (lambda d: d["pcie"].pop(), "rows for 8 GPUs"),
    (lambda d: d["nvlink"].pop(0), "neither NVLink nor a known PCIe path"),
    (lambda d: d["gpus"][0].update(numa=5), "does not match the content"),
    (lambda d: d.update(gpus=[]), "0 GPUs"),
])
def test_bad_topologies_are_refused_with_the_field(mutate, message: str) -> None:
    document = _document()
    mutate(document)
    with pytest.raises(CodecError, match=message):
        decode_topology(orjson.dumps(document))


@pytest.mark.parametrize("text", ["", "not json", "[]", "null", '{"v":1}', "x" * 20000])
def test_garbage_topologies_are_refused(text: str) -> None:
    with pytest.raises(CodecError):
        decode_topology(text)


# -- the node's NVLink domain (topology/fabric.py) --------------------------------------------------------

RACK_A = Domain("9c6f5af3-53bf-49b5-a436-b66766c413c3.4026")
RACK_B = Domain("0c6f5af3-53bf-49b5-a436-b66766c413c3.4026")
REGISTERING = Domain(None, "GPU 2 fabric registration in progress")


def _gb200(domain: Domain | None) -> Topology:
    return replace(_with_identities(PLATFORMS["gb200-node"].topology()), domain=domain)


@pytest.mark.parametrize("domain", [RACK_A, REGISTERING])
def test_a_node_with_fabric_info_writes_v2_with_its_domain(domain: Domain) -> None:
    text = encode_topology(_gb200(domain))
    document = orjson.loads(text)
    assert (document["v"], document["domain"], document["domain_problem"]) == (2, domain.name, domain.problem)
    decoded = decode_topology(text)
    assert decoded.domain == domain
    assert decoded == _gb200(None) and decoded.fingerprint == _gb200(None).fingerprint


@pytest.mark.parametrize("domain", [None, Domain(None, None)])
def test_a_node_without_fabric_info_writes_v1_as_before(domain: Domain | None) -> None:
    """What v1 readers (extenders before domains) read: nothing about a domain, so they keep reading the node."""
    text = encode_topology(_gb200(domain))
    assert text == encode_topology(_with_identities(PLATFORMS["gb200-node"].topology()))
    document = orjson.loads(text)
    assert document["v"] == 1 and "domain" not in document and "domain_problem" not in document
    assert decode_topology(text).domain is None  # says nothing: the label alone decides


def test_an_annotation_from_before_domains_decodes_as_before() -> None:
    old = ('{"v":1,"fp":"bd51ebce3afd8081","nvswitch":false,"gpus":[{"i":0,"uuid":"GPU-a","bus":"0000:07:00.0",'
           '"numa":0,"model":"NVIDIA L40S","mem":46068,"nvl":null,"pcie":[4,16]},{"i":1,"uuid":"GPU-b",'
           '"bus":"0000:0f:00.0","numa":0,"model":"NVIDIA L40S","mem":46068,"nvl":null,"pcie":[4,16]}],"nvlink":[],'
           '"pcie":[["NODE"]]}')
    topology = decode_topology(old)
    assert [gpu.uuid for gpu in topology.gpus] == ["GPU-a", "GPU-b"] and topology.domain is None
    assert encode_topology(topology) == old


def test_the_domain_is_not_part_of_the_board() -> None:
    """Identical boards in two racks, or before and after registration, share a fingerprint and a compiled board."""
    boards = [_gb200(domain) for domain in (None, Domain(None, None), RACK_A, RACK_B, REGISTERING)]
    assert len({board.fingerprint for board in boards}) == 1
    assert len({orjson.loads(encode_topology(board))["fp"] for board in boards}) == 1
    assert all(board == boards[0] for board in boards) and len(set(boards)) == 1
    assert len({id(compile_topology(board)) for board in boards}) == 1
    assert installed_subset(boards[2], (0, 1)).domain == RACK_A


V2 = {"domain": RACK_A.name, "domain_problem": None}


@pytest.mark.parametrize(("fields", "message"), [
    ({"domain": RACK_A.name}, "missing domain_problem"),
    ({"domain_problem": "x"}, "missing domain"),
    ({"domain": None, "domain_problem": None}, "carries a domain or a domain_problem; both are null"),
    ({**V2, "domain_problem": "GPU 2 fabric registration in progress"}, "a domain or a problem, not both"),
    ({**V2, "domain": RACK_A.name.upper()}, r"topology.domain: .*lowercase"),
    ({**V2, "domain": "00000000-0000-0000-0000-000000000000.0"}, "topology.domain: the cluster UUID is zero"),
    ({**V2, "domain": "9c6f5af3-53bf-49b5-a436-b66766c413c3.4294967296"}, "topology.domain: clique id .* beyond"),
    ({**V2, "domain": "4026"}, r"topology.domain: '4026' is not <clusterUUID>.<cliqueId>"),
    ({**V2, "domain": RACK_A.name + "0" * 40}, "topology.domain: 81 characters"),
    ({**V2, "domain": 4026}, "topology.domain: expected <clusterUUID>.<cliqueId> text, found int"),
    ({**V2, "domain": [RACK_A.name]}, "topology.domain: .* found list"),
    ({"domain": None, "domain_problem": 7}, "topology.domain_problem: expected 1 to 256 printable ASCII"),
    ({"domain": None, "domain_problem": ""}, "topology.domain_problem: expected 1 to 256"),
    ({"domain": None, "domain_problem": "x" * 257}, "topology.domain_problem: expected 1 to 256"),
    ({"domain": None, "domain_problem": "GPU 2\nregistering"}, "topology.domain_problem"),
    ({**V2, "extra": 1}, "unknown field extra"),
])
def test_a_malformed_domain_is_refused_with_the_field(fields: dict, message: str) -> None:
    document = orjson.loads(encode_topology(_gb200(None)))
    document.update(v=2, **fields)
    with pytest.raises(CodecError, match=message):
        decode_topology(orjson.dumps(document))


def test_domain_fields_need_version_2() -> None:
    document = orjson.loads(encode_topology(_gb200(RACK_A)))
    document["v"] = 1
    with pytest.raises(CodecError, match="unknown field domain, domain_problem"):
        decode_topology(orjson.dumps(document))


def test_state_round_trip_and_refusals() -> None:
    state = NodeState(frozenset({"GPU-a", "GPU-b"}), frozenset({"GPU-c"}),
                      datetime(2026, 11, 21, 19, 0, tzinfo=timezone.utc), 7, {"ml/train-0": frozenset({"GPU-b"})})
    text = encode_state(state)
    assert orjson.loads(text) == {"v": 2, "used": ["GPU-a", "GPU-b"], "unhealthy": ["GPU-c"],
                                  "pods": {"ml/train-0": ["GPU-b"]}, "observed": "2026-11-21T19:00:00Z",
                                  "generation": 7}
    assert decode_state(text) == state
    v1 = '{"v":1,"used":["GPU-a"],"unhealthy":[],"observed":"2026-11-21T19:00:00Z","generation":1}'
    assert decode_state(v1).pods == {} and decode_state(v1).used == {"GPU-a"}
    for bad, message in [
        ('{"v":1,"used":[],"unhealthy":[],"observed":"yesterday","generation":1}', "not an RFC 3339 time"),
        ('{"v":1,"used":[],"unhealthy":[],"observed":"2026-11-21T19:00:00","generation":1}', "no time zone"),
        ('{"v":1,"used":[1],"unhealthy":[],"observed":"2026-11-21T19:00:00Z","generation":1}', "is not a GPU id"),
        ('{"v":1,"used":[],"unhealthy":[],"observed":"2026-11-21T19:00:00Z","generation":-1}', "expected 0 to"),
        ('{"v":1,"used":[],"unhealthy":[],"observed":"2026-11-21T19:00:00Z"}', "missing generation"),
        ('{"v":1,"used":[],"unhealthy":[],"pods":{},"observed":"2026-11-21T19:00:00Z","generation":1}',
         "unknown field pods"),
        ('{"v":2,"used":[],"unhealthy":[],"observed":"2026-11-21T19:00:00Z","generation":1}', "missing pods"),
        ('{"v":2,"used":["GPU-a"],"unhealthy":[],"pods":{"a/b":["GPU-z"]},"observed":"2026-11-21T19:00:00Z",'
         '"generation":1}', "that state.used does not"),
        ('{"v":2,"used":["GPU-a"],"unhealthy":[],"pods":{"nobody":["GPU-a"]},"observed":"2026-11-21T19:00:00Z",'
         '"generation":1}', "not a namespace/name"),
        ('{"v":true,"used":[],"unhealthy":[],"observed":"2026-11-21T19:00:00Z","generation":1}', "not supported"),
        ('{"v":4,"used":[],"unhealthy":[],"observed":"2026-11-21T19:00:00Z","generation":1}', "not supported"),
        ('{"v":3,"used":[],"unhealthy":[],"pods":{},"observed":"2026-11-21T19:00:00Z","generation":1}',
         "missing sharing"),
        ('{"v":3,"used":[],"unhealthy":[],"pods":{},"observed":"2026-11-21T19:00:00Z","generation":1,'
         '"sharing":"none"}', "expected 'replicas' or 'mig'"),
    ]:
        with pytest.raises(CodecError, match=message):
            decode_state(bad)


def test_a_sharing_node_writes_v3_and_a_whole_gpu_node_stays_v2() -> None:
    observed = datetime(2026, 11, 21, 19, 0, tzinfo=timezone.utc)
    shared = NodeState(frozenset({"GPU-a"}), frozenset(), observed, 3, {"ml/a": frozenset({"GPU-a"})},
                       Sharing.REPLICAS)
    text = encode_state(shared)
    assert orjson.loads(text)["v"] == 3 and orjson.loads(text)["sharing"] == "replicas"
    assert decode_state(text) == shared
    assert orjson.loads(encode_state(replace(shared, sharing=Sharing.NONE)))["v"] == 2


def test_annotation_keys_follow_the_prefix() -> None:
    keys = AnnotationKeys()
    assert keys.topology == "gpu-topology.io/topology" and keys.min_bandwidth == "gpu-topology.io/min-bandwidth"
    assert AnnotationKeys("gpu.example.com").gpus == "gpu.example.com/gpus"
    with pytest.raises(ValueError, match="DNS subdomain"):
        AnnotationKeys("Bad Prefix/")
