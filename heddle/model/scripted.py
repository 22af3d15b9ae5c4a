"""The scripted model: an OpenAI-compatible chat-completions server that answers from a script.

It answers byte for byte like the conformance runner's model (same ids, same chunking of
content and tool-call arguments, `[DONE]`), so flows tested against one behave the same
against the other. Each POST takes the next entry; when none is left the answer is a 500
(and one line on stderr), unless the script loops, when it starts again from the top.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import IO, Any

import uvicorn
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from heddle.errors import UsageError
from heddle.model.script import ScriptError, check_script, load_script
from heddle.safeparse import loads_json
from heddle.tcp import no_delay

__all__ = ["ScriptError", "ScriptedModel", "check_script", "chunks", "completion", "load_script", "serve"]


def _tool_calls(entry: dict[str, Any], index: int) -> list[dict[str, Any]]:
    return [
        {
            "id": f"call_{index}_{i}",
            "type": "function",
            "function": {"name": c["name"], "arguments": json.dumps(c.get("arguments", {}))},
        }
        for i, c in enumerate(entry.get("tool_calls", []))
    ]


def completion(entry: dict[str, Any], index: int) -> dict[str, Any]:
    """The buffered answer for request number `index`."""
    calls = _tool_calls(entry, index)
    message: dict[str, Any] = {"role": "assistant", "content": entry.get("content")}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": f"chatcmpl-{index}",
        "object": "chat.completion",
        "created": 0,
        "model": "scripted",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def chunks(entry: dict[str, Any], index: int) -> Iterator[dict[str, Any]]:
    """The streamed answer: content in two pieces, each call's arguments in two pieces."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"id": f"chatcmpl-{index}", "object": "chat.completion.chunk", "created": 0,
                "model": "scripted", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    yield chunk({"role": "assistant", "content": ""})
    text = entry.get("content") or ""
    if text:
        half = len(text) // 2
        for piece in (text[:half], text[half:]):
            if piece:
                yield chunk({"content": piece})
    calls = _tool_calls(entry, index)
    for i, call in enumerate(calls):
        args = call["function"]["arguments"]
        half = len(args) // 2
        yield chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                     "function": {"name": call["function"]["name"], "arguments": args[:half]}}]})
        yield chunk({"tool_calls": [{"index": i, "function": {"arguments": args[half:]}}]})
    yield chunk({}, "tool_calls" if calls else "stop")


def _json(status: int, obj: Any) -> Response:
    return Response(json.dumps(obj).encode(), status_code=status, media_type="application/json")


def _log(line: str) -> None:
    print(f"heddle model serve: {line}", file=sys.stderr, flush=True)


class ScriptedModel:
    """The ASGI app. Records each POST (in memory, and as a JSON line when `record` is given).

    With `loop`, request N takes entry N modulo the script's length, so a flow can run again
    and again against one server; request numbers (and so ids) keep counting up.
    """

    def __init__(self, script: list[dict[str, Any]], record: IO[str] | None = None, *, loop: bool = False,
                 log: Callable[[str], None] = _log) -> None:
        self.script = list(script)
        self.requests: list[dict[str, Any]] = []
        self.loop = loop
        self._record = record
        self._log = log

    def entry(self, index: int) -> dict[str, Any] | None:
        if index < len(self.script):
            return self.script[index]
        if self.loop and self.script:
            return self.script[index % len(self.script)]
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        request = Request(scope, receive)
        response = await self.respond(request)
        await response(scope, receive, send)

    async def respond(self, request: Request) -> Response:
        # The path as sent (still percent-encoded), as the conformance runner records it.
        path = request.scope.get("raw_path", b"").decode("latin-1") or request.url.path
        target = path + (f"?{request.url.query}" if request.url.query else "")
        if request.method != "POST":
            return _json(404, {"error": {"message": f"no route {request.method} {target}"}})
        raw = await request.body()
        try:
            body = loads_json(raw or b"{}")
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        # Every POST takes an index, even a misrouted one, so that request numbers line up
        # with the conformance runner's recordings.
        index = len(self.requests)
        entry = self.entry(index)
        self._remember({"path": target, "headers": dict(request.headers.items()), "body": body})
        if not target.rstrip("/").endswith("/chat/completions"):
            return _json(404, {"error": {"message": f"no route {target}"}})
        if entry is None:
            # The body is the conformance runner's, byte for byte; the log line says what to do.
            self._log(f"request {index + 1} found the script's {len(self.script)} answer(s) used up; "
                      "answered 500 (restart the server, or pass --loop to repeat the script)")
            return _json(500, {"error": {"message": "the script has no more responses"}})
        if isinstance(body, dict) and body.get("stream"):
            return self._stream(entry, index)
        return _json(200, completion(entry, index))

    def _remember(self, record: dict[str, Any]) -> None:
        self.requests.append(record)
        if self._record is not None:
            # Written before answering, so a client that has its answer finds its request on disk.
            self._record.write(json.dumps(record, ensure_ascii=False) + "\n")
            self._record.flush()

    @staticmethod
    def _stream(entry: dict[str, Any], index: int) -> StreamingResponse:
        async def events() -> AsyncIterator[bytes]:
            for chunk in chunks(entry, index):
                yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"

        headers = {"content-type": "text/event-stream", "cache-control": "no-cache", "connection": "close"}
        return StreamingResponse(events(), status_code=200, headers=headers)


class Protocol(H11Protocol):
    """uvicorn's h11 protocol, each answer sent at once (heddle.tcp)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        no_delay(transport)
        super().connection_made(transport)


class _Server(uvicorn.Server):
    """uvicorn's server, announcing its URL once listening and stopping cleanly on a signal."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self._on_ready()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # A signal is the normal way to stop this server, so it is not re-raised after shutdown.
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        self.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (0 = any free port)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise UsageError(f"cannot listen on {host}:{port} ({reason}); choose another --host or --port") from None


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/v1"


def _announce(url: str) -> None:
    print(url, flush=True)


def serve(script: list[dict[str, Any]], host: str = "127.0.0.1", port: int = 0, record_path: str | Path | None = None,
          *, loop: bool = False, on_ready: Callable[[str], None] = _announce) -> None:
    """Serve `script` until SIGTERM or SIGINT. `on_ready` gets the base URL once connections are accepted.

    `loop` repeats the script from the top once it is used up, instead of answering 500.
    """
    record: IO[str] | None = None
    if record_path is not None:
        try:
            record = open(record_path, "a", encoding="utf-8")  # noqa: SIM115 - open for the server's whole life
        except OSError as exc:
            raise UsageError(f"{record_path}: cannot open the record file ({exc.strerror}); check --record") from None
    try:
        sock = bind(host, port)
        url = base_url(sock)
        config = uvicorn.Config(ScriptedModel(script, record, loop=loop), lifespan="off", log_config=None,
                                log_level="warning", access_log=False, timeout_graceful_shutdown=2, http=Protocol)
        server = _Server(config, lambda: on_ready(url))
        with sock:
            server.run(sockets=[sock])
    finally:
        if record is not None:
            record.close()
