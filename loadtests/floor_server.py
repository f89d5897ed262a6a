"""The floor for `loadtests/load_extender.py`: filter and prioritize answered with none of the extender's own work,
through the extender's own serving path. `extender.server.serve.server_config` serves it as it serves the extender
in `large_cluster_server.py` (uvicorn, one process, one worker, no access log, uvloop, 127.0.0.1 only), so a verb's
POST is answered by the extender's protocol (`limited_protocol`) before ASGI, through a `Verb` on the event loop.
What the extender takes beyond this is its own work: reading and checking the request, deciding, scoring.

The answers have the extender's shape, written by its serializers (extender/api/wire.py):
- filter: every name passes (`filter_result`);
- prioritize: `prioritize_result`, which leaves out the hosts at the least score, as the extender does. The
  scores are a fixed pattern by position, so they cost nothing, that leaves out one host in LEFT_OUT_ONE_IN: at the
  load test's fill the extender listed 91 % of 5,000 names for a 1-GPU pod, 81 % for 2 GPUs and 57 to 63 % for 4,
  80 % over the load's mix of pods.
A body is parsed once when prioritize gets the filter's body again, as the extender parses it (server/app.py).

It prints one line `READY {"port": …}` once its socket is bound.

    python loadtests/floor_server.py [--port 0]
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import orjson
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from extender.api.wire import MAX_BODY_BYTES, ExtenderArgs, filter_result, prioritize_result
from extender.cache.cluster_state import ClusterState
from extender.server.app import Answered, ExtenderApp, Verb
from extender.server.serve import ServeOptions, server_config
from extender.verbs.metrics import Metrics
from extender.verbs.service import ExtenderService

LEFT_OUT_ONE_IN = 5
"""prioritize leaves out the hosts whose position is a multiple of this: the share the extender leaves out."""


class _Served:
    """What the server and a `Verb` read of the extender's service: its metrics, which count the connections and
    the refused requests. The floor has no service; this stands in for it."""

    def __init__(self) -> None:
        self.metrics = Metrics(ClusterState(), ())


def stand_in() -> ExtenderService:
    return cast(ExtenderService, _Served())


class Floor:
    """The two verbs' answers, with the last body's names remembered."""

    def __init__(self) -> None:
        self._last: tuple[bytes, list[str]] = (b"", [])
        self._scores: list[int] = []

    def names(self, body: bytes) -> list[str]:
        if body != self._last[0]:
            self._last = (body, orjson.loads(body).get("NodeNames") or [])
        return self._last[1]

    def filter(self, body: bytes) -> bytes:
        names = self.names(body)
        return filter_result(ExtenderArgs({}, names, None), names, {}, {})

    def prioritize(self, body: bytes) -> bytes:
        names = self.names(body)
        if len(self._scores) < len(names):
            self._scores = [index % LEFT_OUT_ONE_IN for index in range(len(names))]
        return prioritize_result(names, self._scores[:len(names)])


def create_floor_app(served: ExtenderService) -> ExtenderApp:
    """The verbs as the extender's protocol answers them, and /healthz through ASGI."""
    floor = Floor()
    web = FastAPI(title="floor", docs_url=None, redoc_url=None, openapi_url=None)

    @web.get("/healthz")
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    def respond(answer: Callable[[bytes], bytes]) -> Callable[[bytes, bool], Answered]:
        def timed(body: bytes, compute: bool) -> Answered:
            started = time.perf_counter()
            content = answer(body)
            return 200, content, time.perf_counter() - started
        return timed

    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verbs")  # Verb's fallback: the lock is never held
    lock = threading.Lock()
    verbs = {f"/{name}": Verb(served, name, respond(answer), MAX_BODY_BYTES, worker, lock, True)
             for name, answer in (("filter", floor.filter), ("prioritize", floor.prioritize))}
    return ExtenderApp(web, verbs)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    args = parser.parse_args(argv)
    # IPPROTO_TCP, so that asyncio sets TCP_NODELAY on accepted connections, as the extender's server does.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    served = stand_in()
    config = server_config(served, ServeOptions(log_level="warning"), create_floor_app(served))
    print("READY " + json.dumps({"port": sock.getsockname()[1]}), flush=True)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
