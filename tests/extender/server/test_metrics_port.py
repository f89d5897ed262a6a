"""--metrics-port: a second listener serves GET /metrics, /healthz and /readyz alone, over TLS with the serving
certificate but asking no client certificate, so a scraper that cannot bind scrapes without one; no verb is there,
and the main port still pins its clients by name. Real certificates, made with openssl."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import orjson
import pytest

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server.serve import ServeOptions
from extender.verbs.service import ExtenderService
from helpers.extender_server import listening
from helpers.pki import pki

__all__ = ["pki"]  # the fixture: the CA and the certificates, made with openssl

BIND = orjson.dumps({"PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": "n1"})
FILTER = orjson.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n1"]})


def _ask(port: int, method: bytes, path: bytes, body: bytes = b"", tls: ssl.SSLContext | None = None) -> bytes:
    request = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (
        method, path, len(body), body)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with tls.wrap_socket(raw, server_hostname="127.0.0.1") if tls else raw as connection:
            connection.sendall(request)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
    return answer


def _client(pki: Path, certificate: str | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if certificate is not None:
        context.load_cert_chain(pki / f"{certificate}.crt", pki / f"{certificate}.key")
    return context


def _service() -> tuple[ExtenderService, list[str]]:
    state = ClusterState()
    service = ExtenderService(state, DemoCluster(state, (("n1", "dgx-h100"),)))
    called: list[str] = []
    for verb in ("filter", "prioritize", "bind", "bind_soon", "preempt"):
        real = getattr(service, verb)
        setattr(service, verb, lambda *args, real=real, verb=verb, **kwargs: called.append(verb) or real(*args,
                                                                                                          **kwargs))
    return service, called


def test_a_client_without_a_certificate_scrapes_and_reaches_no_verb(pki: Path) -> None:
    service, called = _service()
    options = ServeOptions(tls_cert=str(pki / "server.crt"), tls_key=str(pki / "server.key"),
                           client_ca=str(pki / "ca.crt"), client_names=("kube-scheduler",), metrics_port=1)
    anonymous = _client(pki)
    with listening(service, options) as served:
        assert served.metrics_port is not None
        scraped = _ask(served.metrics_port, b"GET", b"/metrics", tls=anonymous)
        assert scraped.startswith(b"HTTP/1.1 200 ") and b"gpu_topology_extender_build_info{" in scraped
        assert _ask(served.metrics_port, b"GET", b"/healthz", tls=anonymous).startswith(b"HTTP/1.1 200 ")
        ready = _ask(served.port, b"GET", b"/readyz", tls=_client(pki, "kube-scheduler")).split(b"\r\n")[0]
        assert _ask(served.metrics_port, b"GET", b"/readyz", tls=anonymous).split(b"\r\n")[0] == ready
        for method, path, body in ((b"POST", b"/bind", BIND), (b"POST", b"/filter", FILTER),
                                   (b"POST", b"/prioritize", FILTER), (b"POST", b"/preempt", b"{}"),
                                   (b"POST", b"/admission/pods", b"{}"), (b"GET", b"/bind", b""),
                                   (b"POST", b"/metrics", b"")):
            assert _ask(served.metrics_port, method, path, body, tls=anonymous).startswith(b"HTTP/1.1 404 "), path
        assert called == []
        # The main port: no certificate, no handshake; a certificate of another name, 403 on every path.
        try:  # TLS 1.3: the client's side of the handshake ends before the server refuses it
            assert _ask(served.port, b"GET", b"/metrics", tls=anonymous) == b""
        except (ssl.SSLError, ConnectionError):
            pass
        assert _ask(served.port, b"GET", b"/metrics", tls=_client(pki, "intruder")).startswith(b"HTTP/1.1 403 ")
        assert _ask(served.port, b"POST", b"/bind", BIND, tls=_client(pki, "intruder")).startswith(b"HTTP/1.1 403 ")
        assert called == []
        assert _ask(served.port, b"POST", b"/filter", FILTER, tls=_client(pki, "kube-scheduler")).startswith(
            b"HTTP/1.1 200 ")
        assert called == ["filter"]


def test_without_tls_the_metrics_port_is_plain_http_and_has_no_verb() -> None:
    service, called = _service()
    with listening(service, ServeOptions(metrics_port=1)) as served:
        assert served.metrics_port is not None
        assert _ask(served.metrics_port, b"GET", b"/metrics").startswith(b"HTTP/1.1 200 ")
        assert _ask(served.metrics_port, b"POST", b"/bind", BIND).startswith(b"HTTP/1.1 404 ")
        assert _ask(served.port, b"POST", b"/filter", FILTER).startswith(b"HTTP/1.1 200 ")
    assert called == ["filter"]


@pytest.mark.parametrize("port", [0, 65536, 8888])
def test_a_metrics_port_that_is_no_port_or_the_main_one_is_refused(port: int) -> None:
    with pytest.raises(ValueError, match="--metrics-port must be a port"):
        ServeOptions(port=8888, metrics_port=port)
