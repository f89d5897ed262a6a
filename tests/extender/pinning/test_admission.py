"""At a pod's creation the webhook names the claims of its pinnable templates, and nothing else."""

from __future__ import annotations

import base64
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient
from helpers.dra_board import CROSSED, dra_cluster, template

from extender.api.admission import parse_review, review_answer
from extender.api.wire import BadRequest, NotJson
from extender.demo.cluster import DemoCluster
from extender.pinning.admission import name_claims
from extender.server.app import ADMISSION_PATH, create_app
from extender.verbs.service import ExtenderService
from topology import bounds

KEY = "gpu-topology.io/claim-templates"


def _pod(claims: list[dict[str, Any]], **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"generateName": "train-", **metadata},
            "spec": {"containers": [{"name": "c", "resources": {"claims": [{"name": "gpus"}]}}],
                     "resourceClaims": claims}}


def _review(pod: dict[str, Any], operation: str = "CREATE") -> bytes:
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                         "request": {"uid": "r-1", "namespace": "ml", "operation": operation, "object": pod}})


def _state() -> Any:
    state = dra_cluster({"a": CROSSED})
    state.templates.apply("ADDED", template())
    state.templates.apply("ADDED", template("picky", selectors=[{"cel": {"expression": "true"}}]))
    state.templates.apply("ADDED", template("all", allocationMode="All"))
    return state


def test_a_pinnable_template_becomes_a_named_claim_and_the_annotation_says_its_template() -> None:
    state = _state()
    pod = _pod([{"name": "gpus", "resourceClaimTemplateName": "two-gpus"},
                {"name": "other", "resourceClaimTemplateName": "picky"}])
    patch = name_claims(parse_review(_review(pod)), state.dra, state.keys, token=lambda: "x7k2p")
    assert patch == [
        {"op": "replace", "path": "/spec/resourceClaims/0",
         "value": {"name": "gpus", "resourceClaimName": "train-gpus-x7k2p"}},
        {"op": "add", "path": "/metadata/annotations", "value": {KEY: "gpus=two-gpus"}}]


def test_an_existing_annotation_map_gets_one_key_added_by_its_escaped_pointer() -> None:
    state = _state()
    pod = _pod([{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}], annotations={"a": "b"})
    patch = name_claims(parse_review(_review(pod)), state.dra, state.keys, token=lambda: "x7k2p")
    assert patch[-1] == {"op": "add", "path": "/metadata/annotations/gpu-topology.io~1claim-templates",
                         "value": "gpus=two-gpus"}


@pytest.mark.parametrize("case", ["selectors", "all", "unknown", "group", "bound", "update", "named", "again"])
def test_what_a_pin_cannot_say_is_left_as_written(case: str) -> None:
    state = _state()
    claim = {"name": "gpus", "resourceClaimTemplateName": {"selectors": "picky", "all": "all",
                                                           "unknown": "nope"}.get(case, "two-gpus")}
    metadata: dict[str, Any] = {}
    if case == "group":
        metadata["annotations"] = {"gpu-topology.io/group": "job"}
    if case == "again":
        metadata["annotations"] = {KEY: "gpus=two-gpus"}
    if case == "named":
        claim = {"name": "gpus", "resourceClaimName": "mine"}
    pod = _pod([claim], **metadata)
    if case == "bound":
        pod["spec"]["nodeName"] = "a"
    review = parse_review(_review(pod, "UPDATE" if case == "update" else "CREATE"))
    assert name_claims(review, state.dra, state.keys) == []


def test_a_long_pod_name_gives_a_claim_name_of_at_most_63_characters_as_the_controller_cuts_it() -> None:
    state = _state()
    pod = _pod([{"name": "gpus-" + "c" * 50, "resourceClaimTemplateName": "two-gpus"}], name="p" * 200)
    patch = name_claims(parse_review(_review(pod)), state.dra, state.keys)
    name = patch[0]["value"]["resourceClaimName"]
    assert len(name) <= 63 and bounds.DNS_SUBDOMAIN.fullmatch(name)
    assert name.startswith("ppp") and "-gpus-ccc" in name


def test_a_template_refused_is_not_kept_and_says_why() -> None:
    state = _state()
    state.templates.apply("ADDED", {"metadata": {"name": "bad", "namespace": "ml"},
                                    "spec": {"spec": {"devices": {"requests": [{"name": "gpus"}]}}}})
    assert state.dra.template("ml", "bad") is None
    assert "exactly one of exactly and firstAvailable" in state.dra.refused["ResourceClaimTemplate ml/bad"]


@pytest.mark.parametrize("body, error", [
    (b"{", NotJson), (b"[]", BadRequest), (b'{"request": {"uid": "", "object": {}}}', BadRequest),
    (b'{"request": {"uid": "u", "object": {"kind": "Secret"}}}', BadRequest),
    (b'{"request": {"uid": "u", "namespace": 7, "object": {}}}', BadRequest)])
def test_a_body_that_is_no_pod_review_is_refused(body: bytes, error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_review(body)


def test_the_route_answers_an_admission_review_whose_patch_applies_to_the_pod() -> None:
    state = _state()
    service = ExtenderService(state, DemoCluster(state), pin_claims=True)
    client = TestClient(create_app(service))
    pod = _pod([{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}])
    answer = client.post(ADMISSION_PATH, content=_review(pod)).json()
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == ("r-1", True, "JSONPatch")
    patch = orjson.loads(base64.b64decode(response["patch"]))
    assert patch[0]["value"]["resourceClaimName"].startswith("train-gpus-")
    assert service.metrics.decisions.labels("admission", "named")._value.get() == 1
    # Off (no --pin-claims): the pod is admitted as written.
    plain = TestClient(create_app(ExtenderService(state, DemoCluster(state))))
    assert plain.post(ADMISSION_PATH, content=_review(pod)).json()["response"] == {"uid": "r-1", "allowed": True}
    assert orjson.loads(review_answer("u")) == {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                                "response": {"uid": "u", "allowed": True}}

