"""The node annotation codec: round trips on every platform, and strict refusals."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import orjson
import pytest

from topology.annotations import AnnotationKeys
from topology.codec import CodecError, NodeState, decode_state, decode_topology, encode_state, encode_topology
from topology.model import Topology
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
    (lambda d: d.update(v=2), "version 2 is not supported"),
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
