"""This node through the official `kubernetes` client: GET it, and merge-patch our annotations. The edge
that imports Kubernetes.

Each call makes one HTTP attempt with a connect and read timeout (urllib3's own retries are off), and any
failure is a `NodeApiError` carrying the HTTP status (None when there was no answer: refused, reset, timed
out). The loop retries every one with jittered backoff; the message says what to fix where a person must
(RBAC, a wrong NODE_NAME).

The patch is a JSON merge patch (RFC 7386) of `metadata.annotations` only, so it touches no other field
and no other annotation, needs no resourceVersion and cannot conflict; a null value deletes the key. The
reporter needs `get` and `patch` on its own node and nothing else.
"""

from __future__ import annotations

import http.client
import inspect
from collections.abc import Mapping
from typing import Any

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from topology.agent.reporter import NodeError
from topology.api_status import status_message

MERGE_PATCH = "application/merge-patch+json"
# Clients before the OpenAPI-generator rewrite cannot choose a patch type; they send a dict as a strategic
# merge patch, which for a map of strings such as annotations means the same (null deletes).
_CHOOSES_PATCH_TYPE = "_content_type" in inspect.signature(k8s.CoreV1Api.patch_node).parameters
_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


class NodeApiError(NodeError):
    """A failed call: `status` is the HTTP status, None when there was no usable answer."""


class NodeApi:
    """GET and PATCH of one node. `timeout` (seconds) bounds the connect and the read of each call."""

    def __init__(self, api_client: k8s.ApiClient, node_name: str, *, timeout: float = 5.0) -> None:
        self._core = k8s.CoreV1Api(api_client)
        self.node_name = node_name
        self.timeout = timeout

    @classmethod
    def from_configuration(cls, configuration: k8s.Configuration, node_name: str, **kwargs: Any) -> NodeApi:
        configuration.retries = urllib3.Retry(total=0, raise_on_redirect=False)
        return cls(k8s.ApiClient(configuration), node_name, **kwargs)

    @classmethod
    def from_kubeconfig(cls, path: str | None, node_name: str, **kwargs: Any) -> NodeApi:
        configuration = k8s.Configuration()
        try:
            k8s_config.load_kube_config(config_file=path, client_configuration=configuration)
        except (k8s_config.ConfigException, OSError, ValueError) as error:
            raise NodeApiError(f"kubeconfig {path or '(default)'}: {error}") from None
        return cls.from_configuration(configuration, node_name, **kwargs)

    @classmethod
    def in_cluster(cls, node_name: str, **kwargs: Any) -> NodeApi:
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except (k8s_config.ConfigException, OSError) as error:
            raise NodeApiError(f"in-cluster config: {error}") from None
        return cls.from_configuration(configuration, node_name, **kwargs)

    def annotations(self) -> dict[str, str]:
        """The node's annotations now."""
        return _annotations(self._call("get", self._core.read_node, self.node_name))

    def patch_annotations(self, annotations: Mapping[str, str | None]) -> dict[str, str]:
        """Merge-patch `annotations` (None deletes a key); the node's annotations after the patch."""
        body = {"metadata": {"annotations": dict(annotations)}}
        extra = {"_content_type": MERGE_PATCH} if _CHOOSES_PATCH_TYPE else {}
        return _annotations(self._call("patch", self._core.patch_node, self.node_name, body, **extra))

    def _call(self, verb: str, method: Any, /, *args: Any, **kwargs: Any) -> Any:
        what = f"{verb} node {self.node_name}"
        response = None
        try:
            response = method(*args, _preload_content=False, _request_timeout=(self.timeout, self.timeout), **kwargs)
            body = response.data
        except ApiException as error:
            raise self._api_error(what, error) from None
        except _TRANSPORT_ERRORS as error:
            if response is not None:  # cut off mid-body: never hand the connection back to the pool
                response.close()
            if isinstance(error, urllib3.exceptions.MaxRetryError) and error.reason is not None:
                error = error.reason
            raise NodeApiError(f"{what}: {type(error).__name__}: {error}") from None
        finally:
            if response is not None:
                response.release_conn()
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise NodeApiError(f"{what}: the answer is not JSON") from None

    def _api_error(self, what: str, error: ApiException) -> NodeApiError:
        if not error.status:  # the client's own failures (TLS, content type) carry status 0
            return NodeApiError(f"{what}: {error.reason}")
        message = f"{what}: {error.status} {status_message(error.body) or error.reason or 'error'}"
        if error.status == 404:
            message += " (is NODE_NAME this node's name?)"
        elif error.status in (401, 403):
            message += f" (the reporter needs get and patch on nodes/{self.node_name})"
        return NodeApiError(message, error.status)


def _annotations(node: Any) -> dict[str, str]:
    if not isinstance(node, dict):
        raise NodeApiError("the answer is not a Node object")
    annotations = (node.get("metadata") or {}).get("annotations") or {}
    return {str(key): str(value) for key, value in annotations.items()}
