"""Tools a plugin provides: an executable in its folder, run like any tool, or a `callTool`
answered by its process. Either way the arguments are checked against the tool's
`inputSchema` first, and a failure is a tool error the model sees."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from heddle.engine import events as ev
from heddle.errors import ToolError
from heddle.plugin_host.callbacks import Scope
from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.manifest import PluginTool
from heddle.plugin_host.process import PluginCallError

if TYPE_CHECKING:
    from heddle.plugin_host.middleware import PluginRun


async def invoke_plugin_tool(run: "PluginRun", tool: PluginTool, node_name: str, arguments: dict[str, Any],
                             workspace: Any, call_id: str | None, scope: Scope) -> dict[str, Any]:
    from heddle.tools.schema import check_arguments

    ctx = run.ctx
    filled, problem = check_arguments(tool.input_schema, arguments)
    if problem is not None:
        raise ToolError(tool.name, f"the arguments do not match the input schema of plugin {tool.plugin!r}'s tool: "
                                   f"{problem}")
    ctx.emit(ev.ToolCall(node=node_name, tool=tool.name, call_id=call_id, arguments=filled))
    started = time.perf_counter()
    try:
        if tool.path is not None:
            output = await _run_executable(run, tool, filled, workspace)
        else:
            output = await _ask_process(run, tool, node_name, filled, workspace, call_id, scope)
    except Exception as exc:
        ctx.emit(ev.ToolResult(node=node_name, tool=tool.name, call_id=call_id, ok=False, output={"error": str(exc)},
                               duration_ms=(time.perf_counter() - started) * 1000))
        raise
    ctx.emit(ev.ToolResult(node=node_name, tool=tool.name, call_id=call_id, ok=True, output=output,
                           duration_ms=(time.perf_counter() - started) * 1000))
    return output


async def _run_executable(run: "PluginRun", tool: PluginTool, arguments: dict[str, Any], workspace: Any) -> dict[str, Any]:
    from heddle.tools.process import run_tool_process
    from heddle.workspace.sandbox import confine

    options = run.ctx.options
    assert tool.path is not None
    folder = run.host.manifests[tool.plugin].root
    argv, env = confine(options.sandbox, [str(tool.path)], workspace=workspace, tools_dir=folder,
                        env=workspace.env(os.environ))
    return await run_tool_process(tool.name, argv, arguments, cwd=workspace.root, env=env,
                                  timeout=options.tool_timeout, surface=options.surface,
                                  sandboxed=options.sandbox.safe)


async def _ask_process(run: "PluginRun", tool: PluginTool, node_name: str, arguments: dict[str, Any], workspace: Any,
                       call_id: str | None, scope: Scope) -> dict[str, Any]:
    assert tool.component_type is not None
    params = {"tool": tool.name, "arguments": arguments, "callId": call_id, "node": run._node_ref(node_name),
              "workspace": str(workspace.root) if workspace is not None else None}
    try:
        result = await run.ask(tool.plugin, tool.component_type, "callTool", params, scope)
    except PluginCallError as exc:
        raise ToolError(tool.name, str(exc)) from None
    except PluginError as exc:
        raise ToolError(tool.name, exc.message) from None
    output = result.get("output") if isinstance(result, dict) else None
    if not isinstance(output, dict):
        raise ToolError(tool.name, f"plugin {tool.plugin!r} answered callTool without an 'output' object; "
                                   "answer {\"output\": {...}}")
    return output
