"""The scheduler extender wire format (k8s.io/kube-scheduler/extender/v1), and what a request may hold, in one place.

The Go types carry no json tags, so keys are Go field names in PascalCase. Go decodes them
case-insensitively, and so do we; we answer in PascalCase with every field present (no omitempty).
Bodies that are JSON but not the expected shape raise `BadRequest` with the field and what was expected,
which the app turns into an `Error` answer with HTTP 200, because kube-scheduler reads no message from any
other status. Only bytes that are not JSON at all raise `NotJson`, answered with HTTP 400.

Two answers say less than they could, because kube-scheduler (v1.36, pkg/scheduler/schedule_one.go and
extender.go) reads no more, and thousands of names cost time on every cycle:
- filter: FailedNodes and FailedAndUnresolvableNodes are read only to explain a pod that no node passes
  (schedulePod builds its FitError diagnosis when the feasible nodes are none; otherwise it only counts the
  statuses for its log). So while one node passes, both maps are empty; when none does, every reason is there.
- prioritize: kube-scheduler adds score x weight x 10 to each host listed and nothing to a host left out, and
  the same number taken from every host changes no ranking. So each score is answered less the least of the
  request, and a host whose result is 0 is left out (a request whose scores are all equal answers `[]`). One
  side effect: kube-scheduler draws its random tie-break (Randomizer) only for the hosts listed.
What the verbs decided stays whole inside (FilterOutcome, prioritize_nodes' scores), for metrics, logs and tests.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from extender.api._names import first_bad, scores_json
from extender.api.pod_request import MAX_NAME_CHARS, MAX_UID_CHARS, json_type, pod_shape_problem

# The largest body we read, refused with 413 while reading (never buffered past it). What kube-scheduler sends
# with nodeCacheCapable (the captures in shared/kube-scheduler/, our manifests):
# - filter and prioritize: the Pod (at most about 1.5 MiB: etcd's default request limit) and NodeNames. 5,000
#   names of 253 characters, the longest a node name can be, are 1.3 MB, so 8 MiB holds the pod and more than
#   20,000 names of the longest kind (real names of 20 to 60 characters: over 100,000).
# - preempt: NodeNameToMetaVictims for the candidates of DefaultPreemption, at most max(100, 10 % of the
#   nodes), each with at most maxPods (110) victims of about 50 bytes: 500 candidates of 5,000 nodes are
#   2.8 MB.
# nodeCacheCapable: false sends whole Node objects (about 3 KB each in the captures): 8 MiB holds some 2,500.
MAX_BODY_BYTES = 8 << 20
_NAMES_MEMBER = b',"NodeNames":['


class NotJson(ValueError):
    """The body is not JSON at all."""


class BadRequest(ValueError):
    """JSON, but not the extender request this verb expects."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A filter or prioritize request. `nodes` is the NodeList when nodeCacheCapable is false."""

    pod: Mapping[str, Any]
    node_names: list[str] | None
    nodes: Mapping[str, Any] | None

    def candidates(self) -> list[str]:
        if self.node_names is not None:
            return self.node_names
        items = self.nodes.get("items") if self.nodes is not None else None
        return [item["metadata"]["name"] for item in items or ()]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


@dataclass(frozen=True, slots=True)
class Victims:
    pod_uids: list[str]
    pdb_violations: int


@dataclass(frozen=True, slots=True)
class PreemptionArgs:
    """Victims per node, as UIDs whichever form (full pods or MetaVictims) the request used."""

    pod: Mapping[str, Any]
    victims: dict[str, Victims]


def parse_extender_args(body: bytes, recent: NameLists | None = None, last: LastPod | None = None) -> ExtenderArgs:
    """`recent`: the names of recent requests, found again by their bytes (NameLists says why); `last`: the pod of
    the request before, found again by its bytes (LastPod says why)."""
    split = _split(body, recent) if recent is not None else None
    if split is not None:
        head, names = split
        pod = last.get(head) if last is not None else None
        if pod is not None:
            return ExtenderArgs(pod, names, None)
        document = _document(head)
        if document is not None:
            pod = _pod(document)
            if last is not None:
                last.keep(head, pod)
            return ExtenderArgs(pod, names, None)
    document = _object(body)
    pod = _pod(document)
    names = document.get("nodenames")
    nodes = document.get("nodes")
    if names is not None:
        if not isinstance(names, list):
            raise BadRequest(f"NodeNames: expected an array of node names, got {json_type(names)}")
        bad = first_bad(names, MAX_NAME_CHARS)  # thousands of names on the hot path: one C pass
        if bad >= 0:
            _check_name(names[bad], f"NodeNames[{bad}]")
        return ExtenderArgs(pod, names, None)
    if nodes is not None:
        if not isinstance(nodes, dict):
            raise BadRequest(f"Nodes: expected a NodeList object, got {json_type(nodes)}")
        items = nodes.get("items")
        if items is not None and not isinstance(items, list):
            raise BadRequest(f"Nodes.items: expected an array of Node objects, got {json_type(items)}")
        for index, item in enumerate(items or ()):
            _node_name(item, f"Nodes.items[{index}]")
        return ExtenderArgs(pod, None, nodes)
    return ExtenderArgs(pod, [], None)


def parse_binding_args(body: bytes) -> BindingArgs:
    document = _object(body)
    values = []
    for field, limit in (("podname", MAX_NAME_CHARS), ("podnamespace", MAX_NAME_CHARS), ("poduid", MAX_UID_CHARS),
                         ("node", MAX_NAME_CHARS)):
        value = document.get(field)
        if value is None or value == "":
            raise BadRequest(f"binding request has no {_GO_NAMES[field]}")
        _check_name(value, _GO_NAMES[field], limit)
        values.append(value)
    return BindingArgs(*values)


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    document = _object(body)
    pod = _pod(document)
    meta = document.get("nodenametometavictims")
    full = document.get("nodenametovictims")
    source, field = (meta, "NodeNameToMetaVictims") if meta is not None else (full, "NodeNameToVictims")
    if source is None:
        return PreemptionArgs(pod, {})
    if not isinstance(source, dict):
        raise BadRequest(f"{field}: expected an object of node name to victims, got {json_type(source)}")
    victims = {}
    for node, entry in source.items():
        where = f"{field}[{_quoted(node)}]"
        _check_name(node, f"{field}: a node name")
        if not isinstance(entry, dict):
            raise BadRequest(f"{where}: expected a Victims object, got {json_type(entry)}")
        pods = entry.get("Pods")
        if pods is not None and not isinstance(pods, list):
            raise BadRequest(f"{where}.Pods: expected an array, got {json_type(pods)}")
        uids = [_victim_uid(item, meta is not None, f"{where}.Pods[{index}]") for index, item in enumerate(pods or ())]
        violations = entry.get("NumPDBViolations", 0)
        if isinstance(violations, bool) or not isinstance(violations, int) or not 0 <= violations <= len(uids):
            raise BadRequest(f"{where}.NumPDBViolations: expected a whole number from 0 to the number of victims")
        victims[node] = Victims(uids, violations)
    return PreemptionArgs(pod, victims)


def preemption_result(victims: Mapping[str, Victims]) -> bytes:
    """kube-scheduler reads only NodeNameToMetaVictims from the answer, whatever the request held."""
    return orjson.dumps({"NodeNameToMetaVictims": {
        node: {"Pods": [{"UID": uid} for uid in entry.pod_uids], "NumPDBViolations": entry.pdb_violations}
        for node, entry in victims.items()}})


def filter_result(args: ExtenderArgs, passed: Sequence[str], failed: Mapping[str, Sequence[str]],
                  unresolvable: Mapping[str, Sequence[str]]) -> bytes:
    """Answer in the form the request came in: NodeNames for nodeCacheCapable, else the passing Nodes.

    The reasons are written only when no node passes (the module's docstring says why). Failing nodes arrive
    grouped by reason (reason -> names) and are written as the `node: reason` objects kube-scheduler reads, one
    group at a time at C speed.
    """
    if passed:
        tail = b',"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}'
    else:
        tail = (b',"FailedNodes":' + _reason_object(failed) + b',"FailedAndUnresolvableNodes":'
                + _reason_object(unresolvable) + b',"Error":""}')
    if args.node_names is not None:
        return b'{"NodeNames":' + orjson.dumps(list(passed)) + tail
    keep = set(passed)
    nodes = dict(args.nodes or {})
    nodes["items"] = [item for item in (args.nodes or {}).get("items") or () if item["metadata"]["name"] in keep]
    try:
        echoed = orjson.dumps(nodes)
    except orjson.JSONEncodeError as error:  # nesting past orjson's 254 levels: no real Node nests so deep
        raise BadRequest(f"Nodes: cannot be answered back ({error}); a Node object nests a few levels deep") from None
    return b'{"Nodes":' + echoed + b',"NodeNames":null' + tail


def _reason_object(groups: Mapping[str, Sequence[str]]) -> bytes:
    """`{"a":"r1","b":"r1","c":"r2"}` from {"r1": ["a", "b"], "r2": ["c"]}.

    orjson writes a group's names as a JSON array; joining its elements with `:"reason",` turns it into the
    entries. A `","` occurs only between elements, because orjson escapes every quote inside a name.
    """
    parts = []
    for reason, names in groups.items():
        if names:
            value = b":" + orjson.dumps(reason)
            parts.append(orjson.dumps(list(names))[1:-1].replace(b'","', b'"' + value + b',"') + value)
    return b"{" + b",".join(parts) + b"}"


def filter_error(message: str) -> bytes:
    return orjson.dumps({"Nodes": None, "NodeNames": None, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                         "Error": message})


def prioritize_result(hosts: list[str], scores: list[int]) -> bytes:
    """`[{"Host":…,"Score":…},…]`, each score less the least and the hosts at the least left out (the module's
    docstring says why), in one C pass over the hosts (extender/api/_names.c)."""
    return scores_json(hosts, scores)


def binding_result(error: str = "") -> bytes:
    return orjson.dumps({"Error": error})


_GO_NAMES = {"podname": "PodName", "podnamespace": "PodNamespace", "poduid": "PodUID", "node": "Node"}


class RecentNames(list[str]):
    """A request's copy of a name list kept by NameLists. `origin` is the kept list, one object for every request
    that repeats it, by which the cluster state keeps those nodes' keys (cache/kept_keys.py); nobody changes it."""

    __slots__ = ("origin",)

    def __init__(self, names: list[str], origin: list[str]) -> None:
        super().__init__(names)
        self.origin = origin


class NameLists:
    """The NodeNames of the last few requests, by their bytes.

    kube-scheduler sends the same names in the same order, pod after pod, while the nodes that pass its own
    filters stay the same: every node at `percentageOfNodesToScore: 100` (the groups' profile) or in a cluster
    of up to 100 nodes, and `make loadtest`'s 5,000. Decoded anew, 5,000 names cost 0.1 ms, and as new str objects
    each is hashed again and compared where its node's key is looked up: filter took 1.07 ms at the median,
    against 0.69 ms with the names of the request before (in-process, 5,000 names, a bind between requests).
    Found here, they are compared as bytes (a few microseconds) and copied out, so that no request's list is
    another's. A list is made of the cluster's own str objects (`own`) only once a request repeats it: kube-scheduler's
    samples of a big cluster (adaptive percentageOfNodesToScore) come in the order its parallel filter found them,
    so most are never seen again, and looking up 500 new names for that cost 20 us with the node tables out of the
    cache. Bounded: ENTRIES lists, and none from an array over MAX_BYTES."""

    ENTRIES = 4
    MAX_BYTES = 1 << 20  # 20,000 names of 50 characters

    def __init__(self, own: Callable[[list[str]], list[str]] | None = None) -> None:
        """`own`: the names as the cluster's own str objects (ClusterState.own_names), for the lists kept."""
        # (the array's bytes and the `}` after it, its names, whether those are the cluster's own)
        self._kept: list[tuple[bytes, list[str], bool]] = []
        self._lock = threading.Lock()
        self._own = own or list

    def get(self, array: bytes) -> list[str] | None:
        with self._lock:
            for at, (kept, names, owned) in enumerate(self._kept):
                if kept == array:
                    if not owned:
                        names = self._own(names)
                    self._kept.pop(at)
                    self._kept.insert(0, (kept, names, True))
                    return RecentNames(names, names)
        return None

    def keep(self, array: bytes, names: list[str]) -> None:
        if len(array) > self.MAX_BYTES:
            return
        with self._lock:
            self._kept.insert(0, (array, list(names), False))
            del self._kept[self.ENTRIES:]


def _split(body: bytes, recent: NameLists) -> tuple[bytes, list[str]] | None:
    """The bytes before NodeNames, and the names, where the body ends with them as kube-scheduler writes it (Go
    writes the fields in their order, NodeNames last, no space); None for any other body, read whole. The last
    `,"NodeNames":[` of the body starts that member only if what comes before it is an object of at least one
    member, which the JSON parser checks (`_document`); with the array of names valid JSON too, the body parsed
    whole gives the same document. A body that is not a valid request is read whole, so it is refused as it always
    was."""
    at = body.rfind(_NAMES_MEMBER)
    if at < 0 or not body.endswith(b"]}"):
        return None
    array = body[at + len(_NAMES_MEMBER) - 1:]
    names = recent.get(array)
    if names is None:
        try:
            names = orjson.loads(memoryview(array)[:-1])
        except orjson.JSONDecodeError:
            return None
        if not isinstance(names, list) or first_bad(names, MAX_NAME_CHARS) >= 0:
            return None
        recent.keep(array, names)
    return body[:at], names


def _document(head: bytes) -> dict[str, Any] | None:
    """The document `_split`'s head and `}` make, if that is an object of at least one member; else None (the body
    is read whole)."""
    try:
        document = _object(head + b"}")
    except ValueError:
        return None
    return document or None  # `{,"NodeNames":[…]}` is no JSON, though `{}` and the array are


class LastPod:
    """The pod of the last request, by the bytes before its NodeNames, checked (`_pod`) and read only.

    kube-scheduler sends prioritize the pod it sent filter, with the names the shortlist passed (verbs/filter.py): the
    same bytes, parsed and checked once a pod (5 us warm for a pod of kube-scheduler's captured body, against 0.1 to
    compare its bytes). One entry, swapped whole, so a thread reads either the old or the new."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: tuple[bytes, dict[str, Any]] | None = None

    def get(self, head: bytes) -> dict[str, Any] | None:
        last = self._last
        return last[1] if last is not None and last[0] == head else None

    def keep(self, head: bytes, pod: dict[str, Any]) -> None:
        self._last = (head, pod)


def _object(body: bytes) -> dict[str, Any]:
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise NotJson(f"body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise BadRequest("body is not a JSON object")
    return {key.lower(): value for key, value in document.items()}


def _pod(document: Mapping[str, Any]) -> dict[str, Any]:
    pod = document.get("pod")
    if not isinstance(pod, dict):
        raise BadRequest(f"Pod: expected a Pod object, got {json_type(pod)}")
    problem = pod_shape_problem(pod)
    if problem is not None:
        raise BadRequest(f"Pod.{problem}")
    return pod


def _victim_uid(item: Any, meta: bool, where: str) -> str:
    if not isinstance(item, dict):
        raise BadRequest(f"{where}: expected {'a MetaPod' if meta else 'a Pod'} object, got {json_type(item)}")
    if meta:
        uid, field = item.get("UID"), "UID"
    else:
        metadata = item.get("metadata")
        if not isinstance(metadata, dict):
            raise BadRequest(f"{where}.metadata: expected an object, got {json_type(metadata)}")
        uid, field = metadata.get("uid"), "metadata.uid"
    if uid is None or uid == "":
        raise BadRequest(f"{where}: a victim pod has no {field}")
    _check_name(uid, f"{where}.{field}", MAX_UID_CHARS)
    return uid


def _node_name(item: Any, where: str) -> str:
    if not isinstance(item, dict):
        raise BadRequest(f"{where}: expected a Node object, got {json_type(item)}")
    metadata = item.get("metadata")
    if not isinstance(metadata, dict):
        raise BadRequest(f"{where}.metadata: expected an object, got {json_type(metadata)}")
    name = metadata.get("name")
    if name is None or name == "":
        raise BadRequest(f"{where}: a node in Nodes has no metadata.name")
    _check_name(name, f"{where}.metadata.name")
    return name


def _check_name(value: Any, where: str, limit: int = MAX_NAME_CHARS) -> None:
    if not isinstance(value, str):
        raise BadRequest(f"{where}: expected a string, got {json_type(value)}")
    if not 0 < len(value) <= limit:
        raise BadRequest(f"{where}: expected 1 to {limit} characters, got {len(value)}")


def _quoted(name: Any) -> str:
    return repr(str(name)[:40])
