"""One source of truth: the chart, given the values that amount to the kustomize install (the Secrets made
beforehand, both agents), renders the very objects `kubectl apply -k scheduler-config/` creates, object by object,
modulo Helm's own labels, the ConfigMap's hash suffix that kustomize adds and the checksum annotation the chart adds
in its place. Policies, RBAC and alerts come from the manifests' own text (the chart's files/ links to them); the
workloads are templates, held to the manifests here.
"""

from __future__ import annotations

import copy

import pytest
import yaml
from helpers.chart_render import (
    KUSTOMIZE_VALUES,
    NAMESPACE,
    Doc,
    key,
    kustomize_build,
    pod_spec,
    render,
    without_helm_labels,
)

# The release's namespace is Helm's (helm install -n, --create-namespace or made beforehand with its Pod Security
# labels, README.md in the chart): a chart cannot own the namespace its release is stored in.
ONLY_IN_KUSTOMIZE = {("Namespace", "", NAMESPACE)}


def normalized(doc: Doc) -> Doc:
    doc = without_helm_labels(doc)
    if doc["kind"] == "ConfigMap" and "config.yaml" in doc.get("data", {}):
        doc["data"]["config.yaml"] = yaml.safe_load(doc["data"]["config.yaml"])
    if doc["kind"] in {"Deployment", "DaemonSet"}:
        template = doc["spec"]["template"]["metadata"]
        template.get("annotations", {}).pop("checksum/config", None)
        if not template.get("annotations"):
            template.pop("annotations", None)
    return doc


@pytest.fixture(scope="module")
def chart_objects() -> dict[tuple[str, str, str], Doc]:
    return {key(doc): normalized(doc) for doc in render(KUSTOMIZE_VALUES)}


@pytest.fixture(scope="module")
def kustomize_objects() -> dict[tuple[str, str, str], Doc]:
    return {key(doc): normalized(doc) for doc in kustomize_build()}


def test_the_same_objects(chart_objects, kustomize_objects) -> None:
    assert set(kustomize_objects) - set(chart_objects) == ONLY_IN_KUSTOMIZE
    assert set(chart_objects) - set(kustomize_objects) == set()


def test_each_object_the_same(chart_objects, kustomize_objects) -> None:
    differing = [k for k in set(chart_objects) & set(kustomize_objects) if chart_objects[k] != kustomize_objects[k]]
    for k in sorted(differing):
        print(k, "\nchart:", yaml.safe_dump(chart_objects[k])[:3000], "\nkustomize:",
              yaml.safe_dump(kustomize_objects[k])[:3000])
    assert not differing, f"the chart and kustomize differ in {sorted(differing)}"


def test_the_comparison_sees_a_difference_in_a_pod_template(kustomize_objects) -> None:
    """The normalization leaves the specs alone: a changed flag is a difference."""
    changed = copy.deepcopy(kustomize_objects[("Deployment", NAMESPACE, "gpu-topology-extender")])
    pod_spec(changed)["containers"][0]["args"].append("--topology-wait=60")
    assert normalized(changed) != kustomize_objects[("Deployment", NAMESPACE, "gpu-topology-extender")]


def test_the_scheduler_config_map_is_the_kustomize_generators(kustomize_objects) -> None:
    """The comparison above holds the ConfigMap's content; this one that both name it from the same generator, so
    the scheduler Deployment mounts the configuration the kustomization generates."""
    (config,) = [k for k in kustomize_objects if k[0] == "ConfigMap"]
    deployment = kustomize_objects[("Deployment", NAMESPACE, "gpu-topology-scheduler")]
    assert [v["configMap"]["name"] for v in pod_spec(deployment)["volumes"] if "configMap" in v] == [config[2]]
