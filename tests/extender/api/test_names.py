"""extender/api/_names.c against plain Python: each per-name pass gives what the Python it replaced gives, for any
names a request can carry (quotes, backslashes, control characters, non-ASCII, empty, over-long, not strings),
and refuses what it cannot answer with an exception, never a wrong answer."""

from __future__ import annotations

import tomllib
from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from extender.api._names import counts, first_bad, group, lookup, lookup_few, scores_json, unique
from extender.api.pod_request import MAX_NAME_CHARS
from extender.api.wire import BadRequest, parse_extender_args

from helpers.paths import ROOT

# Characters JSON must escape, and some it must not, often; then any character but a lone surrogate.
AWKWARD = '"\\\x00\x01\x08\x09\x0a\x0c\x0d\x1f\x7f/ ,:{}[]éß€\u2028😀'
TEXT = st.text(st.one_of(st.sampled_from(AWKWARD), st.characters(exclude_categories=("Cs",))), max_size=12)
INTEGERS = st.integers(min_value=-(2**63), max_value=2**63 - 1)  # what JSON carries to orjson
NOT_TEXT = st.one_of(st.none(), INTEGERS, st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                     st.lists(INTEGERS, max_size=3), st.dictionaries(st.text(max_size=3), INTEGERS, max_size=2))
SCORES = st.integers(min_value=0, max_value=10)


def first_bad_reference(names: list[Any], max_chars: int) -> int:
    return next((index for index, name in enumerate(names)
                 if not isinstance(name, str) or not 0 < len(name) <= max_chars), -1)


@given(st.lists(st.one_of(TEXT, NOT_TEXT), max_size=20), st.integers(min_value=0, max_value=12))
def test_first_bad_is_the_first_item_that_is_not_a_name(names: list[Any], max_chars: int) -> None:
    assert first_bad(names, max_chars) == first_bad_reference(names, max_chars)


@given(st.lists(TEXT, max_size=8), st.integers(min_value=0, max_value=8), st.one_of(NOT_TEXT, st.just(""),
                                                                                       st.just("n" * 254)))
def test_a_request_names_its_first_bad_node_name(names: list[str], at: int, bad: Any) -> None:
    names = ["n" if not name else name[:MAX_NAME_CHARS] for name in names]
    names.insert(min(at, len(names)), bad)
    expected = first_bad_reference(names, MAX_NAME_CHARS)
    body = orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": names})
    with pytest.raises(BadRequest, match=rf"^NodeNames\[{expected}\]: expected "):
        parse_extender_args(body)


@given(st.lists(TEXT.filter(bool), max_size=20))
def test_a_request_of_good_names_keeps_them_as_sent(names: list[str]) -> None:
    args = parse_extender_args(orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": names}))
    assert args.candidates() == names


KEYS = st.sampled_from(["a", "b", "é", "", 0, 1, None, (1, "x"), frozenset({2})])


@given(st.lists(KEYS, max_size=30), st.dictionaries(KEYS, st.one_of(st.none(), st.integers(), TEXT), max_size=6),
       st.booleans())
def test_lookup_is_dict_get_per_item(items: list[Any], table: dict[Any, Any], with_fallback: bool) -> None:
    fallback = [f"fallback-{index}" for index in range(len(items))] if with_fallback else None
    expected = [table[item] if item in table else (fallback[index] if fallback else None)
                for index, item in enumerate(items)]
    assert lookup(items, table, fallback) == expected
    assert lookup(items, table) == lookup_few(items, table) == [table.get(item) for item in items]


@given(st.lists(st.integers(min_value=0, max_value=300), max_size=400), st.integers(min_value=0, max_value=300))
def test_lookup_few_remembers_each_object_and_finds_equal_ones(picks: list[int], known: int) -> None:
    objects = [tuple([pick]) for pick in range(301)]  # equal to the table's keys, but not them
    table = {(pick,): f"value-{pick}" for pick in range(known)}
    items = [objects[pick] for pick in picks]
    assert lookup_few(items, table) == [table.get(item) for item in items]


def test_lookup_refuses_what_dict_get_refuses() -> None:
    for function in (lookup, lookup_few):
        with pytest.raises(TypeError, match="unhashable"):
            function(["a", ["b"]], {"a": 1})
    with pytest.raises(ValueError, match="as long as the items"):
        lookup(["a", "b"], {}, ["only one"])


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=200))
def test_unique_keeps_each_object_once_in_order(picks: list[int]) -> None:
    objects = [object() for _ in range(41)]  # more than the table's first size, so it grows
    items = [objects[pick] for pick in picks]
    expected = list({id(item): item for item in items}.values())
    assert unique(items) == expected


def test_unique_tells_objects_apart_not_values() -> None:
    first, second = tuple(["a", 1]), tuple(["a", 1])
    assert unique([first, second, first]) == [first, second]  # equal, not one: the caller's set() merges them


@given(st.lists(st.integers(min_value=0, max_value=40), max_size=300), st.booleans())
def test_counts_is_a_counter_of_the_items(picks: list[int], equal_copies: bool) -> None:
    """Objects (node keys) counted by identity as they come, and equal ones that are not one object (a reason
    string read twice) added up, as collections.Counter counts them."""
    objects = [object() for _ in range(41)]
    texts = [str(10**20 + pick) for pick in range(41)]
    items = [texts[pick] if equal_copies and pick % 2 else objects[pick] for pick in picks]
    if equal_copies:
        items += [str(10**20 + pick) for pick in picks if pick % 2]  # equal to texts', other objects
    assert counts(items) == Counter(items)
    with pytest.raises(TypeError, match="expected a list"):
        counts(tuple(items))


@given(st.lists(st.tuples(TEXT, st.sampled_from(["pass", "full", "gone", None])), max_size=40))
def test_group_sorts_items_by_their_labels_number(pairs: list[tuple[str, str | None]]) -> None:
    number_of = {"pass": 0, "full": 1, "gone": 2, None: 1}
    items, labels = [item for item, _ in pairs], [label for _, label in pairs]
    expected: list[list[str]] = [[], [], []]
    for item, label in pairs:
        expected[number_of[label]].append(item)
    assert group(items, labels, number_of, 3) == expected


@given(st.lists(st.tuples(TEXT, st.sampled_from(["a", "b", "c"])), max_size=40),
       st.lists(st.integers(0, 50), min_size=3, max_size=3))
def test_group_with_room_keeps_the_first_of_each_number(pairs: list[tuple[str, str]], room: list[int]) -> None:
    number_of = {"a": 0, "b": 1, "c": 2}
    items, labels = [item for item, _ in pairs], [label for _, label in pairs]
    whole = group(items, labels, number_of, 3)
    assert group(items, labels, number_of, 3, room) == [found[:limit] for found, limit in zip(whole, room)]
    assert group(items, labels, number_of, 3, None) == whole


@pytest.mark.parametrize("room", [[1, 1], [1, 1, -1], [1, 1, "1"], (1, 1, 1)])
def test_group_refuses_room_it_cannot_read(room: Any) -> None:
    with pytest.raises((ValueError, TypeError)):
        group(["item"], ["x"], {"x": 0}, 3, room)


@pytest.mark.parametrize(("labels", "number_of", "error"), [
    (["x"], {}, KeyError),
    (["x"], {"x": 3}, ValueError),
    (["x"], {"x": -1}, ValueError),
    (["x"], {"x": "0"}, TypeError),
    (["x", "y"], {"x": 0}, ValueError),  # two labels for one item
])
def test_group_refuses_labels_it_cannot_place(labels: list[str], number_of: dict[str, Any],
                                              error: type[Exception]) -> None:
    with pytest.raises(error):
        group(["item"], labels, number_of, 3)


def scores_reference(hosts: list[str], scores: list[int]) -> bytes:
    least = min(scores, default=0)
    return orjson.dumps([{"Host": host, "Score": score - least}
                         for host, score in zip(hosts, scores, strict=True) if score != least])


@given(st.lists(st.tuples(TEXT, SCORES), max_size=40))
def test_scores_json_is_what_orjson_writes_for_the_scores_above_the_least(entries: list[tuple[str, int]]) -> None:
    hosts, scores = [host for host, _ in entries], [score for _, score in entries]
    answer = scores_json(hosts, scores)
    assert answer == scores_reference(hosts, scores)
    kube = {host: 0 for host in hosts}  # what kube-scheduler adds per host: 0 for one left out
    kube.update({entry["Host"]: entry["Score"] for entry in orjson.loads(answer)})
    least = min(scores, default=0)
    assert all(kube[host] == score - least for host, score in entries if hosts.count(host) == 1)


@pytest.mark.parametrize(("hosts", "scores", "error"), [
    (["a", "b"], [11, 0], ValueError),
    (["a", "b"], [-1, 0], ValueError),
    (["a", "b"], [2**70, 0], ValueError),
    (["a", "b"], [1.0, 0], TypeError),
    (["a", "b"], ["1", 0], TypeError),
    ([b"a", "b"], [1, 0], TypeError),
    (["a"], [1, 0], ValueError),
    (["\ud800", "b"], [1, 0], UnicodeEncodeError),  # a lone surrogate is not UTF-8, so no JSON string
])
def test_scores_json_refuses_what_it_cannot_write(hosts: list[Any], scores: list[Any],
                                                  error: type[Exception]) -> None:
    with pytest.raises(error):
        scores_json(hosts, scores)


def test_scores_json_takes_long_names_and_every_score() -> None:
    hosts = [f"{'x' * 250}-{index}" for index in range(5000)]
    scores = [index % 11 for index in range(5000)]
    assert scores_json(hosts, scores) == scores_reference(hosts, scores)


def test_every_install_builds_the_extension() -> None:
    """A fresh clone's `make demo` or `make test` (pip install -e), a changed C source (make rebuilds), and the
    image, whose build stage has a compiler and whose runtime stage has none."""
    modules = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["ext-modules"]
    assert modules == [{"name": "extender.api._names", "sources": ["extender/api/_names.c"]}]
    makefile = (ROOT / "Makefile").read_text()
    assert "$(BIN)/activate: pyproject.toml extender/api/_names.c" in makefile
    build, runtime = (ROOT / "Dockerfile").read_text().split("\nFROM ")[1:]
    assert "gcc" in build and "COPY extender ./extender" in build
    assert "gcc" not in runtime and "apt-get" not in runtime


@given(st.lists(st.integers(0, 9), max_size=40), st.lists(st.integers(0, 9), max_size=40), st.integers(0, 10))
def test_lookup_few_makes_what_the_table_lacks_and_reads_a_last_pass_where_the_item_is_the_same(
        picks: list[int], before: list[int], known: int) -> None:
    objects = [object() for _ in range(10)]
    table = {objects[i]: i for i in range(known)}
    made: list[object] = []

    def make(item: object) -> int:
        made.append(item)
        return 100 + objects.index(item)

    items = [objects[i] for i in picks]
    expected = [i if i < known else 100 + i for i in picks]
    last_items = [objects[i] for i in (before + picks)[:len(picks)]]
    last_values = [-1] * len(picks)  # what a last pass gave: read where its item is the same one
    found = lookup_few(items, table, make, last_items, last_values)
    assert found == [-1 if last is item else value for item, last, value in zip(items, last_items, expected)]
    assert len(made) == len(set(map(id, made)))  # each missing object made once, then kept in the table
    assert all(table[item] == 100 + objects.index(item) for item in made)
    with pytest.raises(ValueError):
        lookup_few(items + [objects[0]], table, make, last_items, last_values)


def test_an_exception_from_make_ends_the_pass_and_keeps_what_was_made() -> None:
    first, second = object(), object()
    table: dict[object, int] = {}

    def make(item: object) -> int:
        if item is second:
            raise KeyError("not this one")
        return 1
    with pytest.raises(KeyError):
        lookup_few([first, second], table, make)
    assert table == {first: 1}
