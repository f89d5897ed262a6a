"""What kube-scheduler's own score plugins weigh for a pod beside the extender's score: whether filter may pass the
pod one node.

Where one node passes the filters, kube-scheduler takes it without scoring (schedulePod: a single feasible node is
the suggested host) and calls no prioritize. So a pod for which no score plugin of kube-scheduler's (v1.36's
defaults, the shipped profile) would set one node above another, beyond what ours weighs, is passed our one best
node (verbs/service.py): one request a pod fewer, and no scoring in kube-scheduler. A pod states what those plugins
weigh in:
- NodeAffinity: preferred node affinity terms;
- InterPodAffinity: preferred pod affinity or anti-affinity terms;
- PodTopologySpread: a ScheduleAnyway constraint; without constraints of its own, the system's default spreading
  of the pods a ReplicaSet, StatefulSet or ReplicationController owns (a Service's selection is not seen here);
- DynamicResources: ResourceClaims (a prioritized list's alternatives are scored);
- TaintToleration: PreferNoSchedule taints it does not tolerate, judged on the one node it would be passed
  (`tolerates`): where that node has none, no other node scores higher there.
Such a pod gets the shortlist (verbs/scoring/shortlist.py). What is given up for the others: kube-scheduler's cpu
and memory packing (NodeResourcesFit; ours packs GPUs, fuller nodes first), ImageLocality, and existing pods'
preferred terms towards the pod (InterPodAffinity's symmetry).

The pod's and node's fields are untrusted: a shape the API server would not store, or more entries than MAX_ENTRIES,
counts as weighed (the pod) or untolerated (the node), so kube-scheduler weighs them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_ENTRIES = 64
"""Tolerations of a pod or taints of a node read here: real ones have a few; past this, kube-scheduler judges."""

SOFT = "PreferNoSchedule"
_SPREAD_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})

Toleration = tuple[str, str, str]  # key, operator, value: one that applies to PreferNoSchedule taints
Taint = tuple[str, str]  # key, value: a PreferNoSchedule taint


def kube_weighs(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    """Whether a score plugin of kube-scheduler's weighs something the pod states (the module's list)."""
    affinity = spec.get("affinity")
    if affinity is not None:
        if not isinstance(affinity, dict):
            return True
        for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
            terms = affinity.get(kind)
            if terms is not None and (not isinstance(terms, dict)
                                      or terms.get("preferredDuringSchedulingIgnoredDuringExecution")):
                return True
    if spec.get("resourceClaims"):
        return True
    constraints = spec.get("topologySpreadConstraints")
    if constraints:
        return not isinstance(constraints, list) or any(
            not isinstance(constraint, dict) or constraint.get("whenUnsatisfiable") == "ScheduleAnyway"
            for constraint in constraints)
    owners = metadata.get("ownerReferences")
    if owners is None:
        return False
    return not isinstance(owners, list) or any(
        not isinstance(owner, dict) or owner.get("kind") in _SPREAD_OWNERS for owner in owners)


def soft_tolerations(spec: Mapping[str, Any]) -> tuple[Toleration, ...] | None:
    """The pod's tolerations that apply to PreferNoSchedule taints; None where they cannot be read here."""
    read = _fields(spec.get("tolerations"), ("key", "operator", "value", "effect"))
    if read is None:
        return None
    return tuple((key, operator, value) for key, operator, value, effect in read if effect in ("", SOFT))


def soft_taints(spec: Any) -> tuple[Taint, ...] | None:
    """A node's PreferNoSchedule taints; None where they cannot be read here (judged as untolerated)."""
    read = _fields(spec.get("taints") if isinstance(spec, dict) else None, ("key", "value", "effect"))
    if read is None:
        return None
    return tuple((key, value) for key, value, effect in read if effect == SOFT)


def _fields(entries: Any, names: tuple[str, ...]) -> list[tuple[str, ...]] | None:
    """Each entry's string fields by `names` ("" where absent); [] for no value; None for a value that is not a list
    of at most MAX_ENTRIES objects with strings there."""
    if entries is None:
        return []
    if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
        return None
    read = []
    for entry in entries:
        fields = tuple(entry.get(name) or "" for name in names) if isinstance(entry, dict) else None
        if fields is None or not all(isinstance(field, str) for field in fields):
            return None
        read.append(fields)
    return read


def tolerates(tolerations: Sequence[Toleration] | None, taints: Sequence[Taint] | None) -> bool:
    """Every taint tolerated, as kube-scheduler matches them (v1.Toleration.ToleratesTaint): an empty key with
    Exists tolerates every taint, Exists any value of its key, Equal (or no operator) its value alone."""
    if taints is None or tolerations is None:
        return not taints and taints is not None
    return all(any((key == "" and operator == "Exists") or (key == taint_key and (
        operator == "Exists" or (operator in ("", "Equal") and value == taint_value)))
        for key, operator, value in tolerations) for taint_key, taint_value in taints)
