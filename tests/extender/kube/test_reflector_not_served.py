"""A resource the API server does not serve (PodGroups without their CRD or alpha API: 404 on every list) is a
WARNING once, then debug at each retry, and said again only after it has been served."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, wait_until
from kubernetes import client as k8s

from extender.api.group_request import COSCHEDULING
from extender.kube.client import KubeError, KubernetesApi
from extender.kube.reflector import Reflector

__all__ = ["kube_server_fixture"]  # the `kube_server` fixture

NOT_SERVED = "does not serve it"


class Sink:
    def __init__(self) -> None:
        self.lists = 0

    def replace(self, items: list[dict]) -> None:
        self.lists += 1

    def apply(self, event_type: str, obj: dict) -> None:
        pass

    def synced(self) -> None:
        pass


class CountingSleep:
    """An injected backoff: counts the pauses and waits only a moment."""

    def __init__(self) -> None:
        self.pauses = 0

    def __call__(self, seconds: float) -> None:
        self.pauses += 1
        threading.Event().wait(0.01)


def _said(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.name == "extender.kube.reflector" and record.levelno == level and NOT_SERVED in record.message]


def test_podgroups_not_served_are_a_warning_once(kube_server: FakeKubeApiServer,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="extender.kube.reflector")
    api = KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), timeout=5.0)
    sleep = CountingSleep()
    reflector = Reflector(lambda: api.list_pod_groups(COSCHEDULING),
                          lambda version, timeout: api.watch_pod_groups(COSCHEDULING, version, timeout), Sink(),
                          name="podgroups.scheduling.x-k8s.io", sleep=sleep)
    reflector.start()
    try:
        wait_until(lambda: sleep.pauses >= 4, what="four lists answered 404")
    finally:
        assert reflector.stop(15)
    warned = _said(caplog, logging.WARNING)
    assert len(warned) == 1 and "404" in warned[0] and "podgroups.scheduling.x-k8s.io" in warned[0], warned
    assert len(_said(caplog, logging.DEBUG)) >= 3


def test_served_then_gone_again_is_a_warning_again(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="extender.kube.reflector")
    answers = iter([KubeError("list podgroups: 404", 404), KubeError("list podgroups: 404", 404), ([], "7"),
                    KubeError("list podgroups: 404", 404)])
    sink = Sink()
    done = threading.Event()

    def listed() -> tuple[list[dict], str]:
        answer = next(answers, None)
        if answer is None:
            done.set()
            raise KubeError("list podgroups: 404", 404)
        if isinstance(answer, KubeError):
            raise answer
        return answer

    def watched(version: str, timeout: int) -> Iterator[tuple[str, dict]]:
        raise KubeError("watch podgroups: 404", 404)

    reflector = Reflector(listed, watched, sink, name="podgroups", sleep=CountingSleep())
    reflector.start()
    try:
        assert done.wait(20)
    finally:
        assert reflector.stop(15)
    assert sink.lists == 1
    assert len(_said(caplog, logging.WARNING)) == 2  # the first 404, and the watch's after the list succeeded
    assert any("serves it now" in record.getMessage() for record in caplog.records if record.levelno == logging.INFO)
