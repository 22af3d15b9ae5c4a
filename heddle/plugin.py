"""Write a heddle plugin in Python as decorated functions; `serve()` speaks the protocol.

    from heddle.plugin import Plugin, reject

    plugin = Plugin()

    @plugin.before("ApprovalGate", "toolCall")
    def gate(call):
        if call.params["tool"] == "delete_file":
            return reject("deleting files needs a person's approval")

    @plugin.node("WordStats")
    def stats(call):
        words = len(call.input["text"].split())
        return {"words": words}, "long" if words > 100 else "short"

    if __name__ == "__main__":
        plugin.serve()

A handler gets a `Call`: what heddle sent (`params`, `input`, `config`, `node`, ...) and the
ways to ask heddle for things while it runs (`run_tool`, `call_model`, `emit`, `log`). A
middleware handler returns None to let things go on, or a verdict made with `modify`,
`replace`, `reject`, `retry` or `fail`. The manifest still declares what the plugin has.

This module is the plugin side of the protocol, so it uses nothing but the standard library:
it runs in the plugin's process, which under `--safe` sees only heddle's own package.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

PROTOCOL_VERSION = 1
# What heddle asks a store component (heddle.sessions.plugin_store).
STORE_METHODS = ("store.open", "store.get", "store.create", "store.replace", "store.delete", "store.list")

__all__ = ["Call", "HeddleCallError", "Plugin", "SessionBackend", "SessionExists", "SessionMissing", "StoredSession",
           "VersionConflict", "fail", "modify", "proceed", "reject", "replace", "retry"]


# --------------------------------------------------------------------------- verdicts


def proceed() -> dict[str, Any]:
    """Let the call go on unchanged (the same as returning None from a `before` handler)."""
    return {"verdict": "proceed"}


def modify(**fields: Any) -> dict[str, Any]:
    """Go on with a changed value: `input=` (node), `arguments=` (toolCall), `messages=`/`tools=` (modelCall)."""
    return {"verdict": "modify", **fields}


def replace(**fields: Any) -> dict[str, Any]:
    """Use this value instead: `output=` (and `branch=`) for nodes and tools, `response=` for model calls."""
    return {"verdict": "replace", **fields}


def reject(reason: str) -> dict[str, Any]:
    """Refuse before it happens; a refused tool call's reason is what the model sees."""
    return {"verdict": "reject", "reason": reason}


def retry(delay: float = 0, reason: str = "") -> dict[str, Any]:
    """Run the failed node (nodeError) or the model call (modelCall, after) again after `delay` seconds."""
    return {"verdict": "retry", "delay": delay, "reason": reason}


def fail(reason: str) -> dict[str, Any]:
    """Make it fail after it happened."""
    return {"verdict": "fail", "reason": reason}


class HeddleCallError(Exception):
    """heddle answered one of the plugin's requests (runTool, callModel, ...) with an error."""


# --------------------------------------------------------------------------- session stores


@dataclass(frozen=True)
class StoredSession:
    """One session as a store keeps it. `data` is the record's JSON text: keep it verbatim."""

    id: str
    version: int  # 1 when created; each replace adds one
    data: str
    updated: float  # Unix seconds of the last write


class SessionExists(Exception):
    """Raise from `create`: a session of that id exists."""


class SessionMissing(Exception):
    """Raise from `replace`: there is no session of that id."""


class VersionConflict(Exception):
    """Raise from `replace`: the session is at `version`, not at the version asked for."""

    def __init__(self, version: int) -> None:
        super().__init__(f"the session is at version {version}")
        self.version = version


class SessionBackend(Protocol):
    """What a store plugin keeps sessions in (`plugin.store(TYPE, make)`). `replace` must be a
    compare-and-swap: write only if the session is still at `version`, atomically against every
    other writer (other heddle processes use the same store), else raise VersionConflict."""

    def get(self, session_id: str) -> StoredSession | None: ...

    def create(self, session_id: str, data: str) -> StoredSession: ...

    def replace(self, session_id: str, data: str, version: int) -> StoredSession: ...

    def delete(self, session_id: str) -> bool: ...

    def list(self) -> list[StoredSession]: ...


def _stored(s: StoredSession) -> dict[str, Any]:
    return {"id": s.id, "version": s.version, "data": s.data, "updated": s.updated}


class _StoreServer:
    """Answers store.* requests for one store component: one backend per distinct config, each
    called by one thread at a time (so a backend need not be thread-safe)."""

    def __init__(self, make: Callable[[Any], SessionBackend]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._backends: dict[str, SessionBackend] = {}

    def answer(self, call: Call) -> Any:
        key = json.dumps(call.config, sort_keys=True)
        with self._lock:
            backend = self._backends.get(key)
            if backend is None:
                backend = self._backends[key] = self._make(call.config)
            return self._dispatch(backend, call.method, call.params)

    @staticmethod
    def _dispatch(backend: SessionBackend, method: str, params: dict[str, Any]) -> Any:
        sid = params.get("id", "")
        if method == "store.open":
            return {}
        if method == "store.get":
            found = backend.get(sid)
            return {"session": None if found is None else _stored(found)}
        if method == "store.create":
            try:
                made = backend.create(sid, params["data"])
            except SessionExists:
                return {"exists": True}
            return {"created": {"version": made.version, "updated": made.updated}}
        if method == "store.replace":
            try:
                done = backend.replace(sid, params["data"], params["version"])
            except VersionConflict as exc:
                return {"conflict": {"version": exc.version}}
            except SessionMissing:
                return {"missing": True}
            return {"replaced": {"version": done.version, "updated": done.updated}}
        if method == "store.delete":
            return {"deleted": bool(backend.delete(sid))}
        if method == "store.list":
            return {"sessions": [_stored(s) for s in backend.list()]}
        raise ValueError(f"unknown store method {method!r}")


# --------------------------------------------------------------------------- one call


class Call:
    """One call from heddle: what it sent, and the ways to ask heddle back while handling it."""

    def __init__(self, plugin: Plugin, id: int | str, method: str, params: dict[str, Any]) -> None:
        self._plugin = plugin
        self.id = id
        self.method = method
        self.params = params

    # what heddle sent
    @property
    def run(self) -> str | None:
        return self.params.get("run")

    @property
    def component(self) -> str | None:
        return self.params.get("component")

    @property
    def config(self) -> Any:
        """This component's settings (`--plugin-config`), with its schema's defaults filled in."""
        return self.params.get("config")

    @property
    def node(self) -> dict[str, Any]:
        return self.params.get("node") or {}

    @property
    def seam(self) -> str | None:
        return self.params.get("seam")

    @property
    def input(self) -> dict[str, Any]:
        return self.params.get("input") or {}

    @property
    def arguments(self) -> dict[str, Any]:
        return self.params.get("arguments") or {}

    @property
    def idempotency_key(self) -> str | None:
        """A tool call's key in a session: the same when a call lost in a crash is made again (docs/sessions.md)."""
        key = self.params.get("idempotencyKey")
        return key if isinstance(key, str) else None

    @property
    def event(self) -> dict[str, Any]:
        return self.params.get("event") or {}

    @property
    def workspace(self) -> Path | None:
        ws = self.params.get("workspace")
        return Path(ws) if ws else None

    @property
    def state(self) -> dict[str, Any]:
        """A dict kept for this run across calls (per process), e.g. an encoder's running totals;
        dropped once the run's rendering is finished (finishEncode)."""
        return self._plugin.run_state(self.run)

    # asking heddle back; each blocks until heddle answers
    def run_tool(self, name: str, arguments: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run one of the run's tools (needs the runTool capability) and return its output."""
        output: dict[str, Any] = self._ask("runTool", {"name": name, "arguments": arguments or {}})["output"]
        return output

    def call_model(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """Ask the node's model (needs callModel): returns {content, toolCalls, finishReason}."""
        params: dict[str, Any] = {"messages": messages}
        if tools is not None:
            params["tools"] = tools
        answer: dict[str, Any] = self._ask("callModel", params)
        return answer

    def emit(self, name: str, data: Any = None) -> None:
        """Add a `plugin_event` to the run's event stream (needs emitEvent)."""
        self._ask("emitEvent", {"name": name, "data": data})

    def log(self, message: str, level: str = "info") -> None:
        """Add a `plugin_log` event (needs log); `heddle run --verbose` prints it."""
        self._ask("log", {"message": message, "level": level})

    def partial(self, value: Any) -> None:
        """Stream a piece of the answer before it is done: `{"text": ...}` from a node, `{"data": ...}`
        from an encoder."""
        self._plugin._send({"id": self.id, "partial": value})

    def _ask(self, method: str, params: dict[str, Any]) -> Any:
        return self._plugin.request(method, {**params, "for": self.id})


# --------------------------------------------------------------------------- the plugin

Handler = Callable[[Call], Any]


class Plugin:
    """Handlers by what they answer; `serve()` runs them for heddle until it says shutdown."""

    def __init__(self, *, workers: int = 8) -> None:
        self._handlers: dict[tuple[str, ...], Handler] = {}
        self._listed: dict[str, dict[str, Any]] = {}  # the tools listTools answers with (--discover-tools)
        self._workers = workers
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, Future[dict[str, Any]]] = {}  # request id -> heddle's answer
        self._states: dict[Any, dict[str, Any]] = {}
        self._out: BinaryIO | None = None
        self.capabilities: list[str] = []

    # registering
    def _register(self, key: tuple[str, ...]) -> Callable[[Handler], Handler]:
        def add(fn: Handler) -> Handler:
            self._handlers[key] = fn
            return fn

        return add

    def node(self, component_type: str) -> Callable[[Handler], Handler]:
        """Execute a node type: return its output dict, or (output, branch)."""
        return self._register(("execute", component_type))

    def tool(self, name: str, *, description: str | None = None,
             input_schema: dict[str, Any] | None = None) -> Callable[[Handler], Handler]:
        """Answer a tool: return its output dict (`call.arguments` in). One the manifest declares (with
        `componentType`) needs nothing more; given an `input_schema` (and a `description`), the tool is
        also listed when heddle asks which tools the plugin serves (a manifest with "discoverTools": true,
        run with --discover-tools), and needs no entry in the manifest."""
        if input_schema is not None:
            self._listed[name] = {"name": name, "description": description or "", "inputSchema": input_schema}
        elif description is not None:
            raise ValueError(f"tool {name!r}: a description lists the tool, which needs its input_schema too")
        return self._register(("callTool", name))

    def list_tools(self, fn: Callable[[Call], list[dict[str, Any]]]) -> Callable[[Call], list[dict[str, Any]]]:
        """Work out the listing yourself: `fn(call)` returns `[{"name", "description", "inputSchema"}, ...]`
        (instead of the tools given an `input_schema`); answer their calls with `tool(name)` handlers."""
        self._handlers[("listTools",)] = fn
        return fn

    def before(self, component_type: str, seam: str) -> Callable[[Handler], Handler]:
        """Middleware before a seam (node, toolCall, modelCall, agentRound): None or a verdict."""
        return self._register(("before", component_type, seam))

    def after(self, component_type: str, seam: str) -> Callable[[Handler], Handler]:
        """Middleware after a seam (node, nodeError, toolCall, modelCall, agentRound): None or a verdict."""
        return self._register(("after", component_type, seam))

    def encode(self, component_type: str) -> Callable[[Handler], Handler]:
        """Render one event (`call.event`): return the text to write, or None."""
        return self._register(("encode", component_type))

    def finish(self, component_type: str) -> Callable[[Handler], Handler]:
        """End a rendering (`call.params` has `state` or `error`): return the last text, or None."""
        return self._register(("finishEncode", component_type))

    def store(self, component_type: str, make: Callable[[Any], SessionBackend]) -> None:
        """Serve a session store component: `make(config)` gives the SessionBackend for the
        component's settings (called once per distinct settings, on first use)."""
        server = _StoreServer(make)
        for method in STORE_METHODS:
            self._handlers[(method, component_type)] = server.answer

    def run_state(self, run: Any) -> dict[str, Any]:
        with self._lock:
            return self._states.setdefault(run, {})

    # the protocol
    def _send(self, message: dict[str, Any]) -> None:
        data = (json.dumps(message, ensure_ascii=False, separators=(",", ":"), default=str) + "\n").encode("utf-8")
        with self._lock:
            assert self._out is not None, "serve() has not started"
            self._out.write(data)
            self._out.flush()

    def request(self, method: str, params: dict[str, Any]) -> Any:
        """Send heddle a request and wait for its answer (from a handler's thread)."""
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            request_id = next(self._ids)
            self._waiting[request_id] = future
        self._send({"id": request_id, "method": method, "params": params})
        answer = future.result()
        if "error" in answer:
            raise HeddleCallError((answer.get("error") or {}).get("message", "error"))
        return answer.get("result")

    def _lookup(self, method: str, params: dict[str, Any]) -> Handler | None:
        def handler(*parts: Any) -> Handler | None:
            # handlers are registered under names; a missing or non-string one matches none
            names = tuple(p for p in parts if isinstance(p, str))
            return self._handlers.get((method, *names)) if len(names) == len(parts) else None

        component = params.get("component")
        if method in ("before", "after"):
            return handler(component, params.get("seam"))
        if method == "callTool":
            return handler(params.get("tool")) or handler(component)
        if method == "listTools":
            listed = list(self._listed.values())
            return self._handlers.get(("listTools",)) or (lambda call: listed)
        return handler(component)

    def _result(self, method: str, value: Any) -> Any:
        if method == "listTools":
            return {"tools": list(value or [])}
        if method == "execute":
            if isinstance(value, tuple):
                output, branch = value
                return {"output": output, "branch": branch}
            return {"output": value if value is not None else {}}
        if method == "callTool":
            return {"output": value if value is not None else {}}
        if method in ("encode", "finishEncode"):
            return {"data": value} if isinstance(value, str) else (value or {})
        return value

    def _handle(self, message: dict[str, Any]) -> None:
        method, params = message["method"], message.get("params") or {}
        call = Call(self, message["id"], method, params)
        handler = self._lookup(method, params)
        if handler is None:
            if method in ("before", "after"):
                self._send({"id": call.id, "result": None})  # declared but not handled: let it go on
                return
            what = params.get("tool") if method == "callTool" else params.get("component")
            self._send({"id": call.id, "error": {"message": f"this plugin has no {method} handler for {what!r}"}})
            return
        try:
            result = self._result(method, handler(call))
        except Exception as exc:  # noqa: BLE001 - every failure is answered, the trace goes to stderr
            traceback.print_exc(file=sys.stderr)
            self._send({"id": call.id, "error": {"message": f"{type(exc).__name__}: {exc}"}})
            return
        finally:
            if method == "finishEncode":
                with self._lock:
                    self._states.pop(call.run, None)  # the run is over
        self._send({"id": call.id, "result": result})

    def serve(self, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> None:
        """Answer heddle on stdin/stdout until it says shutdown or closes stdin.

        `print()` in a handler goes to stderr: stdout carries protocol messages only.
        """
        source = stdin if stdin is not None else sys.stdin.buffer
        self._out = stdout if stdout is not None else sys.stdout.buffer
        if stdout is None:
            sys.stdout = sys.stderr
        pool = ThreadPoolExecutor(max_workers=self._workers, thread_name_prefix="heddle-plugin")
        try:
            for line in source:
                if not line.strip():
                    continue
                message = json.loads(line)
                if "method" not in message:
                    with self._lock:
                        future = self._waiting.pop(message.get("id"), None)
                    if future is not None and "partial" not in message:
                        future.set_result(message)
                    continue
                method = message["method"]
                if method == "init":
                    self.capabilities = list((message.get("params") or {}).get("capabilities") or [])
                    self._send({"id": message["id"], "result": {"protocol": PROTOCOL_VERSION}})
                elif method == "shutdown":
                    self._send({"id": message["id"], "result": {}})
                    break
                else:
                    pool.submit(self._handle, message)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
            with self._lock:
                waiting, self._waiting = self._waiting, {}
            for future in waiting.values():
                future.set_result({"error": {"message": "heddle closed the connection"}})
        if stdin is None:
            # A handler still waiting on heddle must not keep the process alive once heddle is done.
            sys.stderr.flush()
            os._exit(0)
