"""loadtests/fuzz.py sees every answer and can fail (issue 31): its canary breaks two verbs so that nothing but the
answers tells, one answering 500 and one an internal error, both with nothing in the log, and `--scale 0.01`
must exit 1 naming each; the same run unbroken exits 0 with every part counted on both sides. The answer tap
counts each path that answers: the server's own verb protocol, FastAPI, and uvicorn's own refusals."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server import app as server_app
from extender.verbs.service import ExtenderService
from helpers.paths import FIXTURES, LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import fuzz  # noqa: E402
from answer_tap import NO_REQUEST_LINE, AnswerTap  # noqa: E402

QUICK = ["--seed", "1", "--scale", "0.01"]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[fuzz.SeedRun]:
    """Every seed's run that fuzz.main makes, as it made it."""
    made: list[fuzz.SeedRun] = []
    real = fuzz.run_seed

    def kept(seed_value: int, scale: float) -> fuzz.SeedRun:
        made.append(real(seed_value, scale))
        return made[-1]
    monkeypatch.setattr(fuzz, "run_seed", kept)
    return made


def test_a_clean_quick_run_passes_with_every_part_counted_on_both_sides(runs: list[fuzz.SeedRun]) -> None:
    assert fuzz.main(QUICK) == 0
    (run,) = runs
    assert run.failures() == []
    assert [part.planned > 0 and part.answered == part.received == part.sent >= part.planned
            for part in run.parts] == [True, True, True]
    assert run.tap.total == sum(part.answered for part in run.parts)
    verbs = {path for path, status in run.tap.answers if status == 200}
    assert {"/filter", "/prioritize", "/bind", "/preempt", "/admission/pods"} <= verbs
    assert all(run.parsed[module] >= run.parser_examples > 0 for module in fuzz.PARSERS)


def test_the_canary_a_verb_answering_500_and_one_an_internal_error_unlogged_fail_the_quick_run(
        monkeypatch: pytest.MonkeyPatch, runs: list[fuzz.SeedRun]) -> None:
    def broken(self: ExtenderService, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("canary")

    def silent_500(service: ExtenderService, verb: str, error: Exception, on_error: Any) -> tuple[int, bytes]:
        return (500, b"[]") if verb == "prioritize" else (200, on_error(f"internal error in {verb}"))
    monkeypatch.setattr(ExtenderService, "prioritize", broken)
    monkeypatch.setattr(ExtenderService, "filter", broken)
    monkeypatch.setattr(server_app, "_failed", silent_500)  # answers without a word in the log

    assert fuzz.main(QUICK) == 1
    (run,) = runs
    assert run.tracebacks == []  # only the answers tell
    failures = run.failures()
    assert any(failure.startswith("/prioritize: ") and failure.endswith(" answers 500") for failure in failures)
    assert any(failure.startswith("/filter: ") and "\"internal error\" answers" in failure for failure in failures)


def test_a_part_fails_when_it_sent_fewer_than_planned_or_an_answer_is_missing_on_either_side() -> None:
    whole = fuzz.Part("part", "seed", planned=10, sent=10, received=10, answered=10)
    assert whole.failures() == []
    assert fuzz.Part("part", "seed", 10, 9, 9, answered=9).failures() == ["part: sent 9 of the 10 requests planned"]
    assert fuzz.Part("part", "seed", 10, 10, 9, answered=9).failures() == ["part: 1 of 10 requests got no answer"]
    assert fuzz.Part("part", "seed", 10, 10, 10, answered=11).failures() == [
        "part: the server wrote 11 answers, the client read 10"]


@pytest.fixture
def server() -> Iterator[tuple[AnswerTap, int]]:
    state = ClusterState()
    tap, port, stop = fuzz.start_server(ExtenderService(state, DemoCluster(state, fuzz.NODES)))
    yield tap, port
    stop()


def _exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(request)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    return answer


def test_the_tap_counts_the_answers_of_every_path(server: tuple[AnswerTap, int],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tap, port = server
    body = (FIXTURES / "kube-scheduler" / "annotated-nvlink--filter.json").read_bytes()

    def post(path: str, content: bytes, more: bytes = b"") -> bytes:
        return _exchange(port, b"POST %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: %d\r\n%s\r\n%s"
                         % (path.encode(), len(content), more, content))

    assert post("/filter", body).startswith(b"HTTP/1.1 200")  # the server's own protocol
    # Through ASGI: Expect: 100-continue sends a verb uvicorn's way; the interim 100 is no answer of its own.
    assert b"HTTP/1.1 200" in post("/filter", body, b"Expect: 100-continue\r\n")
    over = b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (server_app.MAX_BODY_BYTES + 1)
    assert _exchange(port, over).startswith(b"HTTP/1.1 413")  # refused by the protocol, the body never read
    monkeypatch.setattr(ExtenderService, "readiness", lambda self: 1 / 0)
    assert _exchange(port, b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
        b"HTTP/1.1 500")  # FastAPI's route raised
    assert _exchange(port, b"GET / HTTP/1.1\r\nBad Header\r\n\r\n").startswith(b"HTTP/1.1 400")  # uvicorn's own
    assert dict(tap.answers) == {("/filter", 200): 2, ("/filter", 413): 1, ("/readyz", 500): 1,
                                 (NO_REQUEST_LINE, 400): 1}
    assert not tap.internal
    answer = orjson.loads(post("/bind", b"{}").split(b"\r\n\r\n", 1)[1])
    assert answer["Error"] and not tap.internal  # a refusal is no internal error
