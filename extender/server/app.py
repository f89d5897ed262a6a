"""The HTTP edge: routes that read a bounded body, call one service method and serialize.

Extender verbs never answer 500: kube-scheduler reads no message from a non-200, so anything that goes
wrong is an `Error` in a 200 answer; only a body that is not JSON at all gets a 400, and one larger than
MAX_BODY_BYTES a 413, refused while it arrives. Filter, prioritize and preempt run one at a time: on the event
loop when all they need is remembered or quick to work out, else in one worker thread, so the event loop stays
free for /healthz, /metrics and binds while a verb works (create_app says why).

Each verb is a `Verb`. The extender's server answers them in its own protocol, before ASGI (extender/server/serve.py
says why); through ASGI, as any other server and the tests' clients reach them, they are bare routes in front of
FastAPI, which serves the probes and /metrics: FastAPI's middleware, routing and request objects would add their
cost to every scheduling cycle (25 us a request over TLS, measured with uvicorn on this project's machines).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from extender.api.admission import parse_review, review_answer
from extender.api.wire import (
    MAX_BODY_BYTES,
    BadRequest,
    ExtenderArgs,
    LastPod,
    NameLists,
    NotJson,
    binding_result,
    filter_error,
    filter_result,
    parse_binding_args,
    parse_extender_args,
    parse_preemption_args,
    preemption_result,
    prioritize_result,
)
from extender.pinning.admission import admit
from extender.verbs.answer_memo import Unknown
from extender.verbs.service import ExtenderService

log = logging.getLogger(__name__)
JSON = b"application/json"
ADMISSION_PATH = "/admission/pods"
BIND_THREADS = 16  # binds on threads at once, each waiting on the API server; kube-scheduler binds in parallel

Answer = Callable[[bytes, bool], bytes]  # (body, compute): see create_app
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class BodyTooLarge(ValueError):
    """The body is over the limit: said by its Content-Length, or found while reading it."""


class ClientGone(Exception):
    """The client closed the connection (or its deadline closed it) before its body arrived."""


class ExtenderApp:
    """The ASGI app: POSTs to the verbs' paths go to their `Verb`, everything else to `web`. The extender's own
    server (extender/server/serve.py) hands verb requests to `verbs` before ASGI; any other ASGI server, and the
    tests' clients, come through here."""

    def __init__(self, web: FastAPI, verbs: dict[str, Verb]) -> None:
        self.web = web
        self.verbs = verbs

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            verb = self.verbs.get(scope["path"])
            if verb is not None:
                await verb.asgi(scope, receive, send)
                return
        await self.web(scope, receive, send)


def create_app(service: ExtenderService, max_body_bytes: int = MAX_BODY_BYTES) -> ExtenderApp:
    # FastAPI (0.165, the floor in pyproject.toml) wraps every request in its native OpenTelemetry middleware,
    # which asks the global providers on each request whether anyone listens (0.08 ms a request in
    # `make loadtest`'s profile). The extender's telemetry is Prometheus (/metrics), so it is off.
    app = FastAPI(title="gpu-topology-extender", docs_url=None, redoc_url=None, openapi_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})

    last: list[tuple[bytes, ExtenderArgs]] = []
    recent = NameLists(service.state.own_names)
    last_pod = LastPod()
    # Filter, prioritize and preempt run one at a time (`one_at_a_time`), so the remembered body and the memos
    # need no lock of their own. Filter and prioritize are answered on the event loop when all they need is
    # remembered, or is a few new answers on boards of at most 8 GPUs (memo.ON_LOOP; memo.Unknown otherwise):
    # the usual case, where a hop to a thread and back would cost 50 to 90 us of CPU and the loop's attempt
    # would be done again there. Under make loadtest's churn (two nodes change each cycle), 37% of filters and
    # 31% of prioritizes needed a new answer, and handing them over put filter's HTTP p99 at 1.9x to 2.1x the
    # floor's, against 1.25x to 1.4x when worked out here. The rest runs on one thread of its own, so that a
    # verb at work (a verdict on a big board may take a selection's whole budget, a group's plan far more)
    # leaves the event loop free for /healthz, /metrics and binds; the loop never waits for the lock, it
    # hands the verb to that thread.
    one_at_a_time = threading.Lock()
    verbs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verbs")

    def parsed(body: bytes) -> ExtenderArgs:
        """kube-scheduler sends prioritize the filter's body unchanged when every node passed: parse it once."""
        if last and last[0][0] == body:
            return last[0][1]
        args = parse_extender_args(body, recent, last_pod)
        last[:] = [(body, args)]
        return args

    def do_filter(body: bytes, compute: bool) -> bytes:
        args = parsed(body)
        outcome = service.filter(args, compute)
        return filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable)

    def do_prioritize(body: bytes, compute: bool) -> bytes:
        return prioritize_result(*service.prioritize(parsed(body), compute))

    def do_bind(body: bytes, compute: bool) -> bytes:
        return binding_result(service.bind(parse_binding_args(body)))

    def do_preempt(body: bytes, compute: bool) -> bytes:
        return preemption_result(service.preempt(parse_preemption_args(body)))

    def do_admit(body: bytes, compute: bool) -> bytes:
        review = parse_review(body)
        patch = admit(service.state, review) if service.pin_claims else []
        service.metrics.decision("admission", "named" if patch else "as-written").inc()
        return review_answer(review.uid, patch)

    filter_answer = _guarded(service, "filter", do_filter, filter_error)
    # prioritize and preempt answers have no Error field: a refused request is said in the log and the metric.
    prioritize_answer = _guarded(service, "prioritize", do_prioritize, lambda _: b"[]")
    bind_answer = _guarded(service, "bind", do_bind, binding_result)
    # A preempt that fails keeps no victims: better no eviction than a useless one.
    preempt_answer = _guarded(service, "preempt", do_preempt, lambda _: preemption_result({}))

    binds = ThreadPoolExecutor(max_workers=BIND_THREADS, thread_name_prefix="bind")
    verb_map = {f"/{verb}": Verb(service, verb, answer, max_body_bytes, verbs, one_at_a_time, quick)
                for verb, answer, quick in (("filter", filter_answer, True), ("prioritize", prioritize_answer, True),
                                            ("preempt", preempt_answer, False))}
    # bind waits on the API server. Its Binding goes out from the event loop, which never waits for the answer
    # (_bind_soon); a bind that would wait there runs on threads of its own. Neither holds up filters.
    verb_map["/bind"] = Verb(service, "bind", bind_answer, max_body_bytes, binds, None, False,
                             _bind_soon(service, binds))
    # The admission webhook (scheduler-config/dra-pin-webhook.yaml): a failed review is answered in no
    # AdmissionReview, which kube-apiserver takes as the webhook failing; its failurePolicy Ignore admits the pod
    # as it was written.
    verb_map[ADMISSION_PATH] = Verb(service, "admission", _guarded(service, "admission", do_admit, lambda _: b"{}"),
                                    max_body_bytes, binds, None, False)

    for path, probe in probes(service).items():
        app.add_api_route(path, probe, methods=["GET"])
    return ExtenderApp(app, verb_map)


Probe = Callable[[], Awaitable[Response]]


def probes(service: ExtenderService) -> dict[str, Probe]:
    """GET /healthz, /readyz and /metrics: on the main port, and alone on the metrics port (ProbesOnly)."""
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def readyz() -> PlainTextResponse:
        why = service.readiness()
        return PlainTextResponse("ok") if why is None else PlainTextResponse(why, status_code=503)

    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return {"/healthz": healthz, "/readyz": readyz, "/metrics": metrics}


class ProbesOnly:
    """The metrics port's ASGI app (--metrics-port): GET of a probe, and 404 for anything else, so a client there,
    which no certificate names, reaches no verb."""

    def __init__(self, service: ExtenderService) -> None:
        self._probes = probes(service)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        probe = self._probes.get(scope["path"]) if scope["method"] == "GET" else None
        response = PlainTextResponse("not found", status_code=404) if probe is None else await probe()
        await response(scope, receive, send)


Answered = tuple[int, bytes, float]  # status, content, seconds in the verb
Respond = Callable[[bytes, bool], Answered]
Soon = Callable[[bytes], "asyncio.Future[Answered] | None"]  # a verb's answer begun on the event loop, or None


def _guarded(service: ExtenderService, verb: str, answer: Answer, on_error: Callable[[str], bytes]) -> Respond:
    """Time the verb and turn every failure into a status and an extender answer; memo.Unknown, raised only
    without `compute`, goes to the caller."""
    latency = service.metrics.request_seconds.labels(verb)

    def respond(body: bytes, compute: bool) -> Answered:
        started = time.perf_counter()
        try:
            status, content = 200, answer(body, compute)
        except Unknown:
            raise
        except Exception as error:
            status, content = _failed(service, verb, error, on_error)
        elapsed = time.perf_counter() - started
        latency.observe(elapsed)
        return status, content, elapsed
    return respond


def _failed(service: ExtenderService, verb: str, error: Exception,
            on_error: Callable[[str], bytes]) -> tuple[int, bytes]:
    """A verb's failure as its status and answer, logged and counted."""
    refused = service.metrics.requests_refused
    if isinstance(error, NotJson):
        refused.labels(verb, "not_json").inc()
        log.warning("%s refused: %s", verb, error)
        return 400, binding_result(str(error))
    if isinstance(error, BadRequest):
        refused.labels(verb, "bad_shape").inc()
        log.warning("%s refused: %s", verb, error)
        return 200, on_error(str(error))
    log.error("%s failed", verb, exc_info=error)
    return 200, on_error(f"internal error in the GPU topology extender's {verb}; see its log")


def _bind_soon(service: ExtenderService, threads: ThreadPoolExecutor) -> Soon:
    """bind with its Binding posted from the event loop (ExtenderService.bind_soon). A bind thread for each costs
    a hop there and back and the GIL passed between threads: under kube-scheduler (scheduler_throughput, three
    alternating pairs of extender rounds) the extender used 2.16, 1.88 and 2.69 ms of CPU a pod with binds on
    threads, against 1.92, 1.72 and 2.29 with them here. None leaves the request to a bind thread whole: a body
    that does not parse (refused there as always), or a bind that would wait."""
    latency = service.metrics.request_seconds.labels("bind")

    def answered(started: float, answer: asyncio.Future[Answered], outcome: asyncio.Future[str]) -> None:
        if outcome.cancelled():
            answer.cancel()
            return
        error = outcome.exception()
        if isinstance(error, Exception):
            status, content = _failed(service, "bind", error, binding_result)
        elif error is not None:
            answer.set_exception(error)
            return
        else:
            status, content = 200, binding_result(outcome.result())
        elapsed = time.perf_counter() - started
        latency.observe(elapsed)
        answer.set_result((status, content, elapsed))

    def soon(body: bytes) -> asyncio.Future[Answered] | None:
        started = time.perf_counter()
        try:
            args = parse_binding_args(body)
        except ValueError:
            return None
        try:
            outcome = service.bind_soon(args, threads)
        except Exception as error:  # answered as on a thread: logged, counted, an Error for kube-scheduler
            outcome = asyncio.get_running_loop().create_future()
            outcome.set_exception(error)
        if outcome is None:
            return None
        answer: asyncio.Future[Answered] = outcome.get_loop().create_future()
        outcome.add_done_callback(partial(answered, started, answer))
        return answer
    return soon


class Verb:
    """A verb's dispatch: `now` on the event loop from what is remembered, when `lock` is free at once (see
    create_app), else `later` on `worker`, holding `lock` if any. Both the ASGI route and the server's own
    protocol (extender/server/serve.py) answer through it, so they give the same answers."""

    def __init__(self, service: ExtenderService, name: str, respond: Respond, max_body_bytes: int,
                 worker: ThreadPoolExecutor, lock: threading.Lock | None, quick: bool,
                 soon: Soon | None = None) -> None:
        self.name = name
        self.max_body_bytes = max_body_bytes
        self._respond = respond
        self._worker = worker
        self._lock = lock
        self._quick = quick
        self._soon = soon
        self._too_large = service.metrics.requests_refused.labels(name, "too_large")

    def now(self, body: bytes) -> Answered | None:
        """The answer, if it can be given on the event loop without waiting; None hands the body to `later`."""
        lock = self._lock
        if not self._quick or lock is None or not lock.acquire(blocking=False):
            return None
        try:
            return self._respond(body, False)
        except Unknown:
            return None
        finally:
            lock.release()

    def later(self, body: bytes) -> asyncio.Future[Answered]:
        """By `soon` where it answers, else on `worker`."""
        answer = self._soon(body) if self._soon is not None else None
        if answer is not None:
            return answer
        return asyncio.get_running_loop().run_in_executor(self._worker, self._on_worker, body)

    def refuse_too_large(self, why: str) -> bytes:
        """Count and log a body over the limit; the content of the 413 that answers it."""
        self._too_large.inc()
        log.warning("%s refused: %s", self.name, why)
        return binding_result(why)

    def _on_worker(self, body: bytes) -> Answered:
        if self._lock is None:
            return self._respond(body, True)
        with self._lock:
            return self._respond(body, True)

    async def asgi(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await read_body(scope, receive, self.max_body_bytes)
        except BodyTooLarge as error:
            # The rest of the body is never read: the connection closes after the answer.
            await _answer(send, 413, self.refuse_too_large(str(error)), (b"connection", b"close"))
            return
        except ClientGone:
            return  # nobody reads an answer
        answered = self.now(body)
        status, content, elapsed = answered if answered is not None else await self.later(body)
        await _answer(send, status, content, server_timing(elapsed))


def server_timing(elapsed: float) -> tuple[bytes, bytes]:
    """Server-Timing (W3C): the time spent in the verb, without HTTP and parsing by the server."""
    return b"server-timing", b"verb;dur=%.3f" % (elapsed * 1000)


def answer_headers(content: bytes, *extra: tuple[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """The headers of a verb's answer, through ASGI or written by the server's protocol."""
    return [(b"content-type", JSON), (b"content-length", b"%d" % len(content)), *extra]


async def _answer(send: Send, status: int, content: bytes, header: tuple[bytes, bytes]) -> None:
    await send({"type": "http.response.start", "status": status, "headers": answer_headers(content, header)})
    await send({"type": "http.response.body", "body": content})


def declared_over_limit(headers: Iterable[tuple[bytes, bytes]], limit: int) -> str | None:
    """Why a body is refused by its Content-Length alone (lower-case header names), or None."""
    declared = next((value for name, value in headers if name == b"content-length"), b"")
    if declared.isdigit() and int(declared) > limit:
        return f"request body of {int(declared)} bytes is over the extender's limit of {limit} bytes"
    return None


def over_limit(limit: int) -> str:
    """Why a body that has passed `limit` bytes while arriving is refused."""
    return f"request body is over the extender's limit of {limit} bytes"


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The body, refused as soon as it is known to pass `limit` bytes: never more than that is held."""
    declared = declared_over_limit(scope.get("headers") or (), limit)
    if declared is not None:
        raise BodyTooLarge(declared)
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(over_limit(limit))
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)
