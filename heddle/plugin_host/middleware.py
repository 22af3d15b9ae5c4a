"""One run's seams with plugins loaded (heddle.engine.seams): the engine calls them, they ask
middleware around the engine's own step (`next`).

Before-middleware is asked in load order (`--plugin` order, then component order) and a
modify feeds the next one; a replace or reject ends the chain. After-middleware is asked in
the reverse order, so the first plugin loaded wraps all the others. Every replace and retry
emits a `warning` event naming the plugin.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from heddle.blocking import Tasks
from heddle.engine import events as ev
from heddle.engine.journal import Suspended
from heddle.engine.seams import (
    AgentRound,
    ModelRequest,
    ModelStep,
    NodeStep,
    Outcome,
    ProvidedTool,
    Rendering,
    RoundResult,
    RoundStep,
    ToolRequest,
    ToolStep,
)
from heddle.errors import ToolError
from heddle.plugin_host.callbacks import Scope, endpoint_of, handler_for
from heddle.plugin_host.encoder import EncoderSink
from heddle.plugin_host.errors import PluginError, PluginRejected
from heddle.plugin_host.manifest import Component, Phase
from heddle.plugin_host.nodes import execute_plugin_node
from heddle.plugin_host.process import OnPartial, PluginCallError
from heddle.plugin_host.seams import Verdict, parse_verdict
from heddle.plugin_host.tools import ProvidedPluginTool
from heddle.plugin_host.turns import turn_from_json, turn_to_json

if TYPE_CHECKING:
    from heddle.agentspec import components as c
    from heddle.engine.context import RunContext
    from heddle.model.client import ModelEndpoint
    from heddle.model.turn import AssistantTurn
    from heddle.plugin_host.host import PluginHost
    from heddle.plugin_host.process import PluginProcess
    from heddle.workspace.workspace import Workspace


def _answer(output: dict[str, Any]) -> ToolStep:
    async def step(request: ToolRequest) -> dict[str, Any]:
        return output

    return step


def _refuse(error: ToolError) -> ToolStep:
    async def step(request: ToolRequest) -> dict[str, Any]:
        raise error

    return step


class PluginRun:
    """The seams of one run (heddle.engine.seams.RunSeams): its middleware, its plugins' node
    types and tools, the encoder rendering it; leaving it stops the host's processes unless
    the host serves further runs."""

    def __init__(self, host: PluginHost, ctx: RunContext, run_id: str, rendering: Rendering | None = None) -> None:
        self.host = host
        self.ctx = ctx
        self.run_id = run_id
        self._rendering = rendering
        self._encoder: EncoderSink | None = None
        self._tasks = Tasks()  # the run's own tasks (its encoder's): stopped when it ends
        self._finished = False
        self._nodes: list[c.Node] = []  # the nodes running now, innermost last (FlowNodes nest)

    # ---------------------------------------------------------------- the run's lifetime

    async def __aenter__(self) -> Self:
        if self._rendering is not None:
            rendering = self._rendering
            try:
                self._encoder = EncoderSink(self.host, rendering.protocol, rendering.write, run_id=self.run_id,
                                            options=self.ctx.options, tasks=self._tasks)
            except BaseException:
                await self._stop_processes()
                raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            encoder = self._encoder
            if encoder is not None and isinstance(exc, Exception) and not self._finished:
                # The error is the run's answer; an encoder failing to render it must not hide it.
                with contextlib.suppress(Exception):
                    await encoder.finish(error=exc)
            await self._tasks.aclose()
        finally:
            await self._stop_processes()

    async def finish(self, state: dict[str, Any]) -> None:
        self._finished = True
        if self._encoder is not None:
            await self._encoder.finish(state=state)

    async def _stop_processes(self) -> None:
        if not self.host.keep_running:
            await self.host.aclose()

    def event(self, event: ev.Event, next: ev.EventSink) -> None:
        next(event)
        if self._encoder is not None:
            self._encoder(event)

    # ---------------------------------------------------------------- asking plugins

    def process(self, plugin: str) -> PluginProcess:
        return self.host.process(plugin, self.ctx.options)

    async def ask(self, plugin: str, component_type: str | None, method: str, params: dict[str, Any], scope: Scope,
                  on_partial: OnPartial | None = None) -> Any:
        """Call `method` for one component of `plugin`, in this run. PluginCallError when the plugin
        answers with an error, PluginError when its process fails."""
        config = self.host.configs.get(component_type) if component_type is not None else None
        body = {"run": self.run_id, "component": component_type, "config": config, **params}
        return await self.process(plugin).call(method, body, handler=handler_for(self, plugin, scope),
                                               on_partial=on_partial)

    def node_ref(self, name: str | None) -> dict[str, Any] | None:
        node = self._current(name)
        if node is not None:
            return {"name": node.name, "id": node.id, "type": node.component_type}
        return {"name": name, "id": None, "type": None} if name else None

    def _current(self, name: str | None) -> c.Node | None:
        for node in reversed(self._nodes):
            if name is None or node.name == name:
                return node
        return None

    def scope(self, name: str | None, workspace: Workspace | None = None,
              endpoint: ModelEndpoint | None = None) -> Scope:
        if endpoint is None:
            node = self._current(name)
            endpoint = endpoint_of(self.ctx, node) if node is not None else None
        return Scope(node=name, workspace=workspace, endpoint=endpoint)

    async def _verdict(self, component: Component, seam: str, phase: Phase, node: str | None,
                       payload: dict[str, Any], scope: Scope) -> Verdict:
        params = {"seam": seam, "node": self.node_ref(node), **payload}
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

    # ---------------------------------------------------------------- what the plugins add

    def node_type(self, component_type: str) -> NodeStep | None:
        comp = self.host.node_component(component_type)
        if comp is None:
            return None
        return functools.partial(execute_plugin_node, self, comp)

    def tool(self, name: str) -> ProvidedTool | None:
        tool = self.host.tools.get(name)
        if tool is None:
            return None
        return ProvidedPluginTool(self, tool)

    # ---------------------------------------------------------------- node and nodeError

    async def node(self, node: c.Node, inputs: dict[str, Any], next: NodeStep) -> Outcome:
        """One node through the node and nodeError seams."""
        self._nodes.append(node)
        try:
            attempt = 0
            while True:
                attempt += 1
                try:
                    return await self._node_once(node, inputs, next)
                except (asyncio.CancelledError, Suspended):
                    # A node that stops to wait for a person has not failed: no nodeError plugin sees it.
                    raise
                except Exception as exc:
                    outcome = await self._node_error(node, inputs, exc, attempt)
                    if outcome is None:
                        raise
                    if isinstance(outcome, tuple):
                        return outcome
                    await asyncio.sleep(outcome)
        finally:
            # This very node: under a parallel node the last one pushed may be another branch's.
            del self._nodes[max(i for i, running in enumerate(self._nodes) if running is node)]

    async def _node_once(self, node: c.Node, node_input: dict[str, Any], next: NodeStep) -> Outcome:
        name = node.name
        replaced: Outcome | None = None
        for comp in self._chain("node", "before"):
            verdict = await self._verdict(comp, "node", "before", name, {"input": node_input}, self.scope(name))
            if verdict.name == "modify":
                node_input = verdict.value
            elif verdict.name == "replace":
                self._warn(comp, f"replaced the output of node {name!r} before it ran", name)
                replaced = (verdict.value, verdict.branch)
                break
            elif verdict.name == "reject":
                raise PluginRejected(f"node {name!r} was rejected by {comp.label()}: {verdict.reason}")
        output, branch = replaced if replaced is not None else await next(node, node_input)
        for comp in self._chain("node", "after"):
            verdict = await self._verdict(comp, "node", "after", name,
                                          {"input": node_input, "output": output, "branch": branch}, self.scope(name))
            if verdict.name == "replace":
                self._warn(comp, f"replaced the output of node {name!r}", name)
                output = verdict.value
                branch = verdict.branch if verdict.branch is not None else branch
            elif verdict.name == "fail":
                raise PluginRejected(f"node {name!r} was failed by {comp.label()}: {verdict.reason}")
        return output, branch

    async def _node_error(self, node: c.Node, node_input: dict[str, Any], error: Exception,
                          attempt: int) -> Outcome | float | None:
        """What the nodeError middleware makes of a failed node: an outcome that replaces it, a
        delay before the next attempt, or None for the error to stand."""
        name, limit = node.name, self.host.max_node_attempts
        for comp in self._chain("nodeError", "after"):
            payload = {"input": node_input, "error": str(error), "errorKind": getattr(error, "kind", "error"),
                       "attempt": attempt, "maxAttempts": limit}
            verdict = await self._verdict(comp, "nodeError", "after", name, payload, self.scope(name))
            if verdict.name == "pass":
                continue
            if verdict.name == "replace":
                self._warn(comp, f"replaced the output of node {name!r}, which failed: {error}", name)
                return verdict.value, verdict.branch
            if verdict.name == "fail":
                raise PluginRejected(f"node {name!r} failed ({error}) and {comp.label()} says: "
                                     f"{verdict.reason}") from error
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

    async def call_tool(self, request: ToolRequest, next: ToolStep, caller: str | None = None) -> dict[str, Any]:
        """One tool call through the toolCall seam. `caller` is the plugin asking (runTool), whose
        own middleware is left out."""
        node, tool = request.node, request.tool
        scope = self.scope(node, request.workspace)
        payload: dict[str, Any] = {"tool": tool, "callId": request.call_id}
        output: dict[str, Any] | None = None
        for comp in self._chain("toolCall", "before", caller):
            verdict = await self._verdict(comp, "toolCall", "before", node,
                                          {**payload, "arguments": request.arguments}, scope)
            if verdict.name == "modify":
                request = dataclasses.replace(request, arguments=verdict.value)
            elif verdict.name == "replace":
                self._warn(comp, f"replaced the result of tool {tool!r} without running it", node)
                output = await self.ctx.record_tool(request, _answer(verdict.value))
                break
            elif verdict.name == "reject":
                refusal = ToolError(tool, f"the call was rejected by {comp.label()}: {verdict.reason}")
                # Recorded as a failed call, which raises the refusal: the caller sees it as the tool's error.
                await self.ctx.record_tool(request, _refuse(refusal))
        error: ToolError | None = None
        if output is None:
            try:
                output = await next(request)
            except ToolError as exc:
                error = exc
        for comp in self._chain("toolCall", "after", caller):
            result = {"ok": True, "output": output} if error is None else {"ok": False, "error": error.message}
            verdict = await self._verdict(comp, "toolCall", "after", node,
                                          {**payload, "arguments": request.arguments, **result}, scope)
            if verdict.name == "replace":
                self._warn(comp, f"replaced the result of tool {tool!r}", node)
                output, error = verdict.value, None
            elif verdict.name == "fail":
                raise ToolError(tool, f"the call was failed by {comp.label()}: {verdict.reason}")
        if error is not None:
            raise error
        assert output is not None
        return output

    # ---------------------------------------------------------------- modelCall and agentRound

    async def call_model(self, request: ModelRequest, next: ModelStep, caller: str | None = None) -> AssistantTurn:
        """One model call through the modelCall seam (`caller` as for call_tool)."""
        node = request.node
        scope = self.scope(node, endpoint=request.endpoint)
        for comp in self._chain("modelCall", "before", caller):
            verdict = await self._verdict(comp, "modelCall", "before", node,
                                          {"messages": request.messages, "tools": request.tools}, scope)
            if verdict.name == "modify":
                request = dataclasses.replace(
                    request, messages=verdict.value if verdict.value is not None else request.messages,
                    tools=verdict.tools if verdict.sets_tools else request.tools)
            elif verdict.name == "replace":
                self._warn(comp, f"replaced the model's answer to node {node!r} without asking the model", node)
                return self._turn(comp, verdict.value)
            elif verdict.name == "reject":
                raise PluginRejected(f"the model call of node {node!r} was rejected by {comp.label()}: "
                                     f"{verdict.reason}")
        limit = self.host.max_node_attempts
        attempt = 0
        while True:
            attempt += 1
            turn = await next(request)
            retry: float | None = None
            for comp in self._chain("modelCall", "after", caller):
                verdict = await self._verdict(comp, "modelCall", "after", node,
                                              {"messages": request.messages, "tools": request.tools,
                                               "response": turn_to_json(turn), "attempt": attempt,
                                               "maxAttempts": limit}, scope)
                if verdict.name == "replace":
                    self._warn(comp, f"replaced the model's answer to node {node!r}", node)
                    turn = self._turn(comp, verdict.value)
                elif verdict.name == "fail":
                    raise PluginRejected(f"the model call of node {node!r} was failed by {comp.label()}: "
                                         f"{verdict.reason}")
                elif verdict.name == "retry":
                    if attempt >= limit:
                        raise PluginRejected(f"{comp.label()} asked to retry the model call of node {node!r}, "
                                             f"but it was made {attempt} time(s), the --max-node-attempts {limit}")
                    self._warn(comp, f"retried the model call of node {node!r} (attempt {attempt + 1} of "
                                     f"{limit})" + (f": {verdict.reason}" if verdict.reason else ""), node)
                    retry = verdict.delay
                    break
            if retry is None:
                return turn
            await asyncio.sleep(retry)

    @staticmethod
    def _turn(comp: Component, value: Any) -> AssistantTurn:
        try:
            return turn_from_json(value, where="response")
        except ValueError as exc:
            raise PluginError(comp.plugin, f"{comp.component_type} answered modelCall with a response heddle "
                                           f"cannot use: {exc}") from None

    async def agent_round(self, agent_round: AgentRound, next: RoundStep) -> RoundResult:
        node, number = agent_round.node, agent_round.number
        for comp in self._chain("agentRound", "before"):
            verdict = await self._verdict(comp, "agentRound", "before", node,
                                          {"round": number, "messages": agent_round.messages}, self.scope(node))
            if verdict.name == "reject":
                raise PluginRejected(f"agent {node!r} was stopped before round {number} by {comp.label()}: "
                                     f"{verdict.reason}")
        done = await next(agent_round)
        for comp in self._chain("agentRound", "after"):
            verdict = await self._verdict(comp, "agentRound", "after", node,
                                          {"round": number, "response": turn_to_json(done.turn),
                                           "toolResults": done.tool_results}, self.scope(node))
            if verdict.name == "fail":
                raise PluginRejected(f"agent {node!r} was failed after round {number} by {comp.label()}: "
                                     f"{verdict.reason}")
        return done
