"""The wire format's own edge cases: key case, odd host names in the C-speed prioritize serializer."""

from __future__ import annotations

import orjson
import pytest

from extender.wire import BadRequest, PrioritizeEncoder, filter_result, parse_binding_args, parse_extender_args


@pytest.mark.parametrize(("hosts", "scores"), [
    (["node-a", "node-b", "node-c"], [7, 7, 0]),
    (['we"ird', "com,ma", '","', 'x","Score":9},{"Host":"y', "ünï", "back\\slash"], [3, 10, 0, 1, 2, 3]),
    ([], []),
])
def test_prioritize_encoder_writes_exactly_the_entries(hosts: list[str], scores: list[int]) -> None:
    encoder = PrioritizeEncoder()
    for _ in range(2):  # the second time from the cached pieces
        decoded = orjson.loads(encoder.encode(hosts, scores))
        assert decoded == [{"Host": host, "Score": score} for host, score in zip(hosts, scores, strict=True)]


def test_prioritize_encoder_refuses_scores_out_of_range() -> None:
    with pytest.raises(ValueError, match="0 to 10"):
        PrioritizeEncoder().encode(["a"], [11])


def test_keys_are_read_case_insensitively_as_go_does() -> None:
    args = parse_extender_args(b'{"pod": {"metadata": {"name": "p"}}, "nodenames": ["a"]}')
    assert args.candidates() == ["a"]
    binding = parse_binding_args(b'{"podName":"p","podNamespace":"d","podUID":"u","NODE":"n"}')
    assert (binding.pod_name, binding.node) == ("p", "n")


def test_nodes_without_names_are_refused() -> None:
    with pytest.raises(BadRequest, match="metadata.name"):
        parse_extender_args(b'{"Pod": {"metadata": {}}, "Nodes": {"items": [{"metadata": {}}]}}')


@pytest.mark.parametrize("groups", [
    {},
    {"not enough free GPUs": ["a", "b"], "no GPU topology reported": ["c"]},
    {'odd "reason"': ['we"ird', "com,ma", '","', 'x","y'], "empty group": []},
])
def test_filter_result_writes_reason_groups_as_node_objects(groups: dict[str, list[str]]) -> None:
    names = [name for members in groups.values() for name in members]
    args = parse_extender_args(orjson.dumps({"Pod": {"metadata": {}}, "NodeNames": names + ["ok"]}))
    answer = orjson.loads(filter_result(args, ["ok"], groups, {"unresolvable": ["u"]}))
    assert answer == {"NodeNames": ["ok"], "Error": "", "FailedAndUnresolvableNodes": {"u": "unresolvable"},
                      "FailedNodes": {name: reason for reason, members in groups.items() for name in members}}
