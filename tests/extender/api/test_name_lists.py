"""Names and pods found again by their bytes (api/wire.py NameLists, LastPod): the same request as the JSON parser reads
it, whatever the bytes, and the names and pod of kube-scheduler's body not decoded twice."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.api.wire import ExtenderArgs, LastPod, NameLists, parse_extender_args
from helpers.paths import FIXTURES

CAPTURED = (FIXTURES / "kube-scheduler" / "annotated-nvlink--filter.json").read_bytes()


def _read(body: bytes, recent: NameLists | None, last: LastPod | None = None) -> ExtenderArgs | str:
    try:
        return parse_extender_args(body, recent, last)
    except ValueError as error:
        return f"{type(error).__name__}: {error}"


def test_kube_schedulers_body_is_read_as_whole_and_its_names_kept() -> None:
    recent = NameLists()
    first = parse_extender_args(CAPTURED, recent)
    assert first == parse_extender_args(CAPTURED)
    again = parse_extender_args(CAPTURED, recent)
    assert again == first
    assert again.node_names is not first.node_names  # a copy: no request's list is another's
    assert all(a is b for a, b in zip(again.node_names, first.node_names, strict=True))  # not decoded twice


def test_prioritize_takes_the_pod_filter_read_and_another_pod_is_read_anew() -> None:
    """kube-scheduler sends prioritize filter's pod with the names the shortlist passed: the pod is read once."""
    document = orjson.loads(CAPTURED)
    last = LastPod()
    filtered = parse_extender_args(CAPTURED, NameLists(), last)
    prioritized = parse_extender_args(orjson.dumps({**document, "NodeNames": document["NodeNames"][:1]}),
                                      NameLists(), last)
    assert prioritized.pod is filtered.pod and prioritized.node_names == document["NodeNames"][:1]
    other = {**document["Pod"], "metadata": {**document["Pod"]["metadata"], "resourceVersion": "2"}}
    changed = parse_extender_args(orjson.dumps({**document, "Pod": other}), NameLists(), last)
    assert changed.pod == parse_extender_args(orjson.dumps({**document, "Pod": other})).pod != filtered.pod


def test_a_kept_list_changed_by_its_request_does_not_change_the_next() -> None:
    recent = NameLists()
    for _ in range(3):  # kept, then found twice
        parse_extender_args(CAPTURED, recent).candidates().append("node-z")
    assert parse_extender_args(CAPTURED, recent) == parse_extender_args(CAPTURED)


@pytest.mark.parametrize("body", [
    b'{,"NodeNames":["a"]}',  # no member before: not JSON, though `{}` and the array are
    b'{"Pod":{"metadata":{}},"NodeNames":["b"],"NodeNames":["a"]}',  # twice: the last counts, as Go's
    b'{"Pod":{"metadata":{}},"nodenames":["b"],"NodeNames":["a"]}',  # twice, in another case
    b'{"Pod":{"metadata":{}},"x":"\\",\\"NodeNames\\":[\\"a\\"]}',  # the member's bytes escaped in a string
    b'{"Pod":{"metadata":{}},"x":"y","NodeNames":["a",]}',  # a trailing comma
    b'{"Pod":{"metadata":{}},"NodeNames":["a"]}]}',  # more after the object
    b'{"Pod":{"metadata":{}},"NodeNames":["a",1]}',  # not a name
    b'{"Pod":{"metadata":{}},"NodeNames":[""]}',  # an empty name
    b'{"Pod":{"metadata":{}},"NodeNames":["\\u00e9t\\u00e9"]}',  # escapes decoded
    b'{"Pod":{"metadata":{}},"Nodes":null,"NodeNames":[]}',
    b'{"Pod":{"metadata":{}} ,"NodeNames":["a"]}',
    b'{"Pod":[],"NodeNames":["a"]}',
])
def test_odd_bodies_are_read_as_the_json_parser_reads_them(body: bytes) -> None:
    recent, last = NameLists(), LastPod()
    for _ in range(2):  # the second time from what the first kept, if it kept anything
        assert _read(body, recent, last) == _read(body, None)


_NAME = st.text(st.sampled_from('ab-."\\,[]{}:é\x00'), max_size=6)


@settings(max_examples=300, deadline=None)
@given(prefix=st.dictionaries(st.sampled_from(["Pod", "pod", "Nodes", "x", "NodeNames"]),
                              st.one_of(st.just({"metadata": {"name": "p"}}), st.none(), _NAME), max_size=3),
       names=st.one_of(st.lists(_NAME, max_size=5), _NAME, st.none()),
       cut=st.integers(0, 3))
def test_any_body_is_read_as_the_json_parser_reads_it(prefix: dict[str, Any], names: Any, cut: int) -> None:
    body = orjson.dumps({**prefix, "NodeNames": names})
    body = body[:len(body) - cut] if cut < 3 else body.replace(b',"NodeNames"', b',"NodeNames" ')
    recent, last = NameLists(), LastPod()
    for _ in range(2):
        assert _read(body, recent, last) == _read(body, None)


def test_kept_lists_are_bounded_in_number_and_size() -> None:
    recent = NameLists()
    for number in range(NameLists.ENTRIES + 3):
        parse_extender_args(orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": [f"node-{number}"]}), recent)
    assert len(recent._kept) == NameLists.ENTRIES
    huge = orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": ["n" * 200] * (NameLists.MAX_BYTES // 200)})
    assert len(parse_extender_args(huge, recent).candidates()) == NameLists.MAX_BYTES // 200
    assert all(len(kept) <= NameLists.MAX_BYTES for kept, _, _ in recent._kept)


def test_kept_names_are_the_clusters_own_objects_once_a_request_repeats_them() -> None:
    """Found again, a name is the str object the node tables hold, so their lookups match by identity; a list seen
    once is not looked up for that (most of a big cluster's samples are never seen again)."""
    own = {name: name for name in (f"node-{letter}" for letter in "ab")}
    owned: list[list[str]] = []
    recent = NameLists(lambda names: owned.append(names) or [own.get(name, name) for name in names])
    parse_extender_args(CAPTURED, recent)
    assert owned == []
    for _ in range(2):
        again = parse_extender_args(CAPTURED, recent).candidates()
        assert again == ["node-a", "node-b"]
        assert all(name is own[name] for name in again)
    assert len(owned) == 1, "made the cluster's own once, at the first repeat"
