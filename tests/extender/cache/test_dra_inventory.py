"""GPUs as DRA publishes and allocates them (extender/cache/dra_inventory.py), counted as kube-scheduler counts them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.dra import ClaimAsk, ClaimUnseen
from extender.cache.dra_inventory import DraInventory, NodeClass
from extender.demo.cluster import with_uuids
from extender.demo.dra_objects import allocated_claim, channel_slice, gpu_device, gpu_slice, mig_device
from topology.platforms import PLATFORMS

NODE = "a6000-0"
UUIDS = [gpu.uuid or "" for gpu in with_uuids(NODE, PLATFORMS["rtx-a6000-pairs"].topology()).gpus]


def _inventory() -> tuple[DraInventory, list[str]]:
    told: list[str] = []
    inventory = DraInventory(on_node=told.append)
    inventory.apply_slice("ADDED", gpu_slice(NODE, UUIDS, seed=5))
    return inventory, told


def test_nodes_are_classed_by_what_dra_publishes_for_them() -> None:
    inventory, _ = _inventory()
    inventory.apply_slice("ADDED", channel_slice("gb200-0"))
    assert inventory.node_class(NODE) is NodeClass.DRA_GPU
    assert inventory.node_class("gb200-0") is NodeClass.COMPUTE_DOMAIN_ONLY
    assert inventory.node_class("h100-0") is NodeClass.DEVICE_PLUGIN
    assert inventory.taken("gb200-0", UUIDS) is None and inventory.taken("h100-0", UUIDS) is None


def test_every_allocated_device_is_taken_whatever_reserved_for_says_and_freed_with_its_claim() -> None:
    inventory, told = _inventory()
    assert inventory.taken(NODE, UUIDS) == frozenset()
    told.clear()
    inventory.apply_claim("ADDED", allocated_claim("c1", NODE, ["gpu-0", "gpu-5"], pods=["p1"]))
    inventory.apply_claim("ADDED", allocated_claim("c2", NODE, ["gpu-7"]))  # allocated, reserved for nobody
    assert inventory.taken(NODE, UUIDS) == {UUIDS[0], UUIDS[5], UUIDS[7]}
    assert told == [NODE, NODE]
    assert inventory.pods_on(NODE) == {"p1"} and inventory.pods_on("other") == frozenset()
    inventory.apply_claim("DELETED", allocated_claim("c1", NODE, ["gpu-0", "gpu-5"], pods=["p1"]))
    assert inventory.taken(NODE, UUIDS) == {UUIDS[7]}


def test_admin_access_takes_nothing_and_another_drivers_devices_are_not_gpus() -> None:
    inventory, _ = _inventory()
    inventory.apply_claim("ADDED", allocated_claim("mon", NODE, ["gpu-1"], admin=True))
    inventory.apply_claim("ADDED", allocated_claim("nic", NODE, ["gpu-2"], driver="dra.net"))
    assert inventory.taken(NODE, UUIDS) == frozenset()


def test_a_mig_result_makes_its_gpu_unusable_whole_and_a_tainted_or_unpublished_gpu_is_taken() -> None:
    devices = [gpu_device(i, UUIDS[i]) for i in range(6)] + [mig_device(6, UUIDS[6], "MIG-" + UUIDS[6][4:])]
    devices[2]["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule"}]
    inventory = DraInventory()
    inventory.apply_slice("ADDED", gpu_slice(NODE, (), devices=devices))
    assert inventory.taken(NODE, UUIDS) == {UUIDS[2], UUIDS[6], UUIDS[7]}  # GPU 7 is in no device: DRA cannot give it
    inventory.apply_claim("ADDED", allocated_claim("m", NODE, ["gpu-6-mig-1g10gb-19-0"]))
    assert inventory.taken(NODE, UUIDS) == {UUIDS[2], UUIDS[6], UUIDS[7]}


def test_only_the_newest_complete_generation_of_a_pool_counts() -> None:
    inventory, _ = _inventory()
    # The driver republishes in two slices: until both are seen, the node has no GPU to give.
    inventory.apply_slice("ADDED", gpu_slice(NODE, (), generation=2, count=2, index=1,
                                             devices=[gpu_device(i, UUIDS[i]) for i in range(4)]))
    assert inventory.taken(NODE, UUIDS) == frozenset(UUIDS)
    inventory.apply_slice("ADDED", gpu_slice(NODE, (), generation=2, count=2, index=2,
                                             devices=[gpu_device(i, UUIDS[i]) for i in range(4, 8)]))
    assert inventory.taken(NODE, UUIDS) == frozenset()
    inventory.apply_slice("DELETED", gpu_slice(NODE, UUIDS, seed=5))  # the old generation goes: nothing changes
    assert inventory.taken(NODE, UUIDS) == frozenset()
    inventory.apply_slice("DELETED", gpu_slice(NODE, (), generation=2, count=2, index=2, devices=[]))
    assert inventory.taken(NODE, UUIDS) == frozenset(UUIDS)


def test_hostile_objects_are_refused_with_why_and_a_refused_claim_keeps_its_devices_taken() -> None:
    inventory, _ = _inventory()
    inventory.apply_claim("ADDED", allocated_claim("c1", NODE, ["gpu-3"], pods=["p1"]))
    broken = allocated_claim("c1", NODE, ["gpu-3"], pods=["p1"])
    broken["status"]["allocation"]["devices"]["results"] *= 40
    inventory.apply_claim("MODIFIED", broken)
    assert "results: expected a list of at most 32" in inventory.refused["ResourceClaim c1"]
    assert inventory.taken(NODE, UUIDS) == {UUIDS[3]}  # never handed to another pod on a bad update
    huge = gpu_slice("other", UUIDS)
    huge["spec"]["devices"] = huge["spec"]["devices"] * 125_000
    inventory.apply_slice("ADDED", huge)
    assert "at most 128 devices" in inventory.refused["ResourceSlice other-gpu.nvidia.com-0"]
    assert inventory.node_class("other") is NodeClass.DEVICE_PLUGIN


def test_a_claim_naming_a_device_no_slice_has_is_counted_and_takes_effect_when_the_slice_comes() -> None:
    inventory = DraInventory()
    inventory.apply_claim("ADDED", allocated_claim("early", NODE, ["gpu-4", "gpu-99"]))
    assert inventory.unknown_devices() == 2
    inventory.apply_slice("ADDED", gpu_slice(NODE, UUIDS))
    assert inventory.unknown_devices() == 1  # gpu-99 names nothing
    assert inventory.taken(NODE, UUIDS) == {UUIDS[4]}


def _pending(uid: str, requests: list[dict[str, object]]) -> dict[str, object]:
    claim = allocated_claim(uid, NODE, [])
    claim["spec"]["devices"]["requests"] = requests
    del claim["status"]
    return claim


def test_a_pods_claims_ask_the_gpus_of_their_first_alternatives_of_a_gpu_class() -> None:
    inventory = DraInventory()
    inventory.apply_claim("ADDED", _pending("a", [
        {"name": "pair", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 2}},
        {"name": "nic", "exactly": {"deviceClassName": "rdma.example.com", "count": 2}},
        {"name": "all", "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"}},
        {"name": "watch", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}]))
    inventory.apply_claim("ADDED", _pending("b", [{"name": "either", "firstAvailable": [
        {"name": "four", "deviceClassName": "gpu.nvidia.com", "count": 4},
        {"name": "two", "deviceClassName": "gpu.nvidia.com", "count": 2}]}]))
    assert inventory.requested_gpus("ml", ["claim-a"]).gpus == 2
    assert inventory.requested_gpus("ml", ["claim-a", "claim-b"]) == ClaimAsk(6)
    with pytest.raises(ClaimUnseen, match="ResourceClaim ml/claim-c is not seen yet"):
        inventory.requested_gpus("ml", ["claim-a", "claim-c"])
    with pytest.raises(ClaimUnseen):
        inventory.requested_gpus("other", ["claim-a"])
    inventory.apply_claim("DELETED", _pending("b", []))
    with pytest.raises(ClaimUnseen):
        inventory.requested_gpus("ml", ["claim-b"])


def test_the_order_is_the_allocators_slices_by_name_then_devices_as_listed_whole_gpus_only() -> None:
    inventory = DraInventory()
    second = [gpu_device(i, UUIDS[i]) for i in (6, 4)] + [mig_device(5, UUIDS[5], "MIG-" + UUIDS[5][4:])]
    inventory.apply_slice("ADDED", gpu_slice(NODE, (), seed=None, count=2, index=2, devices=second))
    inventory.apply_slice("ADDED", gpu_slice(NODE, (), seed=None, count=2, index=1,
                                             devices=[gpu_device(i, UUIDS[i]) for i in (3, 0)]))
    assert inventory.order(NODE) == (UUIDS[3], UUIDS[0], UUIDS[6], UUIDS[4])
    inventory.apply_slice("ADDED", gpu_slice(NODE, UUIDS[:2], seed=None, generation=2))  # one slice again
    assert inventory.order(NODE) == (UUIDS[0], UUIDS[1])  # the older generation's slices are not the pool's


def test_the_gpus_a_pods_claims_hold_on_a_node_are_its_own() -> None:
    inventory, _ = _inventory()
    inventory.apply_claim("ADDED", allocated_claim("c1", NODE, ["gpu-2", "gpu-6"], pods=["p1"]))
    inventory.apply_claim("ADDED", allocated_claim("c2", NODE, ["gpu-4"], pods=["p2"]))
    assert inventory.held_by("p1", NODE) == {UUIDS[2], UUIDS[6]}
    assert inventory.held_by("p1", "other") == frozenset() and inventory.held_by("p3", NODE) == frozenset()


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**64, 2**64) | st.text(max_size=70),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner,
                                                                                max_size=5), max_leaves=20)
_FIELDS = {"metadata": st.fixed_dictionaries({}, optional={"name": _JSON, "namespace": _JSON, "uid": _JSON,
                                                           "annotations": _JSON}),
           "spec": _JSON | st.fixed_dictionaries({}, optional={"driver": _JSON, "nodeName": _JSON, "pool": _JSON,
                                                               "devices": _JSON}),
           "status": _JSON | st.fixed_dictionaries({}, optional={"allocation": _JSON, "reservedFor": _JSON})}


@settings(max_examples=300, deadline=None, database=None)
@given(events=st.lists(st.tuples(st.sampled_from(["slice", "claim"]), st.sampled_from(["ADDED", "MODIFIED",
                                                                                        "DELETED"]),
                                  _JSON | st.fixed_dictionaries({}, optional=_FIELDS)), max_size=8))
def test_any_object_a_watch_may_deliver_is_kept_or_refused_with_why_never_raised(
        events: list[tuple[str, str, object]]) -> None:
    inventory, _ = _inventory()
    inventory.apply_claim("ADDED", allocated_claim("c1", NODE, ["gpu-1"], pods=["p1"]))
    for kind, event, obj in events:
        (inventory.apply_slice if kind == "slice" else inventory.apply_claim)(event, obj)
        taken = inventory.taken(NODE, UUIDS)
        assert taken is None or taken <= set(UUIDS)
        assert all(isinstance(why, str) and why for why in inventory.refused.values())
        # Every read stays safe after any event: one that raises fails the test.
        inventory.unknown_devices(), inventory.pods_on(NODE), inventory.order(NODE), inventory.held_by("p1", NODE)
    assert inventory.node_class(NODE) in set(NodeClass)
