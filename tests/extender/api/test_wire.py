"""The wire format's own edge cases: key case, odd host names in the C prioritize serializer, what filter and
prioritize leave out of their answers, and a precise reason for every wrongly shaped request."""

from __future__ import annotations

import json

import jsonschema  # kubernetes-validate's own dependency, installed with the test extras
import orjson
import pytest
from fastapi.testclient import TestClient

from extender.api.openapi import document
from extender.api.pod_request import parse_pod
from extender.api.wire import BadRequest, filter_result, parse_binding_args, parse_extender_args, prioritize_result
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server.app import create_app
from extender.verbs.service import ExtenderService
from helpers.paths import FIXTURES
from topology.annotations import AnnotationKeys


@pytest.mark.parametrize(("hosts", "scores", "answered"), [
    (["node-a", "node-b", "node-c"], [7, 7, 0], {"node-a": 7, "node-b": 7}),
    (['we"ird', "com,ma", '","', 'x","Score":9},{"Host":"y', "ünï", "back\\slash"], [3, 10, 1, 1, 2, 3],
     {'we"ird': 2, "com,ma": 9, "ünï": 1, "back\\slash": 2}),
    (["a", "b"], [4, 4], {}),
    ([], [], {}),
])
def test_prioritize_answers_scores_above_the_least_and_leaves_the_rest_out(
        hosts: list[str], scores: list[int], answered: dict[str, int]) -> None:
    """kube-scheduler adds nothing for a host left out, and the same number less on every host ranks them alike."""
    decoded = orjson.loads(prioritize_result(hosts, scores))
    assert decoded == [{"Host": host, "Score": score} for host, score in answered.items()]


def test_prioritize_result_refuses_scores_out_of_range() -> None:
    with pytest.raises(ValueError, match="0 to 10"):
        prioritize_result(["a"], [11])


def test_keys_are_read_case_insensitively_as_go_does() -> None:
    args = parse_extender_args(b'{"pod": {"metadata": {"name": "p"}}, "nodenames": ["a"]}')
    assert args.candidates() == ["a"]
    binding = parse_binding_args(b'{"podName":"p","podNamespace":"d","podUID":"u","NODE":"n"}')
    assert (binding.pod_name, binding.node) == ("p", "n")


def test_nodes_without_names_are_refused() -> None:
    with pytest.raises(BadRequest, match=r"Nodes.items\[0\]: a node in Nodes has no metadata.name"):
        parse_extender_args(b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {}}]}}')


@pytest.mark.parametrize("groups", [
    {},
    {"not enough free GPUs": ["a", "b"], "no GPU topology reported": ["c"]},
    {'odd "reason"': ['we"ird', "com,ma", '","', 'x","y'], "empty group": []},
])
def test_filter_result_writes_reasons_only_when_no_node_passes(groups: dict[str, list[str]]) -> None:
    """kube-scheduler reads them only to explain a pod that fits nowhere."""
    names = [name for members in groups.values() for name in members]
    args = parse_extender_args(orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": names + ["ok", "u"]}))
    answer = orjson.loads(filter_result(args, [], groups, {"unresolvable": ["u"]}))
    assert answer == {"NodeNames": [], "Error": "", "FailedAndUnresolvableNodes": {"u": "unresolvable"},
                      "FailedNodes": {name: reason for reason, members in groups.items() for name in members}}
    passing = orjson.loads(filter_result(args, ["ok"], groups, {"unresolvable": ["u"]}))
    assert passing == {"NodeNames": ["ok"], "Error": "", "FailedNodes": {}, "FailedAndUnresolvableNodes": {}}


BODIES = FIXTURES / "kube-scheduler"  # real kube-scheduler v1.36 bodies


def _capture(name: str) -> dict:
    return orjson.loads((BODIES / name).read_bytes())


def _set(document: dict, path: tuple, value: object) -> dict:
    target = document
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return document


# Real bodies with one field of the wrong shape: each gets the field and what was expected, never
# "internal error", and no traceback in the log.
@pytest.mark.parametrize(("capture", "verb", "path", "value", "error"), [
    ("nodecache-false--filter.json", "filter", ("Nodes", "items", 1, "metadata"), "node-b",
     "Nodes.items[1].metadata: expected an object, got a string"),
    ("nodecache-false--filter.json", "filter", ("Nodes", "items", 2), None,
     "Nodes.items[2]: expected a Node object, got null"),
    ("nodecache-false--filter.json", "filter", ("Nodes", "items"), {"a": 1},
     "Nodes.items: expected an array of Node objects, got an object"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "spec", "containers"), "main",
     "Pod.spec.containers: expected an array of containers, got a string"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "spec", "containers", 0, "resources", "limits"), ["8"],
     "Pod.spec.containers[0].resources.limits: expected an object, got an array"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "spec"), 7, "Pod.spec: expected an object, got a number"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "spec", "activeDeadlineSeconds"), "3600",
     "Pod.spec.activeDeadlineSeconds: expected a whole number from 1 to 2147483647"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "spec", "activeDeadlineSeconds"), 2**31,
     "Pod.spec.activeDeadlineSeconds: expected a whole number from 1 to 2147483647"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "spec", "initContainers"), [{"name": "i"}] * 257,
     "Pod.spec.initContainers: expected at most 256 containers, got 257"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "metadata", "annotations"), {"gpu-topology.io/placement": 1},
     "Pod.metadata.annotations['gpu-topology.io/placement']: expected a string, got a number"),
    ("plain-4gpu--filter.json", "filter", ("Pod", "metadata", "uid"), "u" * 1_000,
     "Pod.metadata.uid: expected at most 128 characters, got 1000"),
    ("plain-4gpu--filter.json", "filter", ("NodeNames", 1), "n" * 254,
     "NodeNames[1]: expected 1 to 253 characters, got 254"),
    ("plain-4gpu--bind.json", "bind", ("Node",), ["node-a"], "Node: expected a string, got an array"),
    ("plain-4gpu--bind.json", "bind", ("PodUID",), "u" * 129, "PodUID: expected 1 to 128 characters, got 129"),
])
def test_wrongly_shaped_fields_get_a_precise_error(capture: str, verb: str, path: tuple, value: object,
                                                   error: str, caplog: pytest.LogCaptureFixture) -> None:
    client = _client()
    body = _set(_capture(capture), path, value)
    answer = client.post(f"/{verb}", content=orjson.dumps(body))
    assert answer.status_code == 200
    assert answer.json()["Error"] == error
    assert not [record for record in caplog.records if record.exc_info], "no traceback for bad input"


@pytest.mark.parametrize(("capture", "verb", "path", "value", "log"), [
    ("nodecache-false--prioritize.json", "prioritize", ("Nodes", "items", 0, "metadata"), 3,
     "Nodes.items[0].metadata: expected an object, got a number"),
    ("preempt-nodecache-false--preempt.json", "preempt", ("NodeNameToVictims", "node-a", "Pods", 0), "victim",
     "NodeNameToVictims['node-a'].Pods[0]: expected a Pod object, got a string"),
    ("preempt--preempt.json", "preempt", ("NodeNameToMetaVictims", "node-a", "NumPDBViolations"), -1,
     "NodeNameToMetaVictims['node-a'].NumPDBViolations: expected a whole number from 0 to the number of victims"),
])
def test_answers_without_an_error_field_say_the_reason_in_the_log_and_metric(
        capture: str, verb: str, path: tuple, value: object, log: str, caplog: pytest.LogCaptureFixture) -> None:
    client = _client()
    body = _set(_capture(capture), path, value)
    answer = client.post(f"/{verb}", content=orjson.dumps(body))
    assert answer.status_code == 200
    assert answer.json() in ([], {"NodeNameToMetaVictims": {}})
    assert f"{verb} refused: {log}" in caplog.messages
    assert not [record for record in caplog.records if record.exc_info]
    metrics = client.get("/metrics").text
    assert f'gpu_topology_extender_requests_refused_total{{reason="bad_shape",verb="{verb}"}} 1.0' in metrics


def test_nesting_past_what_can_be_answered_is_a_reason(caplog: pytest.LogCaptureFixture) -> None:
    body = _capture("nodecache-false--filter.json")
    deep: object = "x"
    for _ in range(300):
        deep = {"d": deep}
    body["Nodes"]["items"][0]["metadata"]["labels"] = deep
    answer = _client().post("/filter", content=json.dumps(body)).json()
    assert answer["Error"].startswith("Nodes: cannot be answered back (Recursion limit reached)")
    assert not [record for record in caplog.records if record.exc_info]


def _client() -> TestClient:
    state = ClusterState()
    cluster = DemoCluster(state, (("node-a", "dgx-h100"), ("node-b", "dgx-h100"), ("node-c", "dgx-a100")))
    return TestClient(create_app(ExtenderService(state, cluster)))


def _json_schema(schema: object) -> object:
    """OpenAPI 3.0's `nullable` as JSON Schema's null type, so jsonschema can check against the document."""
    if isinstance(schema, list):
        return [_json_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    converted = {key: _json_schema(value) for key, value in schema.items() if key != "nullable"}
    return {"anyOf": [converted, {"type": "null"}]} if schema.get("nullable") else converted


@pytest.mark.parametrize("capture", sorted(path.name for path in BODIES.glob("*--*.json")
                                           if "response" not in path.name))
def test_the_openapi_document_describes_what_kube_scheduler_sends(capture: str) -> None:
    """make fuzz generates from extender/api/openapi.py: it must admit every real request body."""
    spec = document()
    verb = capture.split("--")[1].split(".")[0]
    schema = spec["paths"][f"/{verb}"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    resolvable = _json_schema({**schema, "components": spec["components"]})
    jsonschema.validate(_capture(capture), resolvable)


@pytest.mark.parametrize(("deadline", "parsed"), [(None, None), (1, 1), (3600, 3600), (2**31 - 1, 2**31 - 1)])
def test_a_pods_active_deadline_is_read_as_kube_apiserver_admits_it(deadline: int | None, parsed: int | None) -> None:
    spec: dict[str, object] = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    pod = parse_pod({"metadata": {"name": "p", "namespace": "ml", "uid": "u"}, "spec": spec}, AnnotationKeys())
    assert (pod.problem, pod.deadline_seconds) == (None, parsed)


@pytest.mark.parametrize(("value", "parsed", "problem"), [
    (None, None, None), ("0", 0.0, None), (" 0.3 ", 0.3, None), ("0.05", 0.05, None), ("1", 1.0, None),
    ("1.00", 1.0, None),
    ("1.5", None, "gpu-topology.io/comm-share: '1.5' is not a share from 0 to 1 with at most two decimals"),
    ("-0", None, "gpu-topology.io/comm-share: '-0' is not a share"), ("0.333", None, "'0.333' is not a share"),
    ("30%", None, "'30%' is not a share"), ("nan", None, "'nan' is not a share"), ("1e-1", None, "'1e-1'"),
    ("0." + "0" * 10_000, None, "is not a share")])
def test_a_pods_communication_share_is_a_bounded_decimal_or_the_pod_is_refused_with_why(
        value: str | None, parsed: float | None, problem: str | None) -> None:
    annotations = {} if value is None else {"gpu-topology.io/comm-share": value}
    pod = parse_pod({"metadata": {"name": "p", "namespace": "ml", "uid": "u", "annotations": annotations},
                     "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}},
                    AnnotationKeys())
    assert pod.comm_share == parsed
    assert (pod.problem is None) if problem is None else (problem in (pod.problem or ""))
