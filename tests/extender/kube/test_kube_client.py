"""extender.kube.client through the real `kubernetes` client, against the in-process API server."""

from __future__ import annotations

import http.client
import socket
import threading
import time
from datetime import datetime
from urllib.parse import urlsplit

import orjson
import pytest
from helpers.kube_api_server import (
    NODES,
    PODS,
    FakeKubeApiServer,
    kube_server_fixture,
    make_node,
    make_pod,
    wait_until,
)
from kubernetes import client as k8s

from extender.kube.client import (
    ACTIVE_PODS,
    COMPONENT,
    Conflict,
    Gone,
    KubeError,
    KubernetesApi,
    Unreachable,
    WatchStream,
)

__all__ = ["kube_server_fixture"]  # the `kube_server` fixture


@pytest.fixture
def api(kube_server: FakeKubeApiServer) -> KubernetesApi:
    return KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), instance="extender-0")


def names(items: list[dict]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


def take(stream, count: int) -> list[tuple[str, dict]]:
    """The next `count` events of a watch stream."""
    return [next(stream) for _ in range(count)]


def assert_clean(exc: KubeError) -> None:
    """Nothing of urllib3 or the client reaches the caller, not even as the implicit context."""
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)
    assert "urllib3" not in type(exc).__module__ and "kubernetes" not in type(exc).__module__


# -- lists -------------------------------------------------------------------------------------------------


def test_list_nodes_gives_raw_json_and_the_list_version(kube_server, api):
    kube_server.add_node(make_node("gpu-b", annotations={"gpu-topology.io/topology": "{}"}))
    kube_server.add_node(make_node("gpu-a"))
    items, version = api.list_nodes()
    assert names(items) == ["gpu-a", "gpu-b"]
    assert version == kube_server.resource_version
    node = items[1]
    assert type(node) is dict  # raw JSON, camelCase keys as served, no client models
    assert node["metadata"]["annotations"] == {"gpu-topology.io/topology": "{}"}
    assert "creationTimestamp" in node["metadata"] and "resourceVersion" in node["metadata"]
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"


def test_list_pods_covers_every_namespace_and_only_active_pods(kube_server, api):
    kube_server.add_pod(make_pod("train", "team-a"))
    kube_server.add_pod(make_pod("serve", "team-b", node_name="gpu-a", phase="Running"))
    kube_server.add_pod(make_pod("done", "team-a", phase="Succeeded"))
    kube_server.add_pod(make_pod("crashed", "team-b", phase="Failed"))
    items, version = api.list_pods()
    assert sorted(names(items)) == ["serve", "train"]
    assert version == kube_server.resource_version
    request = kube_server.requests[-1]
    assert request.path == "/api/v1/pods"
    assert request.query["fieldSelector"] == ACTIVE_PODS == "status.phase!=Succeeded,status.phase!=Failed"


def test_a_plain_api_client_works_too(kube_server):
    kube_server.add_node(make_node("gpu-a"))
    api = KubernetesApi(k8s.ApiClient(k8s.Configuration(host=kube_server.url)))
    assert names(api.list_nodes()[0]) == ["gpu-a"]


def _token_kubeconfig(tmp_path, url: str):
    """A kubeconfig for `url` whose user authenticates with the token s3cret."""
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        f"""
apiVersion: v1
kind: Config
clusters: [{{name: test, cluster: {{server: "{url}"}}}}]
users: [{{name: sched, user: {{token: s3cret}}}}]
contexts: [{{name: test, context: {{cluster: test, user: sched}}}}]
current-context: test
"""
    )
    return kubeconfig


def test_from_kubeconfig_uses_the_server_and_credentials(kube_server, tmp_path):
    kubeconfig = _token_kubeconfig(tmp_path, kube_server.url)
    kube_server.add_node(make_node("gpu-a"))
    api = KubernetesApi.from_kubeconfig(str(kubeconfig))
    assert names(api.list_nodes()[0]) == ["gpu-a"]
    assert kube_server.requests[-1].headers["authorization"] == "Bearer s3cret"


def test_a_bind_carries_the_same_credentials_as_every_other_call(kube_server, tmp_path):
    """bind posts bytes of its own, not through the generated method: it must still send the token."""
    kubeconfig = _token_kubeconfig(tmp_path, kube_server.url)
    uid = kube_server.add_pod(make_pod("train"))["metadata"]["uid"]
    KubernetesApi.from_kubeconfig(str(kubeconfig)).bind("default", "train", uid, "gpu-a", {})
    request = kube_server.requests[-1]
    assert request.path == "/api/v1/namespaces/default/pods/train/binding"
    assert request.headers["authorization"] == "Bearer s3cret"
    assert request.headers["content-type"] == "application/json"


def test_a_bind_to_an_api_server_that_is_gone_is_unreachable():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]  # closed when the block ends: nothing listens there
    api = KubernetesApi.from_configuration(k8s.Configuration(host=f"http://127.0.0.1:{port}"), timeout=2.0)
    with pytest.raises(Unreachable) as caught:
        api.bind("default", "train", "uid", "gpu-a", {})
    assert caught.value.status is None and "bind pod default/train to gpu-a" in str(caught.value)
    assert_clean(caught.value)


def test_a_missing_kubeconfig_is_a_kube_error(tmp_path):
    with pytest.raises(KubeError, match="kubeconfig"):
        KubernetesApi.from_kubeconfig(str(tmp_path / "nope"))


# -- watches -----------------------------------------------------------------------------------------------


def test_watch_streams_each_change_after_the_version_in_order(kube_server, api):
    kube_server.add_node(make_node("gpu-a"))
    _, version = api.list_nodes()
    kube_server.add_node(make_node("gpu-b"))
    changed = make_node("gpu-a", annotations={"gpu-topology.io/state": "x"})
    kube_server.update_node(changed)
    kube_server.delete_node("gpu-b")
    with api.watch_nodes(version, 30) as stream:
        events = take(stream, 3)
    assert [(kind, obj["metadata"]["name"]) for kind, obj in events] == [
        ("ADDED", "gpu-b"),
        ("MODIFIED", "gpu-a"),
        ("DELETED", "gpu-b"),
    ]
    versions = [int(obj["metadata"]["resourceVersion"]) for _, obj in events]
    assert versions == sorted(versions) and versions[0] > int(version)
    assert events[1][1]["metadata"]["annotations"] == {"gpu-topology.io/state": "x"}
    assert events[1][1]["kind"] == "Node"
    query = kube_server.requests[-1].query
    assert query["watch"].lower() == "true" and query["allowWatchBookmarks"].lower() == "true"  # v31 sends True
    assert query["resourceVersion"] == version and query["timeoutSeconds"] == "30"


def test_watch_passes_bookmarks_on_and_ends_with_the_server(kube_server, api):
    _, version = api.list_nodes()
    stream = api.watch_nodes(version, 30)
    bookmark = kube_server.bookmark(NODES)
    kind, obj = next(stream)
    assert (kind, obj["metadata"]["resourceVersion"]) == ("BOOKMARK", bookmark)
    kube_server.end_watches()
    assert list(stream) == []


def test_a_pod_leaving_the_active_selector_arrives_as_deleted(kube_server, api):
    kube_server.add_pod(make_pod("job", node_name="gpu-a", phase="Running"))
    _, version = api.list_pods()
    kube_server.update_pod(make_pod("job", node_name="gpu-a", phase="Succeeded"))
    kube_server.add_pod(make_pod("old", phase="Failed"))  # never active: not seen at all
    kube_server.add_pod(make_pod("next"))
    with api.watch_pods(version, 30) as stream:
        events = take(stream, 2)
    assert [(kind, obj["metadata"]["name"]) for kind, obj in events] == [("DELETED", "job"), ("ADDED", "next")]
    assert events[0][1]["status"]["phase"] == "Succeeded"
    assert kube_server.requests[-1].query["fieldSelector"] == ACTIVE_PODS


def test_a_watch_that_ends_keeps_its_connection_for_the_next_request(kube_server):
    """As kube-apiserver: its watch handler returns at the timeout and Go's server ends the chunked answer and keeps
    the connection, which a client's pool may then use again (the stand-in used to hang up unannounced)."""
    url = urlsplit(kube_server.url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    try:
        connection.request("GET", "/api/v1/nodes?watch=true&timeoutSeconds=1&resourceVersion=0")
        watch = connection.getresponse()
        assert watch.status == 200
        watch.read()  # to the end of the chunked answer, after the watch's second
        connection.request("GET", "/api/v1/nodes")
        listed = connection.getresponse()
        assert listed.status == 200 and orjson.loads(listed.read())["kind"] == "NodeList"
    finally:
        connection.close()


class _Answer:
    """A watch's response as the client hands it over, streaming `chunks`."""

    def __init__(self, *chunks: bytes) -> None:
        self.chunks = chunks

    def stream(self, amount: int | None, decode_content: bool) -> list[bytes]:
        return list(self.chunks)

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


@pytest.mark.parametrize(("line", "message"), [
    (b'{"type":"ADDED"}', "malformed watch event"),
    (b'[{"type":"ADDED","object":{}}]', "malformed watch event"),
    (b'"ADDED"', "malformed watch event"),
    (b"{not json", "the answer is not JSON"),
])
def test_a_watch_line_that_is_no_event_is_refused_as_such(line: bytes, message: str) -> None:
    """Whatever JSON an answer holds, the reflector gets a KubeError naming the stream (it resumes the watch),
    not another error it would take for a failing sink (a new list)."""
    good = b'{"type":"ADDED","object":{"metadata":{"name":"a"}}}\n'
    stream = WatchStream(lambda: _Answer(good, line + b"\n"), "watch pods")
    assert next(stream)[1]["metadata"]["name"] == "a"
    with pytest.raises(KubeError, match=f"watch pods: {message}"):
        next(stream)


def test_watch_from_an_expired_version_raises_gone(kube_server, api):
    _, version = api.list_nodes()
    kube_server.add_node(make_node("gpu-a"))
    kube_server.compact()
    with pytest.raises(Gone) as caught:
        next(iter(api.watch_nodes(version, 30)))
    assert caught.value.status == 410
    assert "too old resource version" in str(caught.value)
    assert_clean(caught.value)


def test_a_broken_watch_stream_raises_unreachable(kube_server, api):
    _, version = api.list_pods()
    kube_server.add_pod(make_pod("a"))
    stream = api.watch_pods(version, 30)
    assert next(stream)[0] == "ADDED"
    kube_server.break_watches()
    with pytest.raises(Unreachable) as caught:
        next(stream)
    assert caught.value.status is None
    assert_clean(caught.value)


def test_closing_a_watch_from_another_thread_wakes_its_reader(kube_server, api):
    _, version = api.list_pods()
    stream = api.watch_pods(version, 60)  # the server would keep it open for a minute
    seen: list = []
    reader = threading.Thread(target=lambda: seen.extend(stream), daemon=True)
    reader.start()
    assert kube_server.wait_for_watchers(PODS)
    stream.close()
    reader.join(15)
    assert not reader.is_alive()
    assert seen == []


def test_a_watch_refused_by_the_server_is_a_kube_error(kube_server, api):
    kube_server.fail("GET", "/api/v1/nodes", watch=True, status=503)
    with pytest.raises(KubeError) as caught:
        next(iter(api.watch_nodes("1", 30)))
    assert caught.value.status == 503
    assert not isinstance(caught.value, (Unreachable, Gone))


# -- writes ------------------------------------------------------------------------------------------------


def test_get_pod_reads_the_pod_as_the_server_has_it(kube_server, api):
    stored = kube_server.add_pod(make_pod("train", "team-a", annotations={"keep": "1"}))
    pod = api.get_pod("team-a", "train")
    assert pod["metadata"]["uid"] == stored["metadata"]["uid"] and pod["metadata"]["annotations"] == {"keep": "1"}


def test_getting_a_missing_pod_is_a_404(api):
    with pytest.raises(KubeError) as caught:
        api.get_pod("default", "ghost")
    assert caught.value.status == 404 and not isinstance(caught.value, Conflict)
    assert 'pods "ghost" not found' in str(caught.value)


def test_bind_sets_the_node_with_the_uid_precondition(kube_server, api):
    uid = kube_server.add_pod(make_pod("train", "team-a", annotations={"keep": "1"}))["metadata"]["uid"]
    api.bind("team-a", "train", uid, "gpu-a", {"gpu-topology.io/gpus": "GPU-1,GPU-2"})
    pod = kube_server.pod("team-a", "train")
    assert pod["spec"]["nodeName"] == "gpu-a"
    assert pod["metadata"]["annotations"] == {"keep": "1", "gpu-topology.io/gpus": "GPU-1,GPU-2"}  # one write
    binding = kube_server.bindings[-1]
    assert binding["metadata"] == {"name": "train", "namespace": "team-a", "uid": uid,
                                   "annotations": {"gpu-topology.io/gpus": "GPU-1,GPU-2"}}
    assert binding["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}
    assert kube_server.requests[-1].path == "/api/v1/namespaces/team-a/pods/train/binding"


def test_binding_a_bound_pod_is_a_conflict(kube_server, api):
    uid = kube_server.add_pod(make_pod("train"))["metadata"]["uid"]
    api.bind("default", "train", uid, "gpu-a", {})
    with pytest.raises(Conflict) as caught:
        api.bind("default", "train", uid, "gpu-b", {})
    assert caught.value.status == 409 and "already assigned" in str(caught.value)
    assert kube_server.pod("default", "train")["spec"]["nodeName"] == "gpu-a"
    assert_clean(caught.value)


def test_binding_with_another_uid_is_a_conflict(kube_server, api):
    kube_server.add_pod(make_pod("train", uid="new-uid"))  # a pod recreated under the same name
    with pytest.raises(Conflict, match="Precondition failed"):
        api.bind("default", "train", "old-uid", "gpu-a", {"gpu-topology.io/gpus": "GPU-1"})
    assert "nodeName" not in kube_server.pod("default", "train")["spec"]
    assert "gpu-topology.io/gpus" not in kube_server.pod("default", "train")["metadata"].get("annotations", {})


def test_binding_a_missing_pod_is_a_404(api):
    with pytest.raises(KubeError) as caught:
        api.bind("default", "ghost", "uid", "gpu-a", {})
    assert caught.value.status == 404


def test_an_event_is_recorded_on_the_pod(kube_server, api):
    uid = kube_server.add_pod(make_pod("train", "team-a"))["metadata"]["uid"]
    api.emit_event("team-a", "train", uid, "BadAnnotation", "gpu-topology.io/interconnect: 'nvlnk' is not a level")
    (event,) = kube_server.events
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "train",
        "namespace": "team-a",
        "uid": uid,
    }
    assert event["metadata"]["namespace"] == "team-a" and event["metadata"]["name"].startswith("train.")
    assert (event["type"], event["reason"], event["count"]) == ("Warning", "BadAnnotation", 1)
    assert event["message"] == "gpu-topology.io/interconnect: 'nvlnk' is not a level"
    assert event["source"] == {"component": COMPONENT}
    assert (event["reportingComponent"], event["reportingInstance"]) == (COMPONENT, "extender-0")
    first = datetime.fromisoformat(event["firstTimestamp"])
    assert first.tzinfo is not None and event["lastTimestamp"] == event["firstTimestamp"]


def test_event_names_are_unique_and_normal_events_work(kube_server, api):
    api.emit_event("default", "p", "u", "Scheduled", "one", event_type="Normal")
    api.emit_event("default", "p", "u", "Scheduled", "two", event_type="Normal")
    assert [e["type"] for e in kube_server.events] == ["Normal", "Normal"]
    assert len({e["metadata"]["name"] for e in kube_server.events}) == 2


def test_a_failed_event_is_logged_and_swallowed(kube_server, api, caplog):
    kube_server.fail("POST", "/api/v1/namespaces/default/events", status=500)
    api.emit_event("default", "p", "u", "BadAnnotation", "x")
    kube_server.stop()
    api.emit_event("default", "p", "u", "BadAnnotation", "x")
    assert kube_server.events == []
    assert [r.levelname for r in caplog.records if "could not emit event" in r.message] == ["WARNING", "WARNING"]


# -- failures ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["LIST", "GET", "POST"])
def test_a_server_error_is_a_kube_error_with_its_status(kube_server, api, method):
    uid = kube_server.add_pod(make_pod("p"))["metadata"]["uid"]
    call = {
        "LIST": (api.list_pods, "/api/v1/pods"),
        "GET": (lambda: api.get_pod("default", "p"), "/api/v1/namespaces/default/pods/p"),
        "POST": (lambda: api.bind("default", "p", uid, "n", {}), "/api/v1/namespaces/default/pods/p/binding"),
    }
    run, path = call[method]
    kube_server.fail("POST" if method == "POST" else "GET", path, status=500)
    with pytest.raises(KubeError) as caught:
        run()
    assert type(caught.value) is KubeError and caught.value.status == 500
    assert "injected failure" in str(caught.value)
    assert_clean(caught.value)
    run()  # the fault was for one request only


def test_a_stopped_server_is_unreachable(kube_server, api):
    uid = kube_server.add_pod(make_pod("p"))["metadata"]["uid"]
    api.list_pods()  # a pooled keep-alive connection that the stop must not leave usable
    kube_server.stop()
    for call in (api.list_nodes, api.list_pods, lambda: api.bind("default", "p", uid, "n", {})):
        with pytest.raises(Unreachable) as caught:
            call()
        assert caught.value.status is None
        assert_clean(caught.value)
    with pytest.raises(Unreachable):
        next(iter(api.watch_pods("1", 30)))


def test_a_connection_closed_without_answer_is_unreachable(kube_server, api):
    uid = kube_server.add_pod(make_pod("p"))["metadata"]["uid"]
    kube_server.drop("POST", "/api/v1/namespaces/default/pods/p/binding")
    with pytest.raises(Unreachable):
        api.bind("default", "p", uid, "n", {"a": "b"})
    assert "a" not in kube_server.pod("default", "p")["metadata"]["annotations"]


def test_a_lost_answer_is_unreachable_although_the_server_committed(kube_server, api):
    uid = kube_server.add_pod(make_pod("p"))["metadata"]["uid"]
    kube_server.lose("POST", "/api/v1/namespaces/default/pods/p/binding")
    with pytest.raises(Unreachable):
        api.bind("default", "p", uid, "n", {"a": "b"})
    assert kube_server.pod("default", "p")["spec"]["nodeName"] == "n"


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_hanging_server_is_unreachable_within_the_timeout(kube_server, method):
    # One attempt per call: urllib3 would retry a timed-out GET three more times (4 x 1 s) by default.
    api = KubernetesApi.from_configuration(k8s.Configuration(host=kube_server.url), timeout=1.0, list_timeout=1.0)
    uid = kube_server.add_pod(make_pod("p"))["metadata"]["uid"]
    kube_server.hang(method, "/api/v1/pods" if method == "GET" else "/api/v1/namespaces/default/pods/p/binding")
    started = time.monotonic()
    with pytest.raises(Unreachable, match="(?i)timed? ?out"):
        if method == "GET":
            api.list_pods()
        else:
            api.bind("default", "p", uid, "n", {"a": "b"})
    elapsed = time.monotonic() - started
    kube_server.release_hangs()
    assert 0.9 <= elapsed < 3.5


def test_the_test_server_rejects_unknown_field_selectors(kube_server):
    """The fake is as strict as the real server, so a typo in a selector fails here too."""
    api = k8s.CoreV1Api(k8s.ApiClient(k8s.Configuration(host=kube_server.url)))
    with pytest.raises(k8s.ApiException) as caught:
        api.list_pod_for_all_namespaces(field_selector="status.Phase!=Failed", _preload_content=False)
    assert caught.value.status == 400


def test_the_test_server_restarts_with_its_state(kube_server, api):
    kube_server.add_node(make_node("gpu-a"))
    kube_server.stop()
    with pytest.raises(Unreachable):
        api.list_nodes()
    kube_server.start()
    wait_until(lambda: _lists(api), what="the server to answer again")
    assert names(api.list_nodes()[0]) == ["gpu-a"]


def _lists(api: KubernetesApi) -> bool:
    try:
        api.list_nodes()
    except Unreachable:
        return False
    return True
