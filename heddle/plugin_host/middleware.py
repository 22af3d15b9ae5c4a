"""One run's view of the loaded plugins: the engine calls it at each seam.

Before-middleware is asked in load order (`--plugin` order, then component order) and a
modify feeds the next one; a replace or reject ends the chain. After-middleware is asked in
the reverse order, so the first plugin loaded wraps all the others. Every replace and retry
emits a `warning` event naming the plugin.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from heddle.engine import events as ev
from heddle.errors import ModelError, ToolError
from heddle.plugin_host.callbacks import Scope, endpoint_of, handler_for
from heddle.plugin_host.errors import PluginError, PluginRejected
from heddle.plugin_host.manifest import Component, Phase
from heddle.plugin_host.process import PluginCallError
from heddle.plugin_host.seams import Verdict, parse_verdict

if TYPE_CHECKING:
    from heddle.engine.context import RunContext
    from heddle.plugin_host.host import PluginHost

Outcome = tuple[dict[str, Any], "str | None"]


class PluginRun:
    def __init__(self, host: "PluginHost", ctx: "RunContext", run_id: str) -> None:
        self.host = host
        self.ctx = ctx
        self.run_id = run_id
        self._nodes: list[Any] = []  # the nodes running now, innermost last (FlowNodes nest)

    # ---------------------------------------------------------------- asking plugins

    def process(self, plugin: str):
        return self.host.process(plugin, self.ctx.options)

    async def ask(self, plugin: str, component_type: str, method: str, params: dict[str, Any], scope: Scope,
                  on_partial=None) -> Any:
        """Call `method` for one component of `plugin`, in this run. PluginCallError when the plugin
        answers with an error, PluginError when its process fails."""
        body = {"run": self.run_id, "component": component_type, "config": self.host.configs.get(component_type),
                **params}
        return await self.process(plugin).call(method, body, handler=handler_for(self, plugin, scope),
                                               on_partial=on_partial)

    def _node_ref(self, name: str | None) -> dict[str, Any] | None:
        node = self._current(name)
        if node is not None:
            return {"name": node.name, "id": node.id, "type": node.component_type}
        return {"name": name, "id": None, "type": None} if name else None

    def _current(self, name: str | None) -> Any:
        for node in reversed(self._nodes):
            if name is None or node.name == name:
                return node
        return None

    def _scope(self, name: str | None, workspace: Any = None, endpoint: Any = None) -> Scope:
        if endpoint is None:
            node = self._current(name)
            endpoint = endpoint_of(self.ctx, node) if node is not None else None
        return Scope(node=name, workspace=workspace, endpoint=endpoint)

    async def _verdict(self, component: Component, seam: str, phase: Phase, node: str | None,
                       payload: dict[str, Any], scope: Scope) -> Verdict:
        params = {"seam": seam, "node": self._node_ref(node), **payload}
        try:
            result = await self.ask(component.plugin, component.component_type, phase, params, scope)
        except PluginCallError as exc:
            raise PluginError(component.plugin, f"{component.component_type} failed {seam}.{phase}: {exc}") from None
        return parse_verdict(component, seam, phase, result)

    def _warn(self, component: Component, message: str, node: str | None) -> None:
        self.ctx.emit(ev.Warning(message=f"{component.label()} {message}", node=node))

    def _chain(self, seam: str, phase: Phase, caller: str | None = None) -> list[Component]:
        chain = self.host.chain(seam, phase)
        if caller is not None:
            # A plugin's own calls back into heddle do not pass through its own middleware.
            chain = [c for c in chain if c.plugin != caller]
        return chain if phase == "before" else list(reversed(chain))

    # ---------------------------------------------------------------- node and nodeError

    async def run_node(self, node: Any, node_input: dict[str, Any]) -> Outcome:
        """Run one node through the node and nodeError seams; plugin node types run in their plugin."""
        self._nodes.append(node)
        try:
            attempt = 0
            while True:
                attempt += 1
                try:
                    return await self._node_once(node, node_input)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    outcome = await self._node_error(node, node_input, exc, attempt)
                    if outcome is None:
                        raise
                    if isinstance(outcome, tuple):
                        return outcome
                    await asyncio.sleep(outcome)
        finally:
            self._nodes.pop()

    async def _node_once(self, node: Any, node_input: dict[str, Any]) -> Outcome:
        from heddle.engine.nodes import EXECUTORS

        name = node.name
        replaced: Outcome | None = None
        for comp in self._chain("node", "before"):
            verdict = await self._verdict(comp, "node", "before", name, {"input": node_input}, self._scope(name))
            if verdict.name == "modify":
                node_input = verdict.value
            elif verdict.name == "replace":
                self._warn(comp, f"replaced the output of node {name!r} before it ran", name)
                replaced = (verdict.value, verdict.branch)
                break
            elif verdict.name == "reject":
                raise PluginRejected(f"node {name!r} was rejected by {comp.label()}: {verdict.reason}")
        if replaced is not None:
            output, branch = replaced
        elif node.component_type in EXECUTORS:
            output, branch = await EXECUTORS[node.component_type](self.ctx, node, node_input)
        else:
            from heddle.plugin_host.nodes import execute_plugin_node

            output, branch = await execute_plugin_node(self, node, node_input)
        for comp in self._chain("node", "after"):
            verdict = await self._verdict(comp, "node", "after", name,
                                          {"input": node_input, "output": output, "branch": branch}, self._scope(name))
            if verdict.name == "replace":
                self._warn(comp, f"replaced the output of node {name!r}", name)
                output = verdict.value
                branch = verdict.branch if verdict.branch is not None else branch
            elif verdict.name == "fail":
                raise PluginRejected(f"node {name!r} was failed by {comp.label()}: {verdict.reason}")
        return output, branch

    async def _node_error(self, node: Any, node_input: dict[str, Any], error: Exception,
                          attempt: int) -> Outcome | float | None:
        """What the nodeError middleware makes of a failed node: an outcome that replaces it, a
        delay before the next attempt, or None for the error to stand."""
        name, limit = node.name, self.host.max_node_attempts
        for comp in self._chain("nodeError", "after"):
            payload = {"input": node_input, "error": str(error), "errorKind": getattr(error, "kind", "error"),
                       "attempt": attempt, "maxAttempts": limit}
            verdict = await self._verdict(comp, "nodeError", "after", name, payload, self._scope(name))
            if verdict.name == "pass":
                continue
            if verdict.name == "replace":
                self._warn(comp, f"replaced the output of node {name!r}, which failed: {error}", name)
                return verdict.value, verdict.branch
            if verdict.name == "fail":
                raise PluginRejected(f"node {name!r} failed ({error}) and {comp.label()} says: {verdict.reason}") from error
            if attempt >= limit:
                self._warn(comp, f"asked to retry node {name!r}, but it has run {attempt} time(s), the "
                                 f"--max-node-attempts {limit}; the error stands", name)
                return None
            why = f" ({verdict.reason})" if verdict.reason else ""
            self._warn(comp, f"retried node {name!r} (attempt {attempt + 1} of {limit}, after "
                             f"{verdict.delay:g} s){why} after: {error}", name)
            return verdict.delay
        return None

    # ---------------------------------------------------------------- toolCall

    async def call_tool(self, node_name: str, tool_name: str, arguments: dict[str, Any], workspace: Any,
                        call_id: str | None = None, caller: str | None = None) -> dict[str, Any]:
        """One tool call through the toolCall seam: a plugin's tool, or the tools folder's."""
        scope = self._scope(node_name, workspace)
        payload: dict[str, Any] = {"tool": tool_name, "callId": call_id}
        output: dict[str, Any] | None = None
        for comp in self._chain("toolCall", "before", caller):
            verdict = await self._verdict(comp, "toolCall", "before", node_name, {**payload, "arguments": arguments},
                                          scope)
            if verdict.name == "modify":
                arguments = verdict.value
            elif verdict.name == "replace":
                self._warn(comp, f"replaced the result of tool {tool_name!r} without running it", node_name)
                output = verdict.value
                self._emit_call(node_name, tool_name, call_id, arguments, output, ok=True, started=time.perf_counter())
                break
            elif verdict.name == "reject":
                message = f"the call was rejected by {comp.label()}: {verdict.reason}"
                self._emit_call(node_name, tool_name, call_id, arguments, {"error": message}, ok=False,
                                started=time.perf_counter())
                raise ToolError(tool_name, message)
        error: ToolError | None = None
        if output is None:
            try:
                output = await self._invoke_tool(node_name, tool_name, arguments, workspace, call_id, scope)
            except ToolError as exc:
                error = exc
        for comp in self._chain("toolCall", "after", caller):
            result = {"ok": True, "output": output} if error is None else {"ok": False, "error": error.message}
            verdict = await self._verdict(comp, "toolCall", "after", node_name,
                                          {**payload, "arguments": arguments, **result}, scope)
            if verdict.name == "replace":
                self._warn(comp, f"replaced the result of tool {tool_name!r}", node_name)
                output, error = verdict.value, None
            elif verdict.name == "fail":
                raise ToolError(tool_name, f"the call was failed by {comp.label()}: {verdict.reason}")
        if error is not None:
            raise error
        assert output is not None
        return output

    def _emit_call(self, node: str, tool: str, call_id: str | None, arguments: Any, output: Any, *, ok: bool,
                   started: float) -> None:
        self.ctx.emit(ev.ToolCall(node=node, tool=tool, call_id=call_id, arguments=arguments))
        self.ctx.emit(ev.ToolResult(node=node, tool=tool, call_id=call_id, ok=ok, output=output,
                                    duration_ms=(time.perf_counter() - started) * 1000))

    async def _invoke_tool(self, node_name: str, tool_name: str, arguments: dict[str, Any], workspace: Any,
                           call_id: str | None, scope: Scope) -> dict[str, Any]:
        tool = self.host.tools.get(tool_name)
        if tool is None:
            return await self.ctx.run_tool(node_name, tool_name, arguments, workspace, call_id=call_id)
        from heddle.plugin_host.tools import invoke_plugin_tool

        return await invoke_plugin_tool(self, tool, node_name, arguments, workspace, call_id, scope)

    # ---------------------------------------------------------------- modelCall and agentRound

    async def chat(self, node_name: str, endpoint: Any, messages: list[dict[str, Any]],
                   tools: list[dict[str, Any]] | None, on_delta: Any, caller: str | None = None) -> Any:
        """One model call through the modelCall seam."""
        from heddle.plugin_host.turns import turn_from_json, turn_to_json

        scope = self._scope(node_name, endpoint=endpoint)
        for comp in self._chain("modelCall", "before", caller):
            verdict = await self._verdict(comp, "modelCall", "before", node_name,
                                          {"messages": messages, "tools": tools}, scope)
            if verdict.name == "modify":
                messages = verdict.value if verdict.value is not None else messages
                tools = verdict.tools if verdict.sets_tools else tools
            elif verdict.name == "replace":
                self._warn(comp, f"replaced the model's answer to node {node_name!r} without asking the model",
                           node_name)
                return self._turn(comp, verdict.value, turn_from_json)
            elif verdict.name == "reject":
                raise PluginRejected(f"the model call of node {node_name!r} was rejected by {comp.label()}: "
                                     f"{verdict.reason}")
        limit = self.host.max_node_attempts
        attempt = 0
        while True:
            attempt += 1
            if self.ctx.client is None:
                raise ModelError(f"node {node_name!r} has no model client")
            turn = await self.ctx.client.chat(endpoint, messages, tools, on_delta=on_delta)
            retry: float | None = None
            for comp in self._chain("modelCall", "after", caller):
                verdict = await self._verdict(comp, "modelCall", "after", node_name,
                                              {"messages": messages, "tools": tools, "response": turn_to_json(turn),
                                               "attempt": attempt, "maxAttempts": limit}, scope)
                if verdict.name == "replace":
                    self._warn(comp, f"replaced the model's answer to node {node_name!r}", node_name)
                    turn = self._turn(comp, verdict.value, turn_from_json)
                elif verdict.name == "fail":
                    raise PluginRejected(f"the model call of node {node_name!r} was failed by {comp.label()}: "
                                         f"{verdict.reason}")
                elif verdict.name == "retry":
                    if attempt >= limit:
                        raise PluginRejected(f"{comp.label()} asked to retry the model call of node {node_name!r}, "
                                             f"but it was made {attempt} time(s), the --max-node-attempts {limit}")
                    self._warn(comp, f"retried the model call of node {node_name!r} (attempt {attempt + 1} of "
                                     f"{limit})" + (f": {verdict.reason}" if verdict.reason else ""), node_name)
                    retry = verdict.delay
                    break
            if retry is None:
                return turn
            await asyncio.sleep(retry)

    @staticmethod
    def _turn(comp: Component, value: Any, turn_from_json) -> Any:
        try:
            return turn_from_json(value, where="response")
        except ValueError as exc:
            raise PluginError(comp.plugin, f"{comp.component_type} answered modelCall with a response heddle "
                                           f"cannot use: {exc}") from None

    async def round_before(self, node_name: str, round_no: int, messages: list[dict[str, Any]]) -> None:
        for comp in self._chain("agentRound", "before"):
            verdict = await self._verdict(comp, "agentRound", "before", node_name,
                                          {"round": round_no, "messages": messages}, self._scope(node_name))
            if verdict.name == "reject":
                raise PluginRejected(f"agent {node_name!r} was stopped before round {round_no} by {comp.label()}: "
                                     f"{verdict.reason}")

    async def round_after(self, node_name: str, round_no: int, turn: Any, results: list[Any]) -> None:
        from heddle.plugin_host.turns import turn_to_json

        for comp in self._chain("agentRound", "after"):
            verdict = await self._verdict(comp, "agentRound", "after", node_name,
                                          {"round": round_no, "response": turn_to_json(turn), "toolResults": results},
                                          self._scope(node_name))
            if verdict.name == "fail":
                raise PluginRejected(f"agent {node_name!r} was failed after round {round_no} by {comp.label()}: "
                                     f"{verdict.reason}")

    def has(self, seam: str, phase: Phase) -> bool:
        return bool(self.host.chain(seam, phase))

