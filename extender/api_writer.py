"""POSTs to the API server on kept-alive connections, written and read without the client library's machinery.

bind posts one Binding per pod, the extender's busiest write. Through the client's urllib3 and http.client a
small POST over TLS cost 200 us of CPU; written as one buffer on a kept-alive socket and read back with
httptools (uvicorn's parser, a dependency already), 34 us (measured side by side against one local TLS server).

It honours what the client's `Configuration` says of the server: address and path prefix, CA, client
certificate, certificate checks and server name. Credentials come from the caller per request, so a rotated
token is used as soon as the configuration has it. A proxy is not spoken here (`KubernetesApi` keeps the
client's own pool for that).

Connections are pooled idle, used by one thread at a time. One the server has closed while idle is found
readable and dropped before use; a kept-alive connection that ends before any byte of an answer is tried once
more on a new one, which is safe for a Binding: if the first one did commit, the second is refused with 409.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httptools

MAX_ANSWER_BYTES = 1 << 20  # a Status or a Binding's answer is under 2 KB; past this the answer is refused
MAX_IDLE = 16  # idle connections kept, as many as binds run at once (extender/app.py BIND_THREADS)


class AnswerError(OSError):
    """The server's answer could not be read: cut short, not HTTP, or too large."""


class _Closed(Exception):
    """A kept-alive connection ended before any byte of the answer."""


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to reach the API server, from the client's `Configuration`."""

    host: str
    port: int
    prefix: str  # a path the configured host carries (a proxying front end), without the trailing slash
    tls: ssl.SSLContext | None
    server_hostname: str | None


def endpoint_of(configuration: Any) -> Endpoint:
    """The endpoint a kubernetes-client `Configuration` describes (the fields the client's own pool reads; those
    with a default here are missing from some client releases)."""
    url = urlsplit(configuration.host)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(f"API server address {configuration.host!r} is not an http(s) URL")
    port = url.port or (443 if url.scheme == "https" else 80)
    if url.scheme == "http":
        return Endpoint(url.hostname, port, url.path.rstrip("/"), None, None)
    context = ssl.create_default_context(cafile=configuration.ssl_ca_cert,
                                         cadata=getattr(configuration, "ca_cert_data", None))
    if configuration.cert_file:
        context.load_cert_chain(configuration.cert_file, configuration.key_file)
    if not configuration.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif getattr(configuration, "assert_hostname", None) is False:
        context.check_hostname = False
    context.set_alpn_protocols(["http/1.1"])
    return Endpoint(url.hostname, port, url.path.rstrip("/"), context,
                    getattr(configuration, "tls_server_name", None) or url.hostname)


class _Answer:
    """httptools' callbacks: the body, bounded, whether the connection may be kept, and whether it is complete."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.body = bytearray()
        self.keep_alive = False
        self.complete = False
        self.problem = ""

    def on_headers_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()  # known only while the head is current

    def on_body(self, chunk: bytes) -> None:
        self.body += chunk
        if len(self.body) > MAX_ANSWER_BYTES:
            self.problem = f"the API server's answer is over {MAX_ANSWER_BYTES} bytes"
            raise AnswerError(self.problem)

    def on_message_complete(self) -> None:
        self.complete = True


class ApiWriter:
    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._host = endpoint.host if endpoint.port in (80, 443) else f"{endpoint.host}:{endpoint.port}"

    def post(self, path: str, body: bytes, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
        """(status, body) of one POST; OSError (socket.timeout among them) or AnswerError when no answer came."""
        head = [f"POST {self._endpoint.prefix}{path} HTTP/1.1", f"Host: {self._host}",
                f"Content-Length: {len(body)}", *(f"{name}: {value}" for name, value in headers.items())]
        request = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        connection = self._take()
        if connection is not None:
            try:
                return self._exchange(connection, request, timeout, reused=True)
            except _Closed:
                pass  # closed by the server before it answered: the request was not taken (see the docstring)
        return self._exchange(self._connect(timeout), request, timeout, reused=False)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _exchange(self, connection: socket.socket, request: bytes, timeout: float,
                  reused: bool) -> tuple[int, bytes]:
        answer = _Answer()
        received = False
        try:
            connection.settimeout(timeout)
            connection.sendall(request)
            while not answer.complete:
                data = connection.recv(65536)
                if not data:
                    if received:
                        raise AnswerError("the API server closed the connection within its answer")
                    if reused:
                        raise _Closed
                    raise AnswerError("the API server closed the connection without answering")
                received = True
                answer.parser.feed_data(data)
        except httptools.HttpParserError as error:
            connection.close()
            raise AnswerError(answer.problem or f"the API server's answer is not HTTP: {error}") from None
        except (ConnectionResetError, BrokenPipeError):
            connection.close()
            if reused and not received:
                raise _Closed from None  # its close crossed our request: a reset instead of an end
            raise
        except BaseException:
            connection.close()
            raise
        if answer.keep_alive:
            self._keep(connection)
        else:
            connection.close()
        return answer.parser.get_status_code(), bytes(answer.body)

    def _connect(self, timeout: float) -> socket.socket:
        endpoint = self._endpoint
        connection = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if endpoint.tls is None:
            return connection
        try:
            return endpoint.tls.wrap_socket(connection, server_hostname=endpoint.server_hostname)
        except BaseException:
            connection.close()
            raise

    def _take(self) -> socket.socket | None:
        """An idle connection the server has not closed (an idle one that reads as ready has: it is dropped)."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                connection = self._idle.pop()
            if not select.select([connection], [], [], 0)[0]:
                return connection
            connection.close()

    def _keep(self, connection: socket.socket) -> None:
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(connection)
                return
        connection.close()

