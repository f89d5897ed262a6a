"""The extender's HTTP surface as an OpenAPI 3.0 document, written from the wire types in `extender.api.wire`.

It is not served: kube-scheduler needs no schema, and what is not served cannot be abused. `make fuzz` hands
it to schemathesis, and the tests check the real kube-scheduler bodies against it, so it cannot drift from
what the scheduler sends. Bounds are those `extender.api.wire` and `extender.api.pod_request` enforce.
"""

from __future__ import annotations

from typing import Any

from extender.api.pod_request import MAX_NAME_CHARS, MAX_NAMESPACE_CHARS, MAX_UID_CHARS, MAX_VERSION_CHARS

Schema = dict[str, Any]


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _string(max_length: int) -> Schema:
    return {"type": "string", "maxLength": max_length}


def _nullable(schema: Schema) -> Schema:
    return {**schema, "nullable": True}


_QUANTITIES: Schema = {"type": "object", "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}

SCHEMAS: dict[str, Schema] = {
    "ObjectMeta": {"type": "object", "properties": {
        "name": _string(MAX_NAME_CHARS), "namespace": _string(MAX_NAMESPACE_CHARS), "uid": _string(MAX_UID_CHARS),
        "resourceVersion": _string(MAX_VERSION_CHARS),
        "annotations": _nullable({"type": "object", "additionalProperties": {"type": "string"}})}},
    "Container": {"type": "object", "properties": {
        "name": _string(MAX_NAME_CHARS), "restartPolicy": _nullable(_string(MAX_NAME_CHARS)),
        "resources": {"type": "object", "properties": {"requests": _QUANTITIES, "limits": _QUANTITIES}}}},
    "Pod": {"type": "object", "required": ["metadata"], "properties": {
        "metadata": _ref("ObjectMeta"),
        "spec": {"type": "object", "properties": {
            "containers": {"type": "array", "items": _ref("Container")},
            "initContainers": _nullable({"type": "array", "items": _ref("Container")}),
            "overhead": _nullable(_QUANTITIES)}}}},
    "Node": {"type": "object", "required": ["metadata"], "properties": {
        "metadata": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": MAX_NAME_CHARS}}}}},
    "ExtenderArgs": {"type": "object", "required": ["Pod"], "properties": {
        "Pod": _ref("Pod"),
        "Nodes": _nullable({"type": "object", "properties": {"items": {"type": "array", "items": _ref("Node")}}}),
        "NodeNames": _nullable({"type": "array", "items": {"type": "string", "minLength": 1,
                                                            "maxLength": MAX_NAME_CHARS}})}},
    # Nodes is answered only to a request that sent Nodes (nodeCacheCapable: false), NodeNames always.
    "ExtenderFilterResult": {"type": "object", "required": ["NodeNames", "FailedNodes", "FailedAndUnresolvableNodes",
                                                            "Error"], "properties": {
        "Nodes": _nullable({"type": "object"}), "NodeNames": _nullable({"type": "array", "items": {"type": "string"}}),
        "FailedNodes": {"type": "object", "additionalProperties": {"type": "string"}},
        "FailedAndUnresolvableNodes": {"type": "object", "additionalProperties": {"type": "string"}},
        "Error": {"type": "string"}}},
    "HostPriorityList": {"type": "array", "items": {"type": "object", "required": ["Host", "Score"], "properties": {
        "Host": {"type": "string"}, "Score": {"type": "integer", "minimum": 0, "maximum": 10}}}},
    "ExtenderBindingArgs": {"type": "object", "required": ["PodName", "PodNamespace", "PodUID", "Node"],
                            "properties": {"PodName": _string(MAX_NAME_CHARS), "PodNamespace": _string(MAX_NAME_CHARS),
                                           "PodUID": _string(MAX_UID_CHARS), "Node": _string(MAX_NAME_CHARS)}},
    "Error": {"type": "object", "required": ["Error"], "properties": {"Error": {"type": "string"}}},
    "MetaVictims": {"type": "object", "properties": {
        "Pods": {"type": "array", "items": {"type": "object", "required": ["UID"],
                                            "properties": {"UID": _string(MAX_UID_CHARS)}}},
        "NumPDBViolations": {"type": "integer", "minimum": 0}}},
    "ExtenderPreemptionArgs": {"type": "object", "required": ["Pod"], "properties": {
        "Pod": _ref("Pod"),
        "NodeNameToMetaVictims": _nullable({"type": "object", "additionalProperties": _ref("MetaVictims")})}},
    "ExtenderPreemptionResult": {"type": "object", "required": ["NodeNameToMetaVictims"], "properties": {
        "NodeNameToMetaVictims": {"type": "object", "additionalProperties": _ref("MetaVictims")}}},
}


def _verb(summary: str, request: str, answer: str) -> Schema:
    """A verb: 200 for every extender request (its problems in the answer), 400 for non-JSON, 413 past the limit."""
    json_of = lambda name: {"application/json": {"schema": _ref(name)}}  # noqa: E731
    return {"post": {"summary": summary, "operationId": summary.split()[0],
                     "requestBody": {"required": True, "content": json_of(request)},
                     "responses": {"200": {"description": "the answer", "content": json_of(answer)},
                                   "400": {"description": "the body is not JSON", "content": json_of("Error")},
                                   "413": {"description": "the body is over MAX_BODY_BYTES",
                                           "content": json_of("Error")},
                                   "408": {"description": "the request did not arrive within its deadline"}}}}


def _probe(summary: str, codes: tuple[str, ...], media: str = "text/plain") -> Schema:
    return {"get": {"summary": summary, "operationId": summary.split()[0],
                    "responses": {code: {"description": summary, "content": {media: {"schema": {"type": "string"}}}}
                                  for code in codes}}}


def document() -> Schema:
    return {
        "openapi": "3.0.3",
        "info": {"title": "gpu-topology-extender", "version": "v1",
                 "description": "kube-scheduler extender verbs (k8s.io/kube-scheduler/extender/v1) and probes"},
        "paths": {
            "/filter": _verb("filter the candidate nodes", "ExtenderArgs", "ExtenderFilterResult"),
            "/prioritize": _verb("prioritize the candidate nodes, 0 to 10", "ExtenderArgs", "HostPriorityList"),
            "/preempt": _verb("preempt: keep the victims that free a usable set", "ExtenderPreemptionArgs",
                              "ExtenderPreemptionResult"),
            "/bind": _verb("bind the pod to its GPUs", "ExtenderBindingArgs", "Error"),
            "/healthz": _probe("healthz liveness", ("200",)),
            "/readyz": _probe("readyz readiness", ("200", "503")),
            "/metrics": _probe("metrics in Prometheus text", ("200",), "text/plain; version=0.0.4; charset=utf-8"),
        },
        "components": {"schemas": SCHEMAS},
    }
