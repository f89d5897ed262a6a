"""kube-scheduler's side of `make demo`: the extender's server on a local port, and one scheduling cycle over HTTP
as kube-scheduler runs it (its own count check, then POST /filter, /prioritize and /bind to the best score).

Every part of the demo drives the server through this one cycle, so what each part shows is what kube-scheduler
would get from the same answers.
"""

from __future__ import annotations

import http.client
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import orjson
import uvicorn

from extender.demo.cluster import DemoCluster
from extender.server.app import create_app
from extender.verbs.service import ExtenderService


@contextmanager
def running_server(service: ExtenderService) -> Iterator[int]:
    """The extender's app served by uvicorn on a free local port, for as long as the block runs."""
    server = uvicorn.Server(uvicorn.Config(create_app(service), host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the demo server did not start")
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(5)


@dataclass(frozen=True, slots=True)
class Cycle:
    """One scheduling cycle: the node the pod was bound to (None: it was not), prioritize's scores of the nodes
    filter passed (in filter's order) as kube-scheduler reads them (relative to the least, 0 for a node the
    answer leaves out), filter's reason for each node it refused (answered only when none passed: extender/api/wire.py
    says why), and bind's error if any."""

    node: str | None
    scores: Mapping[str, int]
    refused: Mapping[str, str]
    error: str = ""


class Scheduler:
    """kube-scheduler's calls to one extender server, over one keep-alive connection."""

    def __init__(self, port: int) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        self._connection.connect()
        # http.client writes headers and body separately; without NODELAY each request waits on a delayed ACK.
        self._connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._connection.close()

    def cycle(self, pod: Mapping[str, Any], candidates: Sequence[str],
              prebind: Callable[[str], None] | None = None) -> Cycle:
        """Filter the candidates, prioritize those that pass, bind to the highest score (the first of equals).
        `prebind` is told the node first, as kube-scheduler's PreBind plugins run before the extender's bind
        (its DRA plugin writes the pod's claims there)."""
        verdict = self._post("/filter", {"Pod": pod, "Nodes": None, "NodeNames": list(candidates)})
        refused = {**verdict["FailedNodes"], **verdict["FailedAndUnresolvableNodes"]}
        passed = verdict["NodeNames"]
        if not passed:
            return Cycle(None, {}, refused)
        ranked = self._post("/prioritize", {"Pod": pod, "Nodes": None, "NodeNames": passed})
        given = {entry["Host"]: entry["Score"] for entry in ranked}
        scores = {name: given.get(name, 0) for name in passed}
        node = max(passed, key=lambda name: scores[name])
        meta = pod["metadata"]
        if prebind is not None:
            prebind(node)
        answer = self._post("/bind", {"PodName": meta["name"], "PodNamespace": meta["namespace"],
                                      "PodUID": meta["uid"], "Node": node})
        if answer["Error"]:
            return Cycle(None, scores, refused, answer["Error"])
        return Cycle(node, scores, refused)

    def _post(self, path: str, body: Mapping[str, Any]) -> Any:
        self._connection.request("POST", path, body=orjson.dumps(body), headers={"Content-Type": "application/json"})
        return orjson.loads(self._connection.getresponse().read())


def fits_by_count(cluster: DemoCluster, gpus: int) -> list[str]:
    """kube-scheduler's own check (NodeResourcesFit): the nodes whose allocatable devices, less what their pods
    request, hold the pod's count."""
    requested: dict[str, int] = {}
    for pod in cluster.pods.values():
        node = pod["spec"].get("nodeName")
        if node:
            requested[node] = requested.get(node, 0) + int(
                pod["spec"]["containers"][0]["resources"]["requests"][cluster.state.resource])
    return [name for name in cluster.topologies if cluster.allocatable(name) - requested.get(name, 0) >= gpus]
