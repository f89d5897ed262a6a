"""What the manifest suites share: scheduler-config/ loaded once, the Kubernetes version its API objects are
validated against, and small readers for objects, containers, command lines, RBAC rules and quantities.

Used by tests/test_manifests.py (the extender and the scheduler) and tests/test_reporter_manifests.py (the node
reporter and its admission policy).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "scheduler-config"
# The schemas every manifest is validated against: Kubernetes 1.36, the minor of the real kube-scheduler the
# extender contract was captured on (shared/kube-scheduler/INDEX.md). kubernetes-validate silently falls back to
# the newest version it has below the one asked for, so the test below insists that this one is shipped.
KUBERNETES_VERSION = "1.36.0"

Doc = dict[str, Any]


def load_yaml(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


DOCS: dict[str, list[Doc]] = {path.name: load_yaml(path) for path in sorted(CONFIG.glob("*.yaml"))}

# Documents that are not Kubernetes API objects, by API group.
SCHEDULER_CONFIG_GROUP = "kubescheduler.config.k8s.io"
KUSTOMIZE_GROUP = "kustomize.config.k8s.io"
CERT_MANAGER_GROUP = "cert-manager.io"


def api_group(doc: Doc) -> str:
    api_version = doc["apiVersion"]
    return api_version.split("/")[0] if "/" in api_version else ""


def documents(group: str | None = None) -> Iterator[tuple[str, Doc]]:
    """(file name, document) for every document in scheduler-config/*.yaml, or only those of one API group."""
    for name, docs in DOCS.items():
        for doc in docs:
            if group is None or api_group(doc) == group:
                yield name, doc


API_OBJECTS = [
    (name, doc)
    for name, doc in documents()
    if api_group(doc) not in {SCHEDULER_CONFIG_GROUP, KUSTOMIZE_GROUP, CERT_MANAGER_GROUP}
]


def obj(kind: str, name: str, namespace: str | None = None) -> Doc:
    found = [
        doc
        for _, doc in documents()
        if doc.get("kind") == kind
        and doc.get("metadata", {}).get("name") == name
        and (namespace is None or doc["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def container(deployment: Doc) -> Doc:
    """The only container of a Deployment's or DaemonSet's Pod template."""
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def flag_values(args: list[str]) -> dict[str, str]:
    """--name=value and --name value pairs of a command line; flags without a value map to ''."""
    flags: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            if "=" in arg:
                key, value = arg.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                key, value = arg, args[i + 1]
                i += 1
            else:
                key, value = arg, ""
            flags[key] = value
        i += 1
    return flags


def flatten_rules(rules: list[Doc]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    flat = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule  # no nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    flat.add((group, resource, verb, tuple(rule.get("resourceNames", ()))))
    return flat


_QUANTITY = re.compile(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
_QUANTITY_FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int) -> float:
    match = _QUANTITY.fullmatch(str(value))
    assert match, value
    return float(match[1]) * _QUANTITY_FACTOR[match[2]]
