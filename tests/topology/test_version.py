"""`--version` on every entry point of pyproject.toml's [project.scripts], each showing the one version: the installed
package's metadata, which pip takes from pyproject.toml."""

from __future__ import annotations

import importlib
import tomllib
from importlib.metadata import version as distribution_version

import pytest

from helpers.paths import ROOT
from topology.version import DISTRIBUTION, UNKNOWN, version

SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]


def test_the_version_is_pyprojects_as_installed() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert version() == distribution_version(DISTRIBUTION) != UNKNOWN
    assert version() == declared, "the installed metadata is older than pyproject.toml: run `pip install -e .`"


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_entry_point_answers_version(script: str, capsys: pytest.CaptureFixture[str]) -> None:
    module, _, function = SCRIPTS[script].partition(":")
    main = getattr(importlib.import_module(module), function)
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.endswith(f" {version()}\n") and len(out.splitlines()) == 1, out
