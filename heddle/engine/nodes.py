"""One executor per node type. Each takes the node's input and returns (outputs, branch)."""

from __future__ import annotations

from typing import Any

from heddle.agentspec import components as c
from heddle.agentspec import io
from heddle.agentspec.io import declared_values
from heddle.agentspec.templates import as_text, render
from heddle.engine import events as ev
from heddle.engine import structured
from heddle.engine.composite import run_composite, walk_subflow
from heddle.engine.context import RunContext
from heddle.engine.journal import WaitingFor
from heddle.engine.seams import ModelRequest, Outcome, ToolRequest
from heddle.errors import CallDenied, MissingInputError, RunError, ToolInputError
from heddle.tools.client import as_output
from heddle.tools.schema import check_arguments, input_schema


async def start_node(ctx: RunContext, node: c.StartNode, inputs: dict[str, Any]) -> Outcome:
    out, missing = declared_values(node.inputs or node.outputs, inputs)
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise MissingInputError(f"the flow needs input {names} (declared by StartNode {node.name!r}); "
                       f"pass it with --input '{{\"{missing[0]}\": ...}}'")
    return out, None


async def tool_node(ctx: RunContext, node: c.ToolNode, inputs: dict[str, Any]) -> Outcome:
    tool = node.tool
    if tool.inputs:
        arguments = {p["title"]: inputs[p["title"]] for p in tool.inputs if p["title"] in inputs}
        filled, problem = check_arguments(input_schema(tool), arguments)
        if problem is not None:
            raise ToolInputError(tool.name,
                                 f"input for ToolNode {node.name!r} does not match the tool's inputs: {problem}")
        arguments = filled or {}
    else:
        # A tool that declares no inputs gets the node's own (none, unless the node declares some).
        arguments = dict(inputs)
    # Every kind of tool, a ClientTool too, asks a person first when it requires confirmation.
    if tool.requires_confirmation:
        verdict = ctx.wait(WaitingFor("approval", node.name, tool=tool.name, arguments=arguments))
        if not verdict.approved:
            raise CallDenied(f"ToolNode {node.name!r}: the user denied the call to tool {tool.name!r}: "
                             f"{verdict.reason or 'no reason given'}")
    if isinstance(tool, c.ClientTool):
        # The client runs it: the flow waits for its result, which is the node's output.
        answer = ctx.wait(WaitingFor("client_tool", node.name, tool=tool.name, arguments=arguments))
        return as_output(tool, answer.tool_result), None
    async with ctx.workspaces.enter(node.name) as workspace:
        output = await ctx.call_tool(ToolRequest(node.name, tool.name, arguments, workspace))
    return output, None


async def llm_node(ctx: RunContext, node: c.LlmNode, inputs: dict[str, Any]) -> Outcome:
    prompt = render(node.prompt_template, inputs)
    outputs = io.outputs_of(node) or []

    def on_delta(text: str) -> None:
        ctx.emit(ev.TokenDelta(node=node.name, text=text))

    endpoint = ctx.endpoint(node.llm_config)
    if not structured.is_structured(outputs):
        turn = await ctx.chat(ModelRequest(node.name, endpoint, [{"role": "user", "content": prompt}], None,
                                           on_delta))
        return {outputs[0]["title"]: turn.content or ""}, None
    shape = structured.shape(outputs)
    response_format = None
    if node.llm_config.component_type in structured.RESPONSE_FORMAT_CONFIGS:
        response_format = shape.response_format(node.name)
    else:
        prompt = f"{prompt}\n\n{shape.instruction()}"
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for attempt in (1, 2):
        turn = await ctx.chat(ModelRequest(node.name, endpoint, list(messages), None, on_delta, response_format))
        answer = turn.content or ""
        try:
            values = shape.read(answer)
            return {p["title"]: values[p["title"]] for p in outputs}, None
        except structured.AnswerMismatch as problem:
            if attempt == 2:
                raise structured.failure(f"LlmNode {node.name!r}", shape, problem) from None
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": structured.retry_message(problem)}]
    raise AssertionError("unreachable")


async def agent_node(ctx: RunContext, node: c.AgentNode, inputs: dict[str, Any]) -> Outcome:
    # The agent loops (and their transforms, tool output and conversations) load only for a flow that
    # has an agent.
    if isinstance(node.agent, c.MULTI_AGENT):
        from heddle.engine.multiagent import run_multi_agent

        return await run_multi_agent(ctx, node, inputs), None
    if isinstance(node.agent, c.A2AAgent):
        # Here, as ApiNode's below: the HTTP client (httpx) is loaded by a flow that talks over HTTP only.
        from heddle.engine.a2a import run_a2a_agent

        return await run_a2a_agent(ctx, node, node.agent), None
    from heddle.engine.agent import run_agent

    return await run_agent(ctx, node, inputs), None


async def branching_node(ctx: RunContext, node: c.BranchingNode, inputs: dict[str, Any]) -> Outcome:
    key = io.titles(io.inputs_of(node))[0]
    value = inputs.get(key)
    text = as_text(value) if value is not None else None
    if text is not None and text in node.mapping:
        return {}, node.mapping[text]
    return {}, node.mapping.get("DEFAULT_BRANCH", "default")


async def flow_node(ctx: RunContext, node: c.FlowNode, inputs: dict[str, Any]) -> Outcome:
    titles = io.titles(io.flow_inputs(node.subflow))
    walked = await walk_subflow(ctx, node.subflow, {t: inputs[t] for t in titles if t in inputs})
    # A FlowNode leaves by the branch_name of the subflow's EndNode it reached.
    return walked.outputs, None if walked.branch == "next" else walked.branch


async def output_message_node(ctx: RunContext, node: c.OutputMessageNode, inputs: dict[str, Any]) -> Outcome:
    # Shown, not returned: the node has no outputs (heddle.agentspec.messages).
    ctx.show(render(node.message, inputs), node.name)
    return {}, None


async def input_message_node(ctx: RunContext, node: c.InputMessageNode, inputs: dict[str, Any]) -> Outcome:
    prompt = render(node.message, inputs) if node.message else None
    answer = ctx.wait(WaitingFor("message", node.name, prompt=prompt))
    return {io.titles(io.outputs_of(node))[0]: answer.message or ""}, None


async def run_node(ctx: RunContext, node: c.Node, inputs: dict[str, Any]) -> Outcome:
    """The engine's own step of a node: its executor, or the one the run's seams add for its type."""
    if isinstance(node, c.StartNode):
        return await start_node(ctx, node, inputs)
    if isinstance(node, c.ToolNode):
        return await tool_node(ctx, node, inputs)
    if isinstance(node, c.LlmNode):
        return await llm_node(ctx, node, inputs)
    if isinstance(node, c.AgentNode):
        return await agent_node(ctx, node, inputs)
    if isinstance(node, c.BranchingNode):
        return await branching_node(ctx, node, inputs)
    if isinstance(node, c.FlowNode):
        return await flow_node(ctx, node, inputs)
    if isinstance(node, c.OutputMessageNode):
        return await output_message_node(ctx, node, inputs)
    if isinstance(node, c.InputMessageNode):
        return await input_message_node(ctx, node, inputs)
    if isinstance(node, c.ApiNode):
        from heddle.engine.api import api_node

        return await api_node(ctx, node, inputs)
    if isinstance(node, c.COMPOSITE_NODES):
        return await run_composite(ctx, node, inputs)
    step = ctx.seams.node_type(node.component_type)
    if step is None:
        raise RunError(f"{node.component_type} {node.name!r}: nothing executes this node type; "
                       "load the plugin that declares it")
    return await step(node, inputs)
