"""Server-Sent Events framing: `event: <type>` and one `data:` line of JSON per frame."""

from __future__ import annotations

import json
from typing import Any

HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-store"),
    # Proxies that buffer responses would hold the frames back until the run ends.
    (b"x-accel-buffering", b"no"),
]

# A comment line: keeps idle proxies and load balancers from closing a quiet stream.
KEEPALIVE = b": keep-alive\n\n"
# How long a stream may stay quiet before it is sent.
KEEPALIVE_S = 15.0


def frame(event: str, data: Any) -> bytes:
    # Compact JSON escapes every newline inside strings, so one data line always suffices.
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=str)
    return f"event: {event}\ndata: {text}\n\n".encode()
