"""What the manifest suites share: scheduler-config/ loaded once, the Kubernetes version its API objects are
validated against, small readers for objects, containers, command lines, RBAC rules and quantities, the node
selection rules of a DaemonSet, a ValidatingAdmissionPolicy evaluator, and the check of a PromQL query against the
metrics the extender exports.

Used by tests/manifests/test_manifests.py (the extender, the scheduler, the policy on the pods' bind annotations, the
alerts), tests/manifests/test_agent_manifests.py (the node agent in both modes and its admission policy) and
tests/manifests/test_grafana_dashboard.py (the dashboard's queries).
"""

from __future__ import annotations

import functools
import re
import subprocess
import sys
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import celpy
import promql_parser
import yaml
from celpy import celtypes

from helpers.paths import ROOT

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
MONITORING_GROUP = "monitoring.coreos.com"


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
    if api_group(doc) not in {SCHEDULER_CONFIG_GROUP, KUSTOMIZE_GROUP, CERT_MANAGER_GROUP, MONITORING_GROUP}
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


def repeated_flag(args: list[str], name: str) -> list[str]:
    """Every value of a flag that may be given more than once (--name=value form), in order."""
    return [arg.split("=", 1)[1] for arg in args if arg.startswith(f"{name}=")]


def flatten_rules(rules: list[Doc]) -> set[tuple[str, str, str, tuple[str, ...]]]:
    flat = set()
    for rule in rules:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule  # no nonResourceURLs
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    flat.add((group, resource, verb, tuple(rule.get("resourceNames", ()))))
    return flat


@functools.cache
def console_script_help(script: str, *args: str) -> str:
    """What `script [args] --help` prints, run from the source tree through the entry point pyproject.toml gives
    it ("module:function"), so no reinstall is needed."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, function = scripts[script].split(":")
    run = f"import sys; from {module} import {function} as main; sys.exit(main())"
    result = subprocess.run([sys.executable, "-c", run, *args, "--help"], cwd=ROOT, check=False,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


_QUANTITY = re.compile(r"([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?")
_QUANTITY_FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
                    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def quantity(value: str | int) -> float:
    match = _QUANTITY.fullmatch(str(value))
    assert match, value
    return float(match[1]) * _QUANTITY_FACTOR[match[2]]


# ---------------------------------------------------------------------------------------------------------------
# Which nodes a Pod template may run on: nodeSelector AND requiredDuringSchedulingIgnoredDuringExecution
# (k8s.io/component-helpers/scheduling/corev1/nodeaffinity: terms ORed, a term's expressions ANDed; NotIn and
# DoesNotExist also match a node without the label).
# ---------------------------------------------------------------------------------------------------------------


def _expression_matches(expression: Doc, labels: Mapping[str, str]) -> bool:
    key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {operator} is not used in these manifests")


def runs_on(pod_spec: Doc, labels: Mapping[str, str]) -> bool:
    """Whether a Pod template's node selection admits a node with these labels (taints aside)."""
    if any(labels.get(key) != value for key, value in pod_spec.get("nodeSelector", {}).items()):
        return False
    required = pod_spec.get("affinity", {}).get("nodeAffinity", {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    for term in required["nodeSelectorTerms"]:
        assert set(term) == {"matchExpressions"}, term  # no matchFields here
        if all(_expression_matches(expression, labels) for expression in term["matchExpressions"]):
            return True
    return False


# ---------------------------------------------------------------------------------------------------------------
# A ValidatingAdmissionPolicy, applied as the API server applies it: matchConstraints, matchConditions, variables,
# validations, with validationActions Deny. Its CEL is compiled and run with cel-python, as it is written.
# ---------------------------------------------------------------------------------------------------------------

CEL = celpy.Environment()
# Portable CEL: the only functions and macros the policies may call. Kubernetes' CEL libraries (strings, lists,
# optionals, quantity, url, ip, authorizer, ...) are not in cel-python.
PORTABLE_CALLS = {"has", "all", "exists", "exists_one", "filter", "map", "size", "startsWith", "endsWith",
                  "contains", "string", "int"}


def program(expression: str) -> Any:
    return CEL.program(CEL.compile(expression))


def policy_expressions(policy: Doc) -> list[tuple[str, str]]:
    """(where, expression) for every CEL expression of a policy."""
    spec = policy["spec"]
    found = [(f"matchConditions/{c['name']}", c["expression"]) for c in spec.get("matchConditions", [])]
    found += [(f"variables/{v['name']}", v["expression"]) for v in spec.get("variables", [])]
    for i, validation in enumerate(spec["validations"]):
        found.append((f"validations/{i}", validation["expression"]))
        if "messageExpression" in validation:
            found.append((f"validations/{i}/messageExpression", validation["messageExpression"]))
    return found


def non_portable_calls(expression: str) -> set[str]:
    """The functions an expression calls outside PORTABLE_CALLS, and '[?'/'.?' for optional syntax."""
    without_strings = re.sub(r"'[^']*'", "''", expression)
    calls = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(", without_strings)) - PORTABLE_CALLS
    return calls | {syntax for syntax in ("[?", ".?") if syntax in without_strings}


def policy_variable(policy: Doc, name: str) -> str:
    """The value of a variable that is a single-quoted string literal (such as `prefix`)."""
    (expression,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == name]
    match = re.fullmatch(r"'([^'\\]*)'", expression)
    assert match, expression
    return match[1]


@dataclass
class Verdict:
    applies: bool
    messages: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return not self.messages


def _evaluate(compiled: Any, activation: dict[str, Any]) -> Any:
    """A CEL value, or the CELEvalError (cel-python raises some errors and returns others)."""
    try:
        return compiled.evaluate(activation)
    except celpy.CELEvalError as error:
        return error


def _rule_names(rule_resource: str, resource: str, sub_resource: str) -> bool:
    """A resourceRules entry against a request's resource and subresource (admissionregistration/v1: "*" is every
    resource, "pods/*" every subresource of pods, "*/*" everything)."""
    if rule_resource == "*/*":
        return True
    name, _, sub = rule_resource.partition("/")
    if name not in ("*", resource):
        return False
    if not sub:
        return not sub_resource
    return sub == "*" and bool(sub_resource) or sub == sub_resource


class AdmissionPolicy:
    """One ValidatingAdmissionPolicy, compiled once."""

    def __init__(self, policy: Doc) -> None:
        self.policy = policy
        spec = policy["spec"]
        self.conditions = [(c["name"], program(c["expression"])) for c in spec.get("matchConditions", [])]
        self.variables = [(v["name"], program(v["expression"])) for v in spec.get("variables", [])]
        self.validations = [
            (program(v["expression"]), v["message"],
             program(v["messageExpression"]) if "messageExpression" in v else None)
            for v in spec["validations"]
        ]

    def matches_constraints(self, request: Doc) -> bool:
        resource, sub_resource = request["resource"]["resource"], request.get("subResource", "")
        for rule in self.policy["spec"]["matchConstraints"]["resourceRules"]:
            if (request["resource"]["group"] in rule["apiGroups"]
                    and request["resource"]["version"] in rule["apiVersions"]
                    and request["operation"] in rule["operations"]
                    and any(_rule_names(r, resource, sub_resource) for r in rule["resources"])):
                return True
        return False

    def condition(self, name: str, request: Doc) -> Any:
        (compiled,) = [c for n, c in self.conditions if n == name]
        return compiled.evaluate({"request": celpy.json_to_cel(request)})

    def admit(self, request: Doc) -> Verdict:
        """The policy applied to one AdmissionRequest as the API server applies it (failurePolicy Fail: an error
        denies)."""
        assert self.policy["spec"]["failurePolicy"] == "Fail"
        if not self.matches_constraints(request):
            return Verdict(applies=False)
        activation: dict[str, Any] = {
            "request": celpy.json_to_cel(request),
            "object": celpy.json_to_cel(request.get("object")),
            "oldObject": celpy.json_to_cel(request.get("oldObject")),
        }
        for name, condition in self.conditions:
            result = _evaluate(condition, activation)
            if isinstance(result, celpy.CELEvalError):
                return Verdict(applies=True, messages=[f"matchCondition {name}: {result}"])
            if not result:
                return Verdict(applies=False)
        variables: dict[celtypes.StringType, Any] = {}
        for name, variable in self.variables:
            activation["variables"] = celtypes.MapType(variables)
            variables[celtypes.StringType(name)] = _evaluate(variable, activation)
        activation["variables"] = celtypes.MapType(variables)
        messages = []
        for expression, message, message_expression in self.validations:
            result = _evaluate(expression, activation)
            if isinstance(result, celpy.CELEvalError) or not isinstance(result, celtypes.BoolType):
                messages.append(f"evaluation error: {result}")
            elif not result:
                built = _evaluate(message_expression, activation) if message_expression is not None else None
                # The API server falls back to `message` when messageExpression fails or is empty.
                messages.append(str(built) if isinstance(built, str) and built else message)
        return Verdict(applies=True, messages=messages)


def assert_denied(policy: AdmissionPolicy, request: Doc, expected: list[str]) -> None:
    """The policy denies the request with one message per expected part, none an evaluation error."""
    verdict = policy.admit(request)
    assert verdict.applies and not verdict.allowed
    assert not [m for m in verdict.messages if m.startswith("evaluation error")], verdict.messages
    assert len(verdict.messages) == len(expected), verdict.messages
    for part in expected:
        assert any(part in message for message in verdict.messages), (part, verdict.messages)


@dataclass
class ReplicaPod:
    """One extender Pod in the rollout model: its template revision, whether its caches are synced, whether it
    leads (and so carries the leader label)."""

    name: str
    revision: str
    synced: bool = False
    leads: bool = False


@dataclass
class Rollout:
    """What a rollout of the extender's Deployment did, tick by tick (a tick: about one retry period)."""

    finished: bool
    ticks: int
    leaderless_ticks: int  # ticks with no Pod leading, so none labelled: kube-scheduler's calls fail and retry
    leaders_deleted: int
    fewest_ready: int
    pods: list[ReplicaPod]


def roll_out(replicas: int, max_surge: int, max_unavailable: int, ready: Any, *, leader_goes_first: bool,
             ticks: int = 40) -> Rollout:
    """The Deployment controller's rolling-update arithmetic (pkg/controller/deployment/rolling.go) over the
    extender's replicas, from `replicas` old Pods (the first leading) to as many new ones.

    Each tick the controller cleans up old Pods that are not ready (at most all - minAvailable - new unready),
    scales the old ReplicaSet down by available - minAvailable (the ReplicaSet deletes a not-ready Pod first, then
    the leader or a standby as `leader_goes_first` says), and scales the new one up to replicas + maxSurge Pods in
    all. A new Pod syncs its caches one tick after it starts. A deleted leader removes its label and releases the
    Lease (SIGTERM); with no leader, a synced Pod takes the Lease one tick later. `ready(pod)` is the readiness
    under test."""
    pods = [ReplicaPod(f"old-{i}", "old", synced=True, leads=i == 0) for i in range(replicas)]
    min_available = replicas - max_unavailable
    leaderless = deleted = 0
    fewest = replicas
    made = 0
    for tick in range(ticks):
        new = [p for p in pods if p.revision == "new"]
        if len(new) == len(pods) == replicas and all(map(ready, pods)):
            return Rollout(True, tick, leaderless, deleted, fewest, pods)
        available = sum(map(ready, pods))
        fewest = min(fewest, available)
        new_unavailable = sum(not ready(p) for p in new)
        old = [p for p in pods if p.revision == "old"]
        cleanup = max(0, len(pods) - min_available - new_unavailable)
        for pod in [p for p in old if not ready(p)][:cleanup]:
            pods.remove(pod)
            old.remove(pod)
        down = max(0, available - min_available)
        order = sorted(old, key=lambda p: (ready(p), p.leads != leader_goes_first))
        for pod in order[:down]:
            pods.remove(pod)
            deleted += pod.leads
        for pod in pods:  # Pods started last tick have synced their caches
            pod.synced = True
        while len(pods) < replicas + max_surge and len([p for p in pods if p.revision == "new"]) < replicas:
            pods.append(ReplicaPod(f"new-{made}", "new"))
            made += 1
        if not any(p.leads for p in pods):
            leaderless += 1
            candidates = [p for p in pods if p.synced]
            if candidates:
                candidates[0].leads = True
    return Rollout(False, ticks, leaderless, deleted, fewest, pods)


_SERIES_SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum")}


@functools.cache
def exported_series() -> frozenset[str]:
    """The series names a real extender's /metrics can carry (a labelled metric exports no sample until used)."""
    from extender.cache.cluster_state import ClusterState
    from extender.groups.plans import GroupPlans
    from extender.verbs.metrics import Metrics

    state = ClusterState()
    families = Metrics(state, GroupPlans(state)).registry.collect()
    return frozenset(family.name + suffix for family in families for suffix in _SERIES_SUFFIXES[family.type])


def assert_promql_on_exported_metrics(expr: str) -> set[str]:
    """The query parses (promql-parser raises on a syntax error) and names only series the extender exports;
    returns the names."""
    promql_parser.parse(expr)
    named = set(re.findall(r"\bgpu_topology_extender_\w+", expr))
    assert named, f"names no metric of the extender: {expr}"
    assert named <= exported_series(), named - exported_series()
    return named
