"""The load test's floor (loadtests/floor_server.py) answers through the extender's serving path (its server
configuration and protocol, which answers a verb before ASGI) and in the extender's answer shape, so that the
load test's 1.5x-the-floor verdicts measure the extender's own work."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from helpers.paths import LOADTESTS

sys.path.insert(0, str(LOADTESTS))

import floor_server  # noqa: E402
from large_cluster_server import load_pod, node_names  # noqa: E402
from load_extender import Server, _connect  # noqa: E402

from extender.api.wire import ExtenderArgs, filter_result  # noqa: E402
from extender.server.app import Verb  # noqa: E402
from extender.server.serve import ServeOptions, server_config  # noqa: E402


def _body(names: list[str]) -> bytes:
    return b'{"Pod":' + orjson.dumps(load_pod(0)) + b',"Nodes":null,"NodeNames":' + orjson.dumps(names) + b"}"


def test_the_floor_is_served_by_the_extenders_protocol() -> None:
    served = floor_server.stand_in()
    app = floor_server.create_floor_app(served)
    config = server_config(served, ServeOptions(log_level="warning"), app)
    assert issubclass(config.http, HttpToolsProtocol) and config.http.__name__ == "LimitedProtocol"
    assert set(app.verbs) == {"/filter", "/prioritize"}
    assert all(isinstance(verb, Verb) for verb in app.verbs.values())


def test_the_floors_answers_have_the_extenders_shape() -> None:
    floor = floor_server.Floor()
    names = node_names(5000)
    body = _body(names)
    assert floor.filter(body) == filter_result(ExtenderArgs({}, names, None), names, {}, {})
    ranked = orjson.loads(floor.prioritize(body))
    assert len(ranked) == 4000  # the hosts at the least score are left out, one in LEFT_OUT_ONE_IN
    assert all(entry["Score"] > 0 for entry in ranked) and {entry["Host"] for entry in ranked} < set(names)
    fewer = names[:7]
    assert [entry["Host"] for entry in orjson.loads(floor.prioritize(_body(fewer)))] == fewer[1:5] + fewer[6:]


def test_the_running_floor_answers_before_asgi(tmp_path: Path) -> None:
    """A verb answered by the extender's protocol carries its Server-Timing; /healthz goes through ASGI."""
    server = Server([sys.executable, str(LOADTESTS / "floor_server.py")], tmp_path / "floor.log")
    try:
        server.wait_ready("/healthz")
        connection = _connect(server.port)
        names = node_names(100)
        for path, check in (("/filter", lambda answer: answer["NodeNames"] == names and answer["Error"] == ""),
                            ("/prioritize", lambda answer: len(answer) == 80)):
            connection.request("POST", path, _body(names), {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            assert response.status == 200 and check(orjson.loads(answer))
            assert (response.getheader("Server-Timing") or "").startswith("verb;dur=")
    finally:
        server.stop()
