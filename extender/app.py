"""The HTTP edge: FastAPI routes that parse, call one service method and serialize (DESIGN §7).

Extender verbs never answer 500: kube-scheduler reads no message from a non-200, so anything that goes
wrong is an `Error` in a 200 answer, and only a body that is not JSON at all gets a 400.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from extender.service import ExtenderService
from extender.wire import (BadRequest, ExtenderArgs, NotJson, binding_result, filter_error, filter_result, parse_binding_args,
                           parse_extender_args, parse_preemption_args, preemption_result, PrioritizeEncoder)

log = logging.getLogger(__name__)
JSON = "application/json"

Answer = Callable[[bytes], bytes]


def create_app(service: ExtenderService) -> FastAPI:
    app = FastAPI(title="gpu-topology-extender", docs_url=None, redoc_url=None, openapi_url=None)

    last: list[tuple[bytes, ExtenderArgs]] = []
    prioritize_encoder = PrioritizeEncoder()

    def parsed(body: bytes) -> ExtenderArgs:
        """kube-scheduler sends prioritize the filter's body unchanged when every node passed: parse it once.

        Only the event-loop thread runs filter and prioritize, so one remembered body needs no lock.
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
    prioritize_answer = _guarded(service, "prioritize", do_prioritize, lambda _: b"[]")
    bind_answer = _guarded(service, "bind", do_bind, binding_result)
    # A preempt that fails keeps no victims: better no eviction than a useless one.
    preempt_answer = _guarded(service, "preempt", do_preempt, lambda _: preemption_result({}))

    # The verbs read the raw body and write bytes themselves, so they are plain Starlette routes: FastAPI's
    # dependency and validation layer would cost a share of every scheduling cycle for nothing.
    app.add_route("/filter", _route(filter_answer, in_thread=False), methods=["POST"])
    app.add_route("/prioritize", _route(prioritize_answer, in_thread=False), methods=["POST"])
    app.add_route("/preempt", _route(preempt_answer, in_thread=False), methods=["POST"])
    # bind waits on the API server, so it runs off the event loop and filters keep flowing meanwhile.
    app.add_route("/bind", _route(bind_answer, in_thread=True), methods=["POST"])

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

    def respond(body: bytes) -> tuple[int, bytes, float]:
        started = time.perf_counter()
        try:
            status, content = 200, answer(body)
        except NotJson as error:
            status, content = 400, binding_result(str(error))
        except BadRequest as error:
            status, content = 200, on_error(str(error))
        except Exception:
            log.exception("%s failed", verb)
            status, content = 200, on_error(f"internal error in the GPU topology extender's {verb}; see its log")
        elapsed = time.perf_counter() - started
        latency.observe(elapsed)
        return status, content, elapsed
    return respond


def _route(respond: Respond, *, in_thread: bool) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        body = await request.body()
        status, content, elapsed = await run_in_threadpool(respond, body) if in_thread else respond(body)
        # Server-Timing (W3C) carries the time spent in the verb, without HTTP and parsing by the server.
        return Response(content, status_code=status, media_type=JSON,
                        headers={"Server-Timing": f"verb;dur={elapsed * 1000:.3f}"})
    return handle
