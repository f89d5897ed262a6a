"""The serving certificate and the client CA, taken up again when their files change, without a restart.

Kubernetes updates a Secret volume by writing a new directory and swapping the `..data` symlink: the paths stay, and
the files they resolve to have another inode and mtime. `check()`, every CHECK_SECONDS on the event loop that serves
the contexts (so no handshake runs while a context changes), compares those of each file. On a change the new files
are first loaded into a context of their own: a file that does not parse, a key that does not match its
certificate, or a file half written, is an error in the log and a count, and the contexts in use keep what they had.
Then they are loaded into the contexts in use (the main port's and the metrics port's): OpenSSL gives each new
connection the context's certificate, so new handshakes present the new one and open connections keep theirs.

A client CA is added to the trust store, as OpenSSL's stores only grow: a CA taken out of the file stays trusted
until the extender restarts. The expiry metric is the earliest notAfter of the file in use (x509.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry, Counter, Gauge

from extender.server.x509 import earliest_expiry

log = logging.getLogger(__name__)

CHECK_SECONDS = 30.0
SERVING, CLIENT_CA = "serving", "client-ca"
RELOADED, FAILED = "reloaded", "failed"
MAX_PEM_BYTES = 1 << 20  # a chain or a CA bundle is a few KiB

Stamp = tuple[tuple[int, int, int, int] | None, ...]  # per file: (device, inode, mtime ns, size), None if missing


@dataclass(frozen=True, slots=True)
class Files:
    """What is loaded together: a certificate with its key, or a CA bundle (key None)."""

    name: str  # SERVING or CLIENT_CA
    certificate: str
    key: str | None = None

    def paths(self) -> tuple[str, ...]:
        return (self.certificate,) if self.key is None else (self.certificate, self.key)


class Certificates:
    """Reloads `files` into the contexts that serve them when they change, and shows when each expires."""

    def __init__(self, files: Sequence[Files], registry: CollectorRegistry,
                 check_seconds: float = CHECK_SECONDS) -> None:
        """Made before the contexts first load the files: a change made meanwhile is then taken up at the first
        check, not missed."""
        self.files = tuple(files)
        self.check_seconds = check_seconds
        self._contexts: dict[str, list[ssl.SSLContext]] = {found.name: [] for found in self.files}
        self._seen: dict[str, Stamp | None] = {}
        self._expiry = Gauge("gpu_topology_extender_certificate_expiry_timestamp_seconds",
                             "When the certificates in use expire (notAfter, Unix time; the earliest of the file): "
                             "serving, the extender's own; client-ca, the CAs its clients' certificates must chain to",
                             ["certificate"], registry=registry)
        self._reloads = Counter("gpu_topology_extender_certificate_reloads_total",
                                "Certificate files taken up again after they changed (reloaded), or refused and the "
                                "ones in use kept (failed)", ["certificate", "outcome"], registry=registry)
        for found in self.files:
            self._seen[found.name] = _stamp(found)
            for outcome in (RELOADED, FAILED):
                self._reloads.labels(found.name, outcome)
            try:
                self._expiry.labels(found.name).set(earliest_expiry(_read(found.certificate)))
            except (OSError, ValueError) as error:  # what uvicorn loads it refuses itself, with its own message
                log.warning("no expiry metric for the %s certificate %s: %s", found.name, found.certificate, error)

    def serve_with(self, context: ssl.SSLContext, *, client_ca: bool) -> None:
        """`context` serves the serving certificate, and checks clients against the client CA if `client_ca`."""
        self._contexts.get(SERVING, []).append(context)
        if client_ca:
            self._contexts.get(CLIENT_CA, []).append(context)

    async def watch(self) -> None:
        """Check every `check_seconds`, on the event loop of the contexts, until cancelled."""
        while True:
            await asyncio.sleep(self.check_seconds)
            try:
                self.check()
            except Exception:  # a bug here must not end the checks: the certificates in use stay as they are
                log.exception("checking the certificate files failed")

    def check(self) -> None:
        for found in self.files:
            stamp = _stamp(found)
            if stamp != self._seen.get(found.name):
                self._seen[found.name] = stamp
                self._reload(found)

    def _reload(self, found: Files) -> None:
        # Resolved once: the files loaded are those checked, even if the symlink is swapped again meanwhile.
        certificate, key = os.path.realpath(found.certificate), found.key and os.path.realpath(found.key)
        try:
            expires = earliest_expiry(_read(certificate))
            _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), certificate, key)
        except (OSError, ValueError, ssl.SSLError) as error:
            self._reloads.labels(found.name, FAILED).inc()
            log.error("the %s certificate %s changed but cannot be used: %s; the one in use is kept", found.name,
                      found.certificate, error)
            return
        try:
            for context in self._contexts[found.name]:
                _load(context, certificate, key)
        except (OSError, ssl.SSLError) as error:  # the files went between the two loads: at the next check again
            self._seen[found.name] = None
            self._reloads.labels(found.name, FAILED).inc()
            log.error("the %s certificate %s could not be loaded: %s; loaded again at the next check", found.name,
                      found.certificate, error)
            return
        self._expiry.labels(found.name).set(expires)
        self._reloads.labels(found.name, RELOADED).inc()
        log.info("loaded the new %s certificate %s, valid until %s", found.name, found.certificate,
                 datetime.fromtimestamp(expires, UTC).isoformat())


def _load(context: ssl.SSLContext, certificate: str, key: str | None) -> None:
    if key is None:
        context.load_verify_locations(cafile=certificate)
    else:
        context.load_cert_chain(certificate, key)


def _read(path: str) -> bytes:
    with open(path, "rb") as file:
        data = file.read(MAX_PEM_BYTES + 1)
    if len(data) > MAX_PEM_BYTES:
        raise ValueError(f"over {MAX_PEM_BYTES} bytes")
    return data


def _stamp(found: Files) -> Stamp:
    stamps = []
    for path in found.paths():
        try:
            status = os.stat(path)  # follows the symlinks, to the file a Secret volume's ..data names now
        except OSError:
            stamps.append(None)
        else:
            stamps.append((status.st_dev, status.st_ino, status.st_mtime_ns, status.st_size))
    return tuple(stamps)
