"""The agent publishes where its node sits: NVML's fabric info on the bundled GB200 node, discovered at start and read
again each round, carried in the topology annotation, rewritten when the fabric manager finishes registering."""

from __future__ import annotations

import logging
from functools import partial

import orjson
import pytest
from helpers.fake_nvml import (GB200_CLIQUE_ID, GB200_CLUSTER_UUID, GB200_FABRICS, Fabric, gpu_uuid, make_fake_nvml,
                               write_sysfs)
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture
from helpers.reporter_fakes import add_health, kubelet_fixture, socket_dir_fixture
from test_reporter_loop import NODE, Clock, node_api

from topology.agent import cli
from topology.agent import reporter as reporter_loop
from topology.agent.podresources import PodResourcesClient
from topology.agent.reporter import Reporter
from topology.annotations import AnnotationKeys
from topology.backoff import Backoff
from topology.codec import CodecError, decode_topology
from topology.discover import discover, read_domain
from topology.fabric import Domain
from topology.platforms import PLATFORMS

__all__ = ["kube_server_fixture", "kubelet_fixture", "node_api", "socket_dir_fixture"]  # fixtures

NAME = "gb200-node"
KEYS = AnnotationKeys()
BOARD = PLATFORMS[NAME].topology()
DOMAIN = Domain(f"{GB200_CLUSTER_UUID}.{GB200_CLIQUE_ID}")
IN_PROGRESS = Domain(None, "GPU 2 fabric registration in progress")


def topology_patches(kube_server: FakeKubeApiServer) -> list[str]:
    return [patch["patch"]["metadata"]["annotations"][KEYS.topology] for patch in kube_server.patches
            if KEYS.topology in patch["patch"]["metadata"]["annotations"]]


@pytest.mark.parametrize(("case", "domain"), [
    ("completed", DOMAIN),
    ("gpu2-in-progress", IN_PROGRESS),
    ("not-supported", None),  # no fabric: v1, as every agent before domains wrote it
    ("zero-uuid", None),
])
def test_one_round_of_the_agent_carries_the_domain_nvml_gives(case, domain, kubelet, tmp_path, capsys):
    fake = make_fake_nvml(BOARD, NAME, fabric=GB200_FABRICS[case])
    add_health(fake, BOARD, NAME)
    sysfs = write_sysfs(BOARD, tmp_path / "sys")
    assert cli.main(["--once", "--dry-run", "--socket", str(kubelet.socket_path)], nvml=fake, sysfs=sysfs) == 0
    (written,) = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    published = decode_topology(written[KEYS.topology])
    assert published.domain == domain
    assert published.fingerprint == BOARD.fingerprint
    assert orjson.loads(written[KEYS.topology])["v"] == (1 if domain is None else 2)
    assert fake.calls.inits == fake.calls.shutdowns


def test_registration_finishing_after_start_rewrites_the_topology(kube_server, node_api, kubelet, caplog, tmp_path):
    answers = list(GB200_FABRICS["gpu2-in-progress"])
    fake = make_fake_nvml(BOARD, NAME, fabric=answers)
    topology = discover(fake, write_sysfs(BOARD, tmp_path))
    assert topology.domain == IN_PROGRESS
    clock = Clock()
    fake.nvmlInit()  # held open, as the agent's health check holds it
    reporter = Reporter(topology, node_api, PodResourcesClient(str(kubelet.socket_path), timeout=1.0),
                        fabric=partial(read_domain, fake, BOARD.size), monotonic=clock,
                        api_backoff=Backoff(1.0, 30.0, 0.5, rand=lambda: 0.5))
    caplog.set_level(logging.INFO, logger="gpu-topology-agent")
    try:
        assert reporter.load()
        reporter.round()
        assert [decode_topology(text).domain for text in topology_patches(kube_server)] == [IN_PROGRESS]
        clock.now += 5.0
        reporter.round()  # nothing new: nothing written
        assert len(kube_server.patches) == 1
        answers[2] = Fabric()  # the fabric manager finishes GPU 2
        clock.now += 5.0
        reporter.round()
        clock.now += 5.0
        reporter.round()
    finally:
        fake.nvmlShutdown()
    published = topology_patches(kube_server)
    assert [decode_topology(text).domain for text in published] == [IN_PROGRESS, DOMAIN]
    assert kube_server.node(NODE)["metadata"]["annotations"][KEYS.topology] == published[-1]
    assert len(kube_server.patches) == 2  # the change once, then quiet again
    assert decode_topology(published[-1]).fingerprint == BOARD.fingerprint
    assert [gpu.uuid for gpu in decode_topology(published[-1]).gpus] == [gpu_uuid(NAME, i) for i in range(4)]
    said = [record.getMessage() for record in caplog.records if "NVLink domain" in record.getMessage()]
    assert said == [f"no NVLink domain: {IN_PROGRESS.problem}", f"NVLink domain {DOMAIN.name}"]


def test_a_domain_reading_that_would_not_fit_is_left_out_and_said_once(kube_server, node_api, kubelet, caplog,
                                                                       monkeypatch):
    """A board at the edge of the annotation budget: the node keeps being published, without the domain."""
    encode = reporter_loop.encode_topology

    def over_budget(topology):
        if topology.domain is not None:
            raise CodecError("topology annotation would be 16400 bytes, over its 16384-byte budget")
        return encode(topology)

    monkeypatch.setattr(reporter_loop, "encode_topology", over_budget)
    readings = iter([DOMAIN, DOMAIN, DOMAIN])
    reporter = Reporter(BOARD, node_api, PodResourcesClient(str(kubelet.socket_path), timeout=1.0),
                        fabric=lambda: next(readings), monotonic=Clock())
    assert reporter.load()
    for _ in range(3):
        reporter.round()
    (published,) = topology_patches(kube_server)
    assert decode_topology(published).domain is None and reporter.topology.domain is None
    refused = [record for record in caplog.records if "not publishing" in record.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.ERROR
    assert refused[0].getMessage().endswith(f"not publishing NVLink domain {DOMAIN.name}")
