"""The extender's server answers the verbs in its own protocol (extender/server/serve.py), not through ASGI: its answers
are the ASGI routes' answers byte for byte, and it keeps HTTP/1.1's rules where uvicorn would (keep-alive,
`Connection: close`, pipelining, `Expect: 100-continue`, a client gone before its answer, a body over the limit)."""

from __future__ import annotations

import re
import socket
import threading

import orjson
from fastapi.testclient import TestClient

from extender.cache.cluster_state import ClusterState
from extender.cache.ledger import Phase
from extender.demo.cluster import DemoCluster
from extender.server.app import create_app
from extender.verbs.service import ExtenderService
from helpers.extender_server import accepts, hold_binds, running_server, serving

WAIT = 30.0  # only a bound for a failing test, never a measurement
NODES = (("n1", "dgx-h100"), ("n2", "dgx-a100"), ("n3", "dgx1-v100"))
POD = {"metadata": {"name": "p", "namespace": "default", "uid": "u1", "resourceVersion": "1"},
       "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}
FILTER = orjson.dumps({"Pod": POD, "NodeNames": [name for name, _ in NODES]})
BIND = orjson.dumps({"PodName": "p", "PodNamespace": "default", "PodUID": "u1", "Node": "n1"})


def verb_service() -> ExtenderService:
    """A service of three boards that knows the pod POD: filter, prioritize and bind each answer something."""
    state = ClusterState()
    cluster = DemoCluster(state, NODES)
    cluster.add_pod(POD)
    return ExtenderService(state, cluster, one_best=False)  # every fit passes: the answers show each verdict


def _request(path: str, body: bytes, *headers: bytes) -> bytes:
    return b"".join((b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" % path.encode(),
                     *(header + b"\r\n" for header in headers), b"Content-Length: %d\r\n\r\n" % len(body), body))


def _answers(data: bytes) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """Each HTTP/1.1 answer in `data`: its status line, headers and body (by its Content-Length)."""
    found = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        status, *lines = head.split(b"\r\n")
        headers = {name.lower(): value for name, _, value in (line.partition(b": ") for line in lines)}
        length = int(headers.get(b"content-length", b"0"))
        found.append((status, headers, rest[:length]))
        data = rest[length:]
    return found


def _send(port: int, data: bytes, answers: int) -> tuple[list[tuple[bytes, dict[bytes, bytes], bytes]], bool]:
    """Send `data`, read `answers` answers; also whether the server then closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as connection:
        connection.sendall(data)
        received = b""
        while len(parsed := _complete(received)) < answers:
            chunk = connection.recv(65536)
            assert chunk, f"the server closed the connection after {received!r}"
            received += chunk
        connection.settimeout(0.5)
        try:
            closed = connection.recv(1) == b""
        except TimeoutError:
            closed = False
        return parsed, closed


def _complete(data: bytes) -> list[tuple[bytes, dict[bytes, bytes], bytes]]:
    """The answers wholly in `data` so far (a 100 Continue counts as one)."""
    done = b""
    while b"\r\n\r\n" in data:
        head, _, rest = data.partition(b"\r\n\r\n")
        match = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
        length = int(match.group(1)) if match else 0
        if len(rest) < length:
            break
        done += head + b"\r\n\r\n" + rest[:length]
        data = rest[length:]
    return _answers(done)


def test_the_servers_verbs_answer_as_the_asgi_routes_do() -> None:
    prioritize = orjson.dumps({"Pod": POD, "NodeNames": ["n1", "n2", "n3"]})
    asgi = TestClient(create_app(verb_service()))
    expected = [asgi.post(f"/{verb}", content=body) for verb, body in
                (("filter", FILTER), ("prioritize", prioritize), ("bind", BIND), ("bind", BIND))]
    service = verb_service()
    with running_server(service) as port:
        served, closed = _send(port, b"".join(_request(f"/{verb}", body) for verb, body in
                                              (("filter", FILTER), ("prioritize", prioritize), ("bind", BIND),
                                               ("bind", BIND))), 4)
    assert not closed, "kept alive"
    assert [(status.split(b" ")[1], body) for status, _, body in served] == [
        (str(answer.status_code).encode(), answer.content) for answer in expected]
    assert b'"NodeNames":["n1","n2"' in served[0][2] and served[2][2] == b'{"Error":""}'
    for _, headers, body in served:
        assert headers[b"content-type"] == b"application/json"
        assert re.fullmatch(rb"verb;dur=\d+\.\d{3}", headers[b"server-timing"])
    assert service.state.ledger.get("u1") is not None, "the pod was bound through the server"


def test_connection_close_is_answered_then_the_connection_closes() -> None:
    with running_server(verb_service()) as port:
        (answer,), closed = _send(port, _request("/filter", FILTER, b"Connection: close"), 1)
    assert answer[0] == b"HTTP/1.1 200 OK" and answer[1][b"connection"] == b"close" and closed


def test_a_request_pipelined_behind_a_bind_at_work_is_answered_after_it() -> None:
    """The bind goes to its threads; the filter behind it waits for its answer, as HTTP/1.1 orders them."""
    service = verb_service()
    entered, release = hold_binds(service)
    with running_server(service) as port:
        threading.Thread(target=lambda: (entered.wait(WAIT), release.set()), daemon=True).start()
        (bound, filtered), closed = _send(port, _request("/bind", BIND) + _request("/filter", FILTER), 2)
    assert bound[2] == b'{"Error":""}' and b'"NodeNames"' in filtered[2] and not closed


def test_expect_100_continue_is_honoured() -> None:
    with running_server(verb_service()) as port:
        (continued, answer), _ = _send(port, _request("/filter", FILTER, b"Expect: 100-continue"), 2)
    assert continued[0] == b"HTTP/1.1 100 Continue" and answer[0] == b"HTTP/1.1 200 OK"
    assert b'"NodeNames"' in answer[2]


def test_a_client_gone_before_its_answer_leaves_the_server_serving() -> None:
    service = verb_service()
    entered, release = hold_binds(service)
    with running_server(service) as port:
        with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as connection:
            connection.sendall(_request("/bind", BIND))
            assert entered.wait(WAIT)
        release.set()  # the answer now has no one to go to
        (answer,), _ = _send(port, _request("/filter", FILTER), 1)
    assert answer[0] == b"HTTP/1.1 200 OK"
    assert service.state.ledger.get("u1") is not None, "the bind itself went ahead"


def test_a_body_over_the_limit_sent_in_chunks_is_refused_as_it_passes_it() -> None:
    service = verb_service()
    chunk = b"x" * 65536
    head = b"POST /filter HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(130))  # 8.1 MiB, past 8 MiB
    with running_server(service) as port, socket.create_connection(("127.0.0.1", port), timeout=WAIT) as connection:
        connection.sendall(head)
        received = b""
        try:
            connection.sendall(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed as soon as the body passed the limit
        while chunk := _recv(connection):
            received += chunk
    assert received.startswith(b"HTTP/1.1 413 ") and b"over the extender's limit of 8388608 bytes" in received
    assert b"connection: close" in received
    assert service.metrics.registry.get_sample_value(
        "gpu_topology_extender_requests_refused_total", {"verb": "filter", "reason": "too_large"}) == 1.0


def _recv(connection: socket.socket) -> bytes:
    try:
        return connection.recv(65536)
    except ConnectionResetError:
        return b""


def test_a_verb_at_work_when_the_server_stops_is_answered_before_it_goes() -> None:
    """uvicorn's graceful shutdown waits for the connection: the bind's answer is written, then it closes."""
    service = verb_service()
    entered, release = hold_binds(service)
    with serving(service) as (server, port, thread):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=WAIT) as connection:
                connection.sendall(_request("/bind", BIND))
                assert entered.wait(WAIT)
                server.should_exit = True
                while accepts(port):  # the shutdown has begun once the listener is closed
                    threading.Event().wait(0.02)
                release.set()
                answer = b""
                while chunk := connection.recv(65536):
                    answer += chunk
        finally:
            release.set()
    assert not thread.is_alive()
    (status, headers, body), = _answers(answer)
    assert status == b"HTTP/1.1 200 OK" and body == b'{"Error":""}' and headers[b"connection"] == b"close"
    assert service.state.ledger.get("u1") is not None


def test_a_binding_that_cannot_be_posted_from_the_loop_keeps_its_gpus_and_says_so() -> None:
    service = verb_service()

    def broken(*args):
        raise RuntimeError("no way to post")

    service.kube.bind_soon = broken  # type: ignore[method-assign]
    answer = TestClient(create_app(service)).post("/bind", content=BIND)
    assert answer.status_code == 200
    assert answer.json()["Error"] == "internal error in the GPU topology extender's bind; see its log"
    entry = service.state.ledger.get("u1")
    assert entry is not None and entry.phase is Phase.UNCERTAIN, "the Binding's outcome is unknown"
