"""make fuzz: a bounded fuzzing campaign against the real extender server, with fixed seeds; writes FUZZING.md.

Four parts, every request over HTTP to the real server (uvicorn, `extender.server.serve`'s limits) on loopback:
1. schemathesis against `extender.api.openapi` (positive and negative bodies for the four verbs and the probes);
2. the real kube-scheduler bodies (tests/fixtures/kube-scheduler) with one field set to a value of each wrong
   shape, at seeded random places;
3. hypothesis on the parsers and the codec in process (topology.nvidia_smi, topology.codec, extender.api.wire,
   extender.api.pod_request): each input parses or is refused with its own error type, nothing else;
4. adversarial topologies (hostile_node.SHAPES and seeded random boards) published by a node, then filter and
   prioritize through it.
A failure is a 5xx, an "internal error" answer, or a traceback in the log. The script exits 1 on any.

    python loadtests/fuzz.py [--seed 9] [--scale 1.0] [--write FUZZING.md]
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import uvicorn
from hypothesis import HealthCheck, given, seed, settings, strategies as st

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_select import run_header, write_section  # noqa: E402
from hostile_node import SHAPES, _board, hostile_pod  # noqa: E402

from extender.api.openapi import document  # noqa: E402
from extender.api.pod_request import parse_pod  # noqa: E402
from extender.api.wire import BadRequest, NotJson, parse_binding_args, parse_extender_args, parse_preemption_args  # noqa: E402
from extender.cache.cluster_state import ClusterState  # noqa: E402
from extender.demo.cluster import DemoCluster, with_uuids  # noqa: E402
from extender.server.serve import ServeOptions, server_config  # noqa: E402
from extender.verbs.service import ExtenderService  # noqa: E402
from topology.annotations import AnnotationKeys  # noqa: E402
from topology.codec import CodecError, decode_state, decode_topology, encode_topology  # noqa: E402
from topology.levels import Level  # noqa: E402
from topology.model import TopologyError  # noqa: E402
from topology.nvidia_smi import TopoParseError, parse_topo_matrix  # noqa: E402
from topology.platforms import PLATFORMS  # noqa: E402

BEGIN, END = "<!-- fuzz:begin -->", "<!-- fuzz:end -->"
CAPTURES = HERE.parent / "tests" / "fixtures" / "kube-scheduler"
NODES = (("node-a", "dgx-h100"), ("node-b", "dgx-h100"), ("node-c", "dgx-a100"), ("v100", "dgx1-v100"))
WRONG = [None, True, -1, 2**63, 1.5, "", "x" * 300, "2", [], {}, [1], {"a": {"b": []}}, ["x"], [[]], [{}], "\x00"]
H100 = "NVIDIA H100 80GB HBM3"


class Recorder:
    """An ASGI wrapper over the app: every request's status, and whether its answer said "internal error"."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.statuses: Counter[int] = Counter()
        self.internal: list[str] = []

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def recording(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.statuses[message["status"]] += 1
            elif b"internal error" in message.get("body", b""):
                self.internal.append(scope["path"])
            await send(message)
        return await self.app(scope, receive, recording)

    @property
    def total(self) -> int:
        return sum(self.statuses.values())


class Tracebacks(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info or record.levelno >= logging.ERROR:
            self.records.append(f"{record.name}: {record.getMessage()[:200]}")


def start_server(service: ExtenderService) -> tuple[Recorder, int, Callable[[], None]]:
    config = server_config(service, ServeOptions(log_level="warning"))
    recorder = Recorder(config.app)
    config.app = recorder
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
    return recorder, listener.getsockname()[1], stop


class Client:
    """One kept-alive HTTP/1.1 connection, as kube-scheduler's client holds."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connection: socket.socket | None = None

    def post(self, path: str, body: bytes) -> int:
        for _ in range(2):  # once more on a fresh connection if the server closed the kept one
            try:
                return self._post(path, body)
            except OSError:
                self.connection = None
        raise OSError(f"{path}: no answer")

    def _post(self, path: str, body: bytes) -> int:
        if self.connection is None:
            self.connection = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        self.connection.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        reader = self.connection.makefile("rb")
        status = int(reader.readline().split()[1])
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        reader.read(length)
        return status


def run_schemathesis(port: int, seed_value: int, examples: int) -> tuple[int, str]:
    st_binary = shutil.which("st", path=str(Path(sys.executable).parent))
    if st_binary is None:
        raise SystemExit("schemathesis is not installed: pip install -e '.[fuzz]' (make fuzz does)")
    workdir = tempfile.mkdtemp(prefix="fuzz-")  # schemathesis keeps its cache in the working directory
    schema = Path(workdir) / "openapi.json"
    schema.write_text(json.dumps(document()))
    command = [st_binary, "run", str(schema), "--url", f"http://127.0.0.1:{port}", "--seed", str(seed_value),
               "--max-examples", str(examples), "--workers", "1", "--no-color", "--request-timeout", "10",
               "--checks", "not_a_server_error,status_code_conformance,content_type_conformance,"
               "response_schema_conformance", "--generation-database", "none", "--suppress-health-check", "all"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=workdir)
    shutil.rmtree(workdir)
    return done.returncode, (done.stdout + done.stderr)[-3000:]


def _paths(document_: Any, prefix: tuple = ()) -> Iterator[tuple]:
    yield prefix
    if isinstance(document_, dict):
        for key, value in document_.items():
            yield from _paths(value, prefix + (key,))
    elif isinstance(document_, list):
        for index, value in enumerate(document_):
            yield from _paths(value, prefix + (index,))


def run_mutations(port: int, rng: random.Random, count: int) -> int:
    """Real bodies, one field replaced by a value of a wrong shape."""
    captured = [(path.name.split("--")[1].split(".")[0], orjson.loads(path.read_bytes()))
                for path in sorted(CAPTURES.glob("*--*.json")) if "response" not in path.name]
    bodies = [(verb, body, list(_paths(body))[1:]) for verb, body in captured]  # every field, walked once
    client = Client(port)
    for _ in range(count):
        verb, body, fields = rng.choice(bodies)
        where = rng.choice(fields)
        mutated = copy.deepcopy(body)
        target = mutated
        for step in where[:-1]:
            target = target[step]
        target[where[-1]] = copy.deepcopy(rng.choice(WRONG))
        client.post(f"/{verb}", json.dumps(mutated).encode())
    return count


def run_parsers(seed_value: int, examples: int) -> dict[str, int]:
    """Each parser either parses or refuses with its own error type."""
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

    def check(name: str, call: Callable[[], Any], allowed: tuple[type[BaseException], ...]) -> None:
        tried[name] += 1
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
        for parse in (parse_extender_args, parse_binding_args, parse_preemption_args):
            check("extender.api.wire", lambda: parse(body), (BadRequest, NotJson))

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
        check("topology.nvidia_smi", lambda: parse_topo_matrix("\n".join(lines)), (TopoParseError, TopologyError))

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
        check("topology.codec", lambda: decode_topology(mutated), (CodecError, TopologyError))
        check("topology.codec", lambda: decode_state(mutated), (CodecError, TopologyError))

    for run in (wire, pods, topo, codec):
        run()
    return dict(tried)


def random_board(rng: random.Random) -> Any:
    n = rng.randint(1, 48)
    density = rng.random()
    links = {pair: rng.randint(1, 18) for pair in ((a, b) for a in range(n) for b in range(a + 1, n))
             if rng.random() < density}
    return _board(n, H100, lambda a, b: links.get((a, b), 0), rng.choice(list(Level)[:-1]))


def run_topologies(state: ClusterState, port: int, rng: random.Random, boards: int) -> tuple[int, int, float]:
    """Each board published by node `hostile`, then filter and prioritize for pods of 1 to 8 GPUs through it."""
    builders = [build for _, build in SHAPES.values()] + [lambda: random_board(rng) for _ in range(boards)]
    client = Client(port)
    accepted = requests = 0
    slowest = 0.0
    names = [name for name, _ in NODES] + ["hostile"]
    for index, build in enumerate(builders):
        try:
            annotation = encode_topology(build())
            decode_topology(annotation)
        except (CodecError, TopologyError):
            continue
        accepted += 1
        node = {"metadata": {"name": "hostile", "annotations": {"gpu-topology.io/topology": annotation}}}
        state.nodes.apply("MODIFIED" if index else "ADDED", node)
        for pod_index in range(index * 6, index * 6 + 6):
            body = orjson.dumps({"Pod": hostile_pod(pod_index), "NodeNames": names})
            for verb in ("filter", "prioritize"):
                started = time.perf_counter()
                client.post(f"/{verb}", body)
                slowest = max(slowest, time.perf_counter() - started)
                requests += 1
    return accepted, requests, slowest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=9)
    parser.add_argument("--scale", type=float, default=1.0, help="multiplies every count (0.1 for a quick look)")
    parser.add_argument("--write", type=Path, help="rewrite the fuzz section of this file (FUZZING.md)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    tracebacks = Tracebacks()
    logging.getLogger().addHandler(tracebacks)
    state = ClusterState()
    service = ExtenderService(state, DemoCluster(state, NODES))
    recorder, port, stop = start_server(service)
    rows = []
    try:
        before = recorder.total
        code, schemathesis_log = run_schemathesis(port, args.seed, max(1, int(1000 * args.scale)))
        rows.append(("schemathesis against extender/api/openapi.py", f"--seed {args.seed}", recorder.total - before,
                     "exit code 0" if code == 0 else f"exit code {code}"))
        mutations = run_mutations(port, random.Random(args.seed), int(6000 * args.scale))
        rows.append(("real kube-scheduler bodies, one field of a wrong shape", f"random.Random({args.seed})",
                     mutations, ""))
        accepted, requests, slowest = run_topologies(state, port, random.Random(args.seed), int(200 * args.scale))
        rows.append(("adversarial topologies through filter and prioritize", f"random.Random({args.seed})", requests,
                     f"{accepted} boards accepted by the codec; slowest answer {slowest * 1000:.0f} ms"))
        parsed = run_parsers(args.seed, max(1, int(1000 * args.scale)))
    finally:
        stop()
    server_errors = sum(count for status, count in recorder.statuses.items() if status >= 500)
    failures = server_errors + len(recorder.internal) + len(tracebacks.records) + (code != 0)
    lines = run_header("Fuzzing", "fuzz.py", argv, time.perf_counter() - started) + [
        "", "| part | seed | requests | note |", "|---|---|---:|---|"]
    lines += [f"| {part} | {seed_} | {count:,} | {note} |" for part, seed_, count, note in rows]
    lines += ["", f"- HTTP requests in all: **{recorder.total:,}**; by status: "
              + ", ".join(f"{status}: {count:,}" for status, count in sorted(recorder.statuses.items())) + ".",
              f"- In-process hypothesis examples (`@seed({args.seed})`): "
              + ", ".join(f"{name} {count:,}" for name, count in sorted(parsed.items())) + ".",
              f"- 5xx answers: {server_errors}; \"internal error\" answers: {len(recorder.internal)}; "
              f"tracebacks or errors in the log: {len(tracebacks.records)}; schemathesis exit code: {code}."]
    lines += [f"  - {record}" for record in tracebacks.records[:10]]
    if code != 0:
        lines += ["", "```", schemathesis_log.strip(), "```"]
    report = "\n".join(lines)
    print(report)
    if args.write:
        write_section(args.write, report, BEGIN, END)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
