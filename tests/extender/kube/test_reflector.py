"""extender.kube.reflector over the real client and the in-process API server, plus its backoff alone."""

from __future__ import annotations

import itertools
import queue
import random
import threading

import pytest
from helpers.kube_api_server import PODS, FakeKubeApiServer, kube_server_fixture, make_pod, wait_until
from kubernetes import client as k8s

from extender.kube.client import KubernetesApi
from extender.kube.reflector import Reflector
from topology.backoff import Backoff

__all__ = ["kube_server_fixture"]  # the `kube_server` fixture


class RecordingSink:
    """Records every call in order and keeps the state the calls describe."""

    def __init__(self, fail_apply_once: bool = False) -> None:
        self.lock = threading.Lock()
        self.calls: list[tuple] = []
        self.state: dict[str, dict] = {}
        self.fail_apply_once = fail_apply_once

    def replace(self, items: list[dict]) -> None:
        with self.lock:
            self.state = {item["metadata"]["name"]: item for item in items}
            self.calls.append(("replace", sorted(self.state)))

    def apply(self, event_type: str, obj: dict) -> None:
        if self.fail_apply_once:
            self.fail_apply_once = False
            raise RuntimeError("sink bug")
        with self.lock:
            name = obj["metadata"]["name"]
            if event_type == "DELETED":
                self.state.pop(name, None)
            else:
                self.state[name] = obj
            self.calls.append((event_type, name, obj["metadata"]["resourceVersion"]))

    def synced(self) -> None:
        with self.lock:
            self.calls.append(("synced",))

    def changes(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(c[0], c[1]) for c in self.calls if c[0] in ("ADDED", "MODIFIED", "DELETED")]

    def replaces(self) -> list[list[str]]:
        with self.lock:
            return [c[1] for c in self.calls if c[0] == "replace"]


class RecordingSleep:
    """An injected sleep: records each delay and waits only a moment, so a test runs in real time."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        threading.Event().wait(0.01)


@pytest.fixture
def api(kube_server: FakeKubeApiServer) -> KubernetesApi:
    return KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), timeout=5.0)


@pytest.fixture
def running():
    """Start reflectors through this; they are stopped after the test even when it fails."""
    started: list[Reflector] = []

    def start(reflector: Reflector) -> Reflector:
        started.append(reflector)
        reflector.start()
        return reflector

    yield start
    for reflector in started:
        assert reflector.stop(15), f"reflector {reflector.name} did not stop"


def pod_reflector(api: KubernetesApi, sink: RecordingSink, **kwargs) -> Reflector:
    kwargs.setdefault("sleep", RecordingSleep())
    return Reflector(api.list_pods, api.watch_pods, sink, name="pods", **kwargs)


def test_the_list_reaches_the_sink_then_synced_fires(kube_server, api, running):
    kube_server.add_pod(make_pod("b"))
    kube_server.add_pod(make_pod("a"))
    kube_server.add_pod(make_pod("done", phase="Succeeded"))
    sink = RecordingSink()
    reflector = pod_reflector(api, sink)
    assert not reflector.has_synced
    running(reflector)
    assert reflector.wait_for_sync(20)
    assert reflector.has_synced
    assert sink.calls[:2] == [("replace", ["a", "b"]), ("synced",)]


def test_changes_arrive_in_order(kube_server, api, running):
    kube_server.add_pod(make_pod("a"))
    sink = RecordingSink()
    running(pod_reflector(api, sink)).wait_for_sync(20)
    kube_server.add_pod(make_pod("b"))
    kube_server.update_pod(make_pod("a", node_name="gpu-1", phase="Running"))
    kube_server.delete_pod("default", "b")
    kube_server.update_pod(make_pod("a", node_name="gpu-1", phase="Succeeded"))  # leaves the selector
    wait_until(lambda: len(sink.changes()) == 4, what="four changes")
    assert sink.changes() == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b"), ("DELETED", "a")]
    versions = [int(c[2]) for c in sink.calls if c[0] != "replace" and c[0] != "synced"]
    assert versions == sorted(versions)
    assert sink.state == {}
    assert sink.calls.count(("synced",)) == 1


def test_a_broken_stream_resumes_from_the_last_version_without_losing_events(kube_server, api, running):
    sink = RecordingSink()
    sleep = RecordingSleep()
    reflector = running(pod_reflector(api, sink, sleep=sleep))
    reflector.wait_for_sync(20)
    version_a = kube_server.add_pod(make_pod("a"))["metadata"]["resourceVersion"]
    wait_until(lambda: "a" in sink.state, what="pod a")
    kube_server.break_watches()
    kube_server.add_pod(make_pod("b"))  # while the stream is down or coming back
    kube_server.add_pod(make_pod("c"))
    wait_until(lambda: "c" in sink.state, what="pod c")
    assert sink.changes() == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]
    assert kube_server.list_count(PODS) == 1  # no relist
    assert kube_server.watch_versions(PODS)[1] == version_a
    assert len(sleep.delays) == 1 and 0.16 <= sleep.delays[0] <= 0.24  # one short pause, not a spin


def test_a_stream_the_server_ends_is_resumed_without_a_pause(kube_server, api, running):
    sink = RecordingSink()
    sleep = RecordingSleep()
    reflector = running(pod_reflector(api, sink, sleep=sleep, healthy_watch=0.0))
    reflector.wait_for_sync(20)
    kube_server.add_pod(make_pod("a"))
    wait_until(lambda: "a" in sink.state, what="pod a")
    kube_server.end_watches()
    kube_server.add_pod(make_pod("b"))
    wait_until(lambda: "b" in sink.state, what="pod b")
    assert kube_server.list_count(PODS) == 1 and sleep.delays == []


def test_bookmarks_move_the_version_on_without_reaching_the_sink(kube_server, api, running):
    sink = RecordingSink()
    reflector = running(pod_reflector(api, sink))
    reflector.wait_for_sync(20)
    assert kube_server.wait_for_watchers(PODS)
    bookmark = kube_server.bookmark(PODS)
    wait_until(lambda: reflector.resource_version == bookmark, what="the bookmark")
    kube_server.break_watches()
    wait_until(lambda: len(kube_server.watch_versions(PODS)) == 2, what="a second watch")
    assert kube_server.watch_versions(PODS)[1] == bookmark
    assert sink.changes() == []


def test_gone_relists_and_the_sink_gets_the_current_state(kube_server, api, running):
    kube_server.add_pod(make_pod("a"))
    sink = RecordingSink()
    reflector = running(pod_reflector(api, sink))
    reflector.wait_for_sync(20)
    assert kube_server.wait_for_watchers(PODS)
    # Hold the next watch unanswered while the cluster moves on and the server forgets the past.
    kube_server.hang("GET", "/api/v1/pods", watch=True)
    kube_server.end_watches()
    wait_until(lambda: len(kube_server.watch_versions(PODS)) == 2, what="the held watch")
    kube_server.delete_pod("default", "a")
    kube_server.add_pod(make_pod("b"))
    kube_server.add_pod(make_pod("c"))
    kube_server.compact()
    kube_server.release_hangs()  # the held watch fails; its retry from the old version gets 410
    wait_until(lambda: len(sink.replaces()) == 2, what="a relist")
    assert sink.replaces() == [["a"], ["b", "c"]]
    assert sink.changes() == []  # nothing from before the relist was replayed
    assert kube_server.list_count(PODS) == 2
    kube_server.add_pod(make_pod("d"))
    wait_until(lambda: "d" in sink.state, what="pod d after the relist")
    assert sorted(sink.state) == ["b", "c", "d"]
    assert sink.calls.count(("synced",)) == 1


def test_a_failing_sink_leads_to_a_relist(kube_server, api, running, caplog):
    sink = RecordingSink(fail_apply_once=True)
    reflector = running(pod_reflector(api, sink))
    reflector.wait_for_sync(20)
    kube_server.add_pod(make_pod("a"))  # apply raises
    wait_until(lambda: len(sink.replaces()) == 2, what="a relist")
    assert sink.replaces()[-1] == ["a"]
    assert any("sink failed" in r.message for r in caplog.records)
    kube_server.add_pod(make_pod("b"))
    wait_until(lambda: "b" in sink.state, what="pod b")


def test_backoff_on_an_unreachable_server_grows_with_jitter(kube_server, api, running):
    kube_server.stop()
    delays: list[float] = []
    enough = threading.Event()
    release = threading.Event()

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) >= 12:
            enough.set()
            release.wait(15)

    lists: list[int] = []

    def list_pods():
        lists.append(1)
        return api.list_pods()

    backoff = Backoff(initial=0.2, maximum=30.0, jitter=0.2, rand=random.Random(7).random)
    reflector = running(Reflector(list_pods, api.watch_pods, RecordingSink(), sleep=sleep, backoff=backoff))
    assert enough.wait(30)
    reflector.stop(timeout=0)
    release.set()
    assert reflector.stop(15)
    assert not reflector.has_synced
    bases = [min(30.0, 0.2 * 2**i) for i in range(12)]
    for delay, base in zip(delays, bases, strict=True):
        assert base * 0.8 <= delay <= base * 1.2
    assert all(later > earlier for earlier, later in itertools.pairwise(delays[:8]))  # 0.2 s doubling to 25.6 s
    factors = [delay / base for delay, base in zip(delays, bases)]
    assert max(factors) - min(factors) > 0.05  # jittered, not a fixed schedule
    assert len(lists) == len(delays)  # every failed attempt was followed by its pause


def test_backoff_resets_after_the_server_comes_back(kube_server, api, running):
    kube_server.stop()
    sleep = RecordingSleep()
    sink = RecordingSink()
    reflector = running(pod_reflector(api, sink, sleep=sleep))
    wait_until(lambda: len(sleep.delays) >= 3, what="three failed lists")
    kube_server.start()
    assert reflector.wait_for_sync(30)
    assert sleep.delays[1] > sleep.delays[0]
    kube_server.add_pod(make_pod("a"))
    wait_until(lambda: "a" in sink.state, what="pod a")
    failures_before = len(sleep.delays)
    kube_server.break_watches()
    wait_until(lambda: len(sleep.delays) > failures_before, what="a pause after the break")
    assert 0.16 <= sleep.delays[failures_before] <= 0.24  # back to the first step


def test_a_watch_that_ends_at_once_never_spins():
    """A server (or proxy) that answers every watch with an empty stream is paced by the backoff."""
    delays: list[float] = []
    enough = threading.Event()
    release = threading.Event()
    watches = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        if len(delays) >= 6:
            enough.set()
            release.wait(15)

    def watch(version: str, timeout: int):
        watches.append(version)
        return iter(())

    reflector = Reflector(lambda: ([], "7"), watch, RecordingSink(), sleep=sleep,
                          backoff=Backoff(initial=0.2, rand=lambda: 0.5))
    reflector.start()
    assert enough.wait(20)
    reflector.stop(timeout=0)
    release.set()
    assert reflector.stop(15)
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 6.4])
    assert watches[:6] == ["7"] * 6


def test_stop_ends_a_quiet_watch_promptly(kube_server, api):
    sink = RecordingSink()
    reflector = pod_reflector(api, sink, watch_timeout=300)  # the server would hold the watch 5 minutes
    reflector.start()
    assert reflector.wait_for_sync(20)
    assert kube_server.wait_for_watchers(PODS)
    assert reflector.stop(15)


def test_stop_is_checked_between_events_of_a_plain_generator():
    events: queue.Queue = queue.Queue()

    def watch(version: str, timeout: int):
        while True:
            yield events.get()

    sink = RecordingSink()
    reflector = Reflector(lambda: ([], "1"), watch, sink, sleep=RecordingSleep())
    reflector.start()
    assert reflector.wait_for_sync(20)
    events.put(("ADDED", {"metadata": {"name": "a", "resourceVersion": "2"}}))
    wait_until(lambda: "a" in sink.state, what="pod a")
    assert not reflector.stop(timeout=0)  # blocked inside the generator
    events.put(("ADDED", {"metadata": {"name": "b", "resourceVersion": "3"}}))
    assert reflector.stop(15)


def test_a_refused_watch_relists_after_a_pause(kube_server, api, running):
    sink = RecordingSink()
    sleep = RecordingSleep()
    reflector = running(pod_reflector(api, sink, sleep=sleep, healthy_watch=0.0))
    reflector.wait_for_sync(20)
    assert kube_server.wait_for_watchers(PODS)
    kube_server.fail("GET", "/api/v1/pods", watch=True, status=403)
    kube_server.end_watches()
    wait_until(lambda: len(sink.replaces()) == 2, what="a relist")
    assert len(sleep.delays) == 1


def test_backoff_steps_and_bounds():
    low = Backoff(initial=0.2, maximum=30.0, jitter=0.2, rand=lambda: 0.0)
    high = Backoff(initial=0.2, maximum=30.0, jitter=0.2, rand=lambda: 0.999999)
    assert [round(low.next(), 3) for _ in range(10)] == [0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 24.0, 24.0]
    assert [round(high.next(), 2) for _ in range(10)][-1] == 36.0
    low.reset()
    assert low.next() == pytest.approx(0.16)


def test_relist_closes_a_quiet_watch_and_lists_at_once(kube_server, api, running):
    """A new leader asks for a fresh list: it must not wait for a quiet watch to end (60 s) or back off."""
    kube_server.add_pod(make_pod("a"))
    sink = RecordingSink()
    sleep = RecordingSleep()
    reflector = running(pod_reflector(api, sink, sleep=sleep, watch_timeout=600))
    reflector.wait_for_sync(20)
    assert kube_server.wait_for_watchers(PODS)
    kube_server.hang("GET", "/api/v1/pods", watch=False)  # the relist: held until the test lets it go
    ticket = reflector.relist()
    wait_until(lambda: kube_server.list_count(PODS) == 2, what="the relist request")
    assert not reflector.listed(ticket), "a list still under way answers no ticket"
    kube_server.release_hangs()  # that list fails; the next one succeeds
    wait_until(lambda: reflector.listed(ticket), what="the relist in the sink")
    assert sink.replaces() == [["a"], ["a"]] and kube_server.list_count(PODS) == 3
    assert reflector.listed(ticket - 1) and not reflector.listed(ticket + 1)
    assert sink.calls.count(("synced",)) == 1
