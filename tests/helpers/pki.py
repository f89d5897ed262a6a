"""A CA and certificates signed by it, made with the openssl command line: the extender's serving certificate,
kube-scheduler's client certificate, one named by its SAN only, and an intruder's under another name (same CA)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers.tools import required

# name: (subject, subjectAltName)
CERTIFICATES = {
    "server": ("/CN=gpu-topology-extender", "IP:127.0.0.1"),
    "kube-scheduler": ("/CN=kube-scheduler", None),  # scheduler-config/make-certs.sh and cert-manager.yaml
    "by-san": ("/CN=someone-else", "DNS:gpu-topology-extender.gpu-topology-system.svc"),
    "intruder": ("/O=system:masters/CN=intruder", "DNS:kube-scheduler.example"),  # same CA, other name
}


def _openssl(directory: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    required("openssl")
    directory = tmp_path_factory.mktemp("pki")
    authority(directory, "ca")
    for name, (subject, san) in CERTIFICATES.items():
        issue(directory, name, subject, san)
    return directory


def authority(directory: Path, name: str, days: int = 1) -> None:
    """A CA: `name`.crt and `name`.key in `directory`."""
    _openssl(directory, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", str(days), "-subj", f"/CN=test-{name}")


def issue(directory: Path, name: str, subject: str, san: str | None, days: int = 1, ca: str = "ca") -> None:
    """A certificate signed by the CA `ca` of `directory`: `name`.crt and `name`.key."""
    _openssl(directory, "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", subject)
    (directory / f"{name}.ext").write_text(f"subjectAltName = {san}\n" if san else "basicConstraints = CA:FALSE\n")
    _openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-days", str(days), "-extfile", f"{name}.ext", "-out", f"{name}.crt")
