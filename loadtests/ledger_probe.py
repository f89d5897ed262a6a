"""`gpu-topology-extender` as it is, plus one read-only window for loadtests/faults.py: the replica's ledger.

The extender shows its ledger nowhere but in a count (`gpu_topology_extender_ledger_pods`), and `kubectl gputopo`
builds a cache of its own from the API server, so neither says whether the leader's reservations equal the pods'
sealed annotations after a fault. This runs the extender's own `main` unchanged, records the service it builds, and
answers GET /ledger on a loopback port of its own with what the ledger holds, read under the ledger's lock:

    {"leads": bool, "entries": [{"uid", "pod", "node", "gpus", "phase"}...], "free": {node: [GPU ids]}}

    python loadtests/ledger_probe.py PROBE_PORT serve --kubeconfig ... (the extender's own arguments)
"""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import extender.cli as cli
from extender.verbs.service import ExtenderService


def snapshot(service: ExtenderService) -> dict[str, Any]:
    """The ledger's entries and each usable node's free GPUs, as one consistent read."""
    state = service.state
    with state.ledger.lock:
        entries = [{"uid": entry.pod_uid, "pod": entry.pod_key, "node": entry.node, "gpus": sorted(entry.gpus),
                    "phase": entry.phase.value} for entry in state.ledger.pods()]
        free = {name: list(view.gpu_ids(view.free)) for name, view in state.views().items()
                if view.compiled is not None}
    return {"leads": service.leads(), "entries": entries, "free": free}


def serve_probe(port: int, services: list[ExtenderService]) -> ThreadingHTTPServer:
    """GET /ledger on 127.0.0.1:port, from a daemon thread: 503 until the extender has built its service."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/ledger" or not services:
                self.send_error(404 if self.path != "/ledger" else 503)
                return
            body = json.dumps(snapshot(services[0])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="ledger-probe", daemon=True).start()
    return server


def main(argv: list[str]) -> int:
    services: list[ExtenderService] = []

    class Recorded(ExtenderService):
        """The extender's service, remembered for the probe; nothing else differs."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            services.append(self)

    cli.ExtenderService = Recorded  # type: ignore[misc] - the one name _serve builds its service by
    serve_probe(int(argv[0]), services)
    return cli.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
