"""Annotation keys (DESIGN §5, §6): the one place their names are written.

The prefix is configurable so that two installations can share a cluster; every key hangs off it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_PREFIX = "gpu-topology.io"

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True, slots=True)
class AnnotationKeys:
    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        prefix = self.prefix
        if len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix):
            raise ValueError(f"annotation prefix {prefix!r} is not a DNS subdomain such as {DEFAULT_PREFIX}")

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    # On nodes, written by the reporter.
    @property
    def topology(self) -> str:
        return self._key("topology")

    @property
    def state(self) -> str:
        return self._key("state")

    # On pods, written by the user.
    @property
    def interconnect(self) -> str:
        return self._key("interconnect")

    @property
    def placement(self) -> str:
        return self._key("placement")

    @property
    def min_bandwidth(self) -> str:
        return self._key("min-bandwidth")

    # On pods, written by the extender at bind.
    @property
    def gpus(self) -> str:
        return self._key("gpus")

    @property
    def ring_bandwidth(self) -> str:
        return self._key("ring-bandwidth")
