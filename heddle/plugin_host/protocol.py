"""The plugin protocol: JSON Lines on the process's stdin and stdout (stderr is left for its
error messages).

    request   {"id": 7, "method": "execute", "params": {...}}
    answer    {"id": 7, "result": {...}}   or   {"id": 7, "error": {"message": "..."}}
    streamed  {"id": 7, "partial": {...}}  (any number, before the answer)

Both sides send requests; ids are per sender, so an answer is matched to the request of the
other side. heddle's first request is `init {protocol, capabilities}`, answered `{protocol}`.
The plugin's requests name the heddle call they act for in `params.for`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from heddle.safeparse import loads_json

PROTOCOL_VERSION = 1

# heddle asks a plugin process: init, execute, callTool, before, after, encode, finishEncode, shutdown,
# and, under --discover-tools, `listTools {}` of a plugin whose manifest declares discoverTools, answered
# {"tools": [{"name", "description", "inputSchema"}, ...]} (heddle.plugin_host.manifest.discovered_tools).
LIST_TOOLS = "listTools"
# What a plugin may ask heddle, each only with the capability of the same name.
PLUGIN_METHODS = ("runTool", "callModel", "emitEvent", "log")

MAX_LINE = 16 * 2**20


class ProtocolViolation(ValueError):
    """A line that is not a protocol message."""


@dataclass(frozen=True)
class Request:
    id: int | str
    method: str
    params: dict[str, Any]


@dataclass(frozen=True)
class Answer:
    id: int | str
    result: Any = None
    error: str | None = None


@dataclass(frozen=True)
class Partial:
    id: int | str
    value: Any


Message = Request | Answer | Partial


def encode(message: dict[str, Any]) -> bytes:
    return (json.dumps(message, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=str)
            + "\n").encode("utf-8")


def request(id: int, method: str, params: dict[str, Any]) -> bytes:
    return encode({"id": id, "method": method, "params": params})


def answer(id: int | str, result: Any) -> bytes:
    return encode({"id": id, "result": result})


def failure(id: int | str, message: str) -> bytes:
    return encode({"id": id, "error": {"message": message}})


def _preview(line: bytes) -> str:
    text = line.decode("utf-8", "replace").strip()
    return text if len(text) <= 120 else text[:117] + "..."


def decode(line: bytes) -> Message:
    """One line from a plugin as a message, or ProtocolViolation saying what is wrong with it."""
    try:
        obj = loads_json(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolViolation(f"wrote a line that is not JSON ({exc}): {_preview(line)!r}; "
                                "stdout is for protocol messages only, print anything else on stderr") from None
    if not isinstance(obj, dict):
        raise ProtocolViolation(f"wrote JSON that is not an object: {_preview(line)!r}")
    mid = obj.get("id")
    if isinstance(mid, bool) or not isinstance(mid, (int, str)):
        raise ProtocolViolation(f"wrote a message without an integer or string 'id': {_preview(line)!r}")
    if "method" in obj:
        method, params = obj["method"], obj.get("params", {})
        if not isinstance(method, str):
            raise ProtocolViolation(f"wrote a request whose 'method' is not a string: {_preview(line)!r}")
        if not isinstance(params, dict):
            raise ProtocolViolation(f"wrote a {method!r} request whose 'params' is not an object")
        return Request(mid, method, params)
    if "partial" in obj:
        return Partial(mid, obj["partial"])
    if "error" in obj:
        err = obj["error"]
        message = err.get("message") if isinstance(err, dict) else None
        if not isinstance(message, str):
            raise ProtocolViolation(f"answered call {mid} with an 'error' that is not {{\"message\": \"...\"}}")
        return Answer(mid, error=message or "(no message)")
    if "result" in obj:
        return Answer(mid, result=obj["result"])
    raise ProtocolViolation("wrote a message with neither 'method', 'result', 'error' nor 'partial': "
                            f"{_preview(line)!r}")
