"""The documents a user reads name only what the repository holds: a clone has no `../shared/`, so a link there,
or a path that moved, leaves the reader with nothing."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from helpers.paths import ROOT

_LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target)
_OUTSIDE = re.compile(r"(?<![\w/.-])(\.\./shared/|shared/(DESIGN|kube-scheduler|topologies|traces|research)\b)")


def _documents() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    return [ROOT / line for line in listed.stdout.splitlines() if (ROOT / line).is_file()]


DOCUMENTS = _documents()


def test_there_are_documents_to_read() -> None:
    assert {path.name for path in DOCUMENTS} >= {"README.md", "ARCHITECTURE.md", "CHANGELOG.md"}


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_no_document_points_outside_the_repository(document: Path) -> None:
    text = document.read_text(encoding="utf-8")
    outside = [match.group(0) for match in _OUTSIDE.finditer(text)]
    assert not outside, f"{document.relative_to(ROOT)} names files a clone does not have: {outside}"


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: str(path.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_of_the_repository(document: Path) -> None:
    broken = []
    for target in _LINK.findall(document.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):  # a URL or an anchor on the page
            continue
        path = (document.parent / target.split("#", 1)[0]).resolve()
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(target)
    assert not broken, f"{document.relative_to(ROOT)} links to what the repository does not hold: {broken}"
