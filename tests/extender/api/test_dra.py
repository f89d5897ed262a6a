"""DRA objects as the extender reads them (extender/api/dra.py): NVIDIA's shape accepted, the rest refused with why."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.dra import ClaimUnseen, DraError, parse_claim, parse_slice, pod_claims
from extender.api.pod_request import parse_pod
from extender.cache.dra_inventory import DraInventory
from extender.demo.cluster import with_uuids
from extender.demo.dra_objects import allocated_claim, gpu_device, gpu_slice, mig_device
from topology.annotations import AnnotationKeys
from topology.platforms import PLATFORMS

UUIDS = [gpu.uuid or "" for gpu in with_uuids("a6000-0", PLATFORMS["rtx-a6000-pairs"].topology()).gpus]


def test_nvidias_slice_reads_as_its_gpus_by_uuid_in_the_order_it_lists_them() -> None:
    raw = gpu_slice("a6000-0", UUIDS, seed=3)
    parsed = parse_slice(raw)
    assert (parsed.driver, parsed.pool, parsed.node, parsed.generation, parsed.slice_count) == (
        "gpu.nvidia.com", "a6000-0", "a6000-0", 1, 1)
    assert [device.name for device in parsed.devices] == [device["name"] for device in raw["spec"]["devices"]]
    assert [device.name for device in parsed.devices] != [f"gpu-{i}" for i in range(8)]  # shuffled, as published
    assert {device.uuid for device in parsed.devices} == set(UUIDS)
    assert {device.kind for device in parsed.devices} == {"gpu"} and not any(d.tainted for d in parsed.devices)


def test_a_mig_device_names_its_parent_and_a_taint_that_keeps_pods_off_marks_it() -> None:
    devices = [gpu_device(0, UUIDS[0]), mig_device(1, UUIDS[1], "MIG-" + UUIDS[1][4:]),
               {**gpu_device(2, UUIDS[2]), "taints": [{"key": "gpu.nvidia.com/xid", "effect": "NoExecute"}]},
               {**gpu_device(3, UUIDS[3]), "taints": [{"key": "note", "effect": "None"}]}]
    parsed = parse_slice(gpu_slice("a6000-0", (), seed=None, devices=devices))
    assert [(d.kind, d.parent_uuid, d.tainted) for d in parsed.devices] == [
        ("gpu", None, False), ("mig", UUIDS[1], False), ("gpu", None, True), ("gpu", None, False)]


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(gpu_slice("a6000-0", UUIDS))
    target = raw
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return raw


@pytest.mark.parametrize(("path", "value", "reason"), [
    (("spec", "devices"), [gpu_device(0, UUIDS[0])] * 10**6, "spec.devices: expected a list of at most 128"),
    (("spec", "devices"), [gpu_device(0, UUIDS[0])] * 2, "a device name appears twice"),
    (("spec", "driver"), "GPU.NVIDIA.COM", "spec.driver: 'GPU.NVIDIA.COM' is not a DNS name"),
    (("spec", "driver"), "g" * 64, "spec.driver: expected 1 to 63 characters"),
    (("spec", "pool", "generation"), -1, "spec.pool.generation: expected a whole number from 0"),
    (("spec", "pool", "generation"), "1", "spec.pool.generation: expected a whole number"),
    (("spec", "pool", "resourceSliceCount"), 10**9, "resourceSliceCount: expected a whole number from 1 to 1024"),
    (("spec", "pool"), None, "spec.pool: expected an object"),
    (("spec", "devices", 0, "name"), "GPU_0", "'GPU_0' is not a DNS name"),
    (("spec", "devices", 0, "attributes", "uuid"), {"string": "GPU 0"}, "attribute uuid 'GPU 0' is no GPU UUID"),
    (("spec", "devices", 0, "attributes", "uuid"), {"int": 7}, "attribute uuid: expected a string"),
    (("spec", "devices", 0, "attributes"), {f"a{i}": {"int": i} for i in range(40)}, "at most 32 in all"),
    (("spec", "devices", 0, "taints"), [{"effect": "NoSchedule"}] * 17, "taints: expected a list of at most 16"),
    (("metadata",), "x", "metadata and spec must be objects"),
])
def test_a_slice_outside_what_kube_apiserver_admits_is_refused_with_the_field_to_blame(
        path: tuple[Any, ...], value: Any, reason: str) -> None:
    with pytest.raises(DraError) as raised:
        parse_slice(_with(path, value))
    assert reason in str(raised.value)


def test_a_claim_reads_as_its_allocated_devices_and_the_pods_it_is_reserved_for() -> None:
    claim = parse_claim(allocated_claim("c1", "a6000-0", ["gpu-5", "gpu-0"], pods=["p1"], extended=True))
    assert [(r.driver, r.pool, r.device, r.admin_access) for r in claim.results] == [
        ("gpu.nvidia.com", "a6000-0", "gpu-5", False), ("gpu.nvidia.com", "a6000-0", "gpu-0", False)]
    assert (claim.uid, claim.key, claim.reserved_for, claim.extended) == ("c1", "ml/claim-c1", ("p1",), True)
    pending = allocated_claim("c2", "a6000-0", [])
    del pending["status"]
    assert parse_claim(pending).results == ()


@pytest.mark.parametrize(("mutate", "reason"), [
    (lambda c: c["status"]["allocation"]["devices"].update(results=[c["status"]["allocation"]["devices"]["results"][0]]
                                                            * 33), "results: expected a list of at most 32"),
    (lambda c: c["status"].update(reservedFor=[{"uid": "p"}] * 257), "reservedFor: expected a list of at most 256"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(device="../gpu-0"), "is not a DNS name"),
    (lambda c: c["status"]["allocation"]["devices"]["results"][0].update(pool=""), "pool: expected 1 to 253"),
    (lambda c: c["status"].update(allocation="all"), "results: expected a list"),
    (lambda c: c["status"]["reservedFor"].append({"name": "no-uid"}), "reservedFor[1].uid: expected 1 to 128"),
])
def test_a_claim_outside_what_kube_apiserver_admits_is_refused(mutate: Any, reason: str) -> None:
    raw = allocated_claim("c1", "a6000-0", ["gpu-1"], pods=["p1"])
    mutate(raw)
    with pytest.raises(DraError) as raised:
        parse_claim(raw)
    assert reason in str(raised.value)


def _claim_with(requests: list[dict[str, Any]]) -> dict[str, Any]:
    raw = allocated_claim("c1", "a6000-0", [])
    raw["spec"]["devices"]["requests"] = requests
    return raw


def test_a_claims_requests_read_as_each_alternatives_class_and_count() -> None:
    claim = parse_claim(_claim_with([
        {"name": "pair", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
        {"name": "one", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
        {"name": "every", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
        {"name": "watch", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}},
        {"name": "either", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 4},
                                              {"name": "small", "deviceClassName": "mig.nvidia.com"}]}]))
    assert [(r.name, r.alternatives, r.admin_access) for r in claim.requests] == [
        ("pair", (("gpu.nvidia.com", 2),), False), ("one", (("gpu.nvidia.com", 1),), False),
        ("every", (("gpu.nvidia.com", 0),), False), ("watch", (("gpu.nvidia.com", 1),), True),
        ("either", (("gpu.nvidia.com", 4), ("mig.nvidia.com", 1)), False)]


@pytest.mark.parametrize(("request_", "reason"), [
    ({"name": "r"}, "exactly one of exactly and firstAvailable"),
    ({"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com"}, "firstAvailable": []}, "exactly one of"),
    ({"name": "r", "firstAvailable": [{"deviceClassName": "c"}] * 9}, "firstAvailable: expected 1 to 8"),
    ({"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "Some"}}, "allocationMode"),
    ({"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}, "count: expected a whole number"),
    ({"name": "r", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2**63}}, "count: expected a whole"),
    ({"name": "r", "exactly": {"deviceClassName": 7}}, "deviceClassName: expected 1 to 253 characters"),
])
def test_a_request_outside_what_kube_apiserver_admits_is_refused(request_: dict[str, Any], reason: str) -> None:
    with pytest.raises(DraError) as raised:
        parse_claim(_claim_with([request_]))
    assert reason in str(raised.value)


def test_a_pods_claims_are_the_ones_it_names_and_those_made_from_its_templates() -> None:
    spec = {"resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
                               {"name": "shared", "resourceClaimName": "team-claim"},
                               {"name": "none", "resourceClaimTemplateName": "maybe"}]}
    status = {"resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "train-0-gpus-x7k2p"},
                                        {"name": "none"}]}
    assert pod_claims(spec, status) == ("train-0-gpus-x7k2p", "team-claim")
    with pytest.raises(ClaimUnseen, match="not made from its template yet"):
        pod_claims(spec, {})
    with pytest.raises(ValueError, match="at most 128"):
        pod_claims({"resourceClaims": [{"name": "x", "resourceClaimName": "y"}] * 129}, {})


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.text(max_size=70),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner,
                                                                                max_size=5), max_leaves=20)


@settings(max_examples=300, deadline=None, database=None)
@given(claims=_JSON | st.lists(st.fixed_dictionaries({}, optional={
           "name": _JSON, "resourceClaimName": _JSON, "resourceClaimTemplateName": _JSON}), max_size=4),
       status=_JSON | st.fixed_dictionaries({}, optional={"resourceClaimStatuses": _JSON | st.lists(
           st.fixed_dictionaries({}, optional={"name": _JSON, "resourceClaimName": _JSON}), max_size=4)}))
def test_any_pod_claims_read_as_names_or_a_reason_never_a_crash(claims: object, status: object) -> None:
    pod = {"metadata": {"name": "p", "namespace": "ml", "uid": "u"},
           "spec": {"containers": [{"name": "c"}], "resourceClaims": claims}, "status": status}
    parsed = parse_pod(pod, AnnotationKeys(), claims=DraInventory())
    assert parsed.problem is None or isinstance(parsed.problem, str)
    assert parsed.problem is not None or parsed.gpus == 0


@pytest.mark.parametrize(("expression", "pinned"), [
    ("device.attributes['gpu.nvidia.com'].uuid in ['GPU-a1', 'GPU-b2']", {"GPU-a1", "GPU-b2"}),
    ("device.attributes['gpu.nvidia.com'].uuid in ['GPU-a1']", {"GPU-a1"}),
    ("device.attributes['gpu.nvidia.com'].uuid in ['GPU a1']", set()),  # not a GPU id
    ("device.attributes['gpu.nvidia.com'].productName == 'x'", set()),
    ("device.attributes['gpu.nvidia.com'].uuid in ['GPU-a1'] || true", set()),  # more than a pin
    ("device.attributes['gpu.nvidia.com'].uuid in [" + "'GPU-a' " * 1200, set()),  # hostile: no closing bracket
    ("device.attributes['gpu.nvidia.com'].uuid in [" + "'GPU-a', " * 1000 + "]", set()),  # a trailing comma
])
def test_a_uuid_pin_is_read_from_its_selector_and_nothing_else_is(expression: str, pinned: set[str]) -> None:
    selectors = [{"cel": {"expression": expression}}]
    claim = parse_claim(_claim_with([{"name": "gpus", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1,
                                                                  "selectors": selectors}}]))
    assert claim.requests[0].pinned == pinned and claim.requests[0].selected
