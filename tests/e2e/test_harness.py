"""Self-tests of the end-to-end harness (kube_e2e.py): everything that runs without kube-apiserver and
kube-scheduler, so CI checks the harness although it cannot run the suite.

- the skip: its reason names what is missing, and the scheduling module is one skip, not one per test;
- the certificates: a chain that verifies strictly, the subjects and usages Kubernetes reads, a real mTLS
  handshake with them, and the official client loading the harness's kubeconfig and talking through it;
- process groups: `stop` ends a child that ignores SIGTERM and the grandchild it started;
- etcd: started on free loopback ports, read and written, stopped (skipped when no etcd binary is found:
  KUBE_BIN_DIR/etcd or `etcd` on PATH, e.g. Debian's etcd-server package);
- the scheduler configuration derived from scheduler-config/, checked with kube-scheduler's own rules;
- the GPU nodes and pods, validated against the Kubernetes 1.36 schemas and read by the extender's state, with
  what a module's ClusterSpec adds (node labels, kube-scheduler's own PodGroup, gates and API versions);
- the fake reporter, against the in-process fake API server;
- the real extender process, started as the suite starts it (HTTPS, mTLS, the harness's certificates),
  filtering and binding a pod of the harness's cluster held by the fake API server.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from helpers.kube_api_server import FakeKubeApiServer, make_pod
from kube_e2e import (
    HOW_TO_RUN,
    LEAVES,
    NODES,
    POD_GROUP_GATES,
    POD_GROUP_RUNTIME_CONFIG,
    ROOT,
    SCHEDULER_CONFIG_SOURCE,
    FakeReporter,
    Kube,
    KubeBinaries,
    Pki,
    Process,
    StartupError,
    apiserver_argv,
    derive_scheduler_config,
    find_etcd,
    find_kube_binaries,
    gpu_node,
    gpu_pod,
    local_get,
    make_pki,
    node_topologies,
    pod_group,
    scheduler_name,
    skip_reason,
    start_cluster,
    start_etcd,
    start_extender,
    started_processes,
    wait_until,
    write_kubeconfig,
)
from helpers.kube_scheduler_rules import kube_scheduler_errors
from helpers.manifest_checks import KUBERNETES_VERSION

from extender.cache.cluster_state import ClusterState
from topology.annotations import AnnotationKeys
from topology.codec import NodeState, decode_state, decode_topology, encode_state

KEYS = AnnotationKeys()
E2E_MODULE = "tests/e2e/test_scheduling_e2e.py"


# ---------------------------------------------------------------------------------------------------------
# The skip
# ---------------------------------------------------------------------------------------------------------

def _fake_binaries(directory: Path, names: tuple[str, ...], executable: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        path = directory / name
        path.write_text("#!/bin/sh\nexit 0\n")
        path.chmod(0o755 if executable else 0o644)
    return directory


def _post(port: int, path: str, body: dict, context: ssl.SSLContext | None = None) -> dict:
    """POST JSON to http://127.0.0.1:port/path (https:// with `context`); the 200 answer's JSON."""
    connection = (http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
                  if context is not None else http.client.HTTPConnection("127.0.0.1", port, timeout=30))
    try:
        connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        text = response.read()
        assert response.status == 200, text
        return json.loads(text)
    finally:
        connection.close()


def test_skip_names_the_unset_variable_and_how_to_run() -> None:
    directory, problem = find_kube_binaries({})
    assert directory is None
    assert problem == "KUBE_BIN_DIR is not set"
    reason = skip_reason(problem)
    assert "KUBE_BIN_DIR is not set" in reason
    assert HOW_TO_RUN == "KUBE_BIN_DIR=/path/to/bins make test" and HOW_TO_RUN in reason
    assert all(name in reason for name in ("etcd", "kube-apiserver", "kube-scheduler"))


def test_skip_names_each_missing_binary(tmp_path: Path) -> None:
    _fake_binaries(tmp_path, ("etcd",))
    _fake_binaries(tmp_path, ("kube-scheduler",), executable=False)
    _, problem = find_kube_binaries({"KUBE_BIN_DIR": str(tmp_path), "PATH": ""})
    assert problem == f"KUBE_BIN_DIR={tmp_path} has no executable kube-apiserver, kube-scheduler"
    _, problem = find_kube_binaries({"KUBE_BIN_DIR": str(tmp_path / "nowhere")})
    assert problem == f"KUBE_BIN_DIR={tmp_path / 'nowhere'} is not a directory"
    empty = _fake_binaries(tmp_path / "empty", ())
    _, problem = find_kube_binaries({"KUBE_BIN_DIR": str(empty), "PATH": str(tmp_path / "nowhere")})
    assert problem == (f"KUBE_BIN_DIR={empty} has no executable kube-apiserver, kube-scheduler; "
                       f"no etcd in KUBE_BIN_DIR={empty} or on PATH")


def test_all_three_binaries_are_found(tmp_path: Path) -> None:
    _fake_binaries(tmp_path, ("etcd", "kube-apiserver", "kube-scheduler"))
    found = tmp_path.resolve()
    assert find_kube_binaries({"KUBE_BIN_DIR": str(tmp_path), "PATH": ""}) == (
        KubeBinaries(found / "etcd", found / "kube-apiserver", found / "kube-scheduler",
                     found / "kube-controller-manager"), None)


def test_etcd_may_come_from_path_as_debian_installs_it(tmp_path: Path) -> None:
    """Debian's etcd-server puts etcd in /usr/bin, beside nothing of Kubernetes."""
    bins = _fake_binaries(tmp_path / "kube", ("kube-apiserver", "kube-scheduler"))
    on_path = _fake_binaries(tmp_path / "usr-bin", ("etcd",))
    found, problem = find_kube_binaries({"KUBE_BIN_DIR": str(bins), "PATH": str(on_path)})
    assert problem is None and found is not None
    assert found.etcd == on_path.resolve() / "etcd" and found.apiserver == bins.resolve() / "kube-apiserver"
    _, problem = find_kube_binaries({"KUBE_BIN_DIR": str(bins), "PATH": str(tmp_path / "nowhere")})
    assert problem == f"no etcd in KUBE_BIN_DIR={bins} or on PATH"


def _run_e2e_module(env_update: dict[str, str | None]) -> subprocess.CompletedProcess[str]:
    # PATH holds no etcd, so the skip's reason does not depend on what this machine has installed.
    env = {key: value for key, value in os.environ.items() if key != "KUBE_BIN_DIR"} | {"PATH": "/nonexistent"}
    env.update({key: value for key, value in env_update.items() if value is not None})
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", E2E_MODULE],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.parametrize("bin_dir", [None, "empty"], ids=["unset", "empty-dir"])
def test_the_scheduling_suite_is_one_clear_skip(tmp_path: Path, bin_dir: str | None) -> None:
    """What CI prints: one SKIPPED line in the -ra summary, with the reason. Run alone, the module collects
    no test (pytest's exit code 5); within `make test` the other tests make the run pass."""
    env = {"KUBE_BIN_DIR": str(tmp_path) if bin_dir else None}
    done = _run_e2e_module(env)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, output
    skipped = [line for line in output.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 1, output
    assert re.search(r"\b1 skipped\b", output), output
    assert "passed" not in output and "error" not in output.lower(), output
    assert HOW_TO_RUN in skipped[0]
    if bin_dir:
        assert "has no executable kube-apiserver, kube-scheduler; no etcd in" in skipped[0]
    else:
        assert "KUBE_BIN_DIR is not set" in skipped[0]


# ---------------------------------------------------------------------------------------------------------
# Certificates and kubeconfigs
# ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command line is needed to make the harness's certificates")
    return make_pki(tmp_path_factory.mktemp("pki") / "pki")


def _x509(path: Path, *options: str) -> str:
    return subprocess.run(["openssl", "x509", "-in", str(path), "-noout", *options], capture_output=True,
                          text=True, check=True).stdout


def test_every_leaf_verifies_strictly_against_the_ca(pki) -> None:
    for leaf in LEAVES:
        done = subprocess.run(["openssl", "verify", "-x509_strict", "-CAfile", str(pki.ca), str(pki.cert(leaf))],
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0 and done.stdout.strip().endswith(": OK"), done.stdout + done.stderr
    assert "CA:TRUE" in _x509(pki.ca, "-ext", "basicConstraints")


def test_certificates_carry_what_kubernetes_reads(pki) -> None:
    # The API server takes the user from CN and the groups from O; system:masters is cluster-admin.
    assert "O = system:masters, CN = e2e-admin" in _x509(pki.cert("admin"), "-subject")
    assert "CN = system:kube-scheduler" in _x509(pki.cert("scheduler"), "-subject")
    for client in ("admin", "scheduler"):
        assert "TLS Web Client Authentication" in _x509(pki.cert(client), "-ext", "extendedKeyUsage")
    # Go verifies the name against the SAN only (never the CN), and the serving usage.
    apiserver = _x509(pki.cert("apiserver"), "-ext", "subjectAltName,extendedKeyUsage")
    assert "IP Address:127.0.0.1" in apiserver and "DNS:kubernetes.default.svc" in apiserver
    assert "TLS Web Server Authentication" in apiserver
    extender = _x509(pki.cert("extender"), "-ext", "subjectAltName,extendedKeyUsage")
    assert "IP Address:127.0.0.1" in extender and "TLS Web Server Authentication" in extender
    for path in pki.directory.glob("*.key"):
        assert path.stat().st_mode & 0o077 == 0, f"{path.name} is readable by others"


def test_service_account_keys_are_one_pair(pki) -> None:
    derived = subprocess.run(["openssl", "pkey", "-in", str(pki.sa_key), "-pubout"], capture_output=True,
                             text=True, check=True).stdout
    assert derived == pki.sa_pub.read_text()
    text = subprocess.run(["openssl", "pkey", "-in", str(pki.sa_key), "-noout", "-text"], capture_output=True,
                          text=True, check=True).stdout
    assert "(2048 bit" in text.splitlines()[0] and "publicExponent" in text  # RSA-2048, as kubeadm's sa.key


class _EchoPeer(BaseHTTPRequestHandler):
    """Answers GET /api/v1/nodes/<name> with a Node, and records who the client certificate names."""

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        peer = self.connection.getpeercert()
        subject = {key: value for rdn in peer.get("subject", ()) for key, value in rdn}
        self.server.peers.append(subject)  # type: ignore[attr-defined]
        name = self.path.rsplit("/", 1)[-1]
        body = json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_official_client_talks_mtls_with_the_harness_kubeconfig(pki, tmp_path: Path) -> None:
    """The API server's side of the handshake as kube-apiserver sets it up: its serving certificate, client
    certificates required and checked against --client-ca-file."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(pki.cert("apiserver")), str(pki.key("apiserver")))
    context.load_verify_locations(str(pki.ca))
    context.verify_mode = ssl.CERT_REQUIRED
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoPeer)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    server.peers = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        port = server.server_address[1]
        for user, expected in (("admin", {"organizationName": "system:masters", "commonName": "e2e-admin"}),
                               ("scheduler", {"commonName": "system:kube-scheduler"})):
            kubeconfig = write_kubeconfig(tmp_path / f"{user}.kubeconfig", f"https://127.0.0.1:{port}", pki, user)
            kube = Kube(kubeconfig)
            try:
                assert kube.get_node("node-h100-a")["metadata"]["name"] == "node-h100-a"
            finally:
                kube.close()
            assert server.peers[-1] == expected  # type: ignore[attr-defined]
        strict = ssl.create_default_context(cafile=str(pki.ca))
        strict.verify_flags |= ssl.VERIFY_X509_STRICT
        strict.load_cert_chain(str(pki.cert("admin")), str(pki.key("admin")))
        assert local_get(port, "/api/v1/nodes/x", strict)[0] == 200
        anonymous = ssl.create_default_context(cafile=str(pki.ca))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            local_get(port, "/api/v1/nodes/x", anonymous)
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------------------------------
# Processes and etcd
# ---------------------------------------------------------------------------------------------------------

def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie nobody has reaped yet is gone too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_stop_ends_the_whole_process_group_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    stubborn = ("import signal, subprocess, sys, time\n"
                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                "child = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
                "print('child', child.pid, flush=True)\n"
                "time.sleep(600)\n")
    process = Process("stubborn", [sys.executable, "-c", stubborn], tmp_path / "logs" / "stubborn.log")
    try:
        match = wait_until(lambda: re.search(r"child (\d+)", process.tail()), 30, "the grandchild's pid",
                           watch=[process])
        child = int(match.group(1))
        assert os.getpgid(child) == process.pgid != os.getpgid(0)
    finally:
        started = time.monotonic()
        process.stop(grace=1.0)
    assert time.monotonic() - started < 10
    assert not process.alive and process.popen.returncode == -signal.SIGKILL
    assert process.exit_status() == f"killed by signal {int(signal.SIGKILL)}"
    wait_until(lambda: _gone(child), 10, "the grandchild to be gone")
    assert process.tail().startswith("$ ")  # the command line heads the log


def test_a_dead_process_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    process = Process("crasher", [sys.executable, "-c", "import sys; print('bad flag --foo'); sys.exit(3)"],
                      tmp_path / "crasher.log")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"(?s)crasher died.*exited with code 3.*bad flag --foo"):
        wait_until(lambda: False, 60, "nothing", watch=[process])
    assert time.monotonic() - started < 30
    assert process.popen.returncode is None  # not reaped before stop(): its group id stays reserved
    process.stop()
    assert process.popen.returncode == 3 and process.exit_status() == "exited with code 3"


ETCD = find_etcd()


def test_etcd_comes_from_kube_bin_dir_first_then_path(tmp_path: Path) -> None:
    bins = _fake_binaries(tmp_path / "bins", ("etcd",))
    on_path = _fake_binaries(tmp_path / "path", ("etcd",))
    assert find_etcd({"KUBE_BIN_DIR": str(bins), "PATH": str(on_path)}) == bins / "etcd"
    assert find_etcd({"PATH": str(on_path)}) == on_path / "etcd"
    assert find_etcd({"PATH": str(tmp_path / "empty")}) is None


@pytest.mark.skipif(ETCD is None, reason="no etcd binary (KUBE_BIN_DIR/etcd or etcd on PATH; "
                                         "Debian: apt-get install etcd-server)")
def test_etcd_starts_on_loopback_serves_and_stops(tmp_path: Path) -> None:
    assert ETCD is not None
    b64 = lambda text: base64.b64encode(text.encode()).decode()  # noqa: E731
    with ExitStack() as stack:
        process, url = start_etcd(ETCD, tmp_path, stack)
        port = int(url.rsplit(":", 1)[1])
        assert url.startswith("http://127.0.0.1:")
        put = _post(port, "/v3/kv/put", {"key": b64("/registry/e2e"), "value": b64("ok")})
        assert "header" in put
        got = _post(port, "/v3/kv/range", {"key": b64("/registry/e2e")})
        assert base64.b64decode(got["kvs"][0]["value"]) == b"ok"
        assert (tmp_path / "etcd-data" / "member").is_dir()
        listening = _listening_ports(process.popen.pid)
        assert port in listening and len(listening) == 2  # client and peer, nothing else
    assert not process.alive
    with pytest.raises(OSError):
        local_get(port, "/health", timeout=2)


@pytest.mark.skipif(ETCD is None, reason="no etcd binary (KUBE_BIN_DIR/etcd or etcd on PATH; "
                                         "Debian: apt-get install etcd-server)")
def test_a_failed_start_says_why_and_stops_what_already_runs(tmp_path: Path) -> None:
    """A kube-apiserver that refuses its flags: start_cluster fails at once with its log, and the ExitStack
    stops the etcd that was already running."""
    assert ETCD is not None
    bins = tmp_path / "bins"
    bins.mkdir()
    (bins / "etcd").symlink_to(ETCD)
    _fake_binaries(bins, ("kube-scheduler",))
    (bins / "kube-apiserver").write_text('#!/bin/sh\necho "Error: unknown flag: --imaginary" >&2\nexit 1\n')
    (bins / "kube-apiserver").chmod(0o755)
    binaries, problem = find_kube_binaries({"KUBE_BIN_DIR": str(bins), "PATH": ""})
    assert problem is None and binaries is not None
    first = len(started_processes())
    started = time.monotonic()
    with pytest.raises(StartupError, match=r"(?s)kube-apiserver died.*exited with code 1.*unknown flag: --imaginary"):
        with ExitStack() as stack:
            start_cluster(binaries, tmp_path / "work", stack)
    assert time.monotonic() - started < 120
    mine = started_processes()[first:]
    assert [process.name for process in mine] == ["etcd", "kube-apiserver"]
    assert not any(process.alive for process in mine)
    assert all(process.popen.returncode is not None for process in mine)  # reaped by stop()


def _listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on, from /proc (its sockets' inodes against /proc/net/tcp*)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


# ---------------------------------------------------------------------------------------------------------
# The scheduler's configuration
# ---------------------------------------------------------------------------------------------------------

def test_scheduler_config_keeps_ours_and_points_at_the_local_extender(tmp_path: Path) -> None:
    source = yaml.safe_load(SCHEDULER_CONFIG_SOURCE.read_text())
    tls = {"caFile": "/e2e/ca.crt", "certFile": "/e2e/scheduler.crt", "keyFile": "/e2e/scheduler.key"}
    derived = derive_scheduler_config(source, kubeconfig=tmp_path / "scheduler.kubeconfig",
                                      extender_url="https://127.0.0.1:41234", tls=tls)
    assert derived["profiles"] == source["profiles"]
    assert derived["apiVersion"] == source["apiVersion"] and derived["kind"] == source["kind"]
    assert derived["clientConnection"] == {"kubeconfig": str(tmp_path / "scheduler.kubeconfig")}
    assert derived["leaderElection"] == {"leaderElect": False}
    (ours,), (shipped,) = derived["extenders"], source["extenders"]
    changed = {"urlPrefix", "tlsConfig"}
    assert {k: v for k, v in ours.items() if k not in changed} == {k: v for k, v in shipped.items() if k not in changed}
    assert ours["urlPrefix"] == "https://127.0.0.1:41234" and ours["enableHTTPS"] is True
    assert ours["tlsConfig"] == {"insecure": False, **tls}
    assert ours["ignorable"] is False and ours["bindVerb"] == "bind" and ours["weight"] == shipped["weight"]
    assert source["extenders"][0]["urlPrefix"].startswith("https://gpu-topology-extender.")  # source untouched
    assert kube_scheduler_errors(derived) == []
    assert kube_scheduler_errors(yaml.safe_load(yaml.safe_dump(derived))) == []
    assert scheduler_name(derived) == "gpu-topology-scheduler"

    plain = derive_scheduler_config(source, kubeconfig=tmp_path / "k", extender_url="http://127.0.0.1:1", tls=None)
    assert plain["extenders"][0]["enableHTTPS"] is False and "tlsConfig" not in plain["extenders"][0]
    assert kube_scheduler_errors(plain) == []


# ---------------------------------------------------------------------------------------------------------
# Nodes, pods and the reporter
# ---------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def topologies():
    return node_topologies()


def test_nodes_and_pods_are_valid_kubernetes_objects(topologies) -> None:
    for name, platform in NODES.items():
        kubernetes_validate.validate(gpu_node(name, platform, topologies[name]), KUBERNETES_VERSION, strict=True)
    pod = gpu_pod("p", 2, scheduler="gpu-topology-scheduler", node="node-v100",
                  annotations={"gpu-topology.io/interconnect": "nvlink"})
    kubernetes_validate.validate(pod, KUBERNETES_VERSION, strict=True)
    assert pod["spec"]["automountServiceAccountToken"] is False
    requests, limits = (pod["spec"]["containers"][0]["resources"][key] for key in ("requests", "limits"))
    assert requests["nvidia.com/gpu"] == limits["nvidia.com/gpu"] == "2"  # extended resources: equal or refused


def test_a_cluster_spec_reaches_nodes_pods_and_flags(topologies, tmp_path: Path) -> None:
    """What a module's ClusterSpec adds: node labels (NVLink clique, network levels), members of kube-scheduler's
    own PodGroup, and the gates and API versions on kube-apiserver's command line; valid 1.36 objects all."""
    labels = {"nvidia.com/gpu.clique": "9c6f5af3-53bf-49b5-a436-b66766c413c3.1",
              "network.topology.nvidia.com/leaf": "leaf-a"}
    node = gpu_node("node-v100", "dgx1-v100", topologies["node-v100"], labels=labels)
    assert labels.items() <= node["metadata"]["labels"].items()
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == "node-v100"
    member = gpu_pod("m0", 4, scheduler="gpu-topology-scheduler", pod_group="gang")
    assert member["spec"]["schedulingGroup"] == {"podGroupName": "gang"}
    assert "schedulingGroup" not in gpu_pod("solo", 1, scheduler="gpu-topology-scheduler")["spec"]
    group = pod_group("gang", 3)
    assert group["spec"]["schedulingPolicy"]["gang"]["minCount"] == 3
    for obj in (node, member, group):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
    argv = apiserver_argv(Path("/bin/kube-apiserver"), etcd_url="http://127.0.0.1:1", port=2, pki=Pki(tmp_path),
                          cert_dir=tmp_path, feature_gates=POD_GROUP_GATES, runtime_config=POD_GROUP_RUNTIME_CONFIG)
    assert "--feature-gates=GangScheduling=true,GenericWorkload=true" in argv
    assert "--runtime-config=scheduling.k8s.io/v1alpha2=true" in argv
    plain = apiserver_argv(Path("/bin/kube-apiserver"), etcd_url="http://127.0.0.1:1", port=2, pki=Pki(tmp_path),
                           cert_dir=tmp_path)
    assert not [arg for arg in plain if arg.startswith(("--feature-gates", "--runtime-config"))]


def test_the_extender_reads_the_harness_nodes(topologies) -> None:
    nodes = [gpu_node(name, platform, topologies[name]) for name, platform in NODES.items()]
    for node in nodes:
        annotation = node["metadata"]["annotations"][KEYS.topology]
        assert decode_topology(annotation).fingerprint == topologies[node["metadata"]["name"]].fingerprint
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    state = ClusterState(KEYS)
    state.nodes.replace(nodes)
    state.nodes.synced()
    now = time.time()
    for name in NODES:
        view = state.view(name)
        assert view is not None and view.problem is None and view.compiled is not None, view
        assert view.free == view.compiled.full_mask
        assert not state.is_stale(view, now)
    assert len({topologies[name].gpus[0].uuid for name in NODES}) == len(NODES)  # UUIDs differ per node


def _plain_kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
    }))
    return path


@pytest.fixture()
def fake_cluster(topologies, tmp_path: Path):
    """The harness's nodes held by the in-process fake API server, and a Kube client for it."""
    server = FakeKubeApiServer().start()
    for name, platform in NODES.items():
        server.add_node(gpu_node(name, platform, topologies[name]))
    kube = Kube(_plain_kubeconfig(tmp_path / "fake.kubeconfig", server.url))
    try:
        yield server, kube
    finally:
        kube.close()
        server.stop()


def test_fake_reporter_publishes_the_gpus_of_bound_pods(fake_cluster, topologies) -> None:
    server, kube = fake_cluster
    a6000 = [gpu.uuid for gpu in topologies["node-a6000-a"].gpus]
    v100 = [gpu.uuid for gpu in topologies["node-v100"].gpus]
    live = make_pod("live", "gpu-e2e", gpus=2, node_name="node-a6000-a", phase="Running",
                    annotations={KEYS.gpus: f"{a6000[0]},{a6000[1]}"})
    done = make_pod("done", "gpu-e2e", gpus=1, node_name="node-a6000-a", phase="Succeeded",
                    annotations={KEYS.gpus: a6000[5]})
    foreign = make_pod("foreign", "gpu-e2e", gpus=1, node_name="node-v100", annotations={KEYS.gpus: a6000[7]})
    pending = make_pod("pending", "gpu-e2e", gpus=1)
    other = make_pod("other", "default", gpus=1, node_name="node-v100", annotations={KEYS.gpus: v100[3]})
    for pod in (live, done, foreign, pending, other):
        server.add_pod(pod)

    reporter = FakeReporter(kube, topologies, interval=0.2)
    before = datetime.now(timezone.utc).replace(microsecond=0)
    states = reporter.refresh()

    expected = {"node-a6000-a": {a6000[0], a6000[1]}, "node-v100": {v100[3]}}
    for name in NODES:
        state = decode_state(server.node(name)["metadata"]["annotations"][KEYS.state])
        assert state.used == expected.get(name, set()), name
        assert state == states[name]
        assert before <= state.observed <= datetime.now(timezone.utc)
        assert state.generation == 1 and not state.unhealthy
        assert KEYS.topology in server.node(name)["metadata"]["annotations"]  # the patch kept the rest

    cluster_state = ClusterState(KEYS)
    cluster_state.nodes.replace([server.node(name) for name in NODES])
    view = cluster_state.view("node-a6000-a")
    assert view is not None and view.free == view.compiled.full_mask & ~0b11

    reporter.start()
    try:
        wait_until(lambda: decode_state(server.node("node-v100")["metadata"]["annotations"]
                                        [KEYS.state]).generation >= 3,
                   30, "two more reports from the reporter's thread")
    finally:
        reporter.stop()
    assert reporter._thread is not None and not reporter._thread.is_alive()
    assert reporter.errors == []


def test_node_patches_go_through_as_merge_patches(fake_cluster) -> None:
    """The harness lifts the not-ready taint with {"spec": {"taints": null}}; null must reach the server."""
    server, kube = fake_cluster
    node = server.node("node-v100")
    node["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    server.update_node(node)
    kube.patch_node("node-v100", {"spec": {"taints": None}})
    assert "taints" not in server.node("node-v100")["spec"]
    assert server.node("node-v100")["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


# ---------------------------------------------------------------------------------------------------------
# The real extender, as the suite starts it
# ---------------------------------------------------------------------------------------------------------

def test_the_extender_process_filters_and_binds_over_mtls(fake_cluster, topologies, pki, tmp_path: Path) -> None:
    """start_extender with the harness's certificates, against the fake API server holding the harness's
    nodes: kube-scheduler's client certificate gets in, a certificate-less client does not, a 2-GPU NVLink
    pod is bound to an NVLink pair, and a malformed one is refused with a reason and an Event naming it."""
    server, _ = fake_cluster
    pod = server.add_pod(gpu_pod("pair", 2, scheduler="gpu-topology-scheduler",
                                 annotations={"gpu-topology.io/interconnect": "nvlink",
                                              "gpu-topology.io/placement": "required"}))
    bad = server.add_pod(gpu_pod("bad", 1, scheduler="gpu-topology-scheduler",
                                 annotations={"gpu-topology.io/min-bandwidth": "fast"}))
    kubeconfig = _plain_kubeconfig(tmp_path / "extender.kubeconfig", server.url)
    with ExitStack() as stack:
        # Every fit passes (the shortlist, not one-best's one node), so that filter's answer shows each node.
        process, url = start_extender(tmp_path, kubeconfig, pki, stack, ("--no-one-best",))
        port = int(url.rsplit(":", 1)[1])
        scheduler = ssl.create_default_context(cafile=str(pki.ca))
        scheduler.verify_flags |= ssl.VERIFY_X509_STRICT
        scheduler.load_cert_chain(str(pki.cert("scheduler")), str(pki.key("scheduler")))
        names = sorted(NODES)

        verdict = _post(port, "/filter", {"Pod": pod, "NodeNames": names, "Nodes": None}, scheduler)
        assert sorted(verdict["NodeNames"]) == names, verdict
        answer = _post(port, "/bind", {"PodName": "pair", "PodNamespace": "gpu-e2e",
                                       "PodUID": pod["metadata"]["uid"], "Node": "node-a6000-a"}, scheduler)
        assert answer["Error"] == ""
        bound = server.pod("gpu-e2e", "pair")
        assert bound["spec"]["nodeName"] == "node-a6000-a"
        index = {gpu.uuid: gpu.index for gpu in topologies["node-a6000-a"].gpus}
        gpus = sorted(index[uuid] for uuid in bound["metadata"]["annotations"][KEYS.gpus].split(","))
        assert frozenset(gpus) in {frozenset((link.a, link.b)) for link in topologies["node-a6000-a"].nvlinks}

        refused = _post(port, "/filter", {"Pod": bad, "NodeNames": names, "Nodes": None}, scheduler)
        assert refused["NodeNames"] == [] and set(refused["FailedAndUnresolvableNodes"]) == set(names)
        assert all("gpu-topology.io/min-bandwidth" in reason
                   for reason in refused["FailedAndUnresolvableNodes"].values())
        event = wait_until(lambda: next((e for e in server.events if e.get("reason") == "InvalidGPUTopologyRequest"),
                                        None), 30, "the extender's InvalidGPUTopologyRequest event", watch=[process])
        assert event["involvedObject"]["name"] == "bad" and "gpu-topology.io/min-bandwidth" in event["message"]

        anonymous = ssl.create_default_context(cafile=str(pki.ca))
        with pytest.raises((ssl.SSLError, ConnectionError)):
            local_get(port, "/readyz", anonymous)
    assert not process.alive
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_an_unused_state_annotation_is_fresh(topologies) -> None:
    node = gpu_node("node-v100", "dgx1-v100", topologies["node-v100"])
    state = decode_state(node["metadata"]["annotations"][KEYS.state])
    assert state == NodeState(frozenset(), frozenset(), state.observed, 0)
    assert (datetime.now(timezone.utc) - state.observed).total_seconds() < 5
    assert encode_state(state) == node["metadata"]["annotations"][KEYS.state]
