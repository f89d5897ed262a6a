"""The pods bound to this node, through the official `kubernetes` client: the device plugin's Kubernetes edge.

Listed on every GetPreferredAllocation and Allocate with `fieldSelector=spec.nodeName=<node>`, which the
API server filters on its side, so the answer is small and never stale: no watch, no cache. The call is the
node's (`NodeApi`): one HTTP attempt with a connect and read timeout, every failure a `NodeApiError`. The
answer is bounded, in pods (`limit`) and in bytes, so no API answer can grow the agent without bound.
"""

from __future__ import annotations

import http.client
import logging
from typing import Any

from kubernetes.client.exceptions import ApiException

from topology.agent.kube import NodeApi, NodeApiError
from topology.api_status import status_message

log = logging.getLogger(__name__)

MAX_PODS = 1000  # far above a kubelet's pod limit (110 by default)
MAX_ANSWER_BYTES = 32 * 1024 * 1024


class AnswerTooLarge(http.client.HTTPException):
    """The API server's answer is over the agent's bound."""


class NodePods(NodeApi):
    """The pods on this node. Built like `NodeApi` (`from_kubeconfig`, `in_cluster`); needs `list` on pods."""

    def pods(self) -> list[dict[str, Any]]:
        """The pods whose spec.nodeName is this node, as the API serves them."""
        answer = self._call("list pods on", self._bounded, field_selector=f"spec.nodeName={self.node_name}",
                            limit=MAX_PODS)
        items = answer.get("items") if isinstance(answer, dict) else None
        if not isinstance(items, list):
            raise NodeApiError(f"list pods on node {self.node_name}: the answer is not a PodList")
        if (answer.get("metadata") or {}).get("continue"):
            log.warning("more than %d pods on node %s: the rest are not seen", MAX_PODS, self.node_name)
        return [item for item in items[:MAX_PODS] if isinstance(item, dict)]

    def _bounded(self, **kwargs: Any) -> _Bounded:
        return _Bounded(self._core.list_pod_for_all_namespaces(**kwargs), MAX_ANSWER_BYTES)

    def _api_error(self, what: str, error: ApiException) -> NodeApiError:
        if error.status in (401, 403):
            return NodeApiError(f"{what}: {error.status} {status_message(error.body) or error.reason or 'error'} "
                                "(the agent's device plugin needs list on pods)", error.status)
        return super()._api_error(what, error)


class _Bounded:
    """An unread HTTP answer whose body is read only up to `limit` bytes: a larger one fails as a transport
    error, so `NodeApi` closes its connection instead of handing it back to the pool."""

    def __init__(self, response: Any, limit: int) -> None:
        self._response = response
        self._limit = limit

    @property
    def data(self) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while chunk := self._response.read(min(1 << 20, self._limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > self._limit:
                raise AnswerTooLarge(f"the answer is over {self._limit} bytes")
        return b"".join(chunks)

    def close(self) -> None:
        self._response.close()

    def release_conn(self) -> None:
        self._response.release_conn()
