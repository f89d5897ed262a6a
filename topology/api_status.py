"""What the Kubernetes API server's error body says, for both Kubernetes edges (the reporter and the extender).

Plain JSON: it imports no Kubernetes client, so it may live in the core and be shared by both.
"""

from __future__ import annotations

from typing import Any

import orjson


def status_message(body: Any) -> str:
    """The `message` of a Kubernetes Status body, or the body's first line."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.strip().splitlines()[0][:200]
    return str(parsed.get("message") or parsed.get("reason") or "") if isinstance(parsed, dict) else ""
