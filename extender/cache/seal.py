"""The extender's seal on its bind records: an HMAC over the pod's UID, node and GPU assignment.

A pod's annotations are the only record of a bind that outlives the extender, and the pod's owner can write
them too: a pod created with `spec.nodeName` and someone else's GPUs in `gpu-topology.io/gpus` must not
make those GPUs taken. So bind writes a seal with the assignment, and after a restart the ledger takes an
annotation back only when its seal checks out for that very pod (its UID) on that very node. The key is
shared by the extender's replicas (a Secret); without one each process makes its own, and a restart then
relearns unsealed pods only from what the kubelet reports.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from pathlib import Path

VERSION = "v1"
MIN_KEY_BYTES = 16


class Seal:
    def __init__(self, key: bytes) -> None:
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(f"a seal key needs at least {MIN_KEY_BYTES} bytes, not {len(key)}")
        self._key = key

    @classmethod
    def from_file(cls, path: str | Path) -> Seal:
        try:
            key = Path(path).read_bytes().strip()
        except OSError as error:
            raise ValueError(f"seal key {path}: {error.strerror or error}") from None
        return cls(key)

    @classmethod
    def ephemeral(cls) -> Seal:
        """A key of this process only: after a restart, its seals no longer check out."""
        return cls(secrets.token_bytes(32))

    def sign(self, uid: str, node: str, gpus: str, containers: str) -> str:
        return f"{VERSION}.{self._mac(uid, node, gpus, containers)}"

    def verify(self, seal: object, uid: str, node: str, gpus: str, containers: str) -> bool:
        if not isinstance(seal, str) or not seal.startswith(VERSION + "."):
            return False
        return hmac.compare_digest(seal[len(VERSION) + 1:], self._mac(uid, node, gpus, containers))

    def _mac(self, *fields: str) -> str:
        digest = hmac.new(self._key, "\0".join(fields).encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest[:24]).decode()
