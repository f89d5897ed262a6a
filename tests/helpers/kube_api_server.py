"""An in-process Kubernetes API server for tests: the real REST paths, JSON shapes and status codes.

It speaks HTTP/1.1 on 127.0.0.1, so the official `kubernetes` client runs unchanged against it. What it
serves (core/v1 only):

    GET   /api/v1/nodes, /api/v1/pods, /api/v1/namespaces/{ns}/pods    list, or watch=true
    GET   /api/v1/nodes/{name}, /api/v1/namespaces/{ns}/pods/{name}
    GET   /api/v1/namespaces/{ns}/events                                 list (fieldSelector on involvedObject)
    GET   /api/v1/namespaces/{ns}/secrets/{name}, .../configmaps/{name}  (Helm's `lookup`, with /version, /api,
                                                                          /apis and /api/v1's discovery)
    PATCH /api/v1/nodes/{name}, /api/v1/namespaces/{ns}/pods/{name}     merge-patch (strategic = merge)
    POST  /api/v1/namespaces/{ns}/pods/{name}/binding, /api/v1/namespaces/{ns}/bindings
    POST  /api/v1/namespaces/{ns}/events
    GET, PUT, DELETE /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}; POST .../leases
    GET   /apis/resource.k8s.io/v1/resourceslices, .../resourceclaims, .../resourceclaimtemplates
                                                                          list, or watch=true (DRA's objects)
    POST  /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims       create (409 AlreadyExists)
    DELETE /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}
                                                                          with DeleteOptions' preconditions (409)

Semantics kept from the real server: one resourceVersion counter for everything (like etcd's revision);
lists carry it in `metadata.resourceVersion`; a watch from version N streams every change after N as
newline-delimited `{"type","object"}` JSON in chunks, and ends after `timeoutSeconds`; a watch from a
version older than the retained window gets an ERROR event with a 410 Expired Status; `fieldSelector`
(`=`, `==`, `!=`) filters lists and watches, and an object that stops matching arrives as DELETED;
binding a bound pod, or with the wrong UID, is a 409 Conflict Status; a Lease is created once (409
AlreadyExists after) and updated only at its current resourceVersion (409 Conflict otherwise, 422 without
one), as leader election relies on.

Test controls: `add_*`/`update_*`/`delete_*` change objects and notify watchers; `events`, `bindings`,
`patches` and `requests` record what clients did; `fail`, `drop` and `hang` make the next matching
requests answer 500 (or any code), close the connection unanswered, or stall past the client's timeout;
`compact()` expires every older version; `break_watches()` cuts open streams mid-chunk; `stop()` refuses
connections and `start()` brings the same server, with its state, back on the same port.
"""

from __future__ import annotations

import copy
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

import orjson
import pytest

NODES, PODS, LEASES = "nodes", "pods", "leases"
SLICES, CLAIMS, TEMPLATES = "resourceslices", "resourceclaims", "resourceclaimtemplates"
SECRETS, CONFIGMAPS = "secrets", "configmaps"  # read by Helm's `lookup` (tests/manifests/chart/)
_KINDS = {NODES: "Node", PODS: "Pod", LEASES: "Lease", SLICES: "ResourceSlice", CLAIMS: "ResourceClaim",
          TEMPLATES: "ResourceClaimTemplate", SECRETS: "Secret", CONFIGMAPS: "ConfigMap"}
COORDINATION = "coordination.k8s.io/v1"
RESOURCE = "resource.k8s.io/v1"
_API_VERSIONS = {SLICES: RESOURCE, CLAIMS: RESOURCE, TEMPLATES: RESOURCE}  # the rest are "v1"
_NAMESPACED = (PODS, LEASES, CLAIMS, TEMPLATES, SECRETS, CONFIGMAPS)
# The fields the real API server lets a fieldSelector name (a typo is a 400 there, and here).
_SELECTABLE = {
    NODES: {"metadata.name", "spec.unschedulable"},
    PODS: {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.schedulerName",
        "spec.restartPolicy",
        "spec.serviceAccountName",
        "status.phase",
        "status.nominatedNodeName",
    },
    # The fields kube-apiserver's resource strategies expose (pkg/registry/resource/*/strategy.go).
    SLICES: {"metadata.name", "spec.nodeName", "spec.driver"},
    CLAIMS: {"metadata.name", "metadata.namespace"},
    TEMPLATES: {"metadata.name", "metadata.namespace"},
    # The fields kube-apiserver's event field selector takes (pkg/registry/core/event/strategy.go), but source.
    "events": {
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "type",
    },
}
DEFAULT_WATCH_SECONDS = 1800


def wait_until(predicate: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    """Poll `predicate` until it holds; fail the test after `timeout` seconds (generous: CI is slow)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


@pytest.fixture(name="kube_server")
def kube_server_fixture():
    """A started FakeKubeApiServer, stopped after the test. A test module imports this function to use it."""
    server = FakeKubeApiServer().start()
    try:
        yield server
    finally:
        server.stop()


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_node(name: str, *, annotations: dict[str, str] | None = None, gpus: int = 8, labels=None) -> dict:
    """A Node as the API server serves it, with `nvidia.com/gpu` capacity."""
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "allocatable": {"cpu": "63", "memory": "500Gi", "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    gpus: int = 1,
    node_name: str | None = None,
    phase: str = "Pending",
    annotations: dict[str, str] | None = None,
    uid: str | None = None,
) -> dict:
    """A Pod with one container asking for `gpus` of `nvidia.com/gpu`."""
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"nvidia.com/gpu": str(gpus)}}
    pod = {
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "main", "image": "cuda:12", "resources": resources}],
        },
        "status": {"phase": phase},
    }
    if uid:
        pod["metadata"]["uid"] = uid
    if node_name:
        pod["spec"]["nodeName"] = node_name
    return pod


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    """A metav1.Status, as every API error (and a binding's success) is answered."""
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    if code < 400:
        del body["message"], body["reason"]
    return body


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None) -> None:
        super().__init__(message)
        self.body = status_body(code, reason, message, details)


def _not_found(resource: str, name: str) -> ApiError:
    return ApiError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})


def _conflict(resource: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": {why}',
        {"name": name, "kind": resource},
    )


def _discovery(parts: list[str]) -> dict:
    """What a client asks before it reads an object (Helm's `lookup`): the version, the API groups, and core/v1's
    resources. The groups this server serves besides core/v1 are not listed: nothing here asks discovery for them."""
    if parts == ["version"]:
        return {"major": "1", "minor": "36", "gitVersion": "v1.36.0"}
    if parts == ["api"]:
        return {"kind": "APIVersions", "versions": ["v1"]}
    if parts == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
    return {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
        {"name": resource, "singularName": _KINDS[resource].lower(), "namespaced": resource in _NAMESPACED,
         "kind": _KINDS[resource], "verbs": ["get", "list"]} for resource in (NODES, PODS, SECRETS, CONFIGMAPS)]}


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # names in lower case
    body: Any


@dataclass
class Fault:
    """What the next `times` requests matching method, path (exact, without query; None = any) and watch
    (None = either) get: action "error" (a Status with `status`), "close" (no answer), "hang", or "lose" (the
    request is carried out, then the connection closes before the answer: the client cannot know it was)."""

    action: str
    method: str | None = None
    path: str | None = None
    watch: bool | None = None
    times: int = 1
    status: int = 500

    def matches(self, method: str, path: str, watch: bool) -> bool:
        return (
            (self.method is None or self.method == method)
            and (self.path is None or self.path == path)
            and (self.watch is None or self.watch == watch)
        )


@dataclass
class _Change:
    rv: int
    resource: str
    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    obj: dict  # the object after the change (for DELETED, its last state)
    old: dict | None  # the object before, so a selector can turn a change into ADDED or DELETED
    at: float = field(default_factory=time.monotonic)  # when it was committed


@dataclass
class _Selector:
    requirements: list[tuple[str, bool, str]] = field(default_factory=list)  # (field, equal, value)

    @classmethod
    def parse(cls, text: str, resource: str) -> _Selector:
        requirements = []
        for term in filter(None, (t.strip() for t in text.split(","))):
            for op, equal in (("!=", False), ("==", True), ("=", True)):
                if op in term:
                    name, value = (s.strip() for s in term.split(op, 1))
                    break
            else:
                raise ApiError(400, "BadRequest", f'invalid field selector: "{term}"')
            if name not in _SELECTABLE[resource]:
                raise ApiError(400, "BadRequest", f'field label not supported: "{name}"')
            requirements.append((name, equal, value))
        return cls(requirements)

    def matches(self, obj: dict) -> bool:
        for name, equal, value in self.requirements:
            current: Any = obj
            for part in name.split("."):
                current = current.get(part) if isinstance(current, dict) else None
            actual = "" if current is None else str(current).lower() if isinstance(current, bool) else str(current)
            if (actual == value) != equal:
                return False
        return True


@dataclass
class _Watch:
    resource: str
    namespace: str | None
    selector: _Selector
    bookmarks: bool
    broken: bool = False
    ended: bool = False


class FakeKubeApiServer:
    def __init__(self, *, retain: int = 10_000, port: int = 0, first_resource_version: int = 1000) -> None:
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._objects: dict[str, dict[tuple[str, str], dict]] = {resource: {} for resource in _KINDS}
        self._log: list[_Change] = []
        self._retain = retain
        self._rv = first_resource_version
        self._oldest = first_resource_version  # watches from before this get 410
        self._watches: list[_Watch] = []
        self._faults: list[Fault] = []
        self._release = threading.Event()  # ends hanging requests
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port = port
        self.events: list[dict] = []
        self.bindings: list[dict] = []
        self.patches: list[dict] = []
        self.requests: list[Request] = []
        self.watch_delay = 0.0  # seconds every change waits before watchers see it, as a slow watch cache

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> FakeKubeApiServer:
        handler = type("Handler", (_Handler,), {"api": self})
        self._httpd = _Server(("127.0.0.1", self._port), handler)
        self._port = self._httpd.server_address[1]
        self._release.clear()
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.05,), name="fake-kube-api", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop answering: open streams end, hanging requests are dropped, new connections are refused."""
        if self._httpd is None:
            return
        self._release.set()
        with self._lock:
            for watch in self._watches:
                watch.broken = True
            self._changed.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        assert self._thread is not None
        self._thread.join(10)
        self._httpd = None

    def write_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig that points a process (an extender, an agent) at this server."""
        path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: "{self.url}"}}}}]
users: [{{name: client, user: {{token: test-token}}}}]
contexts: [{{name: test, context: {{cluster: test, user: client}}}}]
current-context: test
""")
        return path

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- objects -----------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        with self._lock:
            return str(self._rv)

    def add_node(self, node: dict) -> dict:
        return self._put(NODES, node, create=True)

    def update_node(self, node: dict) -> dict:
        return self._put(NODES, node, create=False)

    def delete_node(self, name: str) -> dict:
        return self._delete(NODES, ("", name))

    def node(self, name: str) -> dict:
        return self._get(NODES, ("", name))

    def add_pod(self, pod: dict) -> dict:
        return self._put(PODS, pod, create=True)

    def update_pod(self, pod: dict) -> dict:
        return self._put(PODS, pod, create=False)

    def delete_pod(self, namespace: str, name: str) -> dict:
        return self._delete(PODS, (namespace, name))

    def pod(self, namespace: str, name: str) -> dict:
        return self._get(PODS, (namespace, name))

    def put(self, resource: str, obj: dict) -> dict:
        """Create or replace a ResourceSlice (SLICES), ResourceClaim (CLAIMS) or ResourceClaimTemplate (TEMPLATES),
        as a driver, kube-scheduler or a user, or a Secret (SECRETS) or ConfigMap (CONFIGMAPS), as an install."""
        with self._lock:
            exists = self._key(resource, copy.deepcopy(obj)) in self._objects[resource]
            return self._put(resource, obj, create=not exists)

    def delete(self, resource: str, namespace: str, name: str) -> dict:
        return self._delete(resource, (namespace, name))

    def create_claim(self, namespace: str, claim: Any) -> dict:
        """POST a ResourceClaim: 409 AlreadyExists for a name taken, as the real server answers."""
        if not isinstance(claim, dict) or not isinstance(claim.get("metadata"), dict):
            raise ApiError(400, "BadRequest", "the body is not a ResourceClaim")
        claim = copy.deepcopy(claim)
        claim["metadata"]["namespace"] = namespace
        name = claim["metadata"].get("name") or ""
        with self._lock:
            if (namespace, name) in self._objects[CLAIMS]:
                raise ApiError(409, "AlreadyExists", f'resourceclaims.resource.k8s.io "{name}" already exists',
                               {"name": name, "group": "resource.k8s.io", "kind": "resourceclaims"})
            return self._put(CLAIMS, claim, create=True)

    def delete_claim(self, namespace: str, name: str, options: Any) -> dict:
        """DELETE a ResourceClaim with DeleteOptions: its preconditions (uid, resourceVersion) checked as the real
        server checks them (409 Conflict). A claim with finalizers (kube-scheduler's on an allocated claim) is only
        marked for deletion."""
        preconditions = (options or {}).get("preconditions") or {} if isinstance(options, dict) else {}
        with self._lock:
            old = self._objects[CLAIMS].get((namespace, name))
            if old is None:
                raise _not_found(CLAIMS, name)
            for field, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
                wanted = preconditions.get(field)
                if wanted and wanted != old["metadata"].get(field):
                    raise _conflict("resourceclaims.resource.k8s.io", name,
                                    f"Precondition failed: {label} in precondition: {wanted}, {label} in object meta: "
                                    f"{old['metadata'].get(field)}")
            if old["metadata"].get("finalizers"):
                marked = copy.deepcopy(old)
                marked["metadata"]["deletionTimestamp"] = now_rfc3339()
                return self._commit(CLAIMS, "MODIFIED", marked, old)
            return self._commit(CLAIMS, "DELETED", copy.deepcopy(old), old)

    def pods_on(self, node: str) -> list[dict]:
        """The pods bound to `node`, as the kubelet's pod source follows them (in-process, no HTTP)."""
        with self._lock:
            return [copy.deepcopy(pod) for pod in self._objects[PODS].values() if pod["spec"].get("nodeName") == node]

    def pods_labelled(self, namespace: str, labels: dict[str, str]) -> list[str]:
        """The names of the pods of `namespace` that carry all of `labels`, as a Service's selector picks them."""
        with self._lock:
            return sorted(key[1] for key, pod in self._objects[PODS].items() if key[0] == namespace
                          and labels.items() <= (pod["metadata"].get("labels") or {}).items())

    def _key(self, resource: str, obj: dict) -> tuple[str, str]:
        meta = obj["metadata"]
        return (meta.setdefault("namespace", "default") if resource in _NAMESPACED else "", meta["name"])

    def _get(self, resource: str, key: tuple[str, str]) -> dict:
        with self._lock:
            if key not in self._objects[resource]:
                raise _not_found(resource, key[1])
            return copy.deepcopy(self._objects[resource][key])

    def _put(self, resource: str, obj: dict, *, create: bool) -> dict:
        obj = copy.deepcopy(obj)
        with self._lock:
            key = self._key(resource, obj)
            old = self._objects[resource].get(key)
            if create and old is not None:
                raise ValueError(f"{resource} {key} already exists")
            if not create and old is None:
                raise _not_found(resource, key[1])
            meta = obj["metadata"]
            if old is None:
                meta.setdefault("uid", str(uuid.uuid4()))
                meta.setdefault("creationTimestamp", now_rfc3339())
            else:
                meta["uid"] = old["metadata"]["uid"]
                meta["creationTimestamp"] = old["metadata"]["creationTimestamp"]
            obj["kind"], obj["apiVersion"] = _KINDS[resource], _API_VERSIONS.get(resource, "v1")
            return self._commit(resource, "ADDED" if old is None else "MODIFIED", obj, old)

    def _delete(self, resource: str, key: tuple[str, str]) -> dict:
        with self._lock:
            old = self._objects[resource].get(key)
            if old is None:
                raise _not_found(resource, key[1])
            return self._commit(resource, "DELETED", copy.deepcopy(old), old)

    def _commit(self, resource: str, change: str, obj: dict, old: dict | None) -> dict:
        """Store a change under a new resourceVersion and wake the watchers. Called with the lock held."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        key = self._key(resource, obj)
        if change == "DELETED":
            del self._objects[resource][key]
        else:
            self._objects[resource][key] = obj
        self._append(_Change(self._rv, resource, change, obj, old))
        return copy.deepcopy(obj)

    def _append(self, change: _Change) -> None:
        self._log.append(change)
        if len(self._log) > self._retain:
            self._oldest = self._log.pop(0).rv
        self._changed.notify_all()

    # -- test controls -----------------------------------------------------------------------------------

    def compact(self) -> None:
        """Forget every change so far: a watch from any older version now gets 410 Expired."""
        with self._lock:
            self._log.clear()
            self._oldest = self._rv

    def bookmark(self, resource: str) -> str:
        """Send a BOOKMARK (to watches that asked for them) at a new resourceVersion, as if other kinds of
        object had changed."""
        with self._lock:
            self._rv += 1
            obj = {"kind": _KINDS[resource], "apiVersion": _API_VERSIONS.get(resource, "v1"),
                   "metadata": {"resourceVersion": str(self._rv)}}
            self._append(_Change(self._rv, resource, "BOOKMARK", obj, None))
            return str(self._rv)

    def fail(
        self, method: str | None, path: str | None, *, times: int = 1, status: int = 500, watch: bool | None = None
    ) -> None:
        self._add_fault(Fault("error", method, path, watch, times, status))

    def drop(self, method: str | None, path: str | None, *, times: int = 1, watch: bool | None = None) -> None:
        self._add_fault(Fault("close", method, path, watch, times))

    def lose(self, method: str | None, path: str | None, *, times: int = 1) -> None:
        """The next matching requests are carried out, but their answers are lost (the connection closes)."""
        self._add_fault(Fault("lose", method, path, False, times))

    def hang(self, method: str | None, path: str | None, *, times: int = 1, watch: bool | None = None) -> None:
        """The next matching requests get no answer until `release_hangs()` or `stop()`."""
        self._release.clear()
        self._add_fault(Fault("hang", method, path, watch, times))

    def release_hangs(self) -> None:
        self._release.set()

    def _add_fault(self, fault: Fault) -> None:
        with self._lock:
            self._faults.append(fault)

    def _take_fault(self, method: str, path: str, watch: bool) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.matches(method, path, watch):
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault
        return None

    def watchers(self, resource: str) -> int:
        with self._lock:
            return sum(1 for w in self._watches if w.resource == resource)

    def wait_for_watchers(self, resource: str, count: int = 1, timeout: float = 10.0) -> bool:
        """Wait until at least `count` watches of `resource` are open."""
        with self._changed:
            return self._changed.wait_for(lambda: self.watchers(resource) >= count, timeout)

    def break_watches(self, resource: str | None = None) -> None:
        """Cut every open watch stream (of `resource`) in the middle of a chunk."""
        self._signal_watches(resource, "broken")

    def end_watches(self, resource: str | None = None) -> None:
        """End every open watch stream cleanly, as the server does when timeoutSeconds runs out."""
        self._signal_watches(resource, "ended")

    def _signal_watches(self, resource: str | None, flag: str) -> None:
        with self._lock:
            for watch in self._watches:
                if resource is None or watch.resource == resource:
                    setattr(watch, flag, True)
            self._changed.notify_all()

    def watch_versions(self, resource: str) -> list[str]:
        """The resourceVersion each watch request of `resource` started from, in order."""
        with self._lock:
            return [
                r.query.get("resourceVersion", "")
                for r in self.requests
                if r.method == "GET" and r.path.endswith(f"/{resource}") and _truthy(r.query.get("watch"))
            ]

    def list_count(self, resource: str) -> int:
        with self._lock:
            return sum(
                1
                for r in self.requests
                if r.method == "GET" and r.path.endswith(f"/{resource}") and not _truthy(r.query.get("watch"))
            )

    # -- API handlers (called from request threads) -------------------------------------------------------

    def list(self, resource: str, namespace: str | None, selector: _Selector) -> dict:
        with self._lock:
            items = []
            for (ns, _), obj in sorted(self._objects[resource].items()):
                if (namespace is None or ns == namespace) and selector.matches(obj):
                    item = copy.deepcopy(obj)
                    del item["kind"], item["apiVersion"]  # list items carry no type, as the real server's
                    items.append(item)
            return {
                "kind": f"{_KINDS[resource]}List",
                "apiVersion": _API_VERSIONS.get(resource, "v1"),
                "metadata": {"resourceVersion": str(self._rv)},
                "items": items,
            }

    def patch(self, resource: str, key: tuple[str, str], content_type: str, patch: Any) -> dict:
        if content_type not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            raise ApiError(
                415, "UnsupportedMediaType", f"the body of the request was in an unsupported format: {content_type}"
            )
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be a JSON object")
        with self._lock:
            old = self._objects[resource].get(key)
            if old is None:
                raise _not_found(resource, key[1])
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_rv is not None and wanted_rv != old["metadata"]["resourceVersion"]:
                raise _conflict(
                    resource,
                    key[1],
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
            new = copy.deepcopy(merge_patch(old, patch))
            meta = new.setdefault("metadata", {})
            for keep in ("name", "namespace", "uid", "creationTimestamp"):
                if keep in old["metadata"]:
                    meta[keep] = old["metadata"][keep]
            new["kind"], new["apiVersion"] = old["kind"], old["apiVersion"]
            self.patches.append({"resource": resource, "key": key, "content_type": content_type, "patch": patch})
            return self._commit(resource, "MODIFIED", new, old)

    def bind(self, namespace: str, name: str, binding: Any) -> dict:
        if not isinstance(binding, dict) or binding.get("kind", "Binding") != "Binding":
            raise ApiError(400, "BadRequest", "the body is not a Binding")
        meta = binding.get("metadata") or {}
        if meta.get("name", name) != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Binding object")
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        target = binding.get("target") or {}
        if not target.get("name") or target.get("kind", "Node") != "Node":
            raise ApiError(400, "BadRequest", "Binding target must name a Node")
        with self._lock:
            old = self._objects[PODS].get((namespace, name))
            if old is None:
                raise _not_found(PODS, name)
            uid = meta.get("uid")
            if uid and uid != old["metadata"]["uid"]:
                raise _conflict(
                    "pods/binding",
                    name,
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: {old['metadata']['uid']}",
                )
            bound = old["spec"].get("nodeName")
            if bound:
                raise _conflict("pods/binding", name, f'pod {name} is already assigned to node "{bound}"')
            new = copy.deepcopy(old)
            new["spec"]["nodeName"] = target["name"]
            # Like BindingREST.setPodNodeAndMetadata: the Binding's annotations land on the pod in the same write.
            annotations = meta.get("annotations") or {}
            if annotations:
                new["metadata"].setdefault("annotations", {}).update(annotations)
            conditions = new.setdefault("status", {}).setdefault("conditions", [])
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()})
            self.bindings.append(copy.deepcopy(binding))
            self._commit(PODS, "MODIFIED", new, old)
        return status_body(201, "", "")

    def lease(self, namespace: str, name: str) -> dict:
        return self._get(LEASES, (namespace, name))

    def create_lease(self, namespace: str, lease: Any) -> dict:
        meta = self._lease_meta(namespace, lease)
        with self._lock:
            key = (namespace, meta.get("name") or "")
            if key in self._objects[LEASES]:
                raise ApiError(409, "AlreadyExists", f'leases.coordination.k8s.io "{key[1]}" already exists',
                               {"name": key[1], "group": "coordination.k8s.io", "kind": "leases"})
            new = copy.deepcopy(lease)
            new["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=now_rfc3339())
            new["kind"], new["apiVersion"] = "Lease", COORDINATION
            return self._commit(LEASES, "ADDED", new, None)

    def replace_lease(self, namespace: str, name: str, lease: Any) -> dict:
        meta = self._lease_meta(namespace, lease)
        if meta.get("name") != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name on the URL")
        with self._lock:
            old = self._objects[LEASES].get((namespace, name))
            if old is None:
                raise ApiError(404, "NotFound", f'leases.coordination.k8s.io "{name}" not found', {"name": name})
            if not meta.get("resourceVersion"):
                raise ApiError(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                               "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
            if meta["resourceVersion"] != old["metadata"]["resourceVersion"]:
                raise _conflict("leases.coordination.k8s.io", name, "the object has been modified; please apply "
                                "your changes to the latest version and try again")
            new = copy.deepcopy(lease)
            for keep in ("uid", "creationTimestamp"):
                new["metadata"][keep] = old["metadata"][keep]
            new["kind"], new["apiVersion"] = "Lease", COORDINATION
            return self._commit(LEASES, "MODIFIED", new, old)

    def delete_lease(self, namespace: str, name: str) -> dict:
        return self._delete(LEASES, (namespace, name))

    @staticmethod
    def _lease_meta(namespace: str, lease: Any) -> dict:
        """The checks kube-apiserver makes on a Lease body that leader election could get wrong."""
        if not isinstance(lease, dict) or lease.get("kind", "Lease") != "Lease":
            raise ApiError(400, "BadRequest", "the body is not a Lease")
        meta = lease.setdefault("metadata", {})
        if meta.setdefault("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest",
                           "the namespace of the provided object does not match the namespace sent on the request")
        spec = lease.get("spec") or {}
        duration, transitions = spec.get("leaseDurationSeconds"), spec.get("leaseTransitions")
        if not meta.get("name") or (duration is not None and (type(duration) is not int or duration <= 0)) or (
                transitions is not None and (type(transitions) is not int or transitions < 0)):
            raise ApiError(422, "Invalid", "Lease is invalid: a name, leaseDurationSeconds > 0 and "
                           "leaseTransitions >= 0 are required")
        return meta

    def create_event(self, namespace: str, event: Any) -> dict:
        if not isinstance(event, dict) or event.get("kind", "Event") != "Event":
            raise ApiError(400, "BadRequest", "the body is not an Event")
        meta = event.setdefault("metadata", {})
        if meta.setdefault("namespace", namespace) != namespace:
            raise ApiError(
                400,
                "BadRequest",
                "the namespace of the provided object does not match the namespace sent on the request",
            )
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "Event.metadata.name: Required value")
        with self._lock:
            self._rv += 1
            meta.update(uid=str(uuid.uuid4()), resourceVersion=str(self._rv), creationTimestamp=now_rfc3339())
            self.events.append(copy.deepcopy(event))
        return event

    def list_events(self, namespace: str, selector: _Selector) -> dict:
        with self._lock:
            items = [copy.deepcopy(event) for event in self.events
                     if event["metadata"]["namespace"] == namespace and selector.matches(event)]
            return {"kind": "EventList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)},
                    "items": items}

    def stream_watch(self, write: Callable[[bytes], None], watch: _Watch, since: str, seconds: int) -> str:
        """Write the events of one watch; returns how it ended: "timeout", "ended", "broken" or "gone"."""
        deadline = time.monotonic() + seconds
        with self._lock:
            if since in ("", "0"):  # "any version": the current state as ADDED, then the changes
                start = self._rv
                initial = [
                    _Change(int(o["metadata"]["resourceVersion"]), watch.resource, "ADDED", o, None)
                    for o in sorted(
                        self._objects[watch.resource].values(), key=lambda o: int(o["metadata"]["resourceVersion"])
                    )
                ]
            else:
                start = int(since)
                initial = []
                if start < self._oldest:
                    gone = status_body(410, "Expired", f"too old resource version: {start} ({self._oldest})")
                    write(_event_line("ERROR", gone))
                    return "gone"
            self._watches.append(watch)
            self._changed.notify_all()
        try:
            pending = initial
            sent = start
            while True:
                for change in pending:
                    line = self._translate(watch, change)
                    if line is not None:
                        write(line)
                    sent = max(sent, change.rv)
                with self._lock:
                    while True:
                        if watch.broken or watch.ended:
                            return "broken" if watch.broken else "ended"
                        now = time.monotonic()
                        newer = [c for c in self._log if c.rv > sent and c.resource == watch.resource]
                        unripe = [i for i, c in enumerate(newer) if c.at + self.watch_delay > now]
                        pending = newer[:unripe[0]] if unripe else newer  # in order: none after an unripe one
                        remaining = deadline - now
                        if pending or remaining <= 0:
                            break
                        ripe = min((c.at + self.watch_delay - now for c in newer), default=remaining)
                        self._changed.wait(min(remaining, max(ripe, 0.001)))
                if not pending:
                    return "timeout"
        finally:
            with self._lock:
                self._watches.remove(watch)
                self._changed.notify_all()

    @staticmethod
    def _translate(watch: _Watch, change: _Change) -> bytes | None:
        """The line a watcher sees for a change, after its namespace and field selector; None if nothing."""
        if change.type == "BOOKMARK":
            return _event_line("BOOKMARK", change.obj) if watch.bookmarks else None
        if watch.namespace is not None and change.obj["metadata"].get("namespace") != watch.namespace:
            return None
        now = change.type != "DELETED" and watch.selector.matches(change.obj)
        before = change.old is not None and watch.selector.matches(change.old)
        if change.type == "DELETED":
            kind = "DELETED" if before else None
        elif now:
            kind = "MODIFIED" if before else "ADDED"
        else:
            kind = "DELETED" if before else None
        return None if kind is None else _event_line(kind, change.obj)


def _event_line(kind: str, obj: dict) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "t")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], OSError):  # a client hanging up is not news
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    _lose = False  # this request's answer is to be lost (Fault "lose")
    protocol_version = "HTTP/1.1"
    api: FakeKubeApiServer  # set on the per-server subclass

    def setup(self) -> None:
        super().setup()
        with self.api._lock:
            self.api._connections.add(self.connection)

    def finish(self) -> None:
        with self.api._lock:
            self.api._connections.discard(self.connection)
        try:
            super().finish()
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._handle("GET")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    def _handle(self, method: str) -> None:
        api = self.api
        url = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = raw
        watch = _truthy(query.get("watch"))
        with api._lock:
            api.requests.append(Request(method, url.path, query, {k.lower(): v for k, v in self.headers.items()}, body))
        fault = api._take_fault(method, url.path, watch)
        self._lose = fault is not None and fault.action == "lose"
        if fault is not None and fault.action not in ("error", "lose"):
            if fault.action == "hang":
                api._release.wait(300)
            self._drop()
            return
        try:
            if fault is not None and fault.action == "error":
                raise ApiError(fault.status, "InternalError", f"injected failure ({fault.status})")
            if isinstance(body, bytes):
                raise ApiError(400, "BadRequest", "the body is not JSON")
            self._route(method, url.path.rstrip("/").split("/")[1:], query, body, watch)
        except ApiError as exc:
            self._send(exc.body["code"], exc.body)

    def _route(self, method: str, parts: list[str], query: dict, body: Any, watch: bool) -> None:
        api = self.api
        if method == "GET" and parts in (["version"], ["api"], ["apis"], ["api", "v1"]):
            self._send(200, _discovery(parts))
            return
        if parts[:3] == ["apis", *COORDINATION.split("/")]:
            self._route_lease(method, parts[3:], body)
            return
        if parts[:3] == ["apis", *RESOURCE.split("/")]:
            match (method, parts[3:]):
                case ("GET", [resource]) if resource in (SLICES, CLAIMS, TEMPLATES):
                    self._list_or_watch(resource, None, query, watch)
                case ("POST", ["namespaces", namespace, "resourceclaims"]):
                    self._send(201, api.create_claim(namespace, body))
                case ("DELETE", ["namespaces", namespace, "resourceclaims", name]):
                    self._send(200, api.delete_claim(namespace, name, body))
                case _:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return
        if parts[:2] != ["api", "v1"]:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        rest = parts[2:]
        namespace = None
        if len(rest) >= 3 and rest[0] == "namespaces":
            namespace, rest = rest[1], rest[2:]
        match (method, rest, namespace):
            case ("GET", [resource], _) if resource in (NODES, PODS) and (namespace is None or resource == PODS):
                self._list_or_watch(resource, namespace, query, watch)
            case ("GET", ["nodes", name], None):
                self._send(200, api.node(name))
            case ("GET", ["pods", name], str()):
                self._send(200, api.pod(namespace, name))
            case ("GET", [resource, name], str()) if resource in (SECRETS, CONFIGMAPS):
                self._send(200, api._get(resource, (namespace, name)))
            case ("PATCH", ["nodes", name], None):
                self._send(200, api.patch(NODES, ("", name), self._content_type(), body))
            case ("PATCH", ["pods", name], str()):
                self._send(200, api.patch(PODS, (namespace, name), self._content_type(), body))
            case ("POST", ["pods", name, "binding"], str()):
                self._send(201, api.bind(namespace, name, body))
            case ("POST", ["bindings"], str()):  # the older form, naming the pod in the Binding
                self._send(201, api.bind(namespace, ((body or {}).get("metadata") or {}).get("name", ""), body))
            case ("GET", ["events"], str()) if not watch:
                self._send(200, api.list_events(namespace, _Selector.parse(query.get("fieldSelector", ""), "events")))
            case ("POST", ["events"], str()):
                self._send(201, api.create_event(namespace, body))
            case (_, ["nodes" | "pods" | "events" | "bindings", *_], _):
                raise ApiError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            case _:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _list_or_watch(self, resource: str, namespace: str | None, query: dict, watch: bool) -> None:
        selector = _Selector.parse(query.get("fieldSelector", ""), resource)
        if watch:
            seconds = int(query.get("timeoutSeconds") or DEFAULT_WATCH_SECONDS)
            spec = _Watch(resource, namespace, selector, _truthy(query.get("allowWatchBookmarks")))
            self._stream(spec, query.get("resourceVersion", ""), seconds)
        else:
            self._send(200, self.api.list(resource, namespace, selector))

    def _route_lease(self, method: str, rest: list[str], body: Any) -> None:
        api = self.api
        match (method, rest):
            case ("GET", ["namespaces", namespace, "leases", name]):
                self._send(200, api.lease(namespace, name))
            case ("POST", ["namespaces", namespace, "leases"]):
                self._send(201, api.create_lease(namespace, body))
            case ("PUT", ["namespaces", namespace, "leases", name]):
                self._send(200, api.replace_lease(namespace, name, body))
            case ("DELETE", ["namespaces", namespace, "leases", name]):
                self._send(200, api.delete_lease(namespace, name))
            case _:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _content_type(self) -> str:
        return (self.headers.get("Content-Type") or "").split(";")[0].strip()

    def _send(self, code: int, body: dict) -> None:
        if self._lose:
            self._drop()
            return
        data = orjson.dumps(body)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _drop(self) -> None:
        """Close the connection without an answer."""
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _stream(self, watch: _Watch, since: str, seconds: int) -> None:
        if since not in ("", "0") and not since.isdigit():
            raise ApiError(400, "BadRequest", f'invalid resource version "{since}"')
        # The real server sends the headers at once; a client waits for them before it reads events. A watch that
        # ends (its timeout, or an ERROR event) ends its chunked answer and keeps the connection, as Go's server
        # does, so a client may send its next request there; only a broken one is hung up.
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(line: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))

        try:
            how = self.api.stream_watch(write, watch, since, seconds)
            if how == "broken":  # announce 64 bytes, send a few, hang up
                self.wfile.write(b'40\r\n{"type":"MODIFIED","obj')
                self._drop()
            else:
                self.wfile.write(b"0\r\n\r\n")
        except OSError:  # the client went away
            self._drop()
