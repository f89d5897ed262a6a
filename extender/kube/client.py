"""The Kubernetes edge: the few API calls the extender makes, behind one narrow interface.

`KubeApi` is what the rest of the extender sees; `KubernetesApi` implements it with the official client
(`CoreV1Api`). Objects come back as the raw JSON dicts the API server sends (camelCase), the same shape as
the objects inside kube-scheduler's request bodies, and parsing thousands of them with orjson is far cheaper
than building client models. So every call uses `_preload_content=False` and reads the body itself, which
also steps around the client's failure to deserialize a Binding's `Status` reply.

Errors: every failure is a `KubeError` with the HTTP status (or None) and a short message; `Conflict`
(409), `Gone` (410) and `Unreachable` (refused, reset, timed out, DNS, a broken stream) are subclasses.
No urllib3 or client exception reaches the caller.

Every call is one HTTP attempt bounded by a timeout (urllib3's own retries are switched off by the
factories): retrying is the caller's policy. The reflector backs off, and a failed bind goes back to
kube-scheduler, which retries the pod.
"""

from __future__ import annotations

import asyncio
import http.client
import logging
import os
import socket
import time
from collections.abc import Generator, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol, Self
from urllib.parse import quote

import orjson
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from extender.api.group_request import PodGroupKind
from extender.kube.binding_writer import ApiWriter, endpoint_of
from topology.api_status import status_message

log = logging.getLogger(__name__)

COMPONENT = "gpu-topology-extender"
ACTIVE_PODS = "status.phase!=Succeeded,status.phase!=Failed"
EVENT_MESSAGE_MAX = 1024

_TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError)


class KubeError(Exception):
    """A failed API call: `status` is the HTTP status code, None when there was no answer."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Conflict(KubeError):
    """409: the object changed or is already bound."""


class Gone(KubeError):
    """410: the resourceVersion is no longer retained; list again."""


class Unreachable(KubeError):
    """No usable answer: connection refused or reset, a timeout, DNS, a stream cut short."""


class KubeApi(Protocol):
    """The Kubernetes calls the extender needs. Objects are raw JSON dicts as the API serves them."""

    def list_nodes(self) -> tuple[list[dict], str]: ...

    def list_pods(self) -> tuple[list[dict], str]: ...

    def watch_nodes(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict]]: ...

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> Iterator[tuple[str, dict]]: ...

    def get_pod(self, namespace: str, name: str) -> dict: ...

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None: ...

    def bind_soon(self, namespace: str, name: str, uid: str, node: str,
                  annotations: Mapping[str, str]) -> asyncio.Future[None] | None:
        """`bind` on the running event loop, or None where the API has no such way (`bind` on a thread then)."""

    def emit_event(
        self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str, event_type: str = "Warning"
    ) -> None: ...


def _error(status: int | None, message: str) -> KubeError:
    if status == 409:
        return Conflict(message, status)
    if status == 410:
        return Gone(message, status)
    return KubeError(message, status)


def _translate(exc: BaseException, what: str) -> KubeError:
    """Any failure of the client or of the transport, as a KubeError naming the call."""
    if isinstance(exc, ApiException):
        if not exc.status:  # the client's own failures (TLS, content type) carry status 0
            return KubeError(f"{what}: {exc.reason}", None)
        detail = status_message(exc.body) or exc.reason or "error"
        return _error(exc.status, f"{what}: {exc.status} {detail}")
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        exc = exc.reason
    return Unreachable(f"{what}: {type(exc).__name__}: {exc}")


def _read(resp: Any, what: str) -> bytes:
    """The whole body of a response taken with `_preload_content=False`; the connection goes back to the pool."""
    try:
        return resp.data
    except _TRANSPORT_ERRORS as exc:
        resp.close()
        raise _translate(exc, what) from None
    finally:
        resp.release_conn()


def _parse(body: bytes, what: str) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        raise KubeError(f"{what}: the answer is not JSON") from None


class WatchStream:
    """The events of one watch request: an iterator of (type, raw object).

    `close()` may be called from another thread: it shuts the socket down, so a reader blocked on a quiet
    stream wakes at once (and sees `Unreachable`). The response is always closed, never returned to the
    pool half-read.

    BOOKMARK events are passed on as ("BOOKMARK", obj): they carry a newer resourceVersion and nothing else,
    and the reflector records the version without handing them to its sink. An ERROR event raises: `Gone`
    for 410, `KubeError` with the Status code otherwise.
    """

    def __init__(self, open_response: Any, what: str) -> None:
        self._what = what
        self._closed = False
        self._resp: Any = None
        self._events = self._generate(open_response)

    def __iter__(self) -> Self:
        return self

    def __next__(self) -> tuple[str, dict]:
        return next(self._events)

    def close(self) -> None:
        self._closed = True
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._events.close()
        except ValueError:  # running in another thread, which now wakes and cleans up
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _generate(self, open_response: Any) -> Generator[tuple[str, dict], None, None]:
        what = self._what
        try:
            self._resp = open_response()
        except (ApiException, *_TRANSPORT_ERRORS) as exc:
            raise _translate(exc, what) from None
        resp = self._resp
        buffer = b""
        try:
            if self._closed:  # closed while the request was being answered
                return
            for chunk in resp.stream(None, decode_content=True):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield self._event(line)
            if buffer.strip():
                yield self._event(buffer)
        except _TRANSPORT_ERRORS as exc:
            if self._closed:
                return
            raise _translate(exc, f"{what} stream") from None
        finally:
            resp.close()
            resp.release_conn()

    def _event(self, line: bytes) -> tuple[str, dict]:
        event = _parse(line, self._what)
        kind, obj = (event.get("type"), event.get("object")) if isinstance(event, dict) else (None, None)
        if not isinstance(kind, str) or not isinstance(obj, dict):
            raise KubeError(f"{self._what}: malformed watch event")
        if kind == "ERROR":
            code = obj.get("code") if isinstance(obj.get("code"), int) else None
            raise _error(code, f"{self._what}: {code} {obj.get('reason', '')}: {obj.get('message', '')}")
        return kind, obj


def _binding(namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> tuple[str, str, bytes]:
    """What a bind posts: (what, path, body)."""
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": name, "namespace": namespace, "uid": uid, "annotations": dict(annotations)},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    return (f"bind pod {namespace}/{name} to {node}",
            f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding",
            orjson.dumps(binding))


def _checked(what: str, status: int, data: bytes, reason: str) -> bytes:
    """The body of a 2xx answer; any other status raises as its code says."""
    if not 200 <= status < 300:
        raise _error(status, f"{what}: {status} {status_message(data) or reason or 'error'}")
    return data


class KubernetesApi:
    """`KubeApi` through the official client. `timeout` bounds each write and the connect of every call;
    `list_timeout` is the read timeout of a list; a watch's read timeout is its server-side
    `timeout_seconds` plus `timeout`, so a silent connection is noticed soon after the server should have
    ended it. Build it with a factory: given a bare `ApiClient`, urllib3's default retries still apply."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        timeout: float = 5.0,
        list_timeout: float = 60.0,
        instance: str | None = None,
    ) -> None:
        self._client = api_client
        # The client talks to the server directly unless its configuration names a proxy (then its pool is a
        # ProxyManager or SOCKSProxyManager, which the writer does not replace).
        direct = type(api_client.rest_client.pool_manager) is urllib3.PoolManager
        self._writer = ApiWriter(endpoint_of(api_client.configuration)) if direct else None
        self._core = k8s.CoreV1Api(api_client)
        self._coordination = k8s.CoordinationV1Api(api_client)
        self._custom = k8s.CustomObjectsApi(api_client)
        self._resource = k8s.ResourceV1Api(api_client)
        self.timeout = timeout
        self.list_timeout = list_timeout
        self.instance = instance or os.environ.get("POD_NAME") or socket.gethostname()

    @classmethod
    def from_configuration(cls, configuration: k8s.Configuration, **kwargs: Any) -> KubernetesApi:
        """One HTTP attempt per call (urllib3 would otherwise retry a timed-out GET three times)."""
        configuration.retries = urllib3.Retry(total=0, raise_on_redirect=False)
        return cls(k8s.ApiClient(configuration), **kwargs)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None, **kwargs: Any) -> KubernetesApi:
        """From a kubeconfig file; None means $KUBECONFIG or ~/.kube/config."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_kube_config(config_file=path, context=context, client_configuration=configuration)
        except (k8s_config.ConfigException, OSError, ValueError) as exc:
            raise KubeError(f"kubeconfig {path or '(default)'}: {exc}") from None
        return cls.from_configuration(configuration, **kwargs)

    @classmethod
    def in_cluster(cls, **kwargs: Any) -> KubernetesApi:
        """From the pod's service account (the token is re-read as it rotates)."""
        configuration = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except (k8s_config.ConfigException, OSError) as exc:
            raise KubeError(f"in-cluster config: {exc}") from None
        return cls.from_configuration(configuration, **kwargs)

    # -- reads -------------------------------------------------------------------------------------------

    def _call(self, what: str, method: Any, /, *args: Any, **kwargs: Any) -> bytes:
        """One request with `_preload_content=False`: the raw body, or a KubeError."""
        try:
            resp = method(*args, _preload_content=False, **kwargs)
        except (ApiException, *_TRANSPORT_ERRORS) as exc:
            raise _translate(exc, what) from None
        return _read(resp, what)

    def _object(self, what: str, kind: str, method: Any, /, *args: Any) -> dict:
        """One object (a Pod, a Lease) by a call bounded by `timeout`, or a KubeError."""
        body = self._call(what, method, *args, _request_timeout=(self.timeout, self.timeout))
        parsed = _parse(body, what)
        if not isinstance(parsed, dict):
            raise KubeError(f"{what}: the answer is not a {kind}")
        return parsed

    def _list(self, what: str, method: Any, **kwargs: Any) -> tuple[list[dict], str]:
        body = self._call(what, method, _request_timeout=(self.timeout, self.list_timeout), **kwargs)
        parsed = _parse(body, what)
        if not isinstance(parsed, dict):
            raise KubeError(f"{what}: the answer is not a list object")
        items = parsed.get("items") or []
        resource_version = (parsed.get("metadata") or {}).get("resourceVersion") or ""
        return items, resource_version

    def list_nodes(self) -> tuple[list[dict], str]:
        return self._list("list nodes", self._core.list_node)

    def list_pods(self) -> tuple[list[dict], str]:
        """Pods of every namespace that are not finished (Succeeded or Failed)."""
        return self._list("list pods", self._core.list_pod_for_all_namespaces, field_selector=ACTIVE_PODS)

    def _watch(self, what: str, method: Any, resource_version: str, timeout_seconds: int, **kwargs: Any) -> WatchStream:
        def open_response() -> Any:
            return method(
                watch=True,
                allow_watch_bookmarks=True,
                resource_version=resource_version,
                timeout_seconds=int(timeout_seconds),
                _preload_content=False,
                _request_timeout=(self.timeout, timeout_seconds + self.timeout),
                **kwargs,
            )

        return WatchStream(open_response, what)

    def watch_nodes(self, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self._watch("watch nodes", self._core.list_node, resource_version, timeout_seconds)

    def watch_pods(self, resource_version: str, timeout_seconds: int) -> WatchStream:
        """Pods leaving the active selector (finishing) arrive as DELETED."""
        return self._watch(
            "watch pods",
            self._core.list_pod_for_all_namespaces,
            resource_version,
            timeout_seconds,
            field_selector=ACTIVE_PODS,
        )

    def list_pod_groups(self, kind: PodGroupKind) -> tuple[list[dict], str]:
        """PodGroup objects of one kind (extender/groups/sizes.py), in every namespace."""
        return self._list(f"list {kind.plural}.{kind.group}", self._custom.list_cluster_custom_object,
                          group=kind.group, version=kind.version, plural=kind.plural)

    def watch_pod_groups(self, kind: PodGroupKind, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self._watch(f"watch {kind.plural}.{kind.group}", self._custom.list_cluster_custom_object,
                           resource_version, timeout_seconds, group=kind.group, version=kind.version,
                           plural=kind.plural)

    def list_resource_slices(self) -> tuple[list[dict], str]:
        return self._list("list resourceslices", self._resource.list_resource_slice)

    def watch_resource_slices(self, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self._watch("watch resourceslices", self._resource.list_resource_slice, resource_version,
                           timeout_seconds)

    def list_resource_claims(self) -> tuple[list[dict], str]:
        return self._list("list resourceclaims", self._resource.list_resource_claim_for_all_namespaces)

    def watch_resource_claims(self, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self._watch("watch resourceclaims", self._resource.list_resource_claim_for_all_namespaces,
                           resource_version, timeout_seconds)

    def list_resource_claim_templates(self) -> tuple[list[dict], str]:
        return self._list("list resourceclaimtemplates", self._resource.list_resource_claim_template_for_all_namespaces)

    def watch_resource_claim_templates(self, resource_version: str, timeout_seconds: int) -> WatchStream:
        return self._watch("watch resourceclaimtemplates",
                           self._resource.list_resource_claim_template_for_all_namespaces, resource_version,
                           timeout_seconds)

    # -- writes ------------------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> dict:
        """The pod as the API server has it now (bind reads it when the watch has not delivered it yet)."""
        return self._object(f"get pod {namespace}/{name}", "Pod", self._core.read_namespaced_pod, name, namespace)

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: Mapping[str, str]) -> None:
        """POST pods/{name}/binding. The API server sets `spec.nodeName` and merges the Binding's annotations
        into the pod in one write (`BindingREST.setPodNodeAndMetadata`), and refuses it (409) if the pod's UID is
        not `uid` (a pod recreated under the same name) or the pod is already bound."""
        self._post(*_binding(namespace, name, uid, node, annotations))

    def bind_soon(self, namespace: str, name: str, uid: str, node: str,
                  annotations: Mapping[str, str]) -> asyncio.Future[None] | None:
        """`bind` answered on the running event loop (ApiWriter.post_soon), or None when it cannot be: a proxy
        stands between, or no connection is idle. The future fails as `bind` raises, and with StaleConnection
        when the Binding should be posted again with `bind`."""
        if self._writer is None:
            return None
        what, path, body = _binding(namespace, name, uid, node, annotations)
        posted = self._writer.post_soon(path, body, self._headers(), self.timeout)
        if posted is None:
            return None
        bound: asyncio.Future[None] = posted.get_loop().create_future()

        def settle(posted: asyncio.Future[tuple[int, bytes]]) -> None:
            if bound.done():
                return
            if posted.cancelled():
                bound.cancel()
                return
            error = posted.exception()
            if isinstance(error, _TRANSPORT_ERRORS):
                bound.set_exception(_translate(error, what))
            elif error is not None:
                bound.set_exception(error)
            else:
                try:
                    _checked(what, *posted.result(), "")
                except KubeError as refused:
                    bound.set_exception(refused)
                else:
                    bound.set_result(None)
        posted.add_done_callback(settle)
        return bound

    def _headers(self) -> dict[str, str]:
        """JSON both ways, and the client's own credentials: every header the configuration's auth settings name
        (the bearer token's identifier in `api_key` differs between client releases; these settings do not), read
        per call, as the configuration rotates a token."""
        configuration = self._client.configuration
        headers = {"Content-Type": "application/json", "Accept": "application/json",
                   "User-Agent": self._client.user_agent}
        for setting in configuration.auth_settings().values():
            if setting.get("in") == "header" and setting.get("value"):
                headers[setting["key"]] = setting["value"]
        return headers

    def _post(self, what: str, path: str, body: bytes) -> bytes:
        """POST a body already serialized, with the client's TLS settings and credentials, through `ApiWriter`
        unless a proxy stands between. A bind per pod makes this the extender's busiest write: the generated
        method builds and validates a model each time (kubernetes 37), and urllib3 with http.client cost 6 times
        the writer's CPU (api_writer.py)."""
        headers = self._headers()
        try:
            if self._writer is not None:
                status, data = self._writer.post(path, body, headers, self.timeout)
                reason = ""
            else:
                resp = self._client.rest_client.pool_manager.request(
                    "POST", self._client.configuration.host + path, body=body, headers=headers,
                    preload_content=False, timeout=urllib3.Timeout(connect=self.timeout, read=self.timeout))
                status, data, reason = resp.status, _read(resp, what), resp.reason
        except _TRANSPORT_ERRORS as exc:
            raise _translate(exc, what) from None
        return _checked(what, status, data, reason)

    def create_resource_claim(self, namespace: str, claim: Mapping[str, Any]) -> dict:
        """Create a ResourceClaim (the planner's pinned claims, extender/pinning/planner.py)."""
        name = (claim.get("metadata") or {}).get("name")
        return self._object(f"create resourceclaim {namespace}/{name}", "ResourceClaim",
                            self._resource.create_namespaced_resource_claim, namespace, dict(claim))

    def delete_resource_claim(self, namespace: str, name: str, uid: str, resource_version: str) -> None:
        """Delete a claim only as it was (its UID and resourceVersion as preconditions): a 409 if it changed, as
        when kube-scheduler allocated it meanwhile."""
        self._call(f"delete resourceclaim {namespace}/{name}", self._resource.delete_namespaced_resource_claim, name,
                   namespace, body={"preconditions": {"uid": uid, "resourceVersion": resource_version}},
                   _request_timeout=(self.timeout, self.timeout))

    def label_pod(self, namespace: str, name: str, labels: Mapping[str, str | None]) -> None:
        """Merge-patch the labels of one pod (None removes a label). The leader marks its own Pod with it, so the
        Service routes to the leader alone (extender/kube/leader_label.py)."""
        self._call(
            f"label pod {namespace}/{name}",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            {"metadata": {"labels": dict(labels)}},
            _content_type="application/merge-patch+json",
            _request_timeout=(self.timeout, self.timeout),
        )

    # -- the leader election's Lease (extender.kube.leader_election.LeaseApi) ------------------------------------------

    def get_lease(self, namespace: str, name: str) -> dict | None:
        """The Lease, or None when there is none yet."""
        try:
            return self._object(f"get lease {namespace}/{name}", "Lease", self._coordination.read_namespaced_lease,
                                name, namespace)
        except KubeError as error:
            if error.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, lease: dict) -> dict:
        """Create the Lease; a 409 (`Conflict`) when another replica created it first."""
        name = (lease.get("metadata") or {}).get("name")
        return self._object(f"create lease {namespace}/{name}", "Lease", self._coordination.create_namespaced_lease,
                            namespace, lease)

    def replace_lease(self, namespace: str, name: str, lease: dict) -> dict:
        """Update the Lease at the resourceVersion in `lease`; a 409 (`Conflict`) when it changed meanwhile."""
        return self._object(f"update lease {namespace}/{name}", "Lease", self._coordination.replace_namespaced_lease,
                            name, namespace, lease)

    def emit_event(
        self, namespace: str, pod_name: str, pod_uid: str, reason: str, message: str, event_type: str = "Warning"
    ) -> None:
        """A core/v1 Event on the pod. Never raises: a failure is logged, since an event must not fail a
        scheduling decision."""
        now = datetime.now(UTC).replace(microsecond=0)
        event = k8s.CoreV1Event(
            api_version="v1",
            kind="Event",
            metadata=k8s.V1ObjectMeta(name=f"{pod_name}.{time.time_ns():x}", namespace=namespace),
            involved_object=k8s.V1ObjectReference(
                api_version="v1", kind="Pod", name=pod_name, namespace=namespace, uid=pod_uid
            ),
            reason=reason,
            message=message[:EVENT_MESSAGE_MAX],
            type=event_type,
            source=k8s.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self.instance,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self._call(
                f"event {reason} on pod {namespace}/{pod_name}",
                self._core.create_namespaced_event,
                namespace,
                event,
                _request_timeout=(self.timeout, self.timeout),
            )
        except Exception as exc:  # noqa: BLE001 - an event is best effort, whatever went wrong
            log.warning("could not emit event: %s", exc)
