"""MCP tools: a document's MCPTools and MCPToolBoxes, reached through the `mcp` package.

When a run starts, heddle opens one session per MCP server configuration the document uses
(the same transport written twice is one server), lists the server's tools, and checks the
document against the listing before any node runs: every MCPTool must be listed, and one that
declares its inputs must declare what the server takes (the same arguments, whatever the
titles and descriptions say). A toolbox offers its agent the listed tools (those its
`tool_filter` names, when it has one). Leaving the run closes every session and stops every
server process, however the run ended.

A stdio server runs like a tool: in a workspace of its own (built as a node's, kept for the
run), with the tool environment (never heddle's own secrets), and under `--safe` inside the
sandbox; each message it prints is read within `--max-response-bytes` (heddle.tools.mcp_stdio), as
each answer and event of a server over HTTP is (`_capped_transport`). A call's error (`isError`)
goes back to the model from an agent and fails a ToolNode.

Sealing starts no server: a bundle seals the document, so the MCPTools' declared inputs are
sealed with it, and the run refuses a server whose listing no longer fits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel

from heddle.agentspec import components as c
from heddle.blocking import Tasks
from heddle.bounded import ACCEPT_ENCODING, BodyError, Decoder, decoder, size_text
from heddle.engine.seams import IDEMPOTENCY_META
from heddle.engine.tracing import REQUEST_HOOKS
from heddle.errors import Overrun, RunError, ToolError, ToolInputError, ToolOverrun, UsageError
from heddle.graph import referenced_tools
from heddle.safeparse import check_finite, loads_json
from heddle.secret_env import header_from_env
from heddle.tools.compat import conflict
from heddle.tools.mcp_stdio import stdio_streams
from heddle.tools.provided import DocumentTools
from heddle.tools.retry import call_retry, with_retries
from heddle.tools.schema import check_arguments, compiled_checker, describe_errors, input_schema
from heddle.workspace.egress_proxy import call_guard
from heddle.workspace.sandbox import confine

if TYPE_CHECKING:
    import httpx2
    import mcp_types
    from mcp import ClientSession

    from heddle.egress import EgressPolicy
    from heddle.engine.context import RunContext
    from heddle.engine.seams import ToolRequest
    from heddle.workspace.egress_proxy import EgressCall
    from heddle.workspace.workspace import Workspace

Transport = c.StdioTransport | c.SSETransport | c.StreamableHTTPTransport

# Listing pages one server may send: a cursor that never ends must not hold the run.
MAX_LIST_PAGES = 100
STDERR_TAIL = 600
CONNECT_TIMEOUT_S = 30.0


# --------------------------------------------------------------------------- what the document uses


@dataclass
class _Server:
    """One server configuration and what the document takes from it."""

    transport: Transport
    tools: dict[str, c.MCPTool] = field(default_factory=dict)
    agent_tools: list[tuple[str, c.MCPTool]] = field(default_factory=list)
    boxes: list[tuple[str, c.MCPToolBox]] = field(default_factory=list)

    @property
    def label(self) -> str:
        t = self.transport
        target = " ".join([t.command, *t.args]) if isinstance(t, c.StdioTransport) else t.url
        return f"MCP server {t.name!r} ({t.component_type} {target})"


def agent_key(agent: c.Agent) -> str:
    """The agent's key in `DocumentTools.by_agent`: its id, else its name."""
    return agent.id or agent.name


def _server_key(transport: Transport) -> str:
    return json.dumps(transport.model_dump(mode="json", exclude={"id", "name", "description", "metadata"}),
                      sort_keys=True)


def _components(value: Any, agent: c.Agent | None,
                found: list[tuple[c.Agent | None, c.MCPTool | c.MCPToolBox]]) -> None:
    if isinstance(value, c.MCPTool | c.MCPToolBox):
        found.append((agent, value))
        return
    # An edge's nodes are the flow's own (the graph check says so), and so is its start node.
    if isinstance(value, c.ControlFlowEdge | c.DataFlowEdge):
        return
    if isinstance(value, c.Agent):
        agent = value
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            if name not in ("metadata", "start_node"):
                _components(getattr(value, name), agent, found)
    elif isinstance(value, list | tuple):
        for item in value:
            _components(item, agent, found)
    elif isinstance(value, dict):
        for item in value.values():
            _components(item, agent, found)


def _servers(flow: c.Flow) -> dict[str, _Server]:
    found: list[tuple[c.Agent | None, c.MCPTool | c.MCPToolBox]] = []
    _components(flow, None, found)
    servers: dict[str, _Server] = {}
    agents: dict[str, c.Agent] = {}
    for agent, component in found:
        transport = component.client_transport
        server = servers.setdefault(_server_key(transport), _Server(transport))
        if agent is not None:
            key = agent_key(agent)
            seen = agents.setdefault(key, agent)
            if seen is not agent and _mcp_of(seen) != _mcp_of(agent):
                raise UsageError(f"two agents have the key {key!r} (no id, the same name) and different MCP tools; "
                                 "give each agent its own id")
        if isinstance(component, c.MCPTool):
            other = server.tools.setdefault(component.name, component)
            # One tool of one server is called one way in a run: the same declared inputs (where
            # they are declared) and outputs; ids and descriptions may differ.
            if other is not component:
                if other.outputs != component.outputs or other.retry_policy != component.retry_policy or (
                        other.declares_inputs() and component.declares_inputs() and other.inputs != component.inputs):
                    raise UsageError(f"MCPTool {component.name!r} of {server.label} is declared twice with different "
                                     "inputs, outputs or retry_policy; declare it the same way everywhere")
                if component.declares_inputs() and not other.declares_inputs():
                    server.tools[component.name] = component
            if agent is not None:
                server.agent_tools.append((agent_key(agent), component))
        elif agent is not None:
            server.boxes.append((agent_key(agent), component))
    return servers


def _mcp_of(agent: c.Agent) -> list[Any]:
    return [t.model_dump() for t in agent.tools if isinstance(t, c.MCPTool)] + [b.model_dump() for b in agent.toolboxes]


def transports_of(flow: c.Flow) -> Iterator[tuple[str, Transport]]:
    """(label, transport) of every MCP server the flow (its subflows, its agents) uses, each once."""
    for server in _servers(flow).values():
        yield server.label, server.transport


# --------------------------------------------------------------------------- schemas

# JSON Schema's meta-data vocabulary (and comments): what a schema says about a value, not what
# it admits. Two schemas that differ only there take the same arguments.
_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                          "$comment", "$schema"})
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_LITERAL = frozenset({"enum", "const"})


def _bare(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_bare(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key in _LITERAL:
            out[key] = value
        elif key in _NAMED and isinstance(value, dict):
            out[key] = {name: _bare(sub) for name, sub in value.items()}
        else:
            out[key] = _bare(value)
    return out


def argument_shape(schema: dict[str, Any]) -> dict[str, Any]:
    """What arguments an input schema admits, as far as Agent Spec inputs can say it: its
    properties without their annotations, and which are required."""
    properties = schema.get("properties") or {}
    return {"properties": {name: _bare(prop) for name, prop in properties.items()},
            "required": sorted(schema.get("required") or [])}


def _listed_schema(tool: mcp_types.Tool) -> dict[str, Any]:
    schema = dict(tool.input_schema or {})
    schema.setdefault("type", "object")
    return schema


def _checked_schema(where: str, declared: c.MCPTool | c.MCPToolSpec, listed: mcp_types.Tool,
                    label: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The schema the tool's arguments are checked against (the declared one when the document gives
    the inputs, and some argument it may send could be taken by the server; else the server's), and
    the server's, which each call is checked against too, where the two differ."""
    served = _listed_schema(listed)
    outputs = _output_conflict(declared, listed)
    if outputs is not None:
        raise RunError(f"{where}: {label} lists tool {declared.name!r} with results the document's outputs cannot "
                       f"take ({outputs}); update the document's outputs or the server")
    if not declared.declares_inputs():
        return served, None
    schema = input_schema(declared)
    problem = _input_conflict(schema, served)
    if problem is not None:
        raise RunError(f"{where}: {label} lists tool {declared.name!r} with inputs that cannot take anything the "
                       f"document may send ({problem}); update the document's inputs or the server")
    return schema, served


def _input_conflict(schema: dict[str, Any], served: dict[str, Any]) -> str | None:
    """Where no arguments the declared `schema` admits could be taken by the server's (a narrower
    difference is left to each call, as the server itself would judge it)."""
    # A declared input with a default is always sent (the default filled in), and nothing else is.
    sent = {**schema, "required": list(schema["properties"]), "additionalProperties": False}
    problem = conflict(sent, served)
    if problem is None:
        return None
    return f"{problem}; declared {json.dumps(argument_shape(schema), sort_keys=True)}, listed " \
           f"{json.dumps(argument_shape(served), sort_keys=True)}"


def _output_conflict(declared: c.MCPTool | c.MCPToolSpec, listed: mcp_types.Tool) -> str | None:
    """Where no result the server's output schema admits could fit the output of the same name the
    document declares (each result is checked against the outputs as it comes)."""
    given = (listed.output_schema or {}).get("properties") or {}
    for prop in declared.outputs:
        title = prop["title"]
        if title in given:
            problem = conflict(prop, given[title], title)
            if problem is not None:
                return problem
    return None


def _definition(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


# --------------------------------------------------------------------------- results


def _text_of(tool: str, result: mcp_types.CallToolResult) -> str:
    parts: list[str] = []
    for block in result.content:
        kind = getattr(block, "type", None)
        if kind == "text":
            parts.append(block.text)  # type: ignore[union-attr]
        elif kind == "resource" and isinstance(getattr(block.resource, "text", None), str):  # type: ignore[union-attr]
            parts.append(block.resource.text)  # type: ignore[union-attr]
        else:
            raise ToolError(tool, f"the MCP server answered with {kind} content, which heddle passes on only as text")
    return "".join(parts)


def _fits(prop: dict[str, Any], value: Any) -> bool:
    import jsonschema

    return bool(jsonschema.Draft202012Validator(_bare({k: v for k, v in prop.items() if k != "title"}))
                .is_valid(value))


def _single_output(tool: str, prop: dict[str, Any], structured: Any, text: str) -> Any:
    title = prop["title"]
    candidates: list[Callable[[], Any]] = []
    if isinstance(structured, dict):
        if title in structured:
            candidates.append(lambda: structured[title])
        if set(structured) == {"result"}:
            # MCP results are objects: a tool's other values come wrapped as {"result": value}.
            candidates.append(lambda: structured["result"])
        candidates.append(lambda: structured)
    candidates.append(lambda: text)
    candidates.append(lambda: loads_json(text))
    for candidate in candidates:
        try:
            value = candidate()
        except ValueError:
            continue
        if _fits(prop, value):
            return value
    kind = prop.get("type", "the declared type")
    raise ToolError(tool, f"the MCP server's answer does not fit output {title!r} ({kind}): {text[:200]!r}")


def _outputs(tool: str, declared: list[dict[str, Any]], result: mcp_types.CallToolResult) -> dict[str, Any]:
    """The call's result as the tool's declared outputs (checked against their types); without
    declared outputs, the structured result or {"result": text}."""
    structured = result.structured_content
    try:
        check_finite(structured)  # read by the MCP library's own parser, which takes NaN
    except ValueError as exc:
        raise ToolError(tool, f"the MCP server's structured answer {exc}") from None
    text = _text_of(tool, result)
    if not declared:
        return dict(structured) if isinstance(structured, dict) else {"result": text}
    if len(declared) == 1:
        return {declared[0]["title"]: _single_output(tool, declared[0], structured, text)}
    source: Any = structured
    if not isinstance(source, dict):
        try:
            source = loads_json(text)
        except ValueError:
            source = None
    if isinstance(source, dict) and set(source) == {"result"} and isinstance(source["result"], list):
        values = source["result"]
        if len(values) == len(declared):
            source = {p["title"]: v for p, v in zip(declared, values, strict=True)}
    if not isinstance(source, dict):
        raise ToolError(tool, f"the MCP server's answer is not an object with the outputs "
                              f"{[p['title'] for p in declared]}: {text[:200]!r}")
    out: dict[str, Any] = {}
    for prop in declared:
        title = prop["title"]
        if title in source:
            value = source[title]
        elif "default" in prop:
            value = prop["default"]
        else:
            raise ToolError(tool, f"the MCP server's answer has no output {title!r}")
        if not _fits(prop, value):
            raise ToolError(tool, f"the MCP server's output {title!r} is not {prop.get('type', 'of its type')}: "
                                  f"{json.dumps(value)[:200]}")
        out[title] = value
    return out


# --------------------------------------------------------------------------- sessions


def _describe(exc: BaseException) -> str:
    """The first real cause in what the transports raise (task groups wrap it)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        inner = [e for e in exc.exceptions if not isinstance(e, asyncio.CancelledError)]
        exc = (inner or list(exc.exceptions))[0]
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _tail(errlog: TextIO | None) -> str:
    if errlog is None:
        return ""
    try:
        errlog.flush()
        errlog.seek(0, os.SEEK_END)
        size = errlog.tell()
        errlog.seek(max(0, size - STDERR_TAIL * 4))
        lines = [line.strip() for line in errlog.read().splitlines() if line.strip()]
    except (OSError, ValueError):
        return ""
    return f" (its stderr: {lines[-1][-STDERR_TAIL:]})" if lines else ""


class ServerOverrun(RunError, Overrun):
    """An MCP server's message past its cap while its session opened or listed its tools."""


class _Session:
    """One open session, held by a task of its own: the transports' task groups then never see the
    run's own errors, and the run's tasks call the session as they like."""

    def __init__(self, label: str, streams: Callable[[], contextlib.AbstractAsyncContextManager[Any]],
                 read_timeout: float, errlog: TextIO | None) -> None:
        self.label = label
        self._streams = streams
        self._read_timeout = read_timeout
        self.errlog = errlog
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.session: ClientSession | None = None
        self.tools: dict[str, mcp_types.Tool] = {}
        # Answers the capped transport refused (the mcp package reports them only as a broken stream).
        self.overruns: list[str] = []

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        try:
            async with self._streams() as streams, ClientSession(
                    streams[0], streams[1], read_timeout_seconds=self._read_timeout) as session:
                await session.initialize()
                self.tools = await _list_tools(session)
                self.session = session
                ready.set_result(None)
                await self._stop.wait()
        except Exception as exc:  # noqa: BLE001 - whatever the transport raised is the server's failure
            if not ready.done():
                ready.set_exception(exc)

    async def start(self, tasks: Tasks) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = tasks.start(self._hold(ready))
        try:
            async with asyncio.timeout(max(CONNECT_TIMEOUT_S, self._read_timeout)):
                await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise RunError(f"{self.label} did not answer within {max(CONNECT_TIMEOUT_S, self._read_timeout):g} s"
                           f"{_tail(self.errlog)}") from None
        if not ready.done():
            raise RunError(f"{self.label} closed the connection before it was ready{_tail(self.errlog)}")
        exc = ready.exception()
        if exc is not None and self.overruns:
            raise ServerOverrun(self.overruns.pop()) from None
        if exc is not None:
            raise RunError(f"{self.label} could not be reached: {_describe(exc)}{_tail(self.errlog)}")

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is None:
            return
        if not task.done():
            try:
                # Shielded: a cancelled run still waits for the server to be stopped (the transport bounds it).
                await asyncio.shield(task)
            except asyncio.CancelledError:
                await asyncio.wait({task})
                raise
        if not task.cancelled():
            task.exception()  # a session that failed after the run: nothing is left to report it to

    async def relist(self) -> None:
        """Ask the server for its tools again."""
        if self.session is None:
            return
        try:
            self.tools = await _list_tools(self.session)
        except Exception as exc:  # noqa: BLE001 - whatever the transport raised is the server's failure
            if self.overruns:
                raise ServerOverrun(self.overruns.pop()) from None
            raise RunError(f"{self.label} could not list its tools: {_describe(exc)}{_tail(self.errlog)}") from None

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float | None,
                   timeout_text: str, retry_policy: c.RetryPolicy | None = None,
                   idempotency_key: str | None = None) -> mcp_types.CallToolResult:
        # A session's step carries its idempotency key in `_meta`; every retry of the call carries the same.
        meta: Any = {IDEMPOTENCY_META: idempotency_key} if idempotency_key is not None else None

        session = self.session
        if session is None or self._task is None or self._task.done():
            raise ToolError(tool, f"{self.label} is no longer connected{_tail(self.errlog)}")
        try:
            async with asyncio.timeout(timeout):
                return await with_retries(retry_policy, lambda: session.call_tool(tool, arguments, meta=meta),
                                          lambda exc: call_retry(retry_policy, exc) if retry_policy else (False, None))
        except TimeoutError:
            raise ToolError(tool, timeout_text) from None
        except Exception as exc:  # noqa: BLE001 - a broken connection is the call's failure, reported as such
            if self.overruns:
                raise ToolOverrun(tool, self.overruns.pop()) from None
            raise ToolError(tool, f"{self.label} failed the call: {_describe(exc)}{_tail(self.errlog)}") from None


async def _list_tools(session: ClientSession) -> dict[str, mcp_types.Tool]:
    import mcp_types

    tools: dict[str, mcp_types.Tool] = {}
    cursor: str | None = None
    for _ in range(MAX_LIST_PAGES):
        params = mcp_types.PaginatedRequestParams(cursor=cursor) if cursor else None
        result = await session.list_tools(params=params)
        for tool in result.tools:
            tools.setdefault(tool.name, tool)
        cursor = result.next_cursor
        if not cursor:
            return tools
    raise RunError(f"the MCP server's tool list goes on past {MAX_LIST_PAGES} pages")


def _header_values(transport: c.SSETransport | c.StreamableHTTPTransport, label: str) -> dict[str, str]:
    headers: dict[str, str] = {}
    for name, value in {**(transport.headers or {}), **(transport.sensitive_headers or {})}.items():
        variable = c.env_reference(value)
        if variable is None:
            headers[name] = value
            continue
        headers[name] = header_from_env(label, name, variable, os.environ)
    return headers


# An event of a stream ends at a blank line: two line endings in a row, each CRLF, LF or CR (a
# CRLF is one ending, never split in two).
_BLANK_LINE = re.compile(rb"(?>\r\n|\r|\n)(?>\r\n|\r|\n)")


def _capped_transport(inner: httpx2.AsyncBaseTransport, cap: int, label: str,
                      overruns: list[str]) -> httpx2.AsyncBaseTransport:
    """`inner` with every answer decoded here (heddle.bounded) within `cap` bytes: a JSON answer in
    all, an event stream per event (a session's stream lives as long as the session). Each refusal
    is also put in `overruns`."""
    import httpx2


    class Capped(httpx2.AsyncByteStream):
        def __init__(self, raw: httpx2.AsyncByteStream, decode: Decoder, per_event: bool) -> None:
            self._raw, self._decode, self._per_event = raw, decode, per_event

        async def __aiter__(self) -> AsyncIterator[bytes]:
            count, tail = 0, b""
            async for raw in self._raw:
                for piece in self._decode.feed(raw):
                    count = self._counted(count, tail, piece)
                    tail = (tail + piece)[-3:]
                    yield piece
            for piece in self._decode.end():
                count = self._counted(count, tail, piece)
                tail = (tail + piece)[-3:]
                yield piece

        def _counted(self, count: int, tail: bytes, piece: bytes) -> int:
            # Each event this piece ends is held to the cap, and what follows the last one counts anew.
            data, at = tail + piece, len(tail)  # `at`: what is counted of `data` so far
            for match in _BLANK_LINE.finditer(data) if self._per_event else ():
                if match.end() > at:
                    self._within(count + match.end() - at)
                    count, at = 0, match.end()
            return self._within(count + len(data) - at)

        def _within(self, count: int) -> int:
            if count > cap:
                what = "one event of its stream" if self._per_event else "its answer"
                overruns.append(f"{label}: {what} is over {size_text(cap)} once decoded (raise "
                                "--max-response-bytes if it needs more)")
                raise httpx2.ReadError(overruns[-1])
            return count

        async def aclose(self) -> None:
            await self._raw.aclose()

    class Transport(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            response = await inner.handle_async_request(request)
            try:
                decode = decoder(response.headers.get("content-encoding", ""), label)
            except BodyError as exc:
                await response.aclose()
                overruns.append(exc.message)
                raise httpx2.ReadError(exc.message) from None
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            per_event = "text/event-stream" in response.headers.get("content-type", "")
            headers = [(k, v) for k, v in response.headers.raw if k.lower() not in (b"content-encoding",
                                                                                     b"content-length")]
            return httpx2.Response(response.status_code, headers=headers, request=request,
                                   stream=Capped(response.stream, decode, per_event), extensions=response.extensions)

        async def aclose(self) -> None:
            await inner.aclose()

    return Transport()


def _http_client_factory(transport: c.SSETransport | c.StreamableHTTPTransport, cap: int, label: str,
                         overruns: list[str], egress: EgressPolicy | None = None) -> Callable[..., httpx2.AsyncClient]:
    import httpx2

    verify: Any = True
    if isinstance(transport, c.SSEmTLSTransport | c.StreamableHTTPmTLSTransport):
        import ssl

        try:
            context = ssl.create_default_context(cafile=transport.ca_file)
            context.load_cert_chain(transport.cert_file, transport.key_file)
        except (OSError, ssl.SSLError) as exc:
            raise UsageError(f"{transport.component_type} {transport.name!r}: cannot load its certificates: "
                             f"{_describe(exc)}") from None
        verify = context

    def factory(headers: dict[str, str] | None = None, timeout: httpx2.Timeout | None = None,
                auth: httpx2.Auth | None = None) -> httpx2.AsyncClient:
        # trust_env off: the document names its server; proxy variables must not reroute it. Its answers
        # are decoded by the capped transport, which asks only for what it decodes so.
        inner = httpx2.AsyncHTTPTransport(verify=verify, trust_env=False)
        hooks = dict(REQUEST_HOOKS)
        if egress is not None:  # each request and redirect hop to a host the transport's list admits
            hooks["request"] = [*hooks["request"], egress.hook(transport.name, httpx2.ConnectError)]
        return httpx2.AsyncClient(headers={"Accept-Encoding": ACCEPT_ENCODING, **(headers or {})}, timeout=timeout,
                                  auth=auth, trust_env=False, transport=_capped_transport(inner, cap, label, overruns),
                                  event_hooks=hooks)

    return factory


def _remote_streams(transport: c.SSETransport | c.StreamableHTTPTransport, label: str, cap: int,
                    overruns: list[str], egress: EgressPolicy | None = None
                    ) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
    import httpx2

    headers = _header_values(transport, label)
    factory = _http_client_factory(transport, cap, label, overruns, egress)
    read = transport.session_parameters.read_timeout_seconds
    if isinstance(transport, c.SSETransport):
        from mcp.client.sse import sse_client

        return lambda: sse_client(transport.url, headers=headers, timeout=CONNECT_TIMEOUT_S, sse_read_timeout=read,
                                  httpx_client_factory=factory)

    @contextlib.asynccontextmanager
    async def streams() -> AsyncIterator[Any]:
        from mcp.client.streamable_http import streamable_http_client

        async with factory(headers=headers, timeout=httpx2.Timeout(CONNECT_TIMEOUT_S, read=read)) as client, \
                streamable_http_client(transport.url, http_client=client) as opened:
            yield opened

    return streams


def _stdio_streams(ctx: RunContext, transport: c.StdioTransport, workspace: Workspace, errlog: TextIO, label: str,
                   overruns: list[str], egress: EgressCall | None = None
                   ) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
    cwd = Path(workspace.root, transport.cwd or "")
    if not cwd.is_dir():
        raise RunError(f"StdioTransport {transport.name!r}: cwd {transport.cwd!r} is not a folder in the server's "
                       "workspace (mount one there)")
    argv, env = confine(ctx.options.sandbox, [transport.command, *transport.args], workspace=workspace,
                        tools_dir=ctx.tools_dir, env=workspace.env(os.environ), egress=egress)
    if ctx.options.sandbox.safe:
        # The sandbox starts in the workspace; the transport's cwd is a folder inside it.
        at = argv.index("--chdir")
        argv[at + 1] = str(cwd)
    # The document's own values, sealed with it (never the host's).
    env.update(transport.env or {})
    cap = ctx.options.max_response_bytes
    overrun = (f"{label}: a message on its stdout is over {size_text(cap)} (raise "
               f"{ctx.options.surface.flag('max_response_bytes')} if it needs more); the server was stopped")
    return lambda: stdio_streams(argv, env=env, cwd=str(cwd), errlog=errlog, cap=cap, overrun=overrun,
                                 overruns=overruns)


@contextlib.asynccontextmanager
async def _opened(ctx: RunContext, server: _Server) -> AsyncIterator[_Session]:
    transport = server.transport
    read_timeout = transport.session_parameters.read_timeout_seconds
    async with contextlib.AsyncExitStack() as stack:
        errlog: TextIO | None = None
        overruns: list[str] = []
        if isinstance(transport, c.StdioTransport):
            workspace = await stack.enter_async_context(ctx.workspaces.enter(f"mcp-{transport.name or 'server'}"))
            # The server's stderr, for the errors that name it; unlinked, gone when the run ends.
            errlog = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))  # noqa: SIM115
            # Under --safe with an allow-list, the server's one way out is a proxy holding it to the list declared
            # for its transport's name, for as long as the session lasts.
            egress = await stack.enter_async_context(call_guard(ctx.options, transport.name, ctx.emit))
            streams = _stdio_streams(ctx, transport, workspace, errlog, server.label, overruns, egress)
        else:
            streams = _remote_streams(transport, server.label, ctx.options.max_response_bytes, overruns,
                                      ctx.options.egress)
        # The session's task, whatever `close` left of it, is stopped before its workspace is removed.
        tasks = Tasks()
        stack.push_async_callback(tasks.aclose)
        session = _Session(server.label, streams, read_timeout, errlog)
        session.overruns = overruns
        try:
            await session.start(tasks)
            yield session
        finally:
            await session.close()


# --------------------------------------------------------------------------- the tools a run is given


@dataclass
class McpProvidedTool:
    """One listed tool of an open session, as the engine calls it."""

    name: str
    session: _Session
    schema: dict[str, Any]
    outputs: list[dict[str, Any]]
    timeout: float | None
    timeout_text: str
    retry_policy: c.RetryPolicy | None = None
    served: dict[str, Any] | None = None  # the server's input schema, where the document declares its own

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        filled, problem = check_arguments(self.schema, arguments)
        if problem is not None or filled is None:
            raise ToolInputError(self.name, f"the arguments do not match its input schema: {problem}")
        served = self.served
        errors = compiled_checker(served)(filled) if served is not None else []
        if served is not None and errors:
            # Not sent: the server's schema refuses it, as the server itself would.
            path = min(e[0] for e in errors)
            name = path[0] if path else None
            mine, theirs = ((self.schema["properties"].get(name), (served.get("properties") or {}).get(name))
                            if isinstance(name, str) else (argument_shape(self.schema), argument_shape(served)))
            what = f"argument {name!r}" if isinstance(name, str) else "the arguments"
            raise ToolInputError(self.name, f"the server's input schema refuses {what} ({describe_errors(errors)}); "
                                            f"the document declares {json.dumps(_bare(mine), sort_keys=True)}, "
                                            f"the server lists {json.dumps(_bare(theirs), sort_keys=True)}")
        return filled

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        result = await self.session.call(self.name, request.arguments, self.timeout, self.timeout_text,
                                         self.retry_policy, request.idempotency_key)
        if result.is_error:
            text = "".join(getattr(b, "text", "") for b in result.content).strip()
            raise ToolError(self.name, f"the MCP server answered with an error: {text or '(no message)'}")
        return _outputs(self.name, self.outputs, result)


def _provide(ctx: RunContext, server: _Server, session: _Session, found: DocumentTools,
             owners: dict[str, str]) -> None:
    timeout = ctx.options.tool_timeout
    timeout_text = (f"timed out after {ctx.options.surface.duration(timeout)} (raise "
                    f"{ctx.options.surface.flag('tool_timeout')} if it needs longer)") if timeout else ""
    label = server.label

    def offer(name: str, schema: dict[str, Any], outputs: list[dict[str, Any]], policy: c.RetryPolicy | None,
              served: dict[str, Any] | None) -> None:
        owner = owners.setdefault(name, label)
        if owner != label:
            raise UsageError(f"tool {name!r} is offered by {owner} and by {label}; heddle calls tools by name, so a "
                             "run can take it from one server only (leave it out of a toolbox with tool_filter)")
        if ctx.seams.tool(name) is not None:
            raise UsageError(f"tool {name!r} of {label} has the name of a plugin's tool; rename one of them")
        offered = found.tools.setdefault(name, McpProvidedTool(name, session, schema, outputs, timeout, timeout_text,
                                                               policy, served))
        if isinstance(offered, McpProvidedTool) and offered.retry_policy != policy:
            raise UsageError(f"tool {name!r} of {label} is given two different retry_policy values (by an MCPTool "
                             "and an MCPToolBox, or two toolboxes); heddle calls a tool one way in a run, so give "
                             "them the same")

    def listed(name: str, where: str) -> mcp_types.Tool:
        tool = session.tools.get(name)
        if tool is None:
            names = ", ".join(sorted(session.tools)) or "none"
            raise RunError(f"{where}: {label} lists no tool {name!r} (it lists: {names})")
        return tool

    schemas: dict[str, dict[str, Any]] = {}
    for name, tool in server.tools.items():
        where = f"MCPTool {name!r}"
        schemas[name], served = _checked_schema(where, tool, listed(name, where), label)
        offer(name, schemas[name], tool.outputs, tool.retry_policy, served)
    for agent, tool in server.agent_tools:
        description = tool.description or session.tools[tool.name].description or ""
        found.by_agent.setdefault(agent, []).append(_definition(tool.name, description, schemas[tool.name]))
    for agent, box in server.boxes:
        where = f"MCPToolBox {box.name!r}"
        entries: list[c.MCPToolSpec | str] = list(session.tools) if box.tool_filter is None else box.tool_filter
        for entry in entries:
            name = entry if isinstance(entry, str) else entry.name
            found_tool = listed(name, where)
            if isinstance(entry, str):
                schema, served = _listed_schema(found_tool), None
                outputs, description = [], found_tool.description or ""
            else:
                schema, served = _checked_schema(f"{where} tool_filter {name!r}", entry, found_tool, label)
                outputs, description = entry.outputs, entry.description or found_tool.description or ""
            offer(name, schema, outputs, box.retry_policy, served)
            found.by_agent.setdefault(agent, []).append(_definition(name, description, schema))
            if box.requires_confirmation or (not isinstance(entry, str) and entry.requires_confirmation):
                found.confirm.setdefault(agent, set()).add(name)


class _Missing(Exception):
    pass


async def _find(server: _Server, session: _Session) -> None:
    """The listing asked for again while a tool that a component with a retry_policy names is missing
    from it (heddle.tools.retry). The session's first listing is the first attempt; a component
    without a policy is held to it, so none is retried when one of those is missing (`_provide`
    names it)."""
    def names(box: c.MCPToolBox) -> list[str]:
        return [e if isinstance(e, str) else e.name for e in box.tool_filter or []]

    wanted = [(t.retry_policy, [name]) for name, t in server.tools.items() if t.retry_policy is not None]
    wanted += [(b.retry_policy, names(b)) for _, b in server.boxes if b.retry_policy is not None and b.tool_filter]
    held = [name for name, t in server.tools.items() if t.retry_policy is None]
    held += [name for _, b in server.boxes if b.retry_policy is None for name in names(b)]
    if any(name not in session.tools for name in held):
        return
    def attempts(expected: list[str]) -> Callable[[], Awaitable[None]]:
        asked = False

        async def attempt() -> None:
            nonlocal asked
            if asked:
                await session.relist()
            asked = True
            if any(name not in session.tools for name in expected):
                raise _Missing()

        return attempt

    for policy, expected in wanted:
        with contextlib.suppress(_Missing):
            await with_retries(policy, attempts(expected), lambda exc: (isinstance(exc, _Missing), None))


class McpKind:
    """The MCP tools of a document (heddle.tools.provided)."""

    def wants(self, flow: c.Flow) -> bool:
        return bool(_servers(flow))

    @contextlib.asynccontextmanager
    async def open(self, ctx: RunContext, flow: c.Flow) -> AsyncIterator[DocumentTools]:
        servers = _servers(flow)
        found = DocumentTools()
        owners: dict[str, str] = dict.fromkeys(referenced_tools(flow), "the document's ServerTool")
        async with contextlib.AsyncExitStack() as stack:
            for server in servers.values():
                session = await stack.enter_async_context(_opened(ctx, server))
                await _find(server, session)
                _provide(ctx, server, session, found, owners)
            for agent, definitions in found.by_agent.items():
                unique = {d["function"]["name"]: d for d in definitions}
                found.by_agent[agent] = list(unique.values())
            yield found


KIND = McpKind()
