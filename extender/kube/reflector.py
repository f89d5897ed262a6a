"""Keep a local cache in sync with one kind of Kubernetes object, as client-go's reflector does.

List, hand the whole list to the sink, then watch from the list's resourceVersion and pass each change on.
A watch that ends (the server's timeout) or breaks (a reset, a proxy) is resumed from the last
resourceVersion seen, so nothing is lost and nothing is listed twice; only a 410 Gone (that version is no
longer retained), a watch the server refuses outright (another 4xx), or a sink that raised leads to a new
list. Failures back off exponentially with jitter, and so does a watch that ends at once with nothing in
it, so an API server that is down or misbehaving never meets a tight loop.

The reflector is resource-agnostic: it is given a list function, a watch function and a sink. BOOKMARK
events only move the resourceVersion on; they never reach the sink.

`relist()` asks for a fresh list at once (the open watch is closed) and returns a ticket; `listed(ticket)`
tells when a list that began after the request has reached the sink. A new leader uses it to rebuild its
ledger: a list is a consistent read, so it holds every bind the previous leader made, however far behind the
watch was.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from extender.kube.client import Gone, KubeError
from topology.backoff import Backoff

log = logging.getLogger(__name__)

CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})

ListFn = Callable[[], tuple[list[dict], str]]
WatchFn = Callable[[str, int], Iterable[tuple[str, dict]]]


class Sink(Protocol):
    """Where a reflector delivers: the whole list, then each change, in order, from one thread."""

    def replace(self, items: list[dict]) -> None: ...

    def apply(self, event_type: str, obj: dict) -> None: ...

    def synced(self) -> None: ...


class Tee:
    """One watch delivered to several sinks, in order: two readers of a kind, one list and one watch."""

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks

    def replace(self, items: list[dict]) -> None:
        for sink in self.sinks:
            sink.replace(items)

    def apply(self, event_type: str, obj: dict) -> None:
        for sink in self.sinks:
            sink.apply(event_type, obj)

    def synced(self) -> None:
        for sink in self.sinks:
            sink.synced()


class Reflector:
    """One kind of object, kept in sync in a daemon thread.

    `watch_timeout` is the server-side length of each watch (seconds). `stop()` is prompt: it is checked
    between events, and a watch iterator with a thread-safe `close()` (as `kube.WatchStream` has) is closed
    so that a quiet stream does not hold the thread until the server ends it. `sleep(seconds)` and `clock()`
    can be injected for tests; the default sleep wakes early on `stop()`. A watch that lasts at least
    `healthy_watch` seconds, or delivers anything, resets the backoff.
    """

    def __init__(
        self,
        list_fn: ListFn,
        watch_fn: WatchFn,
        sink: Sink,
        *,
        name: str = "objects",
        watch_timeout: int = 60,
        backoff: Backoff | None = None,
        sleep: Callable[[float], object] | None = None,
        clock: Callable[[], float] = time.monotonic,
        healthy_watch: float = 1.0,
    ) -> None:
        self.name = name
        self.watch_timeout = watch_timeout
        self.healthy_watch = healthy_watch
        self._list_fn, self._watch_fn, self._sink = list_fn, watch_fn, sink
        # Watches resume fast after a blip: 0.2 s first, doubling to 30 s, +-20 %.
        self._backoff = backoff or Backoff(initial=0.2, maximum=30.0, jitter=0.2)
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._sleep = sleep or self._stopping.wait
        self._clock = clock
        self._synced = threading.Event()
        self._stream: Iterable[tuple[str, dict]] | None = None
        self._thread: threading.Thread | None = None
        self.resource_version: str | None = None  # the last one seen; None means "list next"
        self._wanted = 0  # relists asked for (tickets handed out)
        self._listed = 0  # the last ticket a finished list answered
        self._absent = False  # the last call was answered 404 (_not_served)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    def wait_for_sync(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def relist(self) -> int:
        """Ask for a new list now; the ticket is answered once a list that began after this call is in the sink."""
        with self._lock:
            self._wanted += 1
            ticket = self._wanted
        self._close_stream()
        return ticket

    def listed(self, ticket: int) -> bool:
        with self._lock:
            return self._listed >= ticket

    def _relist_wanted(self) -> bool:
        with self._lock:
            return self._wanted > self._listed

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError(f"reflector {self.name} already started")
        self._thread = threading.Thread(target=self._run, name=f"reflector-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = 10.0) -> bool:
        """Stop and wait for the thread; True if it ended within `timeout`."""
        self._stopping.set()
        self._close_stream()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the loop ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self.resource_version is None or self._relist_wanted():
                    self._list()
                self._watch()
            except KubeError as exc:
                if self._stopping.is_set():
                    break
                if isinstance(exc, Gone):
                    log.info("reflector %s: %s; listing again", self.name, exc)
                    self.resource_version = None
                elif exc.status == 404:
                    self._not_served(exc)
                    self.resource_version = None
                elif exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
                    log.warning("reflector %s: %s; listing again", self.name, exc)
                    self.resource_version = None
                else:
                    log.warning("reflector %s: %s", self.name, exc)
                self._pause()
            except Exception:
                log.exception("reflector %s: the sink failed; listing again", self.name)
                self.resource_version = None
                self._pause()
        log.debug("reflector %s stopped", self.name)

    def _not_served(self, exc: KubeError) -> None:
        """A 404: the API server serves no such resource (a CRD or an API group not installed, as PodGroups often
        are). Said at WARNING once, then at debug until a list succeeds: asked again at every backoff, it would
        otherwise be a warning every few minutes for as long as the cluster runs without it."""
        log.log(logging.DEBUG if self._absent else logging.WARNING,
                "reflector %s: %s; the API server does not serve it: asking again as the backoff allows, said "
                "at debug from now on", self.name, exc)
        self._absent = True

    def _pause(self) -> None:
        if not self._stopping.is_set():
            self._sleep(self._backoff.next())

    def _list(self) -> None:
        with self._lock:
            ticket = self._wanted
        items, resource_version = self._list_fn()
        if self._absent:
            self._absent = False
            log.info("reflector %s: the API server serves it now", self.name)
        self._sink.replace(items)
        self.resource_version = resource_version
        with self._lock:
            self._listed = max(self._listed, ticket)
        log.debug("reflector %s: listed %d at %s", self.name, len(items), resource_version)
        if not self._synced.is_set():
            self._synced.set()
            self._sink.synced()

    def _watch(self) -> None:
        assert self.resource_version is not None
        started = self._clock()
        delivered = False
        stream = self._watch_fn(self.resource_version, self.watch_timeout)
        self._stream = stream
        try:
            if self._stopping.is_set() or self._relist_wanted():
                return
            for event_type, obj in stream:
                if event_type in CHANGES:
                    self._sink.apply(event_type, obj)
                elif event_type != "BOOKMARK":
                    log.warning("reflector %s: ignored a %r event", self.name, event_type)
                resource_version = (obj.get("metadata") or {}).get("resourceVersion")
                if resource_version:
                    self.resource_version = resource_version
                if not delivered:
                    delivered = True
                    self._backoff.reset()
                if self._stopping.is_set() or self._relist_wanted():
                    return
        finally:
            self._stream = None
            _close(stream)
        if not delivered and not self._relist_wanted():
            if self._clock() - started >= self.healthy_watch:
                self._backoff.reset()
            else:  # ended at once with nothing in it: do not spin
                self._pause()

    def _close_stream(self) -> None:
        stream = self._stream
        if stream is not None:
            _close(stream)


def _close(stream: object) -> None:
    close = getattr(stream, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):  # e.g. ValueError: a generator running in the reflector thread
            close()
