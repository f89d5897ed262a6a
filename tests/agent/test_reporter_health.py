"""NVML health, through the fake NVML built from a real capture with health queries added."""

from __future__ import annotations

import pytest
from helpers.fake_nvml import gpu_uuid, make_fake_nvml
from helpers.reporter_fakes import add_health

from topology.agent.health import NvmlHealth
from topology.discover import NvmlUnavailable
from topology.platforms import PLATFORMS

NAME = "dgx-a100"


@pytest.fixture
def nvml():
    topology = PLATFORMS[NAME].topology()
    fake = make_fake_nvml(topology, NAME)
    return fake, add_health(fake, topology, NAME)


@pytest.fixture
def topology():
    from dataclasses import replace

    from topology.model import Topology
    parsed = PLATFORMS[NAME].topology()
    return Topology(tuple(replace(g, uuid=gpu_uuid(NAME, g.index)) for g in parsed.gpus), parsed.nvlinks,
                    parsed.nvswitch, parsed.pcie)


def uuid(index: int) -> str:
    return gpu_uuid(NAME, index)


def test_healthy_gpus_give_no_reasons(nvml, topology):
    fake, _ = nvml
    with NvmlHealth(fake) as health:
        assert health.check(topology) == {}
    assert fake.calls.inits == fake.calls.shutdowns == 1


def test_each_fault_names_its_gpu_and_why(nvml, topology):
    fake, faults = nvml
    faults.lost.add(1)
    faults.ecc[2] = 3
    faults.remap_failed.add(6)
    with NvmlHealth(fake) as health:
        reasons = health.check(topology)
    assert reasons == {
        uuid(1): "NVML cannot reach it: GPU is lost",
        uuid(2): "3 uncorrectable ECC error(s) since its last reset",
        uuid(6): "row remapping failed: its memory cannot be repaired",
    }


def test_a_gpu_gone_from_the_bus_is_unhealthy(nvml, topology):
    from dataclasses import replace

    from topology.model import Topology
    fake, _ = nvml
    moved = Topology((replace(topology.gpus[0], uuid="GPU-not-on-this-node"), *topology.gpus[1:]),
                     topology.nvlinks, topology.nvswitch, topology.pcie)
    with NvmlHealth(fake) as health:
        assert health.check(moved) == {"GPU-not-on-this-node": "NVML cannot reach it: Not Found"}


def test_checks_a_board_cannot_answer_are_skipped(nvml, topology):
    fake, faults = nvml
    faults.ecc_unsupported = faults.remap_unsupported = True
    faults.remap_failed.add(0)
    with NvmlHealth(fake) as health:
        assert health.check(topology) == {}


def test_a_topology_without_uuids_is_checked_by_index(nvml):
    fake, faults = nvml
    faults.ecc[4] = 1
    with NvmlHealth(fake) as health:
        assert health.check(PLATFORMS[NAME].topology()) == {"GPU4": "1 uncorrectable ECC error(s) since its last reset"}


def test_nvml_itself_failing_is_fatal(nvml, topology):
    fake, faults = nvml
    faults.driver_gone = True
    with NvmlHealth(fake) as health, pytest.raises(NvmlUnavailable, match="NVML query failed: Driver Not Loaded"):
        health.check(topology)


def test_no_nvml_library_is_fatal_at_open():
    fake = make_fake_nvml(PLATFORMS[NAME].topology(), NAME, library_missing=True)
    with pytest.raises(NvmlUnavailable, match="NVML is not available"):
        NvmlHealth(fake).open()
