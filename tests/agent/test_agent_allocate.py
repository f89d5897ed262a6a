"""Allocate's answer in each device list strategy (topology/agent/allocate.py), in the shapes NVIDIA's device
plugin gives them (NVIDIA/k8s-device-plugin internal/plugin/server.go)."""

from __future__ import annotations

import re

import pytest

from topology.agent.allocate import (
    DEFAULT_CDI_KIND,
    DEFAULT_STRATEGIES,
    ContainerAnswer,
    Delivery,
    Mount,
    Strategy,
    parse_strategies,
    runtime_id,
)

UUIDS = ("GPU-9f3c7a2e-0b1d-4c5e-8f6a-1b2c3d4e5f60", "GPU-0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d")
RESPONSE = "2b8e6f7a-1c3d-4e5f-9a0b-1c2d3e4f5a6b"


def test_the_default_is_what_the_gpu_operator_gives_nvidias_plugin_with_cdi():
    assert DEFAULT_STRATEGIES == (Strategy.CDI_ANNOTATIONS, Strategy.CDI_CRI)
    assert DEFAULT_CDI_KIND == "k8s.device-plugin.nvidia.com/gpu"
    answer = Delivery().answer(UUIDS, RESPONSE)
    qualified = tuple(f"k8s.device-plugin.nvidia.com/gpu={uuid}" for uuid in UUIDS)
    assert answer == ContainerAnswer({}, (), {f"cdi.k8s.io/gpu-topology_{RESPONSE}": ",".join(qualified)}, qualified)


def test_envvar_names_the_gpus_in_nvidia_visible_devices():
    answer = Delivery((Strategy.ENVVAR,)).answer(UUIDS, RESPONSE)
    assert answer == ContainerAnswer({"NVIDIA_VISIBLE_DEVICES": ",".join(UUIDS)})


def test_volume_mounts_mount_dev_null_once_per_gpu():
    answer = Delivery((Strategy.VOLUME_MOUNTS,)).answer(UUIDS, RESPONSE)
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}
    assert answer.mounts == tuple(Mount(f"/var/run/nvidia-container-devices/{uuid}", "/dev/null", True)
                                  for uuid in UUIDS)
    assert not answer.annotations and not answer.cdi_devices


def test_volume_mounts_set_the_variable_after_envvar_as_nvidias_plugin_does():
    answer = Delivery((Strategy.ENVVAR, Strategy.VOLUME_MOUNTS)).answer(UUIDS, RESPONSE)
    assert answer.envs == {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"} and len(answer.mounts) == 2


def test_cdi_annotations_alone_and_with_another_kind():
    answer = Delivery((Strategy.CDI_ANNOTATIONS,), "nvidia.com/gpu").answer(UUIDS[:1], RESPONSE)
    (key, value), = answer.annotations.items()
    # tags.cncf.io/container-device-interface: cdi.k8s.io/<name>, name at most 63 characters
    assert re.fullmatch(r"cdi\.k8s\.io/[A-Za-z0-9][A-Za-z0-9_.-]{0,61}[A-Za-z0-9]", key)
    assert value == f"nvidia.com/gpu={UUIDS[0]}" and not answer.cdi_devices and not answer.envs


def test_cdi_cri_names_cdi_devices():
    answer = Delivery((Strategy.CDI_CRI,)).answer(UUIDS, RESPONSE)
    assert answer.cdi_devices == tuple(f"{DEFAULT_CDI_KIND}={uuid}" for uuid in UUIDS)
    assert not answer.annotations and not answer.envs


def test_every_strategy_at_once():
    answer = Delivery(tuple(Strategy)).answer(UUIDS, RESPONSE)
    assert answer.envs and answer.mounts and answer.annotations and answer.cdi_devices


def test_gpus_named_by_index_go_to_the_runtime_as_indices():
    assert runtime_id("GPU3") == "3" and runtime_id(UUIDS[0]) == UUIDS[0]
    assert Delivery((Strategy.ENVVAR, Strategy.CDI_CRI)).answer(("GPU0", "GPU5"), RESPONSE) == ContainerAnswer(
        {"NVIDIA_VISIBLE_DEVICES": "0,5"}, (), {}, (f"{DEFAULT_CDI_KIND}=0", f"{DEFAULT_CDI_KIND}=5"))


def test_strategies_parse_from_a_comma_list():
    assert parse_strategies("cdi-annotations, cdi-cri") == DEFAULT_STRATEGIES
    assert parse_strategies("envvar,envvar") == (Strategy.ENVVAR,)
    for bad in ("", " , ", "envvar,cdi"):
        with pytest.raises(ValueError):
            parse_strategies(bad)


def test_bad_kinds_and_ids_are_refused():
    for kind in ("nvidia.com", "nvidia.com/", "/gpu", "nvidia.com/g.pu", "9vendor/gpu", "nvidia.com/gpu="):
        with pytest.raises(ValueError):
            Delivery(cdi_kind=kind)
    with pytest.raises(ValueError):
        Delivery(())
    with pytest.raises(ValueError):
        Delivery().answer(("GPU-a,b",), RESPONSE)
    with pytest.raises(ValueError):
        Delivery().answer(UUIDS, "x" * 80)
