"""The HTTP server around the app: uvicorn with limits on what one connection may hold, and client pinning.

uvicorn bounds a body in flight (it stops reading past 64 KiB unread) and idle time between requests
(`timeout_keep_alive`), but not a request that arrives slowly, a head without end, or a connection that never
sends a byte. `LimitedProtocol` adds those, and with `--client-name` it answers 403 to a client certificate
of another name before any route runs. Each refusal is a log line and a count in
`gpu_topology_extender_requests_refused_total{verb="connection"}`. It also answers kube-scheduler's verb
requests itself, before ASGI (limited_protocol says why); such a body is held up to the verb's limit
(MAX_BODY_BYTES) and refused with 413 as soon as it passes it.

With `--metrics-port`, a second listener on the same host serves only the probes and /metrics (app.ProbesOnly),
over TLS with the same serving certificate but asking none of the client, so a scraper that cannot bind needs no
certificate that the main port's --client-name would let through. Both listen on one event loop, where the
certificates are also taken up again when their files change (certificates.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import uvicorn
import uvloop
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from extender.server.app import (
    Answered,
    ExtenderApp,
    ProbesOnly,
    Verb,
    answer_headers,
    create_app,
    declared_over_limit,
    over_limit,
    server_timing,
)
from extender.server.certificates import CHECK_SECONDS, CLIENT_CA, SERVING, Certificates, Files
from extender.server.http2 import ALPN, Http2Limits, Http2Verbs
from extender.verbs.service import ExtenderService

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one client may hold. kube-scheduler's httpTimeout is 3 s in scheduler-config/: a request that takes
    longer to arrive is one it has already given up on."""

    request_seconds: float = 5.0  # from a request's first byte to its last
    idle_seconds: float = 5.0  # a connection with no request in progress (uvicorn's keep-alive default)
    max_head_bytes: int = 64 << 10  # request line and headers; kube-scheduler sends under 300 bytes
    max_connections: int = 256  # kube-scheduler, probes and Prometheus hold a few; uvicorn answers 503 past it


@dataclass(frozen=True, slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8888
    tls_cert: str | None = None
    tls_key: str | None = None
    client_ca: str | None = None
    client_names: tuple[str, ...] = ()  # with client_ca: only certificates of these names (CN or DNS SAN)
    log_level: str = "info"
    limits: Limits = Limits()
    metrics_port: int | None = None  # a listener of the probes and /metrics alone, no client certificate asked
    http2: bool = True  # the main port offers h2 to kube-scheduler (http2.py), beside HTTP/1.1

    def __post_init__(self) -> None:
        """TLS options that only work together, checked as the options are made: before the CLI starts anything."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.client_ca and not self.tls_cert:
            raise ValueError("--client-ca needs --tls-cert and --tls-key")
        if self.client_names and not self.client_ca:
            raise ValueError("--client-name needs --client-ca: without client certificates there is no name to check")
        if self.metrics_port is not None and not (0 < self.metrics_port < 65536 and self.metrics_port != self.port):
            raise ValueError(f"--metrics-port must be a port, 1 to 65535, other than --port, not {self.metrics_port}")


# The event loop by measurement (a 20 KB request and its answer on a keep-alive connection, server CPU per request):
# over TLS, asyncio's 90 us against uvloop's 140 us, as uvloop's TLS layer costs more than the standard library's;
# in plain HTTP, uvloop's 65 us against asyncio's 75 to 110 us.
_LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def server_config(service: ExtenderService, options: ServeOptions, app: ExtenderApp | None = None) -> uvicorn.Config:
    """`app`: the service's app with routes of its own on `app.web` (the load test's), else a new one."""
    app = app or create_app(service)
    protocol = limited_protocol(options.limits, frozenset(options.client_names), _refused(service),
                                service.metrics.connections.inc, app.verbs)
    config = _config(app, options.port, protocol, options, options.client_ca)
    if config.ssl is not None:
        # No TLS 1.3 session tickets: kube-scheduler's client keeps no session cache, so it never resumes, and
        # it opens a connection whenever more than 2 requests overlap (Go keeps 2 idle per host): each full
        # handshake cost 1.3 to 1.5 ms of CPU here without tickets against 1.6 to 1.7 ms with OpenSSL's default two.
        config.ssl.num_tickets = 0
        if options.http2:
            config.ssl.set_alpn_protocols(list(ALPN))
    return config


def metrics_config(service: ExtenderService, options: ServeOptions) -> uvicorn.Config:
    """The metrics port's listener: the probes and /metrics only, the same limits, no client certificate asked; its
    connections are not counted in connections_opened_total, which counts kube-scheduler's handshakes."""
    assert options.metrics_port is not None
    protocol = limited_protocol(options.limits, frozenset(), _refused(service), lambda: None, {})
    return _config(ProbesOnly(service), options.metrics_port, protocol, options, None, lifespan="off")


def _refused(service: ExtenderService) -> Callable[[str], None]:
    refused = service.metrics.requests_refused
    return lambda reason: refused.labels("connection", reason).inc()


def _config(app: Any, port: int, protocol: type[HttpToolsProtocol], options: ServeOptions, client_ca: str | None,
            **more: Any) -> uvicorn.Config:
    """A loaded uvicorn configuration. No access log: kube-scheduler calls several times per pod; the metrics
    count and time every verb. No proxy headers: nothing stands between kube-scheduler and the extender, and the
    client's address is only logged."""
    config = uvicorn.Config(app, host=options.host, port=port, log_level=options.log_level,
                            loop="asyncio" if options.tls_cert else "uvloop", proxy_headers=False,
                            access_log=False, http=protocol, limit_concurrency=options.limits.max_connections,
                            timeout_keep_alive=int(options.limits.idle_seconds),
                            ssl_certfile=options.tls_cert, ssl_keyfile=options.tls_key, ssl_ca_certs=client_ca,
                            ssl_cert_reqs=ssl.CERT_REQUIRED if client_ca else ssl.CERT_NONE, **more)
    config.load()
    return config


class Listeners:
    """The main port, the metrics port if asked, and the certificates they serve, on one event loop."""

    def __init__(self, service: ExtenderService, options: ServeOptions, check_seconds: float = CHECK_SECONDS) -> None:
        files = ([Files(SERVING, options.tls_cert, options.tls_key)] if options.tls_cert and options.tls_key else [])
        if files and options.client_ca:
            files.append(Files(CLIENT_CA, options.client_ca))
        # Before the first load (Certificates says why).
        self.certificates = Certificates(files, service.metrics.registry, check_seconds) if files else None
        main = server_config(service, options)
        self.main = uvicorn.Server(main)
        self.metrics = None if options.metrics_port is None else _Beside(metrics_config(service, options))
        if self.certificates is not None:
            for server in (self.main, self.metrics):
                if server is not None and server.config.ssl is not None:
                    self.certificates.serve_with(server.config.ssl, client_ca=server is self.main)
        self._loop = _LOOPS[main.loop]

    def run(self, sockets: list[socket.socket] | None = None,
            metrics_sockets: list[socket.socket] | None = None) -> None:
        """Until the main listener stops (SIGTERM or SIGINT in the main thread, or `main.should_exit`)."""
        with asyncio.Runner(loop_factory=self._loop) as runner:
            runner.run(self.serve(sockets, metrics_sockets))

    async def serve(self, sockets: list[socket.socket] | None = None,
                    metrics_sockets: list[socket.socket] | None = None) -> None:
        metrics = None if self.metrics is None else asyncio.create_task(self.metrics.serve(metrics_sockets))
        checks = None if self.certificates is None else asyncio.create_task(self.certificates.watch())
        try:
            await self.main.serve(sockets)
        finally:
            if self.metrics is not None:
                self.metrics.should_exit = True
            if checks is not None:
                checks.cancel()
            await asyncio.gather(*(task for task in (metrics, checks) if task is not None), return_exceptions=True)


class _Beside(uvicorn.Server):
    """A listener beside the main one: the main one takes the signals, and stops it when it stops."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def serve(service: ExtenderService, options: ServeOptions) -> None:
    Listeners(service, options).run()


def certificate_names(peercert: dict[str, Any] | None) -> set[str]:
    """The subject CNs and DNS SANs of a certificate as `SSLSocket.getpeercert()` gives it."""
    if not peercert:
        return set()
    names = {value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"}
    names.update(value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS")
    return names


def limited_protocol(limits: Limits, client_names: frozenset[str], refused: Callable[[str], None],
                     opened: Callable[[], None], verbs: Mapping[str, Verb]) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline per request, a bounded head and the client's name checked.

    It also answers the verbs itself, before ASGI: kube-scheduler's POST to a verb's exact path becomes an
    `_Exchange` whose body goes to the `Verb` and whose answer is written in one piece. uvicorn's cycle (a
    scope, a task, receive and send, the head and the body written apart) cost 45 us of CPU a request over TLS,
    a third of a scheduling cycle's HTTP (a kept-alive mTLS connection, server CPU per request: 73 us for a bare
    ASGI app under this protocol, 28 us answered here). Every other request, and a verb request that pipelining,
    `Expect: 100-continue` or the concurrency limit makes special, takes uvicorn's own way to the same `Verb`."""
    by_path = {path.encode(): verb for path, verb in verbs.items()}
    h2_limits = Http2Limits(limits.request_seconds, limits.idle_seconds, limits.max_head_bytes,
                            max((verb.max_body_bytes for verb in verbs.values()), default=0))

    class LimitedProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _h2: Http2Verbs | None = None  # the connection speaks h2 (ALPN): its streams are answered there
        _head_bytes: int | None = None  # bytes of an unfinished head; None while none is unfinished
        _completed = False  # a request ended within the chunk being parsed

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            opened()
            super().connection_made(transport)
            self._arm(limits.idle_seconds, "sent no request")
            if client_names:
                names = certificate_names(transport.get_extra_info("peercert"))
                if not names & client_names:
                    refused("client_name")
                    log.warning("refused a client certificate from %s named %s: not one of --client-name %s",
                                _peer(self.client), ", ".join(sorted(names)) or "(none)",
                                ", ".join(sorted(client_names)))
                    self.app = _forbidden  # every request on this connection: 403, and the connection closes
            tls = transport.get_extra_info("ssl_object")
            if tls is not None and tls.selected_alpn_protocol() == "h2":
                self._disarm()
                self._h2 = Http2Verbs(transport, by_path, h2_limits, refused, _peer(self.client),
                                      forbidden=self.app is _forbidden)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._h2 is not None:
                self._h2.lost()
            if isinstance(self.cycle, _Exchange):
                self.cycle.response_complete = True  # nothing is written for it any more
                self.cycle = None  # type: ignore[assignment]
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            """A head that is still unfinished after a chunk counts the chunk, unless a request ended within it (the
            chunk began with that request's rest, and a pipelined head began after it). A finished head is measured
            whole in on_headers_complete, so neither the chunking nor a body that shares a chunk with it counts."""
            if self._h2 is not None:
                self._h2.received(data)
                return
            self._completed = False
            super().data_received(data)
            if self._head_bytes is not None and not self._completed and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_head_bytes:
                    self._refuse(431, "head_too_large", f"request head over {limits.max_head_bytes} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._arm(limits.request_seconds, f"did not send a whole request within {limits.request_seconds:g} s")

        def on_headers_complete(self) -> None:
            self._head_bytes = None
            if len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers) > limits.max_head_bytes:
                self._refuse(431, "head_too_large", f"request head over {limits.max_head_bytes} bytes")
                return
            verb = self._verb()
            if verb is None:
                super().on_headers_complete()
                return
            keep_alive = self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
            self.cycle = _Exchange(verb, keep_alive)  # type: ignore[assignment]
            declared = declared_over_limit(self.headers, verb.max_body_bytes)
            if declared is not None:
                self._too_large(declared)

        def on_body(self, body: bytes) -> None:
            exchange = self.cycle
            if self.transport.is_closing():
                return  # refused: the rest of the request is not read
            if not isinstance(exchange, _Exchange):
                super().on_body(body)
            elif not exchange.response_complete:
                exchange.size += len(body)
                exchange.chunks.append(body)
                if exchange.size > exchange.verb.max_body_bytes:
                    self._too_large(over_limit(exchange.verb.max_body_bytes))

        def on_message_complete(self) -> None:
            exchange = self.cycle
            self._completed = True
            if self.transport.is_closing():
                pass  # refused: nothing is answered
            elif not isinstance(exchange, _Exchange):
                super().on_message_complete()
            elif not exchange.response_complete:
                body = b"".join(exchange.chunks)
                exchange.chunks.clear()
                answered = exchange.verb.now(body)
                if answered is not None:
                    self._answer(exchange, answered)
                else:
                    exchange.verb.later(body).add_done_callback(partial(self._answer_later, exchange))
            self._head_bytes = None
            self._disarm()  # what follows is the app's time, and then uvicorn's keep-alive timer

        def shutdown(self) -> None:
            if self._h2 is not None:
                self._h2.shutdown()
            else:
                super().shutdown()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._h2 is not None:
                self._h2.writable(False)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._h2 is not None:
                self._h2.writable(True)

        def _verb(self) -> Verb | None:
            """The verb this request goes to here, or None for uvicorn's way (see limited_protocol)."""
            verb = by_path.get(self.url)
            if (verb is None or self.app is _forbidden or self.parser.get_method() != b"POST"
                    or self.expect_100_continue or self.parser.should_upgrade()
                    or (self.cycle is not None and not self.cycle.response_complete)
                    or (self.limit_concurrency is not None and len(self.connections) >= self.limit_concurrency)):
                return None
            return verb

        def _answer_later(self, exchange: _Exchange, done: asyncio.Future[Answered]) -> None:
            if done.cancelled() or done.exception() is not None:  # the verbs never raise: only when the server stops
                if not done.cancelled():
                    log.error("%s gave no answer: %r", exchange.verb.name, done.exception())
                self.transport.close()
                return
            self._answer(exchange, done.result())

        def _answer(self, exchange: _Exchange, answered: Answered) -> None:
            if exchange.response_complete or self.transport.is_closing():
                return  # the client went away
            status, content, elapsed = answered
            exchange.response_started = exchange.response_complete = True
            self.transport.write(_response(status, content, (server_timing(elapsed),),
                                           self.server_state.default_headers, exchange.keep_alive))
            if exchange.keep_alive:
                self.on_response_complete()
            else:
                self.transport.close()

        def _too_large(self, why: str) -> None:
            """413 and close: the rest of the body is never read."""
            exchange = self.cycle
            assert isinstance(exchange, _Exchange)
            exchange.chunks.clear()
            exchange.keep_alive = False
            self._answer(exchange, (413, exchange.verb.refuse_too_large(why), 0.0))

        def _arm(self, seconds: float, what: str) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._refuse, 408, "timeout", what)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _refuse(self, status: int, reason: str, message: str) -> None:
            """Answer `status` if no answer has begun, and close: the client holds nothing here any longer."""
            self._disarm()
            if self.transport.is_closing():
                return
            refused(reason)
            log.warning("closed the connection from %s: %s", _peer(self.client), message)
            if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
                text = message.encode()
                self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                                     b"connection: close\r\n\r\n%s" % (status, _STATUS[status], len(text), text))
            self.transport.close()

    return LimitedProtocol


class _Exchange:
    """A verb request that LimitedProtocol answers itself. It stands where uvicorn keeps its cycle, so it has the
    fields uvicorn reads there (`response_complete`, `response_started`, `keep_alive`)."""

    __slots__ = ("chunks", "keep_alive", "response_complete", "response_started", "size", "verb")

    def __init__(self, verb: Verb, keep_alive: bool) -> None:
        self.verb = verb
        self.keep_alive = keep_alive
        self.chunks: list[bytes] = []
        self.size = 0
        self.response_started = False
        self.response_complete = False


def _response(status: int, content: bytes, headers: Iterable[tuple[bytes, bytes]],
              default_headers: Iterable[tuple[bytes, bytes]], keep_alive: bool) -> bytes:
    """A whole HTTP/1.1 answer, head and body, written at once: uvicorn's default headers (server, date), then
    a verb's."""
    parts = [STATUS_LINE[status]]
    for name, value in (*default_headers, *answer_headers(content, *headers),
                        *(() if keep_alive else ((b"connection", b"close"),))):
        parts += (name, b": ", value, b"\r\n")
    parts += (b"\r\n", content)
    return b"".join(parts)


_STATUS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


async def _forbidden(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    body = b"client certificate name not allowed by --client-name"
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body)),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _peer(client: Iterable[Any] | None) -> str:
    return ":".join(map(str, client)) if client else "an unknown peer"
