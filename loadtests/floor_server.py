"""The floor for `loadtests/load_extender.py`: a bare FastAPI app that parses a filter or prioritize body and
echoes the node names, served exactly as the extender is (uvicorn, one process, one worker, no access log,
127.0.0.1 only), with the same framework, server and serializer. What the extender takes beyond this is the
extender's own work.

It prints one line `READY {"port": …}` once its socket is bound.

    python loadtests/floor_server.py [--port 0]
"""

from __future__ import annotations

import argparse
import json
import socket
from collections.abc import Sequence

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response

JSON = "application/json"


def create_floor_app() -> FastAPI:
    app = FastAPI(title="floor", docs_url=None, redoc_url=None, openapi_url=None)

    async def filter_echo(request: Request) -> Response:
        names = orjson.loads(await request.body()).get("NodeNames") or []
        return Response(orjson.dumps({"NodeNames": names, "FailedNodes": {}, "FailedAndUnresolvableNodes": {},
                                      "Error": ""}), media_type=JSON)

    async def prioritize_echo(request: Request) -> Response:
        names = orjson.loads(await request.body()).get("NodeNames") or []
        return Response(orjson.dumps([{"Host": name, "Score": 0} for name in names]), media_type=JSON)

    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    app.add_api_route("/filter", filter_echo, methods=["POST"])
    app.add_api_route("/prioritize", prioritize_echo, methods=["POST"])
    app.add_api_route("/healthz", healthz, methods=["GET"])
    return app


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free port)")
    args = parser.parse_args(argv)
    # IPPROTO_TCP, so that asyncio sets TCP_NODELAY on accepted connections, as the extender's server does.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    print("READY " + json.dumps({"port": sock.getsockname()[1]}), flush=True)
    uvicorn.Server(uvicorn.Config(create_floor_app(), log_level="warning", access_log=False)).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
