"""The node agent's manifests: its two DaemonSets (mode b "scheduling only", --mode report, agent.yaml; mode a
"scheduling plus delivery", --mode deliver, agent-deliver.yaml), namespace, RBAC, and the ValidatingAdmissionPolicy
that confines it to its own Node's annotations.

- Every object validates strictly against the official Kubernetes 1.36 schemas (kubernetes-validate); the parametrized
  schema test of tests/manifests/test_manifests.py covers them too, as it covers every file in scheduler-config/.
- Which nodes each DaemonSet runs on is computed from its nodeSelector and node affinity, for every combination of
  the labels involved: each GPU node runs exactly one agent, and the deliver agent never runs where the GPU
  operator's device plugin does (its DaemonSet's own nodeSelector, quoted below).
- The DaemonSets, the namespace and the RBAC are read field by field against what each mode needs and no more; the
  deliver agent's init container that waits for NVIDIA's plugin is run for real against a live and a stale Unix
  socket.
- The deliver agent's other init container, which writes the CDI spec the agent's CDI device names need (NVIDIA's
  plugin writes it at its start; with that plugin off the node nothing else does, and /var/run/cdi is a tmpfs): its
  mounts, privileges and values are read against the agent's (the kind, DEFAULT_CDI_KIND of
  topology/agent/allocate.py; the directory the agent checks; device names = the agent's device ids, the UUIDs), and
  its script is run for real with a stand-in for nvidia-ctk that accepts only the flags of the real command
  (NVIDIA/nvidia-container-toolkit cmd/nvidia-ctk/cdi/generate/generate.go and cdi/transform/root/root.go, v1.18.0,
  the oldest image the manifest allows) and performs the root transform as the real one does
  (pkg/nvcdi/transform/root). No GPU, driver or NVIDIA image is involved.
- The policy's CEL is not re-implemented here: every expression is taken from agent-policy.yaml as it is, compiled
  with cel-python (a CEL implementation from PyPI) and evaluated against realistic AdmissionRequests and Nodes, in
  the order the API server applies a ValidatingAdmissionPolicy (manifest_checks.AdmissionPolicy). The expressions
  keep to portable CEL, and a test checks that they call no function outside that subset, so cel-python and
  Kubernetes agree on them.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import posixpath
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
from celpy import celtypes
from helpers.kube_api_server import merge_patch  # RFC 7386, as the API server applies the agent's PATCH
from topology.agent.allocate import DEFAULT_CDI_KIND, Delivery
from topology.agent.deviceplugin import CDI_SPEC_DIRS as AGENTS_CDI_SPEC_DIRS

from helpers.manifest_checks import (
    CONFIG,
    KUBERNETES_VERSION,
    AdmissionPolicy,
    Doc,
    Verdict,
    assert_denied,
    console_script_help,
    container,
    documents,
    flag_values,
    flatten_rules,
    load_yaml,
    non_portable_calls,
    obj,
    policy_expressions,
    policy_variable,
    program,
    quantity,
    runs_on,
)

AGENT_FILES = ("agent-namespace.yaml", "agent-rbac.yaml", "agent.yaml", "agent-deliver.yaml", "agent-policy.yaml")
NAMESPACE = "gpu-topology-node"
EXTENDER_NAMESPACE = "gpu-topology-system"
NAME = "gpu-topology-agent"  # the report agent's DaemonSet and ServiceAccount
DELIVER_NAME = "gpu-topology-agent-deliver"  # the deliver agent's
POLICY_NAME = "gpu-topology-agent-own-node-annotations"
GPU = "nvidia.com/gpu"
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"  # k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1 DevicePluginPath
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")  # CDI's default spec directories

# Our opt-in label, and the GPU operator's own switch for its device plugin on a node. The operator's DaemonSet runs
# its plugin where that label is "true": NVIDIA/gpu-operator assets/state-device-plugin/0500_daemonset.yaml line 20
# (`nodeSelector: nvidia.com/gpu.deploy.device-plugin: "true"`); it sets the label to "true" only where it is absent
# or empty, and keeps any other value an admin set (controllers/state_manager.go, addGPUStateLabels);
# k8s-driver-manager leaves "false" as it is while it pauses operands for a driver upgrade (cmd/driver-manager/main.go,
# maybeSetPaused) and turns "true" into "paused-for-driver-upgrade".
DELIVERY_LABEL = "gpu-topology.io/agent-mode"
OPERATOR_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
OPERATOR_PLUGIN_POD: Doc = {"nodeSelector": {OPERATOR_PLUGIN_LABEL: "true"}}
GPU_NODE_LABELS = (
    "nvidia.com/gpu.present",
    "feature.node.kubernetes.io/pci-10de.present",
    "feature.node.kubernetes.io/pci-0302_10de.present",
    "feature.node.kubernetes.io/pci-0300_10de.present",
)

REPORT = obj("DaemonSet", NAME, NAMESPACE)
DELIVER = obj("DaemonSet", DELIVER_NAME, NAMESPACE)
AGENTS = {"report": REPORT, "deliver": DELIVER}
POD = REPORT["spec"]["template"]["spec"]
MAIN = container(REPORT)
FLAGS = flag_values(MAIN["args"])
DELIVER_POD = DELIVER["spec"]["template"]["spec"]
DELIVER_MAIN = container(DELIVER)
DELIVER_FLAGS = flag_values(DELIVER_MAIN["args"])
INIT_CONTAINERS = {each["name"]: each for each in DELIVER_POD["initContainers"]}
WAIT = INIT_CONTAINERS["wait-for-nvidia-plugin-to-stop"]
GENERATE = INIT_CONTAINERS["generate-cdi-spec"]
SERVICE_ACCOUNT = obj("ServiceAccount", NAME, NAMESPACE)
DELIVER_SERVICE_ACCOUNT = obj("ServiceAccount", DELIVER_NAME, NAMESPACE)
POLICY = obj("ValidatingAdmissionPolicy", POLICY_NAME)
BINDING = obj("ValidatingAdmissionPolicyBinding", POLICY_NAME)
EXTENDER = obj("Deployment", "gpu-topology-extender", EXTENDER_NAMESPACE)
EXTENDER_FLAGS = flag_values(container(EXTENDER)["args"][1:])
AGENT_USER = f"system:serviceaccount:{NAMESPACE}:{NAME}"
DELIVER_USER = f"system:serviceaccount:{NAMESPACE}:{DELIVER_NAME}"
NODE_NAME_CLAIM = "authentication.kubernetes.io/node-name"  # k8s.io/apiserver/pkg/authentication/serviceaccount


def all_containers(daemonset: Doc) -> list[Doc]:
    spec = daemonset["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def host_path_mounts(daemonset: Doc, main: Doc) -> dict[str, tuple[str, str, bool]]:
    """The hostPath volumes that the container `main` mounts, as {host path: (hostPath type, mount path,
    read-only)}. Every hostPath volume of the Pod is mounted by some container."""
    pod = daemonset["spec"]["template"]["spec"]
    mounted = {m["name"] for each in all_containers(daemonset) for m in each.get("volumeMounts", [])}
    found = {}
    for volume in pod["volumes"]:
        if "hostPath" in volume:
            assert volume["name"] in mounted, volume["name"]
            mounts = [m for m in main.get("volumeMounts", []) if m["name"] == volume["name"]]
            assert len(mounts) <= 1
            for mount in mounts:
                found[volume["hostPath"]["path"]] = (volume["hostPath"].get("type", ""), mount["mountPath"],
                                                     mount.get("readOnly", False))
    return found


# ---------------------------------------------------------------------------------------------------------------
# Schemas and kustomize
# ---------------------------------------------------------------------------------------------------------------


def test_every_agent_object_validates_strictly_against_the_official_schema() -> None:
    kinds = []
    for file in AGENT_FILES:
        for doc in load_yaml(CONFIG / file):
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
            kinds.append(doc["kind"])
    assert sorted(kinds) == sorted([
        "Namespace", "ServiceAccount", "ServiceAccount", "ClusterRole", "ClusterRole", "ClusterRoleBinding",
        "ClusterRoleBinding", "DaemonSet", "DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "ResourceQuota",
    ])


def test_strict_validation_covers_the_admission_policy() -> None:
    broken = copy.deepcopy(BINDING)
    broken["spec"]["validationAction"] = broken["spec"].pop("validationActions")  # a plausible typo
    with pytest.raises(kubernetes_validate.ValidationError, match="validationAction"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_no_reporter_names_are_left() -> None:
    # The reporter became the agent: old names would install a second, unconfined copy next to it. (README.md
    # names them once, in the steps that remove an old installation.)
    for path in [*CONFIG.glob("*.yaml"), *CONFIG.glob("*.sh")]:
        assert "gpu-topology-reporter" not in path.read_text(), path.name
    assert not list(CONFIG.glob("reporter*"))


def test_kustomization_installs_both_agents_with_the_extenders_image() -> None:
    (kustomization,) = load_yaml(CONFIG / "kustomization.yaml")
    assert set(AGENT_FILES) <= set(kustomization["resources"])
    (image,) = kustomization["images"]
    for daemonset in AGENTS.values():
        for each in all_containers(daemonset):
            if each is GENERATE:
                continue  # NVIDIA's container toolkit image (below), which `images:` leaves alone
            assert each["image"] == container(EXTENDER)["image"], each["name"]
            assert each["image"].split(":")[0] == image["name"]  # so `images:` rewrites the agents' images too
    assert GENERATE["image"].split(":")[0] != image["name"]


# ---------------------------------------------------------------------------------------------------------------
# Where each agent runs
# ---------------------------------------------------------------------------------------------------------------

NODE_LABEL_CASES = list(itertools.product(
    # GPU labels: none, each one alone, two at once.
    [(), *((label,) for label in GPU_NODE_LABELS), GPU_NODE_LABELS[:2]],
    # Our label: absent, the value that switches delivery on, other values.
    [None, "deliver", "report", "Deliver", ""],
    # The operator's plugin label: absent, on, off, paused by k8s-driver-manager, empty.
    [None, "true", "false", "paused-for-driver-upgrade", ""],
))


def node_labels(gpu: tuple[str, ...], mode: str | None, plugin: str | None) -> dict[str, str]:
    labels = {"kubernetes.io/os": "linux", **{label: "true" for label in gpu}}
    if mode is not None:
        labels[DELIVERY_LABEL] = mode
    if plugin is not None:
        labels[OPERATOR_PLUGIN_LABEL] = plugin
    return labels


@pytest.mark.parametrize(("gpu", "mode", "plugin"), NODE_LABEL_CASES)
def test_every_gpu_node_runs_exactly_one_agent(gpu: tuple[str, ...], mode: str | None, plugin: str | None) -> None:
    labels = node_labels(gpu, mode, plugin)
    report, deliver = runs_on(POD, labels), runs_on(DELIVER_POD, labels)
    # Never beside the GPU operator's device plugin (two plugins for one resource).
    assert not (deliver and runs_on(OPERATOR_PLUGIN_POD, labels))
    if not gpu:
        assert not report and not deliver
        return
    assert report != deliver  # one agent, never two (they would both write the node's state)
    # Delivery exactly where the admin switched it on and the operator's plugin is off.
    assert deliver == (mode == "deliver" and plugin == "false")


def test_node_selection_is_readable() -> None:
    # The report agent: affinity only (a nodeSelector would AND with it). The deliver agent: its two switches in
    # the nodeSelector, where an operator looks first, and the GPU-node affinity.
    assert "nodeSelector" not in POD
    assert DELIVER_POD["nodeSelector"] == {DELIVERY_LABEL: "deliver", OPERATOR_PLUGIN_LABEL: "false"}
    for term in DELIVER_POD["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]:
        (expression,) = term["matchExpressions"]
        assert expression["key"] in GPU_NODE_LABELS and expression["operator"] == "In"


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_tolerates_the_gpu_taint_and_is_node_critical(mode: str) -> None:
    pod = AGENTS[mode]["spec"]["template"]["spec"]
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["priorityClassName"] == "system-node-critical"


def test_the_two_daemonsets_never_adopt_each_others_pods() -> None:
    for one, other in ((REPORT, DELIVER), (DELIVER, REPORT)):
        selector = one["spec"]["selector"]["matchLabels"]
        assert selector.items() <= one["spec"]["template"]["metadata"]["labels"].items()
        assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()


# ---------------------------------------------------------------------------------------------------------------
# Mounts
# ---------------------------------------------------------------------------------------------------------------


def test_report_agent_mounts_only_the_pod_resources_directory_read_only() -> None:
    assert host_path_mounts(REPORT, MAIN) == {POD_RESOURCES_DIR: ("Directory", POD_RESOURCES_DIR, True)}
    # The socket the agent dials is inside that mount.
    assert FLAGS["--socket"] == f"{POD_RESOURCES_DIR}/kubelet.sock"


def test_deliver_agent_mounts_the_device_plugins_directory_and_nothing_else_writable() -> None:
    assert host_path_mounts(DELIVER, DELIVER_MAIN) == {
        POD_RESOURCES_DIR: ("Directory", POD_RESOURCES_DIR, True),
        # Read-write: it creates its socket there and connects to the kubelet's kubelet.sock.
        DEVICE_PLUGIN_DIR: ("Directory", DEVICE_PLUGIN_DIR, False),
        # Read-only, for the check that a CDI spec defines the kind it hands out.
        **{path: ("DirectoryOrCreate", path, True) for path in CDI_SPEC_DIRS},
    }
    assert DELIVER_FLAGS["--socket"] == f"{POD_RESOURCES_DIR}/kubelet.sock"
    assert DELIVER_FLAGS["--device-plugin-dir"].rstrip("/") == DEVICE_PLUGIN_DIR
    # The CDI directories are where the agent looks for specs (topology/agent/deviceplugin.py).
    assert tuple(AGENTS_CDI_SPEC_DIRS) == CDI_SPEC_DIRS


def test_the_init_container_watches_nvidias_plugin_socket_read_only() -> None:
    assert host_path_mounts(DELIVER, WAIT) == {DEVICE_PLUGIN_DIR: ("Directory", DEVICE_PLUGIN_DIR, True)}
    command = WAIT["command"]
    assert command[:2] == ["python", "-c"]
    # NVIDIA's plugin serves resource <vendor>/<name> on nvidia-<name>.sock (internal/plugin/server.go,
    # getPluginSocketPath): for our --gpu-resource, in the mounted directory.
    resource_name = DELIVER_FLAGS["--gpu-resource"].split("/", 1)[1]
    assert command[3] == f"{DEVICE_PLUGIN_DIR}/nvidia-{resource_name}.sock"
    # Not our own socket (topology/agent/deviceplugin.py DEFAULT_SOCKET_NAME).
    from topology.agent.deviceplugin import DEFAULT_SOCKET_NAME

    assert PurePosixPath(command[3]).name != DEFAULT_SOCKET_NAME


def _wait(path: str) -> subprocess.Popen[str]:
    script = WAIT["command"][2]
    return subprocess.Popen([sys.executable, "-c", script, path], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_the_init_container_waits_only_while_a_plugin_listens() -> None:
    directory = tempfile.mkdtemp(prefix="dp-", dir="/tmp")  # short: a Unix socket path holds 107 bytes
    path = os.path.join(directory, "nvidia-gpu.sock")
    try:
        # No socket at all: go at once.
        assert _wait(path).wait(timeout=30) == 0
        # A socket file nobody listens on (a killed plugin's): go at once.
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)
        stale.close()
        assert _wait(path).wait(timeout=30) == 0
        os.unlink(path)
        # A live plugin: wait, say why once, and go when it stops.
        live = socket.socket(socket.AF_UNIX)
        live.bind(path)
        live.listen()
        waiting = _wait(path)
        try:
            time.sleep(1.5)
            assert waiting.poll() is None
            live.close()
            os.unlink(path)
            assert waiting.wait(timeout=30) == 0
        finally:
            if waiting.poll() is None:
                waiting.kill()
                waiting.wait(timeout=10)
        out = waiting.stdout.read() if waiting.stdout else ""
        assert out.count("waiting for NVIDIA's device plugin to stop") == 1, out
    finally:
        for leftover in Path(directory).iterdir():
            leftover.unlink()
        os.rmdir(directory)


# ---------------------------------------------------------------------------------------------------------------
# The CDI spec: the init container generate-cdi-spec (deliver agent only)
# ---------------------------------------------------------------------------------------------------------------

CDI_VENDOR, CDI_CLASS = DEFAULT_CDI_KIND.split("/")
# NVIDIA's container toolkit image, as the GPU operator deploys it (ClusterPolicy spec.toolkit: repository
# nvcr.io/nvidia/k8s, image container-toolkit, version v1.20.0 in deployments/gpu-operator/values.yaml at v26.7.0).
# From v1.18.0 on it has /bin/sh and nvidia-ctk at /artifacts/deb/usr/bin/nvidia-ctk (deployments/container/Dockerfile:
# the installer's extracted deb packages; packaging/debian/nvidia-container-toolkit-base.install puts nvidia-ctk in
# /usr/bin).
TOOLKIT_IMAGE = re.compile(r"nvcr\.io/nvidia/k8s/container-toolkit:v(\d+)\.(\d+)\.(\d+)")
OLDEST_TOOLKIT = (1, 18, 0)
NVIDIA_CTK = "/artifacts/deb/usr/bin/nvidia-ctk"
# The GPU operator's driver roots (cmd/nvidia-validator/driver.go getDriverInfo; controllers/object_controls.go
# DefaultDriverInstallDir) and where its toolkit installs nvidia-cdi-hook (transformDevicePluginCtrForCDI:
# <toolkit.installDir>/toolkit/nvidia-cdi-hook, installDir defaulting to /usr/local/nvidia).
OPERATOR_DRIVER_ROOTS = ("/run/nvidia/driver", "/")
OPERATOR_CDI_HOOK = "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
SERVICE_ACCOUNT_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"  # DefaultAPITokenMountPath
# The flags of `nvidia-ctk cdi generate` and `nvidia-ctk cdi transform root` in the oldest image allowed (v1.18.0:
# cmd/nvidia-ctk/cdi/generate/generate.go and cmd/nvidia-ctk/cdi/transform/root/root.go; v1.20.0 only adds more).
GENERATE_FLAGS = {
    "config-search-path", "output", "format", "mode", "discovery-mode", "dev-root", "device-name-strategy",
    "driver-root", "library-search-path", "nvidia-cdi-hook-path", "nvidia-ctk-path", "ldconfig-path", "vendor",
    "cdi-vendor", "class", "cdi-class", "csv.file", "csv.ignore-pattern", "disable-hook", "disable-hooks",
    "enable-hook", "enable-hooks", "feature-flag", "feature-flags",
}
TRANSFORM_ROOT_FLAGS = {"from", "input", "output", "relative-to", "to"}


def generate_env() -> dict[str, str]:
    return {item["name"]: item["value"] for item in GENERATE["env"]}


def volume(daemonset: Doc, name: str) -> Doc:
    (found,) = [each for each in daemonset["spec"]["template"]["spec"]["volumes"] if each["name"] == name]
    return found


def mount_paths(each: Doc) -> dict[str, Doc]:
    return {mount["name"]: mount for mount in each.get("volumeMounts", [])}


SETTING = re.compile(r"([a-z_]+)=(/\S*)$")


def script_settings(script: str) -> dict[str, str]:
    """The `name=/path` lines that open the script: its paths in the container."""
    settings = {}
    for line in script.splitlines()[1:]:
        found = SETTING.fullmatch(line)
        if not found:
            break
        settings[found[1]] = found[2]
    return settings


def test_only_the_deliver_agent_writes_the_cdi_spec_after_nvidias_plugin_has_stopped() -> None:
    assert "initContainers" not in POD  # the report agent hands out nothing: NVIDIA's plugin writes its own spec
    # After the wait: NVIDIA's plugin writes the same file at its start, and must not be starting any more.
    assert [each["name"] for each in DELIVER_POD["initContainers"]] == [WAIT["name"], GENERATE["name"]]
    for each in all_containers(REPORT):
        assert not TOOLKIT_IMAGE.match(each["image"]), each["name"]
    (toolkit,) = [each for each in all_containers(DELIVER) if TOOLKIT_IMAGE.match(each["image"])]
    assert toolkit is GENERATE


def test_the_cdi_spec_is_written_where_the_agent_checks_for_its_kind() -> None:
    settings = script_settings(GENERATE["command"][2])
    spec = PurePosixPath(settings["spec"])
    # The directory: read-write here, read-only in the agent, the same host directory, one the agent checks at start
    # (topology/agent/deviceplugin.py) and the container runtime reads (CDI's default directories).
    mounts = mount_paths(GENERATE)
    assert str(spec.parent) == mounts["cdi-run"]["mountPath"] == "/var/run/cdi"
    assert not mounts["cdi-run"].get("readOnly", False)
    assert volume(DELIVER, "cdi-run")["hostPath"]["path"] == str(spec.parent)
    assert mount_paths(DELIVER_MAIN)["cdi-run"]["mountPath"] == str(spec.parent)
    assert str(spec.parent) in AGENTS_CDI_SPEC_DIRS and str(spec.parent) in CDI_SPEC_DIRS
    # The file: NVIDIA's plugin's own name for it, <vendor>-<class>.json (internal/cdi/cdi.go CreateSpecFile:
    # cdiapi.GenerateNameForSpec), so one replaces the other; two files defining the same devices in one directory
    # would make the runtime drop those devices.
    assert spec.name == f"{CDI_VENDOR}-{CDI_CLASS}.json"
    # The kind it defines is the one the agent hands out: no --cdi-kind, so the agent's default.
    assert DELIVER_FLAGS.get("--cdi-kind", DEFAULT_CDI_KIND) == DEFAULT_CDI_KIND
    script = GENERATE["command"][2]
    assert f"--vendor={CDI_VENDOR} " in script and f"--class={CDI_CLASS} " in script


def test_the_cdi_init_container_mounts_the_driver_root_and_dev_read_only_and_writes_only_the_spec() -> None:
    settings = script_settings(GENERATE["command"][2])
    env = generate_env()
    assert host_path_mounts(DELIVER, GENERATE) == {
        # The driver root, read-only, at a fixed path; NVIDIA_DRIVER_ROOT says where it is on the host.
        env["NVIDIA_DRIVER_ROOT"]: ("Directory", settings["driver_root"], True),
        # The host's /dev, read-only, for a driver root without a dev directory of its own.
        "/dev": ("Directory", settings["host_dev"] + "/dev", True),
        # Where the spec goes.
        "/var/run/cdi": ("DirectoryOrCreate", "/var/run/cdi", False),
    }
    mounts = mount_paths(GENERATE)
    assert set(mounts) == {"driver-root", "host-dev", "cdi-run", "cdi-work", "no-api-token"}
    for name in ("driver-root", "host-dev"):
        assert mounts[name]["recursiveReadOnly"] == "IfPossible"
    # The spec before its root transforms: an emptyDir, as the root filesystem is read-only.
    assert "emptyDir" in volume(DELIVER, "cdi-work") and mounts["cdi-work"]["mountPath"] == settings["work"]
    # No ServiceAccount token: a mount at its path keeps the API server's ServiceAccount admission from adding one
    # (plugin/pkg/admission/serviceaccount/admission.go, mountServiceAccountToken).
    assert mounts["no-api-token"] == {"name": "no-api-token", "mountPath": SERVICE_ACCOUNT_TOKEN_DIR, "readOnly": True}
    assert "emptyDir" in volume(DELIVER, "no-api-token")
    # The agent itself mounts neither the driver root nor /dev, and the CDI directory only read-only (above).
    assert not {"driver-root", "host-dev", "cdi-work", "no-api-token"} & set(mount_paths(DELIVER_MAIN))


def test_the_cdi_init_container_runs_the_operators_toolkit_with_the_operators_paths() -> None:
    image = TOOLKIT_IMAGE.fullmatch(GENERATE["image"])
    assert image, GENERATE["image"]
    assert tuple(int(part) for part in image.groups()) >= OLDEST_TOOLKIT
    assert GENERATE["imagePullPolicy"] == "IfNotPresent"  # the operator's toolkit DaemonSet pulled it already
    assert GENERATE["command"][:2] == ["/bin/sh", "-c"]
    assert script_settings(GENERATE["command"][2])["ctk"] == NVIDIA_CTK
    env = generate_env()
    assert env["NVIDIA_DRIVER_ROOT"] in OPERATOR_DRIVER_ROOTS
    assert volume(DELIVER, "driver-root")["hostPath"]["path"] == env["NVIDIA_DRIVER_ROOT"]  # kept in step
    assert env["NVIDIA_CDI_HOOK_PATH"] == OPERATOR_CDI_HOOK
    # NVML, to list the GPUs and their UUIDs, through the nvidia runtime class as the agent has it: the runtime adds
    # the device nodes, so the container need not be privileged (the security test below checks it is not).
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert DELIVER_POD["runtimeClassName"] == "nvidia"


# A stand-in for nvidia-ctk: the two commands the script runs, each refusing flags the real one does not define,
# recorded one JSON line per call. `cdi generate` writes a spec as nvcdi lays it out (host paths under the driver
# root and the dev root, one device per GPU and name strategy); `cdi transform root` moves host paths from one root
# to another as pkg/nvcdi/transform/root does relative to the host (host-root.go, root.go transformPath).
FAKE_NVIDIA_CTK = """#!{python}
import json, os, posixpath, sys

GENERATE, TRANSFORM = {generate!r}, {transform!r}
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"


def flags(args, known):
    values = {{}}
    while args:
        arg = args.pop(0)
        if not arg.startswith("--"):
            sys.exit("unexpected argument " + arg)
        name, _, value = arg[2:].partition("=")
        if name not in known:
            sys.exit("flag provided but not defined: -" + name)
        if not _:
            value = args.pop(0)
        values.setdefault(name, []).append(value)
    return values


def moved(path, root, target):
    root = root if root.endswith("/") else root + "/"
    if not (path + "/").startswith(root):
        return path
    return posixpath.normpath(posixpath.join(target, (path + "/")[len(root):]))


def save(spec, path):
    with open(path, "w") as out:
        json.dump(spec, out)


with open(os.environ["FAKE_CTK_LOG"], "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
if sys.argv[1:3] == ["cdi", "generate"]:
    given = flags(sys.argv[3:], GENERATE)
    one = {{name: values[-1] for name, values in given.items()}}
    if os.environ.get("FAKE_CTK_FAIL"):
        sys.exit("failed to generate CDI spec: failed to create device CDI specs: failed to initialize NVML")
    driver_root = one.get("driver-root", "/")
    dev_root = one.get("dev-root", driver_root)
    if not os.path.exists(driver_root + LIBCUDA):
        sys.exit("failed to locate driver libraries in " + driver_root)
    uuids = os.environ["FAKE_GPUS"].split(",")
    strategies = [s for values in given.get("device-name-strategy", ["index,uuid"]) for s in values.split(",")]
    devices = []
    for strategy in strategies:
        for index, uuid in enumerate(uuids):
            node = "/dev/nvidia%d" % index
            if not os.path.exists(dev_root + node):
                sys.exit("device node %s not found under %s" % (node, dev_root))
            name = {{"uuid": uuid, "index": str(index)}}[strategy]
            devices.append({{"name": name, "containerEdits": {{"deviceNodes": [
                {{"path": node, "hostPath": posixpath.normpath(dev_root + node)}}]}}}})
    hook = one.get("nvidia-cdi-hook-path", "/usr/bin/nvidia-cdi-hook")
    save({{
        "cdiVersion": "0.5.0",
        "kind": one.get("vendor", "nvidia.com") + "/" + one.get("class", "gpu"),
        "devices": devices,
        "containerEdits": {{
            "deviceNodes": [{{"path": "/dev/nvidiactl", "hostPath": posixpath.normpath(dev_root + "/dev/nvidiactl")}}],
            "mounts": [{{"hostPath": posixpath.normpath(driver_root + LIBCUDA), "containerPath": LIBCUDA,
                         "options": ["ro", "nosuid", "nodev", "rbind", "rprivate"]}}],
            "hooks": [{{"hookName": "createContainer", "path": hook,
                        "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]}}],
        }},
    }}, one["output"])
elif sys.argv[1:4] == ["cdi", "transform", "root"]:
    one = {{name: values[-1] for name, values in flags(sys.argv[4:], TRANSFORM).items()}}
    if one.get("relative-to", "host") != "host":
        sys.exit("only host-relative transforms are faked")
    with open(one["input"]) as source:
        spec = json.load(source)
    root, target = one["from"], one.get("to", "")
    for edits in [spec["containerEdits"], *(device["containerEdits"] for device in spec["devices"])]:
        for node in edits.get("deviceNodes", []):
            node["hostPath"] = moved(node.get("hostPath") or node["path"], root, target)
        for mount in edits.get("mounts", []):
            mount["hostPath"] = moved(mount["hostPath"], root, target)
        for hook in edits.get("hooks", []):
            if hook["hookName"] != "startContainer":
                hook["path"] = moved(hook["path"], root, target)
    save(spec, one["output"])
else:
    sys.exit("not faked: " + " ".join(sys.argv[1:]))
"""

FAKE_GPUS = ("GPU-2f1b6c0e-8f0a-4d7e-9c1a-0b5e6f7a8b9c", "GPU-7a3d9e21-5b4c-4f6a-8e2d-1c0b9a8f7e6d")


def run_generate(tmp: Path, *, driver_root: str, own_dev: bool, fail: bool = False) -> tuple[
        subprocess.CompletedProcess[str], list[list[str]], Path]:
    """The init container's script with its container paths moved under `tmp`, a fake driver root (with or without
    a dev directory of its own) and a fake host /dev, and the stand-in for nvidia-ctk."""
    script = GENERATE["command"][2]
    settings = script_settings(script)
    fake = {
        "ctk": tmp / "nvidia-ctk",
        "driver_root": tmp / "driver-root",
        "host_dev": tmp / "host-dev",
        "spec": tmp / "cdi" / PurePosixPath(settings["spec"]).name,
        "work": tmp / "work",
    }
    assert set(settings) == set(fake)
    for name, value in settings.items():
        script = script.replace(f"\n{name}={value}\n", f"\n{name}={fake[name]}\n", 1)
    fake["ctk"].write_text(FAKE_NVIDIA_CTK.format(python=sys.executable, generate=sorted(GENERATE_FLAGS),
                                                  transform=sorted(TRANSFORM_ROOT_FLAGS)))
    fake["ctk"].chmod(0o755)
    libcuda = fake["driver_root"] / "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
    libcuda.parent.mkdir(parents=True)
    libcuda.touch()
    dev_dirs = [fake["host_dev"] / "dev", *([fake["driver_root"] / "dev"] if own_dev else [])]
    for dev in dev_dirs:
        dev.mkdir(parents=True)
        for node in ["nvidiactl", *(f"nvidia{index}" for index in range(len(FAKE_GPUS)))]:
            (dev / node).touch()
    fake["spec"].parent.mkdir()
    fake["work"].mkdir()
    log = tmp / "calls.jsonl"
    env = {**generate_env(), "NVIDIA_DRIVER_ROOT": driver_root, "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
           "FAKE_CTK_LOG": str(log), "FAKE_GPUS": ",".join(FAKE_GPUS), **({"FAKE_CTK_FAIL": "1"} if fail else {})}
    result = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True, timeout=60,
                            check=False)
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return result, calls, fake["spec"]


def call_flags(call: list[str]) -> dict[str, str]:
    return dict(arg[2:].split("=", 1) for arg in call if arg.startswith("--"))


# Where the driver is on the host, and whether its root has a dev directory of its own: NVIDIA's plugin then takes
# the device nodes from there, else from the host's /dev (cmd/nvidia-device-plugin/root.go getDevRoot); the GPU
# operator's validator decides the same for NVIDIA_DEV_ROOT (cmd/nvidia-validator/driver.go getDriverInfo).
DRIVER_LAYOUTS = {
    "the operator's driver container, its own /dev": ("/run/nvidia/driver", True, "/run/nvidia/driver/dev"),
    "the operator's driver container, nodes in the host's /dev": ("/run/nvidia/driver", False, "/dev"),
    "a driver installed on the host (its root / has /dev)": ("/", True, "/dev"),
}


@pytest.mark.parametrize("layout", list(DRIVER_LAYOUTS))
def test_the_cdi_init_container_writes_the_agents_kind_with_host_paths(layout: str, tmp_path: Path) -> None:
    driver_root, own_dev, dev_dir = DRIVER_LAYOUTS[layout]
    result, calls, spec_path = run_generate(tmp_path, driver_root=driver_root, own_dev=own_dev)
    assert result.returncode == 0, result.stderr
    assert f"wrote {spec_path}" in result.stdout
    generate, *transforms = calls
    assert generate[:2] == ["cdi", "generate"]
    assert [call[:3] for call in transforms] == [["cdi", "transform", "root"]] * 2
    flags = call_flags(generate)
    # The agent's kind, devices named by UUID only (nvidia-ctk's default is index and uuid), the operator's hook.
    assert f"{flags['vendor']}/{flags['class']}" == DEFAULT_CDI_KIND
    assert flags["device-name-strategy"] == "uuid"
    assert flags["nvidia-cdi-hook-path"] == OPERATOR_CDI_HOOK
    assert {call_flags(call)["relative-to"] for call in transforms} == {"host"}

    spec = json.loads(spec_path.read_text())
    assert spec["kind"] == DEFAULT_CDI_KIND
    assert [device["name"] for device in spec["devices"]] == list(FAKE_GPUS)
    # Every CDI name the agent's Allocate gives for these GPUs (its device ids) is a device of this spec.
    answer = Delivery().answer(list(FAKE_GPUS), "response")
    assert answer.cdi_devices == tuple(f"{DEFAULT_CDI_KIND}={uuid}" for uuid in FAKE_GPUS)
    for qualified in answer.cdi_devices:
        kind, name = qualified.split("=")
        assert kind == spec["kind"] and name in {device["name"] for device in spec["devices"]}
    # Host paths as the runtime on the host sees them: nothing of the container's paths is left.
    nodes = [node["hostPath"] for edits in [spec["containerEdits"], *(d["containerEdits"] for d in spec["devices"])]
             for node in edits.get("deviceNodes", [])]
    assert nodes and all(posixpath.dirname(node) == dev_dir for node in nodes), nodes
    (mount,) = spec["containerEdits"]["mounts"]
    assert mount["hostPath"] == posixpath.join(driver_root, mount["containerPath"].lstrip("/"))
    assert spec["containerEdits"]["hooks"][0]["path"] == OPERATOR_CDI_HOOK
    assert str(tmp_path) not in spec_path.read_text()
    assert sorted(path.name for path in spec_path.parent.iterdir()) == [spec_path.name]


def test_the_cdi_init_container_fails_visibly_and_writes_nothing_without_a_driver(tmp_path: Path) -> None:
    result, calls, spec_path = run_generate(tmp_path, driver_root="/run/nvidia/driver", own_dev=True, fail=True)
    # A failed init container is run again by the kubelet (with backoff); the agent does not start before.
    assert result.returncode != 0
    assert len(calls) == 1 and not spec_path.exists()
    assert "NVIDIA_DRIVER_ROOT=/run/nvidia/driver" in result.stderr and "was not written" in result.stderr


def test_the_fake_nvidia_ctk_refuses_flags_the_real_one_does_not_define(tmp_path: Path) -> None:
    # The stand-in is strict, so the script's flags above are known to the real command.
    path = tmp_path / "nvidia-ctk"
    path.write_text(FAKE_NVIDIA_CTK.format(python=sys.executable, generate=sorted(GENERATE_FLAGS),
                                           transform=sorted(TRANSFORM_ROOT_FLAGS)))
    path.chmod(0o755)
    env = {**os.environ, "FAKE_CTK_LOG": str(tmp_path / "log"), "FAKE_GPUS": FAKE_GPUS[0]}
    for command in (["cdi", "generate", "--cdi-kind=k8s.device-plugin.nvidia.com/gpu"],
                    ["cdi", "transform", "root", "--driver-root=/"]):
        result = subprocess.run([str(path), *command], env=env, capture_output=True, text=True, timeout=30,
                                check=False)
        assert result.returncode != 0 and "flag provided but not defined" in result.stderr


# ---------------------------------------------------------------------------------------------------------------
# Resources, NVML, security
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_has_requests_and_limits_and_takes_no_gpu(mode: str) -> None:
    daemonset = AGENTS[mode]
    for each in all_containers(daemonset):
        resources = each["resources"]
        for name in ("cpu", "memory"):
            assert 0 < quantity(resources["requests"][name]) <= quantity(resources["limits"][name]), name
        assert GPU not in resources["requests"] and GPU not in resources["limits"]
    # NVML comes from the NVIDIA runtime instead: all device nodes, NVML's "utility" libraries, no CUDA.
    env = {item["name"]: item for item in container(daemonset)["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert daemonset["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_is_root_for_the_sockets_but_otherwise_unprivileged(mode: str) -> None:
    pod = AGENTS[mode]["spec"]["template"]["spec"]
    security = pod["securityContext"]
    # The kubelet's sockets are root:root in 0750 directories: only uid 0 may connect, and create one there.
    assert (security["runAsUser"], security["runAsGroup"], security["runAsNonRoot"]) == (0, 0, False)
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert set(security) == {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"}
    assert not {"hostNetwork", "hostPID", "hostIPC", "hostUsers", "shareProcessNamespace"} & set(pod)
    for each in all_containers(AGENTS[mode]):
        own = each["securityContext"]
        assert own == {"allowPrivilegeEscalation": False, "privileged": False, "readOnlyRootFilesystem": True,
                       "capabilities": {"drop": ["ALL"]}}, each["name"]


def test_command_lines_run_the_agent() -> None:
    for daemonset in AGENTS.values():
        assert container(daemonset)["command"] == ["gpu-topology-agent"]


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_command_line_matches_the_extender_and_the_policy(mode: str) -> None:
    main = container(AGENTS[mode])
    flags = flag_values(main["args"])
    assert flags["--in-cluster"] == ""
    # --node-name comes from the downward API.
    assert flags["--node-name"] == "$(NODE_NAME)"
    env = {item["name"]: item for item in main["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}}
    assert flags["--annotation-prefix"] == EXTENDER_FLAGS["--annotation-prefix"]
    assert flags["--annotation-prefix"] + "/" == policy_variable(POLICY, "prefix")
    assert flags["--gpu-resource"] == EXTENDER_FLAGS["--gpu-resource"] == GPU
    # The heartbeat refreshes the state well before the extender calls it stale.
    assert 0 < float(flags["--interval"]) < float(flags["--heartbeat"]) < float(EXTENDER_FLAGS["--stale-after"])


def test_report_agent_flags() -> None:
    known = {"--in-cluster", "--node-name", "--socket", "--interval", "--heartbeat", "--annotation-prefix",
             "--gpu-resource", "--log-level"}
    # No --mode: report is the default, so this DaemonSet also runs an agent built before the flag existed.
    assert set(FLAGS) <= known, set(FLAGS) - known


def test_deliver_agent_flags() -> None:
    assert DELIVER_FLAGS["--mode"] == "deliver"
    assert set(FLAGS) <= set(DELIVER_FLAGS)  # everything the report agent does, plus delivery
    assert set(DELIVER_FLAGS) - set(FLAGS) == {"--mode", "--device-plugin-dir", "--device-list-strategy"}
    assert "--numa-topology" not in DELIVER_FLAGS  # the Topology Manager must not override the extender's GPUs
    from topology.agent.allocate import parse_strategies

    strategies = parse_strategies(DELIVER_FLAGS["--device-list-strategy"])
    assert [s.value for s in strategies] == ["cdi-annotations", "cdi-cri"]


def test_the_agents_console_script_accepts_the_report_daemonsets_flags() -> None:
    help_text = console_script_help("gpu-topology-agent")
    for flag in FLAGS:
        assert flag in help_text, flag


def test_the_agents_console_script_accepts_the_deliver_daemonsets_flags() -> None:
    help_text = console_script_help("gpu-topology-agent")
    for flag in DELIVER_FLAGS:  # --mode, --device-plugin-dir and --device-list-strategy among them
        assert flag in help_text, flag
    assert "deliver" in help_text


@pytest.mark.parametrize("mode", list(AGENTS))
def test_agent_serves_no_port_and_has_no_probes(mode: str) -> None:
    # The report agent serves nothing; the deliver agent serves a Unix socket to the kubelet only (agent*.yaml).
    for each in all_containers(AGENTS[mode]):
        assert "ports" not in each
        assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(each)


@pytest.mark.parametrize(("daemonset", "account"), [(REPORT, SERVICE_ACCOUNT), (DELIVER, DELIVER_SERVICE_ACCOUNT)],
                         ids=["report", "deliver"])
def test_agent_runs_as_its_own_service_account_with_its_token(daemonset: Doc, account: Doc) -> None:
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == account["metadata"]["name"]
    assert account["metadata"]["namespace"] == daemonset["metadata"]["namespace"] == NAMESPACE
    # The Pod asks for the token it uses; the account gives none to a Pod that does not ask.
    assert pod["automountServiceAccountToken"] is True
    assert account["automountServiceAccountToken"] is False


# ---------------------------------------------------------------------------------------------------------------
# Namespace (Pod Security) and RBAC
# ---------------------------------------------------------------------------------------------------------------


def test_agent_lives_in_its_own_namespace_because_pod_security_requires_it() -> None:
    agent_ns = obj("Namespace", NAMESPACE)["metadata"]["labels"]
    extender_ns = obj("Namespace", EXTENDER_NAMESPACE)["metadata"]["labels"]
    # Pod Security Standards: "baseline" forbids hostPath volumes, "restricted" also requires runAsNonRoot.
    # The agents need both, so gpu-topology-system (restricted) would reject their Pods.
    for daemonset in AGENTS.values():
        pod = daemonset["spec"]["template"]["spec"]
        assert any("hostPath" in volume for volume in pod["volumes"])
        assert pod["securityContext"]["runAsNonRoot"] is False
    assert extender_ns["pod-security.kubernetes.io/enforce"] == "restricted"
    assert agent_ns["pod-security.kubernetes.io/enforce"] == "privileged"
    # Nothing else runs there.
    workloads = {(doc["kind"], doc["metadata"]["name"]) for _, doc in documents()
                 if doc.get("metadata", {}).get("namespace") == NAMESPACE
                 and doc["kind"] not in {"ServiceAccount", "ResourceQuota"}}
    assert workloads == {("DaemonSet", NAME), ("DaemonSet", DELIVER_NAME)}


def granted(account: str) -> set[tuple[str, str, str, tuple[str, ...]]]:
    """Every rule the ServiceAccount gets, through every binding in scheduler-config/ that names it."""
    rules: set[tuple[str, str, str, tuple[str, ...]]] = set()
    for _, doc in documents():
        if doc.get("kind") not in {"RoleBinding", "ClusterRoleBinding"}:
            continue
        if not any((s["kind"], s["name"], s.get("namespace")) == ("ServiceAccount", account, NAMESPACE)
                   for s in doc["subjects"]):
            continue
        assert doc["kind"] == "ClusterRoleBinding" and doc["roleRef"]["kind"] == "ClusterRole"
        assert doc["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        rules |= flatten_rules(obj("ClusterRole", doc["roleRef"]["name"])["rules"])
    return rules


def test_agent_rbac_is_exactly_what_each_mode_needs() -> None:
    node = {("", "nodes", "get", ()), ("", "nodes", "patch", ())}
    # report: its own Node's annotations, nothing else.
    assert granted(NAME) == node
    # deliver: the same, and list (read-only) on pods for the pods bound to its node (topology/agent/pods.py).
    # list on pods reads every Pod of the cluster (RBAC cannot restrict it to a field selector): only the deliver
    # agent's ServiceAccount has it.
    assert granted(DELIVER_NAME) == node | {("", "pods", "list", ())}
    roles = {doc["metadata"]["name"] for _, doc in documents() if doc.get("kind") == "ClusterRole"
             and doc["metadata"]["name"].startswith(NAME)}
    assert roles == {NAME, DELIVER_NAME}


# ---------------------------------------------------------------------------------------------------------------
# The ValidatingAdmissionPolicy: structure
# ---------------------------------------------------------------------------------------------------------------


def policy_prefix() -> str:
    return policy_variable(POLICY, "prefix")


def test_policy_watches_node_updates_and_fails_closed() -> None:
    spec = POLICY["spec"]
    assert POLICY["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert spec["failurePolicy"] == "Fail"
    assert "paramKind" not in spec
    (rule,) = spec["matchConstraints"]["resourceRules"]
    assert rule["apiGroups"] == [""] and rule["apiVersions"] == ["v1"]
    assert rule["operations"] == ["UPDATE"]  # PATCH arrives as UPDATE; create and delete are not granted
    assert set(rule["resources"]) == {"nodes", "nodes/status"}
    assert all(validation.get("reason") == "Forbidden" for validation in spec["validations"])


def test_binding_denies_with_the_policy() -> None:
    spec = BINDING["spec"]
    assert spec["policyName"] == POLICY["metadata"]["name"]
    assert spec["validationActions"] == ["Deny"]
    assert "paramRef" not in spec and "matchResources" not in spec


# ---------------------------------------------------------------------------------------------------------------
# The policy's CEL, evaluated with cel-python
# ---------------------------------------------------------------------------------------------------------------

EXPRESSIONS = policy_expressions(POLICY)
CONFINED = AdmissionPolicy(POLICY)


@pytest.mark.parametrize(("where", "expression"), EXPRESSIONS, ids=[where for where, _ in EXPRESSIONS])
def test_every_expression_compiles_with_cel_python_and_calls_only_portable_cel(where: str, expression: str) -> None:
    program(expression)
    assert not non_portable_calls(expression)


def admit(request: Doc) -> Verdict:
    return CONFINED.admit(request)


def matches_constraints(request: Doc) -> bool:
    return CONFINED.matches_constraints(request)


# A GPU node as the API server holds it (kubectl get node -o json, trimmed), before the agent's write.
OWN_NODE = "gpu-node-1"
NODE: Doc = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {
        "name": OWN_NODE,
        "uid": "5c1d7f4e-2b8a-4a8e-9d55-0c3e1f0a9b21",
        "resourceVersion": "48151623",
        "creationTimestamp": "2026-01-12T08:31:07Z",
        "labels": {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": OWN_NODE,
            "kubernetes.io/os": "linux",
            "node.kubernetes.io/instance-type": "p4d.24xlarge",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            "feature.node.kubernetes.io/pci-10de.present": "true",
        },
        "annotations": {
            "node.alpha.kubernetes.io/ttl": "0",
            "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            "csi.volume.kubernetes.io/nodeid": '{"ebs.csi.aws.com":"i-0a1b2c3d4e5f60718"}',
            "nfd.node.kubernetes.io/feature-labels": "pci-10de.present",
            "gpu-topology.io/topology": '{"v":1,"gpus":[],"fingerprint":"3f9a"}',
            "gpu-topology.io/state": '{"v":1,"used":[],"unhealthy":[],"observed":"2026-01-12T09:00:00Z",'
                                     '"generation":41}',
        },
        "managedFields": [
            {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-01-12T08:31:07Z",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:capacity": {}}}},
            {"manager": "gpu-topology-agent", "operation": "Update", "apiVersion": "v1",
             "time": "2026-01-12T09:00:00Z", "fieldsType": "FieldsV1",
             "fieldsV1": {"f:metadata": {"f:annotations": {"f:gpu-topology.io/state": {}}}}},
        ],
    },
    "spec": {
        "podCIDR": "10.244.7.0/24",
        "podCIDRs": ["10.244.7.0/24"],
        "providerID": "aws:///us-east-1a/i-0a1b2c3d4e5f60718",
        "taints": [{"key": GPU, "value": "present", "effect": "NoSchedule"}],
    },
    "status": {
        "capacity": {"cpu": "96", "memory": "1176481280Ki", GPU: "8", "pods": "110"},
        "allocatable": {"cpu": "95690m", "memory": "1163855360Ki", GPU: "8", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "lastHeartbeatTime": "2026-01-12T09:00:03Z", "lastTransitionTime": "2026-01-12T08:31:37Z"}],
        "addresses": [{"type": "InternalIP", "address": "10.0.7.21"}, {"type": "Hostname", "address": OWN_NODE}],
        "nodeInfo": {"kubeletVersion": "v1.36.2", "containerRuntimeVersion": "containerd://2.1.4",
                     "architecture": "amd64", "operatingSystem": "linux"},
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
    },
}
# The same node before the agent's first write: no annotations of ours, and none at all (the API server leaves
# out an empty map).
FRESH_NODE: Doc = copy.deepcopy(NODE)
del FRESH_NODE["metadata"]["annotations"]


def annotations_patch(**annotations: str | None) -> Callable[[Doc], Doc]:
    return lambda node: merge_patch(node, {"metadata": {"annotations": annotations}})


def edit(change: Callable[[Doc], None]) -> Callable[[Doc], Doc]:
    def apply(node: Doc) -> Doc:
        changed = copy.deepcopy(node)
        change(changed)
        return changed
    return apply


def pod_bound_extra(node_name: str) -> dict[str, list[str]]:
    """userInfo.extra of a Pod-bound service-account token on Kubernetes 1.32+ (ServiceAccountTokenPodNodeInfo)."""
    return {
        "authentication.kubernetes.io/credential-id": ["JTI=7b0f3c52-1d4e-4a2f-8f0e-3c9d2b1a6e57"],
        NODE_NAME_CLAIM: [node_name],
        "authentication.kubernetes.io/node-uid": ["5c1d7f4e-2b8a-4a8e-9d55-0c3e1f0a9b21"],
        "authentication.kubernetes.io/pod-name": [f"{NAME}-x7k2p"],
        "authentication.kubernetes.io/pod-uid": ["0e6f7a1b-93c4-4d2e-b5a8-6f1c2d3e4a5b"],
    }


def admission_request(change: Callable[[Doc], Doc], *, user: str = AGENT_USER,
                      extra: dict[str, list[str]] | None = None, old: Doc = NODE, sub_resource: str = "") -> Doc:
    """The AdmissionRequest of one write to a Node; `change` turns the stored Node into the Node after it."""
    new = change(old)
    # What the API server itself changes on every write before admission: the managedFields entry of the writer.
    new = copy.deepcopy(new)
    new["metadata"]["managedFields"][-1]["time"] = "2026-01-12T09:00:35Z"
    user_info: Doc = {"username": user, "uid": "0b8e0c2d-6a59-4d3f-9c1e-5b7a2f4d8e10",
                      "groups": ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                 "system:authenticated"]}
    if extra is None and user == AGENT_USER:
        extra = pod_bound_extra(OWN_NODE)
    if extra:  # left out, not empty, when the credential carries none (omitempty)
        user_info["extra"] = extra
    request = {
        "uid": "f3c5b1a2-9e8d-4c7b-a6f5-e4d3c2b1a098",
        "kind": {"group": "", "version": "v1", "kind": "Node"},
        "resource": {"group": "", "version": "v1", "resource": "nodes"},
        "requestKind": {"group": "", "version": "v1", "kind": "Node"},
        "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
        "name": old["metadata"]["name"],
        "operation": "UPDATE",
        "userInfo": user_info,
        "object": new,
        "oldObject": old,
        "dryRun": False,
        "options": {"kind": "PatchOptions", "apiVersion": "meta.k8s.io/v1", "fieldManager": NAME},
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return request


ALLOWED: dict[str, Doc] = {
    "first write of topology and state on a node without annotations": admission_request(
        annotations_patch(**{"gpu-topology.io/topology": '{"v":1}', "gpu-topology.io/state": '{"v":1}'}),
        old=FRESH_NODE),
    "state changed": admission_request(
        annotations_patch(**{"gpu-topology.io/state": '{"v":1,"used":["GPU-1"],"generation":42}'})),
    "state removed": admission_request(annotations_patch(**{"gpu-topology.io/state": None})),
    "both removed, leaving the other annotations": admission_request(
        annotations_patch(**{"gpu-topology.io/state": None, "gpu-topology.io/topology": None})),
    "a new annotation of ours": admission_request(annotations_patch(**{"gpu-topology.io/health": "ok"})),
    "heartbeat that changes nothing": admission_request(annotations_patch()),
    "same value written again by a PUT with a new resourceVersion": admission_request(
        edit(lambda n: n["metadata"].update(resourceVersion="48151624"))),
}


def set_label(key: str, value: str | None) -> Callable[[Doc], Doc]:
    return lambda node: merge_patch(node, {"metadata": {"labels": {key: value}}})


DENIED: dict[str, tuple[Doc, list[str]]] = {
    # Not its own Node.
    "another node's name in the claim": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra=pod_bound_extra("gpu-node-2")),
        ["its token is bound to node gpu-node-2, not to node gpu-node-1"]),
    "no extra at all (a legacy Secret token)": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra={}),
        ["its token is bound to no node, not to node gpu-node-1"]),
    "pod claims without the node claim (before Kubernetes 1.30)": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra={
            key: value for key, value in pod_bound_extra(OWN_NODE).items() if "node-" not in key}),
        ["bound to no node"]),
    "an empty node claim": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}), extra={NODE_NAME_CLAIM: []}),
        ["bound to no node"]),
    "two node names in the claim": (
        admission_request(annotations_patch(**{"gpu-topology.io/state": "{}"}),
                          extra={NODE_NAME_CLAIM: [OWN_NODE, "gpu-node-2"]}),
        ["bound to several nodes"]),
    # Labels.
    "a label added": (admission_request(set_label("gpu-topology.io/nvlink", "true")), ["labels"]),
    "a label changed": (admission_request(set_label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")), ["labels"]),
    "a label removed": (admission_request(set_label("nvidia.com/gpu.present", None)), ["labels"]),
    "a label together with our annotation": (
        admission_request(lambda n: merge_patch(n, {"metadata": {
            "labels": {"kubernetes.io/hostname": "gpu-node-9"}, "annotations": {"gpu-topology.io/state": "{}"}}})),
        ["labels"]),
    # Spec.
    "the GPU taint removed": (admission_request(edit(lambda n: n["spec"].pop("taints"))), ["spec"]),
    "a taint added": (
        admission_request(edit(lambda n: n["spec"]["taints"].append(
            {"key": "gpu-topology.io/broken", "effect": "NoExecute"}))),
        ["spec"]),
    "cordoned": (admission_request(edit(lambda n: n["spec"].update(unschedulable=True))), ["spec"]),
    "the whole spec dropped": (admission_request(edit(lambda n: n.pop("spec"))), ["spec"]),
    # Status (through nodes/status, which the agent is not granted either).
    "more GPUs in capacity": (
        admission_request(edit(lambda n: n["status"]["capacity"].update({GPU: "16"})), sub_resource="status"),
        ["status"]),
    "a condition changed": (
        admission_request(edit(lambda n: n["status"]["conditions"][0].update(status="False")),
                          sub_resource="status"),
        ["status"]),
    "the whole status dropped": (admission_request(edit(lambda n: n.pop("status")), sub_resource="status"),
                                 ["status"]),
    # Other metadata.
    "a finalizer added": (
        admission_request(edit(lambda n: n["metadata"].update(finalizers=["gpu-topology.io/keep"]))),
        ["finalizers"]),
    "an owner reference added": (
        admission_request(edit(lambda n: n["metadata"].update(ownerReferences=[
            {"apiVersion": "v1", "kind": "Namespace", "name": NAMESPACE, "uid": "1"}]))),
        ["finalizers, owner references"]),
    "a finalizer removed": (
        admission_request(edit(lambda n: n["metadata"].pop("finalizers")),
                          old=edit(lambda n: n["metadata"].update(finalizers=["gpu-topology.io/keep"]))(NODE)),
        ["finalizers"]),
    "marked for deletion": (
        admission_request(edit(lambda n: n["metadata"].update(deletionTimestamp="2026-01-12T09:00:35Z",
                                                               deletionGracePeriodSeconds=0))),
        ["other metadata"]),
    "another uid": (admission_request(edit(lambda n: n["metadata"].update(uid="0"))), ["other metadata"]),
    "a generateName added": (
        admission_request(edit(lambda n: n["metadata"].update(generateName="gpu-node-"))), ["other metadata"]),
    # Annotations that are not ours.
    "a foreign annotation changed": (
        admission_request(annotations_patch(**{"node.alpha.kubernetes.io/ttl": "30"})),
        ["may add or change only annotations under gpu-topology.io/, not node.alpha.kubernetes.io/ttl"]),
    "a foreign annotation added": (
        admission_request(annotations_patch(**{"example.com/owner": "me"})),
        ["not example.com/owner"]),
    "a foreign annotation removed": (
        admission_request(annotations_patch(**{"csi.volume.kubernetes.io/nodeid": None})),
        ["may remove only annotations under gpu-topology.io/, not csi.volume.kubernetes.io/nodeid"]),
    "a kubernetes.io annotation changed": (
        admission_request(annotations_patch(**{"volumes.kubernetes.io/controller-managed-attach-detach": "false"})),
        ["not volumes.kubernetes.io/controller-managed-attach-detach"]),
    "a kubernetes.io annotation added": (
        admission_request(annotations_patch(**{"kubernetes.io/description": "x"})),
        ["not kubernetes.io/description"]),
    "every annotation replaced by ours (a PUT)": (
        admission_request(edit(lambda n: n["metadata"].update(annotations={"gpu-topology.io/state": "{}"}))),
        ["may remove only annotations under gpu-topology.io/, not node.alpha.kubernetes.io/ttl"]),
    # Keys that only look like ours.
    "a lookalike domain": (
        admission_request(annotations_patch(**{"gpu-topology.io.evil.example/state": "{}"})),
        ["not gpu-topology.io.evil.example/state"]),
    "a subdomain of ours": (
        admission_request(annotations_patch(**{"x.gpu-topology.io/state": "{}"})), ["not x.gpu-topology.io/state"]),
    "a longer name": (
        admission_request(annotations_patch(**{"gpu-topology.iox/state": "{}"})), ["not gpu-topology.iox/state"]),
    "the bare domain without a slash": (
        admission_request(annotations_patch(**{"gpu-topology.io": "{}"})), ["not gpu-topology.io"]),
    # Several at once: every broken rule is reported.
    "another node and a foreign annotation": (
        admission_request(annotations_patch(**{"example.com/owner": "me"}), extra=pod_bound_extra("gpu-node-2")),
        ["bound to node gpu-node-2", "not example.com/owner"]),
}


@pytest.mark.parametrize("case", list(ALLOWED))
def test_policy_allows_the_agent_its_own_annotations_on_its_own_node(case: str) -> None:
    verdict = admit(ALLOWED[case])
    assert verdict.applies
    assert verdict.allowed, verdict.messages


@pytest.mark.parametrize("case", list(DENIED))
def test_policy_denies_everything_else_with_a_clear_message(case: str) -> None:
    assert_denied(CONFINED, *DENIED[case])


# What the policy lets the API server itself change in metadata, and what the other rules cover.
UNCHECKED_METADATA = {"resourceVersion", "managedFields"}
RULED_ELSEWHERE = {"annotations", "labels"}


def test_the_metadata_rule_names_every_field_of_object_meta() -> None:
    """A typed object cannot be ranged over (the API server's type check refuses it), so the rule names each field of
    ObjectMeta: all of them in the 1.36 schema but the four the other rules and the API server own, each compared on
    both sides (present in both and equal, or absent from both)."""
    schema = (Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
              / f"v{KUBERNETES_VERSION}-local-strict" / "objectmeta-meta-v1.json")
    fields = set(json.loads(schema.read_text())["properties"])
    (rule,) = [v["expression"] for v in POLICY["spec"]["validations"] if "finalizers" in v["message"]]
    named = set(re.findall(r"\bobject\.metadata\.(\w+)", rule))
    assert named == fields - UNCHECKED_METADATA - RULED_ELSEWHERE
    for field in named:
        assert (f"has(object.metadata.{field}) == has(oldObject.metadata.{field})" in " ".join(rule.split())
                and f"object.metadata.{field} == oldObject.metadata.{field}" in rule), field


def test_messages_name_the_prefix_of_the_manifests() -> None:
    verdict = admit(DENIED["a foreign annotation added"][0])
    assert verdict.messages == [
        f"gpu-topology-agent may add or change only annotations under {policy_prefix()}, not example.com/owner"
    ]


@pytest.mark.parametrize(
    ("username", "selected"),
    [
        (AGENT_USER, True),
        (DELIVER_USER, True),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:gpu-topology-extender", False),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:{NAME}", False),  # same name, another namespace
        (f"system:serviceaccount:{NAMESPACE}:default", False),
        (f"system:serviceaccount:{NAMESPACE}:{NAME}-2", False),
        (f"{AGENT_USER}x", False),
        (AGENT_USER.upper(), False),
        (f"system:serviceaccounts:{NAMESPACE}", False),  # the group name, not a user
        (f"system:node:{OWN_NODE}", False),
        ("kubernetes-admin", False),
        ("system:kube-controller-manager", False),
    ],
)
def test_match_condition_selects_exactly_the_agents_service_accounts(username: str, selected: bool) -> None:
    (condition,) = POLICY["spec"]["matchConditions"]
    result = CONFINED.condition(condition["name"], admission_request(annotations_patch(), user=username))
    assert isinstance(result, celtypes.BoolType) and bool(result) is selected


@pytest.mark.parametrize(
    ("user", "change", "sub_resource"),
    [
        (f"system:node:{OWN_NODE}", edit(lambda n: n["status"]["capacity"].update({GPU: "7"})), "status"),
        ("kubernetes-admin", set_label("nvidia.com/gpu.product", "x"), ""),
        ("kubernetes-admin", annotations_patch(**{"example.com/owner": "me"}), ""),
        (f"system:serviceaccount:{EXTENDER_NAMESPACE}:gpu-topology-extender", edit(
            lambda n: n["spec"].update(unschedulable=True)), ""),
    ],
    ids=["kubelet status", "admin label", "admin annotation", "another service account's cordon"],
)
def test_policy_leaves_everyone_else_alone(user: str, change: Callable[[Doc], Doc], sub_resource: str) -> None:
    verdict = admit(admission_request(change, user=user, extra={}, sub_resource=sub_resource))
    assert not verdict.applies and verdict.allowed


def test_policy_is_not_consulted_for_other_resources_or_operations() -> None:
    request = admission_request(annotations_patch())
    assert matches_constraints(request)
    assert not matches_constraints({**request, "operation": "DELETE"})
    assert not matches_constraints({**request, "resource": {"group": "", "version": "v1", "resource": "pods"}})
    assert not matches_constraints({**request, "subResource": "proxy"})


def test_an_evaluation_error_denies() -> None:
    # failurePolicy Fail: a request the expressions cannot read (here, a Node without metadata.name) is refused,
    # not let through.
    broken = admission_request(annotations_patch())
    del broken["object"]["metadata"]["name"]
    verdict = admit(broken)
    assert verdict.applies and not verdict.allowed
    assert any(message.startswith("evaluation error") for message in verdict.messages)


def as_deliver_agent(request: Doc) -> Doc:
    """The same request, made by the deliver agent's ServiceAccount (its Pod-bound token, same node claim)."""
    changed = copy.deepcopy(request)
    changed["userInfo"]["username"] = DELIVER_USER
    changed["userInfo"]["groups"] = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}",
                                     "system:authenticated"]
    return changed


@pytest.mark.parametrize("case", ["state changed", "a new annotation of ours", "state removed"])
def test_the_deliver_agent_may_write_its_own_annotations_too(case: str) -> None:
    verdict = admit(as_deliver_agent(ALLOWED[case]))
    assert verdict.applies and verdict.allowed, verdict.messages


@pytest.mark.parametrize("case", ["another node's name in the claim", "no extra at all (a legacy Secret token)",
                                  "a label added", "cordoned", "a foreign annotation added", "a lookalike domain"])
def test_the_deliver_agent_is_confined_the_same_way(case: str) -> None:
    request, expected = DENIED[case]
    verdict = admit(as_deliver_agent(request))
    assert verdict.applies and not verdict.allowed
    for part in expected:
        assert any(part in message for message in verdict.messages), (part, verdict.messages)
