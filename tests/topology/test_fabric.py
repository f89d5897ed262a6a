"""Where a node sits (topology/fabric.py): the node's NVLink domain from its GPUs' fabric info, the agent's reading
against GFD's label, and the label's text, which anyone who can label a node writes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from topology import bounds
from topology.fabric import CLIQUE_LABEL, Domain, FabricState, GpuFabric, describe, node_domain, parse_domain, reconcile

CLUSTER = "9c6f5af3-53bf-49b5-a436-b66766c413c3"  # a real GB200 node's (leptonai/gpud PR #1106)
OTHER_CLUSTER = "0c6f5af3-53bf-49b5-a436-b66766c413c3"
ZERO = "00000000-0000-0000-0000-000000000000"
NAME = f"{CLUSTER}.4026"


def gpu(cluster: str = CLUSTER, clique: int = 4026, state: FabricState = FabricState.COMPLETED,
        ok: bool = True) -> GpuFabric:
    return GpuFabric(cluster, clique, state, ok)


# -- one node from its GPUs ------------------------------------------------------------------------------


def test_every_gpu_registered_in_one_clique_is_the_domain_gfd_labels() -> None:
    domain = node_domain([gpu()] * 4)
    assert domain == Domain(NAME, None)
    assert parse_domain(domain.name) == NAME


@pytest.mark.parametrize("gpus", [
    [],
    [None] * 4,  # NVML answers NOT_SUPPORTED: before Hopper, PCIe boards
    [gpu(ZERO, 0, FabricState.NOT_SUPPORTED)] * 4,  # or answers, with the state saying so
    [None, gpu(ZERO, 0, FabricState.NOT_SUPPORTED)] * 2,
])
def test_no_gpu_on_a_fabric_is_no_domain_and_no_problem(gpus: list[GpuFabric | None]) -> None:
    assert node_domain(gpus) == Domain(None, None)


def test_a_zero_cluster_uuid_on_every_registered_gpu_is_a_fabric_within_the_node() -> None:
    """HGX H100 registers with its own NVSwitches and reports COMPLETED with a zero UUID: no domain, nothing wrong."""
    assert node_domain([gpu(ZERO, 0)] * 8) == Domain(None, None)


@pytest.mark.parametrize(("gpus", "problem"), [
    ([gpu(ZERO, 0, FabricState.NOT_STARTED)] * 4, "GPU 0 fabric registration not started"),
    ([gpu(), gpu(), gpu(ZERO, 0, FabricState.IN_PROGRESS), gpu()], "GPU 2 fabric registration in progress"),
    ([gpu(ZERO, 0, ok=False)] * 4, "GPU 0 fabric status is not success"),  # Insufficient Resources (Azure)
    ([gpu(), gpu(ok=False)], "GPU 1 fabric status is not success"),
    ([gpu(), gpu(), gpu(), gpu(ZERO)], "GPU 3 fabric cluster UUID is zero"),
    ([gpu(ZERO), gpu()], "GPU 0 fabric cluster UUID is zero"),
    ([gpu(), None, gpu(), gpu()], "GPU 1 has no fabric info while other GPUs of the node do"),
    ([gpu(), gpu(ZERO, 0, FabricState.NOT_SUPPORTED)], "GPU 1 has no fabric info while other GPUs of the node do"),
    ([gpu(), gpu(), gpu(clique=4027), gpu(clique=4027)],
     f"GPUs disagree on their NVLink domain: GPU 0 in {NAME}, GPU 2 in {CLUSTER}.4027"),
    # One clique id in two clusters is two domains: the clique id alone is never the key.
    ([gpu(), gpu(), gpu(), gpu(OTHER_CLUSTER)],
     f"GPUs disagree on their NVLink domain: GPU 0 in {NAME}, GPU 3 in {OTHER_CLUSTER}.4026"),
])
def test_doubt_is_no_domain_with_a_reason(gpus: list[GpuFabric | None], problem: str) -> None:
    assert node_domain(gpus) == Domain(None, problem)


def test_registration_finishing_is_the_domain() -> None:
    registering = [gpu(), gpu(ZERO, 0, FabricState.IN_PROGRESS), gpu(), gpu()]
    assert node_domain(registering).name is None
    assert node_domain([gpu()] * 4).name == NAME


def test_the_longest_problem_fits_its_bound() -> None:
    widest = f"{'f' * 8}-{'f' * 4}-{'f' * 4}-{'f' * 4}-{'f' * 12}"
    gpus = [gpu(widest, bounds.MAX_CLIQUE_ID)] * (bounds.MAX_GPUS - 1) + [gpu(widest, bounds.MAX_CLIQUE_ID - 1)]
    problem = node_domain(gpus).problem
    assert problem is not None and problem.startswith("GPUs disagree") and f"GPU {bounds.MAX_GPUS - 1} in" in problem


@pytest.mark.parametrize(("cluster", "clique"), [
    (CLUSTER.upper(), 1), ("9c6f5af353bf49b5a436b66766c413c3", 1), (b"9c6f5af3", 1), (CLUSTER, -1),
    (CLUSTER, bounds.MAX_CLIQUE_ID + 1), (CLUSTER, True), (CLUSTER, 1.0),
])
def test_gpu_fabric_holds_only_what_nvml_can_say(cluster: object, clique: object) -> None:
    with pytest.raises(ValueError):
        GpuFabric(cluster, clique, FabricState.COMPLETED, True)  # type: ignore[arg-type]


def test_fabric_states_carry_nvmls_numbers() -> None:
    import pynvml

    assert [state.value for state in FabricState] == [
        pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED, pynvml.NVML_GPU_FABRIC_STATE_NOT_STARTED,
        pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_GPU_FABRIC_STATE_COMPLETED]


# -- the domain value ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "problem", "message"), [
    (NAME, "also a problem", "a domain or a problem, not both"),
    (f"{ZERO}.0", None, "zero"),
    (NAME.upper(), None, "lowercase"),
    (None, "", "printable ASCII"),
    (None, "x" * (bounds.MAX_DOMAIN_PROBLEM_LENGTH + 1), "printable ASCII"),
    (None, "two\nlines", "printable ASCII"),
    (None, "caf\u00e9", "printable ASCII"),
    (None, 7, "printable ASCII"),
])
def test_a_domain_is_a_canonical_name_or_a_one_line_problem(name: object, problem: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Domain(name, problem)  # type: ignore[arg-type]


def test_domains_compare_by_value() -> None:
    assert Domain(NAME) == Domain(NAME, None) and hash(Domain(NAME)) == hash(Domain(NAME, None))
    assert Domain(None, "GPU 2 fabric registration in progress") != Domain(None, None)


# -- the label's text ------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    NAME,
    f"{CLUSTER}.0",
    f"{CLUSTER}.{bounds.MAX_CLIQUE_ID}",
    "a1b2c3d4-e5f6-7890-abcd-ef1234567890.0",  # NVIDIA/k8s-dra-driver-gpu docs/install.md
    "00000000-0000-0000-0000-0000000000ab.1",  # nvml-mock's demo domain: not a version 4 UUID, still a UUID
])
def test_canonical_domains_parse_to_themselves(text: str) -> None:
    assert parse_domain(text) == text


@pytest.mark.parametrize(("value", "message"), [
    (4026, "found int"),
    (None, "found NoneType"),
    ([NAME], "found list"),
    ({"name": NAME}, "found dict"),
    (NAME.encode(), "found bytes"),
    ("", "is not <clusterUUID>.<cliqueId>"),
    (NAME + "0" * 30, f"{len(NAME) + 30} characters; a domain has at most {bounds.MAX_DOMAIN_LENGTH}"),
    ("x" * 100_000, "100000 characters"),
    ("4026", "is not <clusterUUID>.<cliqueId>"),  # a clique id alone is not a domain
    (CLUSTER, "is not <clusterUUID>.<cliqueId>"),
    (f"{CLUSTER}.", "is not"),
    (f".{4026}", "is not"),
    (f"{CLUSTER}.4026.1", "is not"),
    (f"{CLUSTER}.-1", "is not"),
    (f"{CLUSTER}.+1", "is not"),
    (f"{CLUSTER}.0x10", "is not"),
    (f"{CLUSTER}.04026", "without leading zeros"),
    (f"{CLUSTER}.4026 ", "is not"),
    (f"{CLUSTER}.4026\n", "is not"),
    (f" {NAME}", "is not"),
    (f"{CLUSTER}.\u0664\u0660\u0662\u0666", "is not"),  # Arabic-Indic digits: int() would take them
    (f"{CLUSTER.replace('-', '')}.4026", "is not"),
    (f"{{{CLUSTER}}}.4026", "is not"),
    (f"{CLUSTER[:-1]}g.4026", "is not"),
    (NAME.upper(), "a UUID \\(lowercase\\)"),
    (f"{CLUSTER[:8].upper()}{CLUSTER[8:]}.4026", "lowercase"),
    (f"{CLUSTER}.{bounds.MAX_CLIQUE_ID + 1}", "beyond NVML's unsigned int"),
    (f"{CLUSTER}.{10 ** 25}", "beyond NVML's unsigned int"),
    (f"{ZERO}.0", "the cluster UUID is zero"),
])
def test_anything_else_is_refused_with_the_reason(value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_domain(value)


def test_a_refusal_quotes_a_hostile_value_bounded_and_in_ascii() -> None:
    with pytest.raises(ValueError) as caught:
        parse_domain("\u202e\x00" + "x" * 60)
    reason = str(caught.value)
    assert reason.isascii() and reason.isprintable() and len(reason) < 200
    assert "\\u202e\\x00" in reason


# -- the agent's reading against the label ---------------------------------------------------------------


IN_PROGRESS = Domain(None, "GPU 2 fabric registration in progress")


@pytest.mark.parametrize(("reported", "label", "expected"), [
    (None, None, Domain(None, None)),
    (Domain(None, None), None, Domain(None, None)),
    (Domain(NAME), None, Domain(NAME)),  # the agent alone
    (IN_PROGRESS, None, IN_PROGRESS),
    (None, NAME, Domain(NAME)),  # the label alone: an older agent, or a capture instead of NVML
    (Domain(NAME), NAME, Domain(NAME)),  # both, agreeing
])
def test_one_source_or_two_that_agree_give_the_domain(reported: Domain | None, label: object,
                                                       expected: Domain) -> None:
    assert reconcile(reported, label) == expected


@pytest.mark.parametrize(("reported", "says"), [
    (Domain(f"{CLUSTER}.4027"), f"{CLUSTER}.4027"),
    (Domain(f"{OTHER_CLUSTER}.4026"), f"{OTHER_CLUSTER}.4026"),  # the same clique id in another cluster
    (IN_PROGRESS, "no domain (GPU 2 fabric registration in progress)"),
    (Domain(None, None), "no multi-node NVLink"),
])
def test_two_sources_that_disagree_give_no_domain_naming_both(reported: Domain, says: str) -> None:
    domain = reconcile(reported, NAME)
    assert domain == Domain(None, f"the node agent reads {says} in NVML, label {CLIQUE_LABEL} says {NAME}")


@pytest.mark.parametrize("label", [
    "", 4026, True, 1.5, [NAME], {"value": NAME}, NAME.upper(), f"{CLUSTER}.{bounds.MAX_CLIQUE_ID + 1}",
    f"{ZERO}.0", "not-a-domain", "x" * 10_000, "\u202e" * 63, NAME + "\n",
])
@pytest.mark.parametrize("reported", [None, Domain(NAME), IN_PROGRESS])
def test_a_malformed_label_is_no_domain_with_its_reason(reported: Domain | None, label: object) -> None:
    domain = reconcile(reported, label)
    assert domain.name is None
    assert domain.problem is not None and domain.problem.startswith(f"label {CLIQUE_LABEL}: ")
    assert len(domain.problem) <= bounds.MAX_DOMAIN_PROBLEM_LENGTH and domain.problem.isascii()


def test_the_reason_naming_both_stays_within_its_bound() -> None:
    longest = Domain(None, "p" * bounds.MAX_DOMAIN_PROBLEM_LENGTH)
    problem = reconcile(longest, NAME).problem
    assert problem is not None and len(problem) == bounds.MAX_DOMAIN_PROBLEM_LENGTH and problem.endswith("...")


# -- for people ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("domain", "line"), [
    (None, "NVLink domain not reported"),
    (Domain(None, None), "no multi-node NVLink"),
    (Domain(NAME), f"NVLink domain {NAME}"),
    (IN_PROGRESS, "no NVLink domain: GPU 2 fabric registration in progress"),
])
def test_describe(domain: Domain | None, line: str) -> None:
    assert describe(domain) == line


def test_fabric_is_pure() -> None:
    """The extender imports it: no NVML, Kubernetes or HTTP behind it."""
    code = ("import sys, topology.fabric; bad = {'pynvml', 'kubernetes', 'fastapi', 'grpc'} & set(sys.modules); "
            "print(sorted(bad))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
