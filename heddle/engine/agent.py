"""The AgentNode loop: ask the model, run the tools it asks for, send back the results.

Everything a model can get wrong (an unknown tool, arguments that break the schema, a tool that
fails) goes back to it as an error it can recover from; only the limits end the loop.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec import io
from heddle.agentspec.templates import render
from heddle.engine import events as ev
from heddle.engine import structured
from heddle.engine.context import RunContext
from heddle.engine.journal import WaitingFor
from heddle.engine.seams import AgentRound, ModelRequest, RoundResult, ToolRequest
from heddle.engine.tool_output import limits_of, tool_message
from heddle.engine.transforms import AgentTransforms
from heddle.errors import LimitError, NeedsSessionError, ToolError
from heddle.safeparse import loads_json
from heddle.tools.schema import check_arguments, function_definition

if TYPE_CHECKING:
    from heddle.model.turn import ToolCall
    from heddle.workspace.workspace import Workspace


def _error(text: str) -> dict[str, str]:
    return {"error": f"Error: {text}"}


def answer_shape(node: c.AgentNode) -> structured.Shape | None:
    """How the agent's final answer gives its declared outputs, when they call for structured
    generation (several outputs, or one that is not a string); None when the answer is plain text.
    `result`, the answer itself, may be left out of the JSON object."""
    outputs = io.outputs_of(node) or []
    if not structured.is_structured(outputs):
        return None
    return structured.shape(outputs, optional=frozenset({"result"}))


def answer_outputs(answer: str, node: c.AgentNode) -> dict[str, Any]:
    """The agent's outputs from its final answer: `result` (the answer, unless the JSON object gives
    one) and its declared outputs, typed; the keys of an answer that is a JSON object are kept too.

    With structured outputs an answer that does not fit raises structured.AnswerMismatch.
    """
    shape = answer_shape(node)
    if shape is not None:
        return {"result": answer, **shape.read(answer)}
    outputs: dict[str, Any] = {"result": answer}
    titles = io.titles(io.outputs_of(node))
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
    agent = node.agent
    assert isinstance(agent, c.Agent | c.SpecializedAgent), "groups and A2A agents run elsewhere (nodes.agent_node)"
    endpoint = ctx.endpoint(agent.llm_config)
    # The document's own tools for this agent (its MCP toolboxes', its MCP tools as their servers
    # list them: heddle.tools.provided) replace the definitions of the same name.
    offered = ctx.document_tools.by_agent.get(agent.id or agent.name, [])
    replaced = {d["function"]["name"] for d in offered}
    all_definitions = [function_definition(t) for t in agent.tools if t.name not in replaced] + offered
    schemas = {d["function"]["name"]: d["function"]["parameters"] for d in all_definitions}
    definitions = all_definitions or None
    messages: list[dict[str, Any]] = []
    if agent.system_prompt:
        messages.append({"role": "system", "content": render(agent.system_prompt, inputs)})
    # An agent in a flow shares the flow's conversation (the specification's): it sees what the run
    # has shown so far, as the agent's own messages.
    messages += [{"role": "assistant", "content": text} for text in ctx.shown]
    # The document's own top-level agent is talking to the run's user, and in a session it continues
    # the conversation of the turns before; an agent inside a flow is handed its inputs.
    top = ctx.message if ctx.message is not None and ctx.message.node is node else None
    history_from = len(messages)
    if top is not None and ctx.conversation is not None:
        messages += [dict(m) for m in ctx.conversation.agents.get(_agent_key(agent), [])]
    user = top.text if top is not None else json.dumps(inputs, ensure_ascii=False)
    messages.append({"role": "user", "content": user})
    confirm = confirmed_tools(ctx, agent)
    # A human_in_the_loop agent in a flow gives outputs other than its answer as a JSON object; an
    # answer in prose is then meant for the person (the specification's default is true).
    talks = agent.human_in_the_loop and any(t != "result" for t in io.titles(io.outputs_of(node)))
    limit = ctx.options.max_tool_rounds
    truncates = limits_of(agent.tools)  # the tools' own, tighter limits on what the model gets of a result
    response_format, retried = _ask_for_outputs(node, messages, offers_tools=bool(definitions)), False
    transforms = None
    if agent.transforms:
        # What the model is sent of the conversation, each round; the conversation kept is whole.
        transforms = AgentTransforms(ctx, node.name, agent, lasting=top is not None)

    def on_delta(text: str) -> None:
        ctx.emit(ev.TokenDelta(node=node.name, text=text))

    async with ctx.workspaces.enter(node.name) as workspace:

        async def one_round(agent_round: AgentRound) -> RoundResult:
            sent = agent_round.messages if transforms is None else await transforms.apply(agent_round.messages)
            turn = await ctx.chat(ModelRequest(node.name, endpoint, sent, definitions, on_delta,
                                               response_format))
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
                result = await _one_call(ctx, node.name, call, schemas, workspace, confirm)
                agent_round.messages.append(await tool_message(ctx, workspace, call.id, result,
                                                               limit=truncates.get(call.name)))
                results.append({"id": call.id, "name": call.name, "result": result})
            return RoundResult(turn, results)

        number = 0
        while True:
            number += 1
            done = await ctx.seams.agent_round(AgentRound(node.name, number, messages), one_round)
            if not done.turn.tool_calls:
                answer = done.turn.content or ""
                if top is None and talks and not _looks_like_json(answer):
                    # Prose where its outputs were asked for: a human_in_the_loop agent in a flow is
                    # speaking to the person, and waits for the reply (the same turn goes on with it).
                    if ctx.journal is None:
                        raise _talks_to_the_user(node, ctx.options.surface.say("session"))
                    reply = ctx.wait(WaitingFor("message", node.name, prompt=answer))
                    messages += [{"role": "assistant", "content": answer},
                                 {"role": "user", "content": reply.message or ""}]
                    continue
                try:
                    outputs = answer_outputs(answer, node)
                    if top is not None:
                        top.answer = answer
                        if ctx.conversation is not None:
                            ctx.conversation.agents[_agent_key(agent)] = [
                                *messages[history_from:], {"role": "assistant", "content": answer}]
                    return outputs
                except structured.AnswerMismatch as problem:
                    if retried:
                        shape = answer_shape(node)
                        assert shape is not None, "only structured outputs can mismatch"
                        raise structured.failure(f"agent {node.name!r}", shape, problem) from None
                    retried = True
                    messages += [{"role": "assistant", "content": answer},
                                 {"role": "user", "content": structured.retry_message(problem)}]


def confirmed_tools(ctx: RunContext, agent: c.Agent) -> frozenset[str]:
    """The tools of `agent` whose every call a person approves first: its own that require
    confirmation, and those of its toolboxes that do."""
    own = {t.name for t in agent.tools if t.requires_confirmation}
    return frozenset(own | ctx.document_tools.confirm.get(agent.id or agent.name, set()))


def _looks_like_json(answer: str) -> bool:
    return structured.unfenced(answer)[:1] in ("{", "[")


def _talks_to_the_user(node: c.AgentNode, session: str) -> NeedsSessionError:
    # Prose where JSON outputs were asked for is, with human_in_the_loop, the agent speaking to the
    # person; without a session there is no one to answer, and asking the model again would turn
    # the conversation into something the document did not say.
    return NeedsSessionError(
        f"agent {node.agent.name!r} of AgentNode {node.name!r} answered the user instead of giving its outputs "
        "(human_in_the_loop is true unless the document sets it false): waiting for the user's reply needs a "
        f"session ({session}); set human_in_the_loop: false to have it always give its outputs")


def _agent_key(agent: c.Agent) -> str:
    return agent.id or agent.name


def _ask_for_outputs(node: c.AgentNode, messages: list[dict[str, Any]], *, offers_tools: bool) -> dict[str, Any] | None:
    """Tell the model the shape of its final answer: as `response_format` where the endpoint takes it
    and the agent has no tools (a schema-constrained turn could not call one), else in the system prompt."""
    shape = answer_shape(node)
    if shape is None:
        return None
    assert isinstance(node.agent, c.Agent), "a Swarm or a ManagerWorkers asks in heddle.engine.multiagent"
    if not offers_tools and node.agent.llm_config.component_type in structured.RESPONSE_FORMAT_CONFIGS:
        return shape.response_format(node.agent.name or node.name)
    instruction = "When you give your final answer (not a tool call): " + shape.instruction()
    if messages and messages[0]["role"] == "system":
        messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{instruction}"}
    else:
        messages.insert(0, {"role": "system", "content": instruction})
    return None


async def _one_call(ctx: RunContext, node_name: str, call: ToolCall, schemas: dict[str, dict[str, Any]],
                    workspace: Workspace, confirm: frozenset[str] = frozenset()) -> Any:
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
    if call.name in confirm:
        # requires_confirmation: a person approves each call first; a denied call never runs, and the
        # model is told why.
        verdict = ctx.wait(WaitingFor("approval", node_name, tool=call.name, arguments=filled))
        if not verdict.approved:
            return _error(f"the user denied this call to {call.name!r}: {verdict.reason or 'no reason given'}")
    try:
        return await ctx.call_tool(ToolRequest(node_name, call.name, filled, workspace, call.id))
    except ToolError as exc:
        return _error(str(exc))
