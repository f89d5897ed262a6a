"""Bind throughput per node when several pods race to one node: our bind (no lock per node) against a
HAMi-style node lock, in one run on the delivery cluster (`tests/helpers/delivery_cluster.py`).

The cluster is the one the delivery acceptance test runs, all in this process: the in-process API server
(HTTP on 127.0.0.1), the real extender (watches, `ClusterState`, filter and bind through the `kubernetes`
client), and per node the kubelet stand-in, the node agent's device plugin (`--mode deliver`) and its
reporter on real unix sockets, and the kubelet's pod source, which admits the node's bound pods one at a
time (GetPreferredAllocation, Allocate, then pod-resources `List`).

Nodes and batches: 8 one-GPU pods on a DGX H100, 4 two-GPU pods on an RTX A6000 bridge-pairs board, 2
four-GPU pods on a DGX-1 V100. A batch submits every pod of the three nodes at once and ends when each pod
has been admitted with its GPUs; per node, from submission to its last pod admitted.

kube-scheduler is modelled as it runs an extender with a bind verb: scheduling cycles one at a time
(filter; with one feasible node kube-scheduler sends no prioritize), each binding cycle on its own thread;
a bind that returns an error sends the pod round a full new cycle after its backoff.

Configurations, interleaved batch by batch (their order rotated every round) so machine noise hits all:
- `ours`: the extender's bind as shipped, no lock per node; the agent's device plugin tells the pods apart
  from pod-resources `List` (topology/agent/claims.py).
- `lock+backoff`: the same bind wrapped in HAMi's node lock (below); a refused bind is retried with
  kube-scheduler's default backoff, podInitialBackoffSeconds 1 s doubling to podMaxBackoffSeconds 10 s
  (1, 2, 4, 8, 10, 10 ... s after the 1st, 2nd, ... failed attempt).
- `lock+poll`: the same lock with an idealised immediate retry: a refused pod looks at the node's lock
  annotation every 10 ms, in process and without an API call, and starts a full new cycle as soon as the
  lock is free. No backoff and almost no retry cost: what remains is the serialisation itself.

HAMi's node lock, as modelled (Project-HAMi/HAMi pkg/util/nodelock/nodelock.go, pkg/scheduler/scheduler.go
`Bind`, pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go `Allocate` and plugin/util.go
`PodAllocationTrySuccess`); written from that behaviour, not from its code:
- bind: GET the pod, GET the node; `LockNode`: GET the node; if it carries `hami.io/mutex.lock`, the bind
  fails ("node ... has been locked within 5m0s"), unless the lock is older than 5 minutes or its holder pod
  is gone (a GET of that pod); otherwise `SetNodeLock`, under a per-node mutex of the scheduler process:
  GET the node (refused if locked meanwhile), then GET and merge-PATCH
  `{"metadata":{"annotations":{"hami.io/mutex.lock":"<RFC3339 now>,<namespace>,<pod>"},"resourceVersion":…}}`,
  retried on any error (client-go `retry.OnError`, 5 steps from 100 ms, factor 2, jitter 0.5). Then the
  extender's real bind (a Binding); if it fails, the lock is released at once.
- release: by the device plugin, after Allocate for that pod succeeded (here: when the kubelet stand-in has
  admitted the pod, on the pod source's thread before it admits the next pod, as HAMi's Allocate does it
  before answering): GET the node; only if the lock names this pod, GET and merge-PATCH the annotation to
  null with the node's resourceVersion, retried likewise.

Checked in every batch of every configuration, or the run fails without writing: each pod admitted, each
container given exactly the GPUs annotated for it (`gpu-topology.io/containers`) by the kubelet and by
pod-resources `List`, no GPU in two live containers, no allocation mismatch in the extender, the lock
released at the end of a batch, and every GPU free again before the next batch.

    python loadtests/bind_throughput.py [--rounds 3] [--delays 0,0.15] [--max-seconds 360] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import datetime
import logging
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import kubernetes.client as k8s
import orjson
from kubernetes.client.exceptions import ApiException

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))  # the packages, not tests/'s folders of their names

from helpers import kube_api_server  # noqa: E402
from bench_select import percentile, run_header, write_section  # noqa: E402
from helpers.delivery_cluster import GPU, KEYS, Admitted, DeliveryCluster, NodeRig, gpu_pod  # noqa: E402
from extender.api.wire import BindingArgs, parse_extender_args  # noqa: E402
from helpers.reporter_fakes import short_tmpdir  # noqa: E402

BEGIN, END = "<!-- bind_throughput:begin -->", "<!-- bind_throughput:end -->"
NODES = (("h100", "dgx-h100"), ("a6000", "rtx-a6000-pairs"), ("v100", "dgx1-v100"))
BATCH = {"h100": (8, 1), "a6000": (4, 2), "v100": (2, 4)}  # node -> (pods, GPUs each)
BOARD = {"h100": "DGX H100", "a6000": "RTX A6000 pairs", "v100": "DGX-1 V100"}
CONFIGS = ("ours", "lock+backoff", "lock+poll")
NAMESPACE = "jobs"

LOCK_KEY = "hami.io/mutex.lock"
LOCK_EXPIRY = 300.0  # HAMi's NodeLockTimeout, 5 minutes
RETRY_STEPS, RETRY_FIRST, RETRY_FACTOR, RETRY_JITTER = 5, 0.1, 2.0, 0.5  # HAMi's nodelock.DefaultStrategy
BACKOFF_INITIAL, BACKOFF_MAX = 1.0, 10.0  # kube-scheduler's podInitialBackoffSeconds, podMaxBackoffSeconds
POLL = 0.01
MERGE_PATCH = "application/merge-patch+json"


# -- the API as HAMi's two processes use it -----------------------------------------------------------------

class Api:
    """GET and merge-PATCH through the official client, JSON parsed with orjson (not the client's slow model
    classes, so the baseline pays API round trips, not Python deserialisation); counts its calls."""

    def __init__(self, url: str) -> None:
        self.core = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=url)))
        self.calls = 0
        self.conflicts = 0
        self._count = threading.Lock()

    def _tick(self) -> None:
        with self._count:
            self.calls += 1

    def node(self, name: str) -> dict:
        self._tick()
        return orjson.loads(self.core.read_node(name, _preload_content=False).data)

    def pod(self, namespace: str, name: str) -> dict | None:
        self._tick()
        try:
            return orjson.loads(self.core.read_namespaced_pod(name, namespace, _preload_content=False).data)
        except ApiException as error:
            if error.status == 404:
                return None
            raise

    def patch_node(self, name: str, body: dict) -> None:
        self._tick()
        try:
            self.core.patch_node(name, body, _content_type=MERGE_PATCH, _preload_content=False).data
        except ApiException as error:
            if error.status == 409:
                with self._count:
                    self.conflicts += 1
            raise


def _retry_on_error(attempt: Callable[[], None]) -> Exception | None:
    """client-go retry.OnError with HAMi's DefaultStrategy: up to 5 tries, sleeping 100 ms x 2^i, +0-50%."""
    delay = RETRY_FIRST
    for step in range(RETRY_STEPS):
        try:
            attempt()
            return None
        except Exception as error:  # HAMi retries on any error
            if step == RETRY_STEPS - 1:
                return error
            time.sleep(delay * (1 + RETRY_JITTER * random.random()))
            delay *= RETRY_FACTOR
    return None


def _annotations(node: dict) -> dict[str, str]:
    return (node.get("metadata") or {}).get("annotations") or {}


class NodeLock:
    """HAMi's node lock: taken by the scheduler's bind, released by the device plugin after Allocate."""

    def __init__(self, url: str) -> None:
        self.scheduler = Api(url)  # the scheduler extender's client
        self.plugin = Api(url)  # the device plugins' client (one per node in HAMi; here one, same calls)
        self._mutexes: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()
        self.refusals = 0
        self.failures: list[str] = []

    def _mutex(self, side: str, node: str) -> threading.Lock:
        with self._guard:
            return self._mutexes.setdefault((side, node), threading.Lock())

    def lock(self, node: str, namespace: str, pod: str) -> str:
        """LockNode: "" when this pod now holds the node's lock, else the error kube-scheduler sees."""
        value = _annotations(self.scheduler.node(node)).get(LOCK_KEY)
        if value is None:
            return self._set(node, namespace, pod)
        held_since, holder_namespace, holder = _parse_lock(value)
        expired = time.time() - held_since > LOCK_EXPIRY
        dangling = False
        if not expired and holder and (holder_namespace, holder) != (namespace, pod):
            dangling = self.scheduler.pod(holder_namespace, holder) is None
        if expired or dangling:
            self.release(node, namespace, pod, owner_check=False, api=self.scheduler, side="scheduler")
            return self._set(node, namespace, pod)
        self._refused()
        return f"node {node} has been locked within 5m0s"

    def _set(self, node: str, namespace: str, pod: str) -> str:
        with self._mutex("scheduler", node):
            if LOCK_KEY in _annotations(self.scheduler.node(node)):
                self._refused()
                return f"node {node} is locked"
            value = f"{_rfc3339()},{namespace},{pod}"

            def patch() -> None:
                current = self.scheduler.node(node)
                self.scheduler.patch_node(node,
                                          {"metadata": {"annotations": {LOCK_KEY: value},
                                                        "resourceVersion": current["metadata"]["resourceVersion"]}})
            error = _retry_on_error(patch)
        return "" if error is None else f"failed to set node lock (node={node}): {error}"

    def release(self, node: str, namespace: str, pod: str, *, owner_check: bool = True, api: Api | None = None,
                side: str = "plugin") -> None:
        """ReleaseNodeLock: removes the lock if it names this pod (or unconditionally without owner_check)."""
        api = api or self.plugin
        with self._mutex(side, node):
            value = _annotations(api.node(node)).get(LOCK_KEY)
            if value is None or (owner_check and not value.endswith(f",{namespace},{pod}")):
                return

            def patch() -> None:
                current = api.node(node)
                api.patch_node(node, {"metadata": {"annotations": {LOCK_KEY: None},
                                                   "resourceVersion": current["metadata"]["resourceVersion"]}})
            error = _retry_on_error(patch)
            if error is not None:
                self.failures.append(f"release of {node} for {namespace}/{pod}: {error}")

    def _refused(self) -> None:
        with self._guard:
            self.refusals += 1


def listen_overflows() -> int | None:
    """The kernel's count of connections dropped for a full listen backlog (machine-wide), if readable."""
    try:
        lines = [line.split() for line in Path("/proc/net/netstat").read_text().splitlines()
                 if line.startswith("TcpExt:")]
        return int(dict(zip(lines[0], lines[1]))["ListenOverflows"])
    except (OSError, KeyError, IndexError, ValueError):
        return None


def _rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_lock(value: str) -> tuple[float, str, str]:
    parts = value.split(",")
    stamp = datetime.datetime.strptime(parts[0], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc)
    return stamp.timestamp(), (parts[1] if len(parts) == 3 else ""), (parts[2] if len(parts) == 3 else "")


# -- one pod's way through kube-scheduler, and a batch ---------------------------------------------------------

@dataclass
class PodRun:
    name: str
    node: str
    gpus: int
    pod: dict
    submitted: float = 0.0
    bound: float | None = None  # the bind that succeeded returned
    admitted: float | None = None  # the kubelet admitted it with its GPUs
    attempts: int = 0  # scheduling cycles
    bind_calls: list[float] = field(default_factory=list)  # seconds per bind request, failed ones included
    rejected: int = 0  # filter found no room (should not happen: counted and reported)
    reasons: list[str] = field(default_factory=list)  # filter's reasons for those
    error: str = ""


@dataclass
class BatchResult:
    config: str
    delay: float
    round: int
    pods: list[PodRun]
    makespan: dict[str, float]  # node -> submission to its last pod admitted, seconds
    lock_calls: int = 0
    lock_conflicts: int = 0
    refusals: int = 0


class _Count(logging.Handler):
    """Counts the extender's reflector warnings (a watch that broke and was opened again)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rewatches = _Count()
        logging.getLogger("extender.kube.reflector").addHandler(self.rewatches)
        # Go's net/http, so kube-apiserver, sets TCP_NODELAY on every connection; Python's http.server does not,
        # and then each answer (headers, then body) waits ~40 ms for the client's delayed ACK on loopback.
        kube_api_server._Handler.disable_nagle_algorithm = True
        # Go listens with the kernel's somaxconn; socketserver's backlog of 5 overflows when a batch's binds open
        # connections at once, and a dropped SYN is sent again only after 1 s.
        kube_api_server._Server.request_queue_size = 4096
        self.cluster = DeliveryCluster(short_tmpdir(), NODES, on_admitted=self._on_admitted)
        self.lock = NodeLock(self.cluster.server.url)
        self.cycle = threading.Lock()  # kube-scheduler runs one scheduling cycle at a time
        self.config = "ours"
        self.runs: dict[str, PodRun] = {}  # uid -> run, for the batch in flight
        self.done = threading.Condition()
        self.callback_errors: list[str] = []

    # The kubelet's pod source calls this on its own thread, right after admitting a pod.
    def _on_admitted(self, rig: NodeRig, entry: Admitted) -> None:
        now = time.monotonic()
        try:
            meta = entry.pod["metadata"]
            run = self.runs.get(meta["uid"])
            if run is not None and self.config != "ours":
                # HAMi: Allocate succeeded for the pod's last container -> the device plugin releases the lock.
                self.lock.release(rig.name, meta["namespace"], meta["name"])
            with self.done:
                if run is not None:
                    run.admitted = now
                self.done.notify_all()
        except Exception as error:  # a dying pod source would hang the batch; fail the run instead
            self.callback_errors.append(f"{rig.name}: {error!r}")

    def bind(self, run: PodRun, node: str) -> str:
        meta = run.pod["metadata"]
        args = BindingArgs(meta["name"], meta["namespace"], meta["uid"], node)
        if self.config == "ours":
            return self.cluster.service.bind(args)
        self.lock.scheduler.pod(meta["namespace"], meta["name"])  # HAMi's Bind: GET the pod, GET the node
        self.lock.scheduler.node(node)
        refused = self.lock.lock(node, meta["namespace"], meta["name"])
        answer = refused or self.cluster.service.bind(args)
        if answer:  # HAMi's Bind releases on any failure, a refused lock too (then a GET that finds another owner)
            self.lock.release(node, meta["namespace"], meta["name"], api=self.lock.scheduler, side="scheduler")
        return answer

    def place(self, run: PodRun, deadline: float) -> None:
        """Scheduling cycles until bound: filter (one candidate node, so no prioritize), then bind."""
        body = orjson.dumps({"Pod": run.pod, "NodeNames": [run.node]})
        while time.monotonic() < deadline:
            run.attempts += 1
            with self.cycle:
                outcome = self.cluster.service.filter(parse_extender_args(body))
            if run.node not in outcome.passed:
                run.rejected += 1
                failed, unresolvable = outcome.reasons()
                run.reasons.append(failed.get(run.node) or unresolvable.get(run.node) or "no answer")
                time.sleep(POLL)
                continue
            started = time.monotonic()
            answer = self.bind(run, run.node)
            run.bind_calls.append(time.monotonic() - started)
            if answer == "":
                run.bound = time.monotonic()
                return
            run.error = answer
            if self.config != "lock+poll":  # kube-scheduler: a bind error sends the pod to the error backoff queue
                time.sleep(min(BACKOFF_INITIAL * 2 ** (run.attempts - 1), BACKOFF_MAX))
            else:  # lock+poll: retry once the lock is gone, seen in process every 10 ms
                while time.monotonic() < deadline and LOCK_KEY in _annotations(self.cluster.server.node(run.node)):
                    time.sleep(POLL)
        run.error = f"not bound before the batch deadline (last answer: {run.error or 'none'})"

    def batch(self, config: str, delay: float, round_: int) -> BatchResult:
        server, cluster = self.cluster.server, self.cluster
        self.config = config
        cluster.admit_delay = delay
        lock_calls = self.lock.scheduler.calls + self.lock.plugin.calls
        conflicts = self.lock.scheduler.conflicts + self.lock.plugin.conflicts
        refusals = self.lock.refusals
        runs: list[PodRun] = []
        tag = {"ours": "o", "lock+backoff": "b", "lock+poll": "p"}[config]
        for node, (count, gpus) in BATCH.items():
            for i in range(count):
                name = f"{tag}{round_}-{int(delay * 1000)}-{node}-{i}"
                created = server.add_pod(gpu_pod(name, "one", gpus))
                runs.append(PodRun(name, node, gpus, created))
        with self.done:
            self.runs = {run.pod["metadata"]["uid"]: run for run in runs}
        start = time.monotonic()
        deadline = start + self.args.batch_timeout
        threads = [threading.Thread(target=self.place, args=(run, deadline), daemon=True, name=run.name)
                   for run in runs]
        for run in runs:
            run.submitted = start
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()) + 1)
        with self.done:
            self.done.wait_for(lambda: all(run.admitted is not None for run in runs) or self.callback_errors,
                               max(0.0, deadline - time.monotonic()) + 1)
        result = BatchResult(config, delay, round_, runs, {
            node: max((run.admitted or float("inf")) for run in runs if run.node == node) - start for node in BATCH},
            self.lock.scheduler.calls + self.lock.plugin.calls - lock_calls,
            self.lock.scheduler.conflicts + self.lock.plugin.conflicts - conflicts, self.lock.refusals - refusals)
        self.verify(result)
        self.clean(runs)
        return result

    def verify(self, result: BatchResult) -> None:
        """Every pod admitted with exactly its annotated GPUs; otherwise the run stops here, loudly."""
        problems = list(self.callback_errors) + list(self.lock.failures)
        admitted: dict[str, Admitted] = {}
        for entry in self.cluster.admitted():
            admitted[entry.pod["metadata"]["uid"]] = entry
        held: dict[str, set[str]] = {node: set() for node in BATCH}
        for run in result.pods:
            label = f"{result.config} round {result.round} delay {result.delay:g}s {run.name}"
            entry = admitted.get(run.pod["metadata"]["uid"])
            if run.bound is None or run.admitted is None or entry is None:
                problems.append(f"{label}: bound={run.bound is not None} admitted={run.admitted is not None} "
                                f"{run.error}")
                continue
            if not entry.admission.admitted:
                problems.append(f"{label}: admission refused: {entry.admission.message}")
                continue
            annotation = entry.pod["metadata"].get("annotations", {}).get(KEYS.containers)
            planned = {name: set(ids) for name, ids in orjson.loads(annotation or "{}").items()}
            got = {c.name: set(c.devices.get(GPU, ())) for c in entry.admission.containers}
            listed = {name: set(ids) for name, ids in entry.listed.items() if ids}
            if not planned or got != planned or listed != planned:
                problems.append(f"{label}: annotated {planned}, the kubelet gave {got}, List shows {listed}")
            gpus = set().union(*got.values()) if got else set()
            if len(gpus) != run.gpus or gpus & held[run.node]:
                problems.append(f"{label}: {sorted(gpus)} is not {run.gpus} GPUs of its own on {run.node}")
            held[run.node] |= gpus
        for rig in self.cluster.rigs.values():
            if rig.shared:
                problems.append(f"{rig.name}: a GPU in two live containers: {rig.shared}")
            if LOCK_KEY in _annotations(self.cluster.server.node(rig.name)):
                problems.append(f"{rig.name}: the node lock is still held after the batch")
        mismatches = sum(sample.value for metric in self.cluster.service.metrics.mismatches.collect()
                         for sample in metric.samples if sample.name.endswith("_total"))
        if mismatches:
            problems.append(f"the extender counted {mismatches:g} allocation mismatches")
        if problems:
            raise SystemExit("bind_throughput: a wrong result, nothing written:\n  " + "\n  ".join(problems))

    def clean(self, runs: list[PodRun]) -> None:
        with self.done:
            self.runs = {}
        for run in runs:
            self.cluster.server.delete_pod(NAMESPACE, run.name)
        # Settled: nothing reserved, and the extender has seen a report in which the kubelet holds no GPU (the
        # pod source drops deleted pods on its next pass; a report taken before that still shows them used).
        state = self.cluster.state
        self.cluster.wait(lambda: len(state.ledger) == 0 and all(
            view.free == view.compiled.full_mask and not view.reported_used for view in state.views().values()),
            30, "every GPU free again")

    def close(self) -> None:
        self.cluster.close()


# -- figures ---------------------------------------------------------------------------------------------------

@dataclass
class Row:
    delay: float
    node: str
    config: str
    rates: list[float]  # pods/s per batch
    makespans: list[float]
    to_bound: list[float]  # seconds, submission -> successful bind returned
    to_gpus: list[float]  # seconds, submission -> admitted with its GPUs
    bind_call: list[float]  # seconds, the successful bind request alone
    attempts: list[int]
    refused: int
    rejected: int

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)


def rows(results: list[BatchResult], delays: Sequence[float]) -> list[Row]:
    out = []
    for delay in delays:
        for node in BATCH:
            for config in CONFIGS:
                batches = [b for b in results if b.delay == delay and b.config == config]
                pods = [run for b in batches for run in b.pods if run.node == node]
                if not pods:
                    continue
                out.append(Row(delay, node, config,
                               [BATCH[node][0] / b.makespan[node] for b in batches],
                               [b.makespan[node] for b in batches],
                               [run.bound - run.submitted for run in pods],  # type: ignore[operator]
                               [run.admitted - run.submitted for run in pods],  # type: ignore[operator]
                               [run.bind_calls[-1] for run in pods],
                               [run.attempts for run in pods],
                               sum(len(run.bind_calls) - 1 for run in pods),
                               sum(run.rejected for run in pods)))
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}" if seconds >= 0.1 else f"{seconds * 1000:.1f}"


def _delay(delay: float) -> str:
    return "in-process (0 ms)" if delay == 0 else f"{delay * 1000:.0f} ms"


def table(all_rows: list[Row]) -> list[str]:
    lines = ["| kubelet delay | node | batch | config | pods/s (median; min-max) | batch s (median) | "
             "to bound p50 / p99 ms | to GPUs p50 / p99 ms | bind call p50 / p99 ms | cycles per pod (mean; max) | "
             "refused binds |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in all_rows:
        count, gpus = BATCH[row.node]
        lines.append(
            f"| {_delay(row.delay)} | {BOARD[row.node]} | {count} x {gpus} GPU | {row.config} | "
            f"{row.rate:.2f} ({min(row.rates):.2f}-{max(row.rates):.2f}) | {statistics.median(row.makespans):.2f} | "
            f"{_ms(percentile(row.to_bound, 0.5))} / {_ms(percentile(row.to_bound, 0.99))} | "
            f"{_ms(percentile(row.to_gpus, 0.5))} / {_ms(percentile(row.to_gpus, 0.99))} | "
            f"{_ms(percentile(row.bind_call, 0.5))} / {_ms(percentile(row.bind_call, 0.99))} | "
            f"{statistics.mean(row.attempts):.1f}; {max(row.attempts)} | {row.refused} |")
    return lines


def ratios(all_rows: list[Row], delays: Sequence[float]) -> list[str]:
    lines = ["| kubelet delay | node | pods/s, ours over lock+backoff | ours over lock+poll | "
             "to bound p50, lock+backoff over ours | lock+poll over ours | to bound p99, lock+backoff over ours | "
             "lock+poll over ours |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    by = {(r.delay, r.node, r.config): r for r in all_rows}
    for delay in delays:
        for node in BATCH:
            ours, backoff, poll = (by.get((delay, node, c)) for c in CONFIGS)
            if ours is None or backoff is None or poll is None:
                continue
            p50 = {c: percentile(by[(delay, node, c)].to_bound, 0.5) for c in CONFIGS}
            p99 = {c: percentile(by[(delay, node, c)].to_bound, 0.99) for c in CONFIGS}
            lines.append(f"| {_delay(delay)} | {BOARD[node]} | {ours.rate / backoff.rate:.1f}x | "
                         f"{ours.rate / poll.rate:.2f}x | {p50['lock+backoff'] / p50['ours']:.1f}x | "
                         f"{p50['lock+poll'] / p50['ours']:.1f}x | {p99['lock+backoff'] / p99['ours']:.1f}x | "
                         f"{p99['lock+poll'] / p99['ours']:.1f}x |")
    return lines


def summary(all_rows: list[Row], delays: Sequence[float]) -> list[str]:
    by = {(r.delay, r.node, r.config): r for r in all_rows}
    lines = []
    for node in BATCH:
        parts = []
        for delay in delays:
            ours, backoff, poll = (by.get((delay, node, c)) for c in CONFIGS)
            if ours and backoff and poll:
                each = statistics.median(poll.makespans) / BATCH[node][0] * 1000
                cost = statistics.median(poll.makespans) - statistics.median(ours.makespans)
                parts.append(f"kubelet delay {_delay(delay)}: ours {ours.rate:.2f} pods/s, lock+poll {poll.rate:.2f} "
                             f"({ours.rate / poll.rate:.2f}x; one pod per {each:.0f} ms, {cost:.2f} s more per "
                             f"batch), lock+backoff {backoff.rate:.2f} ({ours.rate / backoff.rate:.1f}x)")
        count, gpus = BATCH[node]
        if parts:
            lines.append(f"- {BOARD[node]}, {count} pods of {gpus} GPU{'s' if gpus > 1 else ''}: "
                         + "; ".join(parts) + ".")
    return lines


def growth(all_rows: list[Row], delays: Sequence[float]) -> list[str]:
    by = {(r.delay, r.node, r.config): r for r in all_rows}
    ordered = sorted(delays)
    lines = []
    for node in BATCH:
        costs = {}
        for delay in ordered:
            ours, poll = by.get((delay, node, "ours")), by.get((delay, node, "lock+poll"))
            if ours and poll:
                costs[delay] = statistics.median(poll.makespans) - statistics.median(ours.makespans)
        if len(costs) < 2:
            continue
        n = BATCH[node][0]
        first, last = min(costs), max(costs)
        lines.append(f"- {BOARD[node]} (n = {n}): " + ", ".join(f"{costs[d]:+.2f} s at {_delay(d)}" for d in costs)
                     + f"; measured change {costs[last] - costs[first]:+.2f} s, "
                       f"model {(n - 1) * (last - first):+.2f} s.")
    return lines


def section(args: argparse.Namespace, argv: Sequence[str] | None, elapsed: float, results: list[BatchResult],
            all_rows: list[Row], bench_rewatches: int, overflows: str) -> str:
    rounds = max(b.round for b in results) + 1
    calls = []
    for config in CONFIGS[1:]:
        batches = [b for b in results if b.config == config]
        count = sum(len(b.pods) for b in batches)
        calls.append(f"{config} {sum(b.lock_calls for b in batches) / max(count, 1):.1f} per pod "
                     f"({sum(b.refusals for b in batches)} refusals)")
    conflicts = sum(b.lock_conflicts for b in results)
    pods = sum(len(b.pods) for b in results)
    lines = run_header("Bind throughput per node: no lock against a node lock", "bind_throughput.py", argv,
                       elapsed, "; everything in one process (the API server on 127.0.0.1, unix sockets)")
    lines += [
        "- Cluster: `tests/helpers/delivery_cluster.py`: the in-process API server, the real extender (watches, "
        "filter, bind through the `kubernetes` client), and per node the kubelet stand-in, the agent's device plugin "
        "(`--mode deliver`) and reporter on unix sockets, and a pod source that admits the node's bound pods one "
        "at a time. The kubelet delay holds each bound pod back that long before the pod source sees it (the "
        "real kubelet's watch and sync loop); in-process it sees it within its 10 ms poll.",
        f"- Batches: all at once, {', '.join(f'{c} x {g}-GPU pods on the {BOARD[n]}' for n, (c, g) in BATCH.items())}; "
        "per node, from submission to its last pod admitted with its GPUs. kube-scheduler modelled: one scheduling "
        "cycle at a time (filter; one feasible node, so no prioritize), each bind on its own thread, a refused bind "
        "retried by a full new cycle.",
        f"- Rounds: {rounds}; in each, for each kubelet delay ({', '.join(_delay(d) for d in args.delays)}), one "
        f"batch per configuration, their order rotated every round, so all three meet the same machine; "
        f"{len(results)} batches, {pods} pods. Percentiles nearest-rank over every pod of the rounds "
        f"({rounds * 8} pods per H100 row, {rounds * 2} per DGX-1 row: p99 is the slowest pod).",
        "- Configurations: **ours**, the extender's bind with no lock per node (the device plugin tells the pods "
        "apart from pod-resources `List`); **lock+backoff**, the same bind inside HAMi's node lock, a refused bind "
        f"retried with kube-scheduler's default backoff ({BACKOFF_INITIAL:g} s doubling to {BACKOFF_MAX:g} s); "
        "**lock+poll**, the same lock with an idealised retry: a refused pod checks the lock annotation every "
        "10 ms in process (no API call) and retries as soon as it is free, which leaves the serialisation alone.",
        "- The lock, as HAMi does it (Project-HAMi/HAMi `pkg/util/nodelock/nodelock.go`, `pkg/scheduler/scheduler.go` "
        "`Bind`, the device plugin's `Allocate` and `PodAllocationTrySuccess`): bind GETs the pod and the node; "
        f"`LockNode` GETs the node and refuses while `{LOCK_KEY}` is set (unless older than 5 min or its pod is "
        "gone); `SetNodeLock` GETs it again and merge-PATCHes the annotation `<RFC3339>,<namespace>,<pod>` with the "
        "node's resourceVersion (retried: 5 steps from 100 ms, x2, jitter 0.5); then the real bind. The device "
        "plugin releases it after the pod's Allocate: GET the node, and if the lock names the pod, merge-PATCH it "
        "to null with the resourceVersion. Here the release runs when the kubelet stand-in has admitted the pod, "
        "before it admits the next. "
        f"API calls of HAMi's bind and lock (GET pod, GET node, PATCH node; the Binding not counted): "
        f"{'; '.join(calls)}; lock PATCHes refused by a resourceVersion conflict (the reporter patches the same "
        f"node) and retried: {conflicts}.",
        "- Checked in every batch of every configuration (the run fails and writes nothing otherwise): each pod "
        "admitted, each container given exactly its annotated GPUs by the kubelet and by pod-resources `List`, "
        "no GPU in two live containers, no allocation mismatch, the lock released, every GPU free before the "
        "next batch. All passed.",
        "",
        "### Summary (pods/s per node, median batch; ratios are ours over the baseline, from the same run)",
        "",
        *summary(all_rows, args.delays),
        "",
        "Reading: without a lock the pods of a node bind at once and the kubelet admits them back to back, so a "
        "batch of n pods takes about one kubelet delay d plus n admissions a. With the lock each pod waits for "
        "the previous one's whole path, bind to Allocate: n x (d + a + the lock's calls) even with the ideal "
        "retry. The lock's cost is therefore about (n - 1) x d plus its calls, growing with the time from bind to "
        "Allocate and with the pods racing to a node (the ratio tends to n as d grows); with kube-scheduler's "
        "backoff the retry waves, not the node, set the pace. Measured, lock+poll's extra time per batch over "
        "ours (medians), against that model's growth (n - 1) x (change in d):",
        "",
        *growth(all_rows, args.delays),
        "",
        "### Per node and configuration",
        "",
        "To bound: submission to the successful bind returning, as kube-scheduler sees it (failed binds and "
        "backoff included). To GPUs: submission to the kubelet having admitted the pod with its GPUs. Bind call: the "
        "successful bind request alone (with the lock: the GETs, the lock's PATCH and the Binding). Refused binds: "
        "binds that found the node locked.",
        "",
        *table(all_rows),
        "",
        "### Ratios, measured side by side in this run",
        "",
        *ratios(all_rows, args.delays),
        "",
        "### Caveats",
        "",
        "- Everything shares one Python process on this machine: the API server, the extender, three kubelet "
        "stand-ins, plugins and reporters, and the three nodes' batches run at the same time. Absolute times are "
        "this machine's; the ratios compare configurations under the same load.",
        "- The baseline is HAMi's lock around our bind, not HAMi itself: it omits HAMi's other writes per pod "
        "(the `bind-phase` pod patches before bind and after Allocate, the GET of the pod in "
        "`PodAllocationTrySuccess`) and kube-scheduler's status update and Event on each failed bind, all of which "
        "would cost the baseline more. The backoff is the nominal 1, 2, 4, 8, 10 s; the real kube-scheduler v1.36 "
        "whose requests `tests/fixtures/kube-scheduler/` holds (scenario 7) retried an erroring pod about 1 s later "
        "than that on every gap after the first, so lock+backoff is, if anything, flattered.",
        "- Pods refused by the lock fail at about the same moment, so with the backoff they retry in waves. A wave "
        "lets one pod through, or a few when the holder is admitted before the wave's last retry is scheduled "
        "(the in-process kubelet); cycles per pod in the table count the waves. After k refusals a pod has waited "
        "1+2+4+... s, capped at 10 s a step: 45 s after seven.",
        "- The in-process API server answers a GET in about 0.5 ms and a PATCH in about 1 ms; a real kube-apiserver "
        "commits each PATCH to etcd, so the lock's two writes per pod would cost more there. The run sets "
        "TCP_NODELAY on the test API server's connections, as Go's net/http does on every connection: without it "
        "Python's http.server makes each answer wait ~40 ms for a delayed ACK, which would have charged the lock's "
        "extra calls (and our own bind) for an artefact of the test server. Likewise its listen backlog is raised "
        "from socketserver's 5 (Go listens with the kernel's somaxconn): a batch's binds open connections at once, "
        "and an overflowing backlog drops a SYN that is sent again only after 1 s. Connections the kernel dropped "
        f"for a full listen backlog during the run (machine-wide): {overflows}.",
    ] + ([f"- The extender's reflectors logged {bench_rewatches} broken watches during the run (a new watch "
          "request that failed and was retried after the reflector's ~0.2 s backoff), each a pause in the "
          "extender's events in whichever configuration ran then."] if bench_rewatches else [])
    return "\n".join(lines)


def report(results: list[BatchResult], delays: Sequence[float]) -> list[Row]:
    all_rows = rows(results, delays)
    print("\n".join(summary(all_rows, delays)))
    print()
    print("\n".join(table(all_rows)))
    print()
    print("\n".join(ratios(all_rows, delays)))
    return all_rows


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every configuration and delay once")
    parser.add_argument("--delays", default="0,0.15",
                        help="kubelet reaction delays in seconds, comma-separated (default 0,0.15)")
    parser.add_argument("--max-seconds", type=float, default=360.0,
                        help="start no further round once the run would exceed this (default 360)")
    parser.add_argument("--batch-timeout", type=float, default=120.0,
                        help="a batch fails if a pod is not admitted by then (default 120 s)")
    parser.add_argument("--write", type=Path, metavar="BENCHMARKS.md", help="rewrite this script's section there")
    args = parser.parse_args(argv)
    args.delays = [float(d) for d in args.delays.split(",") if d.strip()]
    if not args.delays or any(d < 0 or d > 2 for d in args.delays) or not 1 <= args.rounds <= 20:
        parser.error("delays must be 0-2 s, rounds 1-20")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    before = listen_overflows()
    bench = Bench(args)
    results: list[BatchResult] = []
    try:
        round_seconds = 0.0
        for round_ in range(args.rounds):
            if round_ and time.monotonic() - began + round_seconds > args.max_seconds:
                print(f"stopping after {round_} rounds: another would pass --max-seconds {args.max_seconds:g}")
                break
            round_began = time.monotonic()
            delays = args.delays if round_ % 2 == 0 else list(reversed(args.delays))
            for index, delay in enumerate(delays):
                shift = (round_ + index) % len(CONFIGS)
                for config in CONFIGS[shift:] + CONFIGS[:shift]:
                    result = bench.batch(config, delay, round_)
                    print(f"round {round_} delay {_delay(delay)} {config:13s} " + "  ".join(
                        f"{node} {BATCH[node][0] / result.makespan[node]:6.2f} pods/s" for node in BATCH), flush=True)
                    results.append(result)
            round_seconds = time.monotonic() - round_began
    finally:
        bench.close()
    elapsed = time.monotonic() - began
    after = listen_overflows()
    print()
    all_rows = report(results, args.delays)
    if args.write:
        overflows = "unknown" if before is None or after is None else str(after - before)
        write_section(args.write, section(args, argv, elapsed, results, all_rows, bench.rewatches.count, overflows),
                      BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
