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
sandbox. A call's error (`isError`) goes back to the model from an agent and fails a ToolNode.

Sealing starts no server: a bundle seals the document, so the MCPTools' declared inputs are
sealed with it, and the run refuses a server whose listing no longer fits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from pydantic import BaseModel

from heddle.errors import RunError, ToolError, ToolInputError, UsageError
from heddle.secret_env import header_from_env
from heddle.spec import components as c
from heddle.tools.provided import DocumentTools

if TYPE_CHECKING:
    import httpx2
    import mcp_types
    from mcp import ClientSession

    from heddle.engine.context import RunContext
    from heddle.engine.seams import ToolRequest
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
                if other.outputs != component.outputs or (
                        other.declares_inputs() and component.declares_inputs() and other.inputs != component.inputs):
                    raise UsageError(f"MCPTool {component.name!r} of {server.label} is declared twice with different "
                                     "inputs or outputs; declare it the same way everywhere")
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


def _shape_difference(declared: dict[str, Any], listed: dict[str, Any]) -> str:
    names = sorted(set(declared["properties"]) | set(listed["properties"]))
    for name in names:
        if name not in listed["properties"]:
            return f"the server takes no input {name!r}"
        if name not in declared["properties"]:
            return f"the document does not declare the server's input {name!r}"
        if declared["properties"][name] != listed["properties"][name]:
            return (f"input {name!r} is {json.dumps(declared['properties'][name], sort_keys=True)} in the document "
                    f"but {json.dumps(listed['properties'][name], sort_keys=True)} on the server")
    return f"the required inputs are {declared['required']} in the document but {listed['required']} on the server"


def _listed_schema(tool: mcp_types.Tool) -> dict[str, Any]:
    schema = dict(tool.input_schema or {})
    schema.setdefault("type", "object")
    return schema


def _checked_schema(where: str, declared: c.MCPTool | c.MCPToolSpec, listed: mcp_types.Tool,
                    label: str) -> dict[str, Any]:
    """The schema the tool's arguments are checked against: the declared one when the document gives
    the inputs (and the server takes the same), else the server's."""
    from heddle.canonical import fingerprint
    from heddle.tools.schema import input_schema

    served = _listed_schema(listed)
    if not declared.declares_inputs():
        return served
    schema = input_schema(declared)
    ours, theirs = argument_shape(schema), argument_shape(served)
    if ours != theirs:
        raise RunError(f"{where}: {label} lists tool {declared.name!r} with other inputs than the document declares "
                       f"({_shape_difference(ours, theirs)}; argument fingerprints {fingerprint(ours)} declared, "
                       f"{fingerprint(theirs)} listed); update the document's inputs or the server")
    return schema


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
    candidates.append(lambda: json.loads(text))
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
    text = _text_of(tool, result)
    if not declared:
        return dict(structured) if isinstance(structured, dict) else {"result": text}
    if len(declared) == 1:
        return {declared[0]["title"]: _single_output(tool, declared[0], structured, text)}
    source: Any = structured
    if not isinstance(source, dict):
        try:
            source = json.loads(text)
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

    async def start(self) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready))
        try:
            async with asyncio.timeout(max(CONNECT_TIMEOUT_S, self._read_timeout)):
                await asyncio.wait({ready, self._task}, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            raise RunError(f"{self.label} did not answer within {max(CONNECT_TIMEOUT_S, self._read_timeout):g} s"
                           f"{_tail(self.errlog)}") from None
        if not ready.done():
            raise RunError(f"{self.label} closed the connection before it was ready{_tail(self.errlog)}")
        exc = ready.exception()
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

    async def call(self, tool: str, arguments: dict[str, Any], timeout: float | None,
                   timeout_text: str) -> mcp_types.CallToolResult:
        if self.session is None or self._task is None or self._task.done():
            raise ToolError(tool, f"{self.label} is no longer connected{_tail(self.errlog)}")
        try:
            async with asyncio.timeout(timeout):
                return await self.session.call_tool(tool, arguments)
        except TimeoutError:
            raise ToolError(tool, timeout_text) from None
        except Exception as exc:  # noqa: BLE001 - a broken connection is the call's failure, reported as such
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


def _http_client_factory(transport: c.SSETransport | c.StreamableHTTPTransport) -> Callable[..., httpx2.AsyncClient]:
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
        # trust_env off: the document names its server; proxy variables must not reroute it.
        return httpx2.AsyncClient(headers=headers, timeout=timeout, auth=auth, verify=verify, trust_env=False)

    return factory


def _remote_streams(transport: c.SSETransport | c.StreamableHTTPTransport,
                    label: str) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
    import httpx2

    headers = _header_values(transport, label)
    factory = _http_client_factory(transport)
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


def _stdio_streams(ctx: RunContext, transport: c.StdioTransport, workspace: Workspace,
                   errlog: TextIO) -> Callable[[], contextlib.AbstractAsyncContextManager[Any]]:
    from mcp.client.stdio import StdioServerParameters, get_default_environment, stdio_client

    from heddle.workspace.sandbox import confine

    cwd = Path(workspace.root, transport.cwd or "")
    if not cwd.is_dir():
        raise RunError(f"StdioTransport {transport.name!r}: cwd {transport.cwd!r} is not a folder in the server's "
                       "workspace (mount one there)")
    argv, env = confine(ctx.options.sandbox, [transport.command, *transport.args], workspace=workspace,
                        tools_dir=ctx.tools_dir, env=workspace.env(os.environ))
    if ctx.options.sandbox.safe:
        # The sandbox starts in the workspace; the transport's cwd is a folder inside it.
        at = argv.index("--chdir")
        argv[at + 1] = str(cwd)
        # The mcp package adds a few of heddle's own variables (USER, SHELL, ...) to any environment
        # it is given; inside the sandbox only the sandbox's list may be set.
        extra = sorted(set(get_default_environment()) - set(env))
        argv[1:1] = [arg for name in extra for arg in ("--unsetenv", name)]
    # The document's own values, sealed with it (never the host's).
    env.update(transport.env or {})
    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(cwd))
    return lambda: stdio_client(params, errlog=errlog)


@contextlib.asynccontextmanager
async def _opened(ctx: RunContext, server: _Server) -> AsyncIterator[_Session]:
    transport = server.transport
    read_timeout = transport.session_parameters.read_timeout_seconds
    async with contextlib.AsyncExitStack() as stack:
        errlog: TextIO | None = None
        if isinstance(transport, c.StdioTransport):
            workspace = await stack.enter_async_context(ctx.workspaces.enter(f"mcp-{transport.name or 'server'}"))
            # The server's stderr, for the errors that name it; unlinked, gone when the run ends.
            errlog = stack.enter_context(tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace"))  # noqa: SIM115
            streams = _stdio_streams(ctx, transport, workspace, errlog)
        else:
            streams = _remote_streams(transport, server.label)
        session = _Session(server.label, streams, read_timeout, errlog)
        try:
            await session.start()
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

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        from heddle.tools.schema import check_arguments

        filled, problem = check_arguments(self.schema, arguments)
        if problem is not None or filled is None:
            raise ToolInputError(self.name, f"the arguments do not match its input schema: {problem}")
        return filled

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        result = await self.session.call(self.name, request.arguments, self.timeout, self.timeout_text)
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

    def offer(name: str, schema: dict[str, Any], outputs: list[dict[str, Any]]) -> None:
        owner = owners.setdefault(name, label)
        if owner != label:
            raise UsageError(f"tool {name!r} is offered by {owner} and by {label}; heddle calls tools by name, so a "
                             "run can take it from one server only (leave it out of a toolbox with tool_filter)")
        if ctx.seams.tool(name) is not None:
            raise UsageError(f"tool {name!r} of {label} has the name of a plugin's tool; rename one of them")
        found.tools.setdefault(name, McpProvidedTool(name, session, schema, outputs, timeout, timeout_text))

    def listed(name: str, where: str) -> mcp_types.Tool:
        tool = session.tools.get(name)
        if tool is None:
            names = ", ".join(sorted(session.tools)) or "none"
            raise RunError(f"{where}: {label} lists no tool {name!r} (it lists: {names})")
        return tool

    schemas: dict[str, dict[str, Any]] = {}
    for name, tool in server.tools.items():
        where = f"MCPTool {name!r}"
        schemas[name] = _checked_schema(where, tool, listed(name, where), label)
        offer(name, schemas[name], tool.outputs)
    for agent, tool in server.agent_tools:
        description = tool.description or session.tools[tool.name].description or ""
        found.by_agent.setdefault(agent, []).append(_definition(tool.name, description, schemas[tool.name]))
    for agent, box in server.boxes:
        where = f"MCPToolBox {box.name!r}"
        entries: list[c.MCPToolSpec | str] = list(session.tools) if box.tool_filter is None else box.tool_filter
        for entry in entries:
            name = entry if isinstance(entry, str) else entry.name
            served = listed(name, where)
            if isinstance(entry, str):
                schema, outputs, description = _listed_schema(served), [], served.description or ""
            else:
                schema = _checked_schema(f"{where} tool_filter {name!r}", entry, served, label)
                outputs, description = entry.outputs, entry.description or served.description or ""
            offer(name, schema, outputs)
            found.by_agent.setdefault(agent, []).append(_definition(name, description, schema))


class McpKind:
    """The MCP tools of a document (heddle.tools.provided)."""

    def wants(self, flow: c.Flow) -> bool:
        return bool(_servers(flow))

    @contextlib.asynccontextmanager
    async def open(self, ctx: RunContext, flow: c.Flow) -> AsyncIterator[DocumentTools]:
        from heddle.graph import referenced_tools

        servers = _servers(flow)
        found = DocumentTools()
        owners: dict[str, str] = dict.fromkeys(referenced_tools(flow), "the document's ServerTool")
        async with contextlib.AsyncExitStack() as stack:
            for server in servers.values():
                session = await stack.enter_async_context(_opened(ctx, server))
                _provide(ctx, server, session, found, owners)
            for agent, definitions in found.by_agent.items():
                unique = {d["function"]["name"]: d for d in definitions}
                found.by_agent[agent] = list(unique.values())
            yield found


KIND = McpKind()
