"""`gpu-topology-extender serve --observe --metrics-port` as a process: the scraper without a certificate reads the
build and the certificates' expiry on the metrics port, a bind on the main port is refused as observing, and
SIGTERM stops both listeners with exit code 0."""

from __future__ import annotations

import os
import platform
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import orjson

from helpers.extender_harness import free_port
from helpers.kube_api_server import wait_until
from helpers.paths import ROOT
from helpers.pki import pki
from topology.version import version

__all__ = ["pki"]  # the fixture: the CA and the certificates, made with openssl


def _get(url: str, context: ssl.SSLContext, body: bytes | None = None) -> bytes | None:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=body), context=context, timeout=5) as answer:
            return answer.read()
    except (urllib.error.URLError, ConnectionError):
        return None


def test_observe_and_the_metrics_port_from_the_command_line(pki: Path, tmp_path: Path) -> None:
    port, metrics_port = free_port(), free_port()
    log = (tmp_path / "extender.log").open("w+")
    process = subprocess.Popen(
        [sys.executable, "-m", "extender.cli", "serve", "--demo", "--observe", "--port", str(port),
         "--metrics-port", str(metrics_port), "--tls-cert", str(pki / "server.crt"), "--tls-key",
         str(pki / "server.key"), "--client-ca", str(pki / "ca.crt"), "--client-name", "kube-scheduler"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    scraper = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    scheduler = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    scheduler.load_cert_chain(pki / "kube-scheduler.crt", pki / "kube-scheduler.key")
    try:
        metrics = f"https://127.0.0.1:{metrics_port}/metrics"
        wait_until(lambda: process.poll() is not None or _get(metrics, scraper) is not None, timeout=60,
                   what="the metrics port")
        assert process.poll() is None, log.read()
        scraped = (_get(metrics, scraper) or b"").decode()
        assert f'gpu_topology_extender_build_info{{python="{platform.python_version()}",version="{version()}"}} 1.0' \
            in scraped
        assert 'gpu_topology_extender_certificate_expiry_timestamp_seconds{certificate="serving"}' in scraped
        bind = orjson.dumps({"PodName": "p", "PodNamespace": "ml", "PodUID": "u", "Node": "n"})
        answer = _get(f"https://127.0.0.1:{port}/bind", scheduler, bind)
        assert answer is not None and b"observes only (--observe)" in orjson.loads(answer)["Error"].encode()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        log.close()
