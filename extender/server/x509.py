"""When the certificates of a PEM file expire: the notAfter of each, read from its DER.

The standard library decodes a certificate's dates only for a peer (`getpeercert`) or for the CAs of a trust
store (`get_ca_certs`), never for the serving leaf, and `cryptography` is no dependency of the extender. The path
to notAfter is fixed by RFC 5280 (Certificate > TBSCertificate > Validity), so it is read here, every length
checked: a file that is not what it claims is a ValueError, never a wrong date.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime

_PEM = re.compile(rb"-----BEGIN CERTIFICATE-----(.*?)-----END CERTIFICATE-----", re.DOTALL)
_SEQUENCE, _INTEGER, _VERSION, _UTC_TIME, _GENERALIZED_TIME = 0x30, 0x02, 0xA0, 0x17, 0x18
_TIMES = {_UTC_TIME: "%y%m%d%H%M%SZ", _GENERALIZED_TIME: "%Y%m%d%H%M%SZ"}
MAX_CERTIFICATES = 100  # a serving chain or a CA bundle; more is not a file for this


def earliest_expiry(pem: bytes) -> float:
    """The earliest notAfter of the certificates in `pem`, as Unix time: when the file stops being usable whole."""
    blocks = _PEM.findall(pem)
    if not blocks:
        raise ValueError("no PEM certificate in it")
    if len(blocks) > MAX_CERTIFICATES:
        raise ValueError(f"{len(blocks)} certificates in it, more than {MAX_CERTIFICATES}")
    return min(not_after(_der(block)) for block in blocks)


def _der(block: bytes) -> bytes:
    try:
        return base64.b64decode(b"".join(block.split()), validate=True)
    except binascii.Error as error:
        raise ValueError(f"a PEM certificate that is not base64: {error}") from None


def not_after(der: bytes) -> float:
    """A DER certificate's notAfter, as Unix time."""
    tag, body, _ = _element(der, 0)
    _expect(tag, _SEQUENCE, "the certificate")
    tag, at, _ = _element(der, body)
    _expect(tag, _SEQUENCE, "the certificate's body")
    tag, _, after = _element(der, at)
    if tag == _VERSION:
        at = after
    for field, expected in (("serial number", _INTEGER), ("signature algorithm", _SEQUENCE),
                            ("issuer", _SEQUENCE)):
        tag, _, at = _element(der, at)
        _expect(tag, expected, f"the {field}")
    tag, validity, _ = _element(der, at)
    _expect(tag, _SEQUENCE, "the validity")
    tag, start, end = _element(der, _element(der, validity)[2])  # notBefore, then notAfter
    if tag not in _TIMES:
        raise ValueError(f"notAfter is not a time (tag {tag:#x})")
    try:
        moment = datetime.strptime(der[start:end].decode("ascii"), _TIMES[tag]).replace(tzinfo=UTC)
    except (UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"notAfter {der[start:end]!r} is not a time: {error}") from None
    if tag == _UTC_TIME and moment.year >= 2050:  # RFC 5280: a UTCTime's YY of 50 or more is 19YY
        moment = moment.replace(year=moment.year - 100)
    return moment.timestamp()


def _element(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, where its content starts, where it ends) of the DER element at `at`, inside `der`."""
    if at + 2 > len(der):
        raise ValueError("the certificate ends early")
    tag, length = der[at], der[at + 1]
    at += 2
    if length & 0x80:
        size = length & 0x7F
        if not 0 < size <= 4 or at + size > len(der):
            raise ValueError("the certificate has a malformed length")
        length = int.from_bytes(der[at:at + size], "big")
        at += size
    if at + length > len(der):
        raise ValueError("the certificate ends early")
    return tag, at, at + length


def _expect(tag: int, expected: int, what: str) -> None:
    if tag != expected:
        raise ValueError(f"{what} is not where RFC 5280 puts it (tag {tag:#x}, expected {expected:#x})")
