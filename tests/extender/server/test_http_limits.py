"""What one client can hold at the HTTP edge: a body over the limit gets 413 before it is read, a slow or endless
request is cut off at its deadline, and /healthz answers while a verb works."""

from __future__ import annotations

import asyncio
import socket
import threading

import orjson
import pytest
from fastapi.testclient import TestClient

from extender.api.wire import MAX_BODY_BYTES
from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server.app import BodyTooLarge, create_app, read_body
from extender.server.serve import Limits, ServeOptions
from extender.verbs.answer_memo import Unknown
from extender.verbs.service import ExtenderService
from helpers.extender_server import running_server

WAIT = 30.0  # only a bound for a failing test, never a measurement
FILTER_BODY = orjson.dumps({"Pod": {"metadata": {"name": "p", "uid": "u1"},
                                    "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}},
                            "NodeNames": ["n1"]})


def _service() -> ExtenderService:
    state = ClusterState()
    return ExtenderService(state, DemoCluster(state, (("n1", "dgx-h100"),)))


def _exchange(port: int, data: bytes) -> bytes:
    """Send `data`, then read until the server closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as connection:
        connection.sendall(data)
        received = b""
        while chunk := connection.recv(65536):
            received += chunk
        return received


QUICK = ServeOptions(limits=Limits(request_seconds=0.3, idle_seconds=0.3, max_head_bytes=4096))
SMALL_HEAD = ServeOptions(limits=Limits(max_head_bytes=4096))


def test_a_declared_body_over_the_limit_is_refused_before_it_is_sent() -> None:
    service = _service()
    with running_server(service) as port:
        head = (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1))
        answer = _exchange(port, head)  # not a byte of the body: the answer cannot wait for it
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b"over the extender's limit of 8388608 bytes" in answer
    metrics = service.metrics.registry.get_sample_value(
        "gpu_topology_extender_requests_refused_total", {"verb": "filter", "reason": "too_large"})
    assert metrics == 1.0


def test_a_chunked_body_is_refused_as_soon_as_it_passes_the_limit() -> None:
    """No Content-Length (chunked): what arrives is counted, and reading stops at the chunk that passes it."""
    pulled: list[int] = []

    async def receive() -> dict:
        pulled.append(1)
        return {"type": "http.request", "body": b"x" * 1000, "more_body": len(pulled) < 100}

    scope = {"type": "http", "method": "POST", "path": "/filter", "headers": []}
    with pytest.raises(BodyTooLarge, match="over the extender's limit of 10000 bytes"):
        asyncio.run(read_body(scope, receive, 10_000))
    assert len(pulled) == 11, "the eleventh chunk passes 10,000 bytes; nothing after it is read"


@pytest.mark.parametrize(("data", "status"), [
    (b"POST /filter HTTP/1.1\r\nHost: x\r\n", b"408"),  # a head that never ends
    (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"Pod\"", b"408"),  # a body that stops
    (b"", b"408"),  # a connection that never sends a request
    (b"GET /healthz HTTP/1.1\r\n" + b"X-Pad: " + b"a" * 8000, b"431"),  # a head past the bound
])
def test_slow_or_endless_requests_are_cut_off(data: bytes, status: bytes) -> None:
    service = _service()
    with running_server(service, QUICK) as port:
        answer = _exchange(port, data)
        assert answer.startswith(b"HTTP/1.1 " + status + b" ")
        assert _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
            b"HTTP/1.1 200 "), "the server still serves others"
    reason = "head_too_large" if status == b"431" else "timeout"
    assert service.metrics.registry.get_sample_value(
        "gpu_topology_extender_requests_refused_total", {"verb": "connection", "reason": reason}) == 1.0


def test_a_whole_request_in_one_chunk_past_the_head_bound_is_served() -> None:
    """The bound is on the head: a request whose body makes one chunk larger than it is served, twice on one
    connection (kube-scheduler's 5,000-name filter arrives in one read of 100 KB)."""
    pod = {"metadata": {"name": "p", "uid": "u1"},
           "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    body = orjson.dumps({"Pod": pod, "NodeNames": ["n1"] + [f"absent-{i}" for i in range(2000)]})
    assert len(body) > 4 * SMALL_HEAD.limits.max_head_bytes
    with running_server(_service(), SMALL_HEAD) as port:
        request = (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as connection:
            for _ in range(2):
                connection.sendall(request)
                answer = connection.recv(65536)
                assert answer.startswith(b"HTTP/1.1 200 ") and b'"NodeNames":["n1"]' in answer


@pytest.mark.parametrize("second", [False, True])
def test_a_whole_head_past_the_bound_is_refused_with_431(second: bool) -> None:
    """A head that ends within the chunk that carries it is measured whole; on a kept-alive connection the 431 is
    still written (the answer before it is done)."""
    padded = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 8000 + b"\r\n\r\n"
    with running_server(_service(), SMALL_HEAD) as port, \
            socket.create_connection(("127.0.0.1", port), timeout=WAIT) as connection:
        if second:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert connection.recv(65536).startswith(b"HTTP/1.1 200 ")
        connection.sendall(padded)
        answer = b""
        while chunk := connection.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 431 ") and answer.endswith(b"request head over 4096 bytes")


def test_a_request_within_the_deadline_is_served_on_a_kept_alive_connection() -> None:
    with running_server(_service(), QUICK) as port:
        request = (b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(FILTER_BODY)) + FILTER_BODY
        answer = _exchange(port, request + request.replace(b"Host: x", b"Host: x\r\nConnection: close"))
    assert answer.count(b"HTTP/1.1 200 ") == 2 and answer.count(b'"NodeNames":["n1"]') == 2


def test_healthz_answers_while_a_verb_works() -> None:
    service = _service()
    entered, release = threading.Event(), threading.Event()
    real_filter = service.filter

    def blocking_filter(args, compute=True):  # a verb held up as long as the test says (a stalled selection)
        if not compute:
            raise Unknown  # work like that is never remembered: on the event loop, the verb hands it on
        entered.set()
        release.wait(WAIT)
        return real_filter(args)

    service.filter = blocking_filter  # type: ignore[method-assign]
    answers: dict[str, int] = {}
    # One event loop serves every request of this client (the context manager keeps its portal), as in uvicorn.
    with TestClient(create_app(service)) as client:

        def call(name: str, method: str, path: str, body: bytes | None = None) -> threading.Thread:
            thread = threading.Thread(target=lambda: answers.__setitem__(
                name, client.request(method, path, content=body).status_code))
            thread.start()
            return thread

        try:
            verb = call("filter", "POST", "/filter", FILTER_BODY)
            assert entered.wait(WAIT), "the filter started"
            probes = [call("healthz", "GET", "/healthz"), call("metrics", "GET", "/metrics")]
            for probe in probes:
                probe.join(WAIT)
            assert answers == {"healthz": 200, "metrics": 200}, "answered while the filter was still working"
            assert not release.is_set() and verb.is_alive()
        finally:
            release.set()
        verb.join(WAIT)
    assert answers["filter"] == 200


def test_fastapis_own_telemetry_is_off_even_with_a_global_tracer_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Our telemetry is Prometheus: FastAPI's per-request OpenTelemetry middleware must not run on the hot path."""
    from opentelemetry import trace

    class Installed(trace.NoOpTracerProvider):
        """A provider an operator's OpenTelemetry set-up would install (not one of the API's deferred ones)."""

    monkeypatch.setattr(trace, "get_tracer_provider", Installed)
    state = ClusterState()
    app = create_app(ExtenderService(state, DemoCluster(state)))
    assert not app.web._native_telemetry.enabled()


def test_each_connection_accepted_is_counted() -> None:
    """kube-scheduler keeps 2 idle connections to an extender: the count shows how many more it opens."""
    service = _service()
    with running_server(service) as port:
        for _ in range(3):
            assert _exchange(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").startswith(
                b"HTTP/1.1 200 ")
    assert service.metrics.registry.get_sample_value("gpu_topology_extender_connections_opened_total") == 3.0
