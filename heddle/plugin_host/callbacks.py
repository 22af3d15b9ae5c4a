"""What a plugin may ask heddle while one of heddle's calls is in flight: `runTool`,
`callModel`, `emitEvent` and `log`. Each acts within the call it names: that call's run,
node, workspace and model."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.engine.seams import ModelRequest, ToolRequest
from heddle.errors import ModelError, ToolError
from heddle.plugin_host.events import LOG_LEVELS, PluginEvent, PluginLog
from heddle.plugin_host.process import CallbackError, Handler
from heddle.plugin_host.turns import turn_to_json

if TYPE_CHECKING:
    from heddle.engine.context import RunContext
    from heddle.model.client import ModelEndpoint
    from heddle.plugin_host.middleware import PluginRun
    from heddle.workspace.workspace import Workspace


@dataclass(frozen=True)
class Scope:
    """Where a heddle call happens: the node it is for, its workspace and model, when there are."""

    node: str | None = None
    workspace: Workspace | None = None
    endpoint: ModelEndpoint | None = None


def endpoint_of(ctx: RunContext, node: c.Node) -> ModelEndpoint | None:
    """The model endpoint a node talks to, if it has one."""
    if isinstance(node, c.AgentNode):
        # A Swarm's or a ManagerWorkers' agents each have their own model: the node has no one endpoint.
        config: Any = getattr(node.agent, "llm_config", None)
    else:
        config = getattr(node, "llm_config", None)
    if config is None:
        return None
    return ctx.endpoints.get(id(config))


def _string(params: dict[str, Any], key: str, method: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not value:
        raise CallbackError(f"{method}: params.{key} must be a non-empty string")
    return value


def handler_for(run: PluginRun, plugin: str, scope: Scope) -> Handler:
    """The handler answering `plugin`'s requests made for one call in `scope`."""

    async def handle(method: str, params: dict[str, Any]) -> Any:
        ctx = run.ctx
        if method == "log":
            level = params.get("level", "info")
            if level not in LOG_LEVELS:
                raise CallbackError(f"log: params.level must be one of {', '.join(LOG_LEVELS)}")
            message = params.get("message")
            if not isinstance(message, str):
                raise CallbackError("log: params.message must be a string")
            ctx.emit(PluginLog(plugin=plugin, level=level, message=message, node=scope.node))
            return {}
        if method == "emitEvent":
            name = _string(params, "name", method)
            ctx.emit(PluginEvent(plugin=plugin, name=name, data=params.get("data"), node=scope.node))
            return {}
        if method == "runTool":
            return await _run_tool(run, plugin, scope, params)
        if method == "callModel":
            return await _call_model(run, plugin, scope, params)
        raise CallbackError(f"unknown method {method!r}")

    return handle


async def _run_tool(run: PluginRun, plugin: str, scope: Scope, params: dict[str, Any]) -> Any:
    name = _string(params, "name", "runTool")
    arguments = params.get("arguments", {})
    if not isinstance(arguments, dict):
        raise CallbackError("runTool: params.arguments must be a JSON object")
    ctx = run.ctx
    if name not in ctx.tools and name not in run.host.tools:
        known = ", ".join(sorted({*ctx.tools, *run.host.tools})) or "none"
        raise CallbackError(f"runTool: there is no tool named {name!r}; the tools are: {known}")
    node = scope.node or f"plugin:{plugin}"
    async with contextlib.AsyncExitStack() as stack:
        workspace = scope.workspace
        if workspace is None:
            workspace = await stack.enter_async_context(ctx.workspaces.enter(node))
        try:
            output = await run.call_tool(ToolRequest(node, name, arguments, workspace), ctx.run_tool, caller=plugin)
        except ToolError as exc:
            raise CallbackError(str(exc)) from None
    return {"output": output}


async def _call_model(run: PluginRun, plugin: str, scope: Scope, params: dict[str, Any]) -> Any:
    if scope.endpoint is None:
        where = f"node {scope.node!r}" if scope.node else "this call"
        raise CallbackError(f"callModel: {where} has no model; give the node an llm_config")
    messages = params.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise CallbackError("callModel: params.messages must be a list of chat messages")
    tools = params.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise CallbackError("callModel: params.tools must be a list of tool definitions")
    request = ModelRequest(scope.node or "", scope.endpoint, messages, tools)
    try:
        turn = await run.call_model(request, run.ctx.ask_model, caller=plugin)
    except ModelError as exc:
        raise CallbackError(f"callModel: {exc}") from None
    return turn_to_json(turn)
