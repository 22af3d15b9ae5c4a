"""Bearer-token authentication for every route but the probes, as plain ASGI middleware
(it must not buffer bodies or hide client disconnects from the run routes)."""

from __future__ import annotations

import hmac
import json

from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({"/healthz", "/readyz"})


class BearerAuth:
    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app = app
        self._expected = f"Bearer {token}".encode()

    def _allowed(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                # Constant time, so the token cannot be guessed byte by byte from response times.
                return hmac.compare_digest(value, self._expected)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps({"error": {"type": "unauthorized", "message":
                                     "this server needs 'Authorization: Bearer <token>' (the token it was "
                                     "started with)"}}).encode("utf-8")
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", b'Bearer realm="heddle"')]})
        await send({"type": "http.response.body", "body": body})
