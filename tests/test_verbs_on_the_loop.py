"""Filter and prioritize are answered on the event loop from remembered answers only: anything new (a verdict, an
offer, a group's plan) is worked out on the verbs' thread, and both give the same answers."""

from __future__ import annotations

import threading

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.app import create_app
from extender.demo_cluster import DemoCluster
from extender.memo import ShapeMemo, Unknown
from extender.service import ExtenderService
from extender.state import ClusterState
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


@pytest.fixture
def served() -> tuple[TestClient, Recorder, ExtenderService]:
    state = ClusterState()
    service = ExtenderService(state, DemoCluster(state, NODES))
    recorder = Recorder(service)
    return TestClient(create_app(service)), recorder, service


def _cycle(client: TestClient, pod: dict) -> tuple[dict, list]:
    names = [name for name, _ in NODES]
    filtered = client.post("/filter", content=orjson.dumps({"Pod": pod, "NodeNames": names})).json()
    scores = client.post("/prioritize", content=orjson.dumps({"Pod": pod, "NodeNames": filtered["NodeNames"]})).json()
    return filtered, scores


def test_a_new_shape_is_worked_out_on_the_verbs_thread_and_a_remembered_one_on_the_loop(served) -> None:
    client, recorder, _ = served
    first = _cycle(client, _pod("first", 2))
    where = [(verb, thread.startswith("verbs"), compute) for verb, thread, compute in recorder.calls]
    assert where == [("filter", False, False), ("filter", True, True),
                     ("prioritize", False, False), ("prioritize", True, True)]
    recorder.calls.clear()
    second = _cycle(client, _pod("second", 2))  # the same shape on the same nodes: all of it remembered
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
    assert memo.answers("shape", ["a", "b"], len) == {"a": 1, "b": 1}
    assert memo.answers("shape", ["a"], None) == {"a": 1, "b": 1}
    with pytest.raises(Unknown):
        memo.answers("shape", ["a", "ccc"], None)
    with pytest.raises(Unknown):
        memo.answers("other", ["a"], None)
    assert memo.answers("shape", ["ccc"], len)["ccc"] == 3
