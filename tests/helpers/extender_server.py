"""The real extender server (uvicorn, `extender.server.serve`'s protocol and limits) on a free loopback port, in a
thread."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import uvicorn

from extender.server.serve import ServeOptions, server_config
from extender.verbs.service import ExtenderService


class Serving(NamedTuple):
    server: uvicorn.Server
    port: int
    thread: threading.Thread


@contextmanager
def serving(service: ExtenderService, options: ServeOptions = ServeOptions()) -> Iterator[Serving]:
    """Serve until the block ends (or the block stops the server itself); the thread is joined on the way out."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(service, options))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, name="extender-server", daemon=True)
    thread.start()
    started = threading.Event()
    while not server.started and thread.is_alive() and not started.wait(0.02):
        pass
    assert server.started, "the server did not start"
    try:
        yield Serving(server, listener.getsockname()[1], thread)
    finally:
        server.should_exit = True
        thread.join(10)
        listener.close()


@contextmanager
def running_server(service: ExtenderService, options: ServeOptions = ServeOptions()) -> Iterator[int]:
    """Serve until the block ends; yields the port."""
    with serving(service, options) as served:
        yield served.port
