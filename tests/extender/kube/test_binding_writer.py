"""The API writer bind posts through: one kept-alive connection, a closed one never used or retried only when no
answer began, bounded answers, the client configuration's TLS (real certificates, made with openssl), and the
client's own pool where a proxy stands between."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httptools
import pytest
from helpers.kube_api_server import kube_server_fixture, make_pod
from kubernetes import client as k8s
from helpers.pki import pki

from extender.kube.binding_writer import MAX_ANSWER_BYTES, AnswerError, ApiWriter, StaleConnection, endpoint_of
from extender.kube.client import KubernetesApi

__all__ = ["kube_server_fixture", "pki"]  # the `kube_server` fixture, and the certificates of helpers.pki

WAIT = 10.0  # only a bound for a failing test

OK = b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"

# What the scripted server does with the n-th request (from 0) of its m-th connection (from 0): the bytes to send
# back, and whether to close the connection after them.
Script = Callable[[int, int], tuple[bytes, bool]]


class _Request:
    def __init__(self) -> None:
        self.url = b""
        self.headers: dict[bytes, bytes] = {}
        self.body = b""
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True


class ScriptedServer:
    """A loopback HTTP/1.1 server answering each request as `script` says; it records what it received."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script, self.tls = script, tls
        self.requests: list[tuple[int, _Request]] = []  # (connection number, request)
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            number, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._connection, args=(raw, number), daemon=True).start()

    def _connection(self, raw: socket.socket, number: int) -> None:
        try:
            connection = self.tls.wrap_socket(raw, server_side=True) if self.tls else raw
        except (OSError, ssl.SSLError):
            raw.close()
            return
        with connection:
            for index in range(100):
                request = _Request()
                parser = httptools.HttpRequestParser(request)
                while not request.complete:
                    data = connection.recv(65536)
                    if not data:
                        return
                    parser.feed_data(data)
                self.requests.append((number, request))
                answer, close = self.script(number, index)
                connection.sendall(answer)
                if close:
                    return

    def close(self) -> None:
        self.listener.close()


@contextmanager
def scripted(script: Script, tls: ssl.SSLContext | None = None) -> Iterator[ScriptedServer]:
    server = ScriptedServer(script, tls)
    try:
        yield server
    finally:
        server.close()


def _writer(port: int, prefix: str = "") -> ApiWriter:
    return ApiWriter(endpoint_of(k8s.Configuration(host=f"http://127.0.0.1:{port}{prefix}")))


def test_posts_share_one_kept_alive_connection_and_carry_what_they_were_given() -> None:
    with scripted(lambda connection, index: (OK, False)) as server:
        writer = _writer(server.port, "/prefix/")
        for number in range(3):
            status, body = writer.post("/api/v1/x", b'{"n":%d}' % number, {"Authorization": "Bearer t"}, WAIT)
            assert (status, body) == (201, b"{}")
    assert server.connections == 1
    assert [request.body for _, request in server.requests] == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
    first = server.requests[0][1]
    assert first.url == b"/prefix/api/v1/x"
    assert first.headers[b"host"] == b"127.0.0.1:%d" % server.port
    assert first.headers[b"authorization"] == b"Bearer t"


def test_a_connection_the_server_closed_while_idle_is_not_used_again() -> None:
    """The server drops each connection after its answer without saying so (an idle timeout)."""
    with scripted(lambda connection, index: (OK, True)) as server:
        writer = _writer(server.port)
        for _ in range(3):
            assert writer.post("/a", b"{}", {}, WAIT)[0] == 201
    assert server.connections == 3
    assert len(server.requests) == 3, "no request was sent twice"


def test_a_kept_alive_connection_that_ends_before_its_answer_is_tried_once_more_on_a_new_one() -> None:
    def script(connection: int, index: int) -> tuple[bytes, bool]:
        if connection == 0 and index == 1:
            return b"", True  # read the second request, then close without a byte of answer
        return OK, False

    with scripted(script) as server:
        writer = _writer(server.port)
        assert writer.post("/a", b"1", {}, WAIT)[0] == 201
        assert writer.post("/a", b"2", {}, WAIT)[0] == 201
    assert [(connection, request.body) for connection, request in server.requests] == [(0, b"1"), (0, b"2"), (1, b"2")]


def test_a_new_connection_that_ends_before_its_answer_is_not_retried() -> None:
    with scripted(lambda connection, index: (b"", True)) as server, pytest.raises(AnswerError):
        _writer(server.port).post("/a", b"{}", {}, WAIT)
    assert len(server.requests) == 1


@pytest.mark.parametrize(("answer", "message"), [
    (b"HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n{}", "closed the connection within its answer"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", "not HTTP"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_ANSWER_BYTES + 1) + b"x" * (MAX_ANSWER_BYTES + 1),
     f"over {MAX_ANSWER_BYTES} bytes"),
])
def test_an_answer_cut_short_not_http_or_too_large_is_an_error(answer: bytes, message: str) -> None:
    with scripted(lambda connection, index: (answer, True)) as server, pytest.raises(AnswerError, match=message):
        _writer(server.port).post("/a", b"{}", {}, WAIT)


def test_a_server_that_never_answers_times_out() -> None:
    with scripted(lambda connection, index: (b"", False)) as server, pytest.raises(TimeoutError):
        _writer(server.port).post("/a", b"{}", {}, 0.3)


def test_mutual_tls_as_the_client_configuration_says(pki: Path) -> None:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    tls.load_cert_chain(pki / "server.crt", pki / "server.key")
    tls.verify_mode = ssl.CERT_REQUIRED
    with scripted(lambda connection, index: (OK, False), tls) as server:
        configuration = k8s.Configuration(host=f"https://127.0.0.1:{server.port}")
        configuration.ssl_ca_cert = str(pki / "ca.crt")
        configuration.cert_file = str(pki / "kube-scheduler.crt")
        configuration.key_file = str(pki / "kube-scheduler.key")
        writer = ApiWriter(endpoint_of(configuration))
        assert writer.post("/a", b"{}", {}, WAIT) == (201, b"{}")
        assert writer.post("/a", b"{}", {}, WAIT) == (201, b"{}")
        assert server.connections == 1
        configuration.cert_file = configuration.key_file = None  # no client certificate: the server refuses
        with pytest.raises(OSError):
            ApiWriter(endpoint_of(configuration)).post("/a", b"{}", {}, WAIT)
        unknown = k8s.Configuration(host=f"https://127.0.0.1:{server.port}")  # the system CAs: not ours
        with pytest.raises(ssl.SSLCertVerificationError):
            ApiWriter(endpoint_of(unknown)).post("/a", b"{}", {}, WAIT)


def _soon(writer: ApiWriter, body: bytes, timeout: float = WAIT) -> tuple[int, bytes] | None:
    """post_soon on an event loop of its own: its answer, or None when it had no idle connection."""
    async def post() -> tuple[int, bytes] | None:
        posted = writer.post_soon("/a", body, {}, timeout)
        return None if posted is None else await posted
    return asyncio.run(post())


def test_post_soon_needs_an_idle_connection_and_keeps_it() -> None:
    with scripted(lambda connection, index: (OK, False)) as server:
        writer = _writer(server.port)
        assert _soon(writer, b"0") is None, "no idle connection: nothing sent"
        assert writer.post("/a", b"1", {}, WAIT) == (201, b"{}")
        assert _soon(writer, b"2") == (201, b"{}")
        assert _soon(writer, b"3") == (201, b"{}")
        assert writer.post("/a", b"4", {}, WAIT) == (201, b"{}")
    assert [(connection, request.body) for connection, request in server.requests] == [
        (0, b"1"), (0, b"2"), (0, b"3"), (0, b"4")]


def test_post_soon_on_a_connection_closed_as_the_request_crossed_says_post_again() -> None:
    def script(connection: int, index: int) -> tuple[bytes, bool]:
        return (b"", True) if index == 1 else (OK, False)

    with scripted(script) as server:
        writer = _writer(server.port)
        writer.post("/a", b"1", {}, WAIT)
        with pytest.raises(StaleConnection):
            _soon(writer, b"2")
        assert _soon(writer, b"3") is None, "the closed connection was not kept"


@pytest.mark.parametrize(("answer", "error", "message"), [
    (b"HTTP/1.1 201 Created\r\nContent-Length: 10\r\n\r\n{}", AnswerError, "closed the connection within its answer"),
    (b"SSH-2.0-OpenSSH_9.6\r\n", AnswerError, "not HTTP"),
    (b"", TimeoutError, "did not answer in time"),
])
def test_post_soon_refuses_what_post_refuses(answer: bytes, error: type[Exception], message: str) -> None:
    def script(connection: int, index: int) -> tuple[bytes, bool]:
        return (OK, False) if index == 0 else (answer, bool(answer))

    with scripted(script) as server:
        writer = _writer(server.port)
        writer.post("/a", b"1", {}, WAIT)
        with pytest.raises(error, match=message):
            _soon(writer, b"2", timeout=0.3)
        assert _soon(writer, b"3") is None, "a connection that failed is not kept"


def test_post_soon_over_mutual_tls(pki: Path) -> None:
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(pki / "ca.crt"))
    tls.load_cert_chain(pki / "server.crt", pki / "server.key")
    tls.verify_mode = ssl.CERT_REQUIRED
    large = b"HTTP/1.1 201 Created\r\nContent-Length: 100000\r\n\r\n" + b"x" * 100_000  # several TLS records
    with scripted(lambda connection, index: (OK if index == 0 else large, False), tls) as server:
        configuration = k8s.Configuration(host=f"https://127.0.0.1:{server.port}")
        configuration.ssl_ca_cert = str(pki / "ca.crt")
        configuration.cert_file = str(pki / "kube-scheduler.crt")
        configuration.key_file = str(pki / "kube-scheduler.key")
        writer = ApiWriter(endpoint_of(configuration))
        writer.post("/a", b"{}", {}, WAIT)
        body = b"y" * 300_000  # more than one write of the socket takes at once
        assert _soon(writer, body) == (201, b"x" * 100_000)
        assert writer.post("/a", b"{}", {}, WAIT) == (201, b"x" * 100_000)
    assert server.connections == 1
    assert [len(request.body) for _, request in server.requests] == [2, 300_000, 2]


def test_the_endpoint_reads_the_configuration() -> None:
    configuration = k8s.Configuration(host="https://10.0.0.1:6443/k8s/clusters/c-1/")
    configuration.verify_ssl = False
    endpoint = endpoint_of(configuration)
    assert (endpoint.host, endpoint.port, endpoint.prefix) == ("10.0.0.1", 6443, "/k8s/clusters/c-1")
    assert endpoint.tls is not None and endpoint.tls.verify_mode == ssl.CERT_NONE
    named = k8s.Configuration(host="https://api.example")
    named.tls_server_name = "kubernetes.default.svc"
    endpoint = endpoint_of(named)
    assert (endpoint.port, endpoint.server_hostname) == (443, "kubernetes.default.svc")
    with pytest.raises(ValueError, match="is not an http"):
        endpoint_of(k8s.Configuration(host="unix:///var/run/k8s.sock"))


def test_through_a_proxy_bind_keeps_the_clients_own_pool(kube_server) -> None:
    """A configured proxy is not spoken by the writer: the client's ProxyManager carries the Binding."""
    configuration = k8s.Configuration(host="http://kubernetes.invalid")
    configuration.proxy = kube_server.url  # the fake API server reads the absolute URI a proxy would get
    uid = kube_server.add_pod(make_pod("train"))["metadata"]["uid"]
    KubernetesApi.from_configuration(configuration).bind("default", "train", uid, "gpu-a", {})
    assert kube_server.pod("default", "train")["spec"]["nodeName"] == "gpu-a"
