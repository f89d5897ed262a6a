"""HTTP/2 for kube-scheduler's verbs: all its calls as streams of one connection.

kube-scheduler's extender client offers h2 by ALPN (client-go's transport defaults). Over HTTP/1.1 it keeps two
idle connections and opens another, with a full TLS handshake, whenever a call overlaps them (a bind and the next
pod's filter): at 5,000 nodes 0.35 to 0.4 handshakes a pod, each 1.3 to 1.5 ms of CPU here and 0.3 to 0.4 ms a
pod in kube-scheduler (BENCHMARKS.md). Over h2 a call is a stream and no call opens a connection.

The h2 library keeps the protocol's state; `Http2Verbs` keeps what the HTTP/1.1 protocol keeps (serve.py) for
input from outside:
- a stream's request must be whole within the request deadline, a connection without a stream open closes after
  the idle time;
- a head is bounded by MAX_HEADER_LIST_SIZE (the same bound as HTTP/1.1's), a frame by MAX_FRAME_BYTES;
- a body is refused with 413 as it passes the verb's limit. The bytes of bodies not yet whole are bounded by the
  connection's receive window, as a body is acknowledged only once it is whole or refused;
- streams open at once are bounded (MAX_STREAMS), so are streams the client resets (MAX_RESETS, the rapid reset
  of CVE-2023-44487);
- no request is read while the client does not read its answers.
Only the verbs are served here (POST to a verb's path, answered by the same `Verb` as over HTTP/1.1); the probes and
/metrics answer over HTTP/1.1, which every other client of this port speaks.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes

from extender.server.app import Answered, Verb, answer_headers, declared_over_limit, over_limit, server_timing

log = logging.getLogger(__name__)

ALPN = ("h2", "http/1.1")
"""What the main port offers, in its order of preference."""

MAX_STREAMS = 32
"""Streams open at once on one connection: kube-scheduler has one filter or prioritize and its binds in flight.
A client that keeps to the setting never meets it; Go's opens another connection past it."""

MAX_FRAME_BYTES = 256 << 10
"""The largest frame accepted: a 5,000-name body arrives in one frame, and a frame is held whole before it is read."""

MAX_RESETS = 256
"""Streams the client may reset on one connection before it is closed: kube-scheduler resets one only when its
httpTimeout passes."""

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
"""What a client sends before its first frame (RFC 9113 3.4)."""

FORBIDDEN = b"client certificate name not allowed by --client-name"


@dataclass(frozen=True, slots=True)
class Http2Limits:
    request_seconds: float  # from a stream's head to its body's end
    idle_seconds: float  # a connection with no stream open
    max_head_bytes: int  # a head's decoded size, as HTTP/2 counts it (RFC 9113 6.5.2)
    max_body_bytes: int  # the largest body any verb takes: the receive windows


class _Stream:
    """A verb request being read."""

    __slots__ = ("chunks", "deadline", "received", "size", "verb")

    def __init__(self, verb: Verb, deadline: asyncio.TimerHandle) -> None:
        self.verb = verb
        self.deadline = deadline
        self.chunks: list[bytes] = []
        self.size = 0
        self.received = 0  # flow-controlled bytes, padding included: what is acknowledged once the body is taken


class _FrameLengths:
    """Each frame's length read from its header as the bytes pass: h2 refuses an overlong frame only once it holds
    all of it, up to 16 MiB."""

    __slots__ = ("_head", "_skip")

    def __init__(self) -> None:
        self._skip = len(PREFACE)
        self._head = b""

    def overlong(self, data: bytes) -> int | None:
        """The length of a frame over MAX_FRAME_BYTES whose header is in `data`, or None."""
        position, size = 0, len(data)
        while True:
            if self._skip:
                step = min(self._skip, size - position)
                self._skip -= step
                position += step
                if self._skip:
                    return None
            need = 9 - len(self._head)
            self._head += data[position:position + need]
            position += need
            if len(self._head) < 9:
                return None
            length = int.from_bytes(self._head[:3], "big")
            self._head = b""
            if length > MAX_FRAME_BYTES:
                return length
            self._skip = length


class Http2Verbs:
    """One h2 connection: its streams read, bounded and answered through the verbs."""

    def __init__(self, transport: asyncio.Transport, verbs: Mapping[bytes, Verb], limits: Http2Limits,
                 default_headers: Callable[[], Iterable[tuple[bytes, bytes]]], refused: Callable[[str], None],
                 peer: str, forbidden: bool = False) -> None:
        self._transport = transport
        self._verbs = verbs
        self._limits = limits
        self._default_headers = default_headers
        self._refused = refused
        self._peer = peer
        self._forbidden = forbidden
        self._loop = asyncio.get_running_loop()
        self._streams: dict[int, _Stream] = {}
        self._sending: dict[int, memoryview] = {}  # answers waiting for the client's flow-control window
        self._working = 0  # streams whose verb is at work
        self._resets = 0
        self._closing = False
        self._idle: asyncio.TimerHandle | None = None
        self._frames = _FrameLengths()
        self._conn = h2.connection.H2Connection(h2.config.H2Configuration(
            client_side=False, header_encoding=None, validate_outbound_headers=False,
            normalize_outbound_headers=False))
        self._conn.local_settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: limits.max_body_bytes + 1,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: MAX_FRAME_BYTES,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: limits.max_head_bytes,
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
        })
        self._conn.initiate_connection()
        # In force before the client acknowledges them: it may send a frame of the new size before its ACK.
        self._conn.max_inbound_frame_size = MAX_FRAME_BYTES
        # The connection's window holds one whole body beside a frame: what bodies not yet whole may hold here.
        self._conn.increment_flow_control_window(limits.max_body_bytes + MAX_FRAME_BYTES - 65535)
        self._flush()
        self._settled()

    def received(self, data: bytes) -> None:
        overlong = self._frames.overlong(data)
        if overlong is not None:
            self._close("http2_protocol", f"sent a frame of {overlong} bytes, over {MAX_FRAME_BYTES}",
                        ErrorCodes.FRAME_SIZE_ERROR)
            return
        try:
            events = self._conn.receive_data(data)
        except h2.exceptions.ProtocolError as error:
            self._close("http2_protocol", f"broke the HTTP/2 protocol: {error}")
            return
        for event in events:
            if isinstance(event, h2.events.RequestReceived):
                self._request(event)
            elif isinstance(event, h2.events.DataReceived):
                self._data(event)
            elif isinstance(event, h2.events.StreamEnded):
                self._ended(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self._reset(event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated):
                self._send_waiting(event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):
                self._closing = True
                self._transport.close()
                return
            if self._transport.is_closing():
                return
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
            stream.deadline.cancel()
        self._streams.clear()
        self._sending.clear()
        if self._idle is not None:
            self._idle.cancel()

    def _request(self, event: h2.events.RequestReceived) -> None:
        stream_id = event.stream_id
        self._disarm_idle()
        headers = event.headers or ()
        method = path = b""
        for name, value in headers:
            if name == b":method":
                method = value
            elif name == b":path":
                path = value
        verb = self._verbs.get(path)
        if self._closing:  # a client retries a refused stream on another connection (RFC 9113 8.7)
            self._conn.reset_stream(stream_id, ErrorCodes.REFUSED_STREAM)
        elif self._forbidden:  # counted and logged once, as the connection was made (serve.py)
            self._closing = True
            self._text(stream_id, 403, FORBIDDEN)
        elif verb is None:
            self._text(stream_id, 404, b"over HTTP/2 this port serves kube-scheduler's verbs only; "
                                       b"the probes and /metrics answer over HTTP/1.1")
        elif method != b"POST":
            self._text(stream_id, 405, b"a verb is a POST")
        elif (declared := declared_over_limit(headers, verb.max_body_bytes)) is not None:
            self._write(stream_id, 413, answer_headers(content := verb.refuse_too_large(declared)), content)
        else:
            deadline = self._loop.call_later(self._limits.request_seconds, self._expired, stream_id)
            self._streams[stream_id] = _Stream(verb, deadline)

    def _data(self, event: h2.events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None:  # refused or answered already: the bytes are let go at once
            self._acknowledge(event.flow_controlled_length, event.stream_id)
            return
        stream.received += event.flow_controlled_length
        stream.size += len(event.data)
        stream.chunks.append(event.data)
        if stream.size > stream.verb.max_body_bytes:
            self._drop(event.stream_id)
            content = stream.verb.refuse_too_large(over_limit(stream.verb.max_body_bytes))
            self._write(event.stream_id, 413, answer_headers(content), content)

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

    def _reset(self, stream_id: int) -> None:
        self._drop(stream_id)
        self._sending.pop(stream_id, None)
        self._resets += 1
        if self._resets > MAX_RESETS:
            self._close("http2_resets", f"reset more than {MAX_RESETS} streams", ErrorCodes.ENHANCE_YOUR_CALM)
        else:
            self._settled()

    def _drop(self, stream_id: int) -> _Stream | None:
        """A stream no longer read: its deadline is off and its bytes are acknowledged."""
        stream = self._streams.pop(stream_id, None)
        if stream is not None:
            stream.deadline.cancel()
            self._acknowledge(stream.received, stream_id)
        return stream

    def _expired(self, stream_id: int) -> None:
        if self._drop(stream_id) is None or self._transport.is_closing():
            return
        self._refused("timeout")
        log.warning("refused a stream from %s: its request was not whole within %g s", self._peer,
                    self._limits.request_seconds)
        self._text(stream_id, 408, b"the request was not whole within %g s" % self._limits.request_seconds)
        self._flush()

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
        self._write(stream_id, status, answer_headers(content, server_timing(elapsed)), content)

    def _text(self, stream_id: int, status: int, text: bytes) -> None:
        self._write(stream_id, status, [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(text))],
                    text)

    def _write(self, stream_id: int, status: int, headers: list[tuple[bytes, bytes]], content: bytes) -> None:
        """Head and body, as far as the client's windows take it; then, if its request is still being sent, the
        stream is reset (RFC 9113 8.1)."""
        stream = self._conn.streams.get(stream_id)
        if not self._transport.is_closing() and stream is not None and not stream.closed:
            self._conn.send_headers(stream_id, [(b":status", b"%d" % status), *self._default_headers(), *headers])
            self._sending[stream_id] = memoryview(content)
            self._send(stream_id)
        self._settled()

    def _send_waiting(self, stream_id: int) -> None:
        for waiting in (tuple(self._sending) if stream_id == 0 else (stream_id,)):
            if waiting in self._sending:
                self._send(waiting)
        self._settled()

    def _send(self, stream_id: int) -> None:
        content = self._sending.pop(stream_id)
        conn = self._conn
        while True:
            size = min(len(content), conn.local_flow_control_window(stream_id), conn.max_outbound_frame_size)
            if size == 0 and content:
                self._sending[stream_id] = content  # until the client's WINDOW_UPDATE
                return
            last = size == len(content)
            conn.send_data(stream_id, content[:size].tobytes(), end_stream=last)
            content = content[size:]
            if last:
                break
        stream = conn.streams.get(stream_id)
        if stream is not None and not stream.closed:
            conn.reset_stream(stream_id, ErrorCodes.NO_ERROR)  # answered before its request was whole

    def _acknowledge(self, size: int, stream_id: int) -> None:
        if size and not self._transport.is_closing():
            self._conn.acknowledge_received_data(size, stream_id)

    def _close(self, reason: str, what: str, code: ErrorCodes = ErrorCodes.PROTOCOL_ERROR) -> None:
        self._refused(reason)
        log.warning("closed the HTTP/2 connection from %s: it %s", self._peer, what)
        self._goaway(code)

    def _goaway(self, code: ErrorCodes) -> None:
        """GOAWAY, unless the connection is closed already (h2 has sent one for a protocol error), and close.
        After a GOAWAY h2 sends nothing on any stream: it goes once the streams at work are answered."""
        if self._transport.is_closing():
            return
        if self._conn.state_machine.state != h2.connection.ConnectionState.CLOSED:
            self._conn.close_connection(code)
        self._flush()
        self._transport.close()

    def _settled(self) -> None:
        """After a stream is answered or gone: the connection closes if it was closing and nothing is left at work,
        and waits for the next stream idle."""
        if self._streams or self._sending or self._working:
            return
        if self._closing:
            self._goaway(ErrorCodes.NO_ERROR)
        elif self._idle is None:
            self._idle = self._loop.call_later(self._limits.idle_seconds, self._idle_out)

    def _flush(self) -> None:
        data = self._conn.data_to_send()
        if data and not self._transport.is_closing():
            self._transport.write(data)

    def _disarm_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_out(self) -> None:
        self._idle = None
        if not (self._streams or self._sending or self._working):
            self._goaway(ErrorCodes.NO_ERROR)
