"""Errors as the HTTP surface reports them: a status code and `{"error": {"type", "message"}}`."""

from __future__ import annotations

import json
import logging
from typing import Any

from heddle.errors import (
    CallDenied,
    DocumentError,
    HeddleError,
    MissingInputError,
    Overrun,
    SessionError,
    ToolInputError,
    UsageError,
)

# json.dumps(value, ensure_ascii=False, default=str), the encoder made once rather than for each answer.
_ANSWER = json.JSONEncoder(ensure_ascii=False, default=str)


def json_answer(value: Any) -> bytes:
    """An answer's JSON body: UTF-8, anything JSON has no type for written as its text."""
    return _ANSWER.encode(value).encode("utf-8")


class ServeError(HeddleError):
    """The server could not start: the port cannot be opened, a folder is unusable. Nothing ran, and
    another --port or folder fixes it: a usage error's status, as `heddle model serve` exits."""

    exit_code = 2
    kind = "serve_failed"


class ApiError(Exception):
    """A request the server refuses, with the status and the error `type` the client sees."""

    def __init__(self, status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers or {}


def bad_request(message: str, type_: str = "bad_request") -> ApiError:
    return ApiError(400, type_, message)


def error_body(type_: str, message: str) -> dict[str, Any]:
    return {"error": {"type": type_, "message": message}}


def status_of(exc: HeddleError) -> int:
    """Errors found before a run starts are the caller's to fix (400); so are values the run was
    given that a tool's schema refuses before it starts (422), and a run a ToolNode ended because the
    caller denied its call (422: the run ended as answered); a session error has its own status (404
    unknown, 409 a conflict, 413 too large, 500 a damaged record, 400 otherwise); a run whose model,
    remote tool or tool answered past a cap or deadline is a 502; any other failed run is a 500."""
    if isinstance(exc, SessionError):
        return exc.http_status
    if isinstance(exc, (DocumentError, UsageError, MissingInputError)):
        return 400
    if isinstance(exc, (ToolInputError, CallDenied)):
        return 422
    if isinstance(exc, Overrun):
        return 502
    return 500


def as_api_error(exc: HeddleError) -> ApiError:
    return ApiError(status_of(exc), exc.kind, exc.message)


# What a caller hears of a run the server stopped (--drain-timeout passed, or a second signal).
CANCELLED: tuple[int, dict[str, Any]] = (
    503, error_body("cancelled", "the server is shutting down and stopped this run (--drain-timeout passed); "
                                 "retry on another instance"))


def run_failure(exc: BaseException) -> tuple[int, dict[str, Any]]:
    """The status and error body of a run that failed with `exc`: a caller's mistake found once a
    session's turn was known (ApiError), heddle's own error, or else a 500 logged with its cause."""
    if isinstance(exc, ApiError):
        return exc.status, error_body(exc.type, exc.message)
    if isinstance(exc, HeddleError):
        return status_of(exc), error_body(exc.kind, exc.message)
    logging.getLogger("heddle.server").error("run failed unexpectedly", exc_info=exc)
    return 500, error_body("internal_error", f"the run failed unexpectedly ({type(exc).__name__}); "
                                             "see the server log")
