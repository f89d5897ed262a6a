"""The reporter's Kubernetes edge through the real `kubernetes` client, against the in-process API server."""

from __future__ import annotations

import time

import pytest
from helpers.kube_api_server import FakeKubeApiServer, kube_server_fixture, make_node
from kubernetes import client as k8s

from topology.agent.kube import MERGE_PATCH, NodeApi, NodeApiError
from topology.agent.reporter import NodeError

__all__ = ["kube_server_fixture"]  # the `kube_server` fixture

NODE = "gpu-node-1"
PATH = f"/api/v1/nodes/{NODE}"


@pytest.fixture
def node(kube_server: FakeKubeApiServer) -> NodeApi:
    kube_server.add_node(make_node(NODE, annotations={"other.io/keep": "yes", "gpu-topology.io/state": "old"}))
    return NodeApi.from_configuration(k8s.Configuration(host=kube_server.url), NODE, timeout=1.0)


def test_annotations_reads_the_node(node):
    assert node.annotations() == {"other.io/keep": "yes", "gpu-topology.io/state": "old"}


def test_a_patch_is_a_merge_patch_of_our_annotations_only(kube_server, node):
    after = node.patch_annotations({"gpu-topology.io/topology": "{}", "gpu-topology.io/state": None})
    assert after == {"other.io/keep": "yes", "gpu-topology.io/topology": "{}"}
    (patch,) = kube_server.patches
    assert patch["content_type"] == MERGE_PATCH
    assert patch["patch"] == {"metadata": {"annotations": {"gpu-topology.io/topology": "{}",
                                                           "gpu-topology.io/state": None}}}
    stored = kube_server.node(NODE)
    assert stored["metadata"]["annotations"] == after
    assert stored["status"]["capacity"]["nvidia.com/gpu"] == "8"  # nothing else touched
    request = kube_server.requests[-1]
    assert (request.method, request.path) == ("PATCH", PATH)


@pytest.mark.parametrize(("status", "hint"), [
    (404, "(is NODE_NAME this node's name?)"),
    (403, f"(the reporter needs get and patch on nodes/{NODE})"),
    (409, ""),
    (500, ""),
    (503, ""),
])
def test_api_errors_carry_their_status(kube_server, node, status, hint):
    kube_server.fail("PATCH", PATH, status=status)
    with pytest.raises(NodeApiError) as caught:
        node.patch_annotations({"gpu-topology.io/state": "x"})
    error = caught.value
    assert isinstance(error, NodeError) and error.status == status
    assert str(error).startswith(f"patch node {NODE}: {status} injected failure ({status})")
    assert str(error).endswith(hint)
    assert error.__cause__ is None and error.__suppress_context__


def test_a_missing_node_is_a_404_with_a_hint(kube_server):
    api = NodeApi.from_configuration(k8s.Configuration(host=kube_server.url), "nope", timeout=1.0)
    with pytest.raises(NodeApiError, match=r'get node nope: 404 nodes "nope" not found \(is NODE_NAME'):
        api.annotations()


def test_a_dropped_connection_has_no_status(kube_server, node):
    kube_server.drop("GET", PATH)
    with pytest.raises(NodeApiError) as caught:
        node.annotations()
    assert caught.value.status is None


def test_a_hanging_server_times_out(kube_server, node):
    kube_server.hang("PATCH", PATH)
    started = time.monotonic()
    with pytest.raises(NodeApiError) as caught:
        node.patch_annotations({"gpu-topology.io/state": "x"})
    assert caught.value.status is None and "Timeout" in str(caught.value)
    assert time.monotonic() - started < 5
    kube_server.release_hangs()


def test_a_server_that_is_down_is_unreachable(kube_server, node):
    kube_server.stop()
    with pytest.raises(NodeApiError) as caught:
        node.annotations()
    assert caught.value.status is None


def test_one_attempt_per_call(kube_server, node):
    kube_server.fail("GET", PATH, status=503, times=5)
    with pytest.raises(NodeApiError):
        node.annotations()
    assert sum(r.method == "GET" for r in kube_server.requests) == 1  # urllib3 retried nothing


def test_a_bad_kubeconfig_is_one_error(tmp_path):
    with pytest.raises(NodeApiError, match="kubeconfig"):
        NodeApi.from_kubeconfig(str(tmp_path / "absent"), NODE)
