"""Running a flow: checks before anything runs, then the walk from StartNode to an EndNode.

Values move as the Agent Spec reference says. A node reads its own inputs (declared or inferred,
heddle.agentspec.io): in a flow with data edges, each input takes the value of the edge whose source
ran last, else its default (an input no edge reaches and that has no default takes the latest
output of its name, as heddle's own flows have long done); in a flow whose `data_flow_connections`
is null, each input takes the latest output of its name. The inputs of the EndNode reached are
the flow's outputs (a flow output that EndNode does not give takes its default). Nothing else
leaves a flow: `run_flow(...).outputs` is exactly its outputs.

The flat state a top-level run prints is kept beside the wiring: the run's input, then every value
each node produced merged in turn, then the flow's outputs over it, so each output holds exactly
its value and no node ever reads this state.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from heddle.agentspec import components as c
from heddle.agentspec import io
from heddle.agentspec.components import node_key
from heddle.agentspec.roots import check_message, document_root, message_target
from heddle.engine import events as ev
from heddle.engine.context import RunContext, TopMessage
from heddle.engine.journal import Journal, NodeFinished, Suspended, WaitingFor
from heddle.engine.nodes import run_node
from heddle.engine.options import RunOptions
from heddle.engine.seams import NO_PLUGINS, NodeStep, Outcome, Plugins, Rendering
from heddle.engine.tracing import MeasuredSeams, TracedSeams
from heddle.errors import GraphError, HeddleError, LimitError, NeedsSessionError, RunError, UsageError
from heddle.graph import FlowGraph, check_flow, llm_configs, referenced_tools
from heddle.model.endpoints import flow_endpoints
from heddle.tools.provided import kinds, open_document_tools
from heddle.tools.spawner import SPAWNER
from heddle.workspace.egress_proxy import check_relay, check_secrets
from heddle.workspace.mounts import check_mounts
from heddle.workspace.sandbox import check_isolation, check_policy
from heddle.workspace.workspace import Workspaces

if TYPE_CHECKING:
    import httpx

    from heddle.engine.conversation import Conversation
    from heddle.engine.tracing import ModelObserver, Tracing
    from heddle.model.client import ModelClient, ModelEndpoint

T = TypeVar("T")


def resolve_endpoints(flow: c.Flow, *, model_urls: Mapping[str, str] | None = None) -> dict[int, ModelEndpoint]:
    """Every model endpoint of the flow, its URL and API key read now (`$VAR`s from the environment,
    `model_urls` by llm config name or id): a missing one fails before any node runs."""
    configs = list(llm_configs(flow))
    if not configs and not model_urls:
        return {}  # a flow of tools alone never loads the HTTP client
    return flow_endpoints(configs, model_urls or {})


@dataclass
class PreparedRun:
    """A flow that passed every check that can be made before it runs."""

    flow: c.Flow
    tools: Mapping[str, Path]
    tools_dir: Path | None
    options: RunOptions
    endpoints: dict[int, ModelEndpoint]  # by id() of the flow's llm_config objects
    plugins: Plugins = NO_PLUGINS
    warnings: tuple[str, ...] = ()  # the graph check's, emitted when the run starts
    # heddle.tools.provided.kinds of the flow, found once here: a walk of the whole flow, which a
    # server would otherwise make for every run of it. None: found when the run starts.
    tool_kinds: tuple[Any, ...] | None = None
    # The flow's graph, indexed once here for every run of it. None: built when the run starts.
    graph: FlowGraph | None = None
    # How its runs are traced (heddle.engine.tracing); None: they are not.
    tracing: Tracing | None = None
    # What is told of its model calls (a server's metrics); None: nothing.
    observer: ModelObserver | None = None
    # Whether the mounts were measured here and no run has started since: the first run need not walk
    # them again; a later run of the same preparation (a server's) measures them itself.
    mounts_fresh: bool = False
    # Whether a run of it ends within the step of the event loop that starts it (`ends_at_once`).
    at_once: bool = False


# The nodes whose own step waits on nothing (no process, connection, person or subflow).
_AT_ONCE_NODES = (c.StartNode, c.EndNode, c.BranchingNode, c.OutputMessageNode)


def ends_at_once(flow: c.Flow, plugins: Plugins, tracing: Tracing | None, endpoints: Mapping[int, Any],
                 tool_kinds: tuple[Any, ...]) -> bool:
    """Whether a run outside a session (whose journal is written as it goes) ends within the step of the
    event loop that starts it: no plugin, trace, model or document tool, and only nodes that wait on
    nothing. Nothing else runs meanwhile, so nothing could stop it part way (a caller may run it on its
    own task rather than on one that can be cancelled)."""
    return (plugins is NO_PLUGINS and tracing is None and not endpoints and tool_kinds == ()
            and all(isinstance(node, _AT_ONCE_NODES) for node in flow.nodes))


def prepare_run(flow: c.Flow, *, tools: Mapping[str, Path], tools_dir: Path | None, options: RunOptions,
                sandbox_flags: tuple[str, ...] = (), plugins: Plugins | None = None,
                tracing: Tracing | None = None, observer: ModelObserver | None = None) -> PreparedRun:
    """Graph, tools, keys, mounts and sandbox: everything refused before any node runs.

    `plugins` (a heddle.plugin_host.PluginHost) adds its node types, tools, files and seams.
    """
    plugins = plugins or NO_PLUGINS
    warnings: list[str] = list(document_root(flow).warnings)  # the document reader's come first
    problems = check_flow(flow, tools=plugins.known_tools(tools), tools_dir=tools_dir, warnings=warnings,
                          model_urls=options.model_urls)
    problems += plugins.check_flow(flow)
    if problems:
        raise GraphError(problems)
    options = plugins.with_files(options)
    check_policy(options.sandbox, explicitly_set=sandbox_flags)
    if options.egress is not None and options.sandbox.safe and not options.sandbox.deny_net:
        check_relay()
    if options.secrets is not None:
        check_secrets(options)
    if options.sandbox.require_isolation is not None:
        check_isolation(options.sandbox, egress=options.egress is not None)
    ws = options.workspace
    check_mounts(ws.mounts, max_entries=ws.max_entries, max_bytes=ws.max_bytes)
    if not options.sandbox.safe and not tools.keys().isdisjoint(referenced_tools(flow)):
        # The flow runs tools of the folder: their reaper server's start overlaps what is left before the first call.
        SPAWNER.prestart()
    endpoints = resolve_endpoints(flow, model_urls=options.model_urls)
    if options.egress is not None:
        # A model is called from heddle's own process: its URL (--model-url included) is checked here,
        # before any node runs.
        for label, config in llm_configs(flow):
            refused = options.egress.url_problem(config.name, endpoints[id(config)].base_url)
            if refused is not None:
                raise UsageError(f"llm config {config.name!r} of {label}: {refused}")
    tool_kinds = tuple(kinds(flow))
    return PreparedRun(flow, tools, tools_dir, options, endpoints,
                       plugins, tuple(warnings), tool_kinds, FlowGraph.build(flow), tracing,
                       observer, mounts_fresh=True,
                       at_once=ends_at_once(flow, plugins, tracing, endpoints, tool_kinds))


def _label(node: c.Node) -> str:
    return f"{node.component_type} {node.name!r}"


class _Wiring:
    """The values one walk of a flow has produced, and how they reach the next node's inputs."""

    def __init__(self, flow: c.Flow) -> None:
        self.by_name = flow.data_flow_connections is None
        self.into: dict[str, list[c.DataFlowEdge]] = {}
        for edge in flow.data_flow_connections or []:
            self.into.setdefault(node_key(edge.destination_node), []).append(edge)
        self.produced: dict[str, tuple[int, dict[str, Any]]] = {}  # node -> (when it last ran, its outputs)
        self.names: dict[str, Any] = {}  # the latest output of each name
        self.step = 0

    def _by_edges(self, node: c.Node) -> tuple[dict[str, Any], set[str]]:
        """What the node's data edges bring, and the inputs they reach (whether their sources ran or not)."""
        latest: dict[str, tuple[int, Any]] = {}
        edges = self.into.get(node_key(node), [])
        for edge in edges:
            source = self.produced.get(node_key(edge.source_node))
            if source is None or edge.source_output not in source[1]:
                continue
            # Several edges into one input: the one whose source ran last wins.
            when, produced = source
            if edge.destination_input not in latest or when > latest[edge.destination_input][0]:
                latest[edge.destination_input] = (when, produced[edge.source_output])
        return {title: value for title, (_, value) in latest.items()}, {e.destination_input for e in edges}

    def inputs_for(self, node: c.Node) -> dict[str, Any]:
        """The node's input values; RunError naming the input that has none."""
        declared = io.inputs_of(node)
        wired: set[str] = set()
        if self.by_name:
            given = dict(self.names)
        else:
            given, wired = self._by_edges(node)
        if declared is None:
            return {**self.names, **given}
        values: dict[str, Any] = {}
        missing: list[str] = []
        for prop in declared:
            title = prop["title"]
            if title in given:
                values[title] = given[title]
            elif "default" in prop:
                values[title] = copy.deepcopy(prop["default"])
            elif title not in wired and title in self.names:
                # No edge reaches it and it has no default: the latest output of its name, as in
                # a flow wired by name (the graph checks refuse an input that even this leaves empty).
                values[title] = self.names[title]
            else:
                missing.append(title)
        if missing:
            names = ", ".join(repr(m) for m in missing)
            why = ("no node that ran before it gave an output of that name" if self.by_name
                   else "no node that ran before it gave it a value")
            raise RunError(f"{_label(node)} needs input {names}, but {why} and it has no default")
        return values

    def record(self, node: c.Node, produced: dict[str, Any]) -> dict[str, Any]:
        """Keep what the node gave (its declared outputs, defaults filled in) for the nodes after it."""
        declared = io.outputs_of(node)
        if declared is None:
            outputs = dict(produced)
        else:
            outputs, missing = io.declared_values(declared, produced)
            if missing:
                raise RunError(f"{_label(node)} gave no value for its output {missing[0]!r}")
        self.step += 1
        self.produced[node_key(node)] = (self.step, outputs)
        self.names.update(outputs)
        return outputs


@dataclass(frozen=True)
class FlowRun:
    """One walk of a flow to an EndNode."""

    outputs: dict[str, Any]  # the flow's outputs: what a FlowNode (or any caller of the flow) gets
    branch: str  # the branch_name of the EndNode reached
    state: dict[str, Any]  # the flat state a top-level run prints


def _flow_outputs(flow: c.Flow, end: c.EndNode, given: dict[str, Any]) -> dict[str, Any]:
    outputs, missing = io.declared_values(io.flow_outputs(flow), given)
    if missing:
        raise RunError(f"flow {flow.name!r} ended at EndNode {end.name!r}, which does not give the flow's "
                       f"output {missing[0]!r}, and that output has no default")
    return outputs


async def run_flow(ctx: RunContext, flow: c.Flow, inputs: dict[str, Any], *, graph: FlowGraph | None = None
                   ) -> FlowRun:
    """Walk `flow` from its StartNode (which reads `inputs`) to an EndNode; `graph` is its graph,
    when built before (it is only read)."""
    if graph is None or graph.flow is not flow:
        graph = FlowGraph.build(flow)
    wiring = _Wiring(flow)
    state: dict[str, Any] = dict(inputs)
    step = functools.partial(run_node, ctx)
    visits: dict[str, int] = {}
    node = graph.nodes.get(node_key(flow.start_node), flow.start_node)
    while True:
        ctx.count_iteration(node.name)
        node_input = dict(inputs) if isinstance(node, c.StartNode) else wiring.inputs_for(node)
        if isinstance(node, c.EndNode):
            ctx.emit(ev.NodeStart(node=node.name, node_type=node.component_type, inputs=node_input))
            ctx.emit(ev.NodeComplete(node=node.name, node_type=node.component_type, outputs=node_input,
                                     branch=None, duration_ms=0.0))
            outputs = _flow_outputs(flow, node, node_input)
            state.update(outputs)
            return FlowRun(outputs, node.branch_name or "next", state)
        key = node_key(node)
        visits[key] = visits.get(key, 0) + 1
        if ctx.journal is None:
            produced, branch = await _one_node(ctx, node, node_input, step)
        else:
            produced, branch = await _journaled_node(ctx, ctx.journal, f"{key}#{visits[key]}", node, node_input,
                                                     step)
        wiring.record(node, produced)
        state.update(produced)
        edge = graph.next_edge(node, branch)
        if edge is None:
            # No control edge leaves by the branch taken: the flow ends here, as the reference runtime
            # ends it, with the latest value of each of its outputs (their defaults for the rest).
            outputs, missing = io.declared_values(io.flow_outputs(flow), wiring.names)
            if missing:
                raise RunError(f"flow {flow.name!r} ended after {_label(node)}, which took branch "
                               f"{branch or 'next'!r} that no control edge leaves by, before any node gave the "
                               f"flow's output {missing[0]!r}, and that output has no default")
            state.update(outputs)
            return FlowRun(outputs, "next", state)
        node = graph.nodes.get(node_key(edge.to_node), edge.to_node)


async def _one_node(ctx: RunContext, node: c.Node, node_input: dict[str, Any], step: NodeStep) -> Outcome:
    """The node run through the seams, between its node_start and node_complete (or node_error) events."""
    ctx.emit(ev.NodeStart(node=node.name, node_type=node.component_type, inputs=node_input))
    started = time.perf_counter()
    try:
        produced, branch = await ctx.seams.node(node, node_input, step)
    except (asyncio.CancelledError, Suspended):
        raise
    except Exception as exc:
        ctx.emit(ev.NodeError(node=node.name, node_type=node.component_type, error=str(exc)))
        if isinstance(exc, HeddleError):
            raise
        raise RunError(f"node {node.name!r} failed: {type(exc).__name__}: {exc}") from exc
    ctx.emit(ev.NodeComplete(node=node.name, node_type=node.component_type, outputs=produced,
                             branch=branch, duration_ms=(time.perf_counter() - started) * 1000))
    return produced, branch


async def _journaled_node(ctx: RunContext, journal: Journal, visit: str, node: c.Node, node_input: dict[str, Any],
                          step: NodeStep) -> Outcome:
    """A node of a run in a session: one that finished before the run stopped is not run again (its
    outputs, branch and messages are the journal's, and it emits nothing); any other runs, its own
    model and tool calls answered from the journal as far as it holds them."""
    with journal.scope(visit) as scope:
        done = journal.node(scope)
        if done is not None:
            ctx.shown.extend(done.shown)
            return dict(done.outputs), done.branch
        shown = len(ctx.shown)
        try:
            produced, branch = await _one_node(ctx, node, node_input, step)
        except (asyncio.CancelledError, Suspended):
            raise
        except Exception as exc:
            await journal.undo_failure(exc)
            raise
        journal.finished(scope, scope, NodeFinished(outputs=produced, branch=branch, shown=ctx.shown[shown:]))
    if journal.checkpoint is not None:
        await journal.checkpoint(journal)
    return produced, branch


def _model_client(prepared: PreparedRun, transport: httpx.AsyncBaseTransport | None
                  ) -> contextlib.AbstractAsyncContextManager[ModelClient | None]:
    if not prepared.endpoints:
        return contextlib.nullcontext()  # a flow that calls no model has no client to open
    return _open_model_client(prepared, transport)


@contextlib.asynccontextmanager
async def _open_model_client(prepared: PreparedRun,
                             transport: httpx.AsyncBaseTransport | None) -> AsyncIterator[ModelClient | None]:
    # Here, not at the top: the model client brings httpx, which a flow that calls no model never loads.
    from heddle.model.client import ModelClient

    options = prepared.options
    async with ModelClient(stream=options.stream, timeout=options.model_timeout, deadline=options.model_deadline,
                           max_bytes=options.max_response_bytes, retries=options.model_retries,
                           transport=transport) as client:
        yield client


async def _within(options: RunOptions, work: Coroutine[Any, Any, T]) -> T:
    """`work`, stopped when the run's timeout passes (a timeout of its own stays its own)."""
    limit = options.timeout
    if limit is None:
        return await work
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await work
    except TimeoutError:
        if not deadline.expired():
            raise
        raise LimitError(f"the run exceeded {options.surface.setting('timeout', limit)} and was stopped") from None


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: the flat final state `heddle run` prints, the flow's outputs alone, and the
    messages it showed the person running it, in order (heddle.agentspec.messages)."""

    state: dict[str, Any]
    outputs: dict[str, Any]
    messages: tuple[str, ...] = ()
    # A run in a session that stopped to wait for a person: what it waits for (state and outputs are
    # then empty, `messages` what it showed before it stopped, the question last).
    waiting: WaitingFor | None = None
    # A run in a session: the store version its turn's last write left the session at (a handle of that
    # turn names it; reading the store afterwards could see a turn that came after).
    session_version: int | None = None


def refuse_waits_without_session(flow: c.Flow, *, source: str | None = None) -> None:
    """NeedsSessionError when `flow` may wait for a person (heddle.agentspec.waits), naming the first place
    and `source` (the document's file, or the bundle) when the caller knows it."""
    waits = document_root(flow).waits
    if waits:
        more = f" (and {len(waits) - 1} more)" if len(waits) > 1 else ""
        raise NeedsSessionError(f"{source or f'flow {flow.name!r}'} may wait for a person: {waits[0]}{more}; run it "
                                "in a session (--session NAME, or session= in the API) so that it can stop and resume")


async def run_prepared(prepared: PreparedRun, inputs: dict[str, Any], *, on_event: ev.EventSink = ev.ignore,
                       rendering: Rendering | None = None,
                       transport: httpx.AsyncBaseTransport | None = None, message: str | None = None,
                       journal: Journal | None = None, conversation: Conversation | None = None) -> RunOutcome:
    """Run a prepared flow to its end and return its final state and outputs: the one way a flow runs.

    `on_event` sees every event. With `rendering`, the run's plugins (an encoder) also render the
    events in its protocol and hand the output to its `write`. `transport` carries the model
    requests instead of the network (tests serve the scripted model in-process through it).
    `message` is the user's message to an agent document's agent (required there, refused elsewhere);
    its final answer is then the `result` output, unless the agent declares an output of that name.
    `journal` makes it a run in a session (heddle.sessions.turn): it may stop to wait for a person,
    returning the outcome with `waiting` set, and resumes from what the journal holds;
    `conversation` is the session's conversation so far, which the run continues and updates.
    """
    check_message(prepared.flow, message, named="message", give="message=")
    if journal is None:
        refuse_waits_without_session(prepared.flow)
    target = message_target(prepared.flow)

    options = prepared.options

    def warn(message: str) -> None:
        ctx.emit(ev.Warning(message=message))

    workspaces = Workspaces(options.workspace, prepared.tools, tools_dir=prepared.tools_dir, warn=warn)
    ctx = RunContext(options=options, tools=prepared.tools, tools_dir=prepared.tools_dir,
                     endpoints=prepared.endpoints, workspaces=workspaces, sink=on_event,
                     message=TopMessage(target, message) if target is not None and message is not None else None,
                     journal=journal, conversation=conversation)
    run_seams = prepared.plugins.start_run(ctx, rendering)
    if prepared.observer is not None and prepared.endpoints:  # a flow with no model config calls none
        run_seams = MeasuredSeams(run_seams, prepared.observer)
    if prepared.tracing is not None:
        ctx.tracing = prepared.tracing
        run_seams = TracedSeams(run_seams, prepared.tracing, ctx, prepared.flow)
    async with run_seams as seams:
        ctx.seams = seams
        fresh, prepared.mounts_fresh = prepared.mounts_fresh, False
        workspaces.check(mounts=not fresh)
        started = time.perf_counter()
        ctx.emit(ev.FlowStart(flow=prepared.flow.name, inputs=inputs))
        for warning in prepared.warnings:
            warn(warning)
        kinds = prepared.tool_kinds
        # A flow found to have no document tools keeps the context's empty set: nothing to open.
        tools = contextlib.nullcontext() if kinds == () else open_document_tools(ctx, prepared.flow, kinds)
        async with _model_client(prepared, transport) as client, tools:
            ctx.client = client
            try:
                work = run_flow(ctx, prepared.flow, dict(inputs), graph=prepared.graph)
                # A run that ends within the loop's step that starts it is over before its timeout could
                # be heard: it needs no timer. In a session it writes its journal, and waits for that.
                walked = await (work if prepared.at_once and journal is None else _within(options, work))
            except Suspended as stop:
                ctx.emit(ev.Waiting(flow=prepared.flow.name, waiting_for=stop.waiting.as_json(),
                                    duration_ms=(time.perf_counter() - started) * 1000))
                await seams.finish({})
                return RunOutcome({}, {}, tuple(ctx.live_shown), stop.waiting)
        state = walked.state
        ctx.emit(ev.FlowComplete(flow=prepared.flow.name, state=state,
                                 duration_ms=(time.perf_counter() - started) * 1000))
        await seams.finish(state)
    outputs = walked.outputs
    if ctx.message is not None:
        outputs = {"result": ctx.message.answer, **outputs}
    return RunOutcome(state, outputs, tuple(ctx.live_shown))

