"""The agent on a DRA node (`--dra-driver`): no device plugin; which pod holds which GPU from the claims the kubelet
prepared (pod-resources' dynamic resources), joined to the topology by NVML minor and UUID; hostile answers refused
with the reason. The kubelet stand-in's DRA manager is checked against what kubelet v1.36 does first."""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import orjson
import pytest
from helpers.fake_nvml import gpu_uuid, make_fake_nvml, write_sysfs
from helpers.kube_api_server import kube_server_fixture, make_node, wait_until
from helpers.kubelet_standin import DraManagerError, KubeletStandIn
from helpers.reporter_fakes import PodResourcesServer, add_health, kubelet_fixture, short_tmpdir, socket_dir_fixture
from test_reporter_cli import start, stop_with_sigterm

from extender.demo.dra_objects import allocated_claim
from topology.agent import cli
from topology.agent import podresources_v1 as pr
from topology.agent.devices import ClaimDevice, GpuIds, KubeletDevices, Unknown
from topology.agent.dra import DraDevices, read_minors
from topology.agent.podresources import PodResourcesClient, PodResourcesUnavailable
from topology.agent.reporter import PrintingNode, Reporter
from topology.annotations import AnnotationKeys
from topology.codec import decode_state
from topology.discover import NvmlUnavailable, discover
from topology.platforms import PLATFORMS

__all__ = ["kube_server_fixture", "kubelet_fixture", "socket_dir_fixture"]  # fixtures

NODE = "dra-node-1"
DRIVER = "gpu.nvidia.com"
CHANNELS = "compute-domain.nvidia.com"
KEYS = AnnotationKeys()
A6000 = PLATFORMS["rtx-a6000-pairs"].topology()
MINORS = (3, 2, 1, 0, 7, 6, 5, 4)  # the driver probed the GPUs in another order than NVML's PCI order


def claim_pod(name: str, claims: dict[str, list[str]], *, template: str | None = None) -> dict:
    """A pod in namespace ml whose containers (name -> its pod claims) use claims named claim-<pod claim>, or with
    `template` one claim made from a template for the pod claim of that name."""
    pod_claims = [{"name": used, "resourceClaimName": f"claim-{used}"} for used in
                  sorted({used for names in claims.values() for used in names} - {template})]
    status = {}
    if template is not None:
        pod_claims.append({"name": template, "resourceClaimTemplateName": "two-gpus"})
        status = {"resourceClaimStatuses": [{"name": template, "resourceClaimName": f"claim-{template}"}]}
    return {"metadata": {"uid": f"uid-{name}", "name": name, "namespace": "ml"},
            "spec": {"resourceClaims": pod_claims, "containers": [
                {"name": container, "resources": {"claims": [{"name": used} for used in names]}}
                for container, names in claims.items()]},
            "status": status}


def listed_claims(kubelet: KubeletStandIn) -> dict[str, dict[str, list[tuple[str, list[tuple[str, str, str]]]]]]:
    """pod-resources List as {pod: {container: [(claim, [(driver, pool, device)])]}}."""
    with grpc.insecure_channel(f"unix://{kubelet.pod_resources_socket}") as channel:
        answer = channel.unary_unary(pr.LIST, request_serializer=pr.ListPodResourcesRequest.SerializeToString,
                                     response_deserializer=pr.ListPodResourcesResponse.FromString)(
            pr.ListPodResourcesRequest(), timeout=5)
    return {pod.name: {container.name: [(f"{claim.claim_namespace}/{claim.claim_name}",
                                         sorted((d.driver_name, d.pool_name, d.device_name)
                                                for d in claim.claim_resources))
                                        for claim in container.dynamic_resources]
                       for container in pod.containers} for pod in answer.pod_resources}


@pytest.fixture(name="standin")
def standin_fixture() -> Iterator[KubeletStandIn]:
    root = short_tmpdir()
    with KubeletStandIn(root, dial_timeout=1.0) as kubelet:
        kubelet.register_dra_driver(DRIVER)
        yield kubelet
    shutil.rmtree(root, ignore_errors=True)


# -- the stand-in's DRA manager ----------------------------------------------------------------------------


def test_the_standin_lists_a_prepared_claim_for_each_container_that_uses_it(standin: KubeletStandIn) -> None:
    pod = claim_pod("train", {"main": ["a"], "helper": ["a", "b"], "idle": []})
    standin.admit(pod)
    standin.prepare("uid-train", [allocated_claim("a", NODE, ["gpu-0", "gpu-5"], pods=["uid-train"]),
                                  allocated_claim("b", NODE, ["gpu-2"], pods=["uid-train"])])
    two = ("ml/claim-a", [(DRIVER, NODE, "gpu-0"), (DRIVER, NODE, "gpu-5")])
    assert listed_claims(standin) == {"train": {"main": [two], "helper": [two, ("ml/claim-b", [
        (DRIVER, NODE, "gpu-2")])], "idle": []}}


def test_a_claim_is_listed_without_devices_until_its_driver_answers_and_hides_the_rest_until_prepared(
        standin: KubeletStandIn) -> None:
    standin.admit(claim_pod("train", {"main": ["a"]}))
    assert listed_claims(standin) == {"train": {"main": []}}  # not cached yet: the kubelet lists none
    standin.prepare("uid-train", [allocated_claim("a", NODE, ["gpu-1"], pods=["uid-train"])], answered=False)
    assert listed_claims(standin) == {"train": {"main": [("ml/claim-a", [])]}}


def test_each_device_carries_the_cdi_devices_of_the_drivers_earlier_ones_as_v1_36_lists_them(
        standin: KubeletStandIn) -> None:
    standin.admit(claim_pod("train", {"main": ["a"]}))
    standin.prepare("uid-train", [allocated_claim("a", NODE, ["gpu-0", "gpu-1"], pods=["uid-train"])])
    with grpc.insecure_channel(f"unix://{standin.pod_resources_socket}") as channel:
        answer = channel.unary_unary(pr.LIST, request_serializer=pr.ListPodResourcesRequest.SerializeToString,
                                     response_deserializer=pr.ListPodResourcesResponse.FromString)(
            pr.ListPodResourcesRequest(), timeout=5)
    (claim,) = answer.pod_resources[0].containers[0].dynamic_resources
    assert [[cdi.name for cdi in device.cdi_devices] for device in claim.claim_resources] == [
        [f"k8s.{DRIVER}/device=gpu-0"], [f"k8s.{DRIVER}/device=gpu-0", f"k8s.{DRIVER}/device=gpu-1"]]


@pytest.mark.parametrize(("claim", "message"), [
    (allocated_claim("a", NODE, ["gpu-0"]), r"pod train \(uid-train\) is not allowed to use ResourceClaim claim-a "
                                            r"\(a\)"),
    (dict(allocated_claim("a", NODE, ["gpu-0"], pods=["uid-train"]), status={"reservedFor": [{"uid": "uid-train"}]}),
     "ResourceClaim claim-a: not allocated"),
    (allocated_claim("a", NODE, ["channel-0"], pods=["uid-train"], driver=CHANNELS),
     f"DRA driver {CHANNELS} is not registered"),
    (dict(allocated_claim("x", NODE, ["gpu-0"], pods=["uid-train"])), r'fetch ResourceClaim claim-a: '
                                                                      r'resourceclaims.resource.k8s.io "claim-a"'),
])
def test_prepare_refuses_what_the_kubelet_refuses_and_changes_nothing(standin: KubeletStandIn, claim: dict,
                                                                      message: str) -> None:
    standin.admit(claim_pod("train", {"main": ["a"]}))
    with pytest.raises(DraManagerError, match=message):
        standin.prepare("uid-train", [claim])
    assert listed_claims(standin) == {"train": {"main": []}}


def test_a_template_claim_must_be_the_pods_own(standin: KubeletStandIn) -> None:
    standin.admit(claim_pod("train", {"main": ["t"]}, template="t"))
    claim = allocated_claim("t", NODE, ["gpu-0"], pods=["uid-train"])
    with pytest.raises(DraManagerError, match=r"ResourceClaim ml/claim-t was not created for Pod ml/train "
                                              r"\(Pod is not owner\)"):
        standin.prepare("uid-train", [claim])
    claim["metadata"]["ownerReferences"] = [{"uid": "uid-train", "controller": True, "kind": "Pod", "name": "train"}]
    standin.prepare("uid-train", [claim])
    assert listed_claims(standin) == {"train": {"main": [("ml/claim-t", [(DRIVER, NODE, "gpu-0")])]}}


def test_claims_survive_a_restart_and_leave_with_their_last_pod(standin: KubeletStandIn) -> None:
    shared = allocated_claim("a", NODE, ["gpu-4"], pods=["uid-one", "uid-two"])
    for name in ("one", "two"):
        standin.admit(claim_pod(name, {"main": ["a"]}))
        standin.prepare(f"uid-{name}", [shared])
    standin.restart()
    assert listed_claims(standin) == {}  # no pod until its first pod list arrives
    standin.readmit({"uid-one": ["main"], "uid-two": ["main"]})
    held = [("ml/claim-a", [(DRIVER, NODE, "gpu-4")])]
    assert listed_claims(standin) == {"one": {"main": held}, "two": {"main": held}}
    standin.remove("uid-one")
    assert listed_claims(standin) == {"two": {"main": held}}
    standin.remove("uid-two")
    standin.admit(claim_pod("three", {"main": ["a"]}))
    assert listed_claims(standin) == {"three": {"main": []}}, "the claim left the cache with its last pod"


# -- the pod-resources edge --------------------------------------------------------------------------------


def test_the_client_reads_the_drivers_claim_devices_and_no_device_plugin_devices(kubelet: PodResourcesServer
                                                                                 ) -> None:
    kubelet.prepare("ml", "train", "claim-a", [(DRIVER, NODE, "gpu-0"), (CHANNELS, NODE, "channel-0")])
    kubelet.prepare("ml", "train", "claim-a", [(DRIVER, NODE, "gpu-0")], container="side")
    kubelet.allocate("ml", "old", ["GPU-0"])
    kubelet.allocatable = {"nvidia.com/gpu": ["GPU-0"]}
    client = PodResourcesClient(str(kubelet.socket_path), timeout=2.0, dra_driver=DRIVER)
    try:
        devices = client.read()
    finally:
        client.close()
    assert devices == KubeletDevices((), None, (ClaimDevice("ml", "train", "main", "claim-a", DRIVER, NODE, "gpu-0"),
                                                ClaimDevice("ml", "train", "side", "claim-a", DRIVER, NODE, "gpu-0")))
    assert kubelet.calls["GetAllocatableResources"] == 0


@pytest.mark.parametrize(("serve", "reason"), [
    (lambda k: [k.prepare("ml", "p", f"c{i}", []) for i in range(130)],
     r"ml/p \('main'\): 130 claims, more than the 129 a container can use"),
    (lambda k: k.prepare("ml", "p", "c", [(DRIVER, NODE, f"gpu-{i}") for i in range(33)]),
     r"ml/p \('main'\): claim c has 33 devices, more than the 32 an allocation holds"),
    (lambda k: k.prepare("ml", "p", "c", [(DRIVER, NODE, "gpu-" + "0" * 10_000)]),
     r"ml/p \('main'\): claim c has gpu.nvidia.com device 'gpu-0{59}...' of pool 'dra-node-1', not a DRA device"),
    (lambda k: k.prepare("ml", "p", "c", [(DRIVER, "Node A", "gpu-0")]), r"of pool 'Node A', not a DRA"),
    (lambda k: k.prepare("ml", "p", "c", [(DRIVER, NODE, "GPU 0")]), r"device 'GPU 0' of pool"),
    (lambda k: k.prepare("ml", "p", "c", [], claim_namespace="kube-system"),
     r"ml/p \('main'\): claim 'kube-system'/'c', not one of its pod's namespace"),
    (lambda k: k.prepare("ml", "p", "c/../d", []), r"claim 'ml'/'c/../d', not one of"),
    (lambda k: k.prepare("ml", "p" * 254, "c", []), r"a pod named 'ml'/'p{63}\.\.\.'"),
])
def test_a_hostile_answer_is_refused_with_the_reason(kubelet: PodResourcesServer, serve: Callable, reason: str
                                                     ) -> None:
    serve(kubelet)
    client = PodResourcesClient(str(kubelet.socket_path), timeout=2.0, dra_driver=DRIVER)
    try:
        with pytest.raises(PodResourcesUnavailable, match=rf"^pod-resources List on .*: dynamic resources of .*"
                                                          rf"{reason}.*: no kubelet lists that$") as caught:
            client.read()
    finally:
        client.close()
    assert len(str(caught.value)) < 400 and "\n" not in str(caught.value)


def test_another_drivers_devices_are_not_judged(kubelet: PodResourcesServer) -> None:
    kubelet.prepare("ml", "p", "c", [(CHANNELS, "Any Pool", "ANY NAME")])
    client = PodResourcesClient(str(kubelet.socket_path), timeout=2.0, dra_driver=DRIVER)
    try:
        assert client.read().claimed == ()
    finally:
        client.close()


# -- from devices to GPUs ----------------------------------------------------------------------------------


def _fake_nvml(tmp_path: Path, minors: tuple[int, ...] = MINORS):
    """An A6000 node's NVML, health queries included, and its sysfs."""
    fake = make_fake_nvml(A6000, "a6000", minors=minors)
    add_health(fake, A6000, "a6000")
    return fake, write_sysfs(A6000, tmp_path / "sys")


def test_minors_join_the_topology_by_uuid_not_by_index(tmp_path: Path) -> None:
    fake, sysfs = _fake_nvml(tmp_path)
    ids = GpuIds(discover(fake, sysfs))
    assert read_minors(fake, ids) == {minor: gpu_uuid("a6000", index) for index, minor in enumerate(MINORS)}
    assert fake.calls.inits == fake.calls.shutdowns


def test_nvml_giving_two_gpus_one_minor_is_refused(tmp_path: Path) -> None:
    fake, sysfs = _fake_nvml(tmp_path, minors=(0, 1, 2, 3, 4, 5, 6, 6))
    ids = GpuIds(discover(fake, sysfs))
    with pytest.raises(NvmlUnavailable, match=r"NVML GPU 7 \(GPU-.*, minor 6\) is not one GPU of the topology"):
        read_minors(fake, ids)
    assert fake.calls.inits == fake.calls.shutdowns


def _claimed(*devices: tuple[str, str, str], pod: str = "train") -> KubeletDevices:
    return KubeletDevices((), claimed=tuple(ClaimDevice("ml", pod, "main", f"claim-{pod}", driver, pool, device)
                                            for driver, pool, device in devices))


def test_a_pods_claimed_devices_are_its_gpus_and_mig_devices_a_note() -> None:
    uuids = [f"GPU-{i:08x}-0000-0000-0000-000000000000" for i in range(8)]
    dra = DraDevices(DRIVER, NODE, dict(zip(MINORS, uuids, strict=True)))
    seen = dra.observe(_claimed((DRIVER, NODE, "gpu-3"), (DRIVER, NODE, "gpu-7"), (DRIVER, NODE, "gpu-1-mig-19-0-1")),
                       {uuids[5]: "lost"})
    assert not isinstance(seen, Unknown)
    assert seen.pods == {"ml/train": frozenset({uuids[0], uuids[4]})} and seen.used == {uuids[0], uuids[4]}
    assert seen.reasons == {uuids[5]: "lost"}
    assert seen.notes == (f"1 MIG device(s) of {DRIVER} are prepared and ignored: only whole GPUs are reported",)


@pytest.mark.parametrize(("device", "reason"), [
    ((DRIVER, "other-node", "gpu-0"), r"not of this node's pool 'dra-node-1' \(is the node name right\?\)$"),
    ((DRIVER, NODE, "gpu-8"), r"which names no GPU of this node \(its GPUs are gpu-0, gpu-1, .*, gpu-7\)"),
    ((DRIVER, NODE, "gpu-vfio-0"), "which names no GPU of this node"),
    ((DRIVER, NODE, "gpu-9-mig-19-0-1"), "which names no GPU of this node"),
])
def test_a_device_that_names_no_gpu_here_makes_the_state_unknown(device: tuple[str, str, str], reason: str) -> None:
    dra = DraDevices(DRIVER, NODE, {minor: f"GPU{minor}" for minor in range(8)})
    seen = dra.observe(_claimed((DRIVER, NODE, "gpu-0"), device), {})
    assert isinstance(seen, Unknown)
    assert seen.reason.startswith(f"the kubelet prepared {DRIVER} device {device[2]!r} of pool {device[1]!r} for "
                                  "ml/train (main, claim claim-train)")
    assert re.search(reason, seen.reason)


def test_a_hostile_answer_removes_the_published_state(kubelet: PodResourcesServer) -> None:
    out = io.StringIO()
    client = PodResourcesClient(str(kubelet.socket_path), timeout=2.0, dra_driver=DRIVER)
    topology = PLATFORMS["hgx-h100-4gpu"].topology()
    reporter = Reporter(topology, PrintingNode(out), client, dra=DraDevices(DRIVER, NODE, dict(enumerate(
        GpuIds(topology).ids))))
    try:
        kubelet.prepare("ml", "train", "claim-a", [(DRIVER, NODE, "gpu-1")])
        assert reporter.load()
        reporter.round()
        kubelet.prepare("ml", "train", "claim-b", [(DRIVER, NODE, "gpu-2")] * 40)
        reporter.round()
    finally:
        client.close()
    first, second = (orjson.loads(line) for line in out.getvalue().splitlines())
    assert decode_state(first[KEYS.state]).pods == {"ml/train": frozenset({"GPU1"})}
    assert second == {KEYS.state: None}
    assert isinstance(reporter.observation, Unknown) and "claim claim-b has 40 devices" in reporter.observation.reason


# -- the command -------------------------------------------------------------------------------------------


def test_one_round_publishes_each_pods_claimed_gpus_by_uuid(standin: KubeletStandIn, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    standin.admit(claim_pod("train", {"main": ["a"], "side": ["b"]}))
    standin.prepare("uid-train", [allocated_claim("a", NODE, ["gpu-0", "gpu-1"], pods=["uid-train"]),
                                  allocated_claim("b", NODE, ["gpu-7"], pods=["uid-train"])])
    fake, sysfs = _fake_nvml(tmp_path)
    code = cli.main(["--once", "--dry-run", "--dra-driver", DRIVER, "--node-name", NODE,
                     "--socket", str(standin.pod_resources_socket)], nvml=fake, sysfs=sysfs)
    assert code == 0
    (written,) = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    # gpu-0 is /dev/nvidia0, NVML's GPU 3 (MINORS); gpu-1 its GPU 2, gpu-7 its GPU 4.
    held = frozenset(gpu_uuid("a6000", index) for index in (3, 2, 4))
    assert decode_state(written[KEYS.state]).pods == {"ml/train": held}


@pytest.mark.parametrize(("argv", "message"), [
    (["--mode", "deliver", "--node-name", NODE], "--dra-driver: on a DRA node the DRA driver hands out the GPUs"),
    (["--dry-run"], "--dra-driver needs this node's name, the name of the driver's pool"),
])
def test_a_dra_node_has_no_device_plugin_and_needs_its_pool(argv: list[str], message: str,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["--dra-driver", DRIVER, "--from-topo", "dgx-h100", *argv])
    assert code == 2
    assert capsys.readouterr().err.startswith(f"gpu-topology-agent: error: {message}")


def test_a_driver_name_is_a_dns_subdomain(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.main(["--dra-driver", "GPU.nvidia.com", "--dry-run"])
    assert caught.value.code == 2
    assert "'GPU.nvidia.com' is not a DRA driver name" in capsys.readouterr().err


def test_holders_on_a_dra_node_lists_the_claimed_gpus(kubelet: PodResourcesServer,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    kubelet.prepare("team", "train-0", "claim-a", [(DRIVER, NODE, "gpu-0"), (DRIVER, NODE, "gpu-1")])
    code = cli.main(["--holders", "--dra-driver", DRIVER, "--node-name", NODE, "--from-topo", "rtx-a6000-pairs",
                     "--socket", str(kubelet.socket_path)])
    assert code == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["team/train-0", "main", "0,1", "56", "GPU0,GPU1"]


def test_the_daemon_on_a_dra_node_serves_no_device_plugin_and_follows_the_claims(kube_server, standin: KubeletStandIn,
                                                                                 tmp_path: Path) -> None:
    """The real process, as a DaemonSet on a DRA node runs it, against the kubelet stand-in."""
    kube_server.add_node(make_node(NODE))
    config = kube_server.write_kubeconfig(tmp_path / "kubeconfig")
    process = start(["--kubeconfig", str(config), "--from-topo", "hgx-h100-4gpu", "--dra-driver", DRIVER,
                     "--socket", str(standin.pod_resources_socket), "--device-plugin-dir", str(standin.plugin_dir),
                     "--interval", "0.2", "--heartbeat", "60"], env={"NODE_NAME": NODE})
    try:
        def state():
            raw = kube_server.node(NODE)["metadata"]["annotations"].get(KEYS.state)
            return decode_state(raw) if raw else None

        wait_until(lambda: state() is not None, what="the first state")
        for name, claim in (("serve", allocated_claim("b", NODE, ["gpu-0"], pods=["uid-serve"])),
                            ("train", allocated_claim("a", NODE, ["gpu-2", "gpu-3"], pods=["uid-train"]))):
            standin.admit(claim_pod(name, {"main": [claim["metadata"]["uid"]]}))
            standin.prepare(f"uid-{name}", [claim])
        wait_until(lambda: state().pods == {"ml/serve": {"GPU0"}, "ml/train": {"GPU2", "GPU3"}},
                   what="the claims' GPUs")
        standin.remove("uid-train")  # (the last pod's end would be held over a while: a kubelet restart looks alike)
        wait_until(lambda: state().used == {"GPU0"}, what="the pod's end")
    finally:
        code, err, _ = stop_with_sigterm(process)
    assert code == 0, err
    assert "GPUs from DRA driver gpu.nvidia.com" in err
    assert standin.calls() == [] and not standin.healthy("nvidia.com/gpu")
    assert [path.name for path in standin.plugin_dir.iterdir() if path.is_socket()] == ["kubelet.sock"]
