"""Policy (5): the real extender app served over HTTP and driven as kube-scheduler drives it, checked pod for pod
against policy (4), the same extender in-process.

Both runs replay the same jobs with the same seed. (5) is policy (4) whose filter, prioritize and bind travel as
JSON bodies through the app of `serve --demo` (uvicorn on a local port, extender.demo.mixed_pods.running_server) instead
of method calls: kube-scheduler's bodies with nodeCacheCapable (`NodeNames`, no NodeList), its answers read
back as kube-scheduler reads them (filter's reasons come only when no node passes; prioritize leaves out the hosts
at the request's least score, which add 0, and lowers the others by it: extender/api/wire.py). Any difference, a node,
a GPU or a time, is a mismatch: what the HTTP layer parses, remembers (the prioritize body memo) or serialises must
change no decision.
"""

from __future__ import annotations

import http.client
import socket
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from extender.api.wire import BindingArgs, ExtenderArgs
from extender.demo.mixed_pods import running_server
from extender.verbs.filter import FilterOutcome
from loadtests.replay.engine import Outcome, replay
from loadtests.replay.model import ClusterNode, Job
from loadtests.replay.policies import OURS, ExtenderPolicy

OVER_HTTP = "(5) ours over HTTP"
DEFAULT_SAMPLE = 200


class HttpError(RuntimeError):
    """The app answered something kube-scheduler would not accept: a status other than 200, or a filter Error."""


class ExtenderOverHttp:
    """ExtenderService's filter, prioritize and bind, with their own argument and answer types, asked of the real
    app over one kept-alive connection."""

    def __init__(self, port: int) -> None:
        self._connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        self._connection.connect()
        # http.client sends headers and body apart; without NODELAY each request waits on a delayed ACK.
        assert self._connection.sock is not None
        self._connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def filter(self, args: ExtenderArgs) -> FilterOutcome:
        answer = self._post("filter", {"Pod": args.pod, "Nodes": None, "NodeNames": args.candidates()})
        if answer["Error"]:
            raise HttpError(f"filter answered Error: {answer['Error']}")
        return FilterOutcome(list(answer["NodeNames"]), _by_reason(answer["FailedNodes"]),
                             _by_reason(answer["FailedAndUnresolvableNodes"]))

    def prioritize(self, args: ExtenderArgs) -> tuple[list[str], list[int]]:
        names = args.candidates()
        answer = self._post("prioritize", {"Pod": args.pod, "Nodes": None, "NodeNames": names})
        given = {entry["Host"]: entry["Score"] for entry in answer}
        return names, [given.get(name, 0) for name in names]

    def bind(self, args: BindingArgs) -> str:
        return str(self._post("bind", {"PodName": args.pod_name, "PodNamespace": args.pod_namespace,
                                       "PodUID": args.pod_uid, "Node": args.node})["Error"])

    def close(self) -> None:
        self._connection.close()

    def _post(self, verb: str, body: dict[str, Any]) -> Any:
        self._connection.request("POST", f"/{verb}", body=orjson.dumps(body),
                                 headers={"Content-Type": "application/json"})
        response = self._connection.getresponse()
        content = response.read()
        if response.status != 200:
            raise HttpError(f"{verb} answered HTTP {response.status}: {content[:200]!r}")
        return orjson.loads(content)


def _by_reason(failed: dict[str, str]) -> dict[str, list[str]]:
    grouped: dict[str, list[str]] = {}
    for name, reason in failed.items():
        grouped.setdefault(reason, []).append(name)
    return grouped


@contextmanager
def policy_over_http(nodes: Sequence[ClusterNode]) -> Iterator[ExtenderPolicy]:
    """Policy (5): a fresh policy (4) whose extender is served over HTTP and reached only through it."""
    policy = ExtenderPolicy(OVER_HTTP, nodes, delivery=True)
    with running_server(policy.service) as port:
        client = ExtenderOverHttp(port)
        policy.service = client  # type: ignore[assignment]  # the same three verbs, over the wire
        try:
            yield policy
        finally:
            client.close()


@dataclass(frozen=True, slots=True)
class Mismatch:
    job: Job
    in_process: Outcome
    over_http: Outcome


@dataclass(frozen=True, slots=True)
class HttpCheck:
    """The sample both policies replayed, what it exercised (pods placed, multi-GPU ones, pods that waited, drains
    the extender began for pods waiting for a full set), and every pod the two disagree on."""

    jobs: int
    placed: int
    multi_gpu_placed: int
    waited: int
    drained: int
    mismatches: tuple[Mismatch, ...]

    @property
    def matches(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        verdict = "the same decisions pod for pod" if self.matches else f"{len(self.mismatches)} pods differ"
        return (f"{OVER_HTTP} against {OURS} on {self.jobs} jobs ({self.placed} placed, "
                f"{self.multi_gpu_placed} of them multi-GPU, {self.waited} after waiting, "
                f"{self.drained} drain{'' if self.drained == 1 else 's'} begun): {verdict}")


def compare(in_process: Sequence[Outcome], over_http: Sequence[Outcome]) -> tuple[Mismatch, ...]:
    """Every pod whose placement time, node or GPUs differ between the two runs."""
    if [outcome.job for outcome in in_process] != [outcome.job for outcome in over_http]:
        raise ValueError("the two runs replayed different jobs")
    return tuple(Mismatch(ours.job, ours, theirs) for ours, theirs in zip(in_process, over_http, strict=True)
                 if (ours.placed_s, ours.placement) != (theirs.placed_s, theirs.placement))


def http_check(nodes: Sequence[ClusterNode], workload: Sequence[Job], seed: int,
               sample: int = DEFAULT_SAMPLE) -> HttpCheck:
    """Replay the first `sample` jobs through (4) and (5) and compare them pod for pod. A prefix keeps the
    arrivals and departures of those jobs as they are in the whole run."""
    if sample < 1:
        raise ValueError(f"the HTTP sample needs at least one job, not {sample}")
    jobs = tuple(workload[:sample])
    reference = ExtenderPolicy(OURS, nodes, delivery=True)
    in_process = replay(nodes, jobs, reference, seed)
    with policy_over_http(nodes) as policy:
        over_http = replay(nodes, jobs, policy, seed)
    placed = [outcome for outcome in in_process.outcomes if outcome.placement is not None]
    return HttpCheck(len(jobs), len(placed), sum(1 for outcome in placed if outcome.job.gpus > 1),
                     sum(1 for outcome in placed if outcome.placed_s != outcome.job.submit_s),
                     reference.service.drains.started, compare(in_process.outcomes, over_http.outcomes))
