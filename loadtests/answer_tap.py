"""Every answer an extender server writes, counted where it is written: on each connection's transport.

An answer can be written by any of three paths: the extender's own protocol answers the verbs before ASGI
(extender/server/serve.py `limited_protocol`, and its 408 and 431 refusals), FastAPI answers the probes and
/metrics, and uvicorn itself answers a request it cannot parse (400), an app that raised (500) or a server past its
connection limit (503). An ASGI wrapper sees only the second, so loadtests/fuzz.py once counted 0 of 11,000
verb answers. Every path writes an answer's head as the start of one `transport.write`, so the status lines read
there are every answer the server gave, whichever path gave it.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

INTERNAL = b"internal error"  # what a verb's Error says when it raised (extender/server/app.py `_failed`)
NO_REQUEST_LINE = "(no request line)"  # an answer to a request whose head never parsed: 400, 408 or 431


class AnswerTap:
    """Answers by (path, status), and the paths whose answer said "internal error"."""

    def __init__(self) -> None:
        self.answers: Counter[tuple[str, int]] = Counter()
        self.internal: Counter[str] = Counter()

    @property
    def total(self) -> int:
        return sum(self.answers.values())

    def by_status(self) -> Counter[int]:
        statuses: Counter[int] = Counter()
        for (_, status), count in self.answers.items():
            statuses[status] += count
        return statuses

    def protocol(self, base: type[HttpToolsProtocol]) -> type[HttpToolsProtocol]:
        """`base` (the server's protocol class) with every connection's transport read by this tap."""
        tap = self

        class Tapped(base):  # type: ignore[valid-type,misc]
            def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
                super().connection_made(_Wire(transport, tap))

            def on_headers_complete(self) -> None:
                # Before the base: it may answer at once (431, 413). Answers come in the order of requests.
                self.transport.paths.append(self.url.split(b"?", 1)[0].decode("latin-1"))
                super().on_headers_complete()

        return Tapped


class _Wire:
    """A connection's transport that counts each answer head written to it and looks for "internal error" in
    what follows; everything else is the real transport's."""

    def __init__(self, transport: asyncio.Transport, tap: AnswerTap) -> None:
        self._transport = transport
        self._tap = tap
        self.paths: deque[str] = deque()  # requests whose head parsed, not yet answered
        self._path = NO_REQUEST_LINE
        self._internal = False  # the current answer already counted as an internal error

    def write(self, data: bytes) -> None:
        # An interim 100 Continue is no answer: the final head follows it.
        if data.startswith(b"HTTP/1.") and data[9:10] != b"1":
            self._path = self.paths.popleft() if self.paths else NO_REQUEST_LINE
            self._tap.answers[self._path, int(data[9:12])] += 1
            self._internal = False
        if not self._internal and INTERNAL in data:
            self._internal = True
            self._tap.internal[self._path] += 1
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
