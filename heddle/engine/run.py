"""Running a flow: checks before anything runs, then the walk from StartNode to an EndNode.

State is one flat dict that starts as the run's input. A node's input is the state plus what its
data edges bring (renamed to the destination input); its output is merged into the state; the
input of the EndNode reached is the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from heddle.engine import events as ev
from heddle.engine.context import RunContext
from heddle.engine.options import RunOptions
from heddle.engine.seams import NO_PLUGINS, Plugins, Rendering
from heddle.errors import GraphError, HeddleError, LimitError, RunError
from heddle.graph import FlowGraph, check_flow, llm_configs, node_key
from heddle.spec import components as c

if TYPE_CHECKING:
    import httpx

    from heddle.model.client import ModelClient, ModelEndpoint

T = TypeVar("T")


def resolve_endpoints(flow: c.Flow) -> dict[int, ModelEndpoint]:
    """Every model endpoint of the flow, with its API key read now: a missing key fails before any node runs."""
    endpoints: dict[int, ModelEndpoint] = {}
    configs = list(llm_configs(flow))
    if not configs:
        return endpoints  # a flow of tools alone never loads the HTTP client
    from heddle.model.client import ModelEndpoint, resolve_api_key

    for where, config in configs:
        if id(config) in endpoints:
            continue
        key = resolve_api_key(config.api_key, config_type=config.component_type,
                              where=f"llm_config {config.name!r} of {where}")
        endpoints[id(config)] = ModelEndpoint(
            base_url=config.url, model_id=config.model_id, api_key=key,
            params=dict(config.default_generation_parameters or {}),
        )
    return endpoints


@dataclass
class PreparedRun:
    """A flow that passed every check that can be made before it runs."""

    flow: c.Flow
    tools: Mapping[str, Path]
    tools_dir: Path | None
    options: RunOptions
    endpoints: dict[int, ModelEndpoint]  # by id() of the flow's llm_config objects
    plugins: Plugins = NO_PLUGINS


def prepare_run(flow: c.Flow, *, tools: Mapping[str, Path], tools_dir: Path | None, options: RunOptions,
                sandbox_flags: tuple[str, ...] = (), plugins: Plugins | None = None) -> PreparedRun:
    """Graph, tools, keys, mounts and sandbox: everything refused before any node runs.

    `plugins` (a heddle.plugin_host.PluginHost) adds its node types, tools, files and seams.
    """
    from heddle.workspace.mounts import check_mounts
    from heddle.workspace.sandbox import check_policy

    plugins = plugins or NO_PLUGINS
    problems = check_flow(flow, tools=plugins.known_tools(tools), tools_dir=tools_dir)
    problems += plugins.check_flow(flow)
    if problems:
        raise GraphError(problems)
    options = plugins.with_files(options)
    check_policy(options.sandbox, explicitly_set=sandbox_flags)
    ws = options.workspace
    check_mounts(ws.mounts, max_entries=ws.max_entries, max_bytes=ws.max_bytes)
    return PreparedRun(flow, tools, tools_dir, options, resolve_endpoints(flow), plugins)


def _node_input(graph: FlowGraph, node: c.Node, state: dict[str, Any],
                outputs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    values = dict(state)
    key = node_key(node)
    for edge in graph.flow.data_flow_connections or []:
        if node_key(edge.destination_node) != key:
            continue
        produced = outputs.get(node_key(edge.source_node))
        if produced is not None and edge.source_output in produced:
            values[edge.destination_input] = produced[edge.source_output]
        elif edge.source_output in state:
            values[edge.destination_input] = state[edge.source_output]
    return values


async def execute_flow(ctx: RunContext, flow: c.Flow, inputs: dict[str, Any]) -> dict[str, Any]:
    """Walk `flow` from its StartNode; return the input of the EndNode it reaches."""
    from heddle.engine.nodes import run_node

    graph = FlowGraph.build(flow)
    state: dict[str, Any] = dict(inputs)
    outputs: dict[str, dict[str, Any]] = {}
    step = functools.partial(run_node, ctx)
    node = graph.nodes.get(node_key(flow.start_node), flow.start_node)
    while True:
        ctx.count_iteration(node.name)
        node_input = _node_input(graph, node, state, outputs)
        if isinstance(node, c.EndNode):
            ctx.emit(ev.NodeStart(node=node.name, node_type=node.component_type, inputs=node_input))
            ctx.emit(ev.NodeComplete(node=node.name, node_type=node.component_type, outputs=node_input,
                                     branch=None, duration_ms=0.0))
            return node_input
        ctx.emit(ev.NodeStart(node=node.name, node_type=node.component_type, inputs=node_input))
        started = time.perf_counter()
        try:
            produced, branch = await ctx.seams.node(node, node_input, step)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            ctx.emit(ev.NodeError(node=node.name, node_type=node.component_type, error=str(exc)))
            if isinstance(exc, HeddleError):
                raise
            raise RunError(f"node {node.name!r} failed: {type(exc).__name__}: {exc}") from exc
        outputs[node_key(node)] = produced
        state.update(produced)
        ctx.emit(ev.NodeComplete(node=node.name, node_type=node.component_type, outputs=produced,
                                 branch=branch, duration_ms=(time.perf_counter() - started) * 1000))
        edge = graph.next_edge(node, branch)
        if edge is None:
            raise RunError(f"{node.component_type} {node.name!r} chose branch {branch or 'next'!r} "
                           "but no control edge leaves by it")
        node = graph.nodes.get(node_key(edge.to_node), edge.to_node)


@contextlib.asynccontextmanager
async def _model_client(prepared: PreparedRun,
                        transport: httpx.AsyncBaseTransport | None) -> AsyncIterator[ModelClient | None]:
    if not prepared.endpoints:
        yield None
        return
    from heddle.model.client import ModelClient

    options = prepared.options
    async with ModelClient(stream=options.stream, timeout=options.model_timeout,
                           retries=options.model_retries, transport=transport) as client:
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


async def run_prepared(prepared: PreparedRun, inputs: dict[str, Any], *, on_event: ev.EventSink = ev.ignore,
                       rendering: Rendering | None = None,
                       transport: httpx.AsyncBaseTransport | None = None) -> dict[str, Any]:
    """Run a prepared flow to its end and return the final state: the one way a flow runs.

    `on_event` sees every event. With `rendering`, the run's plugins (an encoder) also render the
    events in its protocol and hand the output to its `write`. `transport` carries the model
    requests instead of the network (tests serve the scripted model in-process through it).
    """
    from heddle.workspace.workspace import Workspaces

    options = prepared.options

    def warn(message: str) -> None:
        ctx.emit(ev.Warning(message=message))

    workspaces = Workspaces(options.workspace, prepared.tools, tools_dir=prepared.tools_dir, warn=warn)
    ctx = RunContext(options=options, tools=prepared.tools, tools_dir=prepared.tools_dir,
                     endpoints=prepared.endpoints, workspaces=workspaces, sink=on_event)
    async with prepared.plugins.start_run(ctx, rendering) as seams:
        ctx.seams = seams
        workspaces.check()
        started = time.perf_counter()
        ctx.emit(ev.FlowStart(flow=prepared.flow.name, inputs=inputs))
        async with _model_client(prepared, transport) as client:
            ctx.client = client
            state = await _within(options, execute_flow(ctx, prepared.flow, dict(inputs)))
        ctx.emit(ev.FlowComplete(flow=prepared.flow.name, state=state,
                                 duration_ms=(time.perf_counter() - started) * 1000))
        await seams.finish(state)
    return state

