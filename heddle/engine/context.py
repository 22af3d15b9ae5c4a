"""What every node executor of one run shares: options, tools, model client, workspaces, events
and the run's seams, through which every node, tool call and model call goes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from heddle.engine import events as ev
from heddle.engine import journal as jn
from heddle.engine.journal import Call, ModelTurn, Suspended, ToolDone, ToolFailed, call_fingerprint
from heddle.engine.options import RunOptions
from heddle.engine.seams import (
    ModelRequest,
    PassThrough,
    Seams,
    ToolRequest,
    ToolStep,
    ToolTelemetry,
    idempotency_env,
)
from heddle.engine.tracing import program_env, sandbox_span
from heddle.errors import LimitError, ModelError, ToolError
from heddle.model.turn import AssistantTurn, ToolCall
from heddle.tools.process import run_tool_process
from heddle.tools.provided import DocumentTools
from heddle.workspace.egress_proxy import call_guard, redact
from heddle.workspace.sandbox import backend_name, confine

if TYPE_CHECKING:
    from typing import Any

    from heddle.agentspec import components as c
    from heddle.engine.conversation import Conversation
    from heddle.engine.journal import Answer, Journal, WaitingFor
    from heddle.engine.tracing import Tracing
    from heddle.model.client import ModelClient, ModelEndpoint
    from heddle.workspace.sandbox import SandboxPolicy
    from heddle.workspace.workspace import Workspaces


@dataclass
class TopMessage:
    """The run's user message, for the one node it is addressed to (the document's top-level agent);
    `answer` is that agent's final answer once it has given one."""

    node: Any  # the AgentNode (a heddle.agentspec.components node), compared by identity
    text: str
    answer: str | None = None


@dataclass
class RunContext:
    options: RunOptions
    tools: Mapping[str, Path]
    tools_dir: Path | None
    endpoints: Mapping[int, ModelEndpoint]
    workspaces: Workspaces
    sink: ev.EventSink  # the caller's; events reach it through the seams (see `emit`)
    client: ModelClient | None = None  # None when the flow calls no model
    seams: Seams = field(default_factory=PassThrough)
    iterations: int = 0
    # The document's own tools (RemoteTool, MCP), opened when the run starts: heddle.tools.provided
    document_tools: DocumentTools = field(default_factory=lambda: _no_document_tools())
    # The user's message to an agent document's top-level agent (`--message`), and its answer.
    message: TopMessage | None = None
    # What the run has shown the person running it (OutputMessageNode messages), in order: heddle.agentspec.messages
    shown: list[str] = field(default_factory=list)
    # A run in a session keeps a journal, so that it can stop to wait for a person and resume exactly
    # there (heddle.engine.journal); None outside a session, where nothing may wait.
    journal: Journal | None = None
    # A session's conversation so far (each agent's messages, the agent a Swarm handed it to), which
    # the run continues and updates: heddle.engine.conversation. None outside a session.
    conversation: Conversation | None = None
    # What this run showed live (not replayed from the journal): the messages a stopped or finished
    # run reports for this step.
    live_shown: list[str] = field(default_factory=list)
    # How the run is traced (heddle.engine.tracing): a tool's program runs in a span of its own.
    tracing: Tracing | None = None

    def show(self, text: str, node: str) -> None:
        """Show `text` to the person running the flow, as the agent's message (heddle.agentspec.messages)."""
        self.shown.append(text)
        self.live_shown.append(text)
        self.emit(ev.Message(node=node, text=text))

    def emit(self, event: ev.Event) -> None:
        self.seams.event(event, self.sink)

    def count_iteration(self, node_name: str) -> None:
        self.iterations += 1
        if self.iterations > self.options.max_iterations:
            raise LimitError(
                f"the run exceeded --max-iterations {self.options.max_iterations} node executions "
                f"(at node {node_name!r}); a loop in the flow may never reach its EndNode"
            )

    def endpoint(self, llm_config: c.LlmConfig) -> ModelEndpoint:
        return self.endpoints[id(llm_config)]

    # ---------------------------------------------------------------- tools

    async def call_tool(self, request: ToolRequest) -> dict[str, Any]:
        """One tool call, through the toolCall seam. Raises ToolError.

        In a session the call is a step (heddle.engine.journal): one the journal holds is answered from
        it and the tool does not run again; one that only began runs again with the same idempotency key."""
        journal = self.journal
        if journal is None:
            return await self.seams.call_tool(request, self.run_tool)
        key = journal.key("t")
        call = Call("tool", request.tool, call_fingerprint(request.tool, request.arguments))
        found = journal.replayed(key, call)
        if isinstance(found, ToolFailed):
            raise ToolError(found.name, found.error)
        if isinstance(found, ToolDone):
            return dict(found.output)
        request = replace(request, idempotency_key=journal.idempotency_key(key))
        await journal.begin(key, call)
        try:
            output = await self.seams.call_tool(request, self.run_tool)
        except ToolError as exc:
            await journal.fail(key, ToolFailed(call="tool", name=call.name, fingerprint=call.fingerprint,
                                               error=str(exc).removeprefix(f"tool {exc.tool!r}: ")), exc)
            raise
        await journal.done(key, ToolDone(call="tool", name=call.name, fingerprint=call.fingerprint, output=output))
        return output

    def wait(self, waiting: WaitingFor) -> Answer:
        """The person's answer to `waiting`: from the journal when the run resumes; else the run stops
        here (heddle.engine.journal.Suspended) to wait for it."""
        if self.journal is None:
            raise jn.no_session(waiting, self.options.surface)
        return self.journal.wait(waiting)

    async def run_tool(self, request: ToolRequest) -> dict[str, Any]:
        """The engine's own step of a tool call: the seams' tool of that name, else the tools folder's."""
        provided = self.seams.tool(request.tool) or self.document_tools.tools.get(request.tool)
        if provided is None:
            return await self.record_tool(request, self._run_executable)
        return await self.record_tool(replace(request, arguments=provided.check(request.arguments)), provided.run)

    async def record_tool(self, request: ToolRequest, work: ToolStep) -> dict[str, Any]:
        """`work(request)` between its tool_call and tool_result events: the one place they are emitted,
        whether the tool ran or a seam answered for it. A tool with `telemetry` (a command) has its
        arguments and output shown in them as it says, never as they are."""
        node, tool, call_id = request.node, request.tool, request.call_id
        telemetry: ToolTelemetry | None = getattr(self.seams.tool(tool) or self.document_tools.tools.get(tool),
                                                  "telemetry", None)
        arguments = request.arguments if telemetry is None else telemetry.arguments(request.arguments)
        self.emit(ev.ToolCall(node=node, tool=tool, call_id=call_id, arguments=arguments))
        started = time.perf_counter()
        try:
            output = await work(request)
        except Exception as exc:
            if isinstance(exc, Suspended):
                raise  # a ClientTool call waits for its result: it has none yet, and did not fail
            self.emit(ev.ToolResult(node=node, tool=tool, call_id=call_id, ok=False,
                                    output={"error": str(exc)} if telemetry is None else telemetry.failure(exc),
                                    duration_ms=(time.perf_counter() - started) * 1000))
            raise
        self.emit(ev.ToolResult(node=node, tool=tool, call_id=call_id, ok=True,
                                output=output if telemetry is None else telemetry.output(output),
                                duration_ms=(time.perf_counter() - started) * 1000))
        return output

    async def _run_executable(self, request: ToolRequest) -> dict[str, Any]:
        return await self.run_executable(request, self.tools[request.tool], self.tools_dir)

    async def run_executable(self, request: ToolRequest, executable: Path, tools_dir: Path | None) -> dict[str, Any]:
        """Run a tool's program in the request's workspace, confined by the run's sandbox policy
        (`tools_dir`, the folder it comes from, is bound read-only)."""
        workspace, policy = request.workspace, self.options.sandbox
        with _program_span(self.tracing, policy, request.tool) as traced:
            async with call_guard(self.options, request.tool, self.emit, runner=True) as egress:
                argv, env = confine(policy, [str(executable)], workspace=workspace, tools_dir=tools_dir,
                                    env={**workspace.env(os.environ), **traced, **idempotency_env(request)},
                                    egress=egress)
                try:
                    output = await run_tool_process(request.tool, argv, request.arguments, cwd=workspace.root,
                                                    env=env, timeout=self.options.tool_timeout,
                                                    surface=self.options.surface, sandboxed=policy.safe,
                                                    max_stdout=self.options.max_tool_stdout_bytes,
                                                    netns=egress.runner if egress is not None else None)
                except ToolError as exc:
                    # Its stderr, quoted in the message, is output too.
                    message, leaked = redact(exc.args[0] if exc.args else str(exc), self.options.secrets)
                    if not leaked:
                        raise
                    self._leaked(request.tool, leaked)
                    raise type(exc)(request.tool, message.removeprefix(f"tool {request.tool!r}: ")) from None
        redacted, leaked = redact(output, self.options.secrets)
        self._leaked(request.tool, leaked)
        shown: dict[str, Any] = redacted
        return shown

    def _leaked(self, tool: str, names: list[str]) -> None:
        for name in names:
            self.emit(ev.Warning(message=f"tool {tool!r}: its output held the value of secret {name}, which a tool "
                                         "is never given (a server it reached sent it back?); it was redacted"))

    # ---------------------------------------------------------------- models

    async def chat(self, request: ModelRequest) -> AssistantTurn:
        """One assistant turn of the node's model, through the modelCall seam.

        In a session the call is a step (heddle.engine.journal): a turn the journal holds is answered
        from it and nothing is sent again."""
        journal = self.journal
        if journal is None:
            return await self.seams.call_model(request, self.ask_model)
        key = journal.key("m")
        model = request.endpoint.model_id
        call = Call("model", model, call_fingerprint(model, {"messages": request.messages, "tools": request.tools,
                                                             "response_format": request.response_format}))
        found = journal.replayed(key, call)
        if isinstance(found, ModelTurn):
            return AssistantTurn(found.content, [ToolCall(**tc) for tc in found.tool_calls], found.finish_reason)
        await journal.begin(key, call)
        turn = await self.seams.call_model(request, self.ask_model)
        await journal.done(key, ModelTurn(name=model, fingerprint=call.fingerprint, content=turn.content,
                                          finish_reason=turn.finish_reason,
                                          tool_calls=[{"id": t.id, "name": t.name, "arguments": t.arguments}
                                                      for t in turn.tool_calls]))
        return turn

    async def ask_model(self, request: ModelRequest) -> AssistantTurn:
        """The engine's own step of a model call."""
        if self.client is None:
            raise ModelError(f"node {request.node!r} has no model client")
        return await self.client.chat(request.endpoint, request.messages, request.tools, on_delta=request.on_delta,
                                      response_format=request.response_format)


def _program_span(tracing: Tracing | None, policy: SandboxPolicy,
                  tool: str) -> contextlib.AbstractContextManager[dict[str, str]]:
    """A traced program's `TRACEPARENT`: its sandbox's span under --safe, else its tool call's."""
    if tracing is None:
        return contextlib.nullcontext({})
    if not policy.safe:
        return contextlib.nullcontext(program_env())
    return sandbox_span(tracing, backend=backend_name(policy), tool=tool)


def _no_document_tools() -> DocumentTools:
    return DocumentTools()
