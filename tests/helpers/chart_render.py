"""What the chart tests share: the chart rendered by Helm's own engine (helm-python-sdk, Helm v4's Go SDK), the
kustomize install built in Python from scheduler-config/kustomization.yaml (no kustomize binary in CI), and the
checks every render gets: objects valid against the Kubernetes 1.36 schemas, and every name a Pod or a policy binding
refers to present in the same render.

Used by tests/manifests/chart/test_chart.py, test_chart_matches_kustomize.py, test_chart_upgrade.py and
tests/e2e/test_chart_e2e.py.
"""

from __future__ import annotations

import copy
import functools
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import yaml

from helpers.manifest_checks import CONFIG, KUBERNETES_VERSION, api_group, load_yaml
from helpers.paths import ROOT

CHART = CONFIG / "chart" / "gpu-topology-extender"
NAMESPACE = "gpu-topology-system"  # the kustomization's
RELEASE = "gpu-topology"
# The kinds of operators' CRDs: no schema in kubernetes-validate, so checked for apiVersion, kind and their
# required fields only (check_custom_resource).
CUSTOM_KINDS = {
    "monitoring.coreos.com": {"PrometheusRule": ("groups",), "PodMonitor": ("selector", "podMetricsEndpoints")},
    "cert-manager.io": {"Issuer": (), "ClusterIssuer": (), "Certificate": ("secretName", "issuerRef")},
}
# Helm's own labels on every object (templates/_helpers.tpl, gte.labels): the only labels kustomize does not set.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"}
# What the kustomize install amounts to in values: certificates and the seal key made beforehand (make-certs.sh).
KUSTOMIZE_VALUES: dict[str, Any] = {"tls": {"mode": "existingSecrets"}, "seal": {"existingSecret": "gpu-topology-seal"},
                                    "agent": {"mode": "deliver"}, "scheduler": {"mode": "secondary"}}

Doc = dict[str, Any]

helm_python.disable_logging()


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@functools.cache
def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def parse(manifests: Mapping[str, str]) -> list[Doc]:
    """The objects of a render (template path -> text), NOTES.txt left out."""
    return [doc for path, text in sorted(manifests.items()) if not path.endswith("NOTES.txt")
            for doc in yaml.safe_load_all(text) if doc]


def render(values: Mapping[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[Doc]:
    """An install's objects, rendered offline (lookup finds nothing)."""
    return parse(chart().render(dict(values or {}), name=RELEASE, namespace=namespace, is_install=True))


def notes(values: Mapping[str, Any] | None = None) -> str:
    manifests = chart().render(dict(values or {}), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in manifests.items() if path.endswith("NOTES.txt"))


def key(doc: Doc) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def find(docs: Iterable[Doc], kind: str, name: str) -> Doc:
    found = [doc for doc in docs if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def pod_spec(doc: Doc) -> Doc:
    return doc["spec"]["template"]["spec"]


def containers(doc: Doc) -> list[Doc]:
    spec = pod_spec(doc)
    return [*spec.get("initContainers", []), *spec["containers"]]


# ---------------------------------------------------------------------------------------------------------------
# kustomize, in Python: resources, configMapGenerator (without the hash suffix), images
# ---------------------------------------------------------------------------------------------------------------

def kustomize_build(directory: Path = CONFIG) -> list[Doc]:
    (kustomization,) = load_yaml(directory / "kustomization.yaml")
    docs = [doc for resource in kustomization.get("resources", []) for doc in load_yaml(directory / resource)]
    for generator in kustomization.get("configMapGenerator", []):
        data = {}
        for entry in generator.get("files", []):
            name, _, path = entry.partition("=") if "=" in entry else (Path(entry).name, "", entry)
            data[name] = (directory / path).read_text()
        metadata = {"name": generator["name"], **({"namespace": generator["namespace"]} if "namespace" in generator
                                                  else {})}
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata, "data": data})
    for image in kustomization.get("images", []):
        for doc in docs:
            if doc["kind"] in {"Deployment", "DaemonSet"}:
                for one in containers(doc):
                    if one["image"].split(":")[0] == image["name"]:
                        one["image"] = f"{image.get('newName', image['name'])}:{image['newTag']}"
    return docs


# ---------------------------------------------------------------------------------------------------------------
# Checks every render gets
# ---------------------------------------------------------------------------------------------------------------

def check_custom_resource(doc: Doc) -> None:
    group, _, version = doc["apiVersion"].partition("/")
    assert version == "v1", doc["apiVersion"]
    required = CUSTOM_KINDS[group][doc["kind"]]
    assert doc["metadata"]["name"]
    for field in required:
        assert doc["spec"].get(field), f"{doc['kind']} {doc['metadata']['name']}: spec.{field} missing"


def check_valid(docs: Iterable[Doc]) -> None:
    """Every object strictly valid against Kubernetes 1.36's schemas; operators' kinds by their required fields."""
    for doc in docs:
        if api_group(doc) in CUSTOM_KINDS:
            check_custom_resource(doc)
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def references(doc: Doc) -> set[tuple[str, str, str]]:
    """(kind, namespace, name) of what an object names that must exist: a Pod template's ServiceAccount, Secrets and
    ConfigMaps; a binding's policy; a RoleBinding's Role and subjects."""
    namespace = doc["metadata"].get("namespace", "")
    found: set[tuple[str, str, str]] = set()
    if doc["kind"] in {"Deployment", "DaemonSet"}:
        spec = pod_spec(doc)
        found.add(("ServiceAccount", namespace, spec["serviceAccountName"]))
        for volume in spec.get("volumes", []):
            if "secret" in volume:
                found.add(("Secret", namespace, volume["secret"]["secretName"]))
            if "configMap" in volume:
                found.add(("ConfigMap", namespace, volume["configMap"]["name"]))
    if doc["kind"] in {"ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicyBinding"}:
        found.add((doc["kind"].removesuffix("Binding"), "", doc["spec"]["policyName"]))
    if doc["kind"] in {"RoleBinding", "ClusterRoleBinding"}:
        role = doc["roleRef"]
        if not role["name"].startswith("system:") and role["name"] != "extension-apiserver-authentication-reader":
            found.add((role["kind"], namespace if role["kind"] == "Role" else "", role["name"]))
        for subject in doc["subjects"]:
            found.add((subject["kind"], subject.get("namespace", ""), subject["name"]))
    if doc["kind"] == "Certificate":
        found.add((doc["spec"]["issuerRef"]["kind"], namespace if doc["spec"]["issuerRef"]["kind"] == "Issuer" else "",
                   doc["spec"]["issuerRef"]["name"]))
    return found


def check_references(docs: list[Doc], *, provided: Iterable[tuple[str, str, str]] = ()) -> None:
    """Every name a Pod, binding or Certificate refers to is in the render (or in `provided`: made outside it, as
    existing Secrets or cert-manager's Secrets); every namespaced object's namespace is in it or is the release's;
    each selector of a Deployment, DaemonSet, Service, PDB and PodMonitor matches its Pods' labels."""
    present = {key(doc) for doc in docs} | set(provided)
    for doc in docs:
        for ref in references(doc):
            assert ref in present, f"{key(doc)} refers to {ref}, which the render does not have"
    namespaces = {doc["metadata"]["name"] for doc in docs if doc["kind"] == "Namespace"}
    for doc in docs:
        namespace = doc["metadata"].get("namespace")
        assert namespace in (None, NAMESPACE, "kube-system", "cert-manager") or namespace in namespaces, key(doc)
    pods = [doc for doc in docs if doc["kind"] in {"Deployment", "DaemonSet"}]
    for workload in pods:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert workload["spec"]["selector"]["matchLabels"].items() <= labels.items(), key(workload)
    for doc in docs:
        selector = {"Service": lambda d: d["spec"]["selector"],
                    "PodDisruptionBudget": lambda d: d["spec"]["selector"]["matchLabels"],
                    "PodMonitor": lambda d: d["spec"]["selector"]["matchLabels"]}.get(doc["kind"])
        if selector is None:
            continue
        wanted = dict(selector(doc))
        wanted.pop("gpu-topology.io/leader", None)  # set by the leader on its own Pod at run time
        matched = [w for w in pods if w["metadata"].get("namespace") == doc["metadata"].get("namespace")
                   and wanted.items() <= w["spec"]["template"]["metadata"]["labels"].items()]
        assert matched, f"{key(doc)} selects no Pod of the render"
        if doc["kind"] in {"Service", "PodMonitor"}:
            ports = {port["name"] for w in matched for c in pod_spec(w)["containers"] for port in c.get("ports", [])}
            wanted_ports = ({p["targetPort"] for p in doc["spec"]["ports"]} if doc["kind"] == "Service"
                            else {e["port"] for e in doc["spec"]["podMetricsEndpoints"]})
            assert wanted_ports <= ports, f"{key(doc)} names ports {wanted_ports}, its Pods have {ports}"


def without_helm_labels(doc: Doc) -> Doc:
    doc = copy.deepcopy(doc)
    labels = doc["metadata"].get("labels", {})
    for label in HELM_LABELS:
        labels.pop(label, None)
    if not labels:
        doc["metadata"].pop("labels", None)
    return doc


def secret_data(docs: Iterable[Doc]) -> dict[str, dict[str, str]]:
    return {doc["metadata"]["name"]: doc["data"] for doc in docs if doc["kind"] == "Secret"}


def scheduler_config(docs: Iterable[Doc]) -> Doc:
    return yaml.safe_load(find(docs, "ConfigMap", "gpu-topology-scheduler-config")["data"]["config.yaml"])
