"""The served agent as one MCP tool: streamable HTTP at `/mcp` (and stdio for `heddle mcp`).

The tool's input schema is the StartNode's inputs (and `message` for an agent), its description the
bundle's, its `_meta` the proof of what answers (digest, signers, each tool's schema fingerprint). Its
result is the run's outputs, as structured content and as text.

Both protocol eras are served by the `mcp` package: the stateless one of 2026-07-28 (`server/discover`,
no session id) and the `initialize` handshake of 2025-11-25 (and earlier). A conversation is carried
by a handle the result gives (`_meta`, and a line of text a model can read) and the next call passes
back as its `session` argument. A run that stops for a person is, in the 2026 era, an
`input_required` result whose `requestState` is that handle (so the retry may reach any replica); in a
handshake era it is an elicitation sent to the client within the call, answered, and the run resumed.

Errors: a caller's mistake in the arguments, and a run that fails, are tool results with `isError`
(what a model can read and correct); an unknown tool or session is INVALID_PARAMS; a server that is
full or draining answers the JSON-RPC error SERVER_BUSY with the HTTP status /v1/runs would give, in
its `data`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from heddle.errors import HeddleError
from heddle.server.errors import ApiError, as_api_error
from heddle.server.surfaces.agent import Reply, ServedAgent, UnknownSession

if TYPE_CHECKING:
    import mcp_types as types
    from mcp.server.context import ServerRequestContext
    from mcp.server.lowlevel import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.routing import BaseRoute
    from starlette.types import Receive, Scope, Send

    from heddle.engine.journal import WaitingFor
    from heddle.server.service import Service

log = logging.getLogger("heddle.server")

PATH = "/mcp"
META = "dev.heddle/bundle"  # the tool's _meta key for the proof of what answers
SESSION_META = "dev.heddle/session"  # the result's _meta key for the conversation's handle
WAIT_KEY = "heddle"  # the key of the one input request an input_required result carries
SERVER_BUSY = -32000  # JSON-RPC's implementation-defined server error: full or draining, retry later
MAX_ROUNDS = 16  # a handshake-era call answers at most this many waits in a row
_NAME = re.compile(r"[^A-Za-z0-9_.-]")

SESSION_ARGUMENT = {"type": "string", "description": "To continue a conversation: the session this tool's last "
                                                     "result gave. Leave it out to start a new one."}


def tool_name(name: str) -> str:
    """The bundle's name as an MCP tool name (letters, digits, `_`, `-`, `.`; at most 128)."""
    return (_NAME.sub("_", name) or "agent")[:128]


class McpSurface:
    """One MCP server over the served agent, and the streamable-HTTP transport for it.

    Both are made on the first request: the `mcp` package takes a second or two of CPU to import, which
    a server that is never asked over MCP (and every start-up) should not pay; it is imported in a
    worker thread, so the loop serves other requests meanwhile."""

    def __init__(self, service: Service) -> None:
        self.service = service
        self.agent = ServedAgent(service)
        self._server: Server[Any] | None = None
        self._manager: StreamableHTTPSessionManager | None = None
        self._started: asyncio.Future[None] | None = None
        self._tool: tuple[object, types.Tool] | None = None  # the served bundle, and its tool

    @property
    def server(self) -> Server[Any]:
        """The MCP server (its one tool) for any transport."""
        if self._server is None:
            from mcp.server.lowlevel import Server

            from heddle import __version__

            self._server = Server(f"heddle {self.agent.name}", version=__version__,
                                  description=self.agent.description, get_tool_input_schema=self._schema,
                                  on_list_tools=self._list_tools, on_call_tool=self._call_tool)
        return self._server

    # ------------------------------------------------------------------ transport

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        manager = await self._running()
        await manager.handle_request(scope, receive, send)

    async def _running(self) -> StreamableHTTPSessionManager:
        """The transport, its task group started on the first request (the server has no lifespan)."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            module = "mcp.server.streamable_http_manager"
            try:
                await asyncio.to_thread(importlib.import_module, module)
            except BaseException as exc:
                self._started.set_exception(exc)
                raise
            from mcp.server.streamable_http_manager import DEFAULT_SESSION_IDLE_TIMEOUT, StreamableHTTPSessionManager

            # Host, Origin and authentication are the server's own guard's (outside this app); the body cap
            # is the server's. A handshake-era transport session lives in this process's memory: it is
            # dropped once unused for the package's 30 minutes (or a shorter --session-idle-timeout), the
            # conversation staying in the store, where its handle finds it.
            config = self.service.config
            self._manager = StreamableHTTPSessionManager(
                self.server, security_settings=None, max_request_body_size=config.max_body_bytes,
                session_idle_timeout=min(config.session_idle_timeout, DEFAULT_SESSION_IDLE_TIMEOUT))
            self.service.tasks.start(self._serve(self._manager, self._started), name="mcp transport")
        await asyncio.shield(self._started)
        assert self._manager is not None
        return self._manager

    async def _serve(self, manager: StreamableHTTPSessionManager, started: asyncio.Future[None]) -> None:
        """The transport's task group, until the server stops (Service.aclose cancels it; its handshake
        sessions end with it)."""
        try:
            async with manager.run():
                started.set_result(None)
                await asyncio.get_running_loop().create_future()
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            raise

    # ------------------------------------------------------------------ the tool

    def tool(self) -> types.Tool:
        """The one tool, made once per served bundle (a call reads it up to three times; a swap to another
        bundle makes it anew)."""
        import mcp_types as types

        agent = self.agent
        sealed = agent.sealed
        if self._tool is None or self._tool[0] is not sealed:
            made = types.Tool(name=tool_name(agent.name), description=agent.description,
                              input_schema=agent.input_schema(extra={"session": SESSION_ARGUMENT}
                                                              if agent.keeps_sessions else None),
                              _meta={META: agent.proof()})
            self._tool = (sealed, made)
        return self._tool[1]

    def _schema(self, name: str) -> dict[str, Any] | None:
        # What a 2026-era call's Mcp-Param-* headers are checked against, without listing the tools.
        return self.tool().input_schema if name == tool_name(self.agent.name) else None

    async def _list_tools(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        import mcp_types as types

        return types.ListToolsResult(tools=[self.tool()])

    async def _call_tool(self, ctx: ServerRequestContext[Any], params: types.CallToolRequestParams
                         ) -> types.CallToolResult | types.InputRequiredResult:
        import mcp_types as types
        from mcp.shared.exceptions import MCPError
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        name = tool_name(self.agent.name)
        if params.name != name:
            raise MCPError(types.INVALID_PARAMS, f"there is no tool {params.name!r}; this server has one, {name!r}")
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        try:
            if params.request_state is not None:
                session, waiting = await self.agent.latest(params.request_state, what="requestState")
                if waiting is None:
                    raise ApiError(409, "not_waiting", "the conversation waits for nothing now; call the tool "
                                                       "again without requestState")
                given = (params.input_responses or {}).get(WAIT_KEY)
                answer = _answer(waiting, given)
                if answer is None:  # asked again only when the retry carries no response at all
                    return self._wait_result(waiting, params.request_state, ask=given is None and _can_elicit(ctx))
                reply = await self.agent.run(inputs={}, session=session, answer=answer)
            else:
                reply = await self._start(dict(params.arguments or {}))
            rounds = 0
            while reply.outcome.waiting is not None:
                assert reply.handle is not None, "only a run in a session waits"
                if modern:
                    return self._wait_result(reply.outcome.waiting, reply.handle, ask=_can_elicit(ctx))
                rounds += 1
                answered = await self._elicit(ctx, reply) if rounds <= MAX_ROUNDS and _can_elicit(ctx) else None
                if answered is None:
                    return self._wait_result(reply.outcome.waiting, reply.handle, ask=False)
                reply = answered
            return self._result(reply)
        except (ApiError, HeddleError) as exc:
            return _refusal(exc)

    async def _start(self, arguments: dict[str, Any]) -> Reply:
        """A call's run: a new one, or the next turn of the conversation its `session` names."""
        agent = self.agent
        known = self.tool().input_schema["properties"]
        unknown = sorted(set(arguments) - set(known))
        if unknown:
            raise ApiError(400, "invalid_input", f"argument {unknown[0]!r} is not one the tool takes; it takes "
                                                 + ", ".join(repr(name) for name in known))
        session = None
        handle = arguments.pop("session", None) if agent.keeps_sessions else None
        message = arguments.pop("message", None) if agent.conversational else None
        if message is not None and not isinstance(message, str):
            raise ApiError(400, "invalid_input", f"argument 'message' must be a string, not {type(message).__name__}")
        if handle is not None:
            session, waiting = await agent.latest(handle, what="argument 'session'")
            if waiting is not None and waiting.kind == "message" and message is not None:
                # It waits for the user's answer to a question: this call's message is it.
                return await agent.run(inputs={}, session=session, answer={"message": message})
            if waiting is not None:
                # It still waits: the call shows what for again, with its handle, and runs nothing.
                from heddle.engine.run import RunOutcome

                return Reply(RunOutcome({}, {}, waiting=waiting), handle)
        return await agent.run(inputs=arguments, message=message, session=session)

    async def _elicit(self, ctx: ServerRequestContext[Any], reply: Reply) -> Reply | None:
        """A handshake-era wait: asked of the client within the call, then the run resumed with the answer
        (None: the person gave none, and the conversation still waits)."""
        waiting = reply.outcome.waiting
        assert waiting is not None and reply.handle is not None
        message, schema = _question(waiting)
        answered = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
        answer = _answer(waiting, answered)
        session, _ = self.agent.open_handle(reply.handle, what="the handle")
        if answer is None:
            return None
        return await self.agent.run(inputs={}, session=session, answer=answer)

    def _wait_result(self, waiting: WaitingFor, handle: str, *, ask: bool
                     ) -> types.CallToolResult | types.InputRequiredResult:
        """What a call that stops at a wait answers: with `ask` (the 2026 era, to a client that can be asked)
        an input_required result, else a tool error saying what the run waits for and the session that
        answers it later."""
        import mcp_types as types

        message, schema = _question(waiting)
        if ask:
            request = types.ElicitRequest(params=types.ElicitRequestFormParams(message=message,
                                                                               requested_schema=schema))
            return types.InputRequiredResult(input_requests={WAIT_KEY: request}, request_state=handle)
        how = (f'call the tool again with session "{handle}" and your answer as the message'
               if waiting.kind == "message" else
               f'answer it with a client that can, calling the tool with session "{handle}"')
        text = (f"{message} The run waits for this answer, and this client cannot be asked (it declares no "
                f"elicitation, or the form was dismissed): {how}.")
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True,
                                    _meta={SESSION_META: handle})

    def _result(self, reply: Reply) -> types.CallToolResult:
        import mcp_types as types

        outcome = reply.outcome
        outputs = dict(outcome.outputs)
        if outcome.messages:
            outputs.setdefault("messages", list(outcome.messages))
        answer = outputs.get("result")
        text = answer if self.agent.conversational and isinstance(answer, str) else json.dumps(
            outputs, ensure_ascii=False, default=str)
        content: list[types.ContentBlock] = [types.TextContent(type="text", text=text)]
        meta = None
        if reply.handle is not None:
            content.append(types.TextContent(type="text", text=f'To continue this conversation, call '
                                                               f'{tool_name(self.agent.name)} again with session '
                                                               f'"{reply.handle}".'))
            meta = {SESSION_META: reply.handle}
        return types.CallToolResult(content=content, structured_content=outputs, _meta=meta)


def _can_elicit(ctx: ServerRequestContext[Any]) -> bool:
    import mcp_types as types

    wanted = types.ClientCapabilities(elicitation=types.ElicitationCapability(form=types.FormElicitationCapability()))
    plain = types.ClientCapabilities(elicitation=types.ElicitationCapability())
    try:
        return ctx.session.check_client_capability(wanted) or ctx.session.check_client_capability(plain)
    except Exception:  # noqa: BLE001 (a connection that cannot say has no back-channel to ask on)
        return False


def _question(waiting: WaitingFor) -> tuple[str, dict[str, Any]]:
    """What the person is asked for a wait, and the form of the answer."""
    if waiting.kind == "approval":
        shown = json.dumps(waiting.arguments or {}, ensure_ascii=False, sort_keys=True)
        return (f"Approve the call of the tool {waiting.tool!r} with {shown}?",
                {"type": "object", "properties": {
                    "approve": {"type": "boolean", "title": "Approve", "description": "Run the call."},
                    "reason": {"type": "string", "title": "Reason", "description": "Why not, when not approved."}},
                 "required": ["approve"]})
    if waiting.kind == "message":
        return (waiting.prompt or f"The run waits for your message (node {waiting.node!r}).",
                {"type": "object", "properties": {"message": {"type": "string", "title": "Message"}},
                 "required": ["message"]})
    shown = json.dumps(waiting.arguments or {}, ensure_ascii=False, sort_keys=True)
    return (f"The client tool {waiting.tool!r} was called with {shown}: give its result as JSON.",
            {"type": "object", "properties": {"result": {"type": "string", "title": "Result (JSON)"}},
             "required": ["result"]})


def _answer(waiting: WaitingFor, given: Any) -> dict[str, Any] | None:
    """An elicitation's result as the answer /v1/runs takes, or None when the person gave none (the form was
    dismissed: the run still waits). A declined approval is a denial."""
    action = getattr(given, "action", None)
    content = getattr(given, "content", None) or {}
    if action not in ("accept", "decline"):
        return None
    if waiting.kind == "approval":
        if action == "accept" and content.get("approve") is True:
            return {"approve": True, "fingerprint": waiting.fingerprint}
        reason = content.get("reason") if action == "accept" else "the person declined"
        return {"deny": str(reason or "not approved"), "fingerprint": waiting.fingerprint}
    if action != "accept":
        return None
    if waiting.kind == "message":
        text = content.get("message")
        if not isinstance(text, str):
            raise ApiError(400, "invalid_answer", "the answer to the question needs 'message', a string")
        return {"message": text}
    raw = content.get("result")
    try:
        result = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        result = None
    if result is None and raw != "null":
        raise ApiError(400, "invalid_answer", f"the client tool {waiting.tool!r}'s result must be JSON text")
    return {"tool_result": result, "fingerprint": waiting.fingerprint}


def _refusal(exc: ApiError | HeddleError) -> types.CallToolResult:
    """What a call refused or failed answers: the caller's mistake or the run's failure as a tool error (a
    model reads and corrects it), an unknown session as INVALID_PARAMS, a full or draining server as
    SERVER_BUSY."""
    import mcp_types as types
    from mcp.shared.exceptions import MCPError

    api = exc if isinstance(exc, ApiError) else as_api_error(exc)
    if isinstance(exc, UnknownSession) or api.status == 404:
        raise MCPError(types.INVALID_PARAMS, api.message, {"type": api.type}) from None
    if api.status in (429, 503):
        raise MCPError(SERVER_BUSY, api.message, {"type": api.type, "status": api.status,
                                                  "retryAfter": api.headers.get("Retry-After")}) from None
    if api.status >= 500:
        log.warning("an MCP tool call failed: %s", api.message)
    return types.CallToolResult(content=[types.TextContent(type="text", text=f"{api.type}: {api.message}")],
                                is_error=True)


def routes(service: Service) -> list[BaseRoute]:
    """`/mcp`, when the server serves mcp."""
    from starlette.routing import Route

    # Its transport's task group lives until the server's loop ends, which cancels it.
    return [Route(PATH, McpSurface(service), methods=["GET", "POST", "DELETE"])]
