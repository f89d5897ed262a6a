"""The kubelet's per-container order and init-pool reuse (topology/containers.py), and the assignment codec."""

from __future__ import annotations

import orjson
import pytest

from topology.assignment import AssignmentError, decode_containers, encode_containers
from topology.compiled import bits, compile_topology
from topology.containers import ContainerNeed, Kind, container_needs, device_count, split
from topology.platforms import PLATFORMS
from topology.select import Choice, Request, Selector, mask_of, ring_gbps

GPU = "nvidia.com/gpu"


def _container(name: str, count: int, **extra) -> dict:
    return {"name": name, "resources": {"limits": {GPU: str(count)}}, **extra}


def _plan(platform: str, spec: dict) -> list[tuple[str, list[int], bool]]:
    compiled = compile_topology(PLATFORMS[platform].topology())
    selector = Selector()
    needs = container_needs(spec, GPU)
    choice = selector.select(compiled, compiled.full_mask, Request(device_count(needs)))
    assert isinstance(choice, Choice)
    parts = split(selector, compiled, mask_of(choice.gpus), needs)
    assert mask_of(g for part in parts for g in bits(part.gpus)) == mask_of(choice.gpus), "the parts are the set"
    return [(part.need.name, bits(part.gpus), part.exact) for part in parts]


def test_needs_follow_the_kubelets_order_and_kinds() -> None:
    spec = {"containers": [_container("a", 2), {"name": "cpu"}],
            "initContainers": [_container("prep", 1), _container("side", 1, restartPolicy="Always")]}
    assert container_needs(spec, GPU) == (ContainerNeed("prep", Kind.INIT, 1), ContainerNeed("side", Kind.SIDECAR, 1),
                                          ContainerNeed("a", Kind.APP, 2))


@pytest.mark.parametrize("spec, count", [
    ({"containers": [_container("a", 2), _container("b", 2)]}, 4),
    ({"initContainers": [_container("prep", 4)], "containers": [_container("a", 2)]}, 4),
    ({"initContainers": [_container("prep", 2)], "containers": [_container("a", 4)]}, 4),
    ({"initContainers": [_container("side", 1, restartPolicy="Always"), _container("prep", 1)],
      "containers": [_container("a", 2)]}, 3),  # the plain init container reuses nothing: the sidecar keeps its GPU
])
def test_device_count_is_what_the_kubelet_allocates(spec: dict, count: int) -> None:
    assert device_count(container_needs(spec, GPU)) == count


def test_two_app_containers_each_get_a_ring_of_their_own() -> None:
    plan = _plan("rtx-a6000-pairs", {"containers": [_container("a", 2), _container("b", 2)]})
    compiled = compile_topology(PLATFORMS["rtx-a6000-pairs"].topology())
    assert [exact for *_, exact in plan] == [True, True]
    for _, gpus, _ in plan:
        assert ring_gbps(compiled, gpus) == 56.0, "each container's part is an NVLink bridge pair"


def test_an_app_container_takes_the_whole_init_pool_then_more() -> None:
    plan = _plan("dgx1-v100", {"initContainers": [_container("prep", 2)], "containers": [_container("a", 4)]})
    (_, prep, prep_exact), (_, app, app_exact) = plan
    assert set(prep) < set(app) and prep_exact and app_exact


def test_a_smaller_draw_from_the_pool_is_the_kubelets_choice() -> None:
    plan = _plan("dgx1-v100", {"initContainers": [_container("prep", 4)],
                               "containers": [_container("a", 2), _container("b", 2)]})
    assert [exact for *_, exact in plan] == [True, False, False]


def test_the_assignment_round_trips_and_refuses_what_no_pod_has() -> None:
    text = encode_containers([("prep", ["GPU-a"]), ("train", ["GPU-a", "GPU-b"])])
    assert decode_containers(text) == (("prep", ("GPU-a",)), ("train", ("GPU-a", "GPU-b")))
    for bad in ["", "[]", "{}", '{"Bad_Name":["GPU-a"]}', '{"a":[]}', '{"a":["GPU-a","GPU-a"]}',
                '{"a":["GPU,a"]}', orjson.dumps({f"c{i}": ["g"] for i in range(65)}).decode(), "x" * 20000]:
        with pytest.raises(AssignmentError):
            decode_containers(bad)
