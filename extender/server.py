"""The HTTP server around the app: uvicorn with limits on what one connection may hold, and client pinning.

uvicorn bounds a body in flight (it stops reading past 64 KiB unread) and idle time between requests
(`timeout_keep_alive`), but not a request that arrives slowly, a head without end, or a connection that never
sends a byte. `LimitedProtocol` adds those, and with `--client-name` it answers 403 to a client certificate
of another name before any route runs. Each refusal is a log line and a count in
`gpu_topology_extender_requests_refused_total{verb="connection"}`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from extender.app import create_app
from extender.service import ExtenderService

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

    def __post_init__(self) -> None:
        """TLS options that only work together, checked as the options are made: before the CLI starts anything."""
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.client_ca and not self.tls_cert:
            raise ValueError("--client-ca needs --tls-cert and --tls-key")
        if self.client_names and not self.client_ca:
            raise ValueError("--client-name needs --client-ca: without client certificates there is no name to check")


def server_config(service: ExtenderService, options: ServeOptions) -> uvicorn.Config:
    refused = service.metrics.requests_refused
    protocol = limited_protocol(options.limits, frozenset(options.client_names),
                                lambda reason: refused.labels("connection", reason).inc(),
                                service.metrics.connections.inc)
    # No access log: kube-scheduler calls several times per pod; the metrics count and time every verb.
    # The event loop by measurement (a 20 KB request and its answer on a keep-alive connection, server CPU per
    # request): over TLS, asyncio's 90 us against uvloop's 140 us, as uvloop's TLS layer costs more than the
    # standard library's; in plain HTTP, uvloop's 65 us against asyncio's 75 to 110 us.
    config = uvicorn.Config(create_app(service), host=options.host, port=options.port, log_level=options.log_level,
                            loop="asyncio" if options.tls_cert else "uvloop",
                            access_log=False, http=protocol, limit_concurrency=options.limits.max_connections,
                            timeout_keep_alive=int(options.limits.idle_seconds),
                            ssl_certfile=options.tls_cert, ssl_keyfile=options.tls_key, ssl_ca_certs=options.client_ca,
                            ssl_cert_reqs=ssl.CERT_REQUIRED if options.client_ca else ssl.CERT_NONE)
    config.load()
    if config.ssl is not None:
        # No TLS 1.3 session tickets: kube-scheduler's client keeps no session cache, so it never resumes, and
        # it opens a connection whenever more than 2 requests overlap (Go keeps 2 idle per host): each full
        # handshake cost 1.3 to 1.5 ms of CPU here without tickets against 1.6 to 1.7 ms with OpenSSL's default two.
        config.ssl.num_tickets = 0
    return config


def serve(service: ExtenderService, options: ServeOptions) -> None:
    uvicorn.Server(server_config(service, options)).run()


def certificate_names(peercert: dict[str, Any] | None) -> set[str]:
    """The subject CNs and DNS SANs of a certificate as `SSLSocket.getpeercert()` gives it."""
    if not peercert:
        return set()
    names = {value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"}
    names.update(value for kind, value in peercert.get("subjectAltName", ()) if kind == "DNS")
    return names


def limited_protocol(limits: Limits, client_names: frozenset[str], refused: Callable[[str], None],
                     opened: Callable[[], None]) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a deadline per request, a bounded head and the client's name checked."""

    class LimitedProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _head_bytes: int | None = 0  # bytes of an unfinished head; None while a body arrives

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            opened()
            super().connection_made(transport)
            self._arm(limits.idle_seconds, "sent no request")
            if client_names:
                names = certificate_names(transport.get_extra_info("peercert"))
                if not names & client_names:
                    refused("client_name")
                    log.warning("refused a client certificate from %s named %s: not one of --client-name %s",
                                _peer(self.client), ", ".join(sorted(names)) or "(none)", ", ".join(sorted(client_names)))
                    self.app = _forbidden  # every request on this connection: 403, and the connection closes

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            in_head = self._head_bytes is not None
            super().data_received(data)
            # Counted only while a head is unfinished before and after: a chunk that also carries body is not.
            if in_head and self._head_bytes is not None and not self.transport.is_closing():
                self._head_bytes += len(data)
                if self._head_bytes > limits.max_head_bytes:
                    self._refuse(431, "head_too_large", f"request head over {limits.max_head_bytes} bytes")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._arm(limits.request_seconds, f"did not send a whole request within {limits.request_seconds:g} s")

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._head_bytes = None

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_bytes = 0
            self._disarm()  # what follows is the app's time, and then uvicorn's keep-alive timer

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
            if self.cycle is None or not self.cycle.response_started:
                text = message.encode()
                self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n"
                                     b"connection: close\r\n\r\n%s" % (status, _STATUS[status], len(text), text))
            self.transport.close()

    return LimitedProtocol


_STATUS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


async def _forbidden(scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
    body = b"client certificate name not allowed by --client-name"
    await send({"type": "http.response.start", "status": 403,
                "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body)),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def _peer(client: Iterable[Any] | None) -> str:
    return ":".join(map(str, client)) if client else "an unknown peer"
