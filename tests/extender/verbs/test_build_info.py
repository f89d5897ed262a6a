"""gpu_topology_extender_build_info: the version --version shows and the Python that runs it, in the extender's
registry, so a dashboard tells which release each replica runs."""

from __future__ import annotations

import platform

from extender.cache.cluster_state import ClusterState
from extender.demo.cluster import DemoCluster
from extender.verbs.service import ExtenderService
from topology.version import version


def test_the_registry_shows_the_build() -> None:
    state = ClusterState()
    registry = ExtenderService(state, DemoCluster(state, ())).metrics.registry
    labels = {"version": version(), "python": platform.python_version()}
    assert registry.get_sample_value("gpu_topology_extender_build_info", labels) == 1.0
