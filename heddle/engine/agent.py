"""The AgentNode loop: ask the model, run the tools it asks for, send back the results.

Everything a model can get wrong (an unknown tool, arguments that break the schema, a tool that
fails) goes back to it as an error it can recover from; only the limits end the loop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from heddle.engine import events as ev
from heddle.engine.context import RunContext
from heddle.engine.seams import AgentRound, ModelRequest, RoundResult, ToolRequest
from heddle.engine.templates import render
from heddle.errors import LimitError, ToolError
from heddle.safeparse import loads_json
from heddle.spec import components as c

if TYPE_CHECKING:
    from heddle.model.turn import ToolCall
    from heddle.workspace.workspace import Workspace


def _tool_message(call_id: str, content: Any) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id,
            "content": json.dumps(content, ensure_ascii=False, separators=(",", ":"))}


def _error(text: str) -> dict[str, str]:
    return {"error": f"Error: {text}"}


def answer_outputs(answer: str, node: c.AgentNode) -> dict[str, Any]:
    """`{"result": answer}`, plus the answer's keys when it is a JSON object."""
    outputs: dict[str, Any] = {"result": answer}
    titles = node.output_titles()
    if len(titles) == 1 and titles[0] != "result":
        outputs[titles[0]] = answer
    try:
        parsed = loads_json(answer)
    except (TypeError, ValueError):
        parsed = None
    if isinstance(parsed, dict):
        outputs.update(parsed)
    return outputs


async def run_agent(ctx: RunContext, node: c.AgentNode, inputs: dict[str, Any]) -> dict[str, Any]:
    from heddle.tools.schema import function_definition, input_schema

    agent = node.agent
    endpoint = ctx.endpoint(agent.llm_config)
    schemas = {tool.name: input_schema(tool) for tool in agent.tools}
    definitions = [function_definition(tool) for tool in agent.tools] or None
    messages: list[dict[str, Any]] = []
    if agent.system_prompt:
        messages.append({"role": "system", "content": render(agent.system_prompt, inputs)})
    messages.append({"role": "user", "content": json.dumps(inputs, ensure_ascii=False)})
    limit = ctx.options.max_tool_rounds

    def on_delta(text: str) -> None:
        ctx.emit(ev.TokenDelta(node=node.name, text=text))

    async with ctx.workspaces.enter(node.name) as workspace:

        async def one_round(agent_round: AgentRound) -> RoundResult:
            turn = await ctx.chat(ModelRequest(node.name, endpoint, agent_round.messages, definitions, on_delta))
            if not turn.tool_calls:
                return RoundResult(turn, [])
            if limit is not None and agent_round.number >= limit:
                raise LimitError(
                    f"agent {node.name!r} exceeded --max-tool-rounds {limit}: the model was still "
                    f"calling tools after {agent_round.number} round(s)"
                )
            agent_round.messages.append(turn.as_message())
            results = []
            for call in turn.tool_calls:
                result = await _one_call(ctx, node.name, call, schemas, workspace)
                agent_round.messages.append(_tool_message(call.id, result))
                results.append({"id": call.id, "name": call.name, "result": result})
            return RoundResult(turn, results)

        number = 0
        while True:
            number += 1
            done = await ctx.seams.agent_round(AgentRound(node.name, number, messages), one_round)
            if not done.turn.tool_calls:
                return answer_outputs(done.turn.content or "", node)


async def _one_call(ctx: RunContext, node_name: str, call: ToolCall, schemas: dict[str, dict[str, Any]],
                    workspace: Workspace) -> Any:
    from heddle.tools.schema import check_arguments

    if call.name not in schemas:
        known = ", ".join(sorted(schemas)) or "none"
        return _error(f"there is no tool named {call.name!r}; the tools are: {known}")
    try:
        arguments = loads_json(call.arguments or "{}")
    except ValueError as exc:
        return _error(f"the arguments for {call.name!r} are not valid JSON ({exc}); send a JSON object")
    filled, problem = check_arguments(schemas[call.name], arguments)
    if problem is not None or filled is None:
        return _error(f"the arguments for {call.name!r} do not match its input schema: {problem}")
    try:
        return await ctx.call_tool(ToolRequest(node_name, call.name, filled, workspace, call.id))
    except ToolError as exc:
        return _error(str(exc))
