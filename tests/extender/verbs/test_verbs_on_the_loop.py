"""Filter and prioritize are answered on the event loop from remembered answers and from those quick to work out
(boards of at most 8 GPUs, answer_memo.ON_LOOP): anything more (a bigger board's verdict or offer, a group's plan) is
worked out on the verbs' thread, and both give the same answers."""

from __future__ import annotations

import threading
import time

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.api._names import counts
from extender.cache.cluster_state import ClusterState, NodeKey
from extender.demo.cluster import DemoCluster
from extender.server.app import create_app
from extender.verbs import filter as filter_module
from extender.verbs import scoring
from extender.verbs.answer_memo import ON_LOOP, Inline, ShapeMemo, Unknown
from extender.verbs.service import ExtenderService
from topology.annotations import AnnotationKeys

NODES = (("node-a", "dgx-h100"), ("node-b", "dgx-h100"), ("node-c", "dgx-a100"))
KEYS = AnnotationKeys()


def _pod(name: str, gpus: int, annotations: dict[str, str] | None = None) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "resourceVersion": "1",
                         "annotations": annotations or {}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


class Recorder:
    """The service's filter and prioritize, recording the thread and `compute` of every call."""

    def __init__(self, service: ExtenderService) -> None:
        self.calls: list[tuple[str, str, bool]] = []
        for verb in ("filter", "prioritize"):
            real = getattr(service, verb)
            setattr(service, verb, self._wrap(verb, real))

    def _wrap(self, verb, real):
        def call(args, compute=True):
            self.calls.append((verb, threading.current_thread().name, compute))
            return real(args, compute)
        return call


def _served(nodes: tuple[tuple[str, str], ...]) -> tuple[TestClient, Recorder, ExtenderService]:
    state = ClusterState()
    service = ExtenderService(state, DemoCluster(state, nodes), one_best=False)
    recorder = Recorder(service)
    return TestClient(create_app(service)), recorder, service


@pytest.fixture
def served() -> tuple[TestClient, Recorder, ExtenderService]:
    return _served(NODES)


def _cycle(client: TestClient, pod: dict, nodes: tuple[tuple[str, str], ...] = NODES) -> tuple[dict, list]:
    names = [name for name, _ in nodes]
    filtered = client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": names})).json()
    scores = client.post("/prioritize", content=orjson.dumps({"Pod": pod, "NodeNames": filtered["NodeNames"]})).json()
    return filtered, scores


def test_a_new_shape_on_boards_of_8_gpus_is_worked_out_on_the_loop(served, monkeypatch) -> None:
    # Time without bound: a first request also compiles each board's tables, and a busy machine may take long.
    for module in (filter_module, scoring):
        monkeypatch.setattr(module, "ON_LOOP", Inline(ON_LOOP.cheap, 60.0))
    client, recorder, _ = served
    first = _cycle(client, _pod("first", 2, {KEYS.interconnect: "nvlink", KEYS.placement: "required"}))
    assert [(verb, compute) for verb, _, compute in recorder.calls] == [("filter", False), ("prioritize", False)]
    assert not any(thread.startswith("verbs") for _, thread, _ in recorder.calls)
    assert first[0]["NodeNames"] == [name for name, _ in NODES] and first[1], "verdicts and offers worked out"


def test_a_new_shape_on_a_16_gpu_board_is_worked_out_on_the_verbs_thread_and_then_remembered() -> None:
    nodes = (("dgx2-a", "dgx2-v100"), ("dgx2-b", "dgx2-v100"))
    client, recorder, _ = _served(nodes)
    first = _cycle(client, _pod("first", 2), nodes)
    where = [(verb, thread.startswith("verbs"), compute) for verb, thread, compute in recorder.calls]
    assert where == [("filter", False, False), ("filter", True, True),
                     ("prioritize", False, False), ("prioritize", True, True)]
    recorder.calls.clear()
    second = _cycle(client, _pod("second", 2), nodes)  # the same shape on the same nodes: all of it remembered
    assert [(verb, compute) for verb, _, compute in recorder.calls] == [("filter", False), ("prioritize", False)]
    assert not any(thread.startswith("verbs") for _, thread, _ in recorder.calls)
    assert second == first, "the same answers, wherever they were worked out"


def test_a_group_member_is_never_answered_on_the_loop(served) -> None:
    client, recorder, _ = served
    member = _pod("member", 2, {KEYS.group: "train", KEYS.group_size: "2"})
    for _ in range(2):
        _cycle(client, member)
    # Each request: tried on the loop from remembered answers (Unknown at once), then worked out on the thread.
    where = [(verb, thread.startswith("verbs"), compute) for verb, thread, compute in recorder.calls]
    assert where == [("filter", False, False), ("filter", True, True),
                     ("prioritize", False, False), ("prioritize", True, True)] * 2


def test_remembered_answers_only_raise_unknown_for_a_missing_one() -> None:
    memo: ShapeMemo[int] = ShapeMemo()
    nothing = Inline(lambda key: False, 1.0)
    assert memo.answers("shape", ["a", "b", "a"], len) == [1, 1, 1]
    assert memo.answers("shape", ["a"], len, inline=nothing) == [1]
    with pytest.raises(Unknown):
        memo.answers("shape", ["a", "ccc"], len, inline=nothing)
    with pytest.raises(Unknown):
        memo.answers("other", ["a"], len, inline=nothing)
    assert memo.answers("shape", ["ccc"], len) == [3]


def test_inline_answers_only_cheap_keys_within_its_time_and_keeps_what_it_computed() -> None:
    memo: ShapeMemo[int] = ShapeMemo()
    short = Inline(lambda key: len(key) < 3, 1.0)
    assert memo.answers("shape", ["a", "bb"], len, inline=short) == [1, 2]
    with pytest.raises(Unknown):
        memo.answers("shape", ["cc", "ddd"], len, inline=short)  # "ddd" is not cheap
    assert memo.answers("shape", ["cc"], len, inline=Inline(lambda key: False, 0.0)) == [2], "what came before kept"
    computed: list[str] = []

    def slow(key: str) -> int:
        computed.append(key)
        time.sleep(0.06)
        return len(key)
    with pytest.raises(Unknown):
        memo.answers("slow", ["e", "f"], slow, inline=Inline(lambda key: True, 0.05))
    assert computed == ["e"], "past its time, the next answer is left to the verbs' thread"
    assert memo.answers("slow", ["e"], slow, inline=Inline(lambda key: False, 0.0)) == [1], "kept"


def test_equal_answers_are_one_object_so_a_c_pass_counts_them_by_identity() -> None:
    memo: ShapeMemo[tuple[int, ...]] = ShapeMemo()
    found = memo.answers("shape", ["ab", "cd", "ab", "xyz"], lambda key: (len(key),))
    assert found[0] is found[1] is found[2] and found[3] == (3,)
    assert counts(found) == {(2,): 3, (3,): 1}


def test_on_the_loop_only_boards_of_at_most_8_gpus_are_cheap() -> None:
    state = ClusterState()
    DemoCluster(state, (("h100", "dgx-h100"), ("dgx2", "dgx2-v100"), ("gb200", "gb200-node")))
    sizes = {key.compiled.size: ON_LOOP.cheap(key) for key in state.keys_for(["h100", "dgx2", "gb200"])
             if isinstance(key, NodeKey)}
    assert sizes == {8: True, 16: False, 4: True}
    assert ON_LOOP.cheap(None) and ON_LOOP.cheap("no GPU topology reported")
