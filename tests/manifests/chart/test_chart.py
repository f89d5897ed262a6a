"""The Helm chart (scheduler-config/chart/gpu-topology-extender), through Helm's own engine: lint, the versions,
the schema's refusals, and each mode's render: its objects, valid against Kubernetes 1.36's schemas, and every name
they refer to present in the same render.
"""

from __future__ import annotations

import base64
import subprocess
import textwrap
from pathlib import Path

import helm_python
import pytest
import yaml
from helpers.chart_render import (
    CHART,
    NAMESPACE,
    check_references,
    check_valid,
    chart,
    containers,
    find,
    key,
    notes,
    pod_spec,
    project_version,
    render,
    scheduler_config,
    secret_data,
)

from helpers.manifest_checks import flag_values, repeated_flag
from helpers.tools import required

TLS_SECRETS = ("gpu-topology-extender-tls", "gpu-topology-scheduler-client-tls")
# Made outside the render: by make-certs.sh (existingSecrets) or by cert-manager from the Certificates.
MADE_OUTSIDE = [("Secret", NAMESPACE, name) for name in (*TLS_SECRETS, "gpu-topology-seal")]


def kinds_and_names(docs) -> set[tuple[str, str]]:
    return {(doc["kind"], doc["metadata"]["name"]) for doc in docs}


def extender_args(docs) -> list[str]:
    return pod_spec(find(docs, "Deployment", "gpu-topology-extender"))["containers"][0]["args"]


def test_lint_is_clean() -> None:
    report = helm_python.lint(CHART, strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("values", [{"tls": {"mode": "certManager"}}, {"scheduler": {"mode": "controlPlane"}},
                                    {"agent": {"mode": "off"}}, {"observe": True, "profile": "gb200"}])
def test_lint_is_clean_in_each_mode(values) -> None:
    report = helm_python.lint(CHART, values, strict=True)
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []


def test_chart_versions_are_the_projects() -> None:
    metadata = chart().metadata
    assert metadata["apiVersion"] == "v2"
    assert metadata["version"] == metadata["appVersion"] == project_version()


@pytest.mark.parametrize(("values", "message"), [
    ({"agent": {"mode": "on"}}, "at '/agent/mode': value must be one of 'off', 'report', 'deliver'"),
    ({"tls": {"mode": "self-signed"}}, "at '/tls/mode': value must be one of 'selfSigned', 'certManager'"),
    ({"scheduler": {"mode": "B"}}, "at '/scheduler/mode': value must be one of 'secondary', 'controlPlane'"),
    ({"extender": {"replica": 3}}, "at '/extender': additional properties 'replica' not allowed"),
    ({"extender": {"replicas": 0}}, "at '/extender/replicas': minimum: got 0, want 1"),
    ({"extender": {"topologyWait": "10m"}}, "at '/extender/topologyWait': got string, want null or number"),
    ({"extender": {"extraArgs": ["observe"]}}, "at '/extender/extraArgs/0'"),
    ({"profile": "gb300"}, "at '/profile': value must be one of '', 'gb200'"),
    ({"agent": {"deliver": {"cdi": {"setup": "operator"}}}}, "at '/agent/deliver/cdi/setup': value must be one of"),
    ({"monitoring": {"podMonitor": True}, "extender": {"metricsPort": None}},
     "at '/extender': missing property 'metricsPort'"),  # null takes a default away in Helm
    ({"monitorin": {}}, "additional properties 'monitorin' not allowed"),
])
def test_schema_refuses_bad_values_saying_where_and_why(values, message) -> None:
    with pytest.raises(helm_python.HelmError) as refused:
        render(values)
    assert message in str(refused.value)


def test_schema_accepts_the_defaults_and_each_mode() -> None:
    chart().validate_schema(chart().values)
    for values in ({"tls": {"mode": "existingSecrets"}}, {"agent": {"mode": "report"}},
                   {"monitoring": {"podMonitor": True}, "extender": {"metricsPort": 8890}}):
        chart().validate_schema(chart().merge_values(values))


MODES = {
    "default": {},
    "secondary+existingSecrets": {"tls": {"mode": "existingSecrets"}, "seal": {"existingSecret": "gpu-topology-seal"}},
    "controlPlane": {"scheduler": {"mode": "controlPlane"}},
    "certManager": {"tls": {"mode": "certManager"}},
    "agent-off": {"agent": {"mode": "off"}},
    "agent-report": {"agent": {"mode": "report"}},
    "agent-deliver": {"agent": {"mode": "deliver"}},
    "observe": {"observe": True},
    "gb200": {"profile": "gb200"},
    "monitoring": {"monitoring": {"prometheusRule": True, "podMonitor": True, "grafanaDashboard": True},
                   "extender": {"metricsPort": 8890}},
    "no-policies": {"policies": {"enabled": False}},
    "dra": {"policies": {"draClaims": True}},
    "sendGpuPods": {"scheduler": {"sendGpuPods": True}},
    "other-namespace": {"agent": {"namespace": "gpu-agents"}},
}


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_renders_valid_objects_whose_references_hold(mode) -> None:
    docs = render(MODES[mode])
    assert len({key(doc) for doc in docs}) == len(docs), "an object rendered twice"
    check_valid(docs)
    check_references(docs, provided=MADE_OUTSIDE if mode in {"secondary+existingSecrets", "certManager"} else ())


def test_default_install_objects() -> None:
    got = kinds_and_names(render())
    for expected in [("Deployment", "gpu-topology-extender"), ("Service", "gpu-topology-extender"),
                     ("Deployment", "gpu-topology-scheduler"), ("ConfigMap", "gpu-topology-scheduler-config"),
                     ("DaemonSet", "gpu-topology-agent"), ("DaemonSet", "gpu-topology-agent-deliver"),
                     ("Namespace", "gpu-topology-node"), ("Secret", "gpu-topology-seal"), ("Secret", "gpu-topology-ca"),
                     *[("Secret", name) for name in TLS_SECRETS],
                     ("ValidatingAdmissionPolicy", "gpu-topology-bind-annotations"),
                     ("ValidatingAdmissionPolicy", "gpu-topology-extender-pod-writes"),
                     ("ValidatingAdmissionPolicy", "gpu-topology-agent-own-node-annotations")]:
        assert expected in got
    kinds = {kind for kind, _ in got}
    assert not kinds & {"PrometheusRule", "PodMonitor", "Certificate", "MutatingAdmissionPolicy"}


def test_control_plane_mode_has_no_scheduler_but_its_config_and_the_kubeadm_patch() -> None:
    values = {"scheduler": {"mode": "controlPlane"}}
    docs = render(values)
    got = kinds_and_names(docs)
    assert ("Deployment", "gpu-topology-scheduler") not in got
    assert ("ServiceAccount", "gpu-topology-scheduler") not in got
    config = scheduler_config(docs)
    assert [p["schedulerName"] for p in config["profiles"]][0] == "default-scheduler"
    assert config["clientConnection"]["kubeconfig"] == "/etc/kubernetes/scheduler.conf"
    text = notes(values)
    start = text.index("  apiVersion: kubeadm.k8s.io")
    patch = yaml.safe_load(textwrap.dedent(text[start:text.index("kube-scheduler runs with")]))
    assert patch["kind"] == "ClusterConfiguration"
    (config_arg,) = patch["scheduler"]["extraArgs"]
    mounts = {volume["mountPath"]: volume for volume in patch["scheduler"]["extraVolumes"]}
    assert config_arg == {"name": "config", "value": "/etc/kubernetes/gpu-topology-scheduler-config.yaml"}
    assert mounts[config_arg["value"]]["hostPath"] == config_arg["value"]
    # The configuration's TLS files are where the volume mounts them.
    (extender,) = config["extenders"]
    for path in extender["tlsConfig"].values():
        if isinstance(path, str):
            assert any(path.startswith(mount + "/") for mount in mounts)
    assert "dnsPolicy: ClusterFirstWithHostNet" in text
    assert "Option A" not in notes({})


def test_observe_mode_leaves_binding_to_kube_scheduler() -> None:
    docs = render({"observe": True})
    assert "--observe" in extender_args(docs)
    (extender,) = scheduler_config(docs)["extenders"]
    assert "bindVerb" not in extender and extender["ignorable"] is True
    assert extender["filterVerb"] == "filter" and extender["prioritizeVerb"] == "prioritize"
    (enforcing,) = scheduler_config(render())["extenders"]
    assert enforcing["bindVerb"] == "bind" and enforcing["ignorable"] is False
    assert "--observe" not in extender_args(render())


def test_scheduler_config_points_at_the_release_namespaces_service() -> None:
    docs = render(namespace="gpu-sched")
    (extender,) = scheduler_config(docs)["extenders"]
    assert extender["urlPrefix"] == "https://gpu-topology-extender.gpu-sched.svc:443"
    assert "--client-name=gpu-topology-extender.gpu-sched.svc" in extender_args(docs)
    # The policies name the release's ServiceAccount: otherwise the extender's own Bindings would be refused.
    policy = find(docs, "ValidatingAdmissionPolicy", "gpu-topology-bind-annotations")
    assert "system:serviceaccount:gpu-sched:gpu-topology-extender" in policy["spec"]["matchConditions"][0]["expression"]
    assert "gpu-topology-system" not in yaml.safe_dump_all(docs)


def test_gb200_profile_and_what_values_set_over_it() -> None:
    docs = render({"profile": "gb200"})
    assert flag_values(extender_args(docs))["--topology-levels"] == (
        "network.topology.nvidia.com/spine,network.topology.nvidia.com/leaf")
    command = pod_spec(find(docs, "Deployment", "gpu-topology-scheduler"))["containers"][0]["command"]
    assert "--feature-gates=SchedulerPopFromBackoffQ=false" in command
    mine = render({"profile": "gb200", "extender": {"topologyLevels": ["cloud.google.com/gce-topology-block"]},
                   "scheduler": {"featureGates": {"SchedulerPopFromBackoffQ": True, "GangScheduling": True}}})
    assert flag_values(extender_args(mine))["--topology-levels"] == "cloud.google.com/gce-topology-block"
    command = pod_spec(find(mine, "Deployment", "gpu-topology-scheduler"))["containers"][0]["command"]
    assert "--feature-gates=GangScheduling=true,SchedulerPopFromBackoffQ=true" in command
    plain = render()
    assert "--topology-levels" not in flag_values(extender_args(plain))
    assert not any(arg.startswith("--feature-gates") for arg in
                   pod_spec(find(plain, "Deployment", "gpu-topology-scheduler"))["containers"][0]["command"])


def test_extender_flags_and_placement_from_values() -> None:
    docs = render({"extender": {"topologyWait": 120, "groupTimeout": 90, "shortlist": 50, "replicas": 3,
                                "priorityClassName": "system-cluster-critical",
                                "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                                "tolerations": [{"key": "node-role.kubernetes.io/control-plane",
                                                 "operator": "Exists", "effect": "NoSchedule"}],
                                "extraArgs": ["--comm-share=0.5"]}})
    deployment = find(docs, "Deployment", "gpu-topology-extender")
    flags = flag_values(extender_args(docs))
    assert (flags["--topology-wait"], flags["--group-timeout"], flags["--shortlist"]) == ("120", "90", "50")
    assert "--no-one-best" not in extender_args(docs)  # one-best is the default
    assert "--no-one-best" in extender_args(render({"extender": {"oneBest": False}}))
    assert "--no-http2" not in extender_args(render({}))
    assert "--no-http2" in extender_args(render({"extender": {"http2": False}}))
    assert extender_args(docs)[-1] == "--comm-share=0.5"
    spec = pod_spec(deployment)
    assert deployment["spec"]["replicas"] == 3 and spec["priorityClassName"] == "system-cluster-critical"
    assert spec["nodeSelector"] == {"node-role.kubernetes.io/control-plane": ""}
    assert spec["tolerations"][0]["key"] == "node-role.kubernetes.io/control-plane"
    assert spec["affinity"]["podAntiAffinity"]  # still two nodes for two replicas
    assert repeated_flag(extender_args(docs), "--client-name") == ["kube-scheduler",
                                                                   "gpu-topology-extender.gpu-topology-system.svc"]


def test_extender_and_agent_images_apart() -> None:
    docs = render({"extender": {"image": {"repository": "registry.example/gte", "tag": "0.2.0"}},
                   "agent": {"image": {"repository": "registry.example/gte", "tag": "0.1.0"}}})
    assert pod_spec(find(docs, "Deployment", "gpu-topology-extender"))["containers"][0]["image"] == (
        "registry.example/gte:0.2.0")
    for name in ("gpu-topology-agent", "gpu-topology-agent-deliver"):
        images = {c["name"]: c["image"] for c in containers(find(docs, "DaemonSet", name))}
        assert images["agent"] == "registry.example/gte:0.1.0"
    deliver = {c["name"]: c["image"] for c in containers(find(docs, "DaemonSet", "gpu-topology-agent-deliver"))}
    assert deliver["wait-for-nvidia-plugin-to-stop"] == "registry.example/gte:0.1.0"
    assert deliver["generate-cdi-spec"] == "nvcr.io/nvidia/k8s/container-toolkit:v1.20.0"
    default = pod_spec(find(render(), "Deployment", "gpu-topology-extender"))["containers"][0]["image"]
    assert default == f"gpu-topology-extender:{project_version()}"


def gpu_terms(daemonset) -> list[list[dict]]:
    affinity = pod_spec(daemonset)["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return [term["matchExpressions"] for term in affinity["nodeSelectorTerms"]]


def runs_on(daemonset, labels: dict[str, str]) -> bool:
    """The DaemonSet's nodeSelector AND any of its affinity terms, as the scheduler reads them."""
    def holds(expression) -> bool:
        value = labels.get(expression["key"])
        return value in expression["values"] if expression["operator"] == "In" else value not in expression["values"]
    selector = pod_spec(daemonset).get("nodeSelector", {})
    return (selector.items() <= labels.items()
            and any(all(holds(e) for e in term) for term in gpu_terms(daemonset)))


@pytest.mark.parametrize("mode", ["report", "deliver"])
def test_agent_modes_put_exactly_one_agent_on_every_gpu_node(mode) -> None:
    docs = render({"agent": {"mode": mode}})
    daemonsets = [doc for doc in docs if doc["kind"] == "DaemonSet"]
    assert len(daemonsets) == (2 if mode == "deliver" else 1)
    for gpu in ({"nvidia.com/gpu.present": "true"}, {"feature.node.kubernetes.io/pci-10de.present": "true"}):
        for agent_mode in (None, "deliver", "report"):
            for plugin in (None, "true", "false"):
                labels = {**gpu, **({"gpu-topology.io/agent-mode": agent_mode} if agent_mode else {}),
                          **({"nvidia.com/gpu.deploy.device-plugin": plugin} if plugin else {})}
                running = [d["metadata"]["name"] for d in daemonsets if runs_on(d, labels)]
                switched = mode == "deliver" and agent_mode == "deliver" and plugin == "false"
                assert running == (["gpu-topology-agent-deliver"] if switched else ["gpu-topology-agent"]), labels
    assert not any(runs_on(d, {"kubernetes.io/hostname": "cpu-node"}) for d in daemonsets)
    accounts = {doc["metadata"]["name"] for doc in docs if doc["kind"] == "ServiceAccount"
                and doc["metadata"]["namespace"] == "gpu-topology-node"}
    assert accounts == ({"gpu-topology-agent", "gpu-topology-agent-deliver"} if mode == "deliver"
                        else {"gpu-topology-agent"})


def test_agent_off_installs_no_agent_object() -> None:
    docs = render({"agent": {"mode": "off"}})
    assert not [key(doc) for doc in docs if "gpu-topology-agent" in doc["metadata"]["name"]
                or doc["metadata"].get("namespace") == "gpu-topology-node"]


@pytest.mark.parametrize(("setup", "driver_root", "hook"), [
    ("gpuOperator", "/run/nvidia/driver", "/usr/local/nvidia/toolkit/nvidia-cdi-hook"),
    ("gpuOperatorHostDriver", "/", "/usr/local/nvidia/toolkit/nvidia-cdi-hook"),
    ("host", "/", "/usr/bin/nvidia-cdi-hook"),
])
def test_cdi_values_follow_one_setting(setup, driver_root, hook) -> None:
    docs = render({"agent": {"deliver": {"cdi": {"setup": setup}}}})
    deliver = find(docs, "DaemonSet", "gpu-topology-agent-deliver")
    (init,) = [c for c in containers(deliver) if c["name"] == "generate-cdi-spec"]
    env = {e["name"]: e["value"] for e in init["env"]}
    volumes = {v["name"]: v for v in pod_spec(deliver)["volumes"]}
    # The driver root is said twice, in the environment and in the volume: always the same value.
    assert env["NVIDIA_DRIVER_ROOT"] == volumes["driver-root"]["hostPath"]["path"] == driver_root
    assert env["NVIDIA_CDI_HOOK_PATH"] == hook


def openssl(*args: str, pem: str) -> str:
    required("openssl")
    return subprocess.run(["openssl", *args], input=base64.b64decode(pem), capture_output=True, check=True,
                          timeout=30).stdout.decode()


def test_self_signed_certificates_chain_to_one_ca_with_the_names_the_extender_pins(tmp_path: Path) -> None:
    secrets = secret_data(render())
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(secrets["gpu-topology-ca"]["tls.crt"]))
    for name in TLS_SECRETS:
        assert secrets[name]["ca.crt"] == secrets["gpu-topology-ca"]["tls.crt"]
        assert openssl("verify", "-CAfile", str(ca), pem=secrets[name]["tls.crt"]).strip() == "stdin: OK"
        # The private key is the certificate's.
        assert openssl("pkey", "-pubout", pem=secrets[name]["tls.key"]) == openssl(
            "x509", "-noout", "-pubkey", pem=secrets[name]["tls.crt"])
    serving = openssl("x509", "-noout", "-subject", "-ext", "subjectAltName,extendedKeyUsage",
                      pem=secrets["gpu-topology-extender-tls"]["tls.crt"])
    assert "CN = gpu-topology-extender.gpu-topology-system.svc" in serving or (
        "CN=gpu-topology-extender.gpu-topology-system.svc" in serving)
    assert "DNS:gpu-topology-extender.gpu-topology-system.svc," in serving
    # Server and client: its probes present it.
    assert "TLS Web Server Authentication" in serving and "TLS Web Client Authentication" in serving
    client = openssl("x509", "-noout", "-subject", pem=secrets["gpu-topology-scheduler-client-tls"]["tls.crt"])
    assert client.replace(" ", "").strip() == "subject=CN=kube-scheduler"
    assert len(base64.b64decode(secrets["gpu-topology-seal"]["key"])) >= 32


def test_existing_secrets_mode_makes_none() -> None:
    docs = render({"tls": {"mode": "existingSecrets", "existingSecrets": {"extender": "mine", "scheduler": "theirs"}},
                   "seal": {"existingSecret": "my-seal"}})
    assert not [doc for doc in docs if doc["kind"] == "Secret"]
    volumes = {v["name"]: v for v in pod_spec(find(docs, "Deployment", "gpu-topology-extender"))["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "mine" and volumes["seal"]["secret"]["secretName"] == "my-seal"
    scheduler = {v["name"]: v for v in pod_spec(find(docs, "Deployment", "gpu-topology-scheduler"))["volumes"]}
    assert scheduler["extender-client-tls"]["secret"]["secretName"] == "theirs"


def test_cert_manager_mode_issues_the_secrets_the_pods_mount() -> None:
    docs = render({"tls": {"mode": "certManager"}})
    issued = {doc["spec"]["secretName"] for doc in docs if doc["kind"] == "Certificate"
              and doc["metadata"]["namespace"] == NAMESPACE}
    assert issued == set(TLS_SECRETS)
    assert not {name for name in secret_data(docs)} & set(TLS_SECRETS)
    assert ("ValidatingAdmissionPolicy", "gpu-topology-ca-issuer-namespace") in kinds_and_names(docs)


def test_monitoring_objects_each_switchable() -> None:
    base = {"extender": {"metricsPort": 8890}}
    for switch, kind in (("prometheusRule", "PrometheusRule"), ("podMonitor", "PodMonitor"),
                         ("grafanaDashboard", "ConfigMap")):
        docs = render({**base, "monitoring": {switch: True}})
        monitoring = [doc for doc in docs if doc["kind"] in {"PrometheusRule", "PodMonitor"}
                      or doc["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
        assert [doc["kind"] for doc in monitoring] == [kind]
    docs = render({**base, "monitoring": {"grafanaDashboard": True, "podMonitor": True}})
    (dashboard,) = [doc for doc in docs if doc["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
    assert dashboard["data"]["gpu-topology-extender.json"] == (CHART / "files" / "grafana-dashboard.json").read_text()
    (monitor,) = [doc for doc in docs if doc["kind"] == "PodMonitor"]
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    ports = {p["name"]: p["containerPort"] for p in
             pod_spec(find(docs, "Deployment", "gpu-topology-extender"))["containers"][0]["ports"]}
    assert ports["metrics"] == 8890 and flag_values(extender_args(docs))["--metrics-port"] == "8890"
    # The Service still selects the leader alone; the PodMonitor selects every replica.
    assert "gpu-topology.io/leader" not in monitor["spec"]["selector"]["matchLabels"]


def test_policies_switchable() -> None:
    kinds = {doc["kind"] for doc in render({"policies": {"enabled": False}})}
    assert not kinds & {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy"}
    sending = render({"scheduler": {"sendGpuPods": True}})
    policy = find(sending, "MutatingAdmissionPolicy", "gpu-topology-scheduler-name")
    assert "gpu-topology-scheduler" in policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
    assert find(sending, "MutatingAdmissionPolicyBinding", "gpu-topology-scheduler-name")["spec"]["policyName"] == (
        "gpu-topology-scheduler-name")
    assert ("MutatingAdmissionPolicy", "gpu-topology-dra-claims") in kinds_and_names(
        render({"policies": {"draClaims": True}}))


def test_scheduler_pods_roll_when_the_configuration_changes() -> None:
    def checksum(values) -> str:
        deployment = find(render(values), "Deployment", "gpu-topology-scheduler")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert checksum({}) == checksum({}) != checksum({"observe": True})


def test_the_package_carries_the_linked_manifests_and_renders_the_same(tmp_path: Path) -> None:
    """`make chart`: the archive holds the manifests files/ links to, so it renders without the repository."""
    archive = helm_python.package(CHART, destination=tmp_path, version=project_version(),
                                  app_version=project_version())
    assert Path(archive).name == f"gpu-topology-extender-{project_version()}.tgz"
    packaged = helm_python.Chart.load_archive(Path(archive).read_bytes())
    values = {"tls": {"mode": "existingSecrets"}, "seal": {"existingSecret": "gpu-topology-seal"}}
    ours = chart().render(values, name="gpu-topology", namespace=NAMESPACE, is_install=True)
    theirs = packaged.render(values, name="gpu-topology", namespace=NAMESPACE, is_install=True)
    assert ours == theirs
    assert "gpu-topology-bind-annotations" in "".join(theirs.values())
