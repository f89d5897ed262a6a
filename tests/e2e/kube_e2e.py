"""The end-to-end harness: a real etcd, kube-apiserver and kube-scheduler on loopback, our extender between them.

Nothing here downloads anything. kube-apiserver and kube-scheduler come from `KUBE_BIN_DIR`, etcd from there or
from PATH; without them the scheduling suite skips once, with a reason that says what is missing. Everything
else is built here:

- `make_pki`: with the `openssl` command line, a CA and the certificates kube-apiserver needs (serving for
  127.0.0.1, an admin client in `system:masters`, kube-scheduler's client `system:kube-scheduler`), a
  service-account signing key pair, and the extender's serving certificate for HTTPS with mTLS;
- `Process`: a child in its own process group, its output in a log file; `stop` ends the whole group;
- `start_etcd`, `start_apiserver`, `start_extender`, `start_scheduler`: each waits until its process answers
  its health endpoint, and fails early with the tail of its log when the process dies first;
- `derive_scheduler_config`: scheduler-config/kube-scheduler-config.yaml pointed at the local extender;
- `gpu_node`, `gpu_pod`: API objects of GPU nodes (real platform topologies in the annotations) and GPU pods;
- `FakeReporter`: what the node reporter DaemonSet does, for nodes that have no kubelet: it republishes each
  node's `gpu-topology.io/state` with the GPUs that pods bound there hold;
- `start_cluster`: all of the above in order, each teardown registered on an ExitStack as soon as it exists, for
  a `ClusterSpec`: the nodes and their labels, the extender's flags, feature gates and API versions.

The cluster has no kubelet and no kube-controller-manager (as in shared/kube-scheduler/INDEX.md): pods stay
Pending after binding, so `spec.nodeName` and the `gpu-topology.io/gpus` annotation show the result.
"""

from __future__ import annotations

import atexit
import copy
import http.client
import inspect
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from prometheus_client.parser import text_string_to_metric_families

from extender.api.pod_request import DEFAULT_GPU_RESOURCE
from extender.demo.cluster import with_uuids
from topology.annotations import AnnotationKeys
from topology.codec import NodeState, encode_state, encode_topology
from topology.model import Topology
from topology.platforms import PLATFORMS

log = logging.getLogger("e2e")

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER_CONFIG_SOURCE = ROOT / "scheduler-config" / "kube-scheduler-config.yaml"
KUBE_BINARIES = ("kube-apiserver", "kube-scheduler")  # etcd may come from PATH instead
HOW_TO_RUN = "KUBE_BIN_DIR=/path/to/bins make test"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
FIRST_SERVICE_IP = "10.96.0.1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
NAMESPACE = "gpu-e2e"
REPORT_INTERVAL_SECONDS = 20.0  # the extender treats a node as stale after 120 s without a report
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"  # never pulled: there is no kubelet
POD_GROUP_API = ("scheduling.k8s.io", "v1alpha2")  # group, version
# What kube-scheduler's own pod groups need in v1.36 (alpha), on kube-apiserver and kube-scheduler alike.
POD_GROUP_GATES = {"GenericWorkload": True, "GangScheduling": True}
POD_GROUP_RUNTIME_CONFIG = ("scheduling.k8s.io/v1alpha2=true",)

# The cluster: a DGX H100 (NVSwitch), two 8x RTX A6000 boards (NVLink bridges on pairs) and a DGX-1 V100
# (hybrid cube-mesh). Two A6000 nodes, so that the packing scenario has a whole board even after the NVLink
# scenario took a pair from the other one (the extender prefers the A6000's 56 GB/s bridge pairs).
NODES: dict[str, str] = {
    "node-h100-a": "dgx-h100",
    "node-a6000-a": "rtx-a6000-pairs",
    "node-a6000-b": "rtx-a6000-pairs",
    "node-v100": "dgx1-v100",
}


@dataclass(frozen=True)
class ClusterSpec:
    """What one cluster of the suite is made of: its GPU nodes (name: platform), the labels each node carries
    beyond the harness's own (NVLink domains, network levels), the extender's extra flags, and the feature gates
    (for kube-apiserver and kube-scheduler) and API versions the scenario needs."""

    nodes: Mapping[str, str]
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    extender_args: tuple[str, ...] = ()
    feature_gates: Mapping[str, bool] = field(default_factory=dict)
    runtime_config: tuple[str, ...] = ()
    namespace: str = NAMESPACE
    dra_nodes: frozenset[str] = frozenset()  # GPUs published by a DRA driver: no nvidia.com/gpu in allocatable
    controllers: tuple[str, ...] = ()  # kube-controller-manager's, from KUBE_BIN_DIR; none: it does not run
    # kube-apiserver presents the webhook-client certificate to admission webhooks, which the extender accepts
    # (--client-name), as scheduler-config/dra-pin-webhook.yaml says to set up
    webhook_client: bool = False


DEFAULT_SPEC = ClusterSpec(NODES)

STARTUP_SECONDS = {"etcd": 90.0, "kube-apiserver": 240.0, "extender": 90.0, "kube-scheduler": 180.0,
                   "kube-controller-manager": 180.0}

# Clients generated before the OpenAPI-generator rewrite cannot choose a content type; they send a dict
# body as JSON on POST and as a strategic merge patch on PATCH (the same as a merge patch for what we patch).
_CHOOSES_CONTENT_TYPE = "_content_type" in inspect.signature(k8s.CoreV1Api.patch_node).parameters


# ---------------------------------------------------------------------------------------------------------
# Which binaries, or why the suite skips
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KubeBinaries:
    """Where each binary the cluster runs is: kube-apiserver and kube-scheduler from KUBE_BIN_DIR, etcd from
    there too or else from PATH (a distribution's etcd, such as Debian's etcd-server package)."""

    etcd: Path
    apiserver: Path
    scheduler: Path
    controller_manager: Path  # only a scenario that needs its controllers runs it (ClusterSpec.controllers)

    def versions(self) -> dict[str, str]:
        return {path.name: binary_version(path) for path in (self.etcd, self.apiserver, self.scheduler)}


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_kube_binaries(env: Mapping[str, str] | None = None) -> tuple[KubeBinaries | None, str | None]:
    """(the binaries, None) or (None, what is missing)."""
    env = os.environ if env is None else env
    raw = (env.get("KUBE_BIN_DIR") or "").strip()
    if not raw:
        return None, "KUBE_BIN_DIR is not set"
    directory = Path(raw).expanduser()
    if not directory.is_dir():
        return None, f"KUBE_BIN_DIR={raw} is not a directory"
    etcd = find_etcd(env)
    missing = [name for name in KUBE_BINARIES if not _executable(directory / name)]
    if missing or etcd is None:
        parts = [f"KUBE_BIN_DIR={raw} has no executable {', '.join(missing)}"] if missing else []
        if etcd is None:
            parts.append(f"no etcd in KUBE_BIN_DIR={raw} or on PATH")
        return None, "; ".join(parts)
    directory = directory.resolve()
    return KubeBinaries(etcd.resolve(), directory / "kube-apiserver", directory / "kube-scheduler",
                        directory / "kube-controller-manager"), None


def skip_reason(problem: str) -> str:
    return (f"end-to-end scheduling suite skipped: {problem}. It needs real kube-apiserver and kube-scheduler "
            f"binaries (v1.36) in one directory, and etcd there or on PATH; run it with {HOW_TO_RUN}")


def find_etcd(env: Mapping[str, str] | None = None) -> Path | None:
    """etcd from KUBE_BIN_DIR, else from PATH (Debian's etcd-server package)."""
    env = os.environ if env is None else env
    raw = (env.get("KUBE_BIN_DIR") or "").strip()
    if raw and _executable(Path(raw).expanduser() / "etcd"):
        return Path(raw).expanduser() / "etcd"
    found = shutil.which("etcd", path=env.get("PATH"))
    return Path(found) if found else None


# ---------------------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------------------

class Process:
    """A child in its own session (so its own process group), stdout and stderr in `log_path`."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, *, env: Mapping[str, str] | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.argv = [str(arg) for arg in argv]
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as sink:
            sink.write(f"$ {' '.join(self.argv)}\n".encode())
            sink.flush()
            self.popen = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT,
                                          start_new_session=True, env=dict(env) if env is not None else None,
                                          cwd=cwd)
        self.pgid = self.popen.pid  # start_new_session: the child leads a new group whose id is its pid
        _STARTED.append(self)

    # The leader is reaped only in stop(). Until then its pid, which is the group's id, stays ours (a zombie
    # keeps it), so signalling the group can never reach a stranger that was given a recycled id.

    def exit_status(self) -> str | None:
        """None while the leader runs; how it ended otherwise. Does not reap it."""
        if self.popen.returncode is not None:
            code = self.popen.returncode
            return f"exited with code {code}" if code >= 0 else f"killed by signal {-code}"
        try:
            info = os.waitid(os.P_PID, self.popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return "gone"
        if info is None or info.si_pid == 0:
            return None
        if info.si_code == os.CLD_EXITED:
            return f"exited with code {info.si_status}"
        return f"killed by signal {info.si_status}"

    @property
    def alive(self) -> bool:
        return self.exit_status() is None

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the whole group, SIGKILL to whatever is left after `grace` seconds (the leader's
        children too, even when the leader is already gone), then reap the leader. Never raises."""
        if self.popen.returncode is not None:
            return  # reaped by an earlier stop(): the group was killed then
        _signal_group(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while self.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(self.pgid, signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %s) survived SIGKILL", self.name, self.popen.pid)

    def tail(self, lines: int = 40) -> str:
        try:
            with open(self.log_path, "rb") as source:
                source.seek(0, os.SEEK_END)
                size = source.tell()
                source.seek(max(0, size - 64 * 1024))
                text = source.read().decode("utf-8", "replace")
        except OSError as error:
            return f"(no log: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def failure(self, what: str) -> str:
        state = self.exit_status() or "running"
        return f"{what}; {self.name} is {state}. Last lines of {self.log_path}:\n{self.tail()}"


_STARTED: list[Process] = []


def started_processes() -> list[Process]:
    return list(_STARTED)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@atexit.register
def _kill_leftovers() -> None:
    """Last resort if a fixture's teardown never ran (the interpreter is exiting)."""
    for process in _STARTED:
        if process.popen.returncode is None:  # never reaped, so the group id is still ours
            _signal_group(process.pgid, signal.SIGKILL)


class StartupError(RuntimeError):
    pass


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, *,
               watch: Iterable[Process] = (), interval: float = 0.25,
               diagnose: Callable[[], str] | None = None) -> Any:
    """Poll until `predicate()` is truthy and return its value. Fail at once if a watched process dies, and
    after `timeout` seconds otherwise; the message carries `diagnose()` and the logs of the watched processes."""
    watched = list(watch)
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        for process in watched:
            if not process.alive:
                raise StartupError(process.failure(f"{process.name} died while waiting for {what}"))
        try:
            value = predicate()
        except (OSError, ApiException, http.client.HTTPException, ssl.SSLError) as error:
            value, last_error = None, error
        if value:
            return value
        if time.monotonic() > deadline:
            parts = [f"timed out after {timeout:.0f} s waiting for {what}"]
            if last_error is not None:
                parts.append(f"last error: {last_error!r}")
            if diagnose is not None:
                parts.append(diagnose())
            parts.extend(process.failure("log") for process in watched)
            raise AssertionError("\n".join(parts))
        time.sleep(interval)


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (all sockets held open together, so no port is handed out twice)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def local_get(port: int, path: str, context: ssl.SSLContext | None = None,
              timeout: float = 5.0) -> tuple[int, bytes]:
    """GET http://127.0.0.1:port/path, or https:// with `context`: (status, body)."""
    connection = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=timeout)
                  if context is not None else http.client.HTTPConnection("127.0.0.1", port, timeout=timeout))
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


# ---------------------------------------------------------------------------------------------------------
# Certificates
# ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pki:
    """The files `make_pki` wrote: ca.crt, <leaf>.crt/<leaf>.key for each of LEAVES, sa.key and sa.pub."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def cert(self, leaf: str) -> Path:
        return self.directory / f"{leaf}.crt"

    def key(self, leaf: str) -> Path:
        return self.directory / f"{leaf}.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"


# name: (subject, extended key usage, subjectAltName or None)
WEBHOOK_CLIENT = "kube-apiserver-webhook-client"
LEAVES: dict[str, tuple[str, str, str | None]] = {
    "apiserver": ("/CN=kube-apiserver", "serverAuth",
                  f"IP:127.0.0.1, IP:{FIRST_SERVICE_IP}, DNS:localhost, DNS:kubernetes, DNS:kubernetes.default, "
                  "DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local"),
    "admin": ("/O=system:masters/CN=e2e-admin", "clientAuth", None),
    "scheduler": ("/CN=system:kube-scheduler", "clientAuth", None),
    # Client usage too: the harness's readiness probe presents it to the extender's mTLS port.
    "extender": ("/CN=gpu-topology-extender", "serverAuth, clientAuth", "IP:127.0.0.1, DNS:localhost"),
    # What kube-apiserver presents to admission webhooks (its AdmissionConfiguration, `admission_config`).
    "webhook-client": (f"/CN={WEBHOOK_CLIENT}", "clientAuth", None),
}


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StartupError(f"openssl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


def make_pki(directory: Path) -> Pki:
    """A CA (ECDSA P-256, ten years), the leaves in LEAVES signed by it (SHA-256, one year, SAN where they
    serve, the extended key usage Go checks) and an RSA-2048 service-account key pair (sa.key, sa.pub)."""
    if shutil.which("openssl") is None:
        raise StartupError("the openssl command is needed to make the cluster's certificates")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    (directory / "ca.cnf").write_text(
        "[req]\ndistinguished_name = dn\nprompt = no\n[dn]\nCN = gpu-topology-e2e-ca\n"
        "[v3_ca]\nbasicConstraints = critical, CA:TRUE, pathlen:0\nkeyUsage = critical, keyCertSign, cRLSign\n"
        "subjectKeyIdentifier = hash\n")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key", cwd=directory)
    _openssl("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "3650", "-set_serial",
             _serial(), "-config", "ca.cnf", "-extensions", "v3_ca", "-out", "ca.crt", cwd=directory)
    for name, (subject, usage, san) in LEAVES.items():
        extensions = ["basicConstraints = critical, CA:FALSE",
                      "keyUsage = critical, digitalSignature, keyEncipherment",
                      f"extendedKeyUsage = {usage}",
                      "subjectKeyIdentifier = hash",
                      "authorityKeyIdentifier = keyid"]
        if san:
            extensions.append(f"subjectAltName = {san}")
        (directory / f"{name}.ext").write_text("\n".join(extensions) + "\n")
        _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", f"{name}.key",
                 cwd=directory)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=directory)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial", _serial(),
                 "-sha256", "-days", "365", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=directory)
        (directory / f"{name}.csr").unlink()
        (directory / f"{name}.ext").unlink()
    (directory / "ca.cnf").unlink()
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "sa.key", cwd=directory)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
    for key in directory.glob("*.key"):
        os.chmod(key, 0o600)
    return Pki(directory)


def _serial() -> str:
    return "0x" + os.urandom(16).hex()


def client_context(pki: Pki, user: str = "admin") -> ssl.SSLContext:
    """TLS client context that trusts the cluster CA and presents `user`'s certificate."""
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.load_cert_chain(str(pki.cert(user)), str(pki.key(user)))
    return context


def write_kubeconfig(path: Path, server: str, pki: Pki, user: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": server, "certificate-authority": str(pki.ca)}}],
        "users": [{"name": user, "user": {"client-certificate": str(pki.cert(user)),
                                          "client-key": str(pki.key(user))}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    os.chmod(path, 0o600)
    return path


# ---------------------------------------------------------------------------------------------------------
# The scheduler's configuration
# ---------------------------------------------------------------------------------------------------------

def derive_scheduler_config(source: Mapping[str, Any], *, kubeconfig: Path, extender_url: str,
                            tls: Mapping[str, str] | None) -> dict[str, Any]:
    """Our KubeSchedulerConfiguration pointed at a local extender: profiles, plugin configuration, the
    extender's verbs, weight, timeout, managedResources and ignorable are kept as shipped; urlPrefix and TLS
    are replaced, the client uses `kubeconfig`, and there is no leader election (one scheduler)."""
    config = copy.deepcopy(dict(source))
    config["clientConnection"] = {"kubeconfig": str(kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    binders = [extender for extender in config.get("extenders") or [] if extender.get("bindVerb")]
    if len(binders) != 1:
        raise ValueError(f"expected one extender with a bindVerb in the scheduler config, found {len(binders)}")
    extender = binders[0]
    extender["urlPrefix"] = extender_url
    if tls is None:
        extender["enableHTTPS"] = False
        extender.pop("tlsConfig", None)
    else:
        extender["enableHTTPS"] = True
        extender["tlsConfig"] = {"insecure": False, **tls}
    return config


def scheduler_name(config: Mapping[str, Any]) -> str:
    """The profile GPU pods use: the one that is not the default scheduler."""
    names = [profile.get("schedulerName") or "default-scheduler" for profile in config.get("profiles") or [{}]]
    ours = [name for name in names if name != "default-scheduler"]
    return (ours or names)[0]


# ---------------------------------------------------------------------------------------------------------
# API objects
# ---------------------------------------------------------------------------------------------------------

def node_topologies(nodes: Mapping[str, str] = NODES) -> dict[str, Topology]:
    """Each node's real platform topology, with the per-GPU UUIDs NVML would report."""
    return {name: with_uuids(name, PLATFORMS[platform].topology()) for name, platform in nodes.items()}


def rfc3339(moment: datetime | None = None) -> str:
    return (moment or datetime.now(timezone.utc)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def gpu_node(name: str, platform: str, topology: Topology, *, keys: AnnotationKeys = AnnotationKeys(),
             resource: str = DEFAULT_GPU_RESOURCE, now: datetime | None = None,
             labels: Mapping[str, str] | None = None, dra: bool = False) -> dict[str, Any]:
    """A v1 Node as a GPU node's kubelet, device plugin, GPU feature discovery and our reporter leave it;
    `labels` adds what GFD or Topograph would (the NVLink clique, the network levels). A `dra` node's GPUs are
    published by a DRA driver, not counted in its allocatable (KEP-5004)."""
    now = now or datetime.now(timezone.utc)
    gpus = str(topology.size)
    model = topology.gpus[0].model
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti",
                 **({} if dra else {resource: gpus})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": gpus,
                "nvidia.com/gpu.product": model.replace(" ", "-"),
                "gpu-topology.io/platform": platform,
                **(labels or {}),
            },
            "annotations": {
                keys.topology: encode_topology(topology),
                keys.state: encode_state(NodeState(frozenset(), frozenset(), now, 0)),
            },
        },
        "spec": {},
        "status": {
            "capacity": dict(resources),
            "allocatable": dict(resources),
            "conditions": [{"type": "Ready", "status": "True", "reason": "FakeReady",
                            "message": "no kubelet: the end-to-end harness marks the node Ready",
                            "lastHeartbeatTime": rfc3339(now), "lastTransitionTime": rfc3339(now)}],
        },
    }


def gpu_pod(name: str, gpus: int, *, scheduler: str, namespace: str = NAMESPACE,
            annotations: Mapping[str, str] | None = None, node: str | None = None,
            resource: str = DEFAULT_GPU_RESOURCE, pod_group: str | None = None) -> dict[str, Any]:
    """A pod asking for `gpus` GPUs from our scheduler profile; `node` pins it with a nodeSelector, and
    `pod_group` makes it a member of kube-scheduler's own PodGroup of that name (`spec.schedulingGroup`)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        # No controller creates service-account tokens here, and no kubelet would mount one.
        "automountServiceAccountToken": False,
        # Without a kubelet, a pod is only removed at once with a zero grace period.
        "terminationGracePeriodSeconds": 0,
        "containers": [{
            "name": "main",
            "image": PAUSE_IMAGE,
            "resources": {"requests": {"cpu": "100m", "memory": "64Mi", resource: str(gpus)},
                          "limits": {resource: str(gpus)}},
        }],
    }
    if node is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if pod_group is not None:
        spec["schedulingGroup"] = {"podGroupName": pod_group}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/part-of": "gpu-e2e"},
                     "annotations": dict(annotations or {})},
        "spec": spec,
    }


def pod_group(name: str, min_count: int, *, namespace: str = NAMESPACE) -> dict[str, Any]:
    """kube-scheduler's own PodGroup (scheduling.k8s.io/v1alpha2, Kubernetes 1.36) with a gang policy: no member
    binds before `min_count` of them can be placed together."""
    group, version = POD_GROUP_API
    return {"apiVersion": f"{group}/{version}", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}}


# ---------------------------------------------------------------------------------------------------------
# The Kubernetes client
# ---------------------------------------------------------------------------------------------------------

class Kube:
    """The official client with a kubeconfig; objects go in and come out as plain JSON dicts."""

    def __init__(self, kubeconfig: Path, timeout: float = 30.0) -> None:
        configuration = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        self.api_client = k8s.ApiClient(configuration)
        self.core = k8s.CoreV1Api(self.api_client)
        self.objects = k8s.CustomObjectsApi(self.api_client)  # any group's REST path, such as scheduling's PodGroups
        self.timeout = timeout

    def close(self) -> None:
        self.api_client.close()

    def _call(self, method: Callable[..., Any], *args: Any, content_type: str | None = None, **kwargs: Any) -> Any:
        if content_type is not None and _CHOOSES_CONTENT_TYPE:
            kwargs["_content_type"] = content_type
        response = method(*args, _preload_content=False, _request_timeout=self.timeout, **kwargs)
        try:
            data = response.data
        finally:
            response.release_conn()
        return json.loads(data) if data else None

    # reads
    def get_node(self, name: str) -> dict[str, Any]:
        return self._call(self.core.read_node, name)

    def get_pod(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        return self._call(self.core.read_namespaced_pod, name, namespace)

    def list_pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            return self._call(self.core.list_pod_for_all_namespaces)["items"]
        return self._call(self.core.list_namespaced_pod, namespace)["items"]

    def list_events(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        return self._call(self.core.list_namespaced_event, namespace)["items"]

    def get_pod_group(self, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
        return self._call(self.objects.get_namespaced_custom_object, *POD_GROUP_API, namespace, "podgroups", name)

    # writes
    def create_namespace(self, name: str) -> None:
        self._call(self.core.create_namespace, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
                   content_type="application/json")

    def create_service_account(self, namespace: str, name: str = "default") -> None:
        """kube-controller-manager makes each namespace's `default` ServiceAccount; it does not run here, and
        the ServiceAccount admission plugin refuses pods whose account does not exist."""
        body = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace},
                "automountServiceAccountToken": False}
        try:
            self._retrying(self.core.create_namespaced_service_account, namespace, body)
        except ApiException as error:
            if error.status != 409:
                raise

    def create_node(self, node: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(self.core.create_node, dict(node), content_type="application/json")

    def patch_node(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(self.core.patch_node, name, dict(patch), content_type="application/merge-patch+json")

    def patch_node_status(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        return self._call(self.core.patch_node_status, name, dict(patch),
                          content_type="application/merge-patch+json")

    def create_pod(self, pod: Mapping[str, Any]) -> dict[str, Any]:
        return self._retrying(self.core.create_namespaced_pod, pod["metadata"]["namespace"], dict(pod))

    def delete_pod(self, name: str, namespace: str = NAMESPACE) -> None:
        """Gone at once: the pods here have a zero grace period, and there is no kubelet to wait for."""
        self._call(self.core.delete_namespaced_pod, name, namespace)

    def create_cluster_object(self, group: str, version: str, plural: str, body: Mapping[str, Any]) -> dict[str, Any]:
        """Any cluster-scoped object by its REST path, such as DRA's DeviceClasses and ResourceSlices."""
        return self._retrying(self.objects.create_cluster_custom_object, group, version, plural, dict(body))

    def create_namespaced_object(self, group: str, version: str, namespace: str, plural: str,
                                 body: Mapping[str, Any]) -> dict[str, Any]:
        """Any namespaced object by its REST path, such as DRA's ResourceClaimTemplates."""
        return self._retrying(self.objects.create_namespaced_custom_object, group, version, namespace, plural,
                              dict(body))

    def list_objects(self, group: str, version: str, plural: str) -> list[dict[str, Any]]:
        """Every object of a kind, in all namespaces (a namespaced kind's REST path without a namespace)."""
        return self._call(self.objects.list_cluster_custom_object, group, version, plural)["items"]

    def create_pod_group(self, pod_group: Mapping[str, Any]) -> dict[str, Any]:
        return self._retrying(self.objects.create_namespaced_custom_object, *POD_GROUP_API,
                              pod_group["metadata"]["namespace"], "podgroups", dict(pod_group))

    def _retrying(self, create: Callable[..., Any], *args: Any, timeout: float = 60.0) -> Any:
        """A create, retried while admission cannot yet see a namespace or ServiceAccount made a moment ago
        (403/404) or the server is busy (429/5xx)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._call(create, *args, content_type="application/json")
            except ApiException as error:
                if error.status not in (403, 404, 429, 500, 503) or time.monotonic() > deadline:
                    raise
            time.sleep(0.5)


# ---------------------------------------------------------------------------------------------------------
# The fake node reporter
# ---------------------------------------------------------------------------------------------------------

FINISHED = frozenset({"Succeeded", "Failed"})


class FakeReporter:
    """What each GPU node's reporter does, from the API server's view instead of the kubelet's: every
    `interval` seconds (and on `refresh()`), publish the node's state annotation with `observed` = now and
    `used` = the GPUs in the `gpu-topology.io/gpus` annotations of the live pods bound to that node."""

    def __init__(self, kube: Kube, topologies: Mapping[str, Topology], *, keys: AnnotationKeys = AnnotationKeys(),
                 interval: float = REPORT_INTERVAL_SECONDS) -> None:
        self.kube = kube
        self.topologies = dict(topologies)
        self.keys = keys
        self.interval = interval
        self.generation = 0
        self.errors: list[str] = []
        self.last: dict[str, NodeState] = {}
        self._uuids = {name: {gpu.uuid for gpu in topology.gpus} for name, topology in self.topologies.items()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def used_by_node(self, pods: Iterable[Mapping[str, Any]]) -> dict[str, frozenset[str]]:
        used: dict[str, set[str]] = {name: set() for name in self.topologies}
        for pod in pods:
            node = (pod.get("spec") or {}).get("nodeName")
            if node not in used or (pod.get("status") or {}).get("phase") in FINISHED:
                continue
            annotation = ((pod.get("metadata") or {}).get("annotations") or {}).get(self.keys.gpus) or ""
            used[node] |= {gpu for gpu in annotation.split(",") if gpu} & self._uuids[node]
        return {name: frozenset(gpus) for name, gpus in used.items()}

    def refresh(self) -> dict[str, NodeState]:
        with self._lock:
            # Taken before the list, so the report covers every bind before it; whole seconds, as encoded.
            observed = datetime.now(timezone.utc).replace(microsecond=0)
            used = self.used_by_node(self.kube.list_pods())
            self.generation += 1
            states = {}
            for name in self.topologies:
                state = NodeState(used[name], frozenset(), observed, self.generation)
                self.kube.patch_node(name, {"metadata": {"annotations": {self.keys.state: encode_state(state)}}})
                states[name] = state
            self.last = states
            return states

    def start(self) -> FakeReporter:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fake-gpu-reporter", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.kube.timeout + 5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.refresh()
            except Exception as error:  # noqa: BLE001 - keep reporting; the tests read `errors`
                self.errors.append(f"{datetime.now(timezone.utc).isoformat()} {error!r}")
                log.warning("fake reporter: %r", error)


# ---------------------------------------------------------------------------------------------------------
# Starting the components
# ---------------------------------------------------------------------------------------------------------

def _etcd_healthy(port: int) -> bool:
    status, body = local_get(port, "/health")
    try:
        return status == 200 and json.loads(body).get("health") == "true"
    except ValueError:  # not JSON yet
        return False


def wait_for_https(process: Process, port: int, path: str, context: ssl.SSLContext) -> None:
    """Until GET https://127.0.0.1:port/path answers 200, within the process's startup time."""
    wait_until(lambda: local_get(port, path, context)[0] == 200, STARTUP_SECONDS[process.name],
               f"{process.name} {path}", watch=[process], interval=0.5)


def start_etcd(binary: Path, workdir: Path, stack: ExitStack) -> tuple[Process, str]:
    client, peer = free_ports(2)
    peer_url = f"http://127.0.0.1:{peer}"
    client_url = f"http://127.0.0.1:{client}"
    process = Process("etcd", [
        binary,
        "--name=e2e",
        f"--data-dir={workdir / 'etcd-data'}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=e2e={peer_url}",
        "--initial-cluster-state=new",
    ], workdir / "logs" / "etcd.log")
    stack.callback(process.stop)
    wait_until(lambda: _etcd_healthy(client), STARTUP_SECONDS["etcd"], "etcd /health", watch=[process])
    return process, client_url


def feature_gates_flag(gates: Mapping[str, bool] | None) -> list[str]:
    """`--feature-gates=A=true,B=false`, or nothing when no gate is set."""
    if not gates:
        return []
    return ["--feature-gates=" + ",".join(f"{name}={str(on).lower()}" for name, on in sorted(gates.items()))]


def admission_config(workdir: Path, pki: Pki) -> Path:
    """kube-apiserver's AdmissionConfiguration: to every admission webhook (the kubeconfig's user "*") it presents
    the webhook-client certificate, so a webhook that asks for client certificates (the extender's) admits it."""
    kubeconfig = workdir / "webhook-client.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": [
        {"name": "*", "user": {"client-certificate": str(pki.cert("webhook-client")),
                               "client-key": str(pki.key("webhook-client"))}}]}))
    path = workdir / "admission-config.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration", "plugins": [
            {"name": "MutatingAdmissionWebhook", "configuration": {
                "apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
                "kubeConfigFile": str(kubeconfig)}}]}))
    return path


def apiserver_argv(binary: Path, *, etcd_url: str, port: int, pki: Pki, cert_dir: Path,
                   feature_gates: Mapping[str, bool] | None = None, runtime_config: Sequence[str] = (),
                   admission: Path | None = None) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1",
        # An explicit address: without one the API server picks the default route's interface, and a
        # sandbox may have none. A loopback address cannot go into the `kubernetes` Service's Endpoints
        # (validation refuses 127.0.0.0/8; newer API servers refuse it at start with the lease reconciler),
        # so nothing reconciles those endpoints: no pod here talks to the API through that Service.
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={pki.cert('apiserver')}",
        f"--tls-private-key-file={pki.key('apiserver')}",
        f"--client-ca-file={pki.ca}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        "--authorization-mode=Node,RBAC",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--v=2",
        *feature_gates_flag(feature_gates),
        *([f"--runtime-config={','.join(runtime_config)}"] if runtime_config else []),
        *([f"--admission-control-config-file={admission}"] if admission is not None else []),
    ]


def start_apiserver(binary: Path, workdir: Path, etcd_url: str, pki: Pki, stack: ExitStack, *,
                    feature_gates: Mapping[str, bool] | None = None,
                    runtime_config: Sequence[str] = (), admission: Path | None = None) -> tuple[Process, int]:
    (port,) = free_ports(1)
    cert_dir = workdir / "apiserver-cert-dir"
    cert_dir.mkdir(exist_ok=True)
    process = Process("kube-apiserver", apiserver_argv(binary, etcd_url=etcd_url, port=port, pki=pki,
                                                       cert_dir=cert_dir, feature_gates=feature_gates,
                                                       runtime_config=runtime_config, admission=admission),
                      workdir / "logs" / "kube-apiserver.log")
    stack.callback(process.stop)
    wait_for_https(process, port, "/readyz", client_context(pki, "admin"))
    return process, port


def restart_apiserver(process: Process, port: int, pki: Pki, stack: ExitStack) -> Process:
    """kube-apiserver stopped (SIGTERM, as a rollout stops it) and started again with the same flags, on the same
    port and etcd, once it answers /readyz again; its log goes on in the same file (loadtests/faults.py)."""
    process.stop()
    again = Process(process.name, process.argv, process.log_path)
    stack.callback(again.stop)
    wait_for_https(again, port, "/readyz", client_context(pki, "admin"))
    return again


def start_extender(workdir: Path, admin_kubeconfig: Path, pki: Pki, stack: ExitStack,
                   extra_args: Sequence[str] = ()) -> tuple[Process, str]:
    (port,) = free_ports(1)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = Process("extender", [
        sys.executable, "-m", "extender.cli", "serve",
        "--kubeconfig", admin_kubeconfig,
        "--host", "127.0.0.1", "--port", str(port),
        "--tls-cert", pki.cert("extender"), "--tls-key", pki.key("extender"), "--client-ca", pki.ca,
        # Clients pinned by name, as scheduler-config/extender.yaml does with its own names: this harness's
        # kube-scheduler certificate, and the extender's own, which the harness's readiness probe presents.
        "--client-name", "system:kube-scheduler", "--client-name", "gpu-topology-extender",
        *extra_args,
    ], workdir / "logs" / "extender.log", env=env, cwd=ROOT)
    stack.callback(process.stop)
    wait_for_https(process, port, "/readyz", client_context(pki, "extender"))
    return process, f"https://127.0.0.1:{port}"


def _serving(kubeconfig: Path, port: int) -> list[str]:
    """A control-plane component's serving flags here: its clients checked through `kubeconfig`, on 127.0.0.1."""
    return [f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={port}"]


def unverified_context() -> ssl.SSLContext:
    """For a component whose serving certificate is self-signed in memory (kube-scheduler's,
    kube-controller-manager's): no check of it."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def start_controller_manager(binary: Path, workdir: Path, kubeconfig: Path, stack: ExitStack,
                             controllers: Sequence[str]) -> Process:
    """kube-controller-manager running only `controllers` (such as resourceclaim-controller, which makes a pod's
    claims from its templates), once it answers /healthz."""
    if not _executable(binary):
        raise RuntimeError(f"{binary} is not an executable: this scenario needs kube-controller-manager")
    (port,) = free_ports(1)
    process = Process("kube-controller-manager", [
        binary,
        f"--kubeconfig={kubeconfig}",
        *_serving(kubeconfig, port),
        f"--controllers={','.join(controllers)}",
        "--leader-elect=false",
        "--use-service-account-credentials=false",
        "--v=2",
    ], workdir / "logs" / "kube-controller-manager.log")
    stack.callback(process.stop)
    wait_for_https(process, port, "/healthz", unverified_context())
    return process


def start_scheduler(binary: Path, workdir: Path, config_path: Path, kubeconfig: Path,
                    stack: ExitStack, feature_gates: Mapping[str, bool] | None = None,
                    on_start: Callable[[Process], None] | None = None) -> Process:
    """kube-scheduler, once it answers /healthz; `on_start` is told of the process as soon as it runs, since it may
    bind pods before it is healthy (loadtests/scheduler_throughput.py measures its CPU from the first bind)."""
    (port,) = free_ports(1)
    process = Process("kube-scheduler", [
        binary,
        f"--config={config_path}",
        *_serving(kubeconfig, port),
        "--v=3",
        *feature_gates_flag(feature_gates),
    ], workdir / "logs" / "kube-scheduler.log")
    stack.callback(process.stop)
    if on_start is not None:
        on_start(process)
    wait_for_https(process, port, "/healthz", unverified_context())
    return process


def create_gpu_nodes(kube: Kube, topologies: Mapping[str, Topology], nodes: Mapping[str, str],
                     keys: AnnotationKeys = AnnotationKeys(),
                     labels: Mapping[str, Mapping[str, str]] | None = None, dra: frozenset[str] = frozenset()) -> None:
    """Create each node, set its status through the status subresource (there is no kubelet to do it), and
    drop the not-ready taint the TaintNodesByCondition admission plugin puts on every new node (no node
    lifecycle controller runs to lift it)."""
    for name, platform in nodes.items():
        node = gpu_node(name, platform, topologies[name], keys=keys, labels=(labels or {}).get(name), dra=name in dra)
        kube.create_node(node)
        kube.patch_node_status(name, {"status": node["status"]})
        kube.patch_node(name, {"spec": {"taints": None}})

    def settled() -> bool:
        for name in nodes:
            current = kube.get_node(name)
            allocatable = (current.get("status") or {}).get("allocatable") or {}
            if (current.get("spec") or {}).get("taints") or allocatable.get(DEFAULT_GPU_RESOURCE) != (
                    None if name in dra else str(topologies[name].size)):
                return False
        return True

    wait_until(settled, 60, "GPU nodes with capacity and no taints")


# ---------------------------------------------------------------------------------------------------------
# A control plane driven with the real kubectl (the manifests' and the chart's e2e)
# ---------------------------------------------------------------------------------------------------------

@dataclass
class ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager, and the real kubectl with the admin's kubeconfig.

    kubectl's own schema check fetches the API server's OpenAPI v2, which the v1.36.2 kube-apiserver built for these
    tests fails to serve (503): `apply` passes --validate=false, and so must any other writing command."""

    kubectl_binary: Path
    kubeconfig: Path
    workdir: Path
    binaries: KubeBinaries
    pki: Pki
    server: str

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 180) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.kubectl_binary), *args], input=stdin, capture_output=True, text=True,
                              timeout=timeout, check=False, env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed ({done.returncode}): {done.stderr}")
        return done

    def apply(self, *args: str, stdin: str | None = None) -> list[str]:
        """`kubectl apply` of the arguments; kubectl's lines, one per object."""
        return self.kubectl("apply", "--validate=false", *args, stdin=stdin).stdout.splitlines()

    def get_json(self, *args: str) -> dict[str, Any]:
        return json.loads(self.kubectl("get", "-o", "json", *args).stdout)


def find_kubectl(binaries: KubeBinaries) -> Path | None:
    """kubectl beside kube-apiserver (KUBE_BIN_DIR), else on PATH."""
    beside = binaries.apiserver.parent / "kubectl"
    if _executable(beside):
        return beside
    found = shutil.which("kubectl")
    return Path(found) if found else None


def find_kube_binaries_and_kubectl() -> tuple[KubeBinaries | None, Path | None, str | None]:
    """The binaries (find_kube_binaries) and kubectl (find_kubectl), or why the suite cannot have them."""
    binaries, problem = find_kube_binaries()
    if problem is not None or binaries is None:
        return None, None, problem or "no binaries"
    kubectl = find_kubectl(binaries)
    if kubectl is None:
        return binaries, None, f"no kubectl beside {binaries.apiserver} or on PATH"
    return binaries, kubectl, None


def start_control_plane(binaries: KubeBinaries, kubectl: Path, workdir: Path, stack: ExitStack,
                        controllers: Sequence[str]) -> ControlPlane:
    """etcd, kube-apiserver and kube-controller-manager running only `controllers`, each stopped by `stack`."""
    pki = make_pki(workdir / "pki")
    _, etcd_url = start_etcd(binaries.etcd, workdir, stack)
    _, port = start_apiserver(binaries.apiserver, workdir, etcd_url, pki, stack)
    server = f"https://127.0.0.1:{port}"
    kubeconfig = write_kubeconfig(workdir / "admin.kubeconfig", server, pki, "admin")
    start_controller_manager(binaries.controller_manager, workdir, kubeconfig, stack, controllers)
    return ControlPlane(kubectl, kubeconfig, workdir, binaries, pki, server)


@dataclass
class Cluster:
    workdir: Path
    pki: Pki
    kube: Kube
    topologies: dict[str, Topology]
    platforms: dict[str, str]
    scheduler_name: str
    namespace: str
    reporter: FakeReporter
    processes: dict[str, Process] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    keys: AnnotationKeys = AnnotationKeys()
    extender_url: str = ""

    def uuid_index(self, node: str) -> dict[str, int]:
        return {gpu.uuid: gpu.index for gpu in self.topologies[node].gpus}

    def extender_metric(self, name: str, **labels: str) -> float:
        """One sample of the extender's /metrics (0 when it has none yet), read over mTLS as the readiness probe
        reads /readyz: what the extender did that the API server does not show, such as the binds it refused."""
        status, body = local_get(int(self.extender_url.rsplit(":", 1)[1]), "/metrics",
                                 client_context(self.pki, "extender"))
        if status != 200:
            raise StartupError(f"extender /metrics answered {status}: {body[:200]!r}")
        return sum(sample.value for family in text_string_to_metric_families(body.decode())
                   for sample in family.samples if sample.name == name and labels.items() <= sample.labels.items())

    def logs(self, lines: int = 40) -> list[tuple[str, str]]:
        return [(f"{process.name} log, last {lines} lines ({process.log_path})", process.tail(lines))
                for process in self.processes.values()]


def binary_version(binary: Path) -> str:
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"(--version failed: {error})"
    return (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr).strip() else "?"


def start_cluster(binaries: KubeBinaries, workdir: Path, stack: ExitStack,
                  spec: ClusterSpec = DEFAULT_SPEC) -> Cluster:
    """etcd, kube-apiserver, GPU nodes and their reporter, the extender, kube-scheduler: in that order, each
    stopped by `stack` (in reverse order) however the suite ends."""
    versions = binaries.versions()
    pki = make_pki(workdir / "pki")
    etcd, etcd_url = start_etcd(binaries.etcd, workdir, stack)
    apiserver, api_port = start_apiserver(binaries.apiserver, workdir, etcd_url, pki, stack,
                                          feature_gates=spec.feature_gates, runtime_config=spec.runtime_config,
                                          admission=admission_config(workdir, pki) if spec.webhook_client else None)
    server = f"https://127.0.0.1:{api_port}"
    admin_kubeconfig = write_kubeconfig(workdir / "admin.kubeconfig", server, pki, "admin")
    scheduler_kubeconfig = write_kubeconfig(workdir / "scheduler.kubeconfig", server, pki, "scheduler")

    kube = Kube(admin_kubeconfig)
    stack.callback(kube.close)
    kube.create_namespace(spec.namespace)
    kube.create_service_account(spec.namespace)
    topologies = node_topologies(spec.nodes)
    create_gpu_nodes(kube, topologies, spec.nodes, labels=spec.labels, dra=spec.dra_nodes)
    reporter = FakeReporter(kube, topologies).start()
    stack.callback(reporter.stop)

    extender, extender_url = start_extender(workdir, admin_kubeconfig, pki, stack, (
        *spec.extender_args, *(("--client-name", WEBHOOK_CLIENT) if spec.webhook_client else ())))
    managers = ([start_controller_manager(binaries.controller_manager, workdir, admin_kubeconfig, stack,
                                          spec.controllers)] if spec.controllers else [])
    source = yaml.safe_load(SCHEDULER_CONFIG_SOURCE.read_text())
    config = derive_scheduler_config(source, kubeconfig=scheduler_kubeconfig, extender_url=extender_url,
                                     tls={"caFile": str(pki.ca), "certFile": str(pki.cert("scheduler")),
                                          "keyFile": str(pki.key("scheduler"))})
    config_path = workdir / "kube-scheduler-config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    scheduler = start_scheduler(binaries.scheduler, workdir, config_path, scheduler_kubeconfig, stack,
                                feature_gates=spec.feature_gates)
    return Cluster(workdir=workdir, pki=pki, kube=kube, topologies=topologies, platforms=dict(spec.nodes),
                   scheduler_name=scheduler_name(config), namespace=spec.namespace, reporter=reporter,
                   processes={p.name: p for p in (etcd, apiserver, extender, scheduler, *managers)},
                   versions=versions,
                   extender_url=extender_url)
