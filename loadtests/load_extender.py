"""Load test: filter, prioritize and bind over HTTP against the real extender server on a large cluster, with
a floor that answers through the extender's serving path with none of its work, in one run (DESIGN.md §9).

Three processes besides this one (five with plans and DRA nodes, as by default), all on 127.0.0.1:
- the extender: `loadtests/large_cluster_server.py` (`extender.server.app.create_app` on a DemoCluster of N nodes
  with a share of its GPUs taken and Topograph's network labels, its state built with those levels, uvicorn,
  one worker);
- with `--plans N` (1,000 by default), a second extender built alike that then plans N groups before serving,
  so N group plans hold their open slots against every other pod (issue 17);
- with `--dra-share S` (0.5 by default), one more extender built alike but with that share of its nodes DRA nodes,
  its fill's GPUs there held by claims (`large_cluster_server.py --dra-share`), sent DRA pods (issue 30);
- the floor: `loadtests/floor_server.py` (the extender's server and protocol, its answers' shape and serializers:
  filter passes every name, prioritize leaves out one host in five, as the extender leaves out its least scored);
- the load generator: this script's `client` command, in its own interpreter, playing kube-scheduler: one
  keep-alive connection per server with TCP_NODELAY (as Go's net/http has), one request at a time.

Phases, every one bounded in count and in time:
0. with plans: the 5,000-name latency phase on both extenders, from the same fill with the same pods, in rounds
   alternating between them (which goes first alternates too), so drift on the shared machine meets both, with
   prioritize on every candidate name; server-side p50 and p99 with plans over without, against issue 17's
   10 %; then a few seconds of cProfile (as in 3.) on each, at the same point. The other phases run on the
   extender without plans only (every phase twice would double the run);
0b. with DRA nodes: the same alternating rounds between the extender without DRA nodes (the load's pods) and the
   one with them (DRA pods: claim-template pods and `nvidia.com/gpu` pods, bound after kube-scheduler's DRA
   PreBind where the node is a DRA node); server-side p99 of filter and prioritize with DRA nodes against issue
   30's 1 ms: the run exits 1 on a miss;
0c. with DRA nodes, claim-only routing's cost: on the extender with DRA nodes, filter and prioritize at 5,000 names
   for pods that ask no GPU and for GPU pods, in alternating rounds: the server's CPU per pod (from /proc) and its
   verbs' p50 and p99, side by side;
1. latency, for each size (100, 1,000, 5,000 candidate names): warm-up cycles, then cycles of filter,
   prioritize (on the names that passed) and bind (on the first top-scored node), each followed by the same
   filter and prioritize bodies sent to the floor. Per request: the HTTP time seen by the client (send to last
   byte read) and, for the extender, the verb's own time from its `Server-Timing` header. Below 5,000, the
   candidate names are a window moved along the cluster's names from one cycle to the next.
2. sustained: full cycles back to back, for a fixed time, with 5,000 and with 100 names; cycles/s (only cycles
   that bound their pod count), and the CPU time each process and the rest of the machine used meanwhile (from
   /proc);
3. profile: a few more seconds of 5,000-name cycles with cProfile on the extender's event-loop thread and on
   its filter and prioritize, to show where its time goes (after the measured phases, which it would slow
   down).

The run exits 1 when it misses a target (Report.checks: a target it did not measure is missed), or met an error
answer (filter's Error, PreBind's or bind's) or an error the extenders logged (prioritize answers a failure with no
Error field).

    python loadtests/load_extender.py [--plans 1000] [--dra-share 0.5] [--write BENCHMARKS.md]
"""

from __future__ import annotations

import argparse
import gc
import http.client
import itertools
import json
import math
import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Any

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_select import Check, load_average, missed, percentile, run_header, verdict, write_section  # noqa: E402
from large_cluster_server import (CLAIMS_MARKER, KEYS, LEAF, LOAD_NAMESPACE, SPINE, claims_only,  # noqa: E402
                                  dra_names, load_pod, node_names, pod_uid, training_pod)

BEGIN, END = "<!-- load_extender:begin -->", "<!-- load_extender:end -->"
VERBS = ("filter", "prioritize", "bind")
HEADERS = {"Content-Type": "application/json"}
SERVER_P99_TARGET_MS = 1.0
FLOOR_RATIO_TARGET = 1.5
CYCLES_TARGET = 300.0
TARGET_NAMES = 5000
PLANS_MARGIN = 0.10
DRA_SHARE = 0.5
"""Issue 30: filter and prioritize server p99 <= SERVER_P99_TARGET_MS at 5,000 names with this share of DRA nodes."""
"""Issues 17 and 29: with group plans and drains in force, filter and prioritize within 10% of the same run
without them."""
DRAINS = 256
"""Drains in force beside the plans: pods waiting for a full set (each drains one) and a group past its age bound.
Each on a node of its own, so filter and prioritize take the path for many drained nodes among 5,000 names."""
OURS = ("extender", "scoring", "topology")  # the profile's rows of our own code, by their file's directory
TICKS = os.sysconf("SC_CLK_TCK")
IDLE_SECONDS = 4.0
ERRORS_KEPT = 5  # error answers kept word for word for the report; all are counted
"""A connection idle longer is opened afresh: uvicorn closes idle keep-alive connections after 5 s, and with
plans one extender sits idle through the other's turns and the floor through the whole comparison."""


# ---- the load generator (the `client` command, in its own process) ----

@dataclass
class Samples:
    """Per verb: HTTP times in ns, and the extender's own times in ms where it reported them."""

    http_ns: dict[str, list[int]] = field(default_factory=lambda: {verb: [] for verb in VERBS})
    server_ms: dict[str, list[float]] = field(default_factory=lambda: {verb: [] for verb in VERBS})
    floor_ns: dict[str, list[int]] = field(default_factory=lambda: {verb: [] for verb in VERBS[:2]})

    def as_dict(self) -> dict[str, Any]:
        return {"http_ns": self.http_ns, "server_ms": self.server_ms, "floor_ns": self.floor_ns}


BOUND = ("bound", "bound to a DRA node")
"""A cycle's outcomes that count as cycles: the others bound no pod."""


def bound(outcomes: dict[str, int]) -> int:
    """Cycles that bound their pod: only these count as cycles (in cycles/s and per cycle)."""
    return sum(outcomes.get(outcome, 0) for outcome in BOUND)


@dataclass
class Cycle:
    filter_body: bytes
    prioritize_body: bytes | None = None
    outcome: str = "bound"  # one of BOUND, or unschedulable | filter-error | bind-error
    passed: int = 0  # names that passed filter


class Client:
    def __init__(self, port: int, floor_port: int | None, nodes: int, dra_share: float = 0.0) -> None:
        self.ports = port, floor_port
        self.ours = _connect(port)
        self.floor = _connect(floor_port) if floor_port is not None else None
        self.last = [time.monotonic()] * 2  # the last request on each connection
        self.names = node_names(nodes)
        self.dra_nodes = frozenset(dra_names(self.names, dra_share))  # its pods are DRA pods where there are some
        self.next_pod = 0
        self.windows: dict[int, list[tuple[list[str], bytes]]] = {}
        self.errors: list[str] = []  # the first error answers of filter, PreBind and bind (ERRORS_KEPT)
        self.error_count = 0  # all of them

    def window(self, size: int, number: int) -> tuple[list[str], bytes]:
        """The number-th window of `size` consecutive names, wrapping around, with its JSON."""
        if size not in self.windows:
            count = max(1, len(self.names) // size)
            self.windows[size] = [(names, orjson.dumps(names)) for names in
                                  (self.names[i * size:(i + 1) * size] for i in range(count))]
        windows = self.windows[size]
        return windows[number % len(windows)]

    def cycle(self, names: list[str], names_json: bytes, samples: Samples | None) -> Cycle:
        """One scheduling cycle of kube-scheduler for the next pending pod: prioritize gets the names that passed
        (at most the extender's shortlist), and the bind the top-scored one. A pod asking GPUs through claims only
        is bound only to a DRA node, the only ones kube-scheduler's DRA plugin would have let through; before a
        bind to a DRA node, kube-scheduler's PreBind allocates the pod's claim."""
        index = self.next_pod
        self.next_pod += 1
        pod = load_pod(index, bool(self.dra_nodes))
        pod_json = orjson.dumps(pod)
        cycle = Cycle(b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + names_json + b"}")
        answer = orjson.loads(_post(self.ours, "/filter", cycle.filter_body, samples, "filter"))
        self.last[0] = time.monotonic()
        if answer["Error"]:
            return self.failed(cycle, f"filter: {answer['Error']}", "filter-error")
        passed = answer["NodeNames"]
        cycle.passed = len(passed)
        bindable = [name for name in passed if name in self.dra_nodes] if claims_only(pod) else passed
        if not bindable:
            cycle.outcome = "unschedulable"
            return cycle
        if len(passed) == len(names):
            cycle.prioritize_body = cycle.filter_body
        else:
            passed_json = orjson.dumps(passed)
            cycle.prioritize_body = b'{"Pod":' + pod_json + b',"Nodes":null,"NodeNames":' + passed_json + b"}"
        # As kube-scheduler reads the answer: a host left out adds 0, so the first top-scored host listed, or with
        # none listed (all equal), the first that passed.
        ranked = orjson.loads(_post(self.ours, "/prioritize", cycle.prioritize_body, samples, "prioritize"))
        if len(bindable) < (len(names) if cycle.prioritize_body is cycle.filter_body else len(passed)):
            feasible = set(bindable)
            ranked = [entry for entry in ranked if entry["Host"] in feasible]
        node = max(ranked, key=itemgetter("Score"))["Host"] if ranked else bindable[0]
        uid = pod["metadata"]["uid"]
        if node in self.dra_nodes:
            cycle.outcome = "bound to a DRA node"
            error = orjson.loads(_post(self.ours, "/loadtest/prebind", orjson.dumps({"uid": uid, "node": node}),
                                       None, ""))["error"]
            if error:
                return self.failed(cycle, f"PreBind: {error}", "bind-error")
        binding = orjson.dumps({"PodName": pod["metadata"]["name"], "PodNamespace": LOAD_NAMESPACE, "PodUID": uid,
                                "Node": node})
        error = orjson.loads(_post(self.ours, "/bind", binding, samples, "bind"))["Error"]
        return self.failed(cycle, f"bind: {error}", "bind-error") if error else cycle

    def failed(self, cycle: Cycle, error: str, outcome: str) -> Cycle:
        cycle.outcome = outcome
        self.error(error)
        return cycle

    def error(self, message: str) -> None:
        """An error answer: the run fails (Report.missed), whatever else it measured."""
        self.error_count += 1
        if len(self.errors) < ERRORS_KEPT:
            self.errors.append(message)

    def floor_echo(self, cycle: Cycle, samples: Samples) -> None:
        assert self.floor is not None, "a client with no floor server"
        _post(self.floor, "/filter", cycle.filter_body, samples, "filter", floor=True)
        self.last[1] = time.monotonic()
        if cycle.prioritize_body is not None:
            _post(self.floor, "/prioritize", cycle.prioritize_body, samples, "prioritize", floor=True)

    def stats(self) -> dict[str, Any]:
        self.resume()
        found = stats(self.ours)
        self.last[0] = time.monotonic()
        return found

    def resume(self) -> None:
        """New connections for those that sat idle long enough for the server to close them, as Go's client
        redials; called between phases and turns, outside the timed requests."""
        now = time.monotonic()
        if now - self.last[0] > IDLE_SECONDS:
            self.ours.close()
            self.ours = _connect(self.ports[0])
        if self.floor is not None and now - self.last[1] > IDLE_SECONDS:
            self.floor.close()
            self.floor = _connect(self.ports[1])


def stats(connection: http.client.HTTPConnection) -> dict[str, Any]:
    """The load test server's /loadtest/stats (large_cluster_server.py)."""
    connection.request("GET", "/loadtest/stats")
    return json.loads(connection.getresponse().read())


def _connect(port: int) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.connect()
    # http.client writes headers and body in two sends; without this, Nagle's algorithm holds a small body
    # back until the server's delayed ACK, 40 ms later.
    connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return connection


def _post(connection: http.client.HTTPConnection, path: str, body: bytes, samples: Samples | None, verb: str,
          floor: bool = False) -> bytes:
    started = time.perf_counter_ns()
    connection.request("POST", path, body, HEADERS)
    response = connection.getresponse()
    data = response.read()
    took = time.perf_counter_ns() - started
    if response.status != 200:
        raise RuntimeError(f"{path} answered HTTP {response.status}: {data[:200]!r}")
    if samples is not None:
        if floor:
            samples.floor_ns[verb].append(took)
        else:
            samples.http_ns[verb].append(took)
            timing = response.getheader("Server-Timing") or ""
            samples.server_ms[verb].append(float(timing.rpartition("dur=")[2]))
    return data


def run_client(args: argparse.Namespace) -> dict[str, Any]:
    client = Client(args.port, args.floor_port, args.nodes)
    pids = {"extender": args.server_pid, "floor": args.floor_pid}
    planned = None
    clients = {"extender": client}  # every extender's client, by its role in `pids`
    if args.plans_port is not None:
        planned = clients["plans"] = Client(args.plans_port, None, args.nodes)
        pids["plans"] = args.plans_pid
    if args.dra_port is not None:
        pids["dra"] = args.dra_pid
    result: dict[str, Any] = {"latency": {}, "sustained": {}}
    gc.disable()  # no collector pause inside the client's timed loops; collected between phases
    if planned is not None:  # first, while both extenders hold the same fill and have seen the same pods
        result["comparison"] = compare({"without": client, "with": planned}, args, pids, args.compare_samples,
                                       args.compare_seconds, args.profile_seconds > 0)
        gc.collect()
    if args.dra_port is not None:  # connected now: idle through the plans' rounds, the server would close it
        dra = Client(args.dra_port, None, args.nodes, args.dra_share)
        result["dra"] = compare({"without": client, "with": dra}, args, pids, args.dra_samples, args.dra_seconds,
                                False)
        result["dra"]["after"] = {"without": client.stats(), "with": dra.stats()}
        result["dra"]["errors"] = list(dra.errors)
        result["routing"] = routing(dra, args, args.dra_pid)
        clients["dra"] = dra
        gc.collect()
    for size in args.sizes:
        client.resume()
        for number in range(args.warmup):
            client.cycle(*client.window(size, number), None)
        samples = Samples()
        outcomes: dict[str, int] = {}
        before = _usage(pids)
        started = time.perf_counter()
        for number in range(args.samples):
            if time.perf_counter() - started > args.point_seconds:
                break
            cycle = client.cycle(*client.window(size, args.warmup + number), samples)
            client.floor_echo(cycle, samples)
            outcomes[cycle.outcome] = outcomes.get(cycle.outcome, 0) + 1
        result["latency"][size] = {**samples.as_dict(), "outcomes": outcomes,
                                   "seconds": time.perf_counter() - started, "usage": [before, _usage(pids)]}
        gc.collect()
    for size in args.sustain_sizes:
        samples = Samples()
        outcomes = {}
        before = _usage(pids), client.stats()  # stats resumes the connection
        started = time.perf_counter()
        for number in range(args.max_cycles):
            if time.perf_counter() - started >= args.sustain_seconds:
                break
            cycle = client.cycle(*client.window(size, number), samples)
            outcomes[cycle.outcome] = outcomes.get(cycle.outcome, 0) + 1
        elapsed = time.perf_counter() - started
        after = _usage(pids), client.stats()
        result["sustained"][size] = {**samples.as_dict(), "outcomes": outcomes, "seconds": elapsed,
                                     "usage": [before[0], after[0]], "stats": [before[1], after[1]]}
        gc.collect()
    if args.profile_seconds > 0:
        size = max(args.sustain_sizes or args.sizes)
        result["profile"] = profile(client, size, args)
    if planned is not None:
        result["comparison"]["after"] = {"without": client.stats(), "with": planned.stats()}
    result["errors"] = [error for found in clients.values() for error in found.errors][:ERRORS_KEPT]
    result["error_count"] = sum(found.error_count for found in clients.values())
    result["errors_logged"] = {role: found.stats()["errors_logged"] for role, found in clients.items()}
    result["pods_used"] = client.next_pod
    return result


def compare(sides: dict[str, Client], args: argparse.Namespace, pids: dict[str, int], cycles: int, seconds: float,
            profiled: bool) -> dict[str, Any]:
    """The 5,000-name latency phase on two extenders, `cycles` on each (bounded at `seconds`), in rounds that
    alternate which one goes first, so that drift on the shared machine meets both alike. With plans, both start
    from the same fill and get the same pods: the plans are the only difference; with DRA nodes, each gets the
    pods of its own cluster. prioritize gets the names that passed, as in kube-scheduler's cycle: the shortlist's
    K on both where more fit.
    `profiled`: then a few seconds of cProfile on each."""
    size = min(TARGET_NAMES, args.nodes)
    before = {side: client.stats() for side, client in sides.items()}
    for number in range(args.warmup):
        for client in sides.values():
            client.cycle(*client.window(size, number), None)
    samples = {side: Samples() for side in sides}
    outcomes: dict[str, dict[str, int]] = {side: {} for side in sides}
    passed: dict[str, list[int]] = {side: [] for side in sides}
    rounds: list[dict[str, dict[str, float]]] = []
    order = list(sides)
    usage = _usage(pids)
    started = time.perf_counter()
    done = 0
    while done < cycles and time.perf_counter() - started < seconds:
        count = min(args.compare_round, cycles - done)
        medians: dict[str, dict[str, float]] = {}
        for side in order:
            client, marks = sides[side], {verb: len(samples[side].server_ms[verb]) for verb in VERBS[:2]}
            client.resume()
            for number in range(args.warmup + done, args.warmup + done + count):
                cycle = client.cycle(*client.window(size, number), samples[side])
                outcomes[side][cycle.outcome] = outcomes[side].get(cycle.outcome, 0) + 1
                passed[side].append(cycle.passed)
            medians[side] = {verb: percentile(samples[side].server_ms[verb][marks[verb]:], 0.5)
                             for verb in VERBS[:2] if len(samples[side].server_ms[verb]) > marks[verb]}
        rounds.append(medians)
        done += count
        order.reverse()
    result = {"size": size, "samples": {side: found.as_dict() for side, found in samples.items()},
              "outcomes": outcomes, "passed": passed, "rounds": rounds, "round": args.compare_round,
              "warmup": args.warmup, "seconds": time.perf_counter() - started, "usage": [usage, _usage(pids)],
              "before": before}
    if profiled:  # both at the same point: the same cycles seen, the same memos warm
        result["profiles"] = {side: profile(client, size, args) for side, client in sides.items()}
    return result


ROUTED = ("no GPU", "GPU")


def no_gpu_pod(index: int) -> dict[str, Any]:
    """A pod that asks no GPU (no claim, no `nvidia.com/gpu`): the load's pod shape without its GPUs."""
    return training_pod(f"web-{index}", LOAD_NAMESPACE, pod_uid(f"web/{index}"), 0, {})


def routing(client: Client, args: argparse.Namespace, pid: int) -> dict[str, Any]:
    """What claim-only routing would cost were kube-scheduler to send the extender every pod (managedResources
    empty): filter and prioritize over every name for pods that ask no GPU, against the same for the DRA load's
    next pods, in rounds that alternate which goes first. None is bound, so no churn falls into either's rounds.
    The server's CPU per round from its threads' /proc schedstat, in ns (/proc/PID/stat counts 10 ms ticks, too
    coarse for a round)."""
    size = min(TARGET_NAMES, args.nodes)
    names_json = client.window(size, 0)[1]
    first_gpu_pod = client.next_pod
    pods = {ROUTED[0]: map(no_gpu_pod, itertools.count()),
            ROUTED[1]: (load_pod(index, True) for index in itertools.count(first_gpu_pod))}
    samples = {side: Samples() for side in ROUTED}
    cpu_ns = dict.fromkeys(ROUTED, 0)
    passed = dict.fromkeys(ROUTED, 0)

    def send(side: str, measured: Samples | None) -> int:
        """One pod's filter and prioritize (every name, the filter's body); the names that passed."""
        body = b'{"Pod":' + orjson.dumps(next(pods[side])) + b',"Nodes":null,"NodeNames":' + names_json + b"}"
        answer = orjson.loads(_post(client.ours, "/filter", body, measured, "filter"))
        if answer["Error"]:
            client.error(f"filter: {answer['Error']}")
        _post(client.ours, "/prioritize", body, measured, "prioritize")
        return len(answer["NodeNames"] or ())

    client.resume()
    for _ in range(args.warmup):
        for side in ROUTED:
            send(side, None)
    ratios: list[float] = []  # per round, the CPU of a pod with no GPU over a GPU pod's
    order = list(ROUTED)
    started = time.perf_counter()
    done = 0
    while done < args.routing_samples and time.perf_counter() - started < args.routing_seconds:
        count = min(args.compare_round, args.routing_samples - done)
        spent = {}
        for side in order:
            before = _threads_cpu_ns(pid)
            for _ in range(count):
                passed[side] += send(side, samples[side])
            spent[side] = _threads_cpu_ns(pid) - before
            cpu_ns[side] += spent[side]
        ratios.append(spent[ROUTED[0]] / max(1, spent[ROUTED[1]]))
        done += count
        order.reverse()
    client.last[0] = time.monotonic()
    client.next_pod += args.warmup + done
    return {"size": size, "pods": done, "warmup": args.warmup, "seconds": time.perf_counter() - started,
            "samples": {side: found.as_dict() for side, found in samples.items()}, "cpu_ns": cpu_ns,
            "passed": passed, "ratios": ratios, "first_gpu_pod": first_gpu_pod}


def _threads_cpu_ns(pid: int) -> int:
    """CPU ns the process's threads have run so far."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat", encoding="ascii") as stat:
                total += int(stat.read().split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total


def profile(client: Client, size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Cycles with cProfile on the extender's event-loop thread and on its filter and prioritize (after the
    measured cycles, which it would slow)."""
    client.resume()
    orjson.loads(_post(client.ours, "/loadtest/profile/start", b"", None, ""))
    started = time.perf_counter()
    cycles = 0
    for number in range(args.max_cycles):
        if time.perf_counter() - started >= args.profile_seconds:
            break
        client.cycle(*client.window(size, number), None)
        cycles += 1
    answer = orjson.loads(_post(client.ours, "/loadtest/profile/stop", b"", None, ""))
    return {"size": size, "cycles": cycles, "seconds": time.perf_counter() - started, "rows": answer["rows"],
            "verbs": answer["verbs"]}


def _usage(pids: dict[str, int]) -> dict[str, Any]:
    """CPU seconds so far: per process (and the extender's event-loop thread), this client, and the whole machine."""
    usage: dict[str, Any] = {}
    for role, pid in pids.items():
        usage[role] = _cpu_seconds(f"/proc/{pid}/stat")
    # The interpreter's main thread (its id is the process id) runs the event loop.
    usage["extender_loop"] = _cpu_seconds(f"/proc/{pids['extender']}/task/{pids['extender']}/stat")
    times = os.times()
    usage["client"] = times.user + times.system
    usage["machine_busy"], usage["machine_steal"] = _machine_cpu()
    return usage


def _machine_cpu() -> tuple[float, float]:
    """CPU seconds the whole machine spent busy (user, nice, system, irq, softirq), and stolen from it."""
    with open("/proc/stat", encoding="ascii") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq) / TICKS, steal / TICKS


def _cpu_seconds(path: str) -> float:
    with open(path, encoding="ascii") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


# ---- the orchestrator ----

class Server:
    """A server subprocess that prints `READY {json}` when its socket is bound."""

    def __init__(self, command: list[str], log: Path) -> None:
        self.log = log
        self._log_file = log.open("w", encoding="utf-8")
        self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=self._log_file, text=True)
        lines: queue.SimpleQueue[str] = queue.SimpleQueue()
        threading.Thread(target=lambda: lines.put(self.process.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=180)
        except queue.Empty:
            line = ""
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"{command[1]} did not start: {line!r}; see {log}")
        self.facts = json.loads(line[len("READY "):])
        self.port = int(self.facts["port"])

    def wait_ready(self, path: str, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            try:
                connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                connection.request("GET", path)
                if connection.getresponse().status == 200:
                    connection.close()
                    return
            except OSError:
                pass
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        raise RuntimeError(f"server on port {self.port} not ready at {path}; see {self.log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log_file.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command")
    client = commands.add_parser("client", help="(internal) the load generator")
    for target in (parser, client):
        target.add_argument("--nodes", type=int, default=5000, help="cluster nodes (default 5000)")
        target.add_argument("--sizes", type=_sizes, default=[100, 1000, 5000],
                            help="candidate names per request in the latency phase (default 100,1000,5000)")
        target.add_argument("--samples", type=int, default=500, help="measured cycles per size (default 500)")
        target.add_argument("--warmup", type=int, default=50, help="unmeasured cycles per size first (default 50)")
        target.add_argument("--point-seconds", type=float, default=60.0,
                            help="time bound of the measured cycles of one size (default 60)")
        target.add_argument("--sustain-sizes", type=_sizes, default=[5000, 100],
                            help="candidate names in the sustained phase (default 5000,100)")
        target.add_argument("--sustain-seconds", type=float, default=15.0,
                            help="length of each sustained run (default 15)")
        target.add_argument("--max-cycles", type=int, default=20000, help="bound on each sustained run (default 20000)")
        target.add_argument("--profile-seconds", type=float, default=5.0,
                            help="then cycles with the extender's event loop under cProfile (default 5; 0: none)")
        target.add_argument("--compare-samples", type=int, default=1000,
                            help="with plans: measured 5,000-name cycles on each extender (default 1000)")
        target.add_argument("--compare-round", type=int, default=50,
                            help="with plans: cycles on one extender before the other's turn (default 50)")
        target.add_argument("--compare-seconds", type=float, default=120.0,
                            help="with plans: time bound of the comparison's measured rounds (default 120)")
        target.add_argument("--dra-share", type=float, default=DRA_SHARE,
                            help=f"share of the nodes that are DRA nodes in a third extender, measured against the "
                                 f"first at 5,000 names with DRA pods (default {DRA_SHARE}; 0: no third extender)")
        target.add_argument("--dra-samples", type=int, default=1000,
                            help="with DRA nodes: measured 5,000-name cycles on each extender (default 1000)")
        target.add_argument("--dra-seconds", type=float, default=60.0,
                            help="with DRA nodes: time bound of the comparison's measured rounds (default 60)")
        target.add_argument("--routing-samples", type=int, default=1000,
                            help="with DRA nodes: pods that ask no GPU, and as many GPU pods, sent filter and "
                                 "prioritize (default 1000)")
        target.add_argument("--routing-seconds", type=float, default=30.0,
                            help="with DRA nodes: time bound of those pods' measured rounds (default 30)")
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--floor-port", type=int, required=True)
    client.add_argument("--server-pid", type=int, required=True)
    client.add_argument("--floor-pid", type=int, required=True)
    client.add_argument("--plans-port", type=int)
    client.add_argument("--plans-pid", type=int)
    client.add_argument("--dra-port", type=int)
    client.add_argument("--dra-pid", type=int)
    parser.add_argument("--fill", type=float, default=0.45, help="share of GPUs taken before the load (default 0.45)")
    parser.add_argument("--leaf-nodes", type=int, default=20,
                        help="network labels on every node, a leaf per this many consecutive nodes, and the "
                             "extenders built with those levels (default 20)")
    parser.add_argument("--plans", type=int, default=1000,
                        help="group plans in force in a second extender, measured against the first at 5,000 "
                             "names (default 1000; 0: no second extender)")
    parser.add_argument("--drains", type=int, default=DRAINS,
                        help=f"drains in force in the extender with plans, each on a node of its own (default "
                             f"{DRAINS})")
    parser.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for the machine to be idle (default 0: start at once)")
    parser.add_argument("--write", metavar="PATH", help="rewrite the load_extender section of this Markdown file")
    args = parser.parse_args(argv)
    if args.command == "client":
        print(json.dumps(run_client(args)))
        return 0
    return orchestrate(args, argv)


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def orchestrate(args: argparse.Namespace, argv: Sequence[str] | None) -> int:
    if max(args.sizes + args.sustain_sizes, default=0) > args.nodes:
        raise SystemExit("a size exceeds --nodes")
    if args.leaf_nodes < 1:
        raise SystemExit("--leaf-nodes must be at least 1")
    if not 0 <= args.dra_share <= 1:
        raise SystemExit("--dra-share must be 0 to 1")
    started = time.perf_counter()
    args.idle_note = wait_for_idle(args.wait_idle)
    loadavg_before = load_average()
    logs = Path(tempfile.mkdtemp(prefix="load_extender-"))
    cluster = [sys.executable, str(HERE / "large_cluster_server.py"), "--nodes", str(args.nodes), "--fill",
               str(args.fill), "--leaf-nodes", str(args.leaf_nodes)]
    commands = {"extender": cluster, "floor": [sys.executable, str(HERE / "floor_server.py")]}
    if args.plans:
        commands["plans"] = cluster + ["--plans", str(args.plans), "--drains", str(args.drains)]
    if args.dra_share:
        commands["dra"] = cluster + ["--dra-share", str(args.dra_share)]
    servers: dict[str, Server] = {}
    try:
        start_servers(commands, logs, servers)
        extender, floor, planned, dra = servers["extender"], servers["floor"], servers.get("plans"), servers.get("dra")
        extender.wait_ready("/readyz")
        floor.wait_ready("/healthz")
        bound = (len(args.sizes) * (args.point_seconds + 60) + len(args.sustain_sizes) * (args.sustain_seconds + 30)
                 + 120)
        command = [sys.executable, str(Path(__file__).resolve()), "client", "--port", str(extender.port),
                   "--floor-port", str(floor.port), "--server-pid", str(extender.process.pid),
                   "--floor-pid", str(floor.process.pid), "--nodes", str(args.nodes),
                   "--sizes", ",".join(map(str, args.sizes)), "--samples", str(args.samples),
                   "--warmup", str(args.warmup), "--point-seconds", str(args.point_seconds),
                   "--sustain-sizes", ",".join(map(str, args.sustain_sizes)),
                   "--sustain-seconds", str(args.sustain_seconds), "--max-cycles", str(args.max_cycles),
                   "--profile-seconds", str(args.profile_seconds), "--compare-samples", str(args.compare_samples),
                   "--compare-round", str(args.compare_round), "--compare-seconds", str(args.compare_seconds),
                   "--dra-share", str(args.dra_share), "--dra-samples", str(args.dra_samples),
                   "--dra-seconds", str(args.dra_seconds), "--routing-samples", str(args.routing_samples),
                   "--routing-seconds", str(args.routing_seconds)]
        if planned is not None:
            planned.wait_ready("/readyz")
            command += ["--plans-port", str(planned.port), "--plans-pid", str(planned.process.pid)]
            bound += args.compare_seconds + 2 * args.profile_seconds + 60
        if dra is not None:
            dra.wait_ready("/readyz")
            command += ["--dra-port", str(dra.port), "--dra-pid", str(dra.process.pid)]
            bound += args.dra_seconds + args.routing_seconds + 60
        done = subprocess.run(command, capture_output=True, text=True, timeout=bound)
        if done.returncode != 0:
            raise RuntimeError(f"load generator failed:\n{done.stderr[-3000:]}")
        result = json.loads(done.stdout)
    finally:
        for server in servers.values():
            server.stop()
    loadavg_after = load_average()
    elapsed = time.perf_counter() - started
    report = Report(args, result, extender.facts, planned.facts if planned is not None else None,
                    dra.facts if dra is not None else None)
    body = report.render()
    print(body)
    if any(log.stat().st_size for log in logs.iterdir()):
        print(f"\n(run took {elapsed:.0f} s; the servers wrote to {logs})")
    else:
        shutil.rmtree(logs)
        print(f"\n(run took {elapsed:.0f} s)")
    if args.write:
        write_section(Path(args.write), header(argv, args, elapsed, extender.facts, loadavg_before,
                                               loadavg_after) + "\n\n" + body, BEGIN, END)
    return verdict("load_extender", report.missed())


def start_servers(commands: dict[str, list[str]], logs: Path, servers: dict[str, Server]) -> None:
    """Start every server at once, into `servers` (which the caller stops): building a 5,000-node cluster takes
    seconds, planning a thousand groups half a minute."""
    with ThreadPoolExecutor(len(commands)) as pool:
        futures = {role: pool.submit(Server, command, logs / f"{role}.log") for role, command in commands.items()}
    failed: list[RuntimeError] = []
    for role, future in futures.items():
        try:
            servers[role] = future.result()
        except RuntimeError as error:
            failed.append(error)
    if failed:
        raise failed[0]


def wait_for_idle(seconds: float, busy_below: float = 0.25, window: float = 2.0) -> str:
    """Wait up to `seconds` for a window in which the machine keeps fewer than `busy_below` CPUs busy."""
    if seconds <= 0:
        return ""
    deadline = time.monotonic() + seconds
    waited = time.monotonic()
    while True:
        before = _machine_cpu()[0]
        time.sleep(window)
        busy = (_machine_cpu()[0] - before) / window
        if busy < busy_below or time.monotonic() >= deadline:
            verdict = "idle" if busy < busy_below else "still busy, started anyway"
            return (f"waited {time.monotonic() - waited:.0f} s for an idle machine ({verdict}: "
                    f"{busy:.2f} CPUs busy over the last {window:g} s)")


# ---- reporting ----

def _ms(value: float) -> str:
    return f"{value:.3f}"


def _by(value: float, limit: float) -> str:
    """Met, or missed by how much."""
    if value <= limit:
        return "**met**"
    return f"**missed** by {value - limit:.3g} ({(value / limit - 1) * 100:.0f}% over)"


class Report:
    def __init__(self, args: argparse.Namespace, result: dict[str, Any], facts: dict[str, Any],
                 plan_facts: dict[str, Any] | None, dra_facts: dict[str, Any] | None = None) -> None:
        self.args = args
        self.result = result
        self.facts = facts
        self.latency = {int(size): point for size, point in result["latency"].items()}
        self.sustained = {int(size): point for size, point in result["sustained"].items()}
        self.plans = (PlansComparison(result["comparison"], facts, plan_facts)
                      if plan_facts is not None and "comparison" in result else None)
        self.dra = (DraComparison(result["dra"], facts, dra_facts, result["routing"])
                    if dra_facts is not None and "dra" in result else None)

    @staticmethod
    def figures(point: dict[str, Any], verb: str) -> dict[str, float]:
        http = [ns / 1e6 for ns in point["http_ns"][verb]]
        server = point["server_ms"][verb]
        out = {"n": len(http)}
        for name, values in (("server", server), ("http", http)):
            if values:
                out.update({f"{name}_p50": percentile(values, 0.5), f"{name}_p99": percentile(values, 0.99),
                            f"{name}_max": max(values)})
        floor = [ns / 1e6 for ns in point["floor_ns"].get(verb, [])]
        if floor:
            out.update({"floor_n": len(floor), "floor_p50": percentile(floor, 0.5),
                        "floor_p99": percentile(floor, 0.99), "floor_max": max(floor)})
        return out

    def render(self) -> str:
        parts = [self.targets(), self.plans.section() if self.plans else "",
                 *(self.dra.sections() if self.dra else ()), self.why(), self.latency_table(),
                 self.sustained_table(), self.server_notes()]
        if self.result.get("profile"):
            parts.append(self.profile_table())
        if self.plans is not None and "profiles" in self.plans.data:
            parts.append(self.plans.profile_table())
        return "\n\n".join(part for part in parts if part)

    def why(self) -> str:
        """Where the time of a 5,000-name cycle goes, from this run's own figures."""
        point, run = self.latency.get(TARGET_NAMES), self.sustained.get(TARGET_NAMES)
        if point is None or run is None:
            return ""
        f, p, b = (self.figures(point, verb) for verb in VERBS)
        if not (f["n"] and p["n"] and b["n"] and "floor_p50" in f and "floor_p50" in p):
            return ""
        cycles = max(1, bound(run["outcomes"]))
        wall = run["seconds"] * 1000 / cycles
        http = sum(map(sum, run["http_ns"].values())) / 1e6 / cycles
        verbs = sum(map(sum, run["server_ms"].values())) / cycles
        cpu = self.cpu(run)
        between = wall - http
        # The same cycle with verbs that cost nothing: the floor's filter and prioritize, bind without its work.
        bare = f["floor_p50"] + p["floor_p50"] + (b["http_p50"] - b["server_p50"]) + between
        lines = ["### Where the time goes (5,000 names, this run's medians)", ""]
        for name, v in (("filter", f), ("prioritize", p)):
            lines.append(
                f"- {name}: HTTP {_ms(v['http_p50'])} ms = the verb's own {_ms(v['server_p50'])} ms + "
                f"{_ms(v['http_p50'] - v['server_p50'])} ms of HTTP, framework and transport, against the floor's "
                f"{_ms(v['floor_p50'])} ms in all (whose own work is parsing the body and answering the names). "
                f"Within {FLOOR_RATIO_TARGET:g}x of the floor the verb would have "
                f"{_ms(max(0.0, FLOOR_RATIO_TARGET * v['floor_p50'] - (v['http_p50'] - v['server_p50'])))} ms; "
                f"its server-side p99 is {v['server_p99'] / v['server_p50']:.1f}x its median.")
        lines.append(
            f"- A sustained cycle: {wall:.2f} ms of wall time = {http:.2f} ms in its three requests (of which "
            f"{verbs:.2f} ms the verbs' own work) + {between:.2f} ms of the load generator between requests "
            f"(parsing 5,000-entry answers, building the next bodies). The extender process used "
            f"{cpu['extender_ms']:.2f} ms of CPU per cycle: with a core of its own it would sustain about "
            f"{1000 / cpu['extender_ms']:.0f} cycles/s; {CYCLES_TARGET:g} cycles/s leaves it "
            f"{1000 / CYCLES_TARGET:.2f} ms. With verbs that cost nothing (the floor's filter and prioritize, "
            f"bind's HTTP without its work) this loop would still take about {bare:.2f} ms a cycle "
            f"({1000 / bare:.0f} cycles/s) on this machine, with client and servers sharing its CPUs.")
        return "\n".join(lines)

    def targets(self) -> str:
        return "\n".join(["### Targets (DESIGN.md §9), with 5,000 candidate names", "",
                          "| target | measured | verdict |", "|---|---:|---|", *(c.row() for c in self.checks())])

    def checks(self) -> list[Check]:
        """Every target this run judges, and its error answers. A target it did not measure is missed: a run
        that cannot judge a target must not pass it."""
        point = self.latency.get(TARGET_NAMES)
        checks = []
        for verb in VERBS[:2]:  # §9 bounds filter and prioritize here; bind's bound is under a real scheduler
            target = f"{verb}: server-side p99 <= {SERVER_P99_TARGET_MS:g} ms"
            figures = self.figures(point, verb) if point is not None else {}
            if "server_p99" not in figures:
                checks.append(Check(target, "not measured", False))
                continue
            p99 = figures["server_p99"]
            checks.append(Check(target, f"{_ms(p99)} ms", p99 <= SERVER_P99_TARGET_MS, _by(p99, SERVER_P99_TARGET_MS)))
        for verb in VERBS[:2]:
            target = f"{verb}: HTTP p99 <= {FLOOR_RATIO_TARGET:g}x the floor's"
            figures = self.figures(point, verb) if point is not None else {}
            if not ("floor_p99" in figures and "http_p99" in figures):
                checks.append(Check(target, "not measured", False))
                continue
            ratio = figures["http_p99"] / figures["floor_p99"]
            checks.append(Check(target, f"{ratio:.2f}x ({_ms(figures['http_p99'])} / {_ms(figures['floor_p99'])} ms; "
                                        f"at p50 {figures['http_p50'] / figures['floor_p50']:.2f}x)",
                                ratio <= FLOOR_RATIO_TARGET, _by(ratio, FLOOR_RATIO_TARGET)))
        run = self.sustained.get(TARGET_NAMES)
        target = f">= {CYCLES_TARGET:g} cycles/s (filter + prioritize + bind, bound), sustained"
        per_cpu = "the same, per CPU-second of the extender process (one core of its own)"
        if run is None:
            checks += [Check(target, "not measured", False), Check(per_cpu, "not measured", False)]
        else:
            rate = bound(run["outcomes"]) / run["seconds"]
            met = rate >= CYCLES_TARGET
            checks.append(Check(target, f"{rate:.0f} cycles/s", met, "**met**" if met
                                else f"**missed** by {CYCLES_TARGET - rate:.0f} cycles/s "
                                     f"({(1 - rate / CYCLES_TARGET) * 100:.0f}% under)"))
            cpu_ms = self.cpu(run)["extender_ms"]
            rate = 1000 / cpu_ms if cpu_ms > 0 and bound(run["outcomes"]) else 0.0
            checks.append(Check(per_cpu, f"{rate:.0f} cycles/s", rate >= CYCLES_TARGET))
        if self.plans is not None:
            checks += self.plans.checks()
        if self.dra is not None:
            checks += self.dra.checks()
        errors, logged = self.result["error_count"], sum(self.result["errors_logged"].values())
        checks.append(Check("no error answer (filter, PreBind, bind) and no error logged by an extender",
                            f"{errors} error answers, {logged} errors logged", errors == 0 and logged == 0))
        return checks

    def missed(self) -> list[str]:
        return missed(self.checks())

    def latency_table(self) -> str:
        rows = ["### Latency per verb and size (ms)", "",
                "Server: the verb's own time (`Server-Timing`). HTTP: the client's send-to-last-byte time on a "
                "keep-alive connection. Floor: the same bodies to the floor (`floor_server.py`: the extender's "
                "server, protocol and answer shape, none of its work). Ratio: ours / floor, HTTP.",
                "",
                "| verb | names | samples | server p50 | server p99 | server max | HTTP p50 | HTTP p99 | HTTP max "
                "| floor p50 | floor p99 | floor max | ratio p50 | ratio p99 |",
                "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for verb in VERBS:
            for size, point in sorted(self.latency.items()):
                f = self.figures(point, verb)
                if not f["n"]:
                    continue
                cells = [verb, f"{size:,}", str(f["n"]), _ms(f["server_p50"]), _ms(f["server_p99"]),
                         _ms(f["server_max"]), _ms(f["http_p50"]), _ms(f["http_p99"]), _ms(f["http_max"])]
                if "floor_p50" in f:
                    cells += [_ms(f["floor_p50"]), _ms(f["floor_p99"]), _ms(f["floor_max"]),
                              f"{f['http_p50'] / f['floor_p50']:.2f}x", f"{f['http_p99'] / f['floor_p99']:.2f}x"]
                else:
                    cells += ["-"] * 5
                rows.append("| " + " | ".join(cells) + " |")
        outcomes = "; ".join(f"{size:,} names: " + ", ".join(f"{n} {kind}" for kind, n in sorted(p["outcomes"].items()))
                             for size, p in sorted(self.latency.items()))
        others = ", ".join(f"{size:,} names {self.cpu(p)['others']:.2f}" for size, p in sorted(self.latency.items()))
        rows += ["", f"Cycles measured: {outcomes}. CPUs kept busy by other processes on the machine meanwhile: "
                 f"{others}."]
        return "\n".join(rows)

    @staticmethod
    def cpu(run: dict[str, Any]) -> dict[str, float]:
        """CPU ms per (bound) cycle of each process, and the CPUs every other process on the machine kept busy."""
        before, after = run["usage"]
        cycles = max(1, bound(run["outcomes"]))
        spent = {role: after[role] - before[role] for role in ("extender", "extender_loop", "floor", "client",
                                                               "machine_busy")}
        other = spent["machine_busy"] - spent["extender"] - spent["floor"] - spent["client"]
        return {"extender_ms": spent["extender"] * 1000 / cycles, "loop_ms": spent["extender_loop"] * 1000 / cycles,
                "client_ms": spent["client"] * 1000 / cycles, "floor_ms": spent["floor"] * 1000 / cycles,
                "others": max(0.0, other) / run["seconds"],
                "steal": (after["machine_steal"] - before["machine_steal"]) / run["seconds"]}

    def sustained_table(self) -> str:
        rows = ["### Sustained scheduling cycles", "",
                "Full cycles back to back (filter, prioritize on the passing names, bind on the top-scored node), "
                "one at a time, as kube-scheduler's scheduling loop sends them. Only cycles that bound their pod "
                "count as cycles: per cycle, means over those of all the time spent: wall time; the "
                "HTTP time of its three requests; of that, the verbs' own time (`Server-Timing`); CPU time from "
                "/proc of the extender process (in parentheses its event-loop thread, which runs all HTTP "
                "handling and filter and prioritize where all they need is remembered; new work runs on a thread "
                "of its own, bind on worker threads) and of "
                "the load generator; and the CPUs that every other process on the machine kept busy meanwhile.",
                "",
                "| names | seconds | cycles run (bound / unschedulable / error answer) | bound cycles/s | wall ms "
                "| HTTP ms "
                "| verbs' own ms | filter server p50 / p99 | prioritize server p50 / p99 | bind server p50 / p99 "
                "| extender CPU ms | client CPU ms | other processes |",
                "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for size, run in sorted(self.sustained.items(), reverse=True):
            outcomes = run["outcomes"]
            cycles = max(1, bound(outcomes))
            http = sum(map(sum, run["http_ns"].values())) / 1e6 / cycles
            verbs = sum(map(sum, run["server_ms"].values())) / cycles
            cpu = self.cpu(run)
            unschedulable = outcomes.get("unschedulable", 0)
            cells = [f"{size:,}", f"{run['seconds']:.1f}",
                     f"{sum(outcomes.values())} ({bound(outcomes)} / {unschedulable} / "
                     f"{sum(outcomes.values()) - bound(outcomes) - unschedulable})",
                     f"{bound(outcomes) / run['seconds']:.0f}",
                     f"{run['seconds'] * 1000 / cycles:.2f}", f"{http:.2f}", f"{verbs:.2f}"]
            for verb in VERBS:
                f = self.figures(run, verb)
                cells.append(f"{_ms(f['server_p50'])} / {_ms(f['server_p99'])}" if f["n"] else "-")
            cells += [f"{cpu['extender_ms']:.2f} ({cpu['loop_ms']:.2f})", f"{cpu['client_ms']:.2f}",
                      f"{cpu['others']:.2f} CPUs" + (f" (+{cpu['steal']:.2f} stolen)" if cpu["steal"] >= 0.01 else "")]
            rows.append("| " + " | ".join(cells) + " |")
        return "\n".join(rows)

    def server_notes(self) -> str:
        lines = ["### Inside the extender process during the sustained runs", ""]
        for size, run in sorted(self.sustained.items(), reverse=True):
            before, after = run["stats"]
            calls = after["api_calls"] - before["api_calls"]
            api = (after["api_seconds"] - before["api_seconds"]) * 1000
            binds = run["outcomes"].get("bound", 0) + run["outcomes"].get("bind-error", 0)
            pauses = []
            for generation, (old, new) in enumerate(zip(before["gc"], after["gc"])):
                runs = new["runs"] - old["runs"]
                if runs:
                    pauses.append(f"gen{generation} {runs} runs, {1000 * (new['seconds'] - old['seconds']):.1f} ms "
                                  f"in all, longest {1000 * new['longest']:.2f} ms (over the process's life)")
            lines.append(f"- {size:,} names: the in-process API server (the Binding and the kubelet's admission, "
                         "with the watch events "
                         f"they apply to the extender's state) took {api / max(binds, 1):.3f} ms per bind "
                         f"({calls} calls); pods created {after['pending_created'] - before['pending_created']}, "
                         f"ended {after['pods_ended'] - before['pods_ended']}; garbage collector: "
                         f"{'; '.join(pauses) or 'no runs'}.")
        errors = self.result["errors"]
        if errors:
            lines.append(f"- First error answers (of {self.result['error_count']} in all): {'; '.join(errors)}")
        return "\n".join(lines)


    def profile_table(self, top: int = 12) -> str:
        profile = self.result["profile"]
        threads = {"the event loop": _per_cycle(profile["rows"], profile["cycles"]),
                   "filter and prioritize": _per_cycle(profile["verbs"], profile["cycles"])}
        every = _merged(*threads.values())
        ours = sorted((function for function in every if function.split("/")[0] in OURS),
                      key=lambda function: -every[function][2])[:8]
        lines = [f"### Where the extender spends a {profile['size']:,}-name cycle (cProfile)", "",
                 f"{profile['cycles']} more full cycles, after the measured ones, with cProfile on the event-loop "
                 "thread (all HTTP handling, and filter and prioritize where all they need is remembered; bind runs "
                 "on worker threads) and, on the verbs' thread, around the service's filter and prioritize where "
                 "they run there, on new work (parsing the body and writing the answer left out). cProfile slows "
                 "Python-level calls far more than C "
                 "builtins, so read the shares, not the absolute times. The functions with the most own time:"]
        for thread, rows in threads.items():
            if not rows:
                lines += ["", f"No call of {thread} was profiled on its thread in these cycles: the event loop "
                          "answered them all."]
                continue
            lines += ["", f"| function ({thread}) | calls per cycle | own ms per cycle | cumulative ms per cycle |",
                      "|---|---:|---:|---:|"]
            for function in sorted(rows, key=lambda function: -rows[function][1])[:top]:
                calls, own, cumulative = rows[function]
                lines.append(f"| `{function}` | {calls:.3g} | {own:.3f} | {cumulative:.3f} |")
        lines += ["", "The extender's own functions with the most cumulative time, ms per cycle: "
                  + "; ".join(f"`{function}` {every[function][2]:.3f}" for function in ours) + "."]
        return "\n".join(lines)


class Comparison:
    """`compare`'s figures: two extenders' 5,000-name latency, without and with what is measured."""

    SIDES = ("without", "with")

    def __init__(self, data: dict[str, Any], facts: dict[str, Any]) -> None:
        self.data = data
        self.facts = facts
        self.figures = {side: {verb: Report.figures(data["samples"][side], verb) for verb in VERBS}
                        for side in self.SIDES}

    def ratios(self, verb: str, kind: str = "server") -> tuple[float, float]:
        """With over without, at p50 and at p99."""
        without, with_it = self.figures["without"][verb], self.figures["with"][verb]
        return (with_it[f"{kind}_p50"] / without[f"{kind}_p50"],
                with_it[f"{kind}_p99"] / without[f"{kind}_p99"])

    def measured(self, verb: str) -> bool:
        """Both sides answered the verb."""
        return all("server_p99" in self.figures[side][verb] for side in self.SIDES)

    def verdict(self, verb: str) -> str:
        raise NotImplementedError

    def table(self) -> str:
        """Each verb's server p50 and p99 without and with, their ratios and HTTP's, and filter and prioritize's
        verdict."""
        lines = ["| verb | samples (without / with) | server p50 without / with | ratio | server p99 without / with | "
                 "ratio | HTTP p50 ratio | HTTP p99 ratio | verdict |",
                 "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
        for verb in VERBS:
            without, with_it = self.figures["without"][verb], self.figures["with"][verb]
            if not (without["n"] and with_it["n"]):
                continue
            p50, p99 = self.ratios(verb)
            http50, http99 = self.ratios(verb, "http")
            lines.append(f"| {verb} | {without['n']} / {with_it['n']} | {_ms(without['server_p50'])} / "
                         f"{_ms(with_it['server_p50'])} | {p50:.2f}x | {_ms(without['server_p99'])} / "
                         f"{_ms(with_it['server_p99'])} | {p99:.2f}x | {http50:.2f}x | {http99:.2f}x | "
                         f"{self.verdict(verb) if verb != 'bind' else '-'} |")
        return "\n".join(lines)

    def mean_passed(self, side: str) -> float:
        """Names that passed filter, on average: what kube-scheduler would have sent prioritize."""
        counts = self.data["passed"][side]
        return sum(counts) / max(1, len(counts))

    def rounds_and_outcomes(self, label: str) -> str:
        """Round by round, the server-side median with over without; and each side's cycles by outcome."""
        spread = []
        for verb in VERBS[:2]:
            ratios = sorted(found["with"][verb] / found["without"][verb] for found in self.data["rounds"]
                            if verb in found.get("with", {}) and verb in found.get("without", {}))
            if ratios:
                spread.append(f"{verb} {ratios[0]:.2f}x to {ratios[-1]:.2f}x (median "
                              f"{percentile(ratios, 0.5):.2f}x)")
        outcomes = "; ".join(f"{side}: " + ", ".join(f"{n} {kind}" for kind, n in sorted(found.items()))
                             for side, found in self.data["outcomes"].items())
        return (f"Round by round, the server-side median {label} over the one without: {'; '.join(spread)}. "
                f"Cycles measured: {outcomes}.")

    def others(self) -> float:
        """CPUs that processes other than ours kept busy during the rounds."""
        usage = self.data["usage"]
        ours = sum(usage[1][role] - usage[0][role] for role in ("extender", "plans", "dra", "floor", "client")
                   if role in usage[0])
        return max(0.0, usage[1]["machine_busy"] - usage[0]["machine_busy"] - ours) / self.data["seconds"]


class PlansComparison(Comparison):
    """The 5,000-name latency of the extender with group plans in force against the one without (issue 17)."""

    def __init__(self, data: dict[str, Any], facts: dict[str, Any], plan_facts: dict[str, Any]) -> None:
        super().__init__(data, facts)
        self.plan_facts = plan_facts

    def in_force(self) -> tuple[int, int]:
        """Plans in force in the extender with plans, before the load and after it."""
        return self.data["before"]["with"]["plans"], self.data["after"]["with"]["plans"]

    def all_in_force(self) -> bool:
        """Every plan was in force before the load and after it: else the plans' cost was not measured."""
        return min(self.in_force()) >= self.plan_facts["plan_groups"]

    def met(self, verb: str) -> bool:
        return self.all_in_force() and self.measured(verb) and max(self.ratios(verb)) <= 1 + PLANS_MARGIN

    def verdict(self, verb: str) -> str:
        if not self.all_in_force():
            planned, kept = self.in_force()
            return f"**not measured**: {planned:,} plans in force before the load, {kept:,} after it"
        if not self.measured(verb):
            return "**not measured**: no answers on one side"
        if self.met(verb):
            return "**met**"
        p50, p99 = self.ratios(verb)
        at = "p50" if p50 >= p99 else "p99"
        return f"**missed**: {(max(p50, p99) - 1) * 100:.0f}% slower at {at}"

    def checks(self) -> list[Check]:
        groups = self.plan_facts["plan_groups"]
        return [Check(f"{verb} with {groups:,} group plans and {self.plan_facts['drains']:,} drains in force: server "
                      f"p50 and p99 within {PLANS_MARGIN:.0%} of the same run without (issues 17 and 29)",
                      "{:.2f}x / {:.2f}x".format(*self.ratios(verb)) if self.measured(verb) else "-",
                      self.met(verb), self.verdict(verb))
                for verb in VERBS[:2]]

    def section(self) -> str:
        facts, plan = self.facts, self.plan_facts
        before, after = self.data["before"], self.data["after"]
        rounds = self.data["rounds"]
        lines = [
            f"### Group plans and drains in force (issues 17 and 29): {self.data['size']:,} names, without and "
            f"with {plan['plan_groups']:,} plans and {plan['drains']:,} drains", "",
            "Two extender processes built alike (the same nodes, network labels, levels and seed, so the same "
            "fill); the second then plans the groups and starts the drains before serving. The client sends both "
            "the same pods, in "
            f"the {self.data['size']:,}-name latency phase only (the other phases run on the extender without "
            f"plans), in rounds of {self.data['round']} cycles on one and then on the other, the first to go "
            "alternating from round to round, so that drift on the shared machine meets both alike. The load's "
            "pods are not members of any group: the plans are held against them, which is the cost "
            "measured. prioritize gets the names that passed, as in kube-scheduler's cycle, and the bind the "
            "top-scored of them: the extender's shortlist on both where more fit (here "
            f"{self.mean_passed('without'):,.0f} without plans and {self.mean_passed('with'):,.0f} with, on "
            "average).", "",
            f"- Drains: {plan['drains']:,}, each holding back the free GPUs of a set of 2 on a node of its own, "
            "spread over the cluster, for the whole run (`loadtests/large_cluster_server.py` `start_drains`): "
            "more drained nodes than the few that filter and prioritize look up one by one, so every request "
            f"takes the path for many; {before['with']['drains_in_force']:,} in force before the load, "
            f"{after['with']['drains_in_force']:,} after it.",
            f"- Groups: {plan['plan_groups']:,}, of 2, 3 and 4 members in turn with {plan['plan_gpus_per_member']} "
            f"GPUs each (`{KEYS.group}`, `{KEYS.group_size}`, `{KEYS.group_span}: {LEAF}`, "
            f"`{KEYS.group_placement}: required`), every member pending, each planned at its first member's "
            f"filter over all {facts['nodes']:,} names through the service before serving (mean "
            f"{plan['plan_filter_ms_mean']:.1f} ms, longest {plan['plan_filter_ms_max']:.1f} ms a group); the "
            "group timeout is longer than the run. Members have 2 GPUs, not 1: a single GPU has no ring, so no "
            "full-bandwidth set of one exists and a group of 1-GPU members is never planned.",
            f"- Plans in force in the extender with plans: {before['with']['plans']:,} before the load "
            f"({before['with']['planned_slots']:,} open slots holding {before['with']['planned_gpus']:,} GPUs, "
            f"{100 * before['with']['planned_gpus'] / facts['gpus']:.0f}% of the cluster's, beside the fill's "
            f"{100 * plan['used_gpus'] / facts['gpus']:.0f}%), {after['with']['plans']:,} after it "
            f"({after['with']['planned_slots']:,} slots, {after['with']['planned_gpus']:,} GPUs); in the one "
            f"without: {before['without']['plans']} and {after['without']['plans']}. Distinct (board, free GPUs) "
            f"node states at the start: {facts['distinct_node_keys']} without, {plan['distinct_node_keys']} with.",
            f"- {len(rounds)} rounds in {self.data['seconds']:.1f} s after {self.data['warmup']} warm-up cycles on "
            f"each; CPUs kept busy by other processes on the machine meanwhile: {self.others():.2f}.", "",
            self.table(), "", self.rounds_and_outcomes("with plans")]
        return "\n".join(lines)

    def profile_table(self, top: int = 15) -> str:
        """Our own functions in filter and prioritize's profile, per cycle, in the extender without plans and with."""
        profiles = self.data["profiles"]
        verbs = {side: _per_cycle(found["verbs"], found["cycles"]) for side, found in profiles.items()}
        loops = {side: _per_cycle(found["rows"], found["cycles"]) for side, found in profiles.items()}
        sides = {side: _merged(verbs[side], loops[side]) for side in profiles}  # filter and prioritize run on both
        functions = sorted({function for rows in sides.values() for function in rows
                            if function.split("/")[0] in OURS},
                           key=lambda function: -max(rows.get(function, (0, 0, 0))[2] for rows in sides.values()))
        totals = {side: {thread: sum(own for _, own, _ in rows[side].values()) for thread, rows in
                         (("verbs", verbs), ("loop", loops))} for side in self.SIDES}
        lines = [f"### Where filter and prioritize spend a {self.data['size']:,}-name cycle, without and with "
                 "plans (cProfile)", "",
                 f"Right after the comparison's rounds, {profiles['without']['seconds']:.0f} s of cycles on each "
                 f"extender with cProfile as in the profile above ({profiles['without']['cycles']} cycles without "
                 f"plans, then {profiles['with']['cycles']} with). All functions' own time per cycle, on the verbs' "
                 f"thread (filter and prioritize on new work): {totals['without']['verbs']:.3f} ms without, "
                 f"{totals['with']['verbs']:.3f} ms with; on the event loop (all HTTP handling, and filter and "
                 f"prioritize where all they need is remembered): {totals['without']['loop']:.3f} ms without, "
                 f"{totals['with']['loop']:.3f} ms with. Our own functions with the most cumulative time, on both:",
                 "",
                 "| function | calls per cycle (without / with) | own ms per cycle (without / with) | "
                 "cumulative ms per cycle (without / with) |", "|---|---:|---:|---:|"]
        for function in functions[:top]:
            cells = [sides[side].get(function, (0.0, 0.0, 0.0)) for side in self.SIDES]
            lines.append(f"| `{function}` | {cells[0][0]:.3g} / {cells[1][0]:.3g} | {cells[0][1]:.3f} / "
                         f"{cells[1][1]:.3f} | {cells[0][2]:.3f} / {cells[1][2]:.3f} |")
        return "\n".join(lines)


class DraComparison(Comparison):
    """The 5,000-name latency of an extender with DRA nodes in the mix, sent DRA pods, against the one without
    (issue 30); and what a pod that asks no GPU would cost it under claim-only routing (`routing`)."""

    def __init__(self, data: dict[str, Any], facts: dict[str, Any], dra_facts: dict[str, Any],
                 routed: dict[str, Any]) -> None:
        super().__init__(data, facts)
        self.dra_facts = dra_facts
        self.routed = routed

    def p99(self, verb: str) -> float:
        """The verb's server p99 with DRA nodes (infinite when not measured)."""
        return self.figures["with"][verb].get("server_p99", math.inf)

    def verdict(self, verb: str) -> str:
        return _by(self.p99(verb), SERVER_P99_TARGET_MS)

    def checks(self) -> list[Check]:
        """Each verb's server p99 with DRA nodes against the target (missed when not measured)."""
        dra = self.dra_facts
        return [Check(f"{verb} with {dra['dra_nodes']:,} DRA nodes of {dra['nodes']:,} and DRA pods: server-side p99 "
                      f"<= {SERVER_P99_TARGET_MS:g} ms (issue 30)", f"{_ms(self.p99(verb))} ms "
                      f"({_ms(self.figures['without'][verb].get('server_p99', math.inf))} ms without DRA nodes)",
                      self.p99(verb) <= SERVER_P99_TARGET_MS, self.verdict(verb))
                for verb in VERBS[:2]]

    def sections(self) -> list[str]:
        return [self.section(), self.routing_section()]

    def cpu_per_cycle(self) -> dict[str, float]:
        """CPU ms per measured cycle of each extender process over the rounds (each is idle in the other's)."""
        before, after = self.data["usage"]
        return {side: (after[role] - before[role]) * 1000 / max(1, bound(self.data["outcomes"][side]))
                for side, role in zip(self.SIDES, ("extender", "dra"))}

    def section(self) -> str:
        dra, data = self.dra_facts, self.data
        cpu = self.cpu_per_cycle()
        lines = [
            f"### DRA nodes in the mix (issue 30): {data['size']:,} names, without DRA nodes and with "
            f"{dra['dra_nodes']:,} ({dra['dra_share']:.0%})", "",
            "One more extender process, built as the first (the same nodes, network labels, levels and seed) but "
            f"with its first {dra['dra_nodes']:,} nodes, every platform among them, DRA nodes "
            f"(`large_cluster_server.py --dra-share {dra['dra_share']:g}`, as `make bench-dra` builds them): each "
            "publishes its GPUs in an NVIDIA-shaped ResourceSlice, in an order shuffled per node, and has no "
            "`nvidia.com/gpu` in its allocatable; the fill's pods there hold their GPUs through "
            f"{dra['dra_claims']:,} ResourceClaims allocated at kube-scheduler's first fit (KEP-5004), which the "
            "extender counts. Distinct node keys at the start: "
            f"{self.facts['distinct_node_keys']:,} without DRA nodes, {dra['distinct_node_keys']:,} with (a DRA "
            "node's key carries its slice order).", "",
            "- Pods: without DRA nodes, the load's pods as above; with them, DRA pods: of every four, two ask "
            "`nvidia.com/gpu` (1 and 2 GPUs; on a DRA node kube-scheduler makes their claim, KEP-5004) and two a "
            "claim made from the shipped template of their size (`scheduler-config/dra-claim-templates.yaml`: "
            "`gpus-1` and `gpus-4`, then `gpus-4` preferring NVLink and `gpus-2` requiring it), marked with "
            f"`{CLAIMS_MARKER}` as `dra-claims-policy.yaml` marks them; that claim is in the extender's watch "
            "before its pod is sent.",
            f"- A cycle: filter and prioritize with all {data['size']:,} names (a claims-only pod's too, which "
            "kube-scheduler's DRA plugin would have narrowed to DRA nodes: the extender gets the most work), then, "
            "on the top-scored name that passed (for a claims-only pod, a DRA node), kube-scheduler's DRA PreBind "
            "on a DRA node (the pod's claim allocated at the first fit, `POST /loadtest/prebind`, not timed) and "
            "the bind. The churn ends pods with their claims and makes a template pod's claim with it.",
            f"- {len(data['rounds'])} rounds of {data['round']} cycles in {data['seconds']:.1f} s after "
            f"{data['warmup']} warm-up cycles on each, the first to go alternating; CPUs kept busy by other "
            f"processes on the machine meanwhile: {self.others():.2f}. CPU per cycle (/proc, each extender process "
            f"over the rounds): {cpu['without']:.2f} ms without DRA nodes, {cpu['with']:.2f} ms with. Claims "
            f"allocated on the extender with DRA nodes: {data['before']['with']['dra_claims']:,} before the rounds, "
            f"{data['after']['with']['dra_claims']:,} after them. Verdict: the server p99 with DRA nodes.", "",
            self.table(), "", self.rounds_and_outcomes("with DRA nodes")
            + (f" First error answers: {'; '.join(data['errors'])}." if data["errors"] else "")]
        return "\n".join(lines)

    def routing_section(self) -> str:
        routed = self.routed
        pods = max(1, routed["pods"])
        figures = {side: {verb: Report.figures(routed["samples"][side], verb) for verb in VERBS[:2]}
                   for side in ROUTED}
        cpu = {side: routed["cpu_ns"][side] / 1e6 / pods for side in ROUTED}
        cycle = self.cpu_per_cycle()["with"]
        lines = [
            "### Claim-only routing: what a pod that asks no GPU would cost (issue 30)", "",
            "kube-scheduler sends the extender only the pods that ask one of its managedResources: `nvidia.com/gpu` "
            f"and `{CLAIMS_MARKER}`, which `scheduler-config/dra-claims-policy.yaml` puts on pods with claims. "
            "Without that marker, claims-only pods would reach the extender only with managedResources empty, and "
            "then kube-scheduler would send it every pod. What each pod that asks no GPU would cost it: on the "
            f"extender with DRA nodes, right after the rounds above, {routed['pods']:,} pods that ask no GPU (the "
            "load's pod shape with no GPU and no claim) and as many GPU pods (the DRA load's next pods), each sent "
            f"filter and prioritize with all {routed['size']:,} names (the filter's body), in rounds of "
            f"{self.data['round']} that alternate which goes first, after {routed['warmup']} warm-up pods of each; "
            "none is bound, so no churn falls into either's rounds. Server CPU: the extender process's threads, "
            "from /proc/PID/task/*/schedstat, per round.", "",
            "| pod | server CPU ms per pod (filter + prioritize) | filter server p50 / p99 | prioritize server p50 / "
            "p99 | HTTP p50 filter / prioritize | names passed (mean) |",
            "|---|---:|---:|---:|---:|---:|"]
        for side, label in zip(ROUTED, ("asks no GPU", "GPU pod (the DRA load's, not bound)")):
            f, p = figures[side]["filter"], figures[side]["prioritize"]
            lines.append(f"| {label} | {cpu[side]:.3f} | {_ms(f['server_p50'])} / {_ms(f['server_p99'])} | "
                         f"{_ms(p['server_p50'])} / {_ms(p['server_p99'])} | {_ms(f['http_p50'])} / "
                         f"{_ms(p['http_p50'])} | {routed['passed'][side] / pods:,.0f} |")
        ratio = {verb: {kind: figures[ROUTED[0]][verb][f"server_{kind}"] / figures[ROUTED[1]][verb][f"server_{kind}"]
                        for kind in ("p50", "p99")} for verb in VERBS[:2]}
        lines.append(f"| ratio, no GPU over GPU | {cpu[ROUTED[0]] / cpu[ROUTED[1]]:.2f}x | "
                     f"{ratio['filter']['p50']:.2f}x / {ratio['filter']['p99']:.2f}x | "
                     f"{ratio['prioritize']['p50']:.2f}x / {ratio['prioritize']['p99']:.2f}x | | |")
        ratios = sorted(routed["ratios"])
        lines += ["", f"Round by round, the CPU ratio no GPU over GPU: {ratios[0]:.2f}x to {ratios[-1]:.2f}x (median "
                  f"{percentile(ratios, 0.5):.2f}x, {len(ratios)} rounds). A whole GPU cycle on this extender in the "
                  f"rounds above (filter, prioritize, PreBind, bind and the churn it causes) took {cycle:.2f} ms of "
                  f"CPU: a pod that asks no GPU would cost {cpu[ROUTED[0]] / cycle:.2f}x that."]
        return "\n".join(lines)


def _merged(*tables: dict[str, tuple[float, float, float]]) -> dict[str, tuple[float, float, float]]:
    """Per-cycle figures of several threads' profiles, summed per function (their calls are apart)."""
    merged: dict[str, tuple[float, float, float]] = {}
    for table in tables:
        for function, figures in table.items():
            merged[function] = tuple(map(sum, zip(merged.get(function, (0.0, 0.0, 0.0)), figures)))
    return merged


def _per_cycle(rows: list[dict[str, Any]], cycles: int) -> dict[str, tuple[float, float, float]]:
    """Each function's calls, own ms and cumulative ms per cycle, the event loop's idle wait left out."""
    cycles = max(1, cycles)
    return {row["function"]: (row["calls"] / cycles, row["own"] * 1000 / cycles, row["cumulative"] * 1000 / cycles)
            for row in rows if "select.epoll" not in row["function"]}


def header(argv: Sequence[str] | None, args: argparse.Namespace, elapsed: float, facts: dict[str, Any],
           loadavg_before: str, loadavg_after: str) -> str:
    machine = (f"; {facts['http']}. The extenders (one, and one more each with plans and with DRA nodes), the floor "
               f"and the load generator are processes sharing these CPUs. Load average (1, 5, 15 min) before the run "
               f"{loadavg_before}, after it {loadavg_after}"
               + (f"; {args.idle_note}" if args.idle_note else ""))
    return "\n".join(run_header("Extender over HTTP", "load_extender.py", argv, elapsed, machine) + [
        f"- Cluster: {facts['nodes']:,} nodes, the ten platforms of `extender.demo.cluster.DEMO_NODES` repeated "
        f"({facts['boards']} distinct boards), {facts['gpus']:,} GPUs; {facts['fill_pods']:,} running 1-, 2- and "
        f"4-GPU pods bound through the extender to random nodes first hold {facts['used_gpus']:,} GPUs "
        f"({100 * facts['used_gpus'] / facts['gpus']:.0f}%), giving {facts['distinct_node_keys']} distinct "
        f"(board, free GPUs) node states. Network labels: Topograph's `{LEAF}` on each {facts['leaf_nodes']} "
        f"consecutive nodes (every leaf holds the same mix of platforms) and `{SPINE}` on each "
        f"{facts['spine_leaves']} leaves; the extender's state is built with those levels (spine, leaf). "
        "While the load runs, every bind of a load pod is followed, on a thread of the extender process, by a new "
        "pending pod and the end of the oldest running pod (watch "
        "events, as a real API server would send), so the number of running pods stays where it started. Nodes are not "
        "republished on a heartbeat during the run (no stale nodes).",
        "- Pods: `load-{i}` shaped like the pod kube-scheduler v1.36.2 sent in the captured "
        "`annotated-nvlink` scenario; GPUs 1, 2, 1, 4, 2, 1, 4, 2 in turn, the seventh of every eight "
        "preferring NVLink, the eighth requiring it (those fail filter on the PCIe-only L40S nodes).",
        f"- Latency phase: per size, {args.warmup} warm-up cycles, then up to {args.samples} measured cycles "
        f"(bounded at {args.point_seconds:g} s). Sustained phase: {args.sustain_seconds:g} s per size. "
        "Percentiles are nearest-rank; the client runs with its garbage collector off in its loops, the servers "
        "with theirs as shipped.",
        "- In-process API server: the extender's bind posts one Binding (with its annotations) to a DemoCluster in "
        "the same process (with name and node indexes, `LoadCluster`), which also applies the resulting watch "
        "events to the extender's state and admits the pod through the node agent's attribution before "
        "returning; so bind's server time includes work that a real API server, the watch thread and the "
        "kubelet would do, and excludes the network round trips a real API server costs."])


if __name__ == "__main__":
    raise SystemExit(main())
