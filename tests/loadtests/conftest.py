"""A stand-in for the extender's HTTP server, answering each path with fixed JSON: the benchmarks' clients are
tested against the answers a broken extender would give (an Error, a failed bind) without a load run."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest

Answers = Mapping[str, Any]  # path -> the JSON answered to every request there
StubServer = Callable[[Answers], int]  # answers -> the port it listens on


@pytest.fixture
def stub_server() -> Iterator[StubServer]:
    """Start servers on 127.0.0.1 answering HTTP/1.1 (kept alive, as the benchmarks' clients expect); all are
    stopped after the test."""
    servers: list[ThreadingHTTPServer] = []

    def start(answers: Answers) -> int:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = orjson.dumps(answers[self.path]) if self.path in answers else b"{}"
                self.send_response(200 if self.path in answers else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Server-Timing", "verb;dur=0.100")
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *args: object) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server.server_address[1]

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
