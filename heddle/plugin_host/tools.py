"""Tools a plugin provides: an executable in its folder, run like any tool, or a `callTool`
answered by its process. Either way the arguments are checked against the tool's
`inputSchema` first, and a failure is a tool error the model sees."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.engine.seams import ToolRequest
from heddle.errors import ToolError
from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.manifest import PluginTool
from heddle.plugin_host.process import PluginCallError
from heddle.tools.schema import check_arguments

if TYPE_CHECKING:
    from heddle.plugin_host.middleware import PluginRun


@dataclass(frozen=True)
class ProvidedPluginTool:
    """One plugin tool as the engine runs it (heddle.engine.seams.ProvidedTool); the engine
    emits its events."""

    run_of: PluginRun
    tool: PluginTool

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        tool = self.tool
        filled, problem = check_arguments(tool.input_schema, arguments)
        if problem is not None or filled is None:
            raise ToolError(tool.name, f"the arguments do not match the input schema of plugin {tool.plugin!r}'s "
                                       f"tool: {problem}")
        return filled

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        run, tool = self.run_of, self.tool
        if tool.path is not None:
            return await run.ctx.run_executable(request, tool.path, run.host.manifests[tool.plugin].root)
        return await self._ask_process(request)

    async def _ask_process(self, request: ToolRequest) -> dict[str, Any]:
        run, tool = self.run_of, self.tool
        # A tool its process listed (--discover-tools) belongs to no component: it is asked by name.
        assert tool.component_type is not None or tool.discovered
        params = {"tool": tool.name, "arguments": request.arguments, "callId": request.call_id,
                  "idempotencyKey": request.idempotency_key, "node": run.node_ref(request.node),
                  "workspace": str(request.workspace.root)}
        try:
            result = await run.ask(tool.plugin, tool.component_type, "callTool", params,
                                   run.scope(request.node, request.workspace))
        except PluginCallError as exc:
            raise ToolError(tool.name, str(exc)) from None
        except PluginError as exc:
            raise ToolError(tool.name, exc.message) from None
        output = result.get("output") if isinstance(result, dict) else None
        if not isinstance(output, dict):
            raise ToolError(tool.name, f"plugin {tool.plugin!r} answered callTool without an 'output' object; "
                                       "answer {\"output\": {...}}")
        return output
