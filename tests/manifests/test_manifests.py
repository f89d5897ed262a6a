"""scheduler-config/ and the Dockerfile, checked the way the cluster and kube-scheduler check them.

- Every API object validates against the official Kubernetes JSON schemas that kubernetes-validate ships,
  pinned to one Kubernetes version, in strict mode (an unknown field fails).
- A KubeSchedulerConfiguration is not an API object and has no schema there. The checker re-implements the rules
  kube-scheduler applies when it loads one (tests/helpers/kube_scheduler_rules.py), each quoted from upstream with
  the function it comes from, plus this project's own rules (below); a test shows it rejecting broken variants, so
  it can fail.
- cert-manager's Issuer and Certificate are CRDs whose schemas kubernetes-validate does not ship: they are
  checked for structure (fields, references, usages), not against cert-manager's CRD schema.
- The Dockerfile is read instruction by instruction; it is not built here (no Docker daemon).
- The policy that keeps the pods' bind annotations the extender's (pod-annotations-policy.yaml) is evaluated with
  cel-python against pods, Bindings and subresource writes, as tests/manifests/test_agent_manifests.py does for the
  agent's.
"""

from __future__ import annotations

import copy
import importlib
import json
import os
import re
import stat
import socket
import ssl
import subprocess
import sys
import threading
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.client import HTTPSConnection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import promql_parser
import pytest
import yaml
from kubernetes_validate.utils import all_versions
import celpy
from celpy import celtypes
from helpers.manifest_checks import (
    API_OBJECTS,
    CERT_MANAGER_GROUP,
    CONFIG,
    DOCS,
    KUBERNETES_VERSION,
    KUSTOMIZE_GROUP,
    MONITORING_GROUP,
    ROOT,
    SCHEDULER_CONFIG_GROUP,
    AdmissionPolicy,
    Doc,
    ReplicaPod,
    assert_denied,
    assert_promql_on_exported_metrics,
    console_script_help,
    container,
    flag_values,
    flatten_rules,
    non_portable_calls,
    obj,
    policy_expressions,
    policy_variable,
    program,
    quantity,
    repeated_flag,
    roll_out,
)
from helpers.manifest_checks import api_group as _group
from helpers.manifest_checks import documents as _docs
from helpers.kube_scheduler_rules import (
    IN_TREE_PLUGINS,
    is_extended_resource_name,
    is_qualified_name,
    kube_scheduler_errors,
    parse_go_duration,
    plugin_set,
)
from helpers.tools import required

from extender import cli as extender_cli
from extender.api.dra import CLAIMS_MARKER, ClaimAsk
from extender.cache.dra_inventory import DraInventory
from extender.verbs.scoring import KUBE_PACKING
from topology.annotations import AnnotationKeys

NAMESPACE = "gpu-topology-system"
GPU = "nvidia.com/gpu"
GPU_PROFILE = "gpu-topology-scheduler"
GROUPS_PROFILE = "gpu-topology-scheduler-groups"
SECONDARY_CONFIG = "kube-scheduler-config.yaml"
CONTROL_PLANE_CONFIG = "kube-scheduler-config.control-plane.yaml"


def scheduler_config(file: str) -> Doc:
    (doc,) = DOCS[file]
    return doc


EXTENDER = obj("Deployment", "gpu-topology-extender", NAMESPACE)
EXTENDER_SERVICE = obj("Service", "gpu-topology-extender", NAMESPACE)
SCHEDULER = obj("Deployment", "gpu-topology-scheduler", NAMESPACE)


def volume_mount_for_secret(deployment: Doc, secret: str) -> str:
    """The mount path of the volume that holds `secret` in the Deployment's only container."""
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v["name"] for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret]
    (mount,) = [m["mountPath"] for m in container(deployment)["volumeMounts"] if m["name"] == volume]
    return mount


def secret_of_volume(deployment: Doc, volume: str) -> str:
    pod = deployment["spec"]["template"]["spec"]
    (secret,) = [v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == volume and "secret" in v]
    return secret


EXTENDER_TLS_SECRET = secret_of_volume(EXTENDER, "tls")
SEAL_SECRET = secret_of_volume(EXTENDER, "seal")
SEAL_KEY = "key"  # the Secret's key that holds the seal key
SCHEDULER_TLS_SECRET = secret_of_volume(SCHEDULER, "extender-client-tls")
TLS_KEYS = {"tls.crt", "tls.key", "ca.crt"}  # the keys of a kubernetes.io/tls Secret made by cert-manager's CA issuer


# ---------------------------------------------------------------------------------------------------------------
# API objects against the official schemas
# ---------------------------------------------------------------------------------------------------------------


def test_the_pinned_kubernetes_version_is_shipped_by_kubernetes_validate() -> None:
    assert KUBERNETES_VERSION in all_versions()


@pytest.mark.parametrize(
    ("file", "doc"),
    API_OBJECTS,
    ids=[f"{file}:{doc['kind']}/{doc['metadata']['name']}" for file, doc in API_OBJECTS],
)
def test_api_object_validates_strictly_against_the_official_schema(file: str, doc: Doc) -> None:
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_an_unknown_field() -> None:
    broken = copy.deepcopy(EXTENDER)
    container(broken)["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFS"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_every_document_is_of_a_kind_this_suite_checks() -> None:
    checked = {
        SCHEDULER_CONFIG_GROUP: {"KubeSchedulerConfiguration"},
        KUSTOMIZE_GROUP: {"Kustomization"},
        CERT_MANAGER_GROUP: {"Issuer", "ClusterIssuer", "Certificate"},
        MONITORING_GROUP: {"PrometheusRule", "PodMonitor"},
    }
    for file, doc in _docs():
        group = _group(doc)
        if group in checked:
            assert doc["kind"] in checked[group], f"{file}: {doc['kind']} is not checked by this suite"
    assert {file for file, doc in _docs(SCHEDULER_CONFIG_GROUP)} == {SECONDARY_CONFIG, CONTROL_PLANE_CONFIG}


def test_no_secret_material_is_committed() -> None:
    for path in sorted(p for p in CONFIG.rglob("*") if p.is_file()):  # the chart's directory too
        text = path.read_text()
        assert "PRIVATE KEY" not in text and "BEGIN CERTIFICATE" not in text, path.name
    assert not [doc for _, doc in _docs() if doc.get("kind") == "Secret"]


# ---------------------------------------------------------------------------------------------------------------
# kustomize (option B in one `kubectl apply -k`)
# ---------------------------------------------------------------------------------------------------------------

(KUSTOMIZATION,) = DOCS["kustomization.yaml"]


# Installed by hand where their CRDs exist: cert-manager.yaml (TLS option 1, with its admission policy),
# prometheus-rule.yaml and podmonitor.yaml (the Prometheus Operator's); and where the API server has its kind:
# dra-claims-policy.yaml (MutatingAdmissionPolicy, GA in Kubernetes 1.36), on DRA clusters, and
# scheduler-name-policy.yaml (the same kind), where namespaces opt in; and into users' namespaces:
# dra-claim-templates.yaml.
OPTIONAL_FILES = {"cert-manager.yaml", "prometheus-rule.yaml", "dra-claims-policy.yaml", "dra-claim-templates.yaml",
                  "scheduler-name-policy.yaml", "podmonitor.yaml",
                  "dra-pin-webhook.yaml"}


def test_kustomization_installs_every_manifest_but_the_optional_ones() -> None:
    files_with_api_objects = {file for file, _ in API_OBJECTS}
    assert set(KUSTOMIZATION["resources"]) == files_with_api_objects - OPTIONAL_FILES
    (generator,) = KUSTOMIZATION["configMapGenerator"]
    assert generator["files"] == [f"config.yaml={SECONDARY_CONFIG}"]
    assert generator["namespace"] == NAMESPACE
    # The scheduler mounts the generated ConfigMap and reads config.yaml from it.
    pod = SCHEDULER["spec"]["template"]["spec"]
    (config_volume,) = [v for v in pod["volumes"] if "configMap" in v]
    assert config_volume["configMap"]["name"] == generator["name"]
    (mount,) = [m["mountPath"] for m in container(SCHEDULER)["volumeMounts"] if m["name"] == config_volume["name"]]
    assert flag_values(container(SCHEDULER)["command"][1:])["--config"] == f"{mount}/config.yaml"
    # `images:` rewrites the extender's image.
    (image,) = KUSTOMIZATION["images"]
    assert container(EXTENDER)["image"].split(":")[0] == image["name"]


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    required("kubectl")  # it carries kustomize
    out = subprocess.run(
        ["kubectl", "kustomize", str(CONFIG)], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc is not None]


def test_kustomize_output_validates_and_carries_the_scheduler_config(rendered: list[Doc]) -> None:
    for doc in rendered:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    expected = {(doc["kind"], doc["metadata"]["name"]) for file, doc in API_OBJECTS if file not in OPTIONAL_FILES}
    got = {(doc["kind"], doc["metadata"]["name"]) for doc in rendered if doc["kind"] != "ConfigMap"}
    assert got == expected
    (config_map,) = [doc for doc in rendered if doc["kind"] == "ConfigMap"]
    assert yaml.safe_load(config_map["data"]["config.yaml"]) == scheduler_config(SECONDARY_CONFIG)
    (scheduler,) = [
        d for d in rendered if (d["kind"], d["metadata"]["name"]) == ("Deployment", "gpu-topology-scheduler")
    ]
    names = [v["configMap"]["name"] for v in scheduler["spec"]["template"]["spec"]["volumes"] if "configMap" in v]
    assert names == [config_map["metadata"]["name"]]  # the hash-suffixed name, so a new config rolls the Pod


GB200_COMPONENT = "gb200"


def render_with_component(tmp_path: Path, component: str) -> list[Doc]:
    """kubectl kustomize of a copy of scheduler-config/ whose kustomization.yaml takes the component in, its
    commented lines uncommented as README.md says."""
    copy_dir = tmp_path / "scheduler-config"
    copy_dir.mkdir()
    for path in CONFIG.iterdir():
        if path.is_file():
            (copy_dir / path.name).write_text(path.read_text())
    (copy_dir / component).mkdir()
    (copy_dir / component / "kustomization.yaml").write_text((CONFIG / component / "kustomization.yaml").read_text())
    text = (copy_dir / "kustomization.yaml").read_text()
    lines = [line for line in text.splitlines() if line.startswith("# components:")
             or re.fullmatch(rf"#   - {component}\s+#.*", line)]
    assert len(lines) == 2, "kustomization.yaml names the component in two commented lines"
    for line in lines:
        text = text.replace(line, line[2:], 1)
    (copy_dir / "kustomization.yaml").write_text(text)
    out = subprocess.run(["kubectl", "kustomize", str(copy_dir)], check=True, capture_output=True, text=True,
                         timeout=120).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc is not None]


def test_the_gb200_component_adds_the_topology_levels_and_the_gang_gate_and_nothing_else(
        rendered: list[Doc], tmp_path: Path) -> None:
    gb200 = render_with_component(tmp_path, GB200_COMPONENT)
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in gb200}
    base = {(d["kind"], d["metadata"]["name"]): d for d in rendered}
    assert by_name.keys() == base.keys()
    extender, scheduler = ("Deployment", "gpu-topology-extender"), ("Deployment", "gpu-topology-scheduler")
    for key in base.keys() - {extender, scheduler}:
        assert by_name[key] == base[key], key
    added = container(by_name[extender])["args"][len(container(base[extender])["args"]):]
    assert container(by_name[extender])["args"][:-1] == container(base[extender])["args"]
    (levels,) = added
    flag, _, value = levels.partition("=")
    assert flag == "--topology-levels" and flag in console_script_help("gpu-topology-extender", "serve")
    # Outermost first, distinct label keys, as the extender's own parser takes them.
    assert extender_cli._levels(value) == ("network.topology.nvidia.com/spine", "network.topology.nvidia.com/leaf")
    assert container(by_name[scheduler])["command"] == [*container(base[scheduler])["command"],
                                                        "--feature-gates=SchedulerPopFromBackoffQ=false"]


# ---------------------------------------------------------------------------------------------------------------
# KubeSchedulerConfiguration: this project's rules (what makes the configuration right for *this* extender)
# ---------------------------------------------------------------------------------------------------------------

SERVICE_PORT = EXTENDER_SERVICE["spec"]["ports"][0]
EXPECTED_URL = (
    f"https://{EXTENDER_SERVICE['metadata']['name']}.{EXTENDER_SERVICE['metadata']['namespace']}.svc:"
    f"{SERVICE_PORT['port']}"
)
SCHEDULER_TLS_DIR = volume_mount_for_secret(SCHEDULER, SCHEDULER_TLS_SECRET)
RESOURCE_NAME = re.compile(r"cpu|memory|ephemeral-storage|hugepages-.+")


def project_errors(config: Doc) -> list[str]:
    errors: list[str] = []
    extenders = config.get("extenders") or []
    if len(extenders) != 1:
        return [f"extenders: exactly one extender expected, found {len(extenders)}"]
    (extender,) = extenders
    # kube-scheduler reaches the extender through its Service, on HTTPS (README.md).
    if extender.get("urlPrefix") != EXPECTED_URL:
        errors.append(f"urlPrefix: {extender.get('urlPrefix')!r} is not the extender's Service {EXPECTED_URL!r}")
    # The extender serves exactly these paths (DESIGN §7). preemptVerb is optional.
    for key, verb in (("filterVerb", "filter"), ("prioritizeVerb", "prioritize"), ("bindVerb", "bind")):
        if extender.get(key) != verb:
            errors.append(f"{key}: must be {verb!r}, the extender's endpoint")
    if extender.get("preemptVerb", "preempt") != "preempt":
        errors.append("preemptVerb: must be 'preempt', the extender's endpoint, or absent")
    if extender.get("nodeCacheCapable") is not True:
        errors.append("nodeCacheCapable: must be true (the extender keeps its own Node cache and answers NodeNames)")
    if extender.get("ignorable", False) is not False:
        errors.append("ignorable: must be false (a GPU pod must never be placed without the extender)")
    if extender.get("managedResources") != [{"name": GPU, "ignoredByScheduler": False},
                                            {"name": CLAIMS_MARKER, "ignoredByScheduler": True}]:
        errors.append(f"managedResources: must be exactly [{{name: {GPU}, ignoredByScheduler: false}}, {{name: "
                      f"{CLAIMS_MARKER}, ignoredByScheduler: true}}], so that only GPU pods and pods with DRA claims "
                      "reach the extender, kube-scheduler still counts GPUs, and ignores the marker no node has")
    # NewHTTPExtender: a zero httpTimeout becomes DefaultExtenderTimeout (5 s), and Go's http.Client treats a
    # negative Timeout as no timeout at all: neither is a chosen value.
    timeout = parse_go_duration(extender.get("httpTimeout", "0"))
    if timeout <= 0:
        errors.append("httpTimeout: must be set and positive (0 means the 5 s default; negative means none)")
    tls = extender.get("tlsConfig") or {}
    if not extender.get("enableHTTPS") or tls.get("insecure"):
        errors.append("tlsConfig: HTTPS with the extender's certificate checked (enableHTTPS: true, insecure: false)")
    for key in ("certData", "keyData", "caData"):
        if key in tls:
            errors.append(f"tlsConfig.{key}: key material does not belong in the configuration; use the files")
    for key, secret_key in (("caFile", "ca.crt"), ("certFile", "tls.crt"), ("keyFile", "tls.key")):
        if tls.get(key) != f"{SCHEDULER_TLS_DIR}/{secret_key}":
            errors.append(f"tlsConfig.{key}: must be {SCHEDULER_TLS_DIR}/{secret_key}, the mounted Secret "
                          f"{SCHEDULER_TLS_SECRET}")

    profiles = [p for p in config.get("profiles") or [] if p.get("schedulerName") == GPU_PROFILE]
    groups = [p for p in config.get("profiles") or [] if p.get("schedulerName") == GROUPS_PROFILE]
    if len(profiles) != 1 or len(groups) != 1:
        return errors + [f"profiles: one profile {GPU_PROFILE!r} and one {GROUPS_PROFILE!r} expected"]
    (profile,), (group_profile,) = profiles, groups
    if profile.get("percentageOfNodesToScore", 0) != 0:
        errors.append(f"percentageOfNodesToScore: {GPU_PROFILE} keeps the adaptive share (unset or 0); searching "
                      "every node cost kube-scheduler 6.8x its CPU at 5,000 nodes")
    if group_profile.get("percentageOfNodesToScore") != 100:
        errors.append(f"percentageOfNodesToScore: {GROUPS_PROFILE} must be 100, so that a group is planned on "
                      "every candidate domain")
    if {k: v for k, v in group_profile.items() if k not in ("schedulerName", "percentageOfNodesToScore")} != {
            k: v for k, v in profile.items() if k not in ("schedulerName", "percentageOfNodesToScore")}:
        errors.append(f"profiles: {GROUPS_PROFILE} must have {GPU_PROFILE}'s plugins and their configuration")
    disabled = [
        plugin["name"]
        for point in ("multiPoint", "score")
        for plugin in plugin_set(profile, point).get("disabled", [])
    ]
    for name in disabled:
        if name not in IN_TREE_PLUGINS and name != "*":
            errors.append(f"plugins: disabled plugin {name!r} does not exist, so nothing is disabled")
    if "NodeResourcesBalancedAllocation" not in disabled:
        errors.append("plugins: NodeResourcesBalancedAllocation must be disabled (it leans towards emptier nodes)")
    fit = [c for c in profile.get("pluginConfig", []) if c["name"] == "NodeResourcesFit"]
    strategy = (fit[0].get("args") or {}).get("scoringStrategy", {}) if fit else {}
    if strategy.get("type") != "MostAllocated":
        errors.append("NodeResourcesFit: scoringStrategy.type must be MostAllocated (pack, do not spread)")
    weights = {r["name"]: r.get("weight", 1) for r in strategy.get("resources", [])}
    for name in weights:
        if not (RESOURCE_NAME.fullmatch(name) or is_extended_resource_name(name)):
            errors.append(f"NodeResourcesFit: {name!r} is not a resource name, so it scores nothing")
    others = [weight for name, weight in weights.items() if name != GPU]
    if GPU not in weights or any(weights[GPU] <= weight for weight in others):
        errors.append(f"NodeResourcesFit: {GPU} must be scored, with the highest weight")
    if any(c["name"] == "NodeResourcesBalancedAllocation" for c in profile.get("pluginConfig", [])):
        errors.append("pluginConfig: NodeResourcesBalancedAllocation is disabled; its args would be dead configuration")
    return errors


@pytest.mark.parametrize("file", [SECONDARY_CONFIG, CONTROL_PLANE_CONFIG])
def test_scheduler_config_passes_kube_schedulers_validation(file: str) -> None:
    assert kube_scheduler_errors(scheduler_config(file)) == []


@pytest.mark.parametrize("file", [SECONDARY_CONFIG, CONTROL_PLANE_CONFIG])
def test_scheduler_config_follows_the_projects_rules(file: str) -> None:
    assert project_errors(scheduler_config(file)) == []


def test_both_scheduler_configs_share_the_extender_and_the_gpu_profile() -> None:
    secondary, control_plane = scheduler_config(SECONDARY_CONFIG), scheduler_config(CONTROL_PLANE_CONFIG)
    assert secondary["extenders"] == control_plane["extenders"]

    def ours(config: Doc) -> list[Doc]:
        return [p for p in config["profiles"] if p["schedulerName"] in (GPU_PROFILE, GROUPS_PROFILE)]

    assert ours(secondary) == ours(control_plane)
    # Option B runs only our profiles (a default-scheduler profile would compete with the control plane's);
    # option A keeps default-scheduler untouched.
    assert [p["schedulerName"] for p in secondary["profiles"]] == [GPU_PROFILE, GROUPS_PROFILE]
    assert {"schedulerName": "default-scheduler"} in control_plane["profiles"]
    # Option B's lease is its own, in its namespace.
    assert secondary["leaderElection"]["resourceName"] == GPU_PROFILE
    assert secondary["leaderElection"]["resourceNamespace"] == NAMESPACE


def test_weight_and_timeout_are_the_documented_ones() -> None:
    (extender,) = scheduler_config(SECONDARY_CONFIG)["extenders"]
    # MaxNodeScore / MaxExtenderPriority = 100 / 10: the extender's 0–10 becomes 0–500, above the 0–200 that
    # NodeResourcesFit and ImageLocality can swing together, below what makes them irrelevant (README.md).
    assert extender["weight"] * 10 * (100 // 10) == 500
    assert parse_go_duration(extender["httpTimeout"]) == 3.0


def test_the_one_best_packing_is_the_shipped_profiles() -> None:
    """scoring.KUBE_PACKING, kube-scheduler's packing in our points, is derived from this profile: MostAllocated over
    the resources it weighs, each as full as the node's GPUs (a GPU pod's cpu and memory follow its GPUs)."""
    config = scheduler_config(SECONDARY_CONFIG)
    strategy = _fit_strategy(config)
    assert strategy["type"] == "MostAllocated"
    assert "nvidia.com/gpu" in {resource["name"] for resource in strategy["resources"]}
    # Every resource as full as the GPUs: the weighted mean of equal scores is that score, whatever the weights, so a
    # full node scores 100.
    assert KUBE_PACKING == pytest.approx(100 / (_ext(config)["weight"] * 100 // 10))


def _mutate(config: Doc, change: Callable[[Doc], None]) -> Doc:
    broken = copy.deepcopy(config)
    change(broken)
    return broken


def _ext(config: Doc) -> Doc:
    return config["extenders"][0]


def _profile(config: Doc) -> Doc:
    return config["profiles"][0]


def _fit_strategy(config: Doc) -> Doc:
    return _profile(config)["pluginConfig"][0]["args"]["scoringStrategy"]


UPSTREAM_VIOLATIONS: dict[str, tuple[Callable[[Doc], None], str]] = {
    "weight 0 with a prioritizeVerb": (lambda c: _ext(c).update(weight=0), "must have a positive weight"),
    "no weight with a prioritizeVerb": (lambda c: _ext(c).pop("weight"), "must have a positive weight"),
    "two extenders implement bind": (
        lambda c: c["extenders"].append({"urlPrefix": "https://other:443", "bindVerb": "bind"}),
        "only one extender can implement bind",
    ),
    "managed resource name with a bad character": (
        lambda c: _ext(c)["managedResources"][0].update(name="nvidia.com/gpu!"), "name part must consist of",
    ),
    "managed resource name with two slashes": (
        lambda c: _ext(c)["managedResources"][0].update(name="nvidia.com/gpu/a100"), "a qualified name",
    ),
    "managed resource without a domain (native)": (
        lambda c: _ext(c)["managedResources"][0].update(name="gpu"), "is an invalid extended resource name",
    ),
    "managed resource in kubernetes.io": (
        lambda c: _ext(c)["managedResources"][0].update(name="kubernetes.io/gpu"),
        "is an invalid extended resource name",
    ),
    "managed resource with the quota prefix": (
        lambda c: _ext(c)["managedResources"][0].update(name="requests.nvidia.com/gpu"),
        "is an invalid extended resource name",
    ),
    "duplicate managed resource": (
        lambda c: _ext(c)["managedResources"].append({"name": GPU}), "duplicate extender managed resource name",
    ),
    "unknown extender field (typo)": (
        lambda c: _ext(c).update(nodeCachecapable=True), 'unknown field "nodeCachecapable"',
    ),
    "httpTimeout that Go cannot parse": (lambda c: _ext(c).update(httpTimeout="3 seconds"), "invalid duration"),
    "httpTimeout as a bare number": (lambda c: _ext(c).update(httpTimeout=3), "a duration must be a string"),
    "unsupported scoring strategy": (lambda c: _fit_strategy(c).update(type="MostRequested"), "Unsupported value"),
    "scoring resource weight above 100": (
        lambda c: _fit_strategy(c)["resources"][0].update(weight=101), "not in valid range (0, 100]",
    ),
    "negative scoring resource weight": (
        lambda c: _fit_strategy(c)["resources"][0].update(weight=-1), "not in valid range (0, 100]",
    ),
    "balanced allocation weight other than 1": (
        lambda c: _profile(c)["pluginConfig"].append(
            {"name": "NodeResourcesBalancedAllocation", "args": {"resources": [{"name": "cpu", "weight": 2}]}}
        ),
        "must be 1",
    ),
    "plugin configured twice": (
        lambda c: _profile(c)["pluginConfig"].append({"name": "NodeResourcesFit", "args": {}}), "Duplicate value",
    ),
    "enabled plugin that does not exist": (
        lambda c: _profile(c)["plugins"].update(score={"enabled": [{"name": "GpuTopology"}]}), "does not exist",
    ),
    "two profiles with one name": (
        lambda c: c["profiles"].append({"schedulerName": GPU_PROFILE}), "Duplicate value",
    ),
    "second profile without a name": (lambda c: c["profiles"].append({}), "schedulerName: Required value"),
    "percentageOfNodesToScore above 100": (
        lambda c: _profile(c).update(percentageOfNodesToScore=101), "not in valid range [0-100]",
    ),
    "queueSort differs between profiles": (
        lambda c: c["profiles"].append(
            {"schedulerName": "other", "plugins": {"queueSort": {"disabled": [{"name": "*"}]}}}
        ),
        "queueSort must be the same for all profiles",
    ),
    "leader election on endpoints": (
        lambda c: c["leaderElection"].update(resourceLock="endpoints"), 'resourceLock value must be "leases"',
    ),
    "lease shorter than the renew deadline": (
        lambda c: c["leaderElection"].update(leaseDuration="5s"), "LeaseDuration must be greater than RenewDeadline",
    ),
    "max backoff below the initial backoff": (
        lambda c: c.update(podInitialBackoffSeconds=5, podMaxBackoffSeconds=2), "must be greater than or equal",
    ),
    "parallelism 0": (lambda c: c.update(parallelism=0), "greater than zero"),
    "retired API version": (lambda c: c.update(apiVersion="kubescheduler.config.k8s.io/v1beta3"), "no kind"),
}


def test_upstream_defaults_are_applied_before_validation() -> None:
    # A scoring weight of 0 is defaulted to 1 (SetDefaults_NodeResourcesFitArgs), so upstream accepts it.
    zero = _mutate(scheduler_config(SECONDARY_CONFIG), lambda c: _fit_strategy(c)["resources"][0].update(weight=0))
    assert kube_scheduler_errors(zero) == []
    # An extender without a prioritizeVerb needs no weight.

    def filter_only(config: Doc) -> None:
        del _ext(config)["prioritizeVerb"], _ext(config)["weight"]

    assert kube_scheduler_errors(_mutate(scheduler_config(SECONDARY_CONFIG), filter_only)) == []


PROJECT_VIOLATIONS: dict[str, tuple[Callable[[Doc], None], str]] = {
    "plain HTTP": (lambda c: _ext(c).update(urlPrefix=EXPECTED_URL.replace("https", "http")), "urlPrefix"),
    "the container port instead of the Service port": (
        lambda c: _ext(c).update(urlPrefix=EXPECTED_URL.replace(":443", ":8443")), "urlPrefix",
    ),
    "a verb the extender does not serve": (lambda c: _ext(c).update(filterVerb="predicates"), "filterVerb"),
    "a preempt verb the extender does not serve": (lambda c: _ext(c).update(preemptVerb="preemption"), "preemptVerb"),
    "no node cache": (lambda c: _ext(c).update(nodeCacheCapable=False), "nodeCacheCapable"),
    "ignorable": (lambda c: _ext(c).update(ignorable=True), "ignorable"),
    "GPUs ignored by kube-scheduler": (
        lambda c: _ext(c)["managedResources"][0].update(ignoredByScheduler=True), "managedResources",
    ),
    "no managed resources (every pod would be sent)": (lambda c: _ext(c).pop("managedResources"), "managedResources"),
    "no httpTimeout": (lambda c: _ext(c).pop("httpTimeout"), "httpTimeout"),
    "negative httpTimeout": (lambda c: _ext(c).update(httpTimeout="-1s"), "httpTimeout"),
    "certificate not checked": (lambda c: _ext(c)["tlsConfig"].update(insecure=True), "tlsConfig"),
    "inline key": (lambda c: _ext(c)["tlsConfig"].update(keyData="c2VjcmV0"), "keyData"),
    "CA file that is not mounted": (lambda c: _ext(c)["tlsConfig"].update(caFile="/etc/ssl/ca.crt"), "caFile"),
    "spreading": (lambda c: _fit_strategy(c).update(type="LeastAllocated"), "MostAllocated"),
    "GPU weighted below cpu": (lambda c: _fit_strategy(c)["resources"][0].update(weight=1), "highest weight"),
    "misspelt GPU resource": (
        lambda c: _fit_strategy(c)["resources"][0].update(name="nvidia.com/gpus"), "must be scored",
    ),
    "misspelt disabled plugin": (
        lambda c: _profile(c)["plugins"]["multiPoint"]["disabled"][0].update(name="NodeResourceBalancedAllocation"),
        "does not exist",
    ),
    "groups planned on a sample": (lambda c: c["profiles"][1].pop("percentageOfNodesToScore"),
                                   "percentageOfNodesToScore"),
    "every node searched for every pod": (lambda c: _profile(c).update(percentageOfNodesToScore=100),
                                          "percentageOfNodesToScore"),
    "groups profile packs otherwise": (lambda c: c["profiles"][1]["pluginConfig"][0]["args"]["scoringStrategy"].update(
        type="LeastAllocated"), "plugins and their configuration"),
}


BROKEN_VARIANTS = [
    *[(f"upstream: {name}", kube_scheduler_errors, *case) for name, case in UPSTREAM_VIOLATIONS.items()],
    *[(f"project: {name}", project_errors, *case) for name, case in PROJECT_VIOLATIONS.items()],
]


@pytest.mark.parametrize(("checker", "change", "message"), [case[1:] for case in BROKEN_VARIANTS],
                         ids=[case[0] for case in BROKEN_VARIANTS])
def test_the_checkers_reject_a_broken_variant(
    checker: Callable[[Doc], list[str]], change: Callable[[Doc], None], message: str
) -> None:
    errors = checker(_mutate(scheduler_config(SECONDARY_CONFIG), change))
    assert any(message in error for error in errors), errors


def test_the_resource_name_rules_match_upstream_examples() -> None:
    # Consequences of the upstream rules quoted above, on names a reader would try.
    assert is_extended_resource_name("nvidia.com/gpu")
    assert is_extended_resource_name("example.com/dongle")
    assert not is_extended_resource_name("cpu")
    assert not is_extended_resource_name("kubernetes.io/gpu")
    assert not is_extended_resource_name("requests.example.com/dongle")
    assert not is_extended_resource_name("example.com/" + "a" * 64)
    assert is_qualified_name("nvidia.com/gpu") == []
    assert is_qualified_name("/gpu") and is_qualified_name("Nvidia.com/gpu")
    assert parse_go_duration("1m30s") == 90.0 and parse_go_duration("250ms") == 0.25
    assert parse_go_duration("0") == 0.0 and parse_go_duration("-5s") == -5.0
    for bad in ("", "3", "3 s", "s", "1d"):
        with pytest.raises(ValueError):
            parse_go_duration(bad)


# ---------------------------------------------------------------------------------------------------------------
# The Deployments and the Service
# ---------------------------------------------------------------------------------------------------------------

def probe_target(probe: Doc, tls_dir: str) -> tuple[str, int]:
    """(path, port) a probe asks, for an httpGet probe or for the extender's in-container Python probe."""
    if "httpGet" in probe:
        return probe["httpGet"]["path"], probe["httpGet"]["port"]
    command = probe["exec"]["command"]
    assert command[:2] == ["python", "-c"], command
    script, path = command[2], command[3]
    (port,) = re.findall(r'HTTPSConnection\("127\.0\.0\.1", (\d+)', script)
    # It presents the pod's own certificate and checks the server against the mounted CA.
    assert set(re.findall(r'"(/[^"]+)"', script)) == {f"{tls_dir}/{key}" for key in TLS_KEYS}
    return path, int(port)


def assert_hardened(deployment: Doc) -> None:
    """What a Deployment here adds to test_every_container_is_hardened (non-root Pod, seccomp, no host
    namespaces, read-only root, no escalation, no capabilities, checked there for every workload): the container
    repeats runAsNonRoot, leaves privileged out, is sized, and its Secrets are 0440."""
    pod = deployment["spec"]["template"]["spec"]
    security = container(deployment)["securityContext"]
    assert security["runAsNonRoot"] is True
    assert "privileged" not in security
    resources = container(deployment)["resources"]
    for name in ("cpu", "memory"):
        assert quantity(resources["requests"][name]) <= quantity(resources["limits"][name]), name
    for volume in pod["volumes"]:
        if "secret" in volume:
            assert volume["secret"]["defaultMode"] == 0o440


def test_extender_deployment_probes_health_and_readiness() -> None:
    main = container(EXTENDER)
    tls_dir = volume_mount_for_secret(EXTENDER, EXTENDER_TLS_SECRET)
    (port,) = [p["containerPort"] for p in main["ports"] if p["name"] == "https"]
    assert probe_target(main["livenessProbe"], tls_dir) == ("/healthz", port)
    assert probe_target(main["readinessProbe"], tls_dir) == ("/readyz", port)


def test_extender_deployment_is_hardened_and_sized() -> None:
    assert_hardened(EXTENDER)


LEASE_ROLE = obj("Role", "gpu-topology-extender-lease", NAMESPACE)
LEASE_NAME = "gpu-topology-extender"  # the extender's --leader-elect-lease-name default
LEADER_LABEL_ROLE = obj("Role", "gpu-topology-extender-leader-label", NAMESPACE)


def env_field(deployment: Doc, name: str) -> str:
    """The downward-API field an environment variable of the only container is set from."""
    (env,) = [e for e in container(deployment)["env"] if e["name"] == name]
    return env["valueFrom"]["fieldRef"]["fieldPath"]


def test_extender_runs_two_replicas_on_two_nodes_with_one_leader() -> None:
    spec = EXTENDER["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert spec["replicas"] == 2
    # Never both on one node.
    (term,) = spec["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= labels.items()
    # Leader election on the Lease that the Role names, in the Pod's own namespace, as the Pod's own name.
    args = container(EXTENDER)["args"]
    flags = flag_values(args[1:])
    assert "--leader-elect" in args
    assert flags["--leader-elect-lease-name"] == LEASE_NAME
    assert flags["--leader-elect-namespace"] == "$(POD_NAMESPACE)" and env_field(EXTENDER, "POD_NAMESPACE") == (
        "metadata.namespace")
    assert flags["--leader-elect-identity"] == "$(POD_NAME)" and env_field(EXTENDER, "POD_NAME") == "metadata.name"
    assert LEASE_ROLE["metadata"]["namespace"] == EXTENDER["metadata"]["namespace"]
    assert {name for rule in LEASE_ROLE["rules"] for name in rule.get("resourceNames", [])} == {LEASE_NAME}


def _synced(pod: ReplicaPod) -> bool:
    """The extender's readiness: caches synced, on the leader and on a standby alike (extender/verbs/service.py)."""
    return pod.synced


def _leading(pod: ReplicaPod) -> bool:
    """The readiness the extender had before the leader label: only the leader was ready."""
    return pod.leads


def rolling_update() -> tuple[int, int]:
    """(maxSurge, maxUnavailable) of the extender's Deployment, as integers."""
    strategy = EXTENDER["spec"]["strategy"]
    assert strategy["type"] == "RollingUpdate"
    return strategy["rollingUpdate"]["maxSurge"], strategy["rollingUpdate"]["maxUnavailable"]


@dataclass
class PlacedPod:
    revision: str
    node: str | None = None  # None: Pending
    ready: bool = False
    leads: bool = False
    terminating: bool = False


@dataclass
class NodeRollout:
    finished: bool
    fewest_ready: int
    leaders_deleted: int
    pending_ticks: int  # ticks with a new Pod that no node could take


def roll_out_on_nodes(replicas: int, nodes: int, max_surge: int, max_unavailable: int, *, leader_goes_first: bool,
                      ticks: int = 40) -> NodeRollout:
    """The Deployment controller's rolling update (pkg/controller/deployment/rolling.go: the new ReplicaSet scaled up
    to replicas + maxSurge Pods in all, the old one down to what keeps replicas - maxUnavailable available) over
    `nodes` eligible nodes with the required hostname anti-affinity: a Pod is placed only on a node that holds no Pod
    of the extender, a terminating one included, as kube-scheduler counts it until it is gone. Each tick a deleted
    Pod terminates (it is gone the next tick), a placed Pod syncs its caches and is ready the tick after, and a ready
    Pod takes the Lease when no live Pod leads (the old leader released it on SIGTERM)."""
    pods = [PlacedPod("old", f"node-{i}", ready=True, leads=i == 0) for i in range(replicas)]
    fewest, deleted, pending = replicas, 0, 0
    for _ in range(ticks):
        pods = [pod for pod in pods if not pod.terminating]  # gone: the kubelet confirmed their end
        live = pods
        if len(live) == replicas and all(p.revision == "new" and p.ready for p in live):
            return NodeRollout(True, fewest, deleted, pending)
        available = sum(p.ready for p in live)
        fewest = min(fewest, available)
        # Scale the old ReplicaSet down (not-ready Pods first, then the leader or a standby as asked).
        old = sorted((p for p in live if p.revision == "old"), key=lambda p: (p.ready, p.leads != leader_goes_first))
        for pod in old[:max(0, available - (replicas - max_unavailable))]:
            pod.terminating, pod.ready = True, False
            deleted += pod.leads
            pod.leads = False
        # Scale the new one up, within replicas + maxSurge Pods that are not terminating.
        while (sum(not p.terminating for p in pods) < replicas + max_surge
               and sum(p.revision == "new" for p in pods) < replicas):
            pods.append(PlacedPod("new"))
        for pod in pods:
            if pod.node is not None and not pod.terminating:
                pod.ready = True
        taken = {pod.node for pod in pods if pod.node is not None}
        for pod in (p for p in pods if p.node is None):
            free = [f"node-{i}" for i in range(nodes) if f"node-{i}" not in taken]
            if free:
                pod.node = free[0]
                taken.add(pod.node)
        pending += any(p.node is None for p in pods)
        if not any(p.leads for p in pods):
            for pod in pods:
                if pod.ready and not pod.terminating:
                    pod.leads = True
                    break
    return NodeRollout(False, fewest, deleted, pending)


@pytest.mark.parametrize("nodes", [2, 3], ids=["two-eligible-nodes", "three-eligible-nodes"])
@pytest.mark.parametrize("leader_goes_first", [True, False], ids=["leader-deleted-first", "standby-deleted-first"])
def test_a_rollout_completes_by_itself_where_only_two_nodes_may_host_the_extender(nodes: int,
                                                                                  leader_goes_first: bool) -> None:
    # One replica at a time: an old one goes, its successor takes the freed node, never a third Pod that the
    # anti-affinity would leave Pending.
    surge, unavailable = rolling_update()
    assert (surge, unavailable) == (0, 1)
    replicas = EXTENDER["spec"]["replicas"]
    done = roll_out_on_nodes(replicas, nodes, surge, unavailable, leader_goes_first=leader_goes_first)
    # Each successor waits only for its predecessor to end on the node it takes.
    assert done.finished and done.pending_ticks <= (replicas if nodes == replicas else 0), done
    assert done.fewest_ready == replicas - unavailable == 1, "one replica serves throughout"
    assert 1 <= done.leaders_deleted <= 2, "the leader hands over once or twice"
    # The helper's model (no nodes) agrees: the rollout completes with standbys ready.
    assert roll_out(replicas, surge, unavailable, _synced, leader_goes_first=leader_goes_first).finished


def test_a_surge_pod_never_fits_beside_two_replicas_on_two_nodes() -> None:
    # The strategy it replaces, against the model: the surge Pod stays Pending, and no old replica ever goes.
    stuck = roll_out_on_nodes(2, 2, 1, 0, leader_goes_first=True)
    assert not stuck.finished and stuck.pending_ticks > 30 and stuck.leaders_deleted == 0, stuck
    # A third eligible node would have held it.
    assert roll_out_on_nodes(2, 3, 1, 0, leader_goes_first=True).finished


@pytest.mark.parametrize("max_unavailable", [0, 1])
def test_with_readiness_as_leadership_no_rollout_completes(max_unavailable: int) -> None:
    # The model against the design it replaces: with only the leader ready, maxUnavailable 0 never removes an old
    # Pod and maxUnavailable 1 stalls once the new Pods are up, until someone deletes the leader by hand.
    for leader_goes_first in (True, False):
        stuck = roll_out(2, 1, max_unavailable, _leading, leader_goes_first=leader_goes_first)
        assert not stuck.finished and any(p.revision == "old" and p.leads for p in stuck.pods), stuck


def test_a_disruption_budget_keeps_one_replica_and_lets_a_drain_evict_the_leader() -> None:
    (budget,) = [doc for _, doc in _docs() if doc.get("kind") == "PodDisruptionBudget"]
    assert budget["metadata"]["namespace"] == NAMESPACE
    # The budget counts both replicas (the app's label, not the leader label), and both are ready.
    assert budget["spec"]["selector"] == EXTENDER["spec"]["selector"]
    assert budget["spec"]["minAvailable"] == 1 and "maxUnavailable" not in budget["spec"]
    # A replica still syncing (not ready) is evicted only while the other one is ready.
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "IfHealthyBudget"
    # The disruption controller's arithmetic: disruptionsAllowed = currentHealthy - minAvailable. With a warm
    # standby ready, a drain may evict the leader (2 healthy - 1 = 1, and the leader hands over on SIGTERM); with
    # readiness as leadership it never could (1 healthy - 1 = 0).
    replicas, min_available = EXTENDER["spec"]["replicas"], budget["spec"]["minAvailable"]
    assert replicas - min_available == 1, "with every replica ready, a drain may evict one"
    # With as many eligible nodes as replicas the evicted one waits for its node (anti-affinity), so a drain of a
    # second node then waits on the budget (1 healthy - 1 = 0) until the first is uncordoned: README.md says so.
    assert (replicas - 1) - min_available == 0
    assert "uncordon the first node before draining the second" in " ".join(
        (CONFIG / "README.md").read_text().split())


CRITICAL_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}


def pods_of_class_at_most(workload: Doc) -> int:
    """How many Pods of a Deployment may exist at once in a rollout (replicas + maxSurge, the default 25% rounded
    up where unset). The two agent DaemonSets select complementary nodes (test_agent_manifests.py): one Pod per node
    of a 5,000-node cluster between them, twice over for a mode switch or a rollout."""
    if workload["kind"] == "DaemonSet":
        return 5000
    replicas = workload["spec"].get("replicas", 1)
    surge = (workload["spec"].get("strategy", {}).get("rollingUpdate") or {}).get("maxSurge", "25%")
    return replicas + (-(-replicas * int(surge[:-1]) // 100) if isinstance(surge, str) else surge)


def test_every_workload_runs_critical_and_its_namespace_has_a_quota_for_the_class() -> None:
    """The extender and the secondary scheduler sit on every GPU pod's scheduling path, the agents make GPU nodes
    usable: each runs at a critical priority, which only classes of 2,000,000,000 and above give (the kubelet's
    critical-pod admission; a PriorityClass of our own is capped at 1,000,000,000). Clusters whose ResourceQuota
    admission limits those classes admit such a Pod only where a quota covers it, so each namespace has one, large
    enough for every Pod of that class in it at once."""
    workloads = [doc for _, doc in _docs() if doc.get("kind") in {"Deployment", "DaemonSet"}]
    quotas = [doc for _, doc in _docs() if doc.get("kind") == "ResourceQuota"]
    assert {(w["kind"], w["metadata"]["name"]): w["spec"]["template"]["spec"].get("priorityClassName")
            for w in workloads} == {
        ("Deployment", "gpu-topology-extender"): "system-cluster-critical",
        ("Deployment", "gpu-topology-scheduler"): "system-cluster-critical",
        ("DaemonSet", "gpu-topology-agent"): "system-node-critical",
        ("DaemonSet", "gpu-topology-agent-deliver"): "system-node-critical",
    }
    for workload in workloads:
        namespace = workload["metadata"]["namespace"]
        wanted = workload["spec"]["template"]["spec"]["priorityClassName"]
        assert wanted in CRITICAL_CLASSES
        covering = [q for q in quotas if q["metadata"]["namespace"] == namespace
                    and q["spec"]["scopeSelector"]["matchExpressions"] == [
                        {"scopeName": "PriorityClass", "operator": "In", "values": [wanted]}]]
        assert len(covering) == 1, (namespace, wanted)
        same_class = [w for w in workloads if w["metadata"]["namespace"] == namespace
                      and w["spec"]["template"]["spec"]["priorityClassName"] == wanted]
        assert quantity(covering[0]["spec"]["hard"]["pods"]) >= sum(map(pods_of_class_at_most, same_class))
        # Only pods are limited: a quota on cpu or memory would need every Pod of the class to request them.
        assert set(covering[0]["spec"]["hard"]) == {"pods"}
    # The quotas sit in the files that create their namespaces, applied first in option A too.
    assert {file for file, doc in _docs() if doc.get("kind") == "ResourceQuota"} == {"namespace.yaml",
                                                                                      "agent-namespace.yaml"}


def test_extender_command_line_matches_the_manifests() -> None:
    main = container(EXTENDER)
    assert main["args"][0] == "serve"
    flags = flag_values(main["args"][1:])
    (port,) = [p["containerPort"] for p in main["ports"] if p["name"] == "https"]
    assert "--in-cluster" in flags and flags["--host"] == "0.0.0.0"
    assert int(flags["--port"]) == port == 8443
    tls_dir = volume_mount_for_secret(EXTENDER, EXTENDER_TLS_SECRET)
    assert flags["--tls-cert"] == f"{tls_dir}/tls.crt" and flags["--tls-key"] == f"{tls_dir}/tls.key"
    assert flags["--client-ca"] == f"{tls_dir}/ca.crt"  # mTLS on
    assert flags["--gpu-resource"] == GPU
    assert flags["--annotation-prefix"] == "gpu-topology.io"
    assert float(flags["--stale-after"]) > 0  # seconds
    # The seal key comes from the Secret, at the path the flag names.
    seal_dir = volume_mount_for_secret(EXTENDER, SEAL_SECRET)
    assert flags["--seal-key-file"] == f"{seal_dir}/{SEAL_KEY}"
    assert EXTENDER["spec"]["template"]["spec"]["serviceAccountName"] == obj(
        "ServiceAccount", "gpu-topology-extender", NAMESPACE
    )["metadata"]["name"]


def test_extender_mounts_only_the_seal_key_of_its_secret() -> None:
    pod = EXTENDER["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "seal"]
    # The one key, read-only for the extender's group (fsGroup), and required: no Secret, no Pod, rather than a
    # key that dies with the Pod.
    assert volume["secret"] == {"secretName": SEAL_SECRET, "items": [{"key": SEAL_KEY, "path": SEAL_KEY}],
                                "defaultMode": 0o440}
    (mount,) = [m for m in container(EXTENDER)["volumeMounts"] if m["name"] == "seal"]
    assert mount["readOnly"] is True
    assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsUser"]


def test_the_extenders_console_script_accepts_the_deployments_flags() -> None:
    args = container(EXTENDER)["args"]
    help_text = console_script_help("gpu-topology-extender", args[0])
    for flag in flag_values(args[1:]):
        assert flag in help_text, flag


def test_service_reaches_the_extender_on_https() -> None:
    spec = EXTENDER_SERVICE["spec"]
    labels = EXTENDER["spec"]["template"]["metadata"]["labels"]
    # The leader alone: the template's labels and the label the leader sets on its own Pod (and no Pod of the
    # template carries it from the start).
    assert spec["selector"] == {**EXTENDER["spec"]["selector"]["matchLabels"], KEYS.leader: "true"}
    assert KEYS.leader not in labels
    assert EXTENDER["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (port,) = spec["ports"]
    assert port["port"] == 443 and port["name"] == "https"
    (target,) = [p for p in container(EXTENDER)["ports"] if p["name"] == port["targetPort"]]
    assert target["containerPort"] == 8443


def test_the_metrics_port_is_served_apart_and_reached_on_every_replica() -> None:
    main = container(EXTENDER)
    flags = flag_values(main["args"][1:])
    (port,) = [p["containerPort"] for p in main["ports"] if p["name"] == "metrics"]
    assert int(flags["--metrics-port"]) == port == 8890 != int(flags["--port"])
    assert "--metrics-port" in console_script_help("gpu-topology-extender", "serve")
    # Its Service: every replica (the app's labels, not the leader label), each its own endpoint.
    spec = METRICS_SERVICE["spec"]
    assert spec["selector"] == EXTENDER["spec"]["selector"]["matchLabels"] and KEYS.leader not in spec["selector"]
    assert spec["clusterIP"] == "None"
    assert spec["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]


def test_the_pod_monitor_scrapes_every_replica_over_checked_tls_without_a_client_certificate() -> None:
    assert POD_MONITOR["apiVersion"] == "monitoring.coreos.com/v1"
    assert POD_MONITOR["metadata"]["namespace"] == EXTENDER["metadata"]["namespace"]
    spec = POD_MONITOR["spec"]
    assert set(spec) == {"selector", "podMetricsEndpoints"}
    assert spec["selector"] == {"matchLabels": EXTENDER["spec"]["selector"]["matchLabels"]}
    (endpoint,) = spec["podMetricsEndpoints"]
    assert endpoint["port"] in {p["name"] for p in container(EXTENDER)["ports"]} and endpoint["port"] == "metrics"
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    tls = endpoint["tlsConfig"]
    # The CA of the extender's own Secret, the name its certificate carries (the target is a Pod IP), checked; no
    # client certificate or key, which the metrics port does not ask for.
    assert tls == {"ca": {"secret": {"name": EXTENDER_TLS_SECRET, "key": "ca.crt"}},
                   "serverName": tls["serverName"], "insecureSkipVerify": False}
    # cert-manager's certificate carries the name; make-certs.sh's is checked against it by a real scrape below
    # (test_the_real_extender_runs_the_deployments_command_line_with_mtls).
    assert tls["serverName"] in CERTIFICATES[EXTENDER_TLS_SECRET]["spec"]["dnsNames"]


def test_scheduler_deployment_is_hardened_and_probed() -> None:
    assert_hardened(SCHEDULER)
    main = container(SCHEDULER)
    assert re.fullmatch(r"registry\.k8s\.io/kube-scheduler:v1\.36\.\d+", main["image"])
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        get = main[probe]["httpGet"]
        assert (get["path"], get["port"], get["scheme"]) == (path, "https", "HTTPS")
    (port,) = main["ports"]
    assert port == {"name": "https", "containerPort": 10259, "protocol": "TCP"}
    assert SCHEDULER["spec"]["template"]["spec"]["serviceAccountName"] == "gpu-topology-scheduler"


WORKLOADS = [(f"{doc['kind']}/{doc['metadata']['name']}", doc) for _, doc in _docs()
             if doc.get("kind") in {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"}]
# uid 0 where the kubelet's root-owned sockets demand it, and only there: the node agent connects to
# pod-resources/kubelet.sock (agent.yaml) and creates its device-plugin socket next to the kubelet's
# (agent-deliver.yaml).
# scheduler-config/README.md ("Least privilege, and why root") says why no capability or group makes that unneeded.
ROOT_FOR_KUBELET_SOCKETS = {"DaemonSet/gpu-topology-agent", "DaemonSet/gpu-topology-agent-deliver"}


@pytest.mark.parametrize(("name", "workload"), WORKLOADS, ids=[name for name, _ in WORKLOADS])
def test_every_container_is_hardened(name: str, workload: Doc) -> None:
    pod = workload["spec"]["template"]["spec"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not {"hostNetwork", "hostPID", "hostIPC"} & set(pod)
    if name in ROOT_FOR_KUBELET_SOCKETS:
        assert pod["securityContext"]["runAsUser"] == 0 and pod["securityContext"]["runAsNonRoot"] is False
    else:
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    for each in pod.get("initContainers", []) + pod["containers"]:
        security = each["securityContext"]
        assert security["readOnlyRootFilesystem"] is True, each["name"]
        assert security["allowPrivilegeEscalation"] is False, each["name"]
        assert security["capabilities"] == {"drop": ["ALL"]}, each["name"]  # and nothing added
        assert security.get("privileged", False) is False, each["name"]
        assert "runAsUser" not in security or security["runAsUser"] == pod["securityContext"]["runAsUser"]
        assert "seccompProfile" not in security  # the Pod's RuntimeDefault holds for every container
    # Every workload here talks to the API server, so it asks for its token, and only its Pod gets one: the
    # ServiceAccount automounts nothing.
    assert pod["automountServiceAccountToken"] is True
    (account,) = [doc for _, doc in _docs() if doc.get("kind") == "ServiceAccount"
                  and doc["metadata"]["name"] == pod["serviceAccountName"]
                  and doc["metadata"]["namespace"] == workload["metadata"]["namespace"]]
    assert account["automountServiceAccountToken"] is False


def test_every_service_account_automounts_nothing() -> None:
    accounts = [doc for _, doc in _docs() if doc.get("kind") == "ServiceAccount"]
    assert len(accounts) == 4
    assert all(account["automountServiceAccountToken"] is False for account in accounts)


# ---------------------------------------------------------------------------------------------------------------
# RBAC: exactly the least privilege, nothing more
# ---------------------------------------------------------------------------------------------------------------


def bindings_of(service_account: str) -> set[tuple[str, str | None, str, str]]:
    """(binding kind, binding namespace, role kind, role name) for every binding that names the account."""
    found = set()
    for _, doc in _docs():
        if doc.get("kind") in {"RoleBinding", "ClusterRoleBinding"}:
            for subject in doc["subjects"]:
                if (subject["kind"], subject["name"], subject.get("namespace")) == (
                    "ServiceAccount", service_account, NAMESPACE
                ):
                    found.add((doc["kind"], doc["metadata"].get("namespace"), doc["roleRef"]["kind"],
                               doc["roleRef"]["name"]))
    return found


def test_extender_rbac_is_exactly_least_privilege() -> None:
    role = obj("ClusterRole", "gpu-topology-extender")
    # What extender/kube/client.py calls: list_node (list and watch), list_pod_for_all_namespaces (list and watch),
    # read_namespaced_pod (get), create_namespaced_pod_binding, create_namespaced_event, and PodGroups of both kinds
    # (list_cluster_custom_object, list and watch: extender/groups/sizes.py), and DRA's ResourceSlices and
    # ResourceClaims and ResourceClaimTemplates (list and watch), and the planner's claims (create_namespaced_resource_
    # claim, delete_namespaced_resource_claim: claims only, never resourceclaims/status, as kube-scheduler stays the
    # one writer of status.allocation). No pod patch or update:
    # the bind annotations travel in the Binding. No node get: Nodes come from the watch only.
    assert flatten_rules(role["rules"]) == {
        ("", "nodes", "list", ()),
        ("", "nodes", "watch", ()),
        ("", "pods", "get", ()),
        ("", "pods", "list", ()),
        ("", "pods", "watch", ()),
        ("", "pods/binding", "create", ()),
        ("", "events", "create", ()),
        ("scheduling.x-k8s.io", "podgroups", "list", ()),
        ("scheduling.x-k8s.io", "podgroups", "watch", ()),
        ("scheduling.k8s.io", "podgroups", "list", ()),
        ("scheduling.k8s.io", "podgroups", "watch", ()),
        ("resource.k8s.io", "resourceslices", "list", ()),
        ("resource.k8s.io", "resourceslices", "watch", ()),
        ("resource.k8s.io", "resourceclaims", "list", ()),
        ("resource.k8s.io", "resourceclaims", "watch", ()),
        ("resource.k8s.io", "resourceclaims", "create", ()),
        ("resource.k8s.io", "resourceclaims", "delete", ()),
        ("resource.k8s.io", "resourceclaimtemplates", "list", ()),
        ("resource.k8s.io", "resourceclaimtemplates", "watch", ()),
    }
    assert bindings_of("gpu-topology-extender") == {
        ("ClusterRoleBinding", None, "ClusterRole", "gpu-topology-extender"),
        ("RoleBinding", NAMESPACE, "Role", "gpu-topology-extender-lease"),
        ("RoleBinding", NAMESPACE, "Role", "gpu-topology-extender-leader-label"),
    }
    # The leader label (extender/kube/leader_label.py: one merge patch of its own Pod): patch only, in its namespace
    # only. resourceNames cannot name a Deployment's Pods; extender-policy.yaml holds it to its own Pod.
    assert flatten_rules(LEADER_LABEL_ROLE["rules"]) == {("", "pods", "patch", ())}
    assert LEADER_LABEL_ROLE["metadata"]["namespace"] == EXTENDER["metadata"]["namespace"]
    # Leader election (extender/kube/leader_election.py: get, create, replace): create cannot name its object; get and
    # update name the one Lease. In the extender's namespace only.
    assert flatten_rules(LEASE_ROLE["rules"]) == {
        ("coordination.k8s.io", "leases", "create", ()),
        ("coordination.k8s.io", "leases", "get", (LEASE_NAME,)),
        ("coordination.k8s.io", "leases", "update", (LEASE_NAME,)),
    }


def test_scheduler_rbac_is_the_built_in_scheduler_roles_and_its_own_lease() -> None:
    election = scheduler_config(SECONDARY_CONFIG)["leaderElection"]
    assert bindings_of("gpu-topology-scheduler") == {
        ("ClusterRoleBinding", None, "ClusterRole", "system:kube-scheduler"),
        ("ClusterRoleBinding", None, "ClusterRole", "system:volume-scheduler"),
        ("RoleBinding", election["resourceNamespace"], "Role", "gpu-topology-scheduler-lease"),
        ("RoleBinding", "kube-system", "Role", "extension-apiserver-authentication-reader"),
    }
    lease = obj("Role", "gpu-topology-scheduler-lease", election["resourceNamespace"])
    assert flatten_rules(lease["rules"]) == {
        ("coordination.k8s.io", "leases", "get", (election["resourceName"],)),
        ("coordination.k8s.io", "leases", "update", (election["resourceName"],)),
    }
    # Only these roles are defined here (the node agent's: tests/manifests/test_agent_manifests.py); the rest are
    # Kubernetes' built-in ones.
    roles = {(doc["kind"], doc["metadata"]["name"]) for _, doc in _docs() if doc.get("kind") in {"Role", "ClusterRole"}}
    assert roles == {
        ("ClusterRole", "gpu-topology-extender"),
        ("Role", "gpu-topology-extender-lease"),
        ("Role", "gpu-topology-extender-leader-label"),
        ("Role", "gpu-topology-scheduler-lease"),
        ("ClusterRole", "gpu-topology-agent"),
        ("ClusterRole", "gpu-topology-agent-deliver"),
    }


# ---------------------------------------------------------------------------------------------------------------
# Who may write the pods' bind annotations (pod-annotations-policy.yaml), evaluated with cel-python
# ---------------------------------------------------------------------------------------------------------------

BIND_POLICY = obj("ValidatingAdmissionPolicy", "gpu-topology-bind-annotations")
BIND_POLICY_BINDING = obj("ValidatingAdmissionPolicyBinding", "gpu-topology-bind-annotations")
BIND = AdmissionPolicy(BIND_POLICY)
EXTENDER_USER = f"system:serviceaccount:{NAMESPACE}:gpu-topology-extender"
KEYS = AnnotationKeys(flag_values(container(EXTENDER)["args"][1:])["--annotation-prefix"])
BIND_KEYS = [KEYS.gpus, KEYS.containers, KEYS.seal, KEYS.ring_bandwidth, KEYS.group_plan]
USER = "jane@example.com"
REPLICASET_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
KUBELET = "system:node:gpu-node-1"

# What the extender writes into the Binding (extender/verbs/bind.py), for a 2-GPU pod with one container.
BOUND = {
    KEYS.gpus: "GPU-5d1b6c2e-0a3f-4e7b-9c41-2f8e1d0a7b64,GPU-8a2f4c1d-7e5b-4a93-b0c6-1d2e3f4a5b6c",
    KEYS.containers: "train=GPU-5d1b6c2e-0a3f-4e7b-9c41-2f8e1d0a7b64,GPU-8a2f4c1d-7e5b-4a93-b0c6-1d2e3f4a5b6c",
    KEYS.seal: "v1.q0Xk2m7Zb1Ww3s9Pj8Lr5Tn4Vc6Yd0Ef",
    KEYS.ring_bandwidth: "300",
}
# A GPU pod as the API server holds it, before it is bound: the user's own annotations only.
PENDING_POD: Doc = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "train-0",
        "namespace": "ml",
        "uid": "7c2d9e41-5b8a-4f3c-a1d6-0e9f8b7c6d5a",
        "resourceVersion": "91234",
        "labels": {"app": "train"},
        "annotations": {KEYS.interconnect: "nvlink", KEYS.placement: "required"},
    },
    "spec": {
        "schedulerName": "gpu-topology-scheduler",
        "containers": [{"name": "train", "image": "nvcr.io/nvidia/pytorch:25.01-py3",
                        "resources": {"limits": {GPU: "2"}, "requests": {GPU: "2"}}}],
    },
    "status": {"phase": "Pending"},
}
BOUND_POD: Doc = copy.deepcopy(PENDING_POD)
BOUND_POD["metadata"]["annotations"].update(BOUND)
BOUND_POD["spec"]["nodeName"] = "gpu-node-1"
BARE_POD: Doc = copy.deepcopy(PENDING_POD)  # no annotations at all: the API server leaves the map out
del BARE_POD["metadata"]["annotations"]


def binding(annotations: dict[str, str] | None) -> Doc:
    """A Binding for PENDING_POD, as kube-scheduler or the extender POSTs it to pods/binding."""
    metadata: Doc = {"name": "train-0", "namespace": "ml", "uid": PENDING_POD["metadata"]["uid"]}
    if annotations is not None:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
            "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"}}


def pod_request(operation: str, new: Doc | None, old: Doc | None = None, *, user: str = USER,
                sub_resource: str = "", resource: str = "pods") -> Doc:
    """An AdmissionRequest for a write to a Pod (or to one of its subresources, or the legacy bindings)."""
    kind = {"binding": "Binding", "eviction": "Eviction"}.get(sub_resource, "Pod")
    if resource == "bindings":
        kind = "Binding"
    group_version_kind = {"group": "policy" if kind == "Eviction" else "", "version": "v1", "kind": kind}
    request: Doc = {
        "uid": "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
        "kind": group_version_kind,
        "resource": {"group": "", "version": "v1", "resource": resource},
        "requestKind": group_version_kind,
        "requestResource": {"group": "", "version": "v1", "resource": resource},
        "name": "train-0",
        "namespace": "ml",
        "operation": operation,
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
        "object": new,
        "oldObject": old,
        "dryRun": False,
    }
    if sub_resource:  # left out when empty (omitempty), as the API server hands it to CEL
        request["subResource"] = sub_resource
    return request


def with_annotation(pod: Doc, key: str, value: str | None) -> Doc:
    changed = copy.deepcopy(pod)
    current = changed["metadata"].setdefault("annotations", {})
    if value is None:
        current.pop(key, None)
    else:
        current[key] = value
    return changed


def evict() -> Doc:
    return {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "train-0", "namespace": "ml"}}


BIND_ALLOWED: dict[str, Doc] = {
    "a user creates a GPU pod with its own requests": pod_request("CREATE", PENDING_POD),
    "a user creates a pod without annotations": pod_request("CREATE", BARE_POD),
    "the ReplicaSet controller creates a pod from a clean template": pod_request(
        "CREATE", PENDING_POD, user=REPLICASET_CONTROLLER),
    "kube-scheduler binds a pod without bind annotations": pod_request(
        "CREATE", binding(None), user="system:kube-scheduler", sub_resource="binding"),
    "another scheduler binds with its own annotations": pod_request(
        "CREATE", binding({"scheduling.example.com/queue": "a"}), user="system:serviceaccount:kube-system:volcano",
        sub_resource="binding"),
    "the kubelet updates the status of a bound pod": pod_request(
        "UPDATE", {**BOUND_POD, "status": {"phase": "Running"}}, BOUND_POD, user=KUBELET, sub_resource="status"),
    "a user labels a bound pod": pod_request(
        "UPDATE", {**BOUND_POD, "metadata": {**BOUND_POD["metadata"], "labels": {"app": "train", "x": "y"}}},
        BOUND_POD),
    "a user annotates a bound pod with something else": pod_request(
        "UPDATE", with_annotation(BOUND_POD, "example.com/owner", "jane"), BOUND_POD),
    "a user changes its own request on a pending pod": pod_request(
        "UPDATE", with_annotation(PENDING_POD, KEYS.interconnect, "any"), PENDING_POD),
    "an update of a pod that has no annotations at all": pod_request("UPDATE", BARE_POD, BARE_POD),
    "an eviction of a bound pod": pod_request("CREATE", evict(), user=USER, sub_resource="eviction"),
    "keys that only look like ours": pod_request("CREATE", with_annotation(
        with_annotation(PENDING_POD, "gpu-topology.io.example.com/gpus", "x"), "x.gpu-topology.io/seal", "y")),
}

BIND_DENIED: dict[str, tuple[Doc, list[str]]] = {
    "a user creates a pod with gpu-topology.io/gpus": (
        pod_request("CREATE", with_annotation(PENDING_POD, KEYS.gpus, "GPU-1")),
        [f"{KEYS.gpus} is written only by gpu-topology-extender"]),
    "a user creates a pod with a forged assignment on a chosen node": (
        pod_request("CREATE", {**with_annotation(with_annotation(PENDING_POD, KEYS.containers, "train=GPU-1"),
                                                 KEYS.seal, "v1.forged"),
                               "spec": {**PENDING_POD["spec"], "nodeName": "gpu-node-1"}}),
        [f"{KEYS.containers} is written only by gpu-topology-extender"]),
    "the ReplicaSet controller creates a pod whose template carries the annotation": (
        pod_request("CREATE", with_annotation(PENDING_POD, KEYS.gpus, "GPU-1"), user=REPLICASET_CONTROLLER),
        [f"{KEYS.gpus} is written only by gpu-topology-extender"]),
    "a user adds gpu-topology.io/gpus to a pending pod": (
        pod_request("UPDATE", with_annotation(PENDING_POD, KEYS.gpus, "GPU-1"), PENDING_POD),
        [f"{KEYS.gpus} is written"]),
    "a user changes the GPUs of a bound pod": (
        pod_request("UPDATE", with_annotation(BOUND_POD, KEYS.gpus, "GPU-2"), BOUND_POD),
        [f"{KEYS.gpus} is written"]),
    "a user changes the ring bandwidth": (
        pod_request("UPDATE", with_annotation(BOUND_POD, KEYS.ring_bandwidth, "900"), BOUND_POD),
        [f"{KEYS.ring_bandwidth} is written"]),
    "a user removes the seal of a bound pod": (
        pod_request("UPDATE", with_annotation(BOUND_POD, KEYS.seal, None), BOUND_POD),
        [f"{KEYS.seal} was written by gpu-topology-extender when it bound the pod and may not be removed"]),
    "a PUT without any annotation": (
        pod_request("UPDATE", BARE_POD, BOUND_POD),
        [f"{KEYS.gpus} was written by gpu-topology-extender"]),
    "a status patch that changes the assignment": (
        pod_request("UPDATE", with_annotation(BOUND_POD, KEYS.containers, "train=GPU-3"), BOUND_POD, user=KUBELET,
                    sub_resource="status"),
        [f"{KEYS.containers} is written"]),
    "an ephemeral-container update that adds the annotation": (
        pod_request("UPDATE", with_annotation(PENDING_POD, KEYS.gpus, "GPU-1"), PENDING_POD,
                    sub_resource="ephemeralcontainers"),
        [f"{KEYS.gpus} is written"]),
    "another scheduler's Binding carries the annotations": (
        pod_request("CREATE", binding(BOUND), user="system:serviceaccount:kube-system:volcano",
                    sub_resource="binding"),
        [f"{KEYS.gpus} is written"]),
    "a user with pods/binding rights binds with a forged seal": (
        pod_request("CREATE", binding({KEYS.seal: "v1.forged"}), sub_resource="binding"),
        [f"{KEYS.seal} is written"]),
    "the legacy bindings endpoint, even for the extender's ServiceAccount": (
        pod_request("CREATE", binding(BOUND), user=EXTENDER_USER, resource="bindings"),
        [f"{KEYS.gpus} is written"]),
    "the extender patching a pod instead of binding it": (
        pod_request("UPDATE", with_annotation(PENDING_POD, KEYS.gpus, "GPU-1"), PENDING_POD, user=EXTENDER_USER),
        [f"{KEYS.gpus} is written"]),
    "the extender's ServiceAccount creating a pod with them": (
        pod_request("CREATE", with_annotation(PENDING_POD, KEYS.gpus, "GPU-1"), user=EXTENDER_USER),
        [f"{KEYS.gpus} is written"]),
    "written and removed at once": (
        pod_request("UPDATE", with_annotation(with_annotation(BOUND_POD, KEYS.seal, None), KEYS.gpus, "GPU-9"),
                    BOUND_POD),
        [f"{KEYS.gpus} is written", f"{KEYS.seal} was written"]),
}


POLICY_EXPRESSIONS = [
    (f"{policy['metadata']['name']}/{where}", expression)
    for policy in (BIND_POLICY, obj("ValidatingAdmissionPolicy", "gpu-topology-extender-pod-writes"),
                   obj("ValidatingAdmissionPolicy", "gpu-topology-ca-issuer-namespace"))
    for where, expression in policy_expressions(policy)
]


@pytest.mark.parametrize(("where", "expression"), POLICY_EXPRESSIONS,
                         ids=[where for where, _ in POLICY_EXPRESSIONS])
def test_policy_expressions_compile_with_cel_python_and_call_only_portable_cel(where: str, expression: str) -> None:
    program(expression)
    assert not non_portable_calls(expression)


def test_bind_policy_matches_pods_their_subresources_and_the_legacy_bindings() -> None:
    spec = BIND_POLICY["spec"]
    assert BIND_POLICY["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["apiVersions"]) == ([""], ["v1"])
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    assert sorted(rule["resources"]) == ["bindings", "pods", "pods/*"]
    assert all(validation["reason"] == "Forbidden" for validation in spec["validations"])
    assert BIND_POLICY_BINDING["spec"] == {"policyName": BIND_POLICY["metadata"]["name"], "validationActions": ["Deny"]}
    # What reaches admission, and whether the policy looks at it.
    seen = {
        ("CREATE", "pods", ""): True,
        ("UPDATE", "pods", ""): True,
        ("CREATE", "pods", "binding"): True,  # the Binding, which BindingREST copies into the Pod unadmitted
        ("CREATE", "bindings", ""): True,  # POST /api/v1/namespaces/NS/bindings (LegacyBindingREST)
        ("UPDATE", "pods", "status"): True,
        ("UPDATE", "pods", "ephemeralcontainers"): True,
        ("UPDATE", "pods", "resize"): True,
        ("CREATE", "pods", "eviction"): True,
        ("DELETE", "pods", ""): False,  # freeing the GPUs is what deletion is for
        ("CONNECT", "pods", "exec"): False,
        ("CONNECT", "pods", "portforward"): False,
        ("UPDATE", "nodes", ""): False,
        ("UPDATE", "configmaps", ""): False,
    }
    for (operation, resource, sub_resource), expected in seen.items():
        request = pod_request(operation, PENDING_POD, sub_resource=sub_resource, resource=resource)
        assert BIND.matches_constraints(request) is expected, (operation, resource, sub_resource)


def test_bind_policy_names_exactly_the_keys_the_extender_writes() -> None:
    assert policy_variable(BIND_POLICY, "prefix") == KEYS.prefix + "/"
    (keys,) = [v["expression"] for v in BIND_POLICY["spec"]["variables"] if v["name"] == "keys"]
    prefix = celtypes.StringType(policy_variable(BIND_POLICY, "prefix"))
    value = program(keys).evaluate({"variables": celtypes.MapType({celtypes.StringType("prefix"): prefix})})
    assert [str(key) for key in value] == BIND_KEYS
    # The extender's bind puts these and only these into the Binding (extender/verbs/bind.py).
    source = (ROOT / "extender" / "verbs" / "bind.py").read_text()
    written = set(re.findall(r"state\.keys\.(\w+): ", source)) | set(re.findall(r"annotations\[state\.keys\.(\w+)\]",
                                                                             source))
    assert written == {"gpus", "containers", "seal", "ring_bandwidth", "group_plan"}


@pytest.mark.parametrize(
    ("user", "resource", "sub_resource", "selected"),
    [
        (EXTENDER_USER, "pods", "binding", False),  # the extender's Binding: the way the annotations arrive
        (EXTENDER_USER, "pods", "", True),
        (EXTENDER_USER, "pods", "status", True),
        (EXTENDER_USER, "bindings", "", True),
        ("system:kube-scheduler", "pods", "binding", True),
        ("system:serviceaccount:other:gpu-topology-extender", "pods", "binding", True),
        (f"{EXTENDER_USER}x", "pods", "binding", True),
        (USER, "pods", "binding", True),
        (USER, "pods", "", True),
    ],
)
def test_bind_policy_exempts_only_the_extenders_binding(user: str, resource: str, sub_resource: str,
                                                        selected: bool) -> None:
    request = pod_request("CREATE", PENDING_POD, user=user, sub_resource=sub_resource, resource=resource)
    result = BIND.condition("not-the-extenders-binding", request)
    assert isinstance(result, celtypes.BoolType) and bool(result) is selected


def test_the_extenders_own_binding_is_let_through() -> None:
    verdict = BIND.admit(pod_request("CREATE", binding(BOUND), user=EXTENDER_USER, sub_resource="binding"))
    assert not verdict.applies and verdict.allowed


@pytest.mark.parametrize("case", list(BIND_ALLOWED))
def test_bind_policy_allows_every_other_pod_write(case: str) -> None:
    verdict = BIND.admit(BIND_ALLOWED[case])
    assert verdict.applies
    assert verdict.allowed, verdict.messages


@pytest.mark.parametrize("case", list(BIND_DENIED))
def test_bind_policy_denies_forging_changing_or_removing_the_bind_annotations(case: str) -> None:
    assert_denied(BIND, *BIND_DENIED[case])


@pytest.mark.parametrize(
    "request_",
    [
        pod_request("CREATE", {"apiVersion": "v1", "kind": "Pod"}),  # no metadata at all
        pod_request("UPDATE", {"apiVersion": "v1", "kind": "Pod", "metadata": {}}, {"metadata": {}}),
        pod_request("CREATE", binding(None) | {"metadata": {"name": "train-0"}}, user="system:kube-scheduler",
                    sub_resource="binding"),
        pod_request("UPDATE", BARE_POD, {"apiVersion": "v1", "kind": "Pod"}),
    ],
    ids=["pod without metadata", "empty metadata", "binding with a bare name", "old pod without metadata"],
)
def test_bind_policy_is_total_on_sparse_objects(request_: Doc) -> None:
    # failurePolicy Fail and every Pod write of the cluster: an evaluation error would refuse writes that have
    # nothing to do with GPUs. Sparse objects evaluate cleanly, and are allowed.
    verdict = BIND.admit(request_)
    assert verdict.applies and verdict.allowed, verdict.messages


# ---------------------------------------------------------------------------------------------------------------
# What the extender's own ServiceAccount may write on pods (extender-policy.yaml), evaluated with cel-python
# ---------------------------------------------------------------------------------------------------------------

EXTENDER_POLICY = obj("ValidatingAdmissionPolicy", "gpu-topology-extender-pod-writes")
EXTENDER_POLICY_BINDING = obj("ValidatingAdmissionPolicyBinding", "gpu-topology-extender-pod-writes")
EXTENDER_WRITES = AdmissionPolicy(EXTENDER_POLICY)
# What the PodTopologyLabels admission plugin adds to a Binding from the target Node before validation.
NODE_TOPOLOGY_LABELS = {"topology.kubernetes.io/zone": "eu-west-1a", "topology.kubernetes.io/region": "eu-west-1",
                        "topology.k8s.io/rack": "r12", "block.topology.k8s.io/nvl": "b3"}


def binding_with(annotations: dict[str, str] | None, labels: dict[str, str]) -> Doc:
    made = binding(annotations)
    made["metadata"]["labels"] = labels
    return made


EXTENDER_ALLOWED: dict[str, Doc] = {
    "its Binding with the four bind annotations": pod_request(
        "CREATE", binding(BOUND), user=EXTENDER_USER, sub_resource="binding"),
    "its Binding of a 1-GPU pod (no ring bandwidth)": pod_request(
        "CREATE", binding({k: v for k, v in BOUND.items() if k != KEYS.ring_bandwidth}), user=EXTENDER_USER,
        sub_resource="binding"),
    "its Binding without annotations": pod_request("CREATE", binding(None), user=EXTENDER_USER,
                                                   sub_resource="binding"),
    "its Binding with the Node's topology labels the API server added": pod_request(
        "CREATE", binding_with(BOUND, NODE_TOPOLOGY_LABELS), user=EXTENDER_USER, sub_resource="binding"),
}

EXTENDER_DENIED: dict[str, tuple[Doc, str]] = {
    "a Binding that sets another annotation": (
        pod_request("CREATE", binding({**BOUND, "example.com/owner": "mallory"}), user=EXTENDER_USER,
                    sub_resource="binding"),
        "may carry only the bind annotations, not example.com/owner"),
    "a Binding that sets a pod's own request annotation": (
        pod_request("CREATE", binding({**BOUND, KEYS.interconnect: "any"}), user=EXTENDER_USER,
                    sub_resource="binding"),
        f"may carry only the bind annotations, not {KEYS.interconnect}"),
    "a Binding that labels the pod into another Service": (
        pod_request("CREATE", binding_with(BOUND, {"app": "payments"}), user=EXTENDER_USER, sub_resource="binding"),
        "not app"),
    "a Binding with a label that only looks topological": (
        pod_request("CREATE", binding_with(BOUND, {"topology.k8s.io.example.com/x": "y"}), user=EXTENDER_USER,
                    sub_resource="binding"),
        "not topology.k8s.io.example.com/x"),
    "a patch of a pod (PATCH reaches admission as UPDATE)": (
        pod_request("UPDATE", with_annotation(PENDING_POD, KEYS.gpus, "GPU-1"), PENDING_POD, user=EXTENDER_USER),
        "not by UPDATE on pods"),
    "a change of a pod's spec": (
        pod_request("UPDATE", {**PENDING_POD, "spec": {**PENDING_POD["spec"], "priorityClassName": "x"}},
                    PENDING_POD, user=EXTENDER_USER),
        "not by UPDATE on pods"),
    "creating a pod": (pod_request("CREATE", PENDING_POD, user=EXTENDER_USER), "not by CREATE on pods"),
    "deleting a pod": (pod_request("DELETE", None, BOUND_POD, user=EXTENDER_USER), "not by DELETE on pods"),
    "a status write": (
        pod_request("UPDATE", {**BOUND_POD, "status": {"phase": "Failed"}}, BOUND_POD, user=EXTENDER_USER,
                    sub_resource="status"),
        "not by UPDATE on pods/status"),
    "an eviction": (pod_request("CREATE", evict(), user=EXTENDER_USER, sub_resource="eviction"),
                    "not by CREATE on pods/eviction"),
    "an ephemeral container": (
        pod_request("UPDATE", BOUND_POD, BOUND_POD, user=EXTENDER_USER, sub_resource="ephemeralcontainers"),
        "not by UPDATE on pods/ephemeralcontainers"),
    "the legacy bindings endpoint": (
        pod_request("CREATE", binding(BOUND), user=EXTENDER_USER, resource="bindings"),
        "not by CREATE on bindings"),
}


# The extender's own Pod, as the Deployment makes it, and the patches of its leader label.
OWN_POD_NAME = "gpu-topology-extender-6b7c9d-x2k4q"
OTHER_REPLICA = "gpu-topology-extender-6b7c9d-p8z7m"
EXTENDER_POD: Doc = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": OWN_POD_NAME, "namespace": NAMESPACE, "uid": "5d1c2b3a-0f9e-4d8c-b7a6-958473625140",
                 "resourceVersion": "4711", "labels": {**EXTENDER["spec"]["template"]["metadata"]["labels"],
                                                       "pod-template-hash": "6b7c9d"},
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                      "name": "gpu-topology-extender-6b7c9d", "uid": "0a1b2c3d", "controller": True}]},
    "spec": copy.deepcopy(EXTENDER["spec"]["template"]["spec"]),
    "status": {"phase": "Running"},
}


def with_label(pod: Doc, key: str, value: str | None, *, name: str | None = None) -> Doc:
    changed = copy.deepcopy(pod)
    if name is not None:
        changed["metadata"]["name"] = name
    labels = changed["metadata"]["labels"]
    if value is None:
        labels.pop(key, None)
    else:
        labels[key] = value
    return changed


LEADING_POD = with_label(EXTENDER_POD, KEYS.leader, "true")


def own_pod_request(new: Doc, old: Doc, *, claim: list[str] | None = None, namespace: str = NAMESPACE,
                    sub_resource: str = "") -> Doc:
    """A PATCH (UPDATE in admission) of a Pod by the extender, whose bound token names the Pod in `claim`."""
    request = pod_request("UPDATE", new, old, user=EXTENDER_USER, sub_resource=sub_resource)
    request["name"], request["namespace"] = new["metadata"]["name"], namespace
    request["userInfo"]["extra"] = {"authentication.kubernetes.io/pod-name": [OWN_POD_NAME] if claim is None
                                    else claim,
                                    "authentication.kubernetes.io/pod-uid": [EXTENDER_POD["metadata"]["uid"]]}
    if claim == []:
        del request["userInfo"]["extra"]
    return request


def changed(pod: Doc, change: Callable[[Doc], None]) -> Doc:
    made = copy.deepcopy(pod)
    change(made)
    return made


OWN_LABEL_ALLOWED: dict[str, Doc] = {
    "the leader labels its own Pod": own_pod_request(LEADING_POD, EXTENDER_POD),
    "a leader that steps down removes the label": own_pod_request(EXTENDER_POD, LEADING_POD),
    "removing a label that is not there (a merge patch of null at start)": own_pod_request(EXTENDER_POD, EXTENDER_POD),
    "labelling it again": own_pod_request(LEADING_POD, LEADING_POD),
}

OWN_LABEL_DENIED: dict[str, tuple[Doc, str]] = {
    "labelling the other replica's Pod": (
        own_pod_request(with_label(EXTENDER_POD, KEYS.leader, "true", name=OTHER_REPLICA),
                        with_label(EXTENDER_POD, KEYS.leader, None, name=OTHER_REPLICA)),
        "not by UPDATE on pods"),
    "removing the label of the other replica's Pod": (
        own_pod_request(with_label(EXTENDER_POD, KEYS.leader, None, name=OTHER_REPLICA),
                        with_label(EXTENDER_POD, KEYS.leader, "true", name=OTHER_REPLICA)),
        "not by UPDATE on pods"),
    "a token bound to no Pod (a legacy Secret token)": (
        own_pod_request(LEADING_POD, EXTENDER_POD, claim=[]), "not by UPDATE on pods"),
    "a pod claim with two names": (
        own_pod_request(LEADING_POD, EXTENDER_POD, claim=[OWN_POD_NAME, OTHER_REPLICA]), "not by UPDATE on pods"),
    "a Pod of the same name in another namespace": (
        own_pod_request(LEADING_POD, EXTENDER_POD, namespace="ml"), "not by UPDATE on pods"),
    "a leader label other than true": (
        own_pod_request(with_label(EXTENDER_POD, KEYS.leader, "yes"), EXTENDER_POD), "may change only the label"),
    "taking its Pod out of the Deployment's selection": (
        own_pod_request(with_label(LEADING_POD, "app.kubernetes.io/name", None), EXTENDER_POD),
        "may change only the label"),
    "adding another label (into another Service)": (
        own_pod_request(with_label(EXTENDER_POD, "app", "payments"), EXTENDER_POD), "may change only the label"),
    "changing another label's value": (
        own_pod_request(with_label(LEADING_POD, "pod-template-hash", "000000"), LEADING_POD),
        "may change only the label"),
    "an annotation of its own Pod": (
        own_pod_request(with_annotation(changed(LEADING_POD, lambda p: p["metadata"].setdefault("annotations", {})),
                                        "example.com/x", "y"), LEADING_POD),
        "may change only the label"),
    "its own Pod's spec (an image)": (
        own_pod_request(changed(LEADING_POD, lambda p: p["spec"]["containers"][0].update(image="evil:1")),
                        EXTENDER_POD),
        "may change only the label"),
    "its own Pod's owner": (
        own_pod_request(changed(LEADING_POD, lambda p: p["metadata"].pop("ownerReferences")), EXTENDER_POD),
        "may change only the label"),
    "a finalizer on its own Pod": (
        own_pod_request(changed(LEADING_POD, lambda p: p["metadata"].update(finalizers=["example.com/keep"])),
                        EXTENDER_POD),
        "may change only the label"),
    "its own Pod's status": (
        own_pod_request(changed(EXTENDER_POD, lambda p: p["status"].update(phase="Failed")), EXTENDER_POD,
                        sub_resource="status"),
        "not by UPDATE on pods/status"),
}


@pytest.mark.parametrize("case", list(OWN_LABEL_ALLOWED))
def test_extender_policy_lets_the_extender_label_only_its_own_pod(case: str) -> None:
    request = OWN_LABEL_ALLOWED[case]
    verdict = EXTENDER_WRITES.admit(request)
    assert verdict.applies and verdict.allowed, verdict.messages
    assert BIND.admit(request).allowed, "the bind-annotation policy has no say over a label"


@pytest.mark.parametrize("case", list(OWN_LABEL_DENIED))
def test_extender_policy_denies_any_other_change_of_a_pod_by_the_extender(case: str) -> None:
    request, expected = OWN_LABEL_DENIED[case]
    assert_denied(EXTENDER_WRITES, request, [expected])


def test_the_policy_and_the_service_name_the_extenders_leader_label() -> None:
    (label,) = [v["expression"] for v in EXTENDER_POLICY["spec"]["variables"] if v["name"] == "leaderLabel"]
    assert label == "variables.prefix + 'leader'"
    assert KEYS.leader == policy_variable(EXTENDER_POLICY, "prefix") + "leader"
    assert EXTENDER_SERVICE["spec"]["selector"][KEYS.leader] == "true"


def test_extender_policy_matches_every_pod_write_and_denies() -> None:
    spec = EXTENDER_POLICY["spec"]
    assert spec["failurePolicy"] == "Fail"
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert (rule["apiGroups"], rule["apiVersions"]) == ([""], ["v1"])
    assert sorted(rule["operations"]) == ["CREATE", "DELETE", "UPDATE"]
    assert sorted(rule["resources"]) == ["bindings", "pods", "pods/*"]
    assert all(validation["reason"] == "Forbidden" for validation in spec["validations"])
    assert EXTENDER_POLICY_BINDING["spec"] == {"policyName": EXTENDER_POLICY["metadata"]["name"],
                                               "validationActions": ["Deny"]}
    # The same keys as the policy that keeps them the extender's, and the extender's own prefix.
    assert policy_variable(EXTENDER_POLICY, "prefix") == KEYS.prefix + "/"
    (keys,) = [v["expression"] for v in spec["variables"] if v["name"] == "keys"]
    (bind_keys,) = [v["expression"] for v in BIND_POLICY["spec"]["variables"] if v["name"] == "keys"]
    assert keys == bind_keys


def test_extender_policy_concerns_only_the_extenders_service_account() -> None:
    # The user is the ServiceAccount the Deployment runs as.
    account = EXTENDER["spec"]["template"]["spec"]["serviceAccountName"]
    assert EXTENDER_USER == f"system:serviceaccount:{EXTENDER['metadata']['namespace']}:{account}"
    for user in (USER, "system:kube-scheduler", REPLICASET_CONTROLLER, KUBELET, f"{EXTENDER_USER}x",
                 "system:serviceaccount:other:gpu-topology-extender"):
        request = pod_request("UPDATE", with_annotation(PENDING_POD, "example.com/x", "y"), PENDING_POD, user=user)
        assert not EXTENDER_WRITES.admit(request).applies, user


@pytest.mark.parametrize("case", list(EXTENDER_ALLOWED))
def test_extender_policy_allows_the_extenders_binding(case: str) -> None:
    verdict = EXTENDER_WRITES.admit(EXTENDER_ALLOWED[case])
    assert verdict.applies and verdict.allowed, verdict.messages
    # And the bind-annotation policy lets the same Binding through (it exempts exactly this request).
    assert BIND.admit(EXTENDER_ALLOWED[case]).allowed


@pytest.mark.parametrize("case", list(EXTENDER_DENIED))
def test_extender_policy_denies_every_other_write_of_the_extender(case: str) -> None:
    request, expected = EXTENDER_DENIED[case]
    assert_denied(EXTENDER_WRITES, request, [expected])


# ---------------------------------------------------------------------------------------------------------------
# scheduler-name-policy.yaml: GPU pods of opted-in namespaces sent to our scheduler
# ---------------------------------------------------------------------------------------------------------------

SCHEDULER_NAME_POLICY = obj("MutatingAdmissionPolicy", "gpu-topology-scheduler-name")
OPT_IN_LABEL = {"gpu-topology.io/scheduler": "enabled"}


def gpu_pod_spec(*, limits: int = 0, requests: int = 0, init: int = 0, scheduler: str | None = None) -> Doc:
    """A pod's spec as admission sees it on CREATE (schedulerName defaulted when the pod names none)."""
    resources: Doc = {}
    if limits:
        resources["limits"] = {GPU: str(limits), "cpu": "1"}
    if requests:
        resources["requests"] = {GPU: str(requests)}
    spec: Doc = {"containers": [{"name": "main", "image": "x", **({"resources": resources} if resources else {})}],
                 "schedulerName": scheduler or "default-scheduler"}
    if init:
        spec["initContainers"] = [{"name": "init", "image": "x", "resources": {"limits": {GPU: str(init)}}}]
    return spec


SCHEDULER_NAME_CASES: dict[str, tuple[Doc, bool]] = {
    "a GPU limit": (gpu_pod_spec(limits=2), True),
    "a GPU request only": (gpu_pod_spec(requests=1), True),
    "an init container's GPU": (gpu_pod_spec(init=1), True),
    "default-scheduler named": (gpu_pod_spec(limits=1, scheduler="default-scheduler"), True),
    "no scheduler at all (not defaulted)": ({k: v for k, v in gpu_pod_spec(limits=1).items()
                                            if k != "schedulerName"}, True),
    "no GPU": (gpu_pod_spec(), False),
    "a gang member naming the groups profile": (gpu_pod_spec(limits=8, scheduler=GROUPS_PROFILE), False),
    "another scheduler": (gpu_pod_spec(limits=1, scheduler="volcano"), False),
    "another resource only": ({"containers": [{"name": "m", "image": "x",
                                               "resources": {"limits": {"amd.com/gpu": "1"}}}]}, False),
}


@pytest.mark.parametrize("case", list(SCHEDULER_NAME_CASES))
def test_the_scheduler_name_policy_selects_gpu_pods_that_name_no_other_scheduler(case: str) -> None:
    spec, selected = SCHEDULER_NAME_CASES[case]
    activation = {"object": celpy.json_to_cel({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                                               "spec": spec})}
    results = {c["name"]: program(c["expression"]).evaluate(activation)
               for c in SCHEDULER_NAME_POLICY["spec"]["matchConditions"]}
    assert all(isinstance(r, celtypes.BoolType) for r in results.values()), results
    assert all(results.values()) is selected, results


def test_the_scheduler_name_policy_sets_our_profile_on_created_pods_of_opted_in_namespaces() -> None:
    spec = SCHEDULER_NAME_POLICY["spec"]
    constraints = spec["matchConstraints"]
    assert constraints["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                             "resources": ["pods"], "scope": "*"}]
    assert constraints["namespaceSelector"] == {"matchLabels": OPT_IN_LABEL}
    for _, expression in [(c["name"], c["expression"]) for c in spec["matchConditions"]]:
        assert not non_portable_calls(expression)
    # The resource it looks for is the extender's.
    assert f"'{flag_values(container(EXTENDER)['args'][1:])['--gpu-resource']}'" in spec["matchConditions"][1][
        "expression"]
    (mutation,) = spec["mutations"]
    assert mutation["patchType"] == "JSONPatch"
    assert " ".join(mutation["jsonPatch"]["expression"].split()) == (
        f"[JSONPatch{{op: 'add', path: '/spec/schedulerName', value: '{GPU_PROFILE}'}}]")
    (profile,) = [p for p in scheduler_config(SECONDARY_CONFIG)["profiles"] if p["schedulerName"] == GPU_PROFILE]
    assert obj("MutatingAdmissionPolicyBinding", "gpu-topology-scheduler-name")["spec"] == {
        "policyName": SCHEDULER_NAME_POLICY["metadata"]["name"]}


# ---------------------------------------------------------------------------------------------------------------
# cert-manager (structure only: kubernetes-validate has no schema for these CRDs)
# ---------------------------------------------------------------------------------------------------------------

CERT_MANAGER = [doc for _, doc in _docs(CERT_MANAGER_GROUP)]
ISSUERS = {doc["metadata"]["name"]: doc for doc in CERT_MANAGER if doc["kind"] in {"Issuer", "ClusterIssuer"}}
# cert-manager's cluster resource namespace: where a ClusterIssuer reads its CA Secret (its default).
CA_NAMESPACE = "cert-manager"
# The client names the extender accepts (--client-name), and the one kube-scheduler's certificate carries.
CLIENT_NAMES = repeated_flag(container(EXTENDER)["args"], "--client-name")
KUBE_SCHEDULER_NAME = "kube-scheduler"
CERTIFICATES = {doc["spec"]["secretName"]: doc for doc in CERT_MANAGER if doc["kind"] == "Certificate"}
# cert-manager.io/v1 fields, to catch typos; the CRD's own schema is not available here.
_CERTIFICATE_SPEC_FIELDS = {
    "secretName", "secretTemplate", "commonName", "dnsNames", "ipAddresses", "uris", "emailAddresses",
    "duration", "renewBefore", "renewBeforePercentage", "subject", "literalSubject", "isCA", "usages",
    "privateKey", "issuerRef", "keystores", "encodeUsagesInRequest", "revisionHistoryLimit",
    "additionalOutputFormats", "nameConstraints", "otherNames", "signatureAlgorithm",
}
_KEY_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any", "server auth",
    "client auth", "code signing", "email protection", "s/mime", "ipsec end system", "ipsec tunnel",
    "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
}


def test_cert_manager_resources_are_well_formed() -> None:
    for doc in CERT_MANAGER:
        assert doc["apiVersion"] == "cert-manager.io/v1"
        assert doc["kind"] in {"Issuer", "ClusterIssuer", "Certificate"}
        assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
        assert doc["metadata"]["name"]
        assert ("namespace" in doc["metadata"]) is (doc["kind"] != "ClusterIssuer")
    for issuer in ISSUERS.values():
        (kind,) = issuer["spec"]  # exactly one issuer type
        assert kind in {"selfSigned", "ca"}
        if kind == "ca":
            # A CA issuer reads its Secret in its own namespace; a ClusterIssuer in cert-manager's.
            namespace = issuer["metadata"].get("namespace", CA_NAMESPACE)
            (ca,) = [c for c in CERTIFICATES.values() if c["spec"]["secretName"] == issuer["spec"]["ca"]["secretName"]
                     and c["metadata"]["namespace"] == namespace]
            assert ca["spec"]["isCA"] is True
    for certificate in CERTIFICATES.values():
        spec = certificate["spec"]
        assert set(spec) <= _CERTIFICATE_SPEC_FIELDS, set(spec) - _CERTIFICATE_SPEC_FIELDS
        assert spec["secretName"]
        issuer = ISSUERS[spec["issuerRef"]["name"]]
        assert spec["issuerRef"] == {"group": "cert-manager.io", "kind": issuer["kind"],
                                     "name": issuer["metadata"]["name"]}
        if issuer["kind"] == "Issuer":  # a namespaced Issuer serves its own namespace only
            assert issuer["metadata"]["namespace"] == certificate["metadata"]["namespace"]
        assert set(spec.get("usages", [])) <= _KEY_USAGES
        assert spec["privateKey"]["algorithm"] in {"RSA", "ECDSA", "Ed25519"}
        if "renewBefore" in spec:
            assert 0 < parse_go_duration(spec["renewBefore"]) < parse_go_duration(spec["duration"])


def test_cert_manager_issues_the_secrets_the_deployments_mount() -> None:
    extender = CERTIFICATES[EXTENDER_TLS_SECRET]["spec"]
    host = EXPECTED_URL.removeprefix("https://").rsplit(":", 1)[0]
    assert host in extender["dnsNames"]
    # Serving, and client usage for the probes that call the extender's own mTLS port.
    assert {"server auth", "client auth"} <= set(extender["usages"])
    client = CERTIFICATES[SCHEDULER_TLS_SECRET]["spec"]
    assert "client auth" in client["usages"] and "server auth" not in client["usages"]
    # Both leaves come from the one CA that both sides trust (ca.crt in each Secret).
    assert extender["issuerRef"]["name"] == client["issuerRef"]["name"]
    assert "ca" in ISSUERS[extender["issuerRef"]["name"]]["spec"]


def test_the_extender_accepts_only_kube_schedulers_certificate_and_its_own() -> None:
    # Pinned by name: kube-scheduler's client certificate, and the extender's own for its probes.
    assert "--client-ca" in flag_values(container(EXTENDER)["args"][1:])
    assert sorted(CLIENT_NAMES) == sorted([KUBE_SCHEDULER_NAME,
                                           CERTIFICATES[EXTENDER_TLS_SECRET]["spec"]["commonName"]])
    assert CERTIFICATES[SCHEDULER_TLS_SECRET]["spec"]["commonName"] == KUBE_SCHEDULER_NAME
    assert "dnsNames" not in CERTIFICATES[SCHEDULER_TLS_SECRET]["spec"]
    # No other certificate of the CA carries a pinned name.
    for secret, certificate in CERTIFICATES.items():
        if secret not in {EXTENDER_TLS_SECRET, SCHEDULER_TLS_SECRET}:
            names = {certificate["spec"].get("commonName"), *certificate["spec"].get("dnsNames", [])}
            assert not names & set(CLIENT_NAMES), secret


def test_the_ca_key_stays_out_of_the_extenders_namespace() -> None:
    (ca,) = [c for c in CERTIFICATES.values() if c["spec"].get("isCA")]
    assert ca["metadata"]["namespace"] == CA_NAMESPACE != NAMESPACE
    # The leaves are signed by a ClusterIssuer that reads the CA Secret where it is, in cert-manager's namespace.
    for secret in (EXTENDER_TLS_SECRET, SCHEDULER_TLS_SECRET):
        leaf = CERTIFICATES[secret]
        assert leaf["metadata"]["namespace"] == NAMESPACE
        issuer = ISSUERS[leaf["spec"]["issuerRef"]["name"]]
        assert issuer["kind"] == "ClusterIssuer" and issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    # The self-signed issuer that made the CA cannot be used from any other namespace.
    self_signed = ISSUERS[ca["spec"]["issuerRef"]["name"]]
    assert self_signed["kind"] == "Issuer" and self_signed["metadata"]["namespace"] == CA_NAMESPACE
    # The Deployments mount the leaf Secrets only.
    mounted = {v["secret"]["secretName"] for d in (EXTENDER, SCHEDULER)
               for v in d["spec"]["template"]["spec"]["volumes"]
               if "secret" in v}
    assert ca["spec"]["secretName"] not in mounted


CA_POLICY = AdmissionPolicy(obj("ValidatingAdmissionPolicy", "gpu-topology-ca-issuer-namespace"))


def certificate_request(namespace: str, issuer_ref: Doc, *, kind: str = "Certificate") -> Doc:
    """An AdmissionRequest that creates a cert-manager Certificate or CertificateRequest naming an issuer."""
    resource = {"Certificate": "certificates", "CertificateRequest": "certificaterequests"}[kind]
    version = {"group": "cert-manager.io", "version": "v1"}
    new = {"apiVersion": "cert-manager.io/v1", "kind": kind, "metadata": {"name": "x", "namespace": namespace},
           "spec": {"issuerRef": issuer_ref, "commonName": KUBE_SCHEDULER_NAME, "secretName": "x"}}
    return {"uid": "1", "kind": {**version, "kind": kind}, "resource": {**version, "resource": resource},
            "name": "x", "namespace": namespace, "operation": "CREATE",
            "userInfo": {"username": USER, "groups": ["system:authenticated"]}, "object": new, "oldObject": None}


OUR_CA = {"group": "cert-manager.io", "kind": "ClusterIssuer", "name": "gpu-topology-ca"}


@pytest.mark.parametrize(("namespace", "issuer_ref", "kind", "allowed"), [
    (NAMESPACE, OUR_CA, "Certificate", True),
    (NAMESPACE, OUR_CA, "CertificateRequest", True),
    (NAMESPACE, {"kind": "ClusterIssuer", "name": "gpu-topology-ca"}, "Certificate", True),
    ("ml", OUR_CA, "Certificate", False),
    ("ml", OUR_CA, "CertificateRequest", False),
    ("ml", {"kind": "ClusterIssuer", "name": "gpu-topology-ca"}, "CertificateRequest", False),  # group defaulted
    ("ml", {"name": "gpu-topology-ca"}, "Certificate", None),  # a namespaced Issuer of that name in "ml": not ours
    ("ml", {"kind": "ClusterIssuer", "name": "letsencrypt"}, "Certificate", None),
    ("ml", {**OUR_CA, "group": "other.example.com"}, "Certificate", None),
])
def test_only_the_extenders_namespace_may_have_the_ca_sign(namespace: str, issuer_ref: Doc, kind: str,
                                                           allowed: bool | None) -> None:
    verdict = CA_POLICY.admit(certificate_request(namespace, issuer_ref, kind=kind))
    if allowed is None:
        assert not verdict.applies
    else:
        assert verdict.applies and verdict.allowed is allowed, verdict.messages
        assert not [m for m in verdict.messages if m.startswith("evaluation error")], verdict.messages


# ---------------------------------------------------------------------------------------------------------------
# Alerts (prometheus-rule.yaml): PromQL that parses, on metrics the extender exports
# ---------------------------------------------------------------------------------------------------------------

(PROMETHEUS_RULE,) = [doc for _, doc in _docs(MONITORING_GROUP) if doc["kind"] == "PrometheusRule"]
(POD_MONITOR,) = [doc for _, doc in _docs(MONITORING_GROUP) if doc["kind"] == "PodMonitor"]
METRICS_SERVICE = obj("Service", "gpu-topology-extender-metrics", NAMESPACE)
ALERTS = [rule for group in PROMETHEUS_RULE["spec"]["groups"] for rule in group["rules"]]


def test_prometheus_rule_is_well_formed() -> None:
    assert PROMETHEUS_RULE["apiVersion"] == "monitoring.coreos.com/v1"
    assert PROMETHEUS_RULE["metadata"]["namespace"] == NAMESPACE
    names = [rule["alert"] for rule in ALERTS]
    assert len(names) == len(set(names)) and all(name.startswith("GPUTopologyExtender") for name in names)
    for rule in ALERTS:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}
        assert {"summary", "description"} <= set(rule["annotations"])
        if "for" in rule:
            assert parse_go_duration(rule["for"]) > 0


def certificate_series() -> frozenset[str]:
    """The series the extender's certificate watch exports (extender/server/certificates.py), beside Metrics'."""
    from prometheus_client import CollectorRegistry

    from extender.server.certificates import Certificates

    registry = CollectorRegistry()
    Certificates((), registry)
    suffix = {"counter": "_total", "gauge": ""}
    return frozenset(family.name + suffix[family.type] for family in registry.collect())


@pytest.mark.parametrize("rule", ALERTS, ids=[rule["alert"] for rule in ALERTS])
def test_alert_parses_and_names_only_metrics_the_extender_exports(rule: Doc) -> None:
    named = set(re.findall(r"\bgpu_topology_extender_\w+", rule["expr"]))
    certificates = named & certificate_series()
    if certificates:  # exported by the server's certificate watch, not by Metrics
        promql_parser.parse(rule["expr"])
        assert named == certificates, named
    else:
        assert_promql_on_exported_metrics(rule["expr"])


def test_the_certificate_alert_fires_two_weeks_before_either_certificate_expires() -> None:
    (rule,) = [r for r in ALERTS if r["alert"] == "GPUTopologyExtenderCertificateExpiresSoon"]
    expr = " ".join(rule["expr"].split())
    assert expr == ("min by (certificate) (gpu_topology_extender_certificate_expiry_timestamp_seconds) - time() "
                    "< 14 * 24 * 3600")
    # cert-manager renews a month early (cert-manager.yaml): two weeks left means a renewal did not happen.
    renew_before = {parse_go_duration(CERTIFICATES[s]["spec"]["renewBefore"]) for s in (EXTENDER_TLS_SECRET,
                                                                                          SCHEDULER_TLS_SECRET)}
    assert all(before > 14 * 24 * 3600 for before in renew_before), renew_before
    from extender.server.certificates import CLIENT_CA, SERVING

    assert {SERVING, CLIENT_CA} == {"serving", "client-ca"}  # the label's values the summary names


def test_the_alerts_cover_the_failures_readme_operating_names() -> None:
    # README.md, "Operating": no leader, two leaders, slowness, refused nodes, stale nodes, refused requests.
    covered = " ".join(rule["expr"] for rule in ALERTS)
    for metric in ("gpu_topology_extender_leader", "gpu_topology_extender_request_seconds_bucket",
                   "gpu_topology_extender_nodes_refused", "gpu_topology_extender_stale_nodes",
                   "gpu_topology_extender_requests_refused_total", "gpu_topology_extender_decisions_total",
                   "gpu_topology_extender_certificate_expiry_timestamp_seconds"):
        assert metric in covered, metric


# ---------------------------------------------------------------------------------------------------------------
# The Dockerfile (read, not built: there is no Docker daemon here)
# ---------------------------------------------------------------------------------------------------------------

DOCKERFILE = ROOT / "Dockerfile"


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    logical, pending = [], ""
    for line in text.splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        logical.append(pending + stripped)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in logical]


INSTRUCTIONS = dockerfile_instructions(DOCKERFILE.read_text())
FINAL_STAGE = INSTRUCTIONS[max(i for i, (op, _) in enumerate(INSTRUCTIONS) if op == "FROM"):]


def _final(op: str) -> list[str]:
    return [arg for name, arg in FINAL_STAGE if name == op]


def test_dockerfile_builds_from_python_311_slim_and_installs_the_package() -> None:
    bases = [arg.split()[0] for op, arg in INSTRUCTIONS if op == "FROM"]
    assert bases and all(base == "python:3.11-slim" for base in bases)
    runs = [arg for op, arg in INSTRUCTIONS if op == "RUN"]
    assert any(re.search(r"pip install(\s+-\S+)*\s+\.(\s|$)", run) for run in runs), runs


def test_dockerfile_copies_everything_the_package_build_needs() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {PurePosixPath(src).as_posix() for op, arg in INSTRUCTIONS if op == "COPY" and "--from" not in arg
              for src in arg.split()[:-1]}
    packages = {package.split(".")[0] for package in pyproject["tool"]["setuptools"]["packages"]}
    needed = {"pyproject.toml", pyproject["project"]["readme"], *packages}
    assert needed <= copied, needed - copied
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert not needed & ignored
    assert {".git", ".venv", "scheduler-config"} <= ignored


def test_dockerfile_runs_as_a_numeric_non_root_user_on_the_extenders_ports() -> None:
    (user,) = _final("USER")
    uid = user.split(":")[0]
    assert uid.isdigit() and int(uid) > 0
    assert EXTENDER["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)
    assert _final("EXPOSE") == [" ".join(str(p["containerPort"]) for p in container(EXTENDER)["ports"])]
    (entrypoint,) = _final("ENTRYPOINT")
    assert yaml.safe_load(entrypoint) == ["gpu-topology-extender"]  # exec form, a JSON list


def test_dockerfile_entrypoint_is_the_packages_console_script() -> None:
    """The image runs the command that `pip install .` makes of pyproject's console script: the extender's main."""
    (entrypoint,) = _final("ENTRYPOINT")
    (command,) = yaml.safe_load(entrypoint)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command in scripts, f"pyproject.toml declares no console script {command}"
    module, function = scripts[command].split(":")
    assert module.split(".")[0] == "extender" and callable(getattr(importlib.import_module(module), function))


# ---------------------------------------------------------------------------------------------------------------
# make-certs.sh, and the mTLS design run for real on loopback
# ---------------------------------------------------------------------------------------------------------------

MAKE_CERTS = CONFIG / "make-certs.sh"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    required("openssl", "bash")
    out = tmp_path_factory.mktemp("certs") / "out"
    result = subprocess.run(
        ["bash", str(MAKE_CERTS), str(out)], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def secret_files(printed: str, secret: str) -> dict[str, Path]:
    """The key → file mapping of the `kubectl create secret` command that make-certs.sh printed for `secret`."""
    command = re.search(rf"create secret generic {secret} .*?(?=\n\S|\Z)", printed, re.DOTALL)
    assert command, printed
    assert f"-n {NAMESPACE} create secret generic {secret} --type=kubernetes.io/tls" in printed
    return {key: Path(path) for key, path in re.findall(r"--from-file=([\w.]+)=(\S+)", command[0])}


def test_make_certs_prints_the_secrets_the_deployments_mount(certs: tuple[Path, str]) -> None:
    out, printed = certs
    for secret in (EXTENDER_TLS_SECRET, SCHEDULER_TLS_SECRET):
        files = secret_files(printed, secret)
        assert set(files) == TLS_KEYS
        assert all(path.is_file() for path in files.values())
    for key in out.glob("*.key"):
        assert key.stat().st_mode & 0o077 == 0, key
    verify = subprocess.run(
        ["openssl", "verify", "-x509_strict", "-CAfile", str(out / "ca.crt"),
         str(out / "extender.crt"), str(out / "scheduler-client.crt")],
        check=False, capture_output=True, text=True, timeout=30,
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # kube-scheduler's certificate carries the name the extender pins; the CA key goes into no Secret.
    assert certificate_subject(secret_files(printed, SCHEDULER_TLS_SECRET)["tls.crt"]) == f"CN={KUBE_SCHEDULER_NAME}"
    commands = printed.split("Create the Secrets", 1)[1]  # every kubectl and install command it prints
    assert "kubectl" in commands and "ca.crt" in commands and "ca.key" not in commands


def certificate_subject(path: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-in", str(path), "-noout", "-subject", "-nameopt", "RFC2253"],
                         check=True, capture_output=True, text=True, timeout=30).stdout
    return out.strip().removeprefix("subject=")


def seal_secret_files(printed: str) -> dict[str, Path]:
    """The key → file mapping of the seal Secret's `kubectl create secret` command that make-certs.sh printed."""
    command = re.search(rf"create secret generic {SEAL_SECRET} .*?(?=\n\S|\Z)", printed, re.DOTALL)
    assert command, printed
    return {key: Path(path) for key, path in re.findall(r"--from-file=([\w.]+)=(\S+)", command[0])}


def test_make_certs_makes_the_seal_key_the_extender_mounts(certs: tuple[Path, str]) -> None:
    _, printed = certs
    files = seal_secret_files(printed)
    assert set(files) == {SEAL_KEY}
    key = files[SEAL_KEY]
    # 32 random bytes as 64 hex digits (whitespace-proof: the extender strips the file), readable by its owner only.
    assert re.fullmatch(r"[0-9a-f]{64}\n", key.read_text())
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    # The extender accepts it (extender/cache/seal.py: at least 16 bytes).
    from extender.cache.seal import Seal

    seal = Seal.from_file(key)
    assert seal.verify(seal.sign("uid", "node", "GPU-a", "c=GPU-a"), "uid", "node", "GPU-a", "c=GPU-a")


def certificate_fields(path: Path) -> tuple[str, str, str]:
    """(subject, SANs and usages, public key) of a certificate: what a renewal keeps, and what it changes."""
    def openssl(*args: str) -> str:
        return subprocess.run(["openssl", *args], check=True, capture_output=True, text=True, timeout=30).stdout
    names = openssl("x509", "-in", str(path), "-noout", "-ext", "subjectAltName,extendedKeyUsage,keyUsage")
    return certificate_subject(path), names, openssl("x509", "-in", str(path), "-noout", "-pubkey")


def make_certs(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(MAKE_CERTS), *args], check=False, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def test_make_certs_renews_both_leaves_with_the_kept_ca(tmp_path: Path) -> None:
    required("openssl", "bash")
    out = tmp_path / "out"
    assert make_certs(str(out)).returncode == 0
    kept = {name: (out / name).read_bytes() for name in ("ca.crt", "ca.key", "seal.key")}
    leaves = {leaf: certificate_fields(out / f"{leaf}.crt") for leaf in ("extender", "scheduler-client")}
    renewed = make_certs("--renew", str(out))
    assert renewed.returncode == 0, renewed.stderr
    # The CA and the seal key as they were; each leaf the same names and usages with a new key, from the same CA.
    assert {name: (out / name).read_bytes() for name in kept} == kept
    for leaf, (subject, names, public_key) in leaves.items():
        assert certificate_fields(out / f"{leaf}.crt")[:2] == (subject, names)
        assert certificate_fields(out / f"{leaf}.crt")[2] != public_key
    verify = subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", str(out / "ca.crt"),
                             str(out / "extender.crt"), str(out / "scheduler-client.crt")],
                            check=False, capture_output=True, text=True, timeout=30)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert all(key.stat().st_mode & 0o077 == 0 for key in out.glob("*.key"))
    # It prints the two TLS Secrets, replaced in place with the same keys; no seal Secret, no CA key.
    printed = renewed.stdout
    for secret, leaf in ((EXTENDER_TLS_SECRET, "extender"), (SCHEDULER_TLS_SECRET, "scheduler-client")):
        assert secret_files(printed, secret) == {"tls.crt": out / f"{leaf}.crt", "tls.key": out / f"{leaf}.key",
                                                 "ca.crt": out / "ca.crt"}
    assert printed.count("--dry-run=client -o yaml | kubectl replace -f -") == 2
    assert SEAL_SECRET not in printed and "ca.key" not in printed.split("Replace the two TLS Secrets", 1)[1]


@pytest.mark.parametrize("case", ["no CA", "another CA's key", "a CA that expires first"])
def test_make_certs_refuses_to_renew_without_a_sound_ca(tmp_path: Path, case: str) -> None:
    required("openssl", "bash")
    out, other = tmp_path / "out", tmp_path / "other"
    assert make_certs(str(out)).returncode == 0
    env = {}
    if case == "no CA":
        (out / "ca.key").unlink()
    elif case == "another CA's key":
        assert make_certs(str(other)).returncode == 0
        (out / "ca.key").write_bytes((other / "ca.key").read_bytes())
    else:
        env["DAYS"] = str(3651)  # the CA lasts ten years from the first run
    before = (out / "extender.crt").read_bytes()
    refused = make_certs("--renew", str(out), env=env)
    assert refused.returncode == 2 and refused.stderr.startswith("make-certs.sh: "), refused.stderr
    assert (out / "extender.crt").read_bytes() == before


FAKE_KUBECTL = """#!/usr/bin/env bash
# Records each call; `get secret` succeeds once a Secret was created; `create secret generic` keeps its key file.
echo "$*" >> "$STATE/calls"
case " $* " in
  *" get secret "*) [[ -e "$STATE/secret" ]] ;;
  *" create secret generic "*)
    [[ -e "$STATE/secret" ]] && { echo "AlreadyExists" >&2; exit 1; }
    for arg in "$@"; do [[ "$arg" == --from-file=key=* ]] && cp "${arg#--from-file=key=}" "$STATE/secret"; done ;;
  *) exit 3 ;;
esac
"""


def run_with_fake_kubectl(command: str, tmp_path: Path) -> tuple[list[str], str | None]:
    """Run a shell command against a kubectl stand-in: the kubectl calls it made, and the seal Secret's content."""
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL)
    kubectl.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STATE": str(state)}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", command], env=env, check=False, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    calls = (state / "calls").read_text().splitlines()
    secret = state / "secret"
    return calls, secret.read_text() if secret.exists() else None


def seal_command_of_make_certs(printed: str) -> str:
    """The printed shell command that creates the seal Secret: its first line and the lines it continues on."""
    lines = printed.splitlines()
    first = f"kubectl -n {NAMESPACE} get secret {SEAL_SECRET} "
    (start,) = [i for i, line in enumerate(lines) if line.startswith(first)]
    end = start
    while lines[end].endswith("\\"):
        end += 1
    return "\n".join(lines[start:end + 1])


def test_the_seal_secret_is_created_only_if_it_does_not_exist(certs: tuple[Path, str], tmp_path: Path) -> None:
    out, printed = certs
    command = seal_command_of_make_certs(printed)
    calls, secret = run_with_fake_kubectl(command, tmp_path)
    assert calls == [f"-n {NAMESPACE} get secret {SEAL_SECRET}",
                     f"-n {NAMESPACE} create secret generic {SEAL_SECRET} --from-file={SEAL_KEY}={out}/seal.key"]
    assert secret == (out / "seal.key").read_text()
    # Run again (a second make-certs.sh, a second install): the existing key stays.
    calls, again = run_with_fake_kubectl(command, tmp_path)
    assert calls[2:] == [f"-n {NAMESPACE} get secret {SEAL_SECRET}"]
    assert again == secret


def test_the_cert_manager_path_documents_the_same_seal_secret(tmp_path: Path) -> None:
    # cert-manager issues no random keys: cert-manager.yaml's header carries the one command, which is run here.
    lines = [line[len("#   "):] if line.startswith("#   ") else line[len("#     "):]
             for line in (CONFIG / "cert-manager.yaml").read_text().splitlines()
             if line.startswith(("#   kubectl", "#     "))]
    command = "\n".join(lines)
    assert f"create secret generic {SEAL_SECRET} --from-file={SEAL_KEY}=" in command
    calls, secret = run_with_fake_kubectl(command, tmp_path)
    assert calls[0] == f"-n {NAMESPACE} get secret {SEAL_SECRET}"
    assert calls[1].startswith(f"-n {NAMESPACE} create secret generic {SEAL_SECRET} --from-file={SEAL_KEY}=")
    assert secret is not None and re.fullmatch(r"[0-9a-f]{64}\n", secret)
    temporary = Path(calls[1].rsplit("=", 1)[1])
    assert not temporary.exists()  # the key file is removed again
    calls, again = run_with_fake_kubectl(command, tmp_path)
    assert calls[2:] == [f"-n {NAMESPACE} get secret {SEAL_SECRET}"] and again == secret


def test_make_certs_refuses_a_git_work_tree(tmp_path: Path) -> None:
    required("openssl", "git")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    result = subprocess.run(
        ["bash", str(MAKE_CERTS), str(tmp_path / "certs")], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "git work tree" in result.stderr
    assert not list((tmp_path / "certs").glob("*"))


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"/healthz": 200, "/readyz": 503}.get(self.path, 404)
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def mtls_server(certs: tuple[Path, str]) -> Iterator[int]:
    """A stand-in for the extender's HTTPS port with --client-ca: uvicorn's settings, ssl.CERT_REQUIRED."""
    _, printed = certs
    files = secret_files(printed, EXTENDER_TLS_SECRET)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(files["tls.crt"], files["tls.key"])
    context.load_verify_locations(files["ca.crt"])
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _get(port: int, context: ssl.SSLContext, server_name: str, path: str, body: bytes | None = None) -> int:
    """GET (POST with a body) over TLS to 127.0.0.1, checking the certificate for `server_name` (the urlPrefix
    host): the status."""
    connection = HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    raw = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection.sock = context.wrap_socket(raw, server_hostname=server_name)
    try:
        if body is None:
            connection.request("GET", path)
        else:
            connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        return connection.getresponse().status
    finally:
        connection.close()


def test_kube_scheduler_reaches_the_extender_with_mtls(certs: tuple[Path, str], mtls_server: int) -> None:
    _, printed = certs
    files = secret_files(printed, SCHEDULER_TLS_SECRET)
    (extender,) = scheduler_config(SECONDARY_CONFIG)["extenders"]
    host = extender["urlPrefix"].removeprefix("https://").rsplit(":", 1)[0]
    # As kube-scheduler does: verify the server against caFile for the urlPrefix host, present certFile/keyFile.
    context = ssl.create_default_context(cafile=str(files["ca.crt"]))
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    context.load_cert_chain(files["tls.crt"], files["tls.key"])
    assert _get(mtls_server, context, host, "/healthz") == 200
    # Without a client certificate the extender's port refuses the connection.
    anonymous = ssl.create_default_context(cafile=str(files["ca.crt"]))
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _get(mtls_server, anonymous, host, "/healthz")


def test_the_extenders_probe_passes_mtls_and_reads_the_status(certs: tuple[Path, str], mtls_server: int) -> None:
    _, printed = certs
    files = secret_files(printed, EXTENDER_TLS_SECRET)
    tls_dir = volume_mount_for_secret(EXTENDER, EXTENDER_TLS_SECRET)
    command = container(EXTENDER)["livenessProbe"]["exec"]["command"]
    script = command[2].replace('127.0.0.1", 8443', f'127.0.0.1", {mtls_server}')
    for key, path in files.items():
        script = script.replace(f'"{tls_dir}/{key}"', repr(str(path)))
    run = [sys.executable, "-c", script]
    assert subprocess.run([*run, "/healthz"], check=False, capture_output=True, timeout=60).returncode == 0
    assert subprocess.run([*run, "/readyz"], check=False, capture_output=True, timeout=60).returncode == 1  # a 503


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def intruder_certificate(out: Path, tmp_path: Path, name: str) -> tuple[str, str]:
    """A client certificate named `name`, signed by the CA that make-certs.sh wrote to `out`: (cert, key)."""
    key, csr, cert = tmp_path / "intruder.key", tmp_path / "intruder.csr", tmp_path / "intruder.crt"
    extensions = tmp_path / "intruder.ext"
    extensions.write_text("basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
                          "extendedKeyUsage = clientAuth\n")
    for command in (
        ["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(key)],
        ["openssl", "req", "-new", "-key", str(key), "-subj", f"/CN={name}", "-out", str(csr)],
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(out / "ca.crt"), "-CAkey", str(out / "ca.key"),
         "-set_serial", "0x1234", "-days", "1", "-extfile", str(extensions), "-out", str(cert)],
    ):
        subprocess.run(command, check=True, capture_output=True, timeout=30)
    return str(cert), str(key)


def test_the_real_extender_runs_the_deployments_command_line_with_mtls(certs: tuple[Path, str],
                                                                       tmp_path: Path) -> None:
    """The Deployment's own args, with --demo for --in-cluster, loopback for 0.0.0.0 and the files of
    make-certs.sh for the Secret, start the real server; kube-scheduler's client and the probes get in."""
    _, printed = certs
    extender_files = secret_files(printed, EXTENDER_TLS_SECRET)
    scheduler_files = secret_files(printed, SCHEDULER_TLS_SECRET)
    tls_dir = volume_mount_for_secret(EXTENDER, EXTENDER_TLS_SECRET)
    seal_dir = volume_mount_for_secret(EXTENDER, SEAL_SECRET)
    (seal_key,) = seal_secret_files(printed).values()
    port = _free_port()
    metrics_port = _free_port()
    local = {"--in-cluster": "--demo", "--host=0.0.0.0": "--host=127.0.0.1", "--port=8443": f"--port={port}",
             "--metrics-port=8890": f"--metrics-port={metrics_port}"}
    args = []
    for arg in container(EXTENDER)["args"]:
        if arg.startswith("--leader-elect"):
            # --demo has no API server to hold a Lease on (the election: tests/extender/kube/test_leader_election.py)
            continue
        arg = local.get(arg, arg)
        for key, path in extender_files.items():
            arg = arg.replace(f"{tls_dir}/{key}", str(path))
        arg = arg.replace(f"{seal_dir}/{SEAL_KEY}", str(seal_key))
        args.append(arg)
    assert "--demo" in args and f"--port={port}" in args and "--client-ca=" + str(extender_files["ca.crt"]) in args
    assert f"--seal-key-file={seal_key}" in args  # the key make-certs.sh wrote, where the Secret would be
    server = subprocess.Popen([sys.executable, "-m", "extender.cli", "--log-level", "warning", *args], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        (extender,) = scheduler_config(SECONDARY_CONFIG)["extenders"]
        host = extender["urlPrefix"].removeprefix("https://").rsplit(":", 1)[0]
        client = ssl.create_default_context(cafile=str(scheduler_files["ca.crt"]))
        client.load_cert_chain(scheduler_files["tls.crt"], scheduler_files["tls.key"])
        status = None
        for _ in range(150):  # at most ~30 s for the server to come up
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else ""
            try:
                status = _get(port, client, host, "/readyz")
                break
            except (ConnectionError, ssl.SSLError, TimeoutError, OSError):
                threading.Event().wait(0.2)
        assert status == 200
        anonymous = ssl.create_default_context(cafile=str(scheduler_files["ca.crt"]))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            _get(port, anonymous, host, "/healthz")
        # Another certificate of the same CA (the name kube-scheduler's had before it was pinned) gets nothing.
        filter_call = json.dumps({"Pod": {"metadata": {"name": "p", "namespace": "d"}}, "NodeNames": []}).encode()
        assert _get(port, client, host, "/filter", filter_call) == 200
        intruder = ssl.create_default_context(cafile=str(scheduler_files["ca.crt"]))
        intruder.load_cert_chain(*intruder_certificate(certs[0], tmp_path, "gpu-topology-scheduler"))
        try:
            assert _get(port, intruder, host, "/filter", filter_call) in {401, 403}
        except (ssl.SSLError, ConnectionError):
            pass  # refused in the handshake
        command = container(EXTENDER)["livenessProbe"]["exec"]["command"]
        script = command[2].replace('127.0.0.1", 8443', f'127.0.0.1", {port}')
        for key, path in extender_files.items():
            script = script.replace(f'"{tls_dir}/{key}"', repr(str(path)))
        for health in ("/healthz", "/readyz"):
            probe = subprocess.run([sys.executable, "-c", script, health], check=False, capture_output=True, timeout=60)
            assert probe.returncode == 0, probe.stderr
        # The metrics port, as the PodMonitor scrapes it: our CA, the Service's name, no client certificate. The
        # probes and /metrics answer; no verb does.
        scraper = ssl.create_default_context(cafile=str(extender_files["ca.crt"]))
        server_name = POD_MONITOR["spec"]["podMetricsEndpoints"][0]["tlsConfig"]["serverName"]
        for path in ("/metrics", "/healthz", "/readyz"):
            assert _get(metrics_port, scraper, server_name, path) == 200, path
        for path in ("/filter", "/prioritize", "/bind", "/preempt"):
            assert _get(metrics_port, scraper, server_name, path, filter_call) == 404, path
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def test_the_shipped_claim_templates_are_counted_by_the_extender_as_their_names_say() -> None:
    """Each template of dra-claim-templates.yaml, made into a claim as the resourceclaim controller makes it, asks
    the extender for as many GPUs as its name says (extender/cache/dra_inventory.py)."""
    inventory = DraInventory()
    templates = [doc for _, doc in _docs() if doc.get("kind") == "ResourceClaimTemplate"]
    assert [doc["metadata"]["name"] for doc in templates] == ["gpus-1", "gpus-2", "gpus-4", "gpus-8"]
    for doc in templates:
        name = doc["metadata"]["name"]
        inventory.apply_claim("ADDED", {"metadata": {"name": f"pod-{name}", "namespace": "ml", "uid": name},
                                        "spec": doc["spec"]["spec"]})
        assert inventory.requested_gpus("ml", [f"pod-{name}"]) == ClaimAsk(int(name.split("-")[1]))
