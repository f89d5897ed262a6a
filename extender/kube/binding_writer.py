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

`post_soon` sends the same POST from the event loop on an idle connection and reads its answer as the socket
turns readable, so no thread waits on the API server and nothing hops between threads (extender/server/app.py says
what that saves). A new connection (its connect and handshake block) is left to `post`, on a thread.
"""

from __future__ import annotations

import asyncio
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
# Idle connections kept, as many as binds run on threads at once (extender/server/app.py BIND_THREADS). A POST from the
# event loop takes one of them, so those in flight are bounded by it too.
MAX_IDLE = 16


class AnswerError(OSError):
    """The server's answer could not be read: cut short, not HTTP, or too large."""


class StaleConnection(Exception):
    """A kept-alive connection ended before any byte of the answer: the server closed it as the request crossed,
    so POSTing again on a new connection is safe (see the module docstring)."""


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

    def not_http(self, error: httptools.HttpParserError) -> AnswerError:
        return AnswerError(self.problem or f"the API server's answer is not HTTP: {error}")


def _ended(received: bool, reused: bool) -> Exception:
    """What a connection that ended before its answer was whole means (the module docstring says why a kept-alive
    one that ended before any byte is stale)."""
    if received:
        return AnswerError("the API server closed the connection within its answer")
    if reused:
        return StaleConnection()
    return AnswerError("the API server closed the connection without answering")


class ApiWriter:
    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._host = endpoint.host if endpoint.port in (80, 443) else f"{endpoint.host}:{endpoint.port}"

    def post(self, path: str, body: bytes, headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
        """(status, body) of one POST; OSError (socket.timeout among them) or AnswerError when no answer came."""
        request = self._request(path, body, headers)
        connection = self._take()
        if connection is not None:
            try:
                return self._exchange(connection, request, timeout, reused=True)
            except StaleConnection:
                pass  # closed by the server before it answered: the request was not taken (see the docstring)
        return self._exchange(self._connect(timeout), request, timeout, reused=False)

    def post_soon(self, path: str, body: bytes, headers: Mapping[str, str],
                  timeout: float) -> asyncio.Future[tuple[int, bytes]] | None:
        """`post` answered on the running event loop, on an idle connection; None when none is idle. The future
        fails as `post` raises, and with StaleConnection where `post` would try a new connection."""
        connection = self._take()
        if connection is None:
            return None
        return _Soon(self, connection, self._request(path, body, headers), timeout).future

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    def _request(self, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        head = [f"POST {self._endpoint.prefix}{path} HTTP/1.1", f"Host: {self._host}",
                f"Content-Length: {len(body)}", *(f"{name}: {value}" for name, value in headers.items())]
        return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body

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
                    raise _ended(received, reused)
                received = True
                answer.parser.feed_data(data)
        except httptools.HttpParserError as error:
            connection.close()
            raise answer.not_http(error) from None
        except (ConnectionResetError, BrokenPipeError):
            connection.close()
            if reused and not received:
                raise StaleConnection from None  # its close crossed our request: a reset instead of an end
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


class _Soon:
    """One POST on an idle connection, written and read by the event loop as the socket allows."""

    def __init__(self, writer: ApiWriter, connection: socket.socket, request: bytes, timeout: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.future: asyncio.Future[tuple[int, bytes]] = self._loop.create_future()
        self._writer, self._connection = writer, connection
        self._fd = connection.fileno()
        self._unsent = memoryview(request)
        self._answer = _Answer()
        self._received = False
        self._timer = self._loop.call_later(timeout, self._fail, TimeoutError("the API server did not answer in time"))
        self.future.add_done_callback(self._on_done)
        connection.setblocking(False)
        self._write()

    def _write(self) -> None:
        self._quiet()
        try:
            # An SSL write that could not finish is retried with the same bytes (OpenSSL's rule); a whole one
            # returns their length.
            self._unsent = self._unsent[self._connection.send(self._unsent):]
        except (BlockingIOError, ssl.SSLWantWriteError):
            pass
        except ssl.SSLWantReadError:  # TLS needs the peer's bytes first (a key update)
            self._loop.add_reader(self._fd, self._write)
            return
        except OSError as error:
            self._fail(StaleConnection() if isinstance(error, ConnectionResetError | BrokenPipeError) else error)
            return
        if self._unsent:
            self._loop.add_writer(self._fd, self._write)
        else:
            self._loop.add_reader(self._fd, self._read)

    def _read(self) -> None:
        answer = self._answer
        self._quiet()
        try:
            while not answer.complete:  # until the socket, and TLS's own buffer, are drained
                data = self._connection.recv(65536)
                if not data:
                    self._fail(_ended(self._received, reused=True))
                    return
                self._received = True
                answer.parser.feed_data(data)
        except (BlockingIOError, ssl.SSLWantReadError):
            self._loop.add_reader(self._fd, self._read)
            return
        except ssl.SSLWantWriteError:  # TLS must send first (a key update)
            self._loop.add_writer(self._fd, self._read)
            return
        except httptools.HttpParserError as error:
            self._fail(answer.not_http(error))
            return
        except (ConnectionResetError, BrokenPipeError) as error:
            self._fail(error if self._received else StaleConnection())
            return
        except OSError as error:
            self._fail(error)
            return
        self._timer.cancel()
        if answer.keep_alive:
            self._writer._keep(self._connection)
        else:
            self._connection.close()
        if not self.future.done():
            self.future.set_result((answer.parser.get_status_code(), bytes(answer.body)))

    def _fail(self, error: BaseException) -> None:
        self._stop()
        self._connection.close()
        if not self.future.done():
            self.future.set_exception(error)

    def _stop(self) -> None:
        self._timer.cancel()
        self._quiet()

    def _quiet(self) -> None:
        """No callback left on the socket; each step adds the one it waits for."""
        self._loop.remove_reader(self._fd)
        self._loop.remove_writer(self._fd)

    def _on_done(self, future: asyncio.Future[tuple[int, bytes]]) -> None:
        """Cancelled (the server stops): the connection is in an unknown state, so it is closed."""
        if future.cancelled():
            self._stop()
            self._connection.close()
