"""The serving certificate and the client CA are taken up again when a Secret volume's files change, without a
restart: new handshakes on both ports get the new certificate; a bad new file keeps the one in use, logged and
counted; the expiry metric follows. Real certificates, made with openssl, in a Secret volume's layout."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import ssl
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.server.certificates import Certificates
from extender.server.serve import ServeOptions
from extender.verbs.service import ExtenderService
from helpers.extender_server import listening
from helpers.kube_api_server import wait_until
from helpers.pki import CERTIFICATES, authority, issue, pki

__all__ = ["pki"]  # the fixture: the CA and the certificates, made with openssl

CHECK_SECONDS = 0.05  # the checks' interval here; the extender's is 30 s


@pytest.fixture(scope="module")
def renewed(pki: Path) -> Path:
    """Beside pki's: the serving certificate renewed by the same CA for 30 days, a second CA, and kube-scheduler's
    client certificate from that CA."""
    subject, san = CERTIFICATES["server"]
    issue(pki, "server-renewed", subject, san, days=30)
    authority(pki, "ca2")
    issue(pki, "scheduler-of-ca2", "/CN=kube-scheduler", None, ca="ca2")
    (pki / "both-cas.crt").write_bytes((pki / "ca.crt").read_bytes() + (pki / "ca2.crt").read_bytes())
    return pki


def _publish(volume: Path, version: str, files: dict[str, Path]) -> None:
    """A Secret volume's new version as the kubelet writes it: a new directory, `..data` swapped to it, the old
    one removed; the files are links through `..data`."""
    data = volume / f"..{version}"
    data.mkdir()
    for name, source in files.items():
        shutil.copy(source, data / name)
    old = (volume / "..data").resolve() if (volume / "..data").exists() else None
    (volume / "..data_tmp").symlink_to(data.name)
    os.replace(volume / "..data_tmp", volume / "..data")
    for name in files:
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")
    if old is not None:
        shutil.rmtree(old)


def _secret(pki: Path, version: str, certificate: str, key: str, ca: str = "ca") -> dict[str, Path]:
    return {"tls.crt": pki / f"{certificate}.crt", "tls.key": pki / f"{key}.key", "ca.crt": pki / f"{ca}.crt"}


def _presented(port: int, context: ssl.SSLContext) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
            return connection.getpeercert(binary_form=True) or b""


def _der(path: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def _not_after(path: Path) -> float:
    """By openssl, not by the code under test."""
    out = subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return float(ssl.cert_time_to_seconds(out.strip().removeprefix("notAfter=")))


def _client(pki: Path, certificate: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if certificate is not None:
        context.load_cert_chain(pki / f"{certificate}.crt", pki / f"{certificate}.key")
    return context


def _sample(service: ExtenderService, name: str, **labels: str) -> float | None:
    return service.metrics.registry.get_sample_value(name, labels)


def _reloads(service: ExtenderService, certificate: str, outcome: str) -> float | None:
    return _sample(service, "gpu_topology_extender_certificate_reloads_total", certificate=certificate,
                   outcome=outcome)


def _expiry(service: ExtenderService, certificate: str) -> float | None:
    return _sample(service, "gpu_topology_extender_certificate_expiry_timestamp_seconds", certificate=certificate)


def _serve(volume: Path) -> tuple[ExtenderService, ServeOptions]:
    state = ClusterState()
    service = ExtenderService(state, DemoCluster(state, (("n1", "dgx-h100"),)))
    return service, ServeOptions(tls_cert=str(volume / "tls.crt"), tls_key=str(volume / "tls.key"),
                                 client_ca=str(volume / "ca.crt"), client_names=("kube-scheduler",), metrics_port=1)


def test_a_renewed_certificate_is_served_without_a_restart(renewed: Path, tmp_path: Path) -> None:
    _publish(tmp_path, "1", _secret(renewed, "1", "server", "server"))
    service, options = _serve(tmp_path)
    scheduler, scraper = _client(renewed, "kube-scheduler"), _client(renewed, None)
    with listening(service, options, CHECK_SECONDS) as served:
        assert served.metrics_port is not None
        for port, client in ((served.port, scheduler), (served.metrics_port, scraper)):
            assert _presented(port, client) == _der(renewed / "server.crt")
        assert _expiry(service, "serving") == _not_after(renewed / "server.crt")
        assert _expiry(service, "client-ca") == _not_after(renewed / "ca.crt")
        _publish(tmp_path, "2", _secret(renewed, "2", "server-renewed", "server-renewed"))
        wait_until(lambda: _reloads(service, "serving", "reloaded") == 1, what="the renewed certificate loaded")
        for port, client in ((served.port, scheduler), (served.metrics_port, scraper)):
            assert _presented(port, client) == _der(renewed / "server-renewed.crt")
        assert _expiry(service, "serving") == _not_after(renewed / "server-renewed.crt") > _not_after(
            renewed / "server.crt")
        assert _reloads(service, "serving", "failed") == 0


def test_a_bad_new_file_keeps_the_certificate_in_use(renewed: Path, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    _publish(tmp_path, "1", _secret(renewed, "1", "server", "server"))
    service, options = _serve(tmp_path)
    scheduler = _client(renewed, "kube-scheduler")
    with listening(service, options, CHECK_SECONDS) as served:
        _publish(tmp_path, "2", _secret(renewed, "2", "server-renewed", "server"))  # the key of another certificate
        wait_until(lambda: _reloads(service, "serving", "failed") == 1, what="the mismatched pair refused")
        assert _presented(served.port, scheduler) == _der(renewed / "server.crt")
        assert _expiry(service, "serving") == _not_after(renewed / "server.crt")
        assert any(record.levelno == logging.ERROR and "the one in use is kept" in record.getMessage()
                   for record in caplog.records)
        (tmp_path / "..data" / "tls.crt").write_text("not a certificate")  # garbage in place, then the right pair
        _publish(tmp_path, "3", _secret(renewed, "3", "server-renewed", "server-renewed"))
        wait_until(lambda: _reloads(service, "serving", "reloaded") == 1, what="the good pair loaded")
        assert _presented(served.port, scheduler) == _der(renewed / "server-renewed.crt")


def test_a_new_client_ca_is_trusted_without_a_restart(renewed: Path, tmp_path: Path) -> None:
    _publish(tmp_path, "1", _secret(renewed, "1", "server", "server"))
    service, options = _serve(tmp_path)
    of_ca2 = _client(renewed, "scheduler-of-ca2")
    with listening(service, options, CHECK_SECONDS) as served:
        try:  # TLS 1.3: the client's side of the handshake ends before the server refuses it
            assert not _health(served.port, of_ca2)
        except (ssl.SSLError, ConnectionError):
            pass
        _publish(tmp_path, "2", _secret(renewed, "2", "server", "server", ca="both-cas"))
        wait_until(lambda: _reloads(service, "client-ca", "reloaded") == 1, what="the new CA bundle loaded")
        assert _health(served.port, of_ca2)
        assert _expiry(service, "client-ca") == min(_not_after(renewed / "ca.crt"), _not_after(renewed / "ca2.crt"))


def _health(port: int, context: ssl.SSLContext) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
            connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            return connection.recv(65536).startswith(b"HTTP/1.1 200 ")


def test_the_checks_go_on_after_one_fails(caplog: pytest.LogCaptureFixture) -> None:
    certificates = Certificates([], CollectorRegistry(), check_seconds=0)
    calls: list[int] = []

    def check() -> None:
        calls.append(len(calls))
        if len(calls) == 1:
            raise RuntimeError("a bug")

    certificates.check = check  # type: ignore[method-assign]

    async def watch_a_while() -> None:
        task = asyncio.create_task(certificates.watch())
        while len(calls) < 3:
            await asyncio.sleep(0)
        task.cancel()

    asyncio.run(watch_a_while())
    assert any("checking the certificate files failed" in record.getMessage() for record in caplog.records)
