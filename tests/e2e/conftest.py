"""Fixtures of the end-to-end suite: clusters torn down however the session ends.

`e2e_cluster` (one for the whole session) and `spec_cluster` (one per test module, of the module's own
`CLUSTER_SPEC`) start etcd, kube-apiserver, the GPU nodes with their fake reporter, our extender and
kube-scheduler (kube_e2e.start_cluster), and stop them in reverse order through an ExitStack: on success, on a
failed assertion, and when starting one of them fails half-way. The working directory (certificates,
kubeconfigs, the scheduler's configuration, etcd's data and every process's log) is a pytest temporary
directory, kept after the run for a look. When a test here fails, the report gets the tail of each log.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from kube_e2e import (
    DEFAULT_SPEC,
    Cluster,
    ClusterSpec,
    find_kube_binaries,
    skip_reason,
    start_cluster,
    started_processes,
)

_clusters: list[Cluster] = []
_FIRST_PROCESS = pytest.StashKey[int]()


@contextmanager
def _running(spec: ClusterSpec, tmp_path_factory: pytest.TempPathFactory, name: str) -> Iterator[Cluster]:
    binaries, problem = find_kube_binaries()
    if problem is not None or binaries is None:
        pytest.skip(skip_reason(problem or "no binaries"))
    workdir = tmp_path_factory.mktemp(name)
    with ExitStack() as stack:
        cluster = start_cluster(binaries, workdir, stack, spec)
        _clusters.append(cluster)
        try:
            yield cluster
        finally:
            _clusters.remove(cluster)


@pytest.fixture(scope="session")
def e2e_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with _running(DEFAULT_SPEC, tmp_path_factory, "e2e-cluster") as cluster:
        yield cluster


@pytest.fixture(scope="module")
def spec_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster of its own for a module whose scenario needs other nodes or flags (the module's CLUSTER_SPEC),
    stopped when the module's tests are done, so that two clusters never share the machine for long."""
    spec: ClusterSpec = request.module.CLUSTER_SPEC
    with _running(spec, tmp_path_factory, f"{request.module.__name__}-cluster") as cluster:
        yield cluster


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_FIRST_PROCESS] = len(started_processes())


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """On a failure, the tails of the logs of the live cluster and of whatever the test itself started."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    processes = [process for cluster in _clusters for process in cluster.processes.values()]
    processes += [process for process in started_processes()[item.stash.get(_FIRST_PROCESS, 0):]
                  if process not in processes]
    for cluster in _clusters:
        report.sections.append(("e2e cluster", f"working directory: {cluster.workdir}\n" + "\n".join(
            f"{name}: {version}" for name, version in cluster.versions.items())))
        if cluster.reporter.errors:
            report.sections.append(("fake reporter errors", "\n".join(cluster.reporter.errors[-5:])))
    for process in processes:
        report.sections.append((f"{process.name} log, last 40 lines ({process.log_path})", process.tail(40)))
