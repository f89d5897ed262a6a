"""extender/server/x509.py: the notAfter of real certificates as openssl reads it, UTCTime and GeneralizedTime
alike, and anything else a ValueError, never another exception."""

from __future__ import annotations

import base64
import ssl
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.server.x509 import earliest_expiry, not_after
from helpers.pki import authority, pki

__all__ = ["pki"]  # the fixture: the CA and the certificates, made with openssl


def _openssl_not_after(path: Path) -> float:
    out = subprocess.run(["openssl", "x509", "-enddate", "-noout", "-in", str(path)], check=True,
                         capture_output=True, text=True).stdout
    return float(ssl.cert_time_to_seconds(out.strip().removeprefix("notAfter=")))


def test_the_expiry_is_openssls(pki: Path) -> None:
    authority(pki, "ca-past-2050", days=15_000)  # notAfter past 2049: a GeneralizedTime
    for name in ("ca", "server", "kube-scheduler", "ca-past-2050"):
        assert earliest_expiry((pki / f"{name}.crt").read_bytes()) == _openssl_not_after(pki / f"{name}.crt")
    bundle = (pki / "ca-past-2050.crt").read_bytes() + (pki / "server.crt").read_bytes()
    assert earliest_expiry(bundle) == _openssl_not_after(pki / "server.crt")


@pytest.mark.parametrize("pem", [b"", b"hello", b"-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
                                 b"-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"])
def test_what_is_no_certificate_is_refused(pem: bytes) -> None:
    with pytest.raises(ValueError):
        earliest_expiry(pem)


def test_every_cut_of_a_certificate_is_refused(pki: Path) -> None:
    der = ssl.PEM_cert_to_DER_cert((pki / "server.crt").read_text())
    for end in range(len(der)):
        try:
            not_after(der[:end])
        except ValueError:
            continue
        raise AssertionError(f"a certificate cut at {end} of {len(der)} bytes was read")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=600))
def test_garbage_is_a_value_error_or_a_time(der: bytes) -> None:
    pem = b"-----BEGIN CERTIFICATE-----\n" + base64.encodebytes(der) + b"-----END CERTIFICATE-----\n"
    try:
        assert isinstance(earliest_expiry(pem), float)
    except ValueError:
        pass
