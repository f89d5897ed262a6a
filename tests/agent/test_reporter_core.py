"""The reporter's pure core: device ids -> GPU ids, the observation, the plan (change, heartbeat,
generation, unknown state, size budget) and the backoff. No gRPC, Kubernetes or NVML here."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from topology.agent.annotation_patch import NodeAnnotations, plan
from topology.agent.devices import MIG, ContainerDevices, GpuIds, KubeletDevices, Observation, Unknown, observe
from topology.annotations import AnnotationKeys
from topology.backoff import Backoff
from topology.codec import STATE_MAX_BYTES, NodeState, decode_state, encode_state, encode_topology
from topology.platforms import PLATFORMS
from topology.sharing import Sharing

KEYS = AnnotationKeys()
T0 = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
TOPOLOGY = PLATFORMS["dgx1-v100"].topology()  # a topo -m capture: no UUIDs
TEXT = encode_topology(TOPOLOGY)


def with_uuids():
    from dataclasses import replace

    from topology.model import Topology
    return Topology(tuple(replace(g, uuid=f"GPU-{g.index:08d}-aaaa-bbbb-cccc-000000000000") for g in TOPOLOGY.gpus),
                    TOPOLOGY.nvlinks, TOPOLOGY.nvswitch, TOPOLOGY.pcie)


UUIDS = with_uuids()
U = GpuIds(UUIDS).ids


def container(*ids: str, resource: str = "nvidia.com/gpu", pod: str = "p") -> ContainerDevices:
    return ContainerDevices("ns", pod, "main", resource, ids)


# -- device ids ------------------------------------------------------------------------------------------


def test_gpu_ids_agree_with_the_extender():
    # As extender.cache.cluster_state names a node's GPUs: the UUID, or GPU<index>.
    assert GpuIds(TOPOLOGY).ids == tuple(f"GPU{i}" for i in range(8))
    assert GpuIds(UUIDS).ids == tuple(g.uuid for g in UUIDS.gpus)


@pytest.mark.parametrize(("device_id", "expected"), [
    (U[3], U[3]),
    (U[3].upper().replace("GPU-", "gpu-"), U[3]),  # case does not matter
    (f"{U[3]}::2", U[3]),  # a time-sliced replica
    ("3", U[3]),  # DEVICE_ID_STRATEGY=index
    ("3::1", U[3]),
    ("GPU3", U[3]),
    ("MIG-7b3a2c1d-0000-1111-2222-333344445555", MIG),
    ("MIG-GPU-0000/1/0", MIG),  # the old MIG id form
    ("3:1", MIG),  # a MIG device by index
    ("GPU-ffffffff-0000-0000-0000-000000000000", None),  # not on this node
    ("8", None),
    ("nvidia0", None),
])
def test_device_ids_map_to_gpu_ids(device_id, expected):
    assert GpuIds(UUIDS).resolve(device_id) == expected


def test_without_uuids_indices_map_to_synthetic_ids():
    ids = GpuIds(TOPOLOGY)
    assert ids.resolve("5") == "GPU5" and ids.resolve("GPU5") == "GPU5"
    assert ids.resolve(U[5]) is None


# -- the observation -------------------------------------------------------------------------------------


def test_used_is_every_gpu_of_the_resource_in_any_container():
    devices = KubeletDevices((container(U[0], U[1], pod="a"), container(f"{U[2]}::0", pod="b"),
                              container(f"{U[2]}::1", pod="c"), container("0000:3b:00.0", resource="rdma/hca"),
                              container(U[7], resource="example.com/other")))
    observed = observe(GpuIds(UUIDS), devices, {}, "nvidia.com/gpu")
    assert observed == Observation(frozenset({U[0], U[1], U[2]}), {}, (), {
        "ns/a": frozenset({U[0], U[1]}), "ns/b": frozenset({U[2]}), "ns/c": frozenset({U[2]})}, Sharing.REPLICAS)


def test_the_agent_sees_sharing_in_the_kubelets_device_ids():
    """Replicas (`<id>::<n>`, time-slicing or MPS) or MIG devices, given out or merely offered, mark the node
    as sharing its GPUs (topology/sharing.py); whole GPUs do not."""
    whole = KubeletDevices((container(U[0]),), {"nvidia.com/gpu": (U[0], U[1])})
    offered = KubeletDevices((), {"nvidia.com/gpu": (f"{U[0]}::0", f"{U[0]}::1")})
    other = KubeletDevices((container(f"{U[0]}::0", resource="example.com/other"),), {"nvidia.com/gpu": (U[0],)})
    assert observe(GpuIds(UUIDS), whole, {}, "nvidia.com/gpu").sharing is Sharing.NONE
    assert observe(GpuIds(UUIDS), offered, {}, "nvidia.com/gpu").sharing is Sharing.REPLICAS
    assert observe(GpuIds(UUIDS), other, {}, "nvidia.com/gpu").sharing is Sharing.NONE  # another resource


def test_the_resource_name_is_configurable():
    devices = KubeletDevices((container(U[0]), container(U[4], resource="example.com/gpu")))
    assert observe(GpuIds(UUIDS), devices, {}, "example.com/gpu").used == {U[4]}


def test_mig_devices_are_ignored_and_said():
    devices = KubeletDevices((container("MIG-aaaa", "MIG-bbbb"), container(U[1])))
    observed = observe(GpuIds(UUIDS), devices, {}, "nvidia.com/gpu")
    assert observed.used == {U[1]} and observed.sharing is Sharing.MIG
    assert observed.notes == (
        "2 MIG device(s) of nvidia.com/gpu are assigned and ignored: only whole GPUs are reported",)


def test_a_device_id_naming_no_gpu_makes_the_state_unknown():
    observed = observe(GpuIds(UUIDS), KubeletDevices((container(U[0], "GPU-not-here"),)), {}, "nvidia.com/gpu")
    assert isinstance(observed, Unknown)
    assert "ns/p (main) device 'GPU-not-here' of nvidia.com/gpu, which names no GPU of this node" in observed.reason


def test_uuids_against_a_capture_without_uuids_say_how_to_fix_it():
    observed = observe(GpuIds(TOPOLOGY), KubeletDevices((container(U[0]),)), {}, "nvidia.com/gpu")
    assert isinstance(observed, Unknown)
    assert "DEVICE_ID_STRATEGY=index" in observed.reason
    indexed = observe(GpuIds(TOPOLOGY), KubeletDevices((container("0", "6"),)), {}, "nvidia.com/gpu")
    assert indexed.used == {"GPU0", "GPU6"}


def test_gpus_the_kubelet_does_not_offer_are_unhealthy():
    offered = {"nvidia.com/gpu": tuple(u for i, u in enumerate(U) if i != 5), "cpu": ("0",)}
    observed = observe(GpuIds(UUIDS), KubeletDevices((), offered), {}, "nvidia.com/gpu")
    assert observed.unhealthy == {U[5]}
    assert "does not offer it" in observed.reasons[U[5]]


def test_health_and_allocatable_reasons_combine_and_nvml_wins():
    offered = {"nvidia.com/gpu": U[2:]}
    observed = observe(GpuIds(UUIDS), KubeletDevices((), offered), {U[0]: "lost", U[7]: "ECC"}, "nvidia.com/gpu")
    assert observed.reasons[U[0]] == "lost" and observed.reasons[U[7]] == "ECC"
    assert observed.unhealthy == {U[0], U[1], U[7]}


@pytest.mark.parametrize(("allocatable", "note"), [
    (None, None),  # a kubelet without GetAllocatableResources
    ({}, "the kubelet offers no nvidia.com/gpu device (is the device plugin running?)"),
    ({"nvidia.com/gpu": (U[0], "GPU-elsewhere")}, "which names no GPU of this node"),
])
def test_allocatable_devices_are_used_only_when_they_are_understood(allocatable, note):
    observed = observe(GpuIds(UUIDS), KubeletDevices((), allocatable), {}, "nvidia.com/gpu")
    assert observed.unhealthy == frozenset()
    if note is None:
        assert observed.notes == ()
    else:
        assert len(observed.notes) == 1 and note in observed.notes[0]


def test_mig_mode_gpus_are_not_offered_as_whole_gpus():
    offered = {"nvidia.com/gpu": (*U[:4], "MIG-aaaa", "MIG-bbbb")}  # GPUs 4-7 are in MIG mode
    observed = observe(GpuIds(UUIDS), KubeletDevices((), offered), {}, "nvidia.com/gpu")
    assert observed.unhealthy == set(U[4:])


# -- the plan --------------------------------------------------------------------------------------------


def known(*used: str, unhealthy: tuple[str, ...] = ()) -> Observation:
    return Observation(frozenset(used), dict.fromkeys(unhealthy, "broken"))


def state_of(annotations: dict) -> NodeState:
    return decode_state(annotations[KEYS.state])


def after(node: NodeAnnotations, decided, now: float) -> NodeAnnotations:
    """The node as the loop records it after the patch landed."""
    merged = {KEYS.topology: node.topology, KEYS.state: node.state_text}
    merged.update(decided.patch)
    generation = max(node.generation, decided.state.generation if decided.state else 0)
    written = now if decided.state else (None if KEYS.state in decided.patch else node.written)
    return NodeAnnotations.read({k: v for k, v in merged.items() if v is not None}, KEYS, generation=generation,
                                written=written)


def test_first_round_publishes_topology_and_state():
    decided = plan(KEYS, TEXT, known("GPU1"), NodeAnnotations(), 100.0, 30.0, T0)
    assert set(decided.patch) == {KEYS.topology, KEYS.state}
    assert decided.patch[KEYS.topology] == TEXT
    assert state_of(decided.patch) == NodeState(frozenset({"GPU1"}), frozenset(), T0, 1)
    assert decided.why == ("topology published", "state published")


def test_nothing_is_written_when_nothing_changed_until_the_heartbeat():
    node = after(NodeAnnotations(), plan(KEYS, TEXT, known("GPU1"), NodeAnnotations(), 100.0, 30.0, T0), 100.0)
    for seconds in (5, 10, 29.9):
        quiet = plan(KEYS, TEXT, known("GPU1"), node, 100.0 + seconds, 30.0, T0 + timedelta(seconds=seconds))
        assert not quiet.writes and quiet.patch == {}
    beat = plan(KEYS, TEXT, known("GPU1"), node, 130.0, 30.0, T0 + timedelta(seconds=30))
    assert set(beat.patch) == {KEYS.state} and beat.why == ("heartbeat",)
    assert state_of(beat.patch) == NodeState(frozenset({"GPU1"}), frozenset(), T0 + timedelta(seconds=30), 1)


def test_a_change_is_written_at_once_with_the_next_generation():
    node = after(NodeAnnotations(), plan(KEYS, TEXT, known("GPU1"), NodeAnnotations(), 100.0, 30.0, T0), 100.0)
    changes = [known("GPU1", "GPU2"), known("GPU2"), known("GPU2", unhealthy=("GPU5",))]
    for generation, observation in enumerate(changes, start=2):
        decided = plan(KEYS, TEXT, observation, node, 101.0, 30.0, T0)
        assert set(decided.patch) == {KEYS.state} and decided.why == ("state changed",)
        assert state_of(decided.patch).generation == generation
        node = after(node, decided, 101.0)


def test_a_restarted_reporter_continues_the_nodes_generation_and_keeps_its_topology():
    on_node = {KEYS.topology: TEXT, KEYS.state: encode_state(NodeState(frozenset({"GPU1"}), frozenset(), T0, 7)),
               "other.io/keep": "x"}
    node = NodeAnnotations.read(on_node, KEYS)
    same = plan(KEYS, TEXT, known("GPU1"), node, 5.0, 30.0, T0 + timedelta(minutes=1))
    assert set(same.patch) == {KEYS.state} and same.why == ("heartbeat",)  # observed must be refreshed
    assert state_of(same.patch).generation == 7
    changed = plan(KEYS, TEXT, known(), node, 5.0, 30.0, T0)
    assert state_of(changed.patch).generation == 8


def test_a_topology_edited_on_the_node_is_restored():
    node = NodeAnnotations.read({KEYS.topology: TEXT.replace('"v":1', '"v":1 '),
                                 KEYS.state: encode_state(NodeState(frozenset(), frozenset(), T0, 1))}, KEYS,
                                written=100.0)
    decided = plan(KEYS, TEXT, known(), node, 101.0, 30.0, T0)
    assert decided.patch == {KEYS.topology: TEXT} and decided.why == ("topology changed",)


def test_an_unreadable_state_on_the_node_is_replaced():
    node = NodeAnnotations.read({KEYS.topology: TEXT, KEYS.state: "{garbage"}, KEYS, written=100.0)
    decided = plan(KEYS, TEXT, known("GPU0"), node, 101.0, 30.0, T0)
    assert state_of(decided.patch) == NodeState(frozenset({"GPU0"}), frozenset(), T0, 1)


def test_an_unknown_state_removes_the_state_and_keeps_the_topology():
    node = after(NodeAnnotations(), plan(KEYS, TEXT, known("GPU1"), NodeAnnotations(), 100.0, 30.0, T0), 100.0)
    gone = plan(KEYS, TEXT, Unknown("socket missing"), node, 105.0, 30.0, T0)
    assert gone.patch == {KEYS.state: None} and gone.why == ("state unknown: socket missing",)
    node = after(node, gone, 105.0)
    assert node.state_text is None and node.topology == TEXT and node.generation == 1
    assert plan(KEYS, TEXT, Unknown("socket missing"), node, 200.0, 30.0, T0).patch == {}  # nothing more to say
    back = plan(KEYS, TEXT, known("GPU1"), node, 210.0, 30.0, T0)
    assert state_of(back.patch).generation == 2 and back.why == ("state published",)


def test_an_unknown_state_on_a_fresh_node_publishes_only_the_topology():
    decided = plan(KEYS, TEXT, Unknown("socket missing"), NodeAnnotations(), 1.0, 30.0, T0)
    assert decided.patch == {KEYS.topology: TEXT}


def test_a_state_over_its_budget_is_refused_and_the_state_is_unknown():
    huge = known(*(f"GPU-{i:08d}-{'x' * 60}" for i in range(500)))
    on_node = {KEYS.topology: TEXT, KEYS.state: encode_state(NodeState(frozenset(), frozenset(), T0, 3))}
    node = NodeAnnotations.read(on_node, KEYS, written=1.0)
    decided = plan(KEYS, TEXT, huge, node, 2.0, 30.0, T0)
    assert decided.patch == {KEYS.state: None}
    assert decided.refused is not None and f"over its {STATE_MAX_BYTES}-byte budget" in decided.refused


def test_a_custom_prefix_names_every_key():
    keys = AnnotationKeys("gpu.example.com")
    decided = plan(keys, TEXT, known(), NodeAnnotations(), 1.0, 30.0, T0)
    assert set(decided.patch) == {"gpu.example.com/topology", "gpu.example.com/state"}


# -- backoff ---------------------------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_cap_with_jitter_around_it():
    low, high = Backoff(1.0, 30.0, 0.5, rand=lambda: 0.0), Backoff(1.0, 30.0, 0.5, rand=lambda: 1.0)
    assert [low.next() for _ in range(8)] == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0, 15.0]
    assert [high.next() for _ in range(8)] == [1.5, 3.0, 6.0, 12.0, 24.0, 45.0, 45.0, 45.0]
    low.reset()
    assert low.next() == 0.5


def test_backoff_never_waits_nothing():
    import random
    backoff = Backoff(0.2, 5.0, 0.5, rand=random.Random(7).random)
    assert min(backoff.next() for _ in range(1000)) >= 0.1


@pytest.mark.parametrize("bad", [dict(initial=0), dict(initial=5, maximum=1), dict(jitter=1.0)])
def test_backoff_refuses_settings_that_could_spin(bad):
    with pytest.raises(ValueError):
        Backoff(**bad)


# -- the layering ----------------------------------------------------------------------------------------


def test_the_core_imports_neither_kubernetes_nor_grpc():
    code = ("import sys; import topology.agent.reporter, topology.agent.annotation_patch, topology.agent.devices, "
            "topology.agent.health, topology.backoff, topology.agent.cli; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('kubernetes', 'grpc', 'pynvml', 'extender')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
