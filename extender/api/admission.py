"""The admission webhook's wire format (admission.k8s.io/v1 AdmissionReview): the pod asked about, the answer.

kube-apiserver sends a review of every pod created, as its MutatingWebhookConfiguration selects them
(scheduler-config/dra-pin-webhook.yaml). A body that is not such a review is refused with the field to blame; an
answer always allows the pod, at most with a JSON patch: the webhook names claims, it never keeps a pod out.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from extender.api.wire import BadRequest, NotJson

ADMISSION = "admission.k8s.io/v1"


@dataclass(frozen=True, slots=True)
class PodReview:
    uid: str  # the review's, echoed in the answer
    namespace: str
    pod: Mapping[str, Any]  # request.object, as the user wrote it (its name may still be generated)
    creating: bool


def parse_review(body: bytes) -> PodReview:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise NotJson(str(error)) from None
    request = document.get("request") if isinstance(document, dict) else None
    if not isinstance(request, dict):
        raise BadRequest("AdmissionReview: request: expected an object")
    uid, namespace, pod = request.get("uid"), request.get("namespace") or "", request.get("object")
    if not isinstance(uid, str) or not 0 < len(uid) <= 128:
        raise BadRequest("AdmissionReview: request.uid: expected 1 to 128 characters")
    if not isinstance(namespace, str) or len(namespace) > 63:
        raise BadRequest("AdmissionReview: request.namespace: expected at most 63 characters")
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod":
        raise BadRequest("AdmissionReview: request.object: expected a Pod")
    return PodReview(uid, namespace, pod, request.get("operation") == "CREATE")


def review_answer(uid: str, patch: Sequence[Mapping[str, Any]] = ()) -> bytes:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(patch))).decode()
    return orjson.dumps({"apiVersion": ADMISSION, "kind": "AdmissionReview", "response": response})
