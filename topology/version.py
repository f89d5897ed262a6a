"""The project's version, read from the installed package's metadata, so that pyproject.toml's is the only one:
every entry point's `--version` and the extender's build-info metric show the version pip installed."""

from __future__ import annotations

import argparse
from functools import cache
from importlib.metadata import PackageNotFoundError, version as distribution_version

DISTRIBUTION = "gpu-topology-extender"
UNKNOWN = "unknown"  # a source tree run without `pip install`: there is no metadata to read


@cache
def version() -> str:
    try:
        return distribution_version(DISTRIBUTION)
    except PackageNotFoundError:
        return UNKNOWN


def add_version(parser: argparse.ArgumentParser) -> None:
    """`--version`: the program's name and version on stdout, exit 0."""
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
