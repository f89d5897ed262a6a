"""Fixtures of the end-to-end suite: one cluster for the whole session, torn down however the session ends.

`e2e_cluster` starts etcd, kube-apiserver, the GPU nodes with their fake reporter, our extender and
kube-scheduler (kube_e2e.start_cluster), and stops them in reverse order through an ExitStack: on success, on a
failed assertion, and when starting one of them fails half-way. The working directory (certificates,
kubeconfigs, the scheduler's configuration, etcd's data and every process's log) is a pytest temporary
directory, kept after the run for a look. When a test here fails, the report gets the tail of each log.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from kube_e2e import Cluster, find_kube_binaries, skip_reason, start_cluster, started_processes

_clusters: list[Cluster] = []
_FIRST_PROCESS = pytest.StashKey[int]()


@pytest.fixture(scope="session")
def e2e_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    binaries, problem = find_kube_binaries()
    if problem is not None or binaries is None:
        pytest.skip(skip_reason(problem or "no binaries"))
    workdir = tmp_path_factory.mktemp("e2e-cluster")
    with ExitStack() as stack:
        cluster = start_cluster(binaries, workdir, stack)
        _clusters.append(cluster)
        try:
            yield cluster
        finally:
            _clusters.remove(cluster)


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
