"""Faults under the real control plane (issue 31, item 4): GPU pods arriving at a steady rate at a real kube-scheduler,
two extender replicas with leader election, and, once each mid-run, the leading extender SIGKILLed, kube-apiserver
restarted (etcd stays) and the extender's connections to kube-apiserver cut, watches and all.

The cluster is the e2e harness's (tests/e2e/kube_e2e.py): etcd, kube-apiserver and kube-scheduler v1.36 from
KUBE_BIN_DIR on 127.0.0.1, mTLS everywhere, Node objects with real topologies (dgx2-v100, 16 GPUs under NVSwitch)
and no kubelet, so a bound pod stays Pending and holds its GPUs until the end. Beside it:
- Two replicas of `gpu-topology-extender serve --leader-elect`, sharing a seal key, each in a Pod object of its own
  (never scheduled; the leader labels it, as in scheduler-config/extender.yaml). Each runs through
  loadtests/ledger_probe.py, which shows its ledger and changes nothing else.
- kube-scheduler reaches them through a TCP proxy standing for the Service: a new connection goes to the replica
  whose Pod carries the leader label and whose process lives (a dead one's Pod keeps its label, and is not ready);
  none, and the connection is refused. Connections already made stay where they are, as kube-proxy keeps them.
- The replicas reach kube-apiserver through a second TCP proxy, which the watch fault cuts.

The faults, in turn, spaced so that each has a window of its own before and after it:
- `kill-leader`: SIGKILL to the leading replica; a new replica (a new Pod, as the Deployment makes one) starts at
  once, and the standby takes the Lease once it expires;
- `restart-apiserver`: kube-apiserver stopped with SIGTERM and started again on the same port and etcd;
- `cut-watches`: every connection of the replicas to kube-apiserver closed at once.

Per fault, from a watch on the pods (it lists again whenever its connection drops): pods/s bound in the window
before the fault and from the fault to the window's end after the control plane is back (the fault itself for the
kill and the cut, kube-apiserver ready again for its restart), the longest pause without a bind from then on, the
largest backlog and how long until it is back to its size at the fault. Checks: every pod bound; no GPU given
twice, each pod's GPUs its node's and its seal checking out with the replicas' key; the leader's ledger
(ledger_probe) equal to the pods' sealed annotations, entry for entry, and each node's free GPUs the rest; no
pause longer than the lease plus one retry; no replica that needed a restart (only the killed one is gone, and
the leader at the end leads).

    python loadtests/faults.py [--nodes 200] [--pods 2000] [--rate 10] [--write BENCHMARKS.md]

Exits 1 when a check fails, 2 without the binaries.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import random
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent))  # the packages, not tests/'s folders of their names

from bench_select import Check, load_average, missed, run_header, verdict, write_section  # noqa: E402
from helpers.extender_harness import LEADER_LABEL, Replica as InProcessReplica, extender_pod  # noqa: E402
from kube_e2e import (  # noqa: E402
    ROOT,
    SCHEDULER_CONFIG_SOURCE,
    Kube,
    KubeBinaries,
    Pki,
    Process,
    client_context,
    create_gpu_nodes,
    derive_scheduler_config,
    find_kube_binaries,
    free_ports,
    gpu_pod,
    local_get,
    make_pki,
    node_topologies,
    restart_apiserver,
    scheduler_name,
    start_apiserver,
    start_etcd,
    start_scheduler,
    wait_for_https,
    wait_until,
    write_kubeconfig,
)
from scheduler_throughput import EXTENDER_ERROR, STALE_AFTER, check_gpus  # noqa: E402

from extender.cache.seal import Seal  # noqa: E402
from topology.annotations import AnnotationKeys  # noqa: E402

BEGIN, END = "<!-- fault_e2e:begin -->", "<!-- fault_e2e:end -->"
FAULTS = ("kill-leader", "restart-apiserver", "cut-watches")
PLATFORM = "dgx2-v100"  # 16 GPUs: 200 nodes hold 2,000 pods of 1 or 2 GPUs with room to spare
SIZES = {1: 2, 2: 1}  # GPUs: weight; 2,000 pods take about 2,670 of 3,200 GPUs
NAMESPACE = "faults"
EXTENDER_NAMESPACE = "gpu-topology-system"
LEDGER_PROBE = HERE / "ledger_probe.py"
KEYS = AnnotationKeys()
ROUTE_PERIOD = 0.2  # how often the Service's stand-in reads the leader label


# ---------------------------------------------------------------------------------------------------------
# The proxies: the Service in front of the replicas, and the replicas' way to kube-apiserver
# ---------------------------------------------------------------------------------------------------------

class TcpProxy:
    """Each TCP connection accepted on 127.0.0.1 forwarded to 127.0.0.1:`route()`, chosen when it opens; with no
    route it is refused (reset), as a Service without a ready endpoint refuses it. `cut` closes every connection
    open through it at once."""

    def __init__(self, route: Callable[[], int | None]) -> None:
        self.route = route
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            target = self.route()
            try:
                if target is None:
                    raise ConnectionRefusedError("no route")
                upstream = socket.create_connection(("127.0.0.1", target), timeout=5)
                upstream.settimeout(None)
            except OSError:
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")  # close with a reset
                client.close()
                continue
            with self._lock:
                self._open |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        """Copy one direction until either side ends; then both ends close, as a cut connection does."""
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(source, sink)

    def _drop(self, *ends: socket.socket) -> None:
        for end in ends:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            with self._lock:
                if end in self._open:
                    self._open.discard(end)
                    end.close()

    def cut(self) -> int:
        """Close every connection open through the proxy; how many there were (two sockets each)."""
        with self._lock:
            ends = list(self._open)
        for end in ends:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        return len(ends) // 2

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.cut()


# ---------------------------------------------------------------------------------------------------------
# The replicas and the route to the leader
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Timings:
    """The replicas' leader election (--leader-elect-lease-duration, -renew-deadline, -retry-period)."""

    lease: int = 15
    renew: float = 10.0
    retry: float = 2.0

    @property
    def bound(self) -> float:
        """The issue's bound on a pause: the lease plus one retry."""
        return self.lease + self.retry

    def flags(self) -> list[str]:
        return ["--leader-elect-lease-duration", str(self.lease), "--leader-elect-renew-deadline", f"{self.renew:g}",
                "--leader-elect-retry-period", f"{self.retry:g}"]


class Replica:
    """One `gpu-topology-extender serve --leader-elect` replica in a Pod object of its own, reaching kube-apiserver
    through `kubeconfig`, its ledger shown by loadtests/ledger_probe.py."""

    def __init__(self, identity: str, *, kube: Kube, workdir: Path, kubeconfig: Path, pki: Pki, timings: Timings,
                 stack: ExitStack) -> None:
        self.identity = identity
        self.port, self.probe_port = free_ports(2)
        pod = extender_pod(identity, EXTENDER_NAMESPACE)
        pod.pop("status")
        # Never scheduled: no kube-scheduler serves this name. No kubelet either, so nothing mounts a token.
        pod["spec"] |= {"schedulerName": "no-scheduler", "automountServiceAccountToken": False}
        kube.create_pod(pod)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), "POD_NAME": identity,
               "POD_NAMESPACE": EXTENDER_NAMESPACE}
        self.process = Process("extender", [
            sys.executable, LEDGER_PROBE, str(self.probe_port), "serve",
            "--kubeconfig", kubeconfig, "--host", "127.0.0.1", "--port", str(self.port),
            "--tls-cert", pki.cert("extender"), "--tls-key", pki.key("extender"), "--client-ca", pki.ca,
            "--client-name", "system:kube-scheduler", "--client-name", "gpu-topology-extender",
            "--stale-after", STALE_AFTER, "--seal-key-file", workdir / "seal.key",
            "--leader-elect", "--leader-elect-namespace", EXTENDER_NAMESPACE, "--leader-elect-identity", identity,
            *timings.flags(),
        ], workdir / "logs" / f"{identity}.log", env=env, cwd=ROOT)
        stack.callback(self.process.stop)
        wait_for_https(self.process, self.port, "/readyz", client_context(pki, "extender"))

    def kill(self) -> None:
        """SIGKILL to the whole process group, then reaped."""
        os.killpg(self.process.pgid, signal.SIGKILL)
        self.process.stop()

    def ledger(self) -> dict[str, Any]:
        status, body = local_get(self.probe_port, "/ledger", timeout=30)
        if status != 200:
            raise RuntimeError(f"{self.identity}'s ledger probe answered {status}: {body[:200]!r}")
        return json.loads(body)


class LeaderRoute:
    """The Service's stand-in: every ROUTE_PERIOD, the replica whose Pod carries the leader label and whose process
    lives. While kube-apiserver cannot be read, the route stays as it was (kube-proxy keeps its rules)."""

    def __init__(self, kube: Kube, replicas: Mapping[str, Replica]) -> None:
        self.kube, self.replicas = kube, replicas
        self.labelled: list[str] = []
        self._stop = threading.Event()
        threading.Thread(target=self._run, name="leader-route", daemon=True).start()

    def leader(self) -> Replica | None:
        for identity in self.labelled:
            replica = self.replicas.get(identity)
            if replica is not None and replica.process.alive:
                return replica
        return None

    def port(self) -> int | None:
        leader = self.leader()
        return None if leader is None else leader.port

    def _run(self) -> None:
        while not self._stop.wait(ROUTE_PERIOD):
            try:
                answer = self.kube.core.list_namespaced_pod(EXTENDER_NAMESPACE, label_selector=f"{LEADER_LABEL}=true",
                                                            _preload_content=False, _request_timeout=2)
                self.labelled = sorted(pod["metadata"]["name"] for pod in orjson.loads(answer.data)["items"])
            except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError):
                continue

    def stop(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------------------------------------------------
# The load: pods arriving at a steady rate, and when each is bound
# ---------------------------------------------------------------------------------------------------------

class Arrivals:
    """Creates `pods` in order, the i-th at `i / rate` seconds after `start`, each retried until kube-apiserver
    takes it (a 409 is a create whose answer was lost); `created` holds when each was taken."""

    def __init__(self, kube: Kube, pods: Sequence[dict[str, Any]], rate: float) -> None:
        self.kube, self.pods, self.rate = kube, pods, rate
        self.created: dict[str, float] = {}
        self.retries = 0
        self.started = 0.0
        self.done = threading.Event()
        self._stop = threading.Event()

    def start(self) -> Arrivals:
        self.started = time.monotonic()
        threading.Thread(target=self._run, name="arrivals", daemon=True).start()
        return self

    def _run(self) -> None:
        try:
            for index, pod in enumerate(self.pods):
                if self._stop.wait(max(0.0, self.started + index / self.rate - time.monotonic())):
                    return
                while not self._create(pod):
                    self.retries += 1
                    if self._stop.wait(0.2):
                        return
                self.created[pod["metadata"]["name"]] = time.monotonic()
        finally:
            self.done.set()

    def _create(self, pod: dict[str, Any]) -> bool:
        try:
            self.kube.create_pod(pod)
        except ApiException as error:
            return error.status == 409
        except (urllib3.exceptions.HTTPError, OSError):
            return False
        return True

    def stop(self) -> None:
        self._stop.set()


class BindClock:
    """When each pod of the namespace was first seen bound, by a watch that lists again whenever its connection
    drops (a pod first seen bound in such a list counts from that list)."""

    def __init__(self, port: int, context: ssl.SSLContext) -> None:
        self.port, self.context = port, context
        self.bound: dict[str, float] = {}
        self.relists = 0
        self._stop = threading.Event()
        self._connection: http.client.HTTPSConnection | None = None
        threading.Thread(target=self._run, name="bind-clock", daemon=True).start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._watch(self._list())
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                pass
            if not self._stop.wait(0.1):
                self.relists += 1

    def _get(self, path: str, timeout: float) -> http.client.HTTPResponse:
        self._connection = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=timeout)
        self._connection.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods{path}")
        response = self._connection.getresponse()
        if response.status != 200:
            raise ValueError(f"{response.status}")
        return response

    def _list(self) -> str:
        listed = orjson.loads(self._get("", 60).read())
        for pod in listed["items"]:
            self._saw(pod)
        return listed["metadata"]["resourceVersion"]

    def _watch(self, resource_version: str) -> None:
        for line in self._get(f"?watch=1&timeoutSeconds=600&resourceVersion={resource_version}", 620):
            event = orjson.loads(line)
            if event.get("type") == "ERROR":  # 410 Gone, say: list again
                return
            self._saw(event.get("object") or {})

    def _saw(self, pod: Mapping[str, Any]) -> None:
        name = (pod.get("metadata") or {}).get("name")
        if name and (pod.get("spec") or {}).get("nodeName") and name not in self.bound:
            self.bound[name] = time.monotonic()

    def stop(self) -> None:
        self._stop.set()
        if self._connection is not None:
            self._connection.close()


# ---------------------------------------------------------------------------------------------------------
# What a fault cost, from the moments pods were created and bound
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Figures:
    """One fault's cost. `before`: pods/s bound in the window before it; `around`: from the fault to the window's
    end after the control plane was back; `pause`: the longest time without a bind from then on; `backlog`: most
    pods created and not bound meanwhile; `caught_up`: seconds from the fault until the backlog was back to its
    size at the fault (None: not before the next fault)."""

    before: float
    around: float
    pause: float
    backlog: int
    caught_up: float | None


def figures(binds: Sequence[float], created: Sequence[float], start: float, back: float, window: float,
            horizon: float = math.inf) -> Figures:
    """A fault at `start`, the control plane back at `back` (the same moment for a fault it never stopped); its
    backlog is caught up by `horizon` at the latest (the next fault)."""
    end = back + window
    before = sum(1 for moment in binds if start - window <= moment < start) / window
    around = sum(1 for moment in binds if start <= moment < end) / (end - start)
    moments = [back, *sorted(moment for moment in binds if back < moment < end), end]
    pause = max(later - earlier for earlier, later in zip(moments, moments[1:], strict=False))
    events = sorted([(moment, 1) for moment in created] + [(moment, -1) for moment in binds])
    at_start = sum(step for moment, step in events if moment <= start)
    after = [(moment, step) for moment, step in events if start < moment < max(end, horizon)]
    level = backlog = at_start
    peak = 0  # events of `after` up to the largest backlog within the window
    for index, (moment, step) in enumerate(after, 1):
        level += step
        if level > backlog and moment < end:
            backlog, peak = level, index
    level, caught_up = backlog, None if backlog > at_start else 0.0
    for moment, step in after[peak:]:
        level += step
        if caught_up is None and level <= at_start:
            caught_up = moment - start
    return Figures(before, around, pause, backlog, caught_up)


@dataclass
class Fault:
    name: str
    start: float  # time.monotonic() when it was made
    back: float  # when the control plane was whole again (kube-apiserver ready; the fault itself otherwise)
    detail: str
    figures: Figures | None = None


# ---------------------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    faults: list[Fault]
    checks: list[Check]
    elapsed: float
    versions: dict[str, str]
    started: float  # time.monotonic() when the first pod was created
    arrivals_seconds: float
    error_lines: list[str] = field(default_factory=list)


class FaultRun:
    """The cluster, the replicas and the load of one run; everything stopped by `stack`."""

    def __init__(self, args: argparse.Namespace, binaries: KubeBinaries, workdir: Path, stack: ExitStack) -> None:
        self.args, self.binaries, self.workdir, self.stack = args, binaries, workdir, stack
        self.timings = Timings(args.lease, args.renew, args.retry)
        self.replicas: dict[str, Replica] = {}
        self.gone: list[str] = []  # the replicas the run killed
        self.faults: list[Fault] = []
        self.began = time.monotonic()

    def start(self) -> None:
        self.pki = make_pki(self.workdir / "pki")
        _, etcd_url = start_etcd(self.binaries.etcd, self.workdir, self.stack)
        self.apiserver, self.api_port = start_apiserver(self.binaries.apiserver, self.workdir, etcd_url, self.pki,
                                                        self.stack)
        server = f"https://127.0.0.1:{self.api_port}"
        admin = write_kubeconfig(self.workdir / "admin.kubeconfig", server, self.pki, "admin")
        self.kube = Kube(admin, timeout=30)
        self.stack.callback(self.kube.close)
        for namespace in (NAMESPACE, EXTENDER_NAMESPACE):
            self.kube.create_namespace(namespace)
            self.kube.create_service_account(namespace)
        nodes = {f"dgx2-{index:03d}": PLATFORM for index in range(self.args.nodes)}
        self.topologies = node_topologies(nodes)
        create_gpu_nodes(self.kube, self.topologies, nodes)
        self.api_proxy = TcpProxy(lambda: self.api_port)
        self.stack.callback(self.api_proxy.close)
        self.extender_kubeconfig = write_kubeconfig(self.workdir / "extender.kubeconfig",
                                                    f"https://127.0.0.1:{self.api_proxy.port}", self.pki, "admin")
        InProcessReplica.write_seal_key(self.workdir)
        for identity in ("extender-a", "extender-b"):
            self.add_replica(identity)
        self.route = LeaderRoute(Kube(admin, timeout=5), self.replicas)
        self.stack.callback(self.route.stop)
        self.service = TcpProxy(self.route.port)
        self.stack.callback(self.service.close)
        wait_until(self.route.leader, 60, "a replica labelled as the leader", watch=[self.apiserver])
        self.scheduler_name = self._start_scheduler(admin)

    def add_replica(self, identity: str) -> Replica:
        replica = Replica(identity, kube=self.kube, workdir=self.workdir, kubeconfig=self.extender_kubeconfig,
                          pki=self.pki, timings=self.timings, stack=self.stack)
        self.replicas[identity] = replica
        return replica

    def _start_scheduler(self, admin: Path) -> str:
        """kube-scheduler with the shipped configuration (its client rate too), pointed at the Service's stand-in."""
        source = yaml.safe_load(SCHEDULER_CONFIG_SOURCE.read_text())
        kubeconfig = write_kubeconfig(self.workdir / "scheduler.kubeconfig", f"https://127.0.0.1:{self.api_port}",
                                      self.pki, "scheduler")
        config = derive_scheduler_config(source, kubeconfig=kubeconfig,
                                         extender_url=f"https://127.0.0.1:{self.service.port}",
                                         tls={"caFile": str(self.pki.ca), "certFile": str(self.pki.cert("scheduler")),
                                              "keyFile": str(self.pki.key("scheduler"))})
        config["clientConnection"].update({key: value for key, value in (source.get("clientConnection") or {}).items()
                                           if key != "kubeconfig"})
        path = self.workdir / "kube-scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.scheduler = start_scheduler(self.binaries.scheduler, self.workdir, path, kubeconfig, self.stack)
        return scheduler_name(config)

    # -- the faults ---------------------------------------------------------------------------------------

    def kill_leader(self) -> Fault:
        leader = wait_until(self.route.leader, self.timings.bound * 3, "a leader to kill")
        start = time.monotonic()
        leader.kill()
        self.gone.append(leader.identity)
        replacement = self.add_replica(f"extender-{chr(ord('a') + len(self.replicas))}")
        return Fault("kill-leader", start, start, f"SIGKILL to {leader.identity}; {replacement.identity} started in "
                                                  f"{time.monotonic() - start:.1f} s")

    def restart_apiserver(self) -> Fault:
        start = time.monotonic()
        self.apiserver = restart_apiserver(self.apiserver, self.api_port, self.pki, self.stack)
        back = time.monotonic()
        return Fault("restart-apiserver", start, back, f"ready again after {back - start:.1f} s")

    def cut_watches(self) -> Fault:
        start = time.monotonic()
        cut = self.api_proxy.cut()
        return Fault("cut-watches", start, start, f"{cut} connections cut")

    # -- the load, the faults in turn, the checks ---------------------------------------------------------

    def drive(self) -> Outcome:
        rng = random.Random(self.args.seed)
        sizes = rng.choices(list(SIZES), weights=list(SIZES.values()), k=self.args.pods)
        pods = [gpu_pod(f"p-{index:05d}", size, scheduler=self.scheduler_name, namespace=NAMESPACE)
                for index, size in enumerate(sizes)]
        clock = BindClock(self.api_port, client_context(self.pki, "admin"))
        self.stack.callback(clock.stop)
        arrivals = Arrivals(Kube(self.workdir / "admin.kubeconfig", timeout=5), pods, self.args.rate).start()
        self.stack.callback(arrivals.stop)
        spacing = self.args.pods / self.args.rate / (len(self.args.faults) + 1)
        make = {"kill-leader": self.kill_leader, "restart-apiserver": self.restart_apiserver,
                "cut-watches": self.cut_watches}
        ready_at = arrivals.started
        for number, name in enumerate(self.args.faults, 1):
            at = max(arrivals.started + number * spacing, ready_at)
            time.sleep(max(0.0, at - time.monotonic()))
            fault = make[name]()
            print(f"{fault.start - arrivals.started:6.1f} s ({time.strftime('%H:%M:%S')} minus "
                  f"{time.monotonic() - fault.start:.1f} s): {name}: {fault.detail}", flush=True)
            self.faults.append(fault)
            ready_at = fault.back + 2 * self.args.window  # its window after, the next one's before
        arrivals.done.wait()
        wait_until(lambda: len(clock.bound) >= len(pods), self.args.settle, "every pod bound",
                   watch=[self.apiserver, self.scheduler], interval=1.0,
                   diagnose=lambda: f"{len(clock.bound)} of {len(pods)} bound")
        for fault, following in zip(self.faults, [*self.faults[1:], None], strict=True):
            fault.figures = figures(list(clock.bound.values()), list(arrivals.created.values()), fault.start,
                                    fault.back, self.args.window, following.start if following else math.inf)
        last_created = max(arrivals.created.values(), default=arrivals.started)
        errors = self.error_lines()
        return Outcome(self.faults, self.checks(pods, last_created, errors), time.monotonic() - self.began,
                       self.binaries.versions(), arrivals.started, last_created - arrivals.started, errors)

    def bound_pods(self) -> list[dict[str, Any]]:
        answer = self.kube.core.list_namespaced_pod(NAMESPACE, _preload_content=False, _request_timeout=60)
        return [pod for pod in orjson.loads(answer.data)["items"] if pod["spec"].get("nodeName")]

    def checks(self, pods: Sequence[Mapping[str, Any]], last_created: float, errors: Sequence[str]) -> list[Check]:
        bound = self.bound_pods()
        twice, _ = check_gpus(bound, exact=True)  # its count of a node's GPUs is for 8-GPU boards; seals say more
        foreign = misplaced(bound, self.topologies, Seal.from_file(self.workdir / "seal.key"))
        leader = self.route.leader()
        ledger = settled_ledger(leader, len(bound)) if leader is not None else None
        differences = ledger_differences(ledger or {}, bound, self.topologies) if leader else ["no leader"]
        exited = [f"{identity} {replica.process.exit_status()}" for identity, replica in self.replicas.items()
                  if identity not in self.gone and not replica.process.alive]
        found = [
            Check("every pod bound", f"{len(bound)} of {len(pods)}", len(bound) == len(pods)),
            Check("no GPU given twice; each pod's GPUs its node's, its seal checking out",
                  f"{len(twice)} twice, {len(foreign)} not", not twice and not foreign),
            Check("the leader's ledger equals the pods' sealed annotations, and each node's free GPUs the rest",
                  f"{len(differences)} differences" + (f": {'; '.join(differences[:3])}" if differences else ""),
                  not differences),
            Check("no replica needed a restart (all but the killed one live; the leader at the end leads)",
                  "; ".join(exited) or f"{len(self.replicas) - len(self.gone)} live, "
                                       f"{leader.identity if leader else 'none'} leads",
                  not exited and ledger is not None and ledger["leads"]),
            Check("no line logged at ERROR by a replica (a verb that failed, say)", f"{len(errors)} lines",
                  not errors),
        ]
        for fault in self.faults:
            assert fault.figures is not None
            found.append(Check(f"{fault.name}: no pause longer than the lease plus one retry "
                               f"({self.timings.bound:g} s)", f"{fault.figures.pause:.1f} s",
                               fault.figures.pause <= self.timings.bound))
            found.append(Check(f"{fault.name}: pods kept arriving through its window", "yes" if fault.back +
                               self.args.window <= last_created else "no: the run ended first",
                               fault.back + self.args.window <= last_created))
        return found

    def error_lines(self) -> list[str]:
        return [line for replica in self.replicas.values()
                for line in replica.process.log_path.read_text(errors="replace").splitlines()
                if EXTENDER_ERROR.match(line)]


def settled_ledger(leader: Replica, bound: int, timeout: float = 30.0) -> dict[str, Any]:
    """The leader's ledger once it holds an entry for each pod bound (its watch may trail the last binds), or as
    it stands after `timeout`, for the comparison to show what differs."""
    deadline = time.monotonic() + timeout
    while len((ledger := leader.ledger())["entries"]) != bound and time.monotonic() < deadline:
        time.sleep(0.5)
    return ledger


def annotations(pod: Mapping[str, Any]) -> Mapping[str, str]:
    return pod["metadata"].get("annotations") or {}


def misplaced(bound: Sequence[Mapping[str, Any]], topologies: Mapping[str, Any], seal: Seal) -> list[str]:
    """Bound pods whose GPUs are not all their node's, or whose seal does not check out with the replicas' key."""
    found = []
    for pod in bound:
        node, uid, notes = pod["spec"]["nodeName"], pod["metadata"]["uid"], annotations(pod)
        gpus = notes.get(KEYS.gpus) or ""
        uuids = {gpu.uuid for gpu in topologies[node].gpus}
        if not gpus or not set(gpus.split(",")) <= uuids:
            found.append(f"{pod['metadata']['name']}: GPUs {gpus!r} not of {node}")
        elif not seal.verify(notes.get(KEYS.seal), uid, node, gpus, notes.get(KEYS.containers) or ""):
            found.append(f"{pod['metadata']['name']}: seal does not check out")
    return found


def ledger_differences(ledger: Mapping[str, Any], bound: Sequence[Mapping[str, Any]],
                       topologies: Mapping[str, Any]) -> list[str]:
    """Where the ledger and the pods' annotations disagree: an entry each (node, GPUs), bound, nothing more; and
    each node's free GPUs are the ones no pod holds."""
    sealed = {pod["metadata"]["uid"]: (pod["spec"]["nodeName"], sorted((annotations(pod).get(KEYS.gpus) or "")
                                                                      .split(",")))
              for pod in bound}
    held = {entry["uid"]: (entry["node"], sorted(entry["gpus"])) for entry in ledger.get("entries", [])}
    found = [f"{uid}: ledger {held.get(uid)} against the pod's {sealed.get(uid)}"
             for uid in sorted(sealed.keys() | held.keys()) if held.get(uid) != sealed.get(uid)]
    found += [f"{entry['uid']}: {entry['phase']}" for entry in ledger.get("entries", []) if entry["phase"] != "bound"]
    used: dict[str, set[str]] = {}
    for node, gpus in sealed.values():
        used.setdefault(node, set()).update(gpus)
    for node, topology in topologies.items():
        expected = sorted(gpu.uuid for gpu in topology.gpus if gpu.uuid not in used.get(node, set()))
        if sorted(ledger.get("free", {}).get(node, [])) != expected:
            found.append(f"{node}: free {len(ledger.get('free', {}).get(node, []))} GPUs, {len(expected)} expected")
    return found


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------

def table(outcome: Outcome) -> list[str]:
    lines = ["| fault | at s | control plane back after s | pods/s before | pods/s around | longest pause s | "
             "largest backlog | caught up after s | detail |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for fault in outcome.faults:
        figures_ = fault.figures
        assert figures_ is not None
        caught = "-" if figures_.caught_up is None else f"{figures_.caught_up:.1f}"
        lines.append(f"| {fault.name} | {fault.start - outcome.started:.1f} | {fault.back - fault.start:.1f} | "
                     f"{figures_.before:.1f} | {figures_.around:.1f} | {figures_.pause:.1f} | {figures_.backlog} | "
                     f"{caught} | {fault.detail} |")
    return lines


def section(args: argparse.Namespace, argv: Sequence[str] | None, outcome: Outcome, loads: tuple[str, str]) -> str:
    timings = Timings(args.lease, args.renew, args.retry)
    lines = run_header("Faults under the real control plane", "faults.py", argv, outcome.elapsed,
                       f"; load average {loads[0]} before, {loads[1]} after") + [
        f"- Binaries: {', '.join(f'{name} `{version}`' for name, version in outcome.versions.items())}.",
        f"- Cluster: {args.nodes} Node objects of {PLATFORM} (16 GPUs under NVSwitch), no kubelet, so a bound pod "
        f"holds its GPUs to the end; {args.pods} pods of " + ", ".join(
            f"{gpus} GPU{'s' if gpus > 1 else ''} (weight {weight})" for gpus, weight in SIZES.items())
        + f", seed {args.seed}, created at {args.rate:g} pods/s (over {outcome.arrivals_seconds:.0f} s); "
        "kube-scheduler with the shipped configuration; two extender replicas with leader election (lease "
        f"{timings.lease} s, renew deadline {timings.renew:g} s, retry {timings.retry:g} s), reached through a proxy "
        "standing for the Service (new connections go to the live replica with the leader label), and reaching "
        "kube-apiserver through another proxy.",
        f"- Windows: {args.window:g} s. pods/s before: binds in the window before the fault; around: from the fault to "
        "the window's end after the control plane was back; longest pause: without a bind, from the control plane "
        "back to that end; backlog: pods created and not yet bound. Pods arrive at a steady rate, so what a fault "
        "costs shows as its pause and backlog, caught up at kube-scheduler's own rate, more than in pods/s.",
        "", *table(outcome), "", "| check | measured | verdict |", "|---|---|---|",
        *(check.row() for check in outcome.checks)]
    lines += ["", "First lines logged at ERROR:", "", "```", *(line[:200] for line in outcome.error_lines[:5]),
              "```"] if outcome.error_lines else []
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rate", type=float, default=10.0, help="pods created per second (default 10)")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"in this order (default {','.join(FAULTS)})")
    parser.add_argument("--lease", type=int, default=15, help="the replicas' lease duration, s (default 15)")
    parser.add_argument("--renew", type=float, default=10.0, help="their renew deadline, s (default 10)")
    parser.add_argument("--retry", type=float, default=2.0, help="their retry period, s (default 2)")
    parser.add_argument("--window", type=float, help="seconds before and after each fault (default lease + retry "
                                                     "+ 3)")
    parser.add_argument("--settle", type=float, default=180.0,
                        help="after the last pod is created, how long every pod may take to be bound (default 180)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workdir", type=Path, help="keep certificates, configurations and logs here")
    parser.add_argument("--write", type=Path, metavar="BENCHMARKS.md", help="rewrite this script's section there")
    args = parser.parse_args(argv)
    args.faults = tuple(name for name in args.faults.split(",") if name)
    if not args.faults or set(args.faults) - set(FAULTS):
        parser.error(f"--faults: some of {', '.join(FAULTS)}")
    args.window = args.window or args.lease + args.retry + 3
    if not (1 <= args.nodes <= 1000 and 1 <= args.pods <= 20000 and args.rate > 0):
        parser.error("nodes 1-1000, pods 1-20000, a positive rate")
    spacing = args.pods / args.rate / (len(args.faults) + 1)
    if spacing < 2 * args.window:
        parser.error(f"faults {spacing:.0f} s apart ({args.pods} pods at {args.rate:g}/s): each needs "
                     f"{2 * args.window:g} s, its window before and after; more pods or a lower rate")
    if args.pods * sum(size * weight for size, weight in SIZES.items()) / sum(SIZES.values()) > 0.9 * 16 * args.nodes:
        parser.error(f"{args.pods} pods need more than 90% of {args.nodes} nodes' GPUs; more nodes")
    return args


def run(args: argparse.Namespace, binaries: KubeBinaries, workdir: Path) -> Outcome:
    """The whole run; every process it started is stopped when it returns or raises."""
    with ExitStack() as stack:
        faults = FaultRun(args, binaries, workdir, stack)
        faults.start()
        outcome = faults.drive()
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    binaries, problem = find_kube_binaries()
    if binaries is None:
        print(f"faults: not run: {problem}. It needs etcd, kube-apiserver and kube-scheduler (v1.36) in "
              "KUBE_BIN_DIR (etcd may be on PATH).", file=sys.stderr)
        return 2
    load_before = load_average()
    with tempfile.TemporaryDirectory(prefix="faults-") as scratch:
        workdir = args.workdir or Path(scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        outcome = run(args, binaries, workdir)
    text = section(args, argv, outcome, (load_before, load_average()))
    print()
    print(text)
    if args.write:
        write_section(args.write, text, BEGIN, END)
    return verdict("faults", missed(outcome.checks))


if __name__ == "__main__":
    raise SystemExit(main())
