"""--client-name: with mTLS, only certificates of the pinned names reach the extender; any other certificate from
the same CA gets 403 before a route runs, with a log line and a count. Real certificates, made with openssl."""

from __future__ import annotations

import socket
import ssl
from pathlib import Path

import orjson
import pytest

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server.serve import ServeOptions, certificate_names
from extender.verbs.service import ExtenderService
from helpers.extender_server import running_server
from helpers.pki import pki

__all__ = ["pki"]  # the fixture: the CA and the certificates, made with openssl

PINNED = ("kube-scheduler", "gpu-topology-extender.gpu-topology-system.svc")


def _get(port: int, pki: Path, client: str, path: str, body: bytes | None = None) -> bytes:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    context.load_cert_chain(pki / f"{client}.crt", pki / f"{client}.key")
    method = b"POST" if body is not None else b"GET"
    request = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" % (method, path.encode())
    if body is not None:
        request += b"Content-Length: %d\r\n" % len(body)
    request += b"\r\n" + (body or b"")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
            connection.sendall(request)
            answer = b""
            while chunk := connection.recv(65536):
                answer += chunk
    return answer


def _serve_pinned(pki: Path, service: ExtenderService, names: tuple[str, ...] = PINNED):
    return running_server(service, ServeOptions(tls_cert=str(pki / "server.crt"), tls_key=str(pki / "server.key"),
                                                client_ca=str(pki / "ca.crt"), client_names=names))


def test_only_pinned_names_reach_the_verbs(pki: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = ClusterState()
    service = ExtenderService(state, DemoCluster(state, (("n1", "dgx-h100"),)))
    called: list[str] = []
    real_filter = service.filter
    service.filter = (  # type: ignore[method-assign]
        lambda args, compute=True: called.append("filter") or real_filter(args, compute))
    body = orjson.dumps({"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n1"]})
    with _serve_pinned(pki, service) as port:
        for client in ("kube-scheduler", "by-san"):
            assert _get(port, pki, client, "/filter", body).startswith(b"HTTP/1.1 200 ")
        assert called == ["filter", "filter"]
        refused = _get(port, pki, "intruder", "/filter", body)
        assert refused.startswith(b"HTTP/1.1 403 ") and refused.endswith(b"not allowed by --client-name")
        assert called == ["filter", "filter"], "the refused client never reached a verb"
    assert any("refused a client certificate" in message and "named intruder, kube-scheduler.example" in message
               for message in caplog.messages)
    assert service.metrics.registry.get_sample_value(
        "gpu_topology_extender_requests_refused_total", {"verb": "connection", "reason": "client_name"}) == 1.0


def test_without_pinning_any_certificate_of_the_ca_is_served(pki: Path) -> None:
    state = ClusterState()
    with _serve_pinned(pki, ExtenderService(state, DemoCluster(state, (("n1", "dgx-h100"),))), names=()) as port:
        assert _get(port, pki, "intruder", "/healthz").startswith(b"HTTP/1.1 200 ")


def test_a_name_without_client_certificates_is_refused_at_start() -> None:
    state = ClusterState()
    with pytest.raises(ValueError, match="--client-name needs --client-ca"):
        with running_server(ExtenderService(state, DemoCluster(state, ())), ServeOptions(client_names=PINNED)):
            pass


def test_names_are_read_from_the_subject_and_dns_sans() -> None:
    peercert = {"subject": ((("organizationName", "system:masters"),), (("commonName", "kube-scheduler"),)),
                "subjectAltName": (("DNS", "a.example"), ("IP Address", "10.0.0.1"))}
    assert certificate_names(peercert) == {"kube-scheduler", "a.example"}
    assert certificate_names(None) == set()


def test_no_session_tickets_are_issued(pki: Path) -> None:
    """kube-scheduler never resumes a session: the server spends nothing on tickets it would never see again."""
    state = ClusterState()
    with _serve_pinned(pki, ExtenderService(state, DemoCluster(state, (("n1", "dgx-h100"),)))) as port:
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(pki / "kube-scheduler.crt", pki / "kube-scheduler.key")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as raw, \
                context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            while connection.recv(65536):
                pass
            assert connection.version() == "TLSv1.3"
            assert connection.session is not None and not connection.session.has_ticket
