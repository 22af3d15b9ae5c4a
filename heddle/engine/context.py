"""What every node executor of one run shares: options, tools, model client, workspaces, events."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.engine import events as ev
from heddle.engine.options import RunOptions
from heddle.errors import LimitError

if TYPE_CHECKING:
    from heddle.model.client import ModelClient, ModelEndpoint
    from heddle.workspace.workspace import Workspace, Workspaces


@dataclass
class RunContext:
    options: RunOptions
    tools: Mapping[str, Path]
    tools_dir: Path | None
    client: "ModelClient"
    endpoints: dict[int, "ModelEndpoint"]
    workspaces: "Workspaces"
    emit: ev.EventSink
    iterations: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    plugins: Any = None  # a heddle.plugin_host PluginRun when plugins are loaded: the seams go through it

    def count_iteration(self, node_name: str) -> None:
        self.iterations += 1
        if self.iterations > self.options.max_iterations:
            raise LimitError(
                f"the run exceeded --max-iterations {self.options.max_iterations} node executions "
                f"(at node {node_name!r}); a loop in the flow may never reach its EndNode"
            )

    def endpoint(self, llm_config) -> "ModelEndpoint":
        return self.endpoints[id(llm_config)]

    async def call_tool(self, node_name: str, tool_name: str, arguments: dict[str, Any],
                        workspace: "Workspace", call_id: str | None = None) -> dict[str, Any]:
        """Run one tool in `workspace`, emitting tool_call/tool_result. Raises ToolError."""
        if self.plugins is not None:
            return await self.plugins.call_tool(node_name, tool_name, arguments, workspace, call_id)
        return await self.run_tool(node_name, tool_name, arguments, workspace, call_id=call_id)

    async def chat(self, node_name: str, endpoint: "ModelEndpoint", messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, on_delta=None):
        """Ask the node's model for one assistant turn."""
        if self.plugins is not None:
            return await self.plugins.chat(node_name, endpoint, messages, tools, on_delta)
        return await self.client.chat(endpoint, messages, tools, on_delta=on_delta)

    async def run_tool(self, node_name: str, tool_name: str, arguments: dict[str, Any],
                       workspace: "Workspace", call_id: str | None = None) -> dict[str, Any]:
        """Run one executable of the tools folder, with no plugin in between."""
        from heddle.tools.process import run_tool_process
        from heddle.workspace.sandbox import confine

        executable = self.tools[tool_name]
        self.emit(ev.ToolCall(node=node_name, tool=tool_name, call_id=call_id, arguments=arguments))
        argv, env = confine(self.options.sandbox, [str(executable)], workspace=workspace,
                            tools_dir=self.tools_dir, env=workspace.env(os.environ))
        started = time.perf_counter()
        try:
            output = await run_tool_process(tool_name, argv, arguments, cwd=workspace.root, env=env,
                                            timeout=self.options.tool_timeout, surface=self.options.surface,
                                            sandboxed=self.options.sandbox.safe)
        except Exception as exc:
            self.emit(ev.ToolResult(node=node_name, tool=tool_name, call_id=call_id, ok=False,
                                    output={"error": str(exc)},
                                    duration_ms=(time.perf_counter() - started) * 1000))
            raise
        self.emit(ev.ToolResult(node=node_name, tool=tool_name, call_id=call_id, ok=True, output=output,
                                duration_ms=(time.perf_counter() - started) * 1000))
        return output
