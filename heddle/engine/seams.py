"""The seams of a run: the four points where something outside the engine may wrap what it does.

The engine never asks whether plugins are loaded. At each seam it hands the run's `Seams` what
it is about to do and its own way of doing it (`next`); the pass-through seams just call
`next`. The plugin host's seams ask middleware before and after, may call `next` again (a
retry) or not at all (a replace), and add the node types and tools its plugins declare.

    node(node, inputs, next)        one node execution (and its retries after an error)
    call_tool(request, next)        one tool call, from a ToolNode, an agent or a plugin
    call_model(request, next)       one model call, from an LlmNode, an agent or a plugin
    agent_round(round, next)        one agent round: the model's turn and the tools it asked for

Every event of the run passes through `event(event, next)` too, so an encoder can render it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Protocol, Self

from heddle.errors import UsageError

if TYPE_CHECKING:
    from heddle.agentspec import components as c
    from heddle.engine import events as ev
    from heddle.engine.context import RunContext
    from heddle.engine.options import RunOptions
    from heddle.model.client import ModelEndpoint
    from heddle.model.turn import AssistantTurn
    from heddle.workspace.workspace import Workspace

# What a node produced, and the branch it leaves by (None: its only one).
Outcome = tuple[dict[str, Any], str | None]
NodeStep = Callable[["c.Node", dict[str, Any]], Awaitable[Outcome]]


# Where a call's idempotency key (ToolRequest.idempotency_key) reaches it, for each kind of call.
IDEMPOTENCY_ENV = "HEDDLE_IDEMPOTENCY_KEY"  # a tool's program and a command: its environment
IDEMPOTENCY_HEADER = "Idempotency-Key"  # RemoteTool and ApiNode requests
IDEMPOTENCY_META = "heddle/idempotency-key"  # an MCP tools/call's `_meta`


@dataclass(frozen=True)
class ToolRequest:
    node: str
    tool: str
    arguments: dict[str, Any]
    workspace: Workspace
    call_id: str | None = None  # the model's id for the call, when a model asked for it
    # In a session, the call's step key (heddle.engine.journal): the same when a step lost in a crash runs
    # again, for the tool to de-duplicate with (HEDDLE_IDEMPOTENCY_KEY, Idempotency-Key, MCP `_meta`).
    idempotency_key: str | None = None


ToolStep = Callable[[ToolRequest], Awaitable[dict[str, Any]]]


def idempotency_env(request: ToolRequest) -> dict[str, str]:
    """The variable a tool's or a command's process finds its call's idempotency key in: always set, empty
    outside a session (never a value inherited from heddle's own environment)."""
    return {IDEMPOTENCY_ENV: request.idempotency_key or ""}


@dataclass(frozen=True)
class ModelRequest:
    node: str
    endpoint: ModelEndpoint
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None  # function definitions the model may call
    on_delta: Callable[[str], None] | None = None  # sees the answer's text as it streams
    response_format: dict[str, Any] | None = None  # the JSON Schema the answer must fit (structured outputs)


ModelStep = Callable[[ModelRequest], Awaitable["AssistantTurn"]]


@dataclass(frozen=True)
class AgentRound:
    node: str
    number: int  # 1 for the first round
    messages: list[dict[str, Any]]  # the conversation so far; the round appends to it


@dataclass(frozen=True)
class RoundResult:
    turn: AssistantTurn
    tool_results: list[dict[str, Any]]  # {id, name, result} per tool call, in the model's order


RoundStep = Callable[[AgentRound], Awaitable[RoundResult]]


class ProvidedTool(Protocol):
    """A tool the seams add beside the tools folder's (a plugin's tool)."""

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments to run with (defaults filled in), or ToolError before anything runs."""
        ...

    async def run(self, request: ToolRequest) -> dict[str, Any]: ...


class ToolTelemetry(Protocol):
    """What a tool's tool_call and tool_result events show instead of its arguments and output,
    for a tool whose arguments and output stay out of telemetry (a command: heddle.tools.command_run).
    A ProvidedTool with a `telemetry` attribute gets it."""

    def arguments(self, arguments: dict[str, Any]) -> Any: ...

    def output(self, output: dict[str, Any]) -> Any: ...

    def failure(self, error: Exception) -> Any: ...


class Seams(Protocol):
    """What the engine calls at each seam of one run."""

    def node_type(self, component_type: str) -> NodeStep | None:
        """How to execute a node of a type the engine does not know, if these seams add it."""
        ...

    def tool(self, name: str) -> ProvidedTool | None:
        """The tool of that name these seams add, which then answers instead of the tools folder's."""
        ...

    async def node(self, node: c.Node, inputs: dict[str, Any], next: NodeStep) -> Outcome: ...

    async def call_tool(self, request: ToolRequest, next: ToolStep) -> dict[str, Any]: ...

    async def call_model(self, request: ModelRequest, next: ModelStep) -> AssistantTurn: ...

    async def agent_round(self, agent_round: AgentRound, next: RoundStep) -> RoundResult: ...

    def event(self, event: ev.Event, next: ev.EventSink) -> None: ...


class RunSeams(Seams, Protocol):
    """The seams of one run, open for as long as it runs (`async with`): leaving ends whatever the
    seams started for it (an encoder's output, plugin processes), however the run ended."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None: ...

    async def finish(self, state: dict[str, Any]) -> None:
        """The run reached its end with `state` (after its last event)."""
        ...


@dataclass(frozen=True)
class Rendering:
    """Render the run's events in `protocol` (an encoder's) and hand the output to `write`."""

    protocol: str
    write: Callable[[str], None]


class Plugins(Protocol):
    """What a run is prepared with besides the flow: node types, tools, files and seams.
    The plugin host is one; `NO_PLUGINS` is the engine's own."""

    def known_tools(self, tools: Mapping[str, Path]) -> dict[str, Path]:
        """`tools` with the ones these plugins add, for checking a flow."""
        ...

    def check_flow(self, flow: c.Flow) -> list[str]:
        """Problems with the nodes of `flow` these plugins execute."""
        ...

    def with_files(self, options: RunOptions) -> RunOptions:
        """`options` with whatever these plugins put in every workspace."""
        ...

    def start_run(self, ctx: RunContext, rendering: Rendering | None) -> RunSeams:
        """The seams of one run of `ctx`."""
        ...


class PassThrough:
    """The seams of a run without plugins: each seam is the engine's own step."""

    def node_type(self, component_type: str) -> NodeStep | None:
        return None

    def tool(self, name: str) -> ProvidedTool | None:
        return None

    async def node(self, node: c.Node, inputs: dict[str, Any], next: NodeStep) -> Outcome:
        return await next(node, inputs)

    async def call_tool(self, request: ToolRequest, next: ToolStep) -> dict[str, Any]:
        return await next(request)

    async def call_model(self, request: ModelRequest, next: ModelStep) -> AssistantTurn:
        return await next(request)

    async def agent_round(self, agent_round: AgentRound, next: RoundStep) -> RoundResult:
        return await next(agent_round)

    def event(self, event: ev.Event, next: ev.EventSink) -> None:
        next(event)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        return None

    async def finish(self, state: dict[str, Any]) -> None:
        return None


class NoPlugins:
    """A run prepared without plugins: nothing added, every seam passed through."""

    def known_tools(self, tools: Mapping[str, Path]) -> dict[str, Path]:
        return dict(tools)

    def check_flow(self, flow: c.Flow) -> list[str]:
        return []

    def with_files(self, options: RunOptions) -> RunOptions:
        return options

    def start_run(self, ctx: RunContext, rendering: Rendering | None) -> RunSeams:
        if rendering is not None:
            raise UsageError(f"--protocol {rendering.protocol!r}: no such protocol; the protocols are: heddle; "
                             "an encoder plugin adds one (--plugin MANIFEST)")
        return PassThrough()


NO_PLUGINS: Plugins = NoPlugins()


class SeamsLayer:
    """A layer over a run's seams (the plugin host's, or the engine's own): each seam passed to them."""

    def __init__(self, inner: RunSeams) -> None:
        self.inner = inner

    def node_type(self, component_type: str) -> NodeStep | None:
        return self.inner.node_type(component_type)

    def tool(self, name: str) -> ProvidedTool | None:
        return self.inner.tool(name)

    async def node(self, node: c.Node, inputs: dict[str, Any], next: NodeStep) -> Outcome:
        return await self.inner.node(node, inputs, next)

    async def call_tool(self, request: ToolRequest, next: ToolStep) -> dict[str, Any]:
        return await self.inner.call_tool(request, next)

    async def call_model(self, request: ModelRequest, next: ModelStep) -> AssistantTurn:
        return await self.inner.call_model(request, next)

    async def agent_round(self, agent_round: AgentRound, next: RoundStep) -> RoundResult:
        return await self.inner.agent_round(agent_round, next)

    def event(self, event: ev.Event, next: ev.EventSink) -> None:
        self.inner.event(event, next)

    async def finish(self, state: dict[str, Any]) -> None:
        await self.inner.finish(state)

    async def __aenter__(self) -> Self:
        await self.inner.__aenter__()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.inner.__aexit__(exc_type, exc, tb)
