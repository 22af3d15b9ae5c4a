"""Each component's inputs and outputs, as the Agent Spec language reference defines them.

A component may declare its inputs and outputs; when it declares none they are inferred from its
configuration (an LlmNode's from the `{{placeholders}}` of its prompt, a ToolNode's from its tool,
a FlowNode's from its subflow...). The engine wires values by these lists, and the graph checks
name an edge or an input against them, so both read them here and nowhere else.

One function per component type, in the `_INPUTS` and `_OUTPUTS` tables: a node type added to
heddle adds its two entries. `None` stands for "open": a plugin node, or a ToolNode whose
ServerTool declares nothing, takes whatever reaches it (the latest value of every name, and what
its data edges bring) and gives whatever it produces.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from heddle.agentspec import components as c
from heddle.agentspec.templates import placeholders

Property = c.Property
Infer = Callable[[Any], "list[Property] | None"]

GENERATED_TEXT = "generated_text"  # an LlmNode's output when it declares none
BRANCHING_KEY = "branching_mapping_key"  # a BranchingNode's input when it declares none


def declared_values(declared: list[Property], values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The values of the `declared` properties (defaults filled in, each a copy), in declared
    order, and the titles that have neither a value nor a default."""
    import copy

    out: dict[str, Any] = {}
    missing = []
    for prop in declared:
        title = prop["title"]
        if title in values:
            out[title] = values[title]
        elif "default" in prop:
            out[title] = copy.deepcopy(prop["default"])
        else:
            missing.append(title)
    return out, missing


def _strings(titles: list[str]) -> list[Property]:
    return [{"title": title, "type": "string"} for title in titles]


def _declared_or(declared: list[Property], inferred: list[Property]) -> list[Property]:
    # A declared list may refine the inferred one (a type, a default, a description); an
    # empty one is what documents written by hand say when they mean "work it out".
    return list(declared) if declared else inferred


# --------------------------------------------------------------------------- agents and flows


def agent_inputs(agent: c.Agentic | c.A2AAgent) -> list[Property]:
    """The Agent's inputs: declared, else one string per placeholder of its system prompt. A Swarm's
    or a ManagerWorkers': declared, else those of its agents (each title once), whose prompts they fill."""
    if isinstance(agent, c.A2AAgent):
        return []  # it takes the user's message only
    if isinstance(agent, c.MULTI_AGENT):
        merged: dict[str, Property] = {}
        for member in c.agents_of(agent):
            for prop in agent_inputs(member):
                merged.setdefault(prop["title"], prop)
        return _declared_or(agent.inputs, list(merged.values()))
    return _declared_or(agent.inputs, _strings(placeholders(agent.system_prompt)))


def agent_outputs(agent: c.Agentic | c.A2AAgent) -> list[Property]:
    return list(agent.outputs)


def flow_inputs(flow: c.Flow) -> list[Property]:
    """A flow's inputs: those of its StartNode (the flow's own list when it gives one)."""
    if "inputs" in flow.model_fields_set:
        return list(flow.inputs)
    return inputs_of(flow.start_node) or []


def end_nodes(flow: c.Flow) -> list[c.EndNode]:
    return [node for node in flow.nodes if isinstance(node, c.EndNode)]


def flow_outputs(flow: c.Flow) -> list[Property]:
    """A flow's outputs: its declared list, else the outputs every one of its EndNodes exposes.

    Unlike a node's, an explicitly empty list means what it says: a flow that exposes nothing.
    """
    if "outputs" in flow.model_fields_set:
        return list(flow.outputs)
    ends = [outputs_of(end) or [] for end in end_nodes(flow)]
    if not ends:
        return []
    common: list[Property] = []
    for prop in ends[0]:
        if all(any(other["title"] == prop["title"] for other in outputs) for outputs in ends[1:]):
            common.append(prop)
    return common


# --------------------------------------------------------------------------- nodes


def _start_inputs(node: c.StartNode) -> list[Property]:
    return _declared_or(node.inputs, list(node.outputs))


def _start_outputs(node: c.StartNode) -> list[Property]:
    return _declared_or(node.outputs, list(node.inputs))


def _end_inputs(node: c.EndNode) -> list[Property]:
    return _declared_or(node.inputs, list(node.outputs))


def _end_outputs(node: c.EndNode) -> list[Property]:
    return _declared_or(node.outputs, list(node.inputs))


def _tool_inputs(node: c.ToolNode) -> list[Property] | None:
    declared = _declared_or(node.inputs, list(node.tool.inputs))
    if not declared and isinstance(node.tool, c.ServerTool):
        # A ServerTool that declares no inputs (nor its node) takes what reaches the node, as
        # heddle's own documents have long relied on; one that declares them is read exactly.
        return None
    return declared


def _tool_outputs(node: c.ToolNode) -> list[Property] | None:
    return _declared_or(node.outputs, list(node.tool.outputs)) or None


def _llm_inputs(node: c.LlmNode) -> list[Property]:
    return _declared_or(node.inputs, _strings(placeholders(node.prompt_template)))


def _llm_outputs(node: c.LlmNode) -> list[Property]:
    return _declared_or(node.outputs, [{"title": GENERATED_TEXT, "type": "string",
                                        "description": "Raw text generated by the LLM"}])


def _agent_node_inputs(node: c.AgentNode) -> list[Property]:
    return _declared_or(node.inputs, agent_inputs(node.agent))


def _agent_node_outputs(node: c.AgentNode) -> list[Property]:
    return _declared_or(node.outputs, agent_outputs(node.agent))


def _branching_inputs(node: c.BranchingNode) -> list[Property]:
    # The mapping's key is one input: the first declared one, else `branching_mapping_key`.
    return list(node.inputs[:1]) if node.inputs else _strings([BRANCHING_KEY])


def _no_outputs(node: c.Node) -> list[Property]:
    return []


def _message_inputs(node: c.OutputMessageNode) -> list[Property]:
    return _declared_or(node.inputs, _strings(placeholders(node.message)))


def _input_message_inputs(node: c.InputMessageNode) -> list[Property]:
    return _declared_or(node.inputs, _strings(placeholders(node.message or "")))


def _input_message_outputs(node: c.InputMessageNode) -> list[Property]:
    # One string: the user's message, `user_input` unless the node names it.
    return _declared_or(node.outputs, _strings([c.INPUT_MESSAGE_OUTPUT]))


def _flow_node_inputs(node: c.FlowNode) -> list[Property]:
    return _declared_or(node.inputs, flow_inputs(node.subflow))


def _flow_node_outputs(node: c.FlowNode) -> list[Property]:
    return _declared_or(node.outputs, flow_outputs(node.subflow))


def _composite_inputs(node: c.MapNode | c.ParallelMapNode | c.ParallelFlowNode | c.CatchExceptionNode,
                      ) -> list[Property]:
    # MapNode: `iterated_<x>` per subflow input; ParallelFlowNode: the union of its subflows';
    # CatchExceptionNode: its subflow's (heddle.agentspec.components infers them).
    return _declared_or(node.inputs, node.inferred_inputs())


def _composite_outputs(node: c.MapNode | c.ParallelMapNode | c.ParallelFlowNode | c.CatchExceptionNode,
                       ) -> list[Property]:
    # MapNode: `collected_<x>` per reduced subflow output; ParallelFlowNode: the union of its
    # subflows'; CatchExceptionNode: its subflow's and `caught_exception_info`.
    return node.inferred_outputs() if isinstance(node, c.CatchExceptionNode) else \
        _declared_or(node.outputs, node.inferred_outputs())


def _api_inputs(node: c.ApiNode) -> list[Property]:
    return list(node.inputs)  # declared, else inferred from its placeholders when it was read


def _api_outputs(node: c.ApiNode) -> list[Property]:
    return list(node.outputs)  # declared (`[]` reads nothing), else `response` when it was read


def _plugin_inputs(node: c.PluginNode) -> list[Property] | None:
    return list(node.inputs) or None


def _plugin_outputs(node: c.PluginNode) -> list[Property] | None:
    return list(node.outputs) or None


_INPUTS: dict[type, Infer] = {
    c.StartNode: _start_inputs,
    c.EndNode: _end_inputs,
    c.ToolNode: _tool_inputs,
    c.LlmNode: _llm_inputs,
    c.AgentNode: _agent_node_inputs,
    c.BranchingNode: _branching_inputs,
    c.FlowNode: _flow_node_inputs,
    c.OutputMessageNode: _message_inputs,
    c.InputMessageNode: _input_message_inputs,
    c.ApiNode: _api_inputs,
    **dict.fromkeys(c.COMPOSITE_NODES, _composite_inputs),
    c.PluginNode: _plugin_inputs,
}

_OUTPUTS: dict[type, Infer] = {
    c.StartNode: _start_outputs,
    c.EndNode: _end_outputs,
    c.ToolNode: _tool_outputs,
    c.LlmNode: _llm_outputs,
    c.AgentNode: _agent_node_outputs,
    c.BranchingNode: _no_outputs,
    c.FlowNode: _flow_node_outputs,
    c.OutputMessageNode: _no_outputs,
    c.InputMessageNode: _input_message_outputs,
    c.ApiNode: _api_outputs,
    **dict.fromkeys(c.COMPOSITE_NODES, _composite_outputs),
    c.PluginNode: _plugin_outputs,
}


def _lookup(table: dict[type, Infer], node: Any) -> Infer | None:
    for kind in type(node).__mro__:
        if kind in table:
            return table[kind]
    return None


def inputs_of(node: Any) -> list[Property] | None:
    """The node's inputs, declared or inferred; None when it takes whatever reaches it."""
    infer = _lookup(_INPUTS, node)
    if infer is None:
        declared: list[Property] = list(getattr(node, "inputs", None) or [])
        return declared or None
    return infer(node)


def outputs_of(node: Any) -> list[Property] | None:
    """The node's outputs, declared or inferred; None when it gives whatever it produces."""
    infer = _lookup(_OUTPUTS, node)
    if infer is None:
        declared: list[Property] = list(getattr(node, "outputs", None) or [])
        return declared or None
    return infer(node)


def titles(props: list[Property] | None) -> list[str]:
    return [p["title"] for p in props or []]


def templates_of(node: Any) -> list[tuple[str, str]]:
    """(field, text) for each attribute of the node whose `{{placeholders}}` are its inputs."""
    if isinstance(node, c.LlmNode):
        return [("prompt_template", node.prompt_template)]
    if isinstance(node, c.AgentNode):
        agent = node.agent
        if isinstance(agent, c.MULTI_AGENT):
            return [(f"agent.{where}.system_prompt", member.system_prompt) for where, member in agent.members()]
        return [] if isinstance(agent, c.A2AAgent) else [("agent.system_prompt", agent.system_prompt)]
    if isinstance(node, c.OutputMessageNode):
        return [("message", node.message)]
    if isinstance(node, c.InputMessageNode) and node.message:
        return [("message", node.message)]
    return []
