"""What kube-scheduler's score plugins weigh of a pod (api/preferences.py), read from pods and nodes as the API
server stores them, and from shapes it would not store."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.api.preferences import MAX_ENTRIES, kube_weighs, soft_taints, soft_tolerations, tolerates

TERM = {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
POD_TERM = {"weight": 5, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                             "labelSelector": {"matchLabels": {"app": "x"}}}}
REQUIRED = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}


@pytest.mark.parametrize("metadata, spec, weighed", [
    ({}, {}, False),
    ({}, {"affinity": {"nodeAffinity": REQUIRED}}, False),  # a requirement filters; it scores nothing
    ({}, {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [TERM]}}}, True),
    ({}, {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}}}, True),
    ({}, {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}}}, True),
    ({}, {"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}, False),
    ({}, {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
     False),
    ({}, {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}]},
     True),
    ({}, {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}, True),
    ({"ownerReferences": [{"kind": "Job", "name": "train", "uid": "u"}]}, {}, False),
    ({"ownerReferences": [{"kind": "ReplicaSet", "name": "serve-7f", "uid": "u"}]}, {}, True),
    ({"ownerReferences": [{"kind": "StatefulSet", "name": "db", "uid": "u"}]}, {}, True),
    # Its own constraints replace the default spreading, which then does not apply.
    ({"ownerReferences": [{"kind": "ReplicaSet", "name": "serve-7f", "uid": "u"}]},
     {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
     False),
    # Shapes the API server would not store: kube-scheduler weighs them.
    ({}, {"affinity": "near"}, True),
    ({}, {"affinity": {"nodeAffinity": ["x"]}}, True),
    ({}, {"topologySpreadConstraints": "spread"}, True),
    ({}, {"topologySpreadConstraints": [7]}, True),
    ({"ownerReferences": {"kind": "Job"}}, {}, True),
    ({"ownerReferences": ["Job"]}, {}, True),
])
def test_what_kube_scheduler_weighs_of_a_pod(metadata: dict[str, Any], spec: dict[str, Any], weighed: bool) -> None:
    assert kube_weighs(metadata, spec) is weighed


def test_only_tolerations_that_can_apply_to_prefer_no_schedule_taints_are_kept() -> None:
    spec = {"tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "yes", "effect": "PreferNoSchedule"},
        {"key": "maintenance", "operator": "Exists"},
        {"operator": "Exists"},
    ]}
    assert soft_tolerations(spec) == (("spot", "Equal", "yes"), ("maintenance", "Exists", ""), ("", "Exists", ""))
    assert soft_tolerations({}) == ()
    for bad in ("all", [1], [{"key": 7}], [{"key": "a", "effect": ["PreferNoSchedule"]}],
                [{"key": "a"}] * (MAX_ENTRIES + 1)):
        assert soft_tolerations({"tolerations": bad}) is None, bad


def test_a_nodes_prefer_no_schedule_taints_are_read_and_the_others_left() -> None:
    spec = {"taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"},
                       {"key": "spot", "value": "yes", "effect": "PreferNoSchedule"},
                       {"key": "aging", "effect": "PreferNoSchedule"}]}
    assert soft_taints(spec) == (("spot", "yes"), ("aging", ""))
    assert soft_taints({}) == () and soft_taints(None) == ()
    for bad in ("all", [1], [{"key": 7, "effect": "PreferNoSchedule"}], [{"key": "a"}] * (MAX_ENTRIES + 1)):
        assert soft_taints({"taints": bad}) is None, bad


@pytest.mark.parametrize("tolerations, taints, tolerated", [
    ((), (), True),
    ((), (("spot", "yes"),), False),
    ((("spot", "Equal", "yes"),), (("spot", "yes"),), True),
    ((("spot", "", "yes"),), (("spot", "yes"),), True),  # no operator is Equal
    ((("spot", "Equal", "no"),), (("spot", "yes"),), False),
    ((("spot", "Exists", ""),), (("spot", "yes"),), True),
    ((("other", "Exists", ""),), (("spot", "yes"),), False),
    ((("", "Exists", ""),), (("spot", "yes"), ("aging", "")), True),
    ((("spot", "Exists", ""),), (("spot", "yes"), ("aging", "")), False),
    ((("spot", "Gt", "1"),), (("spot", "2"),), False),  # an operator not known here is not taken as tolerating
    (None, (), True),
    (None, (("spot", "yes"),), False),
    ((), None, False),
])
def test_tolerations_match_taints_as_kube_scheduler_matches_them(tolerations: Any, taints: Any,
                                                                 tolerated: bool) -> None:
    assert tolerates(tolerations, taints) is tolerated


json = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner,
                                                                               max_size=4), max_leaves=20)


@given(st.dictionaries(st.sampled_from(["ownerReferences", "name"]), json),
       st.dictionaries(st.sampled_from(["affinity", "topologySpreadConstraints", "resourceClaims", "tolerations",
                                        "taints"]), json))
def test_any_json_gets_an_answer_never_an_exception(metadata: dict[str, Any], spec: dict[str, Any]) -> None:
    assert isinstance(kube_weighs(metadata, spec), bool)
    tolerations, taints = soft_tolerations(spec), soft_taints(spec)
    assert isinstance(tolerates(tolerations, taints), bool)
