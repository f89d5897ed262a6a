"""Whether a pod may go to a node at all, as far as a planner working before kube-scheduler can tell.

The planner (extender/pinning/planner.py) pins a pod's GPUs before kube-scheduler runs its filters, so it must
not pin them on a node the pod may never use: one that is cordoned, has a NoSchedule or NoExecute taint the pod
does not tolerate, lacks a label of its nodeSelector, or fails its required node affinity (label expressions of
In, NotIn, Exists, DoesNotExist, Gt and Lt; a term with matchFields counts as matching, as fields are not kept).
What else kube-scheduler checks (CPU and memory, pod affinity, topology spread, volumes) is not seen here: a pin
that cannot be scheduled is made again elsewhere after the planner's timeout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

_KEEP_OFF = frozenset({"NoSchedule", "NoExecute"})
_MAX_ITEMS = 256  # of labels, taints, tolerations, terms or values read: more than a real object carries


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeFacts:
    labels: Mapping[str, str]
    taints: tuple[Taint, ...]  # only those that keep pods off
    unschedulable: bool


@dataclass(frozen=True, slots=True)
class Expression:
    key: str
    operator: str
    values: tuple[str, ...]

    def holds(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        match self.operator:
            case "In":
                return value in self.values
            case "NotIn":
                return value not in self.values
            case "Exists":
                return value is not None
            case "DoesNotExist":
                return value is None
            case "Gt" | "Lt" if value is not None and value.lstrip("-").isdigit() and len(self.values) == 1 \
                    and self.values[0].lstrip("-").isdigit():
                return int(value) > int(self.values[0]) if self.operator == "Gt" else int(value) < int(self.values[0])
        return False


@dataclass(frozen=True, slots=True)
class PodPlacementRules:
    node_selector: Mapping[str, str]
    tolerations: tuple[Mapping[str, Any], ...]
    terms: tuple[tuple[Expression, ...], ...]  # required node affinity: any term, all its expressions

    def allow(self, node: NodeFacts) -> bool:
        if node.unschedulable and not any(_tolerates(toleration, Taint("node.kubernetes.io/unschedulable", "",
                                                                       "NoSchedule"))
                                          for toleration in self.tolerations):
            return False
        if any(node.labels.get(key) != value for key, value in self.node_selector.items()):
            return False
        if any(not any(_tolerates(toleration, taint) for toleration in self.tolerations) for taint in node.taints):
            return False
        return not self.terms or any(all(expression.holds(node.labels) for expression in term)
                                     for term in self.terms)


def parse_node(node: Any) -> tuple[str, NodeFacts] | None:
    metadata = node.get("metadata") if isinstance(node, dict) else None
    name = metadata.get("name") if isinstance(metadata, dict) else None
    if not isinstance(name, str):
        return None
    spec = node.get("spec") or {}
    labels = metadata.get("labels") or {}
    taints = spec.get("taints") or [] if isinstance(spec, dict) else []
    return name, NodeFacts(
        {str(key): str(value) for key, value in list(labels.items())[:_MAX_ITEMS]} if isinstance(labels, dict) else {},
        tuple(Taint(str(taint.get("key") or ""), str(taint.get("value") or ""), str(taint.get("effect")))
              for taint in taints[:_MAX_ITEMS] if isinstance(taint, dict) and taint.get("effect") in _KEEP_OFF)
        if isinstance(taints, list) else (),
        isinstance(spec, dict) and spec.get("unschedulable") is True)


def parse_rules(spec: Mapping[str, Any]) -> PodPlacementRules:
    selector = spec.get("nodeSelector") or {}
    tolerations = spec.get("tolerations") or []
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}) if isinstance(spec.get("affinity"), dict) \
        else {}
    required = (affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}) if isinstance(affinity, dict) \
        else {}
    terms = required.get("nodeSelectorTerms") or [] if isinstance(required, dict) else []
    return PodPlacementRules(
        {str(key): str(value) for key, value in list(selector.items())[:_MAX_ITEMS]}
        if isinstance(selector, dict) else {},
        tuple(toleration for toleration in tolerations[:_MAX_ITEMS] if isinstance(toleration, dict))
        if isinstance(tolerations, list) else (),
        tuple(_term(term) for term in terms[:_MAX_ITEMS] if isinstance(term, dict)) if isinstance(terms, list) else ())


def _term(term: Mapping[str, Any]) -> tuple[Expression, ...]:
    expressions = term.get("matchExpressions") or []
    return tuple(Expression(str(item.get("key") or ""), str(item.get("operator") or ""),
                            tuple(str(value) for value in (item.get("values") or [])[:_MAX_ITEMS]))
                 for item in (expressions if isinstance(expressions, list) else [])[:_MAX_ITEMS]
                 if isinstance(item, dict))


def _tolerates(toleration: Mapping[str, Any], taint: Taint) -> bool:
    """corev1 Toleration.ToleratesTaint: an empty effect matches every effect, an empty key with Exists every key."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    if toleration.get("operator") == "Exists":
        return True
    return bool(key) and (toleration.get("value") or "") == taint.value
