"""Leader election on a Lease (extender.kube.leader_election), and what it gates: only the leader binds and carries
the leader label (the Service routes to it); every replica with synced caches is ready, to serve or to take over.

The election rules run over the real client and the in-process API server (Leases with resourceVersion
conflicts, as kube-apiserver keeps them), on a fake clock: no test waits for a lease to expire. The
failover test at the end runs two real `gpu-topology-extender serve` processes.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import kubernetes.client as k8s
import pytest
from helpers.extender_harness import (APP_LABELS, GPUS_KEY, LEADER_LABEL, Extender, Replica, held_gpus, leader_pods,
                              node_annotations, start)
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, make_node, make_pod, wait_until

from extender.kube.client import KubeError, KubernetesApi
from extender.kube.leader_election import LeaderElector, LeaseRecord, Timings, micro_time
from extender.kube.leader_label import LeaderLabel
from topology.annotations import AnnotationKeys

__all__ = ["kube_server_fixture"]

NAMESPACE, LEASE = "gpu-system", "gpu-topology-extender"


class Clock:
    """A monotonic clock that moves only when told, and the wall time that goes with it."""

    def __init__(self) -> None:
        self.now = 1000.25
        self.epoch = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> float:
        return self.now

    def wall(self) -> datetime:
        return self.epoch + timedelta(seconds=self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def api(kube_server: FakeKubeApiServer) -> KubernetesApi:
    return KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), timeout=2.0)


@pytest.fixture
def clock() -> Clock:
    return Clock()


def elector(api, clock: Clock, identity: str, *, lease_api=None) -> LeaderElector:
    return LeaderElector(lease_api or api, NAMESPACE, LEASE, identity, Timings(), clock=clock, wall=clock.wall)


def spec(server: FakeKubeApiServer) -> dict:
    return server.lease(NAMESPACE, LEASE)["spec"]


# -- the election rules --------------------------------------------------------------------------------------


def test_the_first_candidate_creates_the_lease_and_the_second_waits(kube_server, api, clock):
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert a.step() and a.is_leader() and a.term() == 1
    assert not b.step() and not b.is_leader() and b.term() is None
    lease = spec(kube_server)
    assert (lease["holderIdentity"], lease["leaseDurationSeconds"], lease["leaseTransitions"]) == ("a", 15, 0)
    assert datetime.fromisoformat(lease["acquireTime"]) == datetime.fromisoformat(lease["renewTime"]) == clock.wall()


def test_a_renewal_keeps_the_acquire_time_and_the_term(kube_server, api, clock):
    a = elector(api, clock, "a")
    a.step()
    acquired = spec(kube_server)["acquireTime"]
    for _ in range(5):
        clock.advance(2)
        assert a.step()
    lease = spec(kube_server)
    assert lease["acquireTime"] == acquired and datetime.fromisoformat(lease["renewTime"]) == clock.wall()
    assert lease["leaseTransitions"] == 0 and a.term() == 1


def test_a_lease_not_renewed_is_taken_over_after_the_lease_duration_seen_locally(kube_server, api, clock):
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    assert not b.step()  # b sees a's record now, and times it from now
    clock.advance(14.9)
    assert not b.step()
    clock.advance(0.1)
    assert b.step() and b.term() == 1
    lease = spec(kube_server)
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("b", 1)
    assert not a.step() and not a.is_leader(), "a, back from its pause, finds the Lease held by b"


def test_a_candidate_wakes_when_the_lease_it_saw_expires_not_at_its_next_retry(kube_server, api, clock):
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    assert a.next_attempt(a.step()) == 2.0  # a leader renews every retry period
    assert not b.step()  # b sees a's record now: it expires 15 s from now on b's clock
    assert 2.0 <= b.next_attempt(False) <= 2.4  # a retry, jittered, comes first
    clock.advance(13.5)
    assert b.next_attempt(False) == pytest.approx(1.5)  # the expiry comes first: b wakes then, and takes it
    clock.advance(1.5)
    b.api = Unreachable()
    assert not b.step()  # past the expiry an attempt failed: b retries as usual, no tight loop
    assert 2.0 <= b.next_attempt(False) <= 2.4
    b.api = api
    assert b.step() and b.term() == 1


class Unreachable:
    """A Lease API whose every call fails, as one cut off from the API server."""

    def get_lease(self, namespace: str, name: str) -> None:
        raise KubeError("unreachable")


def test_expiry_is_measured_on_this_replica_s_clock_not_the_holder_s_renew_time(kube_server, api, clock):
    """A holder whose clock is a year behind still holds its Lease while it renews: only changes are timed."""
    a = LeaderElector(api, NAMESPACE, LEASE, "a", Timings(), clock=clock,
                      wall=lambda: clock.wall() - timedelta(days=365))
    b = elector(api, clock, "b")
    a.step()
    for _ in range(20):
        assert not b.step()
        clock.advance(2)
        assert a.step()
    assert spec(kube_server)["holderIdentity"] == "a"


class RacingLeases:
    """The Lease API of a candidate that, once armed, is overtaken between its next read and its write."""

    def __init__(self, api: KubernetesApi, between) -> None:
        self.api, self.between, self.armed = api, between, False

    def get_lease(self, namespace, name):
        lease = self.api.get_lease(namespace, name)
        if self.armed:
            self.armed = False
            self.between()
        return lease

    def create_lease(self, namespace, lease):
        return self.api.create_lease(namespace, lease)

    def replace_lease(self, namespace, name, lease):
        return self.api.replace_lease(namespace, name, lease)


@pytest.mark.parametrize("lease_exists", [False, True], ids=["create", "update"])
def test_of_two_candidates_racing_for_the_lease_only_one_wins(kube_server, api, clock, lease_exists):
    c = elector(api, clock, "c")
    racing = RacingLeases(api, c.step)
    b = elector(api, clock, "b", lease_api=racing)
    if lease_exists:  # a Lease its holder stopped renewing, as a dead leader leaves it
        elector(api, clock, "old").step()
        assert not b.step() and not c.step()
        clock.advance(15)
    racing.armed = True
    assert not b.step(), "c wrote between b's read and b's write: b's write is refused"
    assert c.is_leader() and not b.is_leader() and b.term() is None
    assert spec(kube_server)["holderIdentity"] == "c"


def test_a_leader_that_cannot_renew_steps_down_before_anyone_can_take_over(kube_server, api, clock):
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    b.step()
    kube_server.fail(None, f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/{LEASE}", times=5)
    for _ in range(4):  # a retries every 2 s and every call fails
        clock.advance(2)
        assert not a.step() and a.is_leader()
    clock.advance(2)  # 10 s since a's last renewal: the renew deadline
    assert not a.step()
    assert not a.is_leader() and a.term() is None, "a stops binding at the renew deadline"
    assert not b.step(), "b cannot have the Lease yet: it was renewed 10 s ago, less than the lease duration"
    clock.advance(5)
    assert b.step() and b.is_leader()


def test_each_win_starts_a_new_term_and_tells_the_listeners(kube_server, api, clock):
    terms: list[int] = []
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.on_new_term(terms.append)
    a.step()
    clock.advance(2)
    a.step()
    b.step()
    clock.advance(16)  # a paused (say, a long GC) and lost the Lease to b
    assert b.step()
    assert not a.step() and terms == [1]
    b.release()
    assert a.step() and terms == [1, 2] and a.term() == 2
    assert spec(kube_server)["leaseTransitions"] == 2


def test_release_hands_the_lease_over_at_once(kube_server, api, clock):
    a, b = elector(api, clock, "a"), elector(api, clock, "b")
    a.step()
    b.step()
    a.stop()
    assert spec(kube_server)["holderIdentity"] == "" and not a.is_leader()
    assert b.step() and spec(kube_server)["leaseTransitions"] == 1


def test_a_mangled_lease_can_be_taken_over():
    mangled = {"spec": {"holderIdentity": 7, "leaseDurationSeconds": "15", "leaseTransitions": -3,
                        "renewTime": ["2026"]}}
    assert LeaseRecord.from_lease(mangled) == LeaseRecord()
    assert LeaseRecord.from_lease({"spec": None}) == LeaseRecord()


@pytest.mark.parametrize(("lease", "renew", "retry"), [(15, 15, 2), (15, 10, 10), (10, 20, 2), (15, 10, 0)])
def test_inconsistent_timings_are_refused(lease, renew, retry):
    with pytest.raises(ValueError, match="lease duration > renew deadline"):
        Timings(lease, renew, retry)


def test_a_micro_time_always_has_its_fraction():
    """The client passes it through datetime.isoformat, which would drop a zero fraction."""
    assert micro_time(datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)) == "2026-05-01T12:00:00.000001Z"


# -- what the election gates, in one process -----------------------------------------------------------------


@pytest.fixture
def cluster(kube_server: FakeKubeApiServer) -> FakeKubeApiServer:
    kube_server.add_node(make_node("gpu-1", annotations=node_annotations("gpu-1")))
    return kube_server


@pytest.fixture
def pair(cluster, clock) -> Iterator[tuple[Extender, Extender]]:
    """Two replicas in one process, each in its own Pod; a has won the election, b stands by."""
    extenders = []
    try:
        for identity in ("a", "b"):
            api = KubernetesApi.from_configuration(k8s.Configuration(host=cluster.url), timeout=2.0)
            extenders.append(start(cluster, elector=elector(api, clock, identity)))
        a, b = extenders
        assert a.elector.step() and not b.elector.step()
        yield a, b
    finally:
        for extender in extenders:
            extender.stop()


def test_a_standby_is_ready_but_only_the_leader_binds_and_carries_the_label(cluster, clock, pair):
    a, b = pair
    wait_until(lambda: leader_pods(cluster, NAMESPACE) == ["a"], what="the label on the leader's pod")
    # Ready means "can serve or take over": a warm standby is ready, so a rollout or a drain can proceed.
    assert a.readyz() == b.readyz() == (200, "ok")
    assert cluster.pod(NAMESPACE, "b")["metadata"]["labels"] == APP_LABELS
    pod = cluster.add_pod(make_pod("p", gpus=2))
    wait_until(lambda: b.state.pod(pod["metadata"]["uid"]), what="the pod in b's cache")
    assert b.filter(pod, ["gpu-1"])["NodeNames"] == ["gpu-1"], "a standby still filters"
    assert b.bind(pod, "gpu-1") == ("binding default/p refused: replica b is not the leader; kube-scheduler "
                                    "will retry the pod")
    assert "nodeName" not in cluster.pod("default", "p")["spec"]
    assert a.bind(pod, "gpu-1") == ""
    assert "gpu_topology_extender_leader 1.0" in a.client.get("/metrics").text
    assert "gpu_topology_extender_leader 0.0" in b.client.get("/metrics").text
    # The only pod writes are merge patches of the replicas' own leader label.
    assert {(p["key"], p["content_type"], str(p["patch"])) for p in cluster.patches} <= {
        ((NAMESPACE, name), "application/merge-patch+json", str({"metadata": {"labels": {LEADER_LABEL: value}}}))
        for name in ("a", "b") for value in ("true", None)}


def test_the_label_moves_to_the_new_leader_and_a_leader_that_steps_down_removes_it(cluster, clock, pair):
    a, b = pair
    wait_until(lambda: leader_pods(cluster, NAMESPACE) == ["a"], what="the label on a")
    clock.advance(10)  # a paused past its renew deadline (a long GC, say): it steps down without a call
    assert not a.service.leads()
    wait_until(lambda: leader_pods(cluster, NAMESPACE) == [], what="a removes its label on stepping down")
    clock.advance(5)
    assert b.elector.step()  # the Lease expired: b wins, rebuilds its ledger, then labels its pod
    wait_until(lambda: leader_pods(cluster, NAMESPACE) == ["b"], what="the label on b")
    assert not a.elector.step() and leader_pods(cluster, NAMESPACE) == ["b"]
    assert a.readyz() == b.readyz() == (200, "ok")
    b.stop()  # as on SIGTERM: the label goes first, then the Lease
    assert leader_pods(cluster, NAMESPACE) == [] and spec(cluster)["holderIdentity"] == ""
    assert a.elector.step()
    wait_until(lambda: leader_pods(cluster, NAMESPACE) == ["a"], what="the label back on a")


def test_a_new_leader_is_labelled_only_once_a_pod_list_made_after_its_win_is_in_the_ledger(cluster, clock):
    api = KubernetesApi.from_configuration(k8s.Configuration(host=cluster.url), timeout=2.0)
    a = start(cluster, elector=elector(api, clock, "a"))
    try:
        pod = cluster.add_pod(make_pod("early", gpus=1))
        wait_until(lambda: a.state.pod(pod["metadata"]["uid"]), what="the pod in the watch")
        wait_until(lambda: a.label.labelled is False, what="a's label removed at start (a container restart keeps it)")
        lists = cluster.list_count("pods")
        cluster.hang("GET", "/api/v1/pods", watch=False)
        assert a.elector.step() and a.elector.term() == 1
        wait_until(lambda: cluster.list_count("pods") > lists, what="the relist after the win")
        assert a.readyz() == (200, "ok"), "ready: it can serve filter and prioritize"
        assert "rebuilding its GPU ledger" in a.bind(pod, "gpu-1")
        assert not a.service.leads() and leader_pods(cluster, NAMESPACE) == []
        cluster.release_hangs()  # the hung list fails; the next one rebuilds the ledger
        wait_until(lambda: leader_pods(cluster, NAMESPACE) == ["a"], what="labelled after a list succeeded")
        assert cluster.list_count("pods") == lists + 2
        assert a.bind(pod, "gpu-1") == ""
    finally:
        a.stop()


def test_a_leader_cut_off_from_the_api_server_steps_down_and_leads_again_after_a_relist(cluster):
    """In real time, with short timings: the Lease cannot be renewed, so the leader stops binding (its label
    cannot be removed while the server is down, which is safe: it refuses binds); once the API server is back
    it renews, and a new term begins with a fresh list."""
    api = KubernetesApi.from_configuration(k8s.Configuration(host=cluster.url), timeout=0.3)
    a = start(cluster, elector=LeaderElector(api, NAMESPACE, LEASE, "a", Timings(2, 1.5, 0.3)), timeout=0.3)
    try:
        a.elector.start()
        wait_until(lambda: leader_pods(cluster, NAMESPACE) == ["a"], what="a leads")
        pod = cluster.add_pod(make_pod("p", gpus=1))
        wait_until(lambda: a.state.pod(pod["metadata"]["uid"]), what="the pod in the cache")
        cluster.stop()
        wait_until(lambda: not a.service.leads(), what="a steps down")
        assert "replica a is not the leader" in a.bind(pod, "gpu-1")
        assert a.readyz() == (200, "ok"), "it still serves filter and prioritize from its cache"
        assert "gpu_topology_extender_leader 0.0" in a.client.get("/metrics").text
        lists = cluster.list_count("pods")
        cluster.start()
        wait_until(lambda: a.service.leads(), what="a leads again")
        assert a.elector.term() == 2 and cluster.list_count("pods") > lists
        assert spec(cluster)["holderIdentity"] == "a" and spec(cluster)["leaseTransitions"] == 0
        wait_until(lambda: leader_pods(cluster, NAMESPACE) == ["a"], what="a labelled")
        assert a.bind(pod, "gpu-1") == ""
    finally:
        a.stop()


class FlakyLabels:
    """A pod-label API whose first `failures` calls fail, recording every call."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, []

    def label_pod(self, namespace, name, labels):
        self.calls.append((namespace, name, dict(labels)))
        if len(self.calls) <= self.failures:
            raise KubeError("label pod: 503 unavailable", 503)


def test_the_label_is_written_only_on_a_change_and_retried_until_it_sticks():
    leads = [True]
    api = FlakyLabels(failures=2)
    label = LeaderLabel(api, NAMESPACE, "a", LEADER_LABEL, lambda: leads[0])
    assert not label.sync() and not label.sync() and label.labelled is None
    assert label.sync() and label.labelled is True
    assert label.sync() and label.sync() and len(api.calls) == 3, "no write while nothing changes"
    leads[0] = False
    assert label.sync() and label.labelled is False
    assert [c[2] for c in api.calls] == [{LEADER_LABEL: "true"}] * 3 + [{LEADER_LABEL: None}]
    assert api.calls[0][:2] == (NAMESPACE, "a")


def test_a_new_term_while_the_removal_is_retried_keeps_the_label():
    leads = [True]
    api = FlakyLabels(failures=0)
    label = LeaderLabel(api, NAMESPACE, "a", LEADER_LABEL, lambda: leads[0])
    assert label.sync() and label.labelled is True
    api.failures = 10**6
    leads[0] = False
    assert not label.sync() and label.labelled is True  # the removal failed; it is retried
    leads[0] = True  # it leads again before the removal went through: nothing left to do
    calls = len(api.calls)
    assert label.sync() and len(api.calls) == calls


def test_the_leader_label_is_under_the_annotation_prefix():
    assert AnnotationKeys().leader == LEADER_LABEL
    assert AnnotationKeys("gpu.example.com").leader == "gpu.example.com/leader"


# -- failover between two processes --------------------------------------------------------------------------

LEASE_SECONDS, RENEW_SECONDS, RETRY_SECONDS, API_SECONDS = 3, 2.0, 0.4, 0.3
FAST = ("--leader-elect-lease-duration", str(LEASE_SECONDS), "--leader-elect-renew-deadline", str(RENEW_SECONDS),
        "--leader-elect-retry-period", str(RETRY_SECONDS), "--api-timeout", str(API_SECONDS))


def replica(identity: str, server: FakeKubeApiServer, tmp: Path) -> Replica:
    return Replica(identity, server, tmp, NAMESPACE, FAST)


@pytest.fixture
def replicas(kube_server: FakeKubeApiServer, tmp_path: Path) -> Iterator[dict[str, Replica]]:
    Replica.write_seal_key(tmp_path)
    for node in ("gpu-1", "gpu-2"):
        kube_server.add_node(make_node(node, annotations=node_annotations(node)))
    started: dict[str, Replica] = {}
    yield started
    for replica in started.values():
        replica.stop()


def lease_writes(server: FakeKubeApiServer, identity: str) -> list[dict]:
    return [r.body["spec"] for r in list(server.requests) if r.method in ("POST", "PUT")
            and r.path.startswith("/apis/coordination.k8s.io/") and r.body["spec"]["holderIdentity"] == identity]


def test_failover_between_two_processes_assigns_no_gpu_twice(kube_server, replicas, tmp_path):
    replicas["a"] = a = replica("a", kube_server, tmp_path)
    wait_until(lambda: leader_pods(kube_server, NAMESPACE) == ["a"], timeout=60, what=f"replica a leads: {a.output()}")
    replicas["b"] = b = replica("b", kube_server, tmp_path)
    wait_until(lambda: b.get("/readyz") == (200, "ok"), timeout=60, what="replica b up as a ready standby")
    assert leader_pods(kube_server, NAMESPACE) == ["a"]
    assert "gpu_topology_extender_leader 1.0" in a.get("/metrics")[1]
    assert "gpu_topology_extender_leader 0.0" in b.get("/metrics")[1]

    pods = [kube_server.add_pod(make_pod(f"p{i}", gpus=2)) for i in range(9)]
    nodes = ["gpu-1", "gpu-2"]
    assert "replica b is not the leader" in b.bind(pods[0], "gpu-1")
    for i, pod in enumerate(pods[:4]):  # a binds half of the 16 GPUs
        assert a.bind(pod, nodes[i % 2]) == "", a.output()
    assert "nodeName" not in kube_server.pod("default", "p4")["spec"]

    a.process.kill()  # no release: b has to wait for the Lease to expire
    a.process.wait(10)
    killed = time.monotonic()
    wait_until(lambda: "b" in leader_pods(kube_server, NAMESPACE), timeout=60, what=f"b to take over: {b.output()}")
    print(f"failover: b labelled {time.monotonic() - killed:.1f} s after a was killed (lease {LEASE_SECONDS} s)")
    # A killed replica cannot remove its label: a Pod whose container died is not ready, so the Service drops it,
    # and a restarted container removes the label first thing. Meanwhile it could only refuse binds.
    assert leader_pods(kube_server, NAMESPACE) == ["a", "b"]
    lease = spec(kube_server)
    assert (lease["holderIdentity"], lease["leaseTransitions"]) == ("b", 1)
    last_renewal = datetime.fromisoformat(lease_writes(kube_server, "a")[-1]["renewTime"])
    assert datetime.fromisoformat(lease["acquireTime"]) - last_renewal >= timedelta(seconds=LEASE_SECONDS), \
        "b took the Lease before it expired"

    # b rebuilt its ledger from a's sealed binds: no reporter says they are used, yet b fills only the rest.
    for i, pod in enumerate(pods[4:8]):
        assert b.bind(pod, nodes[i % 2]) == "", b.output()
    assert all(b.bind(pods[8], node) != "" for node in nodes), "both nodes are full"
    for node in nodes:
        held = held_gpus(kube_server, node)
        assert len(held) == len(set(held)) == 8, f"{node}: {held}"
    assert all(GPUS_KEY in kube_server.pod("default", f"p{i}")["metadata"]["annotations"] for i in range(8))
    assert "Traceback" not in b.output()


def test_a_stopped_leader_hands_over_at_once(kube_server, replicas, tmp_path):
    replicas["a"] = a = replica("a", kube_server, tmp_path)
    wait_until(lambda: leader_pods(kube_server, NAMESPACE) == ["a"], timeout=60, what=f"replica a leads: {a.output()}")
    replicas["b"] = b = replica("b", kube_server, tmp_path)
    wait_until(lambda: b.get("/readyz") == (200, "ok"), timeout=60, what="replica b up")
    a.process.send_signal(signal.SIGTERM)
    assert a.process.wait(20) == 0, a.output()
    assert "released" in a.output()
    assert leader_pods(kube_server, NAMESPACE) == [], "a removed its label before it exited"
    wait_until(lambda: leader_pods(kube_server, NAMESPACE) == ["b"], timeout=60, what=f"b to take over: {b.output()}")
    lease = spec(kube_server)
    assert lease_writes(kube_server, ""), "a cleared the holder"
    assert lease["holderIdentity"] == "b" and lease["leaseTransitions"] == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--kubeconfig", "k"], "--leader-elect needs --seal-key-file, the key every replica shares"),
    (["--demo", "--seal-key-file", "k"], "--leader-elect needs a cluster (--kubeconfig or --in-cluster), not --demo"),
    (["--kubeconfig", "k", "--seal-key-file", "k", "--leader-elect-renew-deadline", "20"],
     "leader election needs lease duration > renew deadline > 1.2 x retry period > 0, got 15, 20.0 and 2.0"),
    (["--kubeconfig", "k", "--seal-key-file", "k", "--leader-elect-renew-deadline", "12", "--api-timeout", "1"],
     "3 x --api-timeout must be shorter than the lease duration less the renew deadline (15 - 12 s)"),
])
def test_leader_election_refuses_to_start_without_what_keeps_it_safe(argv, message, capsys):
    """Without the shared seal key, a new leader would not know its predecessor's binds that no node reported yet."""
    from extender import cli

    assert cli.main(["serve", "--leader-elect", *argv]) == 2
    assert capsys.readouterr().err == f"gpu-topology-extender: error: {message}\n"


def test_leader_election_refuses_to_start_without_its_pod_to_label(monkeypatch, tmp_path, capsys):
    from extender import cli

    Replica.write_seal_key(tmp_path)
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    monkeypatch.delenv("POD_NAME", raising=False)
    assert cli.main(["serve", "--leader-elect", "--kubeconfig", "k", "--seal-key-file",
                     str(tmp_path / "seal.key")]) == 2
    assert capsys.readouterr().err == (
        "gpu-topology-extender: error: --leader-elect needs the environment variables POD_NAME and POD_NAMESPACE "
        "(the downward API): the leader labels its own Pod so that the Service routes to it alone\n")
