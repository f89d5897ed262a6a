"""The real extender server (uvicorn, `extender.server.serve`'s protocol and limits) on a free loopback port, in a
thread."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

import uvicorn

from extender.server.certificates import CHECK_SECONDS
from extender.server.serve import Listeners, ServeOptions, server_config
from extender.verbs.service import ExtenderService

WAIT = 30.0  # only a bound for a failing test, never a measurement


class Serving(NamedTuple):
    server: uvicorn.Server
    port: int
    thread: threading.Thread


@contextmanager
def serving(service: ExtenderService, options: ServeOptions = ServeOptions()) -> Iterator[Serving]:
    """Serve until the block ends (or the block stops the server itself); the thread is joined on the way out."""
    listener = _listener()
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


class Listening(NamedTuple):
    listeners: Listeners
    port: int
    metrics_port: int | None


@contextmanager
def listening(service: ExtenderService, options: ServeOptions = ServeOptions(),
              check_seconds: float = CHECK_SECONDS) -> Iterator[Listening]:
    """`serve`'s listeners (the main port, the metrics port if `options` asks for one, the certificates checked every
    `check_seconds`) on free loopback ports, in a thread, until the block ends."""
    sockets = [_listener() for _ in range(1 if options.metrics_port is None else 2)]
    ports = [listener.getsockname()[1] for listener in sockets]
    listeners = Listeners(service, replace(options, port=ports[0],
                                           metrics_port=None if options.metrics_port is None else ports[1]),
                          check_seconds)
    thread = threading.Thread(target=listeners.run, args=(sockets[:1], sockets[1:] or None), name="extender-server",
                              daemon=True)
    thread.start()
    servers = [server for server in (listeners.main, listeners.metrics) if server is not None]
    started = threading.Event()
    while not all(server.started for server in servers) and thread.is_alive() and not started.wait(0.02):
        pass
    assert all(server.started for server in servers), "the servers did not start"
    try:
        yield Listening(listeners, ports[0], ports[1] if len(ports) > 1 else None)
    finally:
        listeners.main.should_exit = True
        thread.join(10)
        for listener in sockets:
            listener.close()


def hold_binds(service: ExtenderService) -> tuple[threading.Event, threading.Event]:
    """Each Binding waits for `release` once it has set `entered`: a bind at work on its thread (the demo cluster
    posts no Binding from the event loop)."""
    entered, release = threading.Event(), threading.Event()
    real_bind = service.kube.bind

    def held_bind(*args):
        entered.set()
        release.wait(WAIT)
        return real_bind(*args)

    service.kube.bind = held_bind  # type: ignore[method-assign]
    return entered, release


def accepts(port: int) -> bool:
    """The listener takes connections: false once a server stopping has closed it."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=WAIT).close()
    except ConnectionRefusedError:
        return False
    return True


def _listener() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    return listener
