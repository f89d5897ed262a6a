"""The commands besides python3 that `make test` runs (README, Quick start): openssl makes the certificates of the
mTLS checks and runs scheduler-config/make-certs.sh, and kubectl's kustomize renders scheduler-config/. A test
that needs one fails where it is missing, naming it, rather than skip the checks it exists for."""

from __future__ import annotations

import shutil


def required(*tools: str) -> None:
    """Fail unless every one of these commands is on PATH."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    assert not missing, f"make test needs {' and '.join(missing)} on PATH (README, Quick start)"
