"""An upgrade keeps the certificates and the seal key: Helm renders the upgrade with `lookup` reading the Secrets the
install made (helm_python.Config.render against the in-process API server, tests/helpers/kube_api_server.py, which
serves them as kube-apiserver would). tests/e2e/test_chart_e2e.py does the same through a real install and upgrade.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path

import helm_python
from helpers.chart_render import NAMESPACE, RELEASE, chart, parse, render, secret_data
from helpers.kube_api_server import SECRETS as SECRET_RESOURCE
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture
from helpers.tools import required

__all__ = ["kube_server_fixture"]  # a fixture

SECRETS = ("gpu-topology-ca", "gpu-topology-extender-tls", "gpu-topology-scheduler-client-tls", "gpu-topology-seal")


def upgrade(api: FakeKubeApiServer, tmp_path: Path, values=None) -> dict[str, dict[str, str]]:
    config = helm_python.Config(kubeconfig_path=str(api.write_kubeconfig(tmp_path / "kubeconfig")),
                                namespace=NAMESPACE)
    try:
        return secret_data(parse(config.render(chart(), values or {}, name=RELEASE, namespace=NAMESPACE,
                                               is_upgrade=True)))
    finally:
        config.close()


def install(api: FakeKubeApiServer) -> dict[str, dict[str, str]]:
    docs = render()
    for doc in docs:
        if doc["kind"] == "Secret":
            api.put(SECRET_RESOURCE, doc)
    return secret_data(docs)


def test_an_upgrade_keeps_the_certificates_and_the_seal_key(kube_server, tmp_path) -> None:
    installed = install(kube_server)
    upgraded = upgrade(kube_server, tmp_path, {"extender": {"replicas": 3}})
    assert set(installed) == set(SECRETS)
    for name in SECRETS:
        assert upgraded[name] == installed[name], f"{name} changed at the upgrade"
    assert any(request.path.endswith("/secrets/gpu-topology-seal") for request in kube_server.requests)


def test_without_the_objects_every_render_makes_new_ones(kube_server, tmp_path) -> None:
    """What the test above rules out: nothing to look up, and each render has new keys."""
    first, second = render(), upgrade(kube_server, tmp_path)
    for name in SECRETS:
        assert secret_data(first)[name] != second[name]


def test_a_deleted_certificate_is_issued_again_by_the_kept_ca(kube_server, tmp_path) -> None:
    required("openssl")
    installed = install(kube_server)
    kube_server.delete(SECRET_RESOURCE, NAMESPACE, "gpu-topology-extender-tls")
    upgraded = upgrade(kube_server, tmp_path)
    assert upgraded["gpu-topology-extender-tls"]["tls.crt"] != installed["gpu-topology-extender-tls"]["tls.crt"]
    assert upgraded["gpu-topology-extender-tls"]["ca.crt"] == installed["gpu-topology-ca"]["tls.crt"]
    ca = tmp_path / "ca.crt"
    ca.write_bytes(base64.b64decode(installed["gpu-topology-ca"]["tls.crt"]))
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(ca)], capture_output=True, check=False,
                              input=base64.b64decode(upgraded["gpu-topology-extender-tls"]["tls.crt"]))
    assert verified.returncode == 0, verified.stderr
    # kube-scheduler's certificate, still there, is kept: it trusts the same CA.
    assert upgraded["gpu-topology-scheduler-client-tls"] == installed["gpu-topology-scheduler-client-tls"]


def test_a_certificate_of_another_ca_is_replaced(kube_server, tmp_path) -> None:
    """A leaf whose ca.crt is not the kept CA's would fail the other side's check: it is issued again."""
    installed = install(kube_server)
    stranger = secret_data(render())["gpu-topology-scheduler-client-tls"]
    metadata = {"name": "gpu-topology-scheduler-client-tls", "namespace": NAMESPACE}
    kube_server.put(SECRET_RESOURCE, {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                                      "data": stranger, "metadata": metadata})
    upgraded = upgrade(kube_server, tmp_path)
    assert upgraded["gpu-topology-scheduler-client-tls"]["ca.crt"] == installed["gpu-topology-ca"]["tls.crt"]
    assert upgraded["gpu-topology-scheduler-client-tls"]["tls.crt"] != stranger["tls.crt"]
