"""The scheduler extender wire format (k8s.io/kube-scheduler/extender/v1), in one place.

The Go types carry no json tags, so keys are Go field names in PascalCase. Go decodes them
case-insensitively, and so do we; we answer in PascalCase with every field present (no omitempty).
Bodies that are JSON but not the expected shape raise `BadRequest`, which the app turns into an `Error`
answer with HTTP 200, because kube-scheduler reads no message from any other status. Only bytes that are
not JSON at all raise `NotJson`, answered with HTTP 400.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson


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
        return [_node_name(item) for item in items or ()]


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


def parse_extender_args(body: bytes) -> ExtenderArgs:
    document = _object(body)
    pod = _pod(document)
    names = document.get("nodenames")
    nodes = document.get("nodes")
    if names is not None:
        if not isinstance(names, list) or (names and set(map(type, names)) != {str}):
            raise BadRequest("NodeNames must be a list of node names")
        return ExtenderArgs(pod, names, None)
    if nodes is not None:
        if not isinstance(nodes, dict) or not isinstance(nodes.get("items", []), list):
            raise BadRequest("Nodes must be a NodeList")
        for item in nodes.get("items") or ():
            _node_name(item)
        return ExtenderArgs(pod, None, nodes)
    return ExtenderArgs(pod, [], None)


def parse_binding_args(body: bytes) -> BindingArgs:
    document = _object(body)
    values = []
    for field in ("podname", "podnamespace", "poduid", "node"):
        value = document.get(field)
        if not isinstance(value, str) or not value:
            raise BadRequest(f"binding request has no {_GO_NAMES[field]}")
        values.append(value)
    return BindingArgs(*values)


def parse_preemption_args(body: bytes) -> PreemptionArgs:
    document = _object(body)
    pod = _pod(document)
    meta = document.get("nodenametometavictims")
    full = document.get("nodenametovictims")
    source = meta if meta is not None else full
    if source is None:
        return PreemptionArgs(pod, {})
    if not isinstance(source, dict):
        raise BadRequest("NodeNameToVictims must map node names to victims")
    victims = {}
    for node, entry in source.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("Pods", []), list):
            raise BadRequest(f"victims of node {node} are not a Victims object")
        uids = [_victim_uid(item, meta is not None) for item in entry.get("Pods") or ()]
        violations = entry.get("NumPDBViolations", 0)
        if not isinstance(violations, int):
            raise BadRequest(f"NumPDBViolations of node {node} is not a number")
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

    Failing nodes arrive grouped by reason (reason -> names) and are written as the `node: reason` objects
    kube-scheduler reads, one group at a time at C speed.
    """
    tail = (b',"FailedNodes":' + _reason_object(failed) + b',"FailedAndUnresolvableNodes":'
            + _reason_object(unresolvable) + b',"Error":""}')
    if args.node_names is not None:
        return b'{"NodeNames":' + orjson.dumps(list(passed)) + tail
    keep = set(passed)
    nodes = dict(args.nodes or {})
    nodes["items"] = [item for item in (args.nodes or {}).get("items") or () if _node_name(item) in keep]
    return b'{"Nodes":' + orjson.dumps(nodes) + b',"NodeNames":null' + tail


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


class PrioritizeEncoder:
    """Writes `[{"Host":…,"Score":…},…]` for thousands of hosts without a Python loop per host.

    Each host's `{"Host":"…","Score":` is encoded once and kept; an answer is then joined from those pieces
    and a piece per score, with C builtins only.
    """

    _MAX_HOSTS = 1 << 17

    def __init__(self) -> None:
        self._heads: dict[str, bytes] = {}
        self._tails = [b"%d}," % score for score in range(11)]

    def encode(self, hosts: Sequence[str], scores: Sequence[int]) -> bytes:
        if not hosts:
            return b"[]"
        if min(scores) < 0 or max(scores) > 10:
            raise ValueError("extender scores run from 0 to 10")
        pieces: list[bytes] = [b""] * (2 * len(hosts))
        try:
            pieces[0::2] = map(self._heads.__getitem__, hosts)
        except KeyError:
            self._learn(hosts)
            pieces[0::2] = map(self._heads.__getitem__, hosts)
        pieces[1::2] = map(self._tails.__getitem__, scores)
        return b"[" + b"".join(pieces)[:-1] + b"]"

    def _learn(self, hosts: Sequence[str]) -> None:
        heads = self._heads
        missing = set(hosts) - heads.keys()
        if len(heads) + len(missing) > self._MAX_HOSTS:
            heads.clear()
            missing = set(hosts)
        heads.update((host, b'{"Host":' + orjson.dumps(host) + b',"Score":') for host in missing)


def binding_result(error: str = "") -> bytes:
    return orjson.dumps({"Error": error})


_GO_NAMES = {"podname": "PodName", "podnamespace": "PodNamespace", "poduid": "PodUID", "node": "Node"}


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
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise BadRequest("request has no Pod object")
    return pod


def _victim_uid(item: Any, meta: bool) -> str:
    uid = item.get("UID") if meta and isinstance(item, dict) else (
        item.get("metadata", {}).get("uid") if isinstance(item, dict) else None)
    if not isinstance(uid, str) or not uid:
        raise BadRequest("a victim pod has no UID")
    return uid


def _node_name(item: Any) -> str:
    name = item.get("metadata", {}).get("name") if isinstance(item, dict) else None
    if not isinstance(name, str) or not name:
        raise BadRequest("a node in Nodes has no metadata.name")
    return name
