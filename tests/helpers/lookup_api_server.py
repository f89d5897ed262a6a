"""Just enough of a Kubernetes API server for Helm's `lookup`: the discovery documents of core/v1 and the Secrets
and ConfigMaps of one in-memory store, read by namespace and name (404 Status otherwise), over plain HTTP on
127.0.0.1, with a kubeconfig pointing at it. Helm's client asks discovery which resource a kind is, then GETs it;
nothing is written (helm_python.Config.render creates nothing).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

RESOURCES = {"secrets": "Secret", "configmaps": "ConfigMap"}


class LookupApiServer:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}  # (resource, namespace, name)
        self.requests: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                server.requests.append(self.path)
                code, body = server.answer(self.path.split("?")[0])
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)

    def __enter__(self) -> LookupApiServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.shutdown()
        self.http.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http.server_address[1]}"

    def write_kubeconfig(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "lookup",
            "clusters": [{"name": "lookup", "cluster": {"server": self.url}}],
            "users": [{"name": "lookup", "user": {"token": "lookup"}}],
            "contexts": [{"name": "lookup", "context": {"cluster": "lookup", "user": "lookup"}}]}))
        return path

    def put(self, obj: dict[str, Any]) -> None:
        resource = {kind: plural for plural, kind in RESOURCES.items()}[obj["kind"]]
        self.objects[(resource, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj

    def answer(self, path: str) -> tuple[int, dict[str, Any]]:
        parts = path.strip("/").split("/")
        if parts == ["version"]:
            return 200, {"major": "1", "minor": "36", "gitVersion": "v1.36.0"}
        if parts == ["api"]:
            return 200, {"kind": "APIVersions", "versions": ["v1"]}
        if parts == ["apis"]:
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
        if parts == ["api", "v1"]:
            return 200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                {"name": plural, "singularName": kind.lower(), "namespaced": True, "kind": kind,
                 "verbs": ["get", "list"]} for plural, kind in RESOURCES.items()]}
        if len(parts) == 6 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] in RESOURCES:
            found = self.objects.get((parts[4], parts[3], parts[5]))
            if found is not None:
                return 200, found
            return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound",
                         "code": 404, "message": f'{parts[4]} "{parts[5]}" not found'}
        return 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                     "message": f"the server could not find the requested resource ({path})"}
