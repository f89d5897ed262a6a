"""make fuzz: a bounded fuzzing campaign against the real extender server, with fixed seeds; writes FUZZING.md.

Four parts, every request over HTTP to the real server (uvicorn, `extender.server.serve`'s limits) on loopback:
1. schemathesis against `extender.api.openapi` (positive and negative bodies for the four verbs and the probes);
2. the real kube-scheduler bodies (tests/fixtures/kube-scheduler), and AdmissionReviews of their pods asking GPUs
   through the shipped claim templates (to the webhook, with --pin-claims), with one field set to a value of each
   wrong shape, at seeded random places;
3. hypothesis on the parsers and the codec in process (topology.nvidia_smi, topology.codec, extender.api.wire,
   extender.api.pod_request): each input parses or is refused with its own error type, nothing else;
4. adversarial topologies (hostile_node.SHAPES and seeded random boards within the NVLink budget) published by a
   node, then filter and prioritize through it.
Every answer is counted where the server writes it (loadtests/answer_tap.py), whichever path answers it. The run
fails (exit 1) on a 5xx, an "internal error" answer, a traceback or error in the log, a part that sent fewer
requests than planned, a request without an answer, or server and client counts that differ. Each seed runs on a
fresh server and writes its own section.

    python loadtests/fuzz.py [--seed 9 --seed 23] [--scale 1.0] [--write FUZZING.md]
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import logging
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import orjson
import uvicorn
import yaml
from hypothesis import HealthCheck, given, seed, settings, strategies as st

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from answer_tap import AnswerTap  # noqa: E402
from bench_select import run_header, write_section  # noqa: E402
from hostile_node import SHAPES, _board, hostile_pod  # noqa: E402

from extender.api.openapi import document  # noqa: E402
from extender.api.pod_request import parse_pod  # noqa: E402
from extender.api.wire import BadRequest, NotJson, parse_binding_args, parse_extender_args, parse_preemption_args  # noqa: E402
from extender.cache.cluster_state import ClusterState  # noqa: E402
from extender.demo.cluster import DemoCluster, with_uuids  # noqa: E402
from extender.server.app import ADMISSION_PATH  # noqa: E402
from extender.server.serve import ServeOptions, server_config  # noqa: E402
from extender.verbs.service import ExtenderService  # noqa: E402
from topology import bounds  # noqa: E402
from topology.annotations import AnnotationKeys  # noqa: E402
from topology.codec import CodecError, decode_state, decode_topology, encode_topology  # noqa: E402
from topology.levels import Level  # noqa: E402
from topology.model import Topology, TopologyError  # noqa: E402
from topology.nvidia_smi import TopoParseError, parse_topo_matrix  # noqa: E402
from topology.platforms import PLATFORMS  # noqa: E402

SEEDS = (9, 23)  # make fuzz runs both: FUZZING.md holds a section for each
CAPTURES = HERE.parent / "tests" / "fixtures" / "kube-scheduler"
TEMPLATES = HERE.parent / "scheduler-config" / "dra-claim-templates.yaml"
NODES = (("node-a", "dgx-h100"), ("node-b", "dgx-h100"), ("node-c", "dgx-a100"), ("v100", "dgx1-v100"))
WRONG = [None, True, -1, 2**63, 1.5, "", "x" * 300, "2", [], {}, [1], {"a": {"b": []}}, ["x"], [[]], [{}], "\x00"]
H100 = "NVIDIA H100 80GB HBM3"
PODS_PER_BOARD = 6  # each through filter and prioritize
# The planned size of each part at --scale 1: 10,000+ HTTP requests in all.
SCHEMA_EXAMPLES, MUTATIONS, BOARDS, PARSER_EXAMPLES = 1000, 6000, 200, 1000


def markers(seed_value: int) -> tuple[str, str]:
    """The markers of a seed's section in FUZZING.md."""
    return f"<!-- fuzz seed {seed_value}:begin -->", f"<!-- fuzz seed {seed_value}:end -->"


@dataclass(frozen=True, slots=True)
class Part:
    """One part's requests as its client saw them, and the answers the server wrote while it ran."""

    name: str
    seed: str
    planned: int
    sent: int
    received: int  # answers the client read
    note: str = ""
    problems: tuple[str, ...] = ()  # what the part found wrong besides its counts
    detail: str = ""  # shown under the report when the part failed (schemathesis's own output)
    answered: int = 0  # answers the server wrote during the part (`counted` fills it in)

    def failures(self) -> list[str]:
        found = [f"{self.name}: {problem}" for problem in self.problems]
        if self.sent < self.planned:
            found.append(f"{self.name}: sent {self.sent:,} of the {self.planned:,} requests planned")
        if self.received < self.sent:
            found.append(f"{self.name}: {self.sent - self.received:,} of {self.sent:,} requests got no answer")
        if self.answered != self.received:
            found.append(f"{self.name}: the server wrote {self.answered:,} answers, the client read {self.received:,}")
        return found


def counted(tap: AnswerTap, run: Callable[[], Part]) -> Part:
    """The part run, with the answers the server wrote meanwhile. The tap counts an answer before it writes it,
    and a part returns once its clients have read every answer they will get, so nothing is counted late."""
    before = tap.total
    part = run()
    return replace(part, answered=tap.total - before)


class Tracebacks(logging.Handler):
    """Errors and tracebacks logged by the server and the verbs, and exceptions that end a thread."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []
        self._loggers = (logging.getLogger(), logging.getLogger("uvicorn"))  # uvicorn's do not propagate
        self._excepthook = threading.excepthook

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(f"{record.name}: {record.getMessage()[:200]}")

    def _thread_ended(self, args: threading.ExceptHookArgs) -> None:
        self.records.append(f"thread {args.thread.name if args.thread else '?'}: {args.exc_type.__name__}: "
                            f"{str(args.exc_value)[:200]}")
        self._excepthook(args)

    def __enter__(self) -> Tracebacks:
        for logger in self._loggers:
            logger.addHandler(self)
        threading.excepthook = self._thread_ended
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        for logger in self._loggers:
            logger.removeHandler(self)
        threading.excepthook = self._excepthook


def start_server(service: ExtenderService) -> tuple[AnswerTap, int, Callable[[], None]]:
    config = server_config(service, ServeOptions(log_level="warning"))
    tap = AnswerTap()
    config.http_protocol_class = tap.protocol(config.http_protocol_class)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listener]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(10)
    return tap, listener.getsockname()[1], stop


class Client:
    """One kept-alive HTTP/1.1 connection, as kube-scheduler's client holds. Every status read is kept; a request
    that gets no answer is not sent again, it is counted as sent and not answered."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection: socket.socket | None = None
        self.sent = 0
        self.statuses: Counter[int] = Counter()

    @property
    def received(self) -> int:
        return sum(self.statuses.values())

    def post(self, path: str, body: bytes) -> None:
        self.sent += 1
        try:
            status, keep_alive = self._post(path, body)
        except (OSError, ValueError, IndexError):  # closed, timed out, or no HTTP answer
            keep_alive = False
        else:
            self.statuses[status] += 1
        if not keep_alive:
            self.close()

    def close(self) -> None:
        """At a part's end too: a connection left open would be closed by the server in a later part."""
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def _post(self, path: str, body: bytes) -> tuple[int, bool]:
        if self.connection is None:
            self.connection = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.connection.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        reader = self.connection.makefile("rb")
        status = int(reader.readline().split()[1])
        length, keep_alive = 0, True
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            elif name.lower() == b"connection" and b"close" in value.lower():
                keep_alive = False
        if len(reader.read(length)) != length:
            raise ConnectionError(f"{path}: the answer ended early")
        return status, keep_alive


def schema_plan(examples: int) -> dict[tuple[str, str], int]:
    """The requests each operation of the document must get at least: `examples` where it takes a body (the
    verbs), one where it takes nothing (the probes, whose one request is all there is to generate)."""
    return {(method.upper(), path): examples if "requestBody" in operation else 1
            for path, operations in document()["paths"].items() for method, operation in operations.items()}


def run_schemathesis(port: int, seed_value: int, examples: int) -> Part:
    """schemathesis's run, counted from its own reports: every test case's request (HAR) and its probes'."""
    st_binary = shutil.which("st", path=str(Path(sys.executable).parent))
    if st_binary is None:
        raise SystemExit("schemathesis is not installed: pip install -e '.[test]' (make test and make fuzz do)")
    with tempfile.TemporaryDirectory(prefix="fuzz-") as workdir:  # schemathesis keeps its cache there
        schema = Path(workdir) / "openapi.json"
        schema.write_text(json.dumps(document()))
        har, events = Path(workdir) / "requests.har", Path(workdir) / "events.ndjson"
        command = [st_binary, "run", str(schema), "--url", f"http://127.0.0.1:{port}", "--seed", str(seed_value),
                   "--max-examples", str(examples), "--workers", "1", "--no-color", "--request-timeout", "10",
                   "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
                   "response_schema_conformance", "--generation-database", "none", "--suppress-health-check", "all",
                   "--report", "har,ndjson", "--report-har-path", str(har), "--report-ndjson-path", str(events)]
        done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=workdir)
        entries = json.loads(har.read_text())["log"]["entries"] if har.exists() else []
        probes = _probes_answered(events) if events.exists() else 0
    by_operation = Counter((entry["request"]["method"], urlsplit(entry["request"]["url"]).path) for entry in entries)
    plan = schema_plan(examples)
    problems = [f"{method} {path} got {by_operation[method, path]:,} requests of the {least:,} planned"
                for (method, path), least in plan.items() if by_operation[method, path] < least]
    if done.returncode != 0:
        problems.append(f"schemathesis exit code {done.returncode}")
    received = sum(1 for entry in entries if entry["response"]["status"]) + probes
    return Part("schemathesis against extender/api/openapi.py", f"--seed {seed_value}", sum(plan.values()),
                len(entries) + probes, received,
                f"exit code {done.returncode}; {len(plan)} operations, {probes} probes", tuple(problems),
                (done.stdout + done.stderr)[-3000:])


def _probes_answered(events: Path) -> int:
    """The requests of schemathesis's probing phase (which its HAR leaves out) that got an answer."""
    with events.open() as lines:
        for line in lines:
            if line.startswith('{"PhaseFinished"'):
                finished = json.loads(line)["PhaseFinished"]
                if finished["phase"]["name"] == "probing":
                    return sum(1 for probe in (finished.get("payload") or {}).get("probes", ())
                               if probe.get("response"))
    return 0


def _paths(document_: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(document_, dict):
        for key, value in document_.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(document_, list):
        for index, value in enumerate(document_):
            yield from _paths(value, prefix + (index,))


def shipped_templates() -> list[dict[str, Any]]:
    """The ResourceClaimTemplates of scheduler-config/, in the namespace the fuzzed pods are made in."""
    templates = list(yaml.safe_load_all(TEMPLATES.read_text()))
    for template in templates:
        template["metadata"]["namespace"] = "default"
    return templates


def admission_review(pod: dict[str, Any], template: str) -> dict[str, Any]:
    """kube-apiserver's review of `pod`'s creation, its GPUs asked through `template`: with --pin-claims the
    webhook names the claim (extender/pinning/admission.py)."""
    pod = copy.deepcopy(pod)
    pod["metadata"]["namespace"] = "default"
    pod["spec"]["resourceClaims"] = [{"name": "gpus", "resourceClaimTemplateName": template}]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "fuzz", "namespace": "default", "operation": "CREATE", "object": pod}}


def run_mutations(port: int, seed_value: int, count: int) -> Part:
    """Real bodies, one field replaced by a value of a wrong shape: kube-scheduler's to the verbs, and reviews of
    the same pods to the admission webhook."""
    rng = random.Random(seed_value)
    captured = [(f"/{path.name.split('--')[1].split('.')[0]}", orjson.loads(path.read_bytes()))
                for path in sorted(CAPTURES.glob("*--*.json")) if "response" not in path.name]
    templates = [template["metadata"]["name"] for template in shipped_templates()]
    captured += [(ADMISSION_PATH, admission_review(body["Pod"], templates[index % len(templates)]))
                 for index, (path, body) in enumerate(list(captured)) if path == "/filter"]
    bodies = [(path, body, list(_paths(body))[1:]) for path, body in captured]  # every field, walked once
    client = Client(port)
    sent: Counter[str] = Counter()
    for _ in range(count):
        path, body, fields = rng.choice(bodies)
        where = rng.choice(fields)
        mutated = copy.deepcopy(body)
        target = mutated
        for step in where[:-1]:
            target = target[step]
        target[where[-1]] = copy.deepcopy(rng.choice(WRONG))
        client.post(path, json.dumps(mutated).encode())
        sent[path] += 1
    client.close()
    return Part("real kube-scheduler bodies and admission reviews, one field of a wrong shape",
                f"random.Random({seed_value})", count, client.sent, client.received,
                ", ".join(f"{path} {n:,}" for path, n in sorted(sent.items())))


def run_parsers(seed_value: int, examples: int) -> Counter[str]:
    """Each parser either parses or refuses with its own error type. The examples run, by module (one example
    tries the three wire parsers, or both codec decoders, on one input)."""
    tried: Counter[str] = Counter()
    json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**63 - 1) | st.floats() | st.text(),
                               lambda inner: st.lists(inner, max_size=4)
                                             | st.dictionaries(st.text(), inner, max_size=4),
                               max_leaves=30)
    captures = [orjson.loads(path.read_bytes()) for path in sorted(CAPTURES.glob("*--filter.json"))]
    keys = AnnotationKeys()
    topo_text = (HERE.parent / "topology" / "captures").glob("*.txt")
    topo_lines = [line for path in sorted(topo_text) for line in path.read_text().splitlines()]
    encoded = [encode_topology(with_uuids(name, platform.topology())) for name, platform in PLATFORMS.items()]

    def check(call: Callable[[], Any], allowed: tuple[type[BaseException], ...]) -> None:
        try:
            call()
        except allowed:
            pass

    common = settings(max_examples=examples, deadline=None, database=None, derandomize=False,
                      suppress_health_check=list(HealthCheck))

    @seed(seed_value)
    @common
    @given(json_values)
    def wire(value: Any) -> None:
        body = json.dumps({"Pod": value, "NodeNames": value} if isinstance(value, dict) else value).encode()
        tried["extender.api.wire"] += 1
        for parse in (parse_extender_args, parse_binding_args, parse_preemption_args):
            check(lambda: parse(body), (BadRequest, NotJson))

    @seed(seed_value)
    @common
    @given(st.sampled_from(captures), st.data())
    def pods(capture: dict, data: st.DataObject) -> None:
        pod = copy.deepcopy(capture["Pod"])
        where = data.draw(st.sampled_from(list(_paths(pod))[1:]))
        target = pod
        for step in where[:-1]:
            target = target[step]
        target[where[-1]] = data.draw(json_values)
        tried["extender.api.pod_request"] += 1
        parse_pod(pod, keys)  # never raises: a problem is a reason

    @seed(seed_value)
    @common
    @given(st.lists(st.sampled_from(topo_lines) | st.text(max_size=80), max_size=30))
    def topo(lines: list[str]) -> None:
        tried["topology.nvidia_smi"] += 1
        check(lambda: parse_topo_matrix("\n".join(lines)), (TopoParseError, TopologyError))

    @seed(seed_value)
    @common
    @given(st.sampled_from(encoded), st.data())
    def codec(text: str, data: st.DataObject) -> None:
        document_ = orjson.loads(text)
        where = data.draw(st.sampled_from(list(_paths(document_))[1:]))
        target = document_
        for step in where[:-1]:
            target = target[step]
        target[where[-1]] = data.draw(json_values)
        mutated = json.dumps(document_)
        tried["topology.codec"] += 1
        check(lambda: decode_topology(mutated), (CodecError, TopologyError))
        check(lambda: decode_state(mutated), (CodecError, TopologyError))

    for run in (wire, pods, topo, codec):
        run()
    return tried


def random_board(rng: random.Random) -> Topology:
    """1 to 48 GPUs, NVLinks between random pairs up to each GPU's budget (the codec refuses a board past it, and
    a refused board never reaches the verbs): single links make dense graphs like hostile_node's, fat ones few
    wide pairs."""
    n = rng.randint(1, 48)
    density, widest = rng.random(), rng.choice((1, 2, 18))
    spare = [bounds.max_nvlinks(H100)] * n
    pairs = list(itertools.combinations(range(n), 2))
    rng.shuffle(pairs)
    links: dict[tuple[int, int], int] = {}
    for a, b in pairs:
        if rng.random() < density and min(spare[a], spare[b]) > 0:
            links[a, b] = rng.randint(1, min(widest, spare[a], spare[b]))
            spare[a] -= links[a, b]
            spare[b] -= links[a, b]
    return _board(n, H100, lambda a, b: links.get((a, b), 0), rng.choice(list(Level)[:-1]))


def annotation_of(build: Callable[[], Topology]) -> tuple[str | None, str]:
    """A board's annotation if the codec accepts it (decodes what it encoded), else None and the codec's reason."""
    try:
        annotation = encode_topology(build())
        decode_topology(annotation)
    except (CodecError, TopologyError) as error:
        return None, str(error)
    return annotation, ""


def run_topologies(state: ClusterState, port: int, seed_value: int, boards: int) -> Part:
    """Each board published by node `hostile`, then filter and prioritize for pods of 1 to 8 GPUs through it.
    Planned: `boards` random boards the codec accepts (a draw it refuses, past the annotation's byte budget, is
    drawn again, up to ten draws a board), and each of hostile_node.SHAPES it accepts (some are built to be
    refused)."""
    rng = random.Random(seed_value)
    shapes = [annotation for annotation, _ in (annotation_of(build) for _, build in SHAPES.values()) if annotation]
    randoms: list[str] = []
    refused: Counter[str] = Counter()
    for _ in range(10 * boards):
        if len(randoms) == boards:
            break
        annotation, why = annotation_of(lambda: random_board(rng))
        if annotation:
            randoms.append(annotation)
        else:
            refused[re.sub(r"\d+", "N", why)] += 1  # by reason, whatever the figures
    client = Client(port)
    slowest = 0.0
    names = [name for name, _ in NODES] + ["hostile"]
    for index, annotation in enumerate(shapes + randoms):
        node = {"metadata": {"name": "hostile", "annotations": {"gpu-topology.io/topology": annotation}}}
        state.nodes.apply("MODIFIED" if index else "ADDED", node)
        for pod_index in range(index * PODS_PER_BOARD, (index + 1) * PODS_PER_BOARD):
            body = orjson.dumps({"Pod": hostile_pod(pod_index), "NodeNames": names})
            for verb in ("filter", "prioritize"):
                started = time.perf_counter()
                client.post(f"/{verb}", body)
                slowest = max(slowest, time.perf_counter() - started)
    client.close()
    return Part("adversarial topologies through filter and prioritize", f"random.Random({seed_value})",
                (len(shapes) + boards) * PODS_PER_BOARD * 2, client.sent, client.received,
                f"{len(shapes)} of {len(SHAPES)} hostile shapes and {len(randoms)} random boards accepted by the "
                f"codec ({sum(refused.values())} draws refused: "
                + ("; ".join(f"{count} \"{why}\"" for why, count in refused.most_common()) or "none")
                + f"); slowest answer {slowest * 1000:.0f} ms")


@dataclass(frozen=True, slots=True)
class SeedRun:
    """One seed's campaign on a fresh server."""

    seed: int
    parts: list[Part]
    tap: AnswerTap
    parsed: Counter[str]
    parser_examples: int
    tracebacks: list[str]

    def failures(self) -> list[str]:
        found = [failure for part in self.parts for failure in part.failures()]
        found += [f"{path}: {count:,} answers {status}" for (path, status), count in sorted(self.tap.answers.items())
                  if status >= 500]
        found += [f"{path}: {count:,} \"internal error\" answers" for path, count in sorted(self.tap.internal.items())]
        found += [f"in-process {module}: {self.parsed[module]:,} of the {self.parser_examples:,} examples planned"
                  for module in PARSERS if self.parsed[module] < self.parser_examples]
        found += [f"the log: {record}" for record in self.tracebacks]
        return found


PARSERS = ("extender.api.pod_request", "extender.api.wire", "topology.codec", "topology.nvidia_smi")


def planned(scale: float, full: int) -> int:
    """A part's planned count at `scale`: at least one."""
    return max(1, round(full * scale))


def run_seed(seed_value: int, scale: float) -> SeedRun:
    state = ClusterState()
    service = ExtenderService(state, DemoCluster(state, NODES), pin_claims=True)
    for template in shipped_templates():
        state.templates.apply("ADDED", template)
    tap, port, stop = start_server(service)  # before the handlers: uvicorn's Config sets up its loggers anew
    with Tracebacks() as tracebacks:
        try:
            parts = [counted(tap, lambda: run_schemathesis(port, seed_value, planned(scale, SCHEMA_EXAMPLES))),
                     counted(tap, lambda: run_mutations(port, seed_value, planned(scale, MUTATIONS))),
                     counted(tap, lambda: run_topologies(state, port, seed_value, planned(scale, BOARDS)))]
            examples = planned(scale, PARSER_EXAMPLES)
            parsed = run_parsers(seed_value, examples)
        finally:
            stop()
    return SeedRun(seed_value, parts, tap, parsed, examples, tracebacks.records)


def report(run: SeedRun, argv: Sequence[str], elapsed: float) -> str:
    statuses = run.tap.by_status()
    by_path: dict[str, Counter[int]] = {}
    for (path, status), count in run.tap.answers.items():
        by_path.setdefault(path, Counter())[status] += count
    lines = run_header(f"Fuzzing, seed {run.seed}", "fuzz.py", argv, elapsed) + [
        "", "| part | seed | planned | sent | answered by the server | note |", "|---|---|---:|---:|---:|---|"]
    lines += [f"| {part.name} | {part.seed} | {part.planned:,} | {part.sent:,} | {part.answered:,} | {part.note} |"
              for part in run.parts]
    lines += ["", f"- HTTP answers the server wrote, counted on the wire: **{run.tap.total:,}**; by status: "
              + ", ".join(f"{status}: {count:,}" for status, count in sorted(statuses.items())) + ".",
              "- By path: " + "; ".join(
                  f"`{path}` {sum(counts.values()):,} ("
                  + ", ".join(f"{status}: {count:,}" for status, count in sorted(counts.items())) + ")"
                  for path, counts in sorted(by_path.items(), key=lambda item: -sum(item[1].values()))) + ".",
              f"- In-process hypothesis examples (`@seed({run.seed})`), of {run.parser_examples:,} planned each: "
              + ", ".join(f"{name} {run.parsed[name]:,}" for name in PARSERS) + ".",
              f"- 5xx answers: {sum(count for status, count in statuses.items() if status >= 500):,}; "
              f"\"internal error\" answers: {sum(run.tap.internal.values()):,}; "
              f"tracebacks or errors in the log: {len(run.tracebacks):,}."]
    failures = run.failures()
    lines.append(f"- Verdict: **{'failed' if failures else 'passed'}**" + ("." if not failures else ":"))
    lines += [f"  - {failure}" for failure in failures[:20]]
    for part in run.parts:
        if part.detail and part.failures():
            lines += ["", "```", part.detail.strip(), "```"]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, action="append", help=f"once per run (default: {SEEDS})")
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every part's planned count "
                        "(0.01 for a quick look)")
    parser.add_argument("--write", type=Path, help="rewrite each seed's section of this file (FUZZING.md)")
    args = parser.parse_args(argv)
    argv = sys.argv[1:] if argv is None else list(argv)
    failed = False
    for seed_value in args.seed or SEEDS:
        started = time.perf_counter()
        run = run_seed(seed_value, args.scale)
        text = report(run, argv, time.perf_counter() - started)
        print(text)
        for failure in run.failures():
            print(f"fuzz.py: seed {seed_value}: {failure}", file=sys.stderr)
        failed = failed or bool(run.failures())
        if args.write:
            write_section(args.write, text, *markers(seed_value))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
