"""kube-scheduler's calls over HTTP/2 (extender/server/http2.py): offered by ALPN on the main port, answered as over
HTTP/1.1, on one connection; and the limits HTTP/1.1 keeps, kept for streams. Real certificates (openssl), a real
h2 client (httpx) and a raw one (the h2 library) for what a well-behaved client never sends."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import orjson
import pytest
from h2.errors import ErrorCodes

from extender import cli
from extender.api.wire import MAX_BODY_BYTES
from extender.server.http2 import FORBIDDEN, MAX_RESETS, MAX_STREAMS, WINDOW_SLACK
from extender.server.serve import Limits, ServeOptions
from extender.verbs.service import ExtenderService
from helpers.extender_server import accepts, hold_binds, running_server, serving
from helpers.pki import pki
from test_verb_protocol import BIND, FILTER, POD, verb_service

__all__ = ["pki"]  # the fixture: the CA and the certificates, made with openssl

WAIT = 30.0  # only a bound for a failing test, never a measurement
PRIORITIZE = FILTER
LARGE_FILTER = FILTER + b" " * (60 << 10)  # white space after the JSON: the same request, in fewer of them


def _options(pki: Path, **limits: float) -> ServeOptions:
    return ServeOptions(tls_cert=str(pki / "server.crt"), tls_key=str(pki / "server.key"),
                        client_ca=str(pki / "ca.crt"), client_names=("kube-scheduler",),
                        limits=Limits(**limits) if limits else Limits())


def _context(pki: Path, client: str = "kube-scheduler", alpn: tuple[str, ...] = ("h2", "http/1.1")) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(pki / f"{client}.crt", pki / f"{client}.key")
    context.set_alpn_protocols(list(alpn))
    return context


def _refused(service: ExtenderService, reason: str) -> float | None:
    return service.metrics.registry.get_sample_value(
        "gpu_topology_extender_requests_refused_total", {"verb": "connection", "reason": reason})


def _opened(service: ExtenderService) -> float | None:
    return service.metrics.registry.get_sample_value("gpu_topology_extender_connections_opened_total")


def _verbs_over(port: int, pki: Path, http2: bool) -> list[tuple[str, int, bytes]]:
    with httpx.Client(http2=http2, verify=_context(pki), base_url=f"https://127.0.0.1:{port}",
                      timeout=WAIT) as client:
        answers = [client.post(f"/{verb}", content=body) for verb, body in
                   (("filter", FILTER), ("prioritize", PRIORITIZE), ("bind", BIND), ("bind", BIND))]
    return [(answer.http_version, answer.status_code, answer.content) for answer in answers]


def test_the_verbs_answer_over_h2_as_over_http_1_1_on_one_connection(pki: Path) -> None:
    over_h2, over_h1 = verb_service(), verb_service()
    with running_server(over_h2, _options(pki)) as port:
        answers_h2 = _verbs_over(port, pki, http2=True)
    with running_server(over_h1, _options(pki)) as port:
        answers_h1 = _verbs_over(port, pki, http2=False)
    assert {version for version, _, _ in answers_h2} == {"HTTP/2"}
    assert {version for version, _, _ in answers_h1} == {"HTTP/1.1"}
    assert [answer[1:] for answer in answers_h2] == [answer[1:] for answer in answers_h1]
    assert b'"NodeNames":["n1","n2"' in answers_h2[0][2] and answers_h2[2][2] == b'{"Error":""}'
    assert over_h2.state.ledger.get("u1") is not None, "the pod was bound over h2"
    assert _opened(over_h2) == 1.0


def test_the_admission_webhook_answers_over_h2_with_the_query_its_client_adds(pki: Path) -> None:
    """kube-apiserver's webhook client speaks h2 and adds ?timeout= to the webhook's path."""
    review = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                           "request": {"uid": "r1", "namespace": "default", "operation": "CREATE", "object": POD}})
    with running_server(verb_service(), _options(pki)) as port:
        with httpx.Client(http2=True, verify=_context(pki), base_url=f"https://127.0.0.1:{port}",
                          timeout=WAIT) as client:
            answer = client.post("/admission/pods?timeout=10s", content=review)
    assert (answer.http_version, answer.status_code) == ("HTTP/2", 200)
    assert answer.json()["response"] == {"uid": "r1", "allowed": True}


def test_without_http2_the_port_offers_http_1_1_only(pki: Path) -> None:
    with running_server(verb_service(), replace(_options(pki), http2=False)) as port:
        assert {version for version, _, _ in _verbs_over(port, pki, http2=True)} == {"HTTP/1.1"}


def test_concurrent_calls_are_streams_of_one_connection(pki: Path) -> None:
    service = verb_service()

    async def calls(port: int) -> list[httpx.Response]:
        async with httpx.AsyncClient(http2=True, verify=_context(pki), base_url=f"https://127.0.0.1:{port}",
                                     timeout=WAIT) as client:
            return await asyncio.gather(*(client.post("/filter", content=FILTER) for _ in range(MAX_STREAMS)))

    with running_server(service, _options(pki)) as port:
        answers = asyncio.run(calls(port))
    assert [answer.status_code for answer in answers] == [200] * MAX_STREAMS
    assert len({answer.content for answer in answers}) == 1
    assert _opened(service) == 1.0


def test_what_is_not_a_verb_is_refused_with_its_reason(pki: Path) -> None:
    with running_server(verb_service(), _options(pki)) as port:
        with httpx.Client(http2=True, verify=_context(pki), base_url=f"https://127.0.0.1:{port}",
                          timeout=WAIT) as client:
            healthz, get_filter = client.get("/healthz"), client.get("/filter")
    assert (healthz.http_version, healthz.status_code) == ("HTTP/2", 404)
    assert b"the probes and /metrics answer over HTTP/1.1" in healthz.content
    assert get_filter.status_code == 405


def test_a_certificate_of_another_name_gets_403_and_the_connection_closes(pki: Path) -> None:
    service = verb_service()
    with running_server(service, _options(pki)) as port:
        with _RawClient(port, pki, "intruder") as client:
            stream = client.request(FILTER)
            client.read_until(lambda: client.ended(stream) and client.terminated)
    assert client.status(stream) == b"403" and client.bodies[stream] == FORBIDDEN
    assert _refused(service, "client_name") == 1.0


def test_a_body_over_the_limit_is_refused_declared_or_sent(pki: Path) -> None:
    service = verb_service()
    with running_server(service, _options(pki)) as port:
        with _RawClient(port, pki) as client:
            declared = client.request(None, length=MAX_BODY_BYTES + 1)
            client.read_until(lambda: client.ended(declared))
            sent = client.request(None)
            chunk = b"x" * client.conn.max_outbound_frame_size
            for _ in range(MAX_BODY_BYTES // len(chunk) + 1):  # the stream's window holds one byte past the limit
                client.send(sent, chunk[:client.conn.local_flow_control_window(sent)])
            client.read_until(lambda: client.ended(sent))
            healthy = client.request(FILTER)  # the connection still serves
            client.read_until(lambda: client.ended(healthy))
    assert client.status(declared) == b"413" and b"8388609 bytes is over" in client.bodies[declared]
    assert client.status(sent) == b"413" and b"over the extender's limit" in client.bodies[sent]
    assert client.status(healthy) == b"200"
    assert service.metrics.registry.get_sample_value(
        "gpu_topology_extender_requests_refused_total", {"verb": "filter", "reason": "too_large"}) == 2.0


def test_a_stream_not_whole_by_its_deadline_gets_408_and_an_idle_connection_closes(pki: Path) -> None:
    service = verb_service()
    with running_server(service, _options(pki, request_seconds=0.3, idle_seconds=0.5)) as port:
        with _RawClient(port, pki) as client:
            slow = client.request(None)
            client.send(slow, FILTER[:10])
            client.read_until(lambda: client.ended(slow))
            client.read_until(lambda: client.terminated)
    assert client.status(slow) == b"408" and _refused(service, "timeout") == 1.0
    assert client.goaway == ErrorCodes.NO_ERROR, "closed for idleness, not for an error"


def test_a_connection_in_use_outlives_the_idle_time_and_closes_once_idle(pki: Path) -> None:
    with running_server(verb_service(), _options(pki, idle_seconds=0.5)) as port:
        with _RawClient(port, pki) as client:
            for _ in range(4):  # 1.2 s in all, never 0.5 s without a stream
                stream = client.request(FILTER)
                client.read_until(lambda: client.ended(stream))
                assert client.goaway is None and client.status(stream) == b"200"
                threading.Event().wait(0.3)
            client.read_until(lambda: client.terminated)
    assert client.goaway == ErrorCodes.NO_ERROR


def test_the_window_is_given_back_past_its_slack_and_always_holds_the_largest_body(pki: Path) -> None:
    """A WINDOW_UPDATE a request would be a frame and a write more each bind: the bytes are given back once they
    pass WINDOW_SLACK, and the window never falls below the largest body a verb takes."""
    with running_server(verb_service(), _options(pki)) as port:
        with _RawClient(port, pki) as client:
            client.read_until(lambda: client.window_updates == 1)  # sent with the server's SETTINGS
            opened = client.conn.outbound_flow_control_window
            assert opened >= MAX_BODY_BYTES + WINDOW_SLACK
            sent, updates = 0, []
            while sent < 2 * WINDOW_SLACK:
                stream = client.request(LARGE_FILTER)
                client.read_until(lambda: client.ended(stream))
                sent += len(LARGE_FILTER)
                updates.append(client.window_updates - 1)
                assert client.status(stream) == b"200"
                assert client.conn.outbound_flow_control_window >= MAX_BODY_BYTES
    each = WINDOW_SLACK // len(LARGE_FILTER) + 1  # requests whose bytes pass the slack
    assert updates[:each - 1] == [0] * (each - 1), "no update while the bytes are within the slack"
    assert updates[each - 1] == 1 and updates[-1] == len(updates) // each


def test_an_answer_waits_for_the_clients_window(pki: Path) -> None:
    """An answer larger than the client lets the server send at once is sent as the client opens its window."""
    with running_server(verb_service(), _options(pki)) as port:
        with _RawClient(port, pki, window=16) as client:
            stream = client.request(FILTER)
            client.read_until(lambda: client.ended(stream))
    assert client.status(stream) == b"200" and b'"NodeNames":["n1","n2"' in client.bodies[stream]


def test_a_client_that_resets_stream_after_stream_is_cut_off(pki: Path) -> None:
    """The rapid reset (CVE-2023-44487): streams opened and reset at once cost work, but hold none of the stream
    limit."""
    service = verb_service()
    with running_server(service, _options(pki)) as port:
        with _RawClient(port, pki) as client:
            for _ in range(MAX_RESETS + 1):
                stream = client.request(None)
                client.conn.reset_stream(stream, ErrorCodes.CANCEL)
            client.flush()
            client.read_until(lambda: client.terminated)
    assert client.goaway == ErrorCodes.ENHANCE_YOUR_CALM and _refused(service, "http2_resets") == 1.0


@pytest.mark.parametrize("garbage", [b"\x00\x00\x04\x09\x00\x00\x00\x00\x01abcd",  # a naked CONTINUATION
                                     b"\x10\x00\x00\x00\x00\x00\x00\x00\x01"])  # a frame past MAX_FRAME_SIZE
def test_a_broken_protocol_closes_the_connection_with_its_reason(pki: Path, garbage: bytes) -> None:
    service = verb_service()
    with running_server(service, _options(pki)) as port:
        with _RawClient(port, pki) as client:
            client.tls.sendall(garbage)
            client.read_until(lambda: client.terminated)
    assert client.goaway in (ErrorCodes.PROTOCOL_ERROR, ErrorCodes.FRAME_SIZE_ERROR)
    assert _refused(service, "http2_protocol") == 1.0


def test_a_header_block_in_continuation_frames_padding_priority_and_trailers_are_read(pki: Path) -> None:
    """What a client may send that Go's does not: a block past one frame, padded frames, a priority, trailers."""
    with running_server(verb_service(), _options(pki)) as port:
        with _RawClient(port, pki) as client:
            long_head = client.request(FILTER, extra=((b"x-pad", b"p" * 40_000),))  # > 16 KiB: CONTINUATION
            client.read_until(lambda: client.ended(long_head))
            padded = client.conn.get_next_available_stream_id()
            client.conn.send_headers(padded, _head(FILTER), priority_weight=200, priority_depends_on=0)
            client.conn.send_data(padded, FILTER[:5], pad_length=30)
            client.conn.send_data(padded, FILTER[5:], pad_length=7)
            client.conn.send_headers(padded, [(b"x-trailer", b"1")], end_stream=True)
            client.flush()
            client.read_until(lambda: client.ended(padded))
            client.conn.ping(b"12345678")
            client.flush()
            client.read_until(lambda: client.pinged)
    assert client.status(long_head) == b"200" and client.status(padded) == b"200"
    assert client.bodies[long_head] == client.bodies[padded]


def test_a_header_block_over_the_bound_closes_the_connection(pki: Path) -> None:
    service = verb_service()
    with running_server(service, _options(pki, max_head_bytes=4096)) as port:
        with _RawClient(port, pki) as client:
            client.request(FILTER, extra=((b"x-pad", b"p" * 5000),))
            client.read_until(lambda: client.terminated)
    assert client.goaway == ErrorCodes.ENHANCE_YOUR_CALM and _refused(service, "head_too_large") == 1.0


def test_streams_past_the_limit_are_refused_and_the_others_answered(pki: Path) -> None:
    with running_server(verb_service(), _options(pki)) as port:
        with _RawClient(port, pki) as client:
            client.conn.remote_settings.max_concurrent_streams = MAX_STREAMS + 1  # as if it ignored the setting
            held = [client.request(None, length=len(FILTER)) for _ in range(MAX_STREAMS)]
            refused = client.request(None, length=len(FILTER))
            client.read_until(lambda: client.ended(refused))
            for stream in held:
                client.send(stream, FILTER, end=True)
            client.read_until(lambda: all(client.ended(stream) for stream in held))
    assert client.resets[refused] == ErrorCodes.REFUSED_STREAM
    assert {client.status(stream) for stream in held} == {b"200"}


def test_a_verb_at_work_when_the_server_stops_is_answered_then_goaway(pki: Path) -> None:
    service = verb_service()
    entered, release = hold_binds(service)
    with serving(service, _options(pki)) as (server, port, thread):
        try:
            with _RawClient(port, pki) as client:
                bind = client.request(BIND, path=b"/bind")
                assert entered.wait(WAIT)
                server.should_exit = True
                while accepts(port):  # the shutdown has begun once the listener is closed
                    threading.Event().wait(0.02)
                release.set()
                client.read_until(lambda: client.ended(bind) and client.terminated)
        finally:
            release.set()
    assert not thread.is_alive()
    assert client.status(bind) == b"200" and client.bodies[bind] == b'{"Error":""}'
    assert client.goaway == ErrorCodes.NO_ERROR


@pytest.mark.parametrize(("frames", "code"), [
    (b"\x00\x00\x00\x06\x00\x00\x00\x00\x00", ErrorCodes.PROTOCOL_ERROR),  # a PING of no bytes
    (b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x00\x00\x00", ErrorCodes.PROTOCOL_ERROR),  # WINDOW_UPDATE of 0
    (b"\x00\x00\x04\x08\x00\x00\x00\x00\x00\x7f\xff\xff\xff", ErrorCodes.FLOW_CONTROL_ERROR),  # past 2^31-1
    (b"\x00\x00\x01\x00\x00\x00\x00\x00\x05x", ErrorCodes.PROTOCOL_ERROR),  # DATA on a stream never opened
    (b"\x00\x00\x03\x01\x04\x00\x00\x00\x01\xff\xff\xff", ErrorCodes.COMPRESSION_ERROR),  # no HPACK
    (b"\x00\x00\x01\x01\x00\x00\x00\x00\x01\x82\x00\x00\x00\x06\x00\x00\x00\x00\x00",
     ErrorCodes.PROTOCOL_ERROR),  # a header block interrupted
])
def test_a_frame_against_the_protocol_closes_the_connection_with_its_code(pki: Path, frames: bytes,
                                                                          code: ErrorCodes) -> None:
    service = verb_service()
    with running_server(service, _options(pki)) as port:
        with _RawClient(port, pki) as client:
            client.tls.sendall(frames)
            client.read_until(lambda: client.terminated)
    assert client.goaway == code and _refused(service, "http2_protocol") == 1.0


def _head(body: bytes, path: bytes = b"/filter") -> list[tuple[bytes, bytes]]:
    return [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"127.0.0.1"), (b":path", path),
            (b"content-length", b"%d" % len(body))]


class _RawClient:
    """An h2 client over a blocking TLS socket that sends what it is told, and keeps what comes back."""

    def __init__(self, port: int, pki: Path, client: str = "kube-scheduler", window: int | None = None) -> None:
        self.tls = _context(pki, client).wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=WAIT),
                                                     server_hostname="127.0.0.1")
        assert self.tls.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
        if window is not None:
            self.conn.local_settings = h2.settings.Settings(
                client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
        self.conn.initiate_connection()
        self.heads: dict[int, list[tuple[bytes, bytes]]] = {}
        self.bodies: dict[int, bytes] = {}
        self.done: set[int] = set()
        self.resets: dict[int, ErrorCodes] = {}
        self.goaway: ErrorCodes | None = None
        self.pinged = False
        self.window_updates = 0  # the connection's, the one sent with the server's SETTINGS among them
        self.terminated = False
        self.flush()

    def __enter__(self) -> _RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.tls.close()

    def request(self, body: bytes | None, path: bytes = b"/filter", length: int | None = None,
                extra: tuple[tuple[bytes, bytes], ...] = ()) -> int:
        """A POST; its body whole if given, else left open."""
        stream = self.conn.get_next_available_stream_id()
        headers = [(b":method", b"POST"), (b":scheme", b"https"), (b":authority", b"127.0.0.1"), (b":path", path)]
        if length is not None or body is not None:
            headers.append((b"content-length", b"%d" % (length if length is not None else len(body or b""))))
        self.conn.send_headers(stream, [*headers, *extra])
        if body is not None:
            self.conn.send_data(stream, body, end_stream=True)
        self.flush()
        return stream

    def send(self, stream: int, data: bytes, end: bool = False) -> None:
        self.conn.send_data(stream, data, end_stream=end)
        self.flush()

    def flush(self) -> None:
        if data := self.conn.data_to_send():
            try:
                self.tls.sendall(data)
            except OSError:
                self.terminated = True

    def ended(self, stream: int) -> bool:
        return stream in self.done

    def status(self, stream: int) -> bytes:
        return dict(self.heads[stream])[b":status"]

    def read_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            try:
                data = self.tls.recv(65536)
            except (ssl.SSLError, OSError):
                data = b""
            if not data:
                self.terminated = True
                assert condition(), "the server closed the connection first"
                return
            for event in self.conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    self.heads[event.stream_id] = list(event.headers)
                elif isinstance(event, h2.events.DataReceived):
                    self.bodies[event.stream_id] = self.bodies.get(event.stream_id, b"") + event.data
                    self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    self.done.add(event.stream_id)
                elif isinstance(event, h2.events.StreamReset):
                    self.done.add(event.stream_id)
                    self.resets[event.stream_id] = event.error_code
                elif isinstance(event, h2.events.PingAckReceived):
                    self.pinged = True
                elif isinstance(event, h2.events.WindowUpdated) and event.stream_id == 0:
                    self.window_updates += 1
                elif isinstance(event, h2.events.ConnectionTerminated):
                    self.goaway = event.error_code
            self.flush()


@pytest.mark.parametrize(("flags", "offered"), [((), True), (("--no-http2",), False)])
def test_the_command_line_offers_h2_unless_told_not_to(monkeypatch: pytest.MonkeyPatch, flags: tuple[str, ...],
                                                      offered: bool) -> None:
    served: list[ServeOptions] = []
    monkeypatch.setattr(cli, "serve", lambda service, options: served.append(options))
    assert cli.main(["serve", "--demo", *flags]) == 0
    assert [options.http2 for options in served] == [offered]
