"""HTTP/2 for kube-scheduler's verbs: all its calls as streams of one connection.

kube-scheduler's extender client offers h2 by ALPN (client-go's transport defaults). Over HTTP/1.1 it keeps two
idle connections and opens another, with a full TLS handshake, whenever a call overlaps them (a bind and the next
pod's filter): at 5,000 nodes 0.35 to 0.4 handshakes a pod, each 1.3 to 1.5 ms of CPU here and 0.3 to 0.4 ms a
pod in kube-scheduler (BENCHMARKS.md). Over h2 a call is a stream and no call opens a connection.

The server side of RFC 9113 that a client of POSTs needs, written here rather than taken from the h2 library: h2
cost 100 to 140 us of CPU a request against about 25 here (its general state machine, header validation and
encoder in Python), which at two or three calls a pod was a fifth of the extender's CPU. Header blocks are decoded by
hpack_decoder.py (Huffman codes, the dynamic table, the bound on a decoded list); answers are encoded without the
dynamic table (RFC 7541 6.2.2), so no table is kept for them.

What the HTTP/1.1 protocol (serve.py) keeps for input from outside, kept per stream:
- a stream's request must be whole within the request deadline; a connection without a stream open closes after
  the idle time;
- a header block is bounded by MAX_HEADER_LIST_SIZE (HTTP/1.1's head bound) compressed and decoded, a frame by
  MAX_FRAME_BYTES, refused at its header before its body is held;
- a body is refused with 413 as it passes the verb's limit; the bytes of bodies not yet whole are bounded by the
  connection's receive window, as a body is acknowledged only once it is whole or refused;
- streams open at once are bounded (MAX_STREAMS), so are streams the client resets (MAX_RESETS, the rapid reset
  of CVE-2023-44487);
- no request is read while the client does not read its answers.
Any breach of the protocol closes the connection with GOAWAY and its error code. Only the verbs are served here
(POST to a verb's path, answered by the same `Verb` as over HTTP/1.1); the probes and /metrics answer over HTTP/1.1,
which every other client of this port speaks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import partial

from extender.server.app import JSON, Answered, Verb, declared_over_limit, over_limit, server_timing
from extender.server.hpack_decoder import CompressionError, HeaderListTooLarge, HpackDecoder

log = logging.getLogger(__name__)

ALPN = ("h2", "http/1.1")
"""What the main port offers, in its order of preference."""

MAX_STREAMS = 32
"""Streams open at once on one connection: kube-scheduler has one filter or prioritize and its binds in flight.
A client that keeps to the setting never meets it; Go's opens another connection past it."""

MAX_FRAME_BYTES = 256 << 10
"""The largest frame accepted: a 5,000-name body arrives in one frame, and a frame is held whole before it is read."""

WINDOW_SLACK = 1 << 20
"""Bytes taken or let go that are given back to the connection's window (WINDOW_UPDATE) at once, beyond the
largest body and frame it holds: a window update per request would be a frame and a write more a bind, whose
answer goes out on its own later. Its bytes can be held unacknowledged, so a body of the largest size always
finds room."""

MAX_RESETS = 256
"""Streams the client may reset on one connection before it is closed: kube-scheduler resets one only when its
httpTimeout passes."""

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What a client sends before its first frame (RFC 9113 3.4)."""

FORBIDDEN = b"client certificate name not allowed by --client-name"

_MAX_WINDOW = (1 << 31) - 1
_DEFAULT_WINDOW = 65535
_DEFAULT_FRAME = 16384


# Frame types (RFC 9113 6), plain ints: each frame is compared with them.
_DATA, _HEADERS, _PRIORITY_FRAME, _RST_STREAM, _SETTINGS, _PUSH_PROMISE, _PING, _GOAWAY, _WINDOW_UPDATE = range(9)
_CONTINUATION = 9


class ErrorCode(IntEnum):
    """The codes of RST_STREAM and GOAWAY this server sends (RFC 9113 7)."""

    NO_ERROR = 0
    PROTOCOL_ERROR = 1
    FLOW_CONTROL_ERROR = 3
    FRAME_SIZE_ERROR = 6
    REFUSED_STREAM = 7
    COMPRESSION_ERROR = 9
    ENHANCE_YOUR_CALM = 11


_END_STREAM, _ACK, _END_HEADERS, _PADDED, _PRIORITY = 0x1, 0x1, 0x4, 0x8, 0x20
# SETTINGS identifiers (RFC 9113 6.5.2).
_ENABLE_PUSH, _MAX_CONCURRENT_STREAMS, _INITIAL_WINDOW_SIZE, _MAX_FRAME_SIZE, _MAX_HEADER_LIST_SIZE = 2, 3, 4, 5, 6


@dataclass(frozen=True, slots=True)
class Http2Limits:
    request_seconds: float  # from a stream's head to its body's end
    idle_seconds: float  # a connection with no stream open
    max_head_bytes: int  # a header block, compressed and decoded (as RFC 9113 6.5.2 counts it)
    max_body_bytes: int  # the largest body any verb takes: the receive windows


class ProtocolBreach(Exception):
    """The client broke RFC 9113: the connection closes with GOAWAY and this code."""

    def __init__(self, code: ErrorCode, what: str, reason: str = "http2_protocol") -> None:
        super().__init__(what)
        self.code = code
        self.reason = reason


def _frame(kind: int, flags: int, stream_id: int, payload: bytes | memoryview = b"") -> bytes:
    return b"".join(((len(payload) << 8 | kind).to_bytes(4, "big"), bytes((flags,)), stream_id.to_bytes(4, "big"),
                     payload))


def _integer(value: int, prefix_bits: int, first: int = 0) -> bytes:
    """An HPACK integer (RFC 7541 5.1) whose first byte carries `first` above its prefix."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(index: int, value: bytes) -> bytes:
    """A field not indexed (RFC 7541 6.2.2) whose name is static table entry `index`, its value not Huffman coded."""
    return _integer(index, 4) + _integer(len(value), 7) + value


def _named_literal(name: bytes, value: bytes) -> bytes:
    """A field not indexed with a name of its own."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(len(value), 7) + value


_STATUS_INDEXED = {200: 8, 204: 9, 206: 10, 304: 11, 400: 12, 404: 13, 500: 14}  # RFC 7541 Appendix A
_CONTENT_TYPE, _CONTENT_LENGTH, _STATUS_NAME = 31, 28, 8
_JSON = _literal(_CONTENT_TYPE, JSON)
_TEXT = _literal(_CONTENT_TYPE, b"text/plain")


def _head(status: int, content_type: bytes, length: int, *more: tuple[bytes, bytes]) -> bytes:
    """An answer's header block."""
    index = _STATUS_INDEXED.get(status)
    block = [bytes((0x80 | index,)) if index else _literal(_STATUS_NAME, b"%d" % status), content_type,
             _literal(_CONTENT_LENGTH, b"%d" % length)]
    block += (_named_literal(name, value) for name, value in more)
    return b"".join(block)


class _Stream:
    """A verb request being read."""

    __slots__ = ("chunks", "deadline", "received", "size", "verb")

    def __init__(self, verb: Verb) -> None:
        self.verb = verb
        self.deadline: asyncio.TimerHandle | None = None  # armed once a read leaves the request unfinished
        self.chunks: list[bytes] = []
        self.size = 0
        self.received = 0  # flow-controlled bytes, padding included: acknowledged once the body is taken


class Http2Verbs:
    """One h2 connection: its frames read, its streams bounded and answered through the verbs."""

    def __init__(self, transport: asyncio.Transport, verbs: Mapping[bytes, Verb], limits: Http2Limits,
                 refused: Callable[[str], None], peer: str, forbidden: bool = False) -> None:
        self._transport = transport
        self._verbs = verbs
        self._limits = limits
        self._refused = refused
        self._peer = peer
        self._forbidden = forbidden
        self._loop = asyncio.get_running_loop()
        self._decoder = HpackDecoder(limits.max_head_bytes)
        self._in = bytearray()
        self._preface = len(PREFACE)  # bytes of the preface still to come
        self._out: list[bytes] = []
        self._block = bytearray()  # a header block whose CONTINUATION frames are still to come
        self._block_stream = 0
        self._block_flags = 0
        self._last = 0  # the highest stream the client has opened
        self._streams: dict[int, _Stream] = {}  # requests being read
        self._open: dict[int, int] = {}  # streams not yet answered whole: what the client's window lets us send
        self._half_open: set[int] = set()  # of those, streams whose request the client has not ended
        self._sending: dict[int, memoryview] = {}  # answers waiting for a window
        self._send_window = _DEFAULT_WINDOW  # the connection's, as the client grants it
        self._initial_window = _DEFAULT_WINDOW  # a new stream's, from the client's SETTINGS
        self._max_frame = _DEFAULT_FRAME  # the client's SETTINGS_MAX_FRAME_SIZE
        self._receive_window = limits.max_body_bytes + MAX_FRAME_BYTES + WINDOW_SLACK
        self._unacknowledged = 0  # received bytes taken or let go, not yet given back by WINDOW_UPDATE
        self._working = 0  # streams whose verb is at work
        self._resets = 0
        self._closing = False
        self._idle: asyncio.TimerHandle | None = None
        self._idle_since: float | None = None  # when the last stream was answered, while none is open
        settings = ((_MAX_CONCURRENT_STREAMS, MAX_STREAMS), (_INITIAL_WINDOW_SIZE, limits.max_body_bytes + 1),
                    (_MAX_FRAME_SIZE, MAX_FRAME_BYTES), (_MAX_HEADER_LIST_SIZE, limits.max_head_bytes))
        self._out.append(_frame(_SETTINGS, 0, 0, b"".join(key.to_bytes(2, "big") + value.to_bytes(4, "big")
                                                               for key, value in settings)))
        self._out.append(_frame(_WINDOW_UPDATE, 0, 0, (self._receive_window - _DEFAULT_WINDOW).to_bytes(4, "big")))
        self._flush()
        self._settled()

    def received(self, data: bytes) -> None:
        try:
            self._read(data)
        except ProtocolBreach as breach:
            self._close(breach.reason, str(breach), breach.code)
            return
        for stream_id, stream in self._streams.items():  # a request whole within one read needs no timer
            if stream.deadline is None:
                stream.deadline = self._loop.call_later(self._limits.request_seconds, self._expired, stream_id)
        self._give_back()

    def _give_back(self) -> None:
        """The connection's window opened by the bytes taken or let go once they pass WINDOW_SLACK, and what is to
        send written at once."""
        if self._unacknowledged >= WINDOW_SLACK and not self._transport.is_closing():
            self._out.append(_frame(_WINDOW_UPDATE, 0, 0, self._unacknowledged.to_bytes(4, "big")))
            self._receive_window += self._unacknowledged
            self._unacknowledged = 0
        self._flush()

    def writable(self, writable: bool) -> None:
        """The transport's write buffer passed its high mark (not writable) or fell back: no request is read while
        the client does not read its answers."""
        if writable:
            self._transport.resume_reading()
        else:
            self._transport.pause_reading()

    def shutdown(self) -> None:
        """The server stops: no new stream, and the connection closes once the streams at work are answered."""
        self._closing = True
        self._settled()

    def lost(self) -> None:
        self._closing = True
        for stream in self._streams.values():
            if stream.deadline is not None:
                stream.deadline.cancel()
        self._streams.clear()
        self._open.clear()
        self._sending.clear()
        if self._idle is not None:
            self._idle.cancel()

    def _read(self, data: bytes) -> None:
        buffer = self._in
        buffer += data
        if self._preface:
            seen = min(self._preface, len(buffer))
            start = len(PREFACE) - self._preface
            if buffer[:seen] != PREFACE[start:start + seen]:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent no HTTP/2 preface")
            del buffer[:seen]
            self._preface -= seen
        position = 0
        while len(buffer) - position >= 9 and not self._transport.is_closing():
            length = int.from_bytes(buffer[position:position + 3], "big")
            if length > MAX_FRAME_BYTES:
                raise ProtocolBreach(ErrorCode.FRAME_SIZE_ERROR, f"sent a frame of {length} bytes, "
                                                                 f"over {MAX_FRAME_BYTES}")
            end = position + 9 + length
            if len(buffer) < end:
                break
            kind, flags = buffer[position + 3], buffer[position + 4]
            stream_id = int.from_bytes(buffer[position + 5:position + 9], "big") & _MAX_WINDOW
            payload = bytes(buffer[position + 9:end])
            position = end
            self._frame(kind, flags, stream_id, payload)
        del buffer[:position]

    def _frame(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if self._block_stream and kind != _CONTINUATION:
            raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "interrupted a header block")
        if kind == _DATA:
            self._data(flags, stream_id, payload)
        elif kind == _HEADERS or kind == _CONTINUATION:
            self._headers(kind, flags, stream_id, payload)
        elif kind == _WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == _SETTINGS:
            self._settings(flags, stream_id, payload)
        elif kind == _RST_STREAM:
            if stream_id == 0 or len(payload) != 4:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent a malformed RST_STREAM")
            self._reset(stream_id)
        elif kind == _PING:
            if stream_id != 0 or len(payload) != 8:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent a malformed PING")
            if not flags & _ACK:
                self._out.append(_frame(_PING, _ACK, 0, payload))
        elif kind == _PRIORITY_FRAME:
            if stream_id == 0 or len(payload) != 5:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent a malformed PRIORITY")
        elif kind == _GOAWAY:
            self._closing = True  # the client opens no more streams: what is at work is answered, then it closes
            self._settled()
        elif kind == _PUSH_PROMISE:
            raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent a PUSH_PROMISE")
        # Frames of other types are ignored (RFC 9113 4.1).

    def _data(self, flags: int, stream_id: int, payload: bytes) -> None:
        length = len(payload)
        self._receive_window -= length
        if self._receive_window < 0:
            raise ProtocolBreach(ErrorCode.FLOW_CONTROL_ERROR, "sent past the connection's window")
        if stream_id == 0 or stream_id > self._last:
            raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, f"sent DATA on stream {stream_id}, never opened")
        body = _unpadded(payload, flags)
        stream = self._streams.get(stream_id)
        if stream is None:  # refused, answered or reset already: the bytes are let go at once
            self._unacknowledged += length
        else:
            stream.received += length
            stream.size += len(body)
            stream.chunks.append(body)
            if stream.size > stream.verb.max_body_bytes:
                self._drop(stream_id)
                self._answer(stream_id, 413, stream.verb.refuse_too_large(over_limit(stream.verb.max_body_bytes)))
        if flags & _END_STREAM:
            self._half_open.discard(stream_id)
            self._ended(stream_id)

    def _headers(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
        if kind == _CONTINUATION:
            if stream_id != self._block_stream or not stream_id:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent a CONTINUATION outside a header block")
            fragment = payload
        else:
            if stream_id == 0 or not stream_id % 2:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, f"sent HEADERS on stream {stream_id}")
            fragment = _unpadded(payload, flags)
            if flags & _PRIORITY:
                if len(fragment) < 5:
                    raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent HEADERS too short for their priority")
                fragment = fragment[5:]
            self._block_stream, self._block_flags = stream_id, flags
        self._block += fragment
        if len(self._block) > self._limits.max_head_bytes:
            raise ProtocolBreach(ErrorCode.ENHANCE_YOUR_CALM, f"sent a header block over "
                                                              f"{self._limits.max_head_bytes} bytes", "head_too_large")
        if not flags & _END_HEADERS:
            self._block_stream = stream_id
            return
        block, flags = bytes(self._block), self._block_flags
        self._block.clear()
        self._block_stream = 0
        try:
            headers = self._decoder.decode(block)  # every block: the decoder's table follows the client's
        except HeaderListTooLarge:
            raise ProtocolBreach(ErrorCode.ENHANCE_YOUR_CALM, f"sent headers over {self._limits.max_head_bytes} "
                                                              f"bytes", "head_too_large") from None
        except CompressionError as error:
            raise ProtocolBreach(ErrorCode.COMPRESSION_ERROR, f"sent a header block that does not decode: "
                                                              f"{error}") from None
        if stream_id <= self._last:  # trailers of a request being read, or HEADERS on a stream already closed
            if stream_id in self._half_open and flags & _END_STREAM:
                self._half_open.discard(stream_id)
                self._ended(stream_id)
            elif stream_id in self._half_open:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent trailers that do not end the stream")
            return
        self._last = stream_id
        if self._closing or len(self._open) >= MAX_STREAMS:  # a client retries a refused stream (RFC 9113 8.7)
            self._out.append(_frame(_RST_STREAM, 0, stream_id, ErrorCode.REFUSED_STREAM.to_bytes(4, "big")))
            return
        self._idle_since = None
        self._open[stream_id] = self._initial_window
        if not flags & _END_STREAM:
            self._half_open.add(stream_id)
        self._request(stream_id, headers)
        if flags & _END_STREAM:
            self._ended(stream_id)

    def _request(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        method = path = b""
        for name, value in headers:
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
        verb = self._verbs.get(path.partition(b"?")[0])  # kube-apiserver's webhook client adds ?timeout=
        if self._forbidden:  # counted and logged once, as the connection was made (serve.py)
            self._closing = True
            self._text(stream_id, 403, FORBIDDEN)
        elif verb is None:
            self._text(stream_id, 404, b"over HTTP/2 this port serves kube-scheduler's verbs only; "
                                       b"the probes and /metrics answer over HTTP/1.1")
        elif method != b"POST":
            self._text(stream_id, 405, b"a verb is a POST")
        elif (declared := declared_over_limit(headers, verb.max_body_bytes)) is not None:
            self._answer(stream_id, 413, verb.refuse_too_large(declared))
        else:
            self._streams[stream_id] = _Stream(verb)

    def _ended(self, stream_id: int) -> None:
        stream = self._drop(stream_id)
        if stream is None:
            return
        body = b"".join(stream.chunks)
        answered = stream.verb.now(body)
        if answered is not None:
            self._answered(stream_id, answered)
            return
        self._working += 1
        stream.verb.later(body).add_done_callback(partial(self._answered_later, stream_id, stream.verb.name))

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise ProtocolBreach(ErrorCode.FRAME_SIZE_ERROR, "sent a malformed WINDOW_UPDATE")
        increment = int.from_bytes(payload, "big") & _MAX_WINDOW
        if increment == 0:
            raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent a WINDOW_UPDATE of 0")
        if stream_id == 0:
            self._send_window += increment
            if self._send_window > _MAX_WINDOW:
                raise ProtocolBreach(ErrorCode.FLOW_CONTROL_ERROR, "opened the connection's window past 2^31-1")
            self._send_waiting()
        elif stream_id in self._open:
            self._open[stream_id] += increment
            if self._open[stream_id] > _MAX_WINDOW:
                raise ProtocolBreach(ErrorCode.FLOW_CONTROL_ERROR, "opened a stream's window past 2^31-1")
            if stream_id in self._sending:
                self._send(stream_id)

    def _settings(self, flags: int, stream_id: int, payload: bytes) -> None:
        if stream_id != 0 or len(payload) % 6 or (flags & _ACK and payload):
            raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent a malformed SETTINGS")
        if flags & _ACK:
            return
        for at in range(0, len(payload), 6):
            key, value = int.from_bytes(payload[at:at + 2], "big"), int.from_bytes(payload[at + 2:at + 6], "big")
            if key == _INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise ProtocolBreach(ErrorCode.FLOW_CONTROL_ERROR, "set a window past 2^31-1")
                delta, self._initial_window = value - self._initial_window, value
                for open_stream in self._open:
                    self._open[open_stream] += delta
            elif key == _MAX_FRAME_SIZE:
                if not _DEFAULT_FRAME <= value < 1 << 24:
                    raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, f"set a frame size of {value}")
                self._max_frame = value
            elif key == _ENABLE_PUSH and value > 1:
                raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, f"set ENABLE_PUSH to {value}")
        self._out.append(_frame(_SETTINGS, _ACK, 0))
        self._send_waiting()

    def _reset(self, stream_id: int) -> None:
        self._drop(stream_id)
        self._open.pop(stream_id, None)
        self._half_open.discard(stream_id)
        self._sending.pop(stream_id, None)
        self._resets += 1
        if self._resets > MAX_RESETS:
            raise ProtocolBreach(ErrorCode.ENHANCE_YOUR_CALM, f"reset more than {MAX_RESETS} streams", "http2_resets")
        self._settled()

    def _drop(self, stream_id: int) -> _Stream | None:
        """A stream no longer read: its deadline is off and its bytes are given back."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            if stream.deadline is not None:
                stream.deadline.cancel()
            self._unacknowledged += stream.received
        return stream

    def _expired(self, stream_id: int) -> None:
        if self._drop(stream_id) is None or self._transport.is_closing():
            return
        self._refused("timeout")
        log.warning("refused a stream from %s: its request was not whole within %g s", self._peer,
                    self._limits.request_seconds)
        self._text(stream_id, 408, b"the request was not whole within %g s" % self._limits.request_seconds)
        self._give_back()

    def _answered_later(self, stream_id: int, verb: str, done: asyncio.Future[Answered]) -> None:
        self._working -= 1
        if done.cancelled() or done.exception() is not None:  # the verbs never raise: only when the server stops
            if not done.cancelled():
                log.error("%s gave no answer: %r", verb, done.exception())
            self._transport.close()
            return
        self._answered(stream_id, done.result())
        self._flush()

    def _answered(self, stream_id: int, answered: Answered) -> None:
        status, content, elapsed = answered
        self._answer(stream_id, status, content, server_timing(elapsed))

    def _answer(self, stream_id: int, status: int, content: bytes, *more: tuple[bytes, bytes]) -> None:
        self._write(stream_id, _head(status, _JSON, len(content), *more), content)

    def _text(self, stream_id: int, status: int, text: bytes) -> None:
        self._write(stream_id, _head(status, _TEXT, len(text)), text)

    def _write(self, stream_id: int, head: bytes, content: bytes) -> None:
        if stream_id not in self._open or self._transport.is_closing():
            self._settled()  # the client reset it, or went away: nothing to write
            return
        self._out.append(_frame(_HEADERS, _END_HEADERS | (0 if content else _END_STREAM), stream_id, head))
        if content:
            self._sending[stream_id] = memoryview(content)
            self._send(stream_id)
        else:
            self._answered_whole(stream_id)

    def _send_waiting(self) -> None:
        """The answers held back by the client's windows, once they opened."""
        for waiting in tuple(self._sending):
            self._send(waiting)

    def _send(self, stream_id: int) -> None:
        """As much of an answer as the client's windows take; the rest waits for its WINDOW_UPDATE."""
        content = self._sending.pop(stream_id)
        while content:
            size = min(len(content), self._send_window, self._open[stream_id], self._max_frame)
            if size <= 0:
                self._sending[stream_id] = content
                return
            self._send_window -= size
            self._open[stream_id] -= size
            last = size == len(content)
            self._out.append(_frame(_DATA, _END_STREAM if last else 0, stream_id, content[:size]))
            content = content[size:]
        self._answered_whole(stream_id)

    def _answered_whole(self, stream_id: int) -> None:
        del self._open[stream_id]
        if stream_id in self._half_open:  # answered before its request was whole (RFC 9113 8.1)
            self._half_open.discard(stream_id)
            self._out.append(_frame(_RST_STREAM, 0, stream_id, ErrorCode.NO_ERROR.to_bytes(4, "big")))
        self._settled()

    def _close(self, reason: str, what: str, code: ErrorCode) -> None:
        self._refused(reason)
        log.warning("closed the HTTP/2 connection from %s: it %s", self._peer, what)
        self._goaway(code)

    def _goaway(self, code: ErrorCode) -> None:
        if self._transport.is_closing():
            return
        self._out.append(_frame(_GOAWAY, 0, 0, self._last.to_bytes(4, "big") + code.to_bytes(4, "big")))
        self._flush()
        self._transport.close()

    def _settled(self) -> None:
        """After a stream is answered or gone: the connection closes if it was closing and nothing is left at work,
        and waits for the next stream idle."""
        if self._open or self._working:
            return
        if self._closing:
            self._goaway(ErrorCode.NO_ERROR)
            return
        self._idle_since = self._loop.time()
        if self._idle is None:
            self._idle = self._loop.call_later(self._limits.idle_seconds, self._idle_out)

    def _flush(self) -> None:
        if self._out and not self._transport.is_closing():
            self._transport.write(b"".join(self._out))
        self._out.clear()

    def _idle_out(self) -> None:
        """The idle timer is not moved at each stream (a call_later and a cancel a request): when it fires, it
        closes a connection idle since long enough, or waits for the rest of the time."""
        self._idle = None
        if self._idle_since is None or self._open or self._working:
            return  # at work: the stream that ends it arms the timer again
        remaining = self._idle_since + self._limits.idle_seconds - self._loop.time()
        if remaining > 0:
            self._idle = self._loop.call_later(remaining, self._idle_out)
        else:
            self._goaway(ErrorCode.NO_ERROR)


def _unpadded(payload: bytes, flags: int) -> bytes:
    """A DATA or HEADERS payload without its padding (RFC 9113 6.1)."""
    if not flags & _PADDED:
        return payload
    if not payload or payload[0] >= len(payload):
        raise ProtocolBreach(ErrorCode.PROTOCOL_ERROR, "sent padding longer than its frame")
    return payload[1:len(payload) - payload[0]]
