"""The request log, and each request's place in a trace.

One line per request once it is answered (method, path, status, duration, and for a run its session,
the digest it ran and its trace id), and for a request that failed, one more with its cause: the
error type of the answer, with its message only under `--otel-capture-content` (a message may quote
what the caller sent). Refusals among them are counted (heddle.server.metrics). Nothing else of a
request is logged: never a header, an argument or an output.

With tracing on (heddle.engine.tracing), a request is a SERVER span, a child of the caller's
`traceparent` when it sends one, and the run it starts is inside it.

Plain ASGI, outermost: a request the guard or authentication refuses is logged too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heddle.server.metrics import Metrics

if TYPE_CHECKING:
    from heddle.server.service import Job, Service

log = logging.getLogger("heddle.server.access")

# An error body is a small JSON object; more than this of one is not read for its cause.
_ERROR_BODY_CAP = 8192
# Where a route puts what the log line says of the run it started (heddle.server.app).
RUN_FIELDS = "heddle.run"


class AccessLog:
    def __init__(self, app: ASGIApp, *, metrics: Metrics, routes: Sequence[Route] = (),
                 capture_content: bool = False) -> None:
        self.app = app
        self.metrics = metrics
        self.routes = tuple(routes)
        self.capture_content = capture_content
        # A path without parameters is its own template, found without matching every route's pattern
        # (once a request); unless a route before it would match it first.
        self._fixed = {r.path: r.path for i, r in enumerate(self.routes) if not r.param_convertors
                       and not any(s.path_regex.match(r.path) for s in self.routes[:i])}

    def route(self, path: str) -> str | None:
        """The template of the route `path` reaches (`/v1/sessions/{session_id}`), or None."""
        fixed = self._fixed.get(path)
        if fixed is not None:
            return fixed
        return next((r.path for r in self.routes if r.path_regex.match(path)), None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0
        error = bytearray()

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status >= 400 and len(error) < _ERROR_BODY_CAP:
                error.extend(message.get("body", b"")[: _ERROR_BODY_CAP - len(error)])
            await send(message)

        method, path = scope["method"], scope["path"]
        found = _tracer()
        with contextlib.nullcontext() if found is None else _request_span(found, scope, self.route(path)) as span:
            try:
                await self.app(scope, receive, sending)
            finally:
                status = status or 500  # nothing was answered: the server failed
                self._logged(scope, method, path, status, time.perf_counter() - started, bytes(error), span)

    def _logged(self, scope: Scope, method: str, path: str, status: int, seconds: float, error: bytes,
                span: Any) -> None:
        fields: dict[str, Any] = {"method": method, "path": path, "status": status,
                                  "duration_ms": round(seconds * 1000, 3)}
        fields.update(scope.get("state", {}).get(RUN_FIELDS, {}))
        trace_id = _trace_id(span, scope)
        if trace_id is not None:
            fields["trace_id"] = trace_id
        if span is not None:
            span.set_attribute("http.response.status_code", status)
        level = logging.INFO if status < 500 else logging.ERROR
        log.log(level, "%s %s %s", method, path, status, extra={"fields": fields})
        if status < 400:
            self.metrics.answered(None)
            return
        kind, message = _cause(error)
        self.metrics.answered(kind)
        cause: dict[str, Any] = {"method": method, "path": path, "status": status, "error": kind or "unknown"}
        if self.capture_content and message:
            cause["detail"] = message
        if trace_id is not None:
            cause["trace_id"] = trace_id
        if span is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_attribute("error.type", kind or str(status))
            if status >= 500:
                span.set_status(Status(StatusCode.ERROR))
        log.log(logging.WARNING if status < 500 else logging.ERROR, "%s %s failed: %s", method, path,
                cause["error"], extra={"fields": cause})


def run_fields(service: Service, job: Job) -> dict[str, str]:
    """What the log line of a request says of the run it started: its session and the digest it runs
    (a bundle's, or in a session the digest of the flow the session is bound to)."""
    fields: dict[str, str] = {}
    if job.session is not None:
        fields["session"] = job.session.session_id
    edition = job.lease.edition if job.lease is not None else None
    if edition is not None and edition.sealed is not None and job.prepared is edition.bundle_run:
        fields["digest"] = edition.sealed.digest
    elif job.digest:
        fields["digest"] = job.digest
    return fields


def _cause(body: bytes) -> tuple[str | None, str | None]:
    """The error type and message of an error answer's body, when it is the server's usual one."""
    try:
        value = json.loads(body)
    except ValueError:
        return None, None
    error = value.get("error") if isinstance(value, dict) else None
    if not isinstance(error, dict):
        return None, None
    kind, message = error.get("type"), error.get("message")
    return (kind if isinstance(kind, str) else None), (message if isinstance(message, str) else None)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())
            if k.lower() in (b"traceparent", b"tracestate")}


def _trace_id(span: Any, scope: Scope) -> str | None:
    """The request's trace id: its span's, or else the one its caller's `traceparent` names."""
    if span is not None:
        context = span.get_span_context()
        return f"{context.trace_id:032x}" if context.is_valid else None
    parent = _headers(scope).get("traceparent", "").split("-")
    if len(parent) == 4 and len(parent[1]) == 32 and all(c in "0123456789abcdef" for c in parent[1]):
        return parent[1] if parent[1] != "0" * 32 else None
    return None


def _tracer() -> Any:
    """The process's recorder of spans, or None when tracing is off (heddle.engine.tracing.tracer)."""
    from heddle.engine import tracing

    return tracing.tracer()


@contextlib.contextmanager
def _request_span(found: Any, scope: Scope, route: str | None) -> Iterator[Any]:
    """The request's SERVER span, recorded by `found` (`_tracer`), under its caller's `traceparent`. Named
    by its route's template, never by what a caller wrote in the path (a session id, any unknown path)."""
    from heddle.engine import tracing

    method = scope["method"]
    attributes = {"http.request.method": method, **({"http.route": route} if route is not None else {})}
    with tracing.continued(_headers(scope)), tracing.Tracing(found).span(
            method if route is None else f"{method} {route}", attributes, kind="server") as span:
        yield span


class LogLines(logging.Formatter):
    """A log record as one line: text (`heddle-server: ...` and its fields), or one JSON object."""

    def __init__(self, prefix: str, *, json_lines: bool) -> None:
        super().__init__()
        self.prefix = prefix
        self.json_lines = json_lines

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = getattr(record, "fields", {})
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        if self.json_lines:
            return json.dumps({"time": round(record.created, 3), "level": record.levelname.lower(),
                               "logger": record.name, "message": message, **fields},
                              ensure_ascii=False, default=str)
        extra = " ".join(f"{k}={v}" for k, v in fields.items() if k not in ("method", "path", "status", "error"))
        return f"{self.prefix}{message}" + (f" {extra}" if extra else "")
