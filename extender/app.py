"""The HTTP edge: routes that read a bounded body, call one service method in the verbs' thread and serialize.

Extender verbs never answer 500: kube-scheduler reads no message from a non-200, so anything that goes
wrong is an `Error` in a 200 answer; only a body that is not JSON at all gets a 400, and one larger than
MAX_BODY_BYTES a 413, refused while it arrives. Filter, prioritize and preempt run in one worker thread, so the
event loop stays free for /healthz, /metrics and binds while a verb works.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from extender.service import ExtenderService
from extender.wire import (MAX_BODY_BYTES, BadRequest, ExtenderArgs, NotJson, binding_result, filter_error,
                           filter_result, parse_binding_args, parse_extender_args, parse_preemption_args,
                           preemption_result, PrioritizeEncoder)

log = logging.getLogger(__name__)
JSON = "application/json"

Answer = Callable[[bytes], bytes]


class BodyTooLarge(ValueError):
    """The body is over the limit: said by its Content-Length, or found while reading it."""


def create_app(service: ExtenderService, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    # FastAPI (0.165, the floor in pyproject.toml) wraps every request in its native OpenTelemetry middleware,
    # which asks the global providers on each request whether anyone listens (0.08 ms a request in
    # `make loadtest`'s profile). The extender's telemetry is Prometheus (/metrics), so it is off.
    app = FastAPI(title="gpu-topology-extender", docs_url=None, redoc_url=None, openapi_url=None,
                  telemetry={"tracing": False, "metrics": False, "logs": False})

    last: list[tuple[bytes, ExtenderArgs]] = []
    prioritize_encoder = PrioritizeEncoder()
    # One thread for filter, prioritize and preempt: the event loop stays free, and they keep running one at
    # a time as they did on the loop, so the remembered body and the encoder's pieces need no lock.
    verbs = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verbs")

    def parsed(body: bytes) -> ExtenderArgs:
        """kube-scheduler sends prioritize the filter's body unchanged when every node passed: parse it once.

        Only the verbs' thread runs filter and prioritize, so one remembered body needs no lock.
        """
        if last and last[0][0] == body:
            return last[0][1]
        args = parse_extender_args(body)
        last[:] = [(body, args)]
        return args

    def do_filter(body: bytes) -> bytes:
        args = parsed(body)
        outcome = service.filter(args)
        return filter_result(args, outcome.passed, outcome.failed, outcome.unresolvable)

    def do_prioritize(body: bytes) -> bytes:
        return prioritize_encoder.encode(*service.prioritize(parsed(body)))

    def do_bind(body: bytes) -> bytes:
        return binding_result(service.bind(parse_binding_args(body)))

    def do_preempt(body: bytes) -> bytes:
        return preemption_result(service.preempt(parse_preemption_args(body)))

    filter_answer = _guarded(service, "filter", do_filter, filter_error)
    # prioritize and preempt answers have no Error field: a refused request is said in the log and the metric.
    prioritize_answer = _guarded(service, "prioritize", do_prioritize, lambda _: b"[]")
    bind_answer = _guarded(service, "bind", do_bind, binding_result)
    # A preempt that fails keeps no victims: better no eviction than a useless one.
    preempt_answer = _guarded(service, "preempt", do_preempt, lambda _: preemption_result({}))

    # The verbs read the raw body and write bytes themselves, so they are plain Starlette routes: FastAPI's
    # dependency and validation layer would cost a share of every scheduling cycle for nothing.
    for verb, answer in (("filter", filter_answer), ("prioritize", prioritize_answer), ("preempt", preempt_answer)):
        app.add_route(f"/{verb}", _route(service, verb, answer, max_body_bytes, verbs), methods=["POST"])
    # bind waits on the API server, so it runs in the thread pool, several at a time, and never holds up filters.
    app.add_route("/bind", _route(service, "bind", bind_answer, max_body_bytes, None), methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/readyz")
    async def readyz() -> PlainTextResponse:
        why = service.readiness()
        return PlainTextResponse("ok") if why is None else PlainTextResponse(why, status_code=503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app


Respond = Callable[[bytes], tuple[int, bytes, float]]


def _guarded(service: ExtenderService, verb: str, answer: Answer, on_error: Callable[[str], bytes]) -> Respond:
    """Time the verb and turn every failure into a status and an extender answer."""
    latency = service.metrics.request_seconds.labels(verb)
    refused = service.metrics.requests_refused

    def respond(body: bytes) -> tuple[int, bytes, float]:
        started = time.perf_counter()
        try:
            status, content = 200, answer(body)
        except NotJson as error:
            refused.labels(verb, "not_json").inc()
            log.warning("%s refused: %s", verb, error)
            status, content = 400, binding_result(str(error))
        except BadRequest as error:
            refused.labels(verb, "bad_shape").inc()
            log.warning("%s refused: %s", verb, error)
            status, content = 200, on_error(str(error))
        except Exception:
            log.exception("%s failed", verb)
            status, content = 200, on_error(f"internal error in the GPU topology extender's {verb}; see its log")
        elapsed = time.perf_counter() - started
        latency.observe(elapsed)
        return status, content, elapsed
    return respond


def _route(service: ExtenderService, verb: str, respond: Respond, max_body_bytes: int,
           worker: ThreadPoolExecutor | None) -> Callable[[Request], Awaitable[Response]]:
    """A verb's route: the body read up to the limit, then the verb in `worker` (None: the thread pool)."""
    refused = service.metrics.requests_refused

    async def handle(request: Request) -> Response:
        try:
            body = await read_body(request, max_body_bytes)
        except BodyTooLarge as error:
            refused.labels(verb, "too_large").inc()
            log.warning("%s refused: %s", verb, error)
            # The rest of the body is never read: the connection closes after the answer.
            return Response(binding_result(str(error)), status_code=413, media_type=JSON,
                            headers={"Connection": "close"})
        except ClientDisconnect:
            return Response(status_code=400)  # the client left (or its deadline closed it): nobody reads this
        if worker is None:
            status, content, elapsed = await run_in_threadpool(respond, body)
        else:
            status, content, elapsed = await asyncio.get_running_loop().run_in_executor(worker, respond, body)
        # Server-Timing (W3C) carries the time spent in the verb, without HTTP and parsing by the server.
        return Response(content, status_code=status, media_type=JSON,
                        headers={"Server-Timing": f"verb;dur={elapsed * 1000:.3f}"})
    return handle


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused as soon as it is known to pass `limit` bytes: never more than that is held."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body of {int(declared)} bytes is over the extender's limit of {limit} bytes")
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the extender's limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
