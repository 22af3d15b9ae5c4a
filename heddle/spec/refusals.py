"""What a document names that heddle does not run, refused before anything runs.

Each refusal is one sentence naming the component (type and name), its path in the document
(`$.nodes[2].tool`, after `$component_ref`s are resolved) and what would run it. None of these
fields is read and then ignored:

- `requires_confirmation: true` on any tool or toolbox: the run would wait for a person's approval.
- `human_in_the_loop: true` on an agent inside a flow (an AgentNode's): the agent may stop to ask
  the user, and the flow would wait. A top-level agent answers the user itself, one turn per
  `--message`, so it runs. The default the specification gives (true) is not assumed for an
  agent that does not write the field: such an agent runs to its answer, as heddle's AgentNode
  always has (an Agent serialised by pyagentspec writes the field).
- A ClientTool as a ToolNode's tool: the client runs it, and the flow would wait for its result.
  (An agent is offered its ClientTools; a call to one ends the run: heddle.tools.client.)
- A BuiltinTool no loaded plugin provides: heddle has no built-in tools of its own. A plugin tool
  of its name runs it, given its arguments alone, so one that also gives a `configuration`, an
  `executor_name` or a `tool_version` is refused.

The first three are read from the document itself (`document_refusals`, when it is parsed); the
last needs the run's plugins (`flow_refusals`, with the graph checks). Component types heddle
does not read at all (Swarm, ManagerWorkers, ...) are refused with their reason by
heddle.spec.catalog.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle.spec import components as c

SESSIONS = "a later heddle version, with sessions, runs it"

REFUSED_FIELDS: dict[str, str] = {
    "requires_confirmation": ("requires_confirmation: true, which needs a session (the run would wait for a "
                              "person to approve each call); " + SESSIONS),
    "human_in_the_loop": ("human_in_the_loop: true inside a flow, which needs a session (the agent may stop to ask "
                          "the user, and the flow would wait for the answer); " + SESSIONS
                          + " (as a top-level agent, one turn per --message, it runs today)"),
}
"""Fields whose value heddle cannot honour yet, with why and what would run them."""

CLIENT_TOOL_NODE = ("is a ClientTool: the client runs it, and the flow would wait for its result, which needs a "
                    "session; " + SESSIONS)
BUILTIN_TOOL = ("is a BuiltinTool, and heddle has no built-in tools of its own: a plugin that provides a tool "
                "named {name!r} runs it (--plugin MANIFEST)")

# Components inside one of these run within a flow (a node document runs as a one-node flow).
_FLOW_TYPES = frozenset({"Flow", "AgentNode"})
_NODE_REFERENCES = frozenset({"start_node", "control_flow_connections", "data_flow_connections"})


def _label(node: dict[str, Any]) -> str:
    name = node.get("name")
    return f"{node.get('component_type')} {name!r}" if isinstance(name, str) and name else str(node["component_type"])


def _effective_hitl(node: dict[str, Any]) -> Any:
    """An agent's human_in_the_loop; a SpecializedAgent's parameters override its agent's."""
    if node.get("component_type") != "SpecializedAgent":
        return node.get("human_in_the_loop")
    params, base = node.get("agent_specialization_parameters"), node.get("agent")
    override = params.get("human_in_the_loop") if isinstance(params, dict) else None
    if override is not None:
        return override
    return _effective_hitl(base) if isinstance(base, dict) else None


def document_refusals(document: Any) -> list[str]:
    """Every refusal `document` (a resolved mapping) earns, each `PATH: TYPE 'name' why`, in document order."""
    found: list[str] = []
    seen: set[tuple[int, bool, bool]] = set()
    # A stack, not recursion; shared subtrees (resolved references) are visited once per context.
    stack: list[tuple[str, Any, bool, bool]] = [("$", document, False, False)]
    while stack:
        path, node, in_flow, hitl_done = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{path}[{i}]", item, in_flow, False) for i, item in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        key = (id(node), in_flow, hitl_done)
        if key in seen:
            continue
        seen.add(key)
        ctype = node.get("component_type")
        if isinstance(ctype, str):
            if node.get("requires_confirmation") is True:
                found.append(f"{path}: {_label(node)} has {REFUSED_FIELDS['requires_confirmation']}")
            if (in_flow and not hitl_done and ctype in ("Agent", "SpecializedAgent")
                    and _effective_hitl(node) is True):
                found.append(f"{path}: {_label(node)} has {REFUSED_FIELDS['human_in_the_loop']}")
            tool = node.get("tool")
            if ctype == "ToolNode" and isinstance(tool, dict) and tool.get("component_type") == "ClientTool":
                found.append(f"{path}.tool: {_label(tool)} of {_label(node)} {CLIENT_TOOL_NODE}")
        inner = in_flow or ctype in _FLOW_TYPES
        children = []
        for field, value in node.items():
            # A flow's start node and its edges' ends are nodes of its `nodes` (the graph checks
            # refuse any other), where a refusal names them.
            if field == "metadata" or (ctype == "Flow" and field in _NODE_REFERENCES):
                continue
            # A SpecializedAgent's agent runs as the specialisation says: its own flag is not the one that counts.
            done = ctype == "SpecializedAgent" and field == "agent"
            children.append((f"{path}.{field}", value, inner, done))
        stack.extend(reversed(children))
    return found


def flow_refusals(flow: c.Flow, *, plugin_tools: Collection[str] = ()) -> list[str]:
    """What `flow` names that only the run's plugins could run, and tool names it gives two
    different tools (a call names its tool by name alone)."""
    from heddle.spec import components as c
    from heddle.spec.walk import document_components, of_type

    problems: list[str] = []
    for where, tool in of_type(flow, c.BuiltinTool):
        label = f"{where}: BuiltinTool {tool.name!r} (tool_type {tool.tool_type!r})"
        if tool.name not in plugin_tools:
            problems.append(f"{label} {BUILTIN_TOOL.format(name=tool.name)}")
            continue
        # A plugin's tool is given its arguments alone: what else the document says would be lost.
        unsent = [field for field in ("configuration", "executor_name", "tool_version") if getattr(tool, field)]
        if unsent:
            problems.append(f"{label} gives {', '.join(unsent)}, which heddle cannot pass to the plugin tool that "
                            "runs it (a plugin tool takes its arguments only); drop them, or give them to the "
                            "plugin as its settings (--plugin-config)")
    tool_types = (c.ServerTool, c.RemoteTool, c.ClientTool, c.BuiltinTool, c.MCPTool)
    first: dict[str, tuple[str, Any]] = {}
    for where, component in document_components(flow):
        if not isinstance(component, tool_types):
            continue
        seen = first.setdefault(component.name, (where, component))
        other = seen[1]
        if other is component or (isinstance(other, c.ServerTool) and isinstance(component, c.ServerTool)):
            continue
        if type(other) is not type(component) or _definition(other) != _definition(component):
            problems.append(f"{where}: {component.component_type} {component.name!r} has the name of the "
                            f"{other.component_type} at {seen[0]}, another tool; a tool is called by its name, so "
                            "give each its own")
    return problems


def _definition(tool: c.Component) -> dict[str, Any]:
    return tool.model_dump(exclude={"id", "metadata", "description"})


def plugin_tools(tools: Mapping[str, Path] | None, tools_dir: Path | None) -> frozenset[str]:
    """The names in `tools` (a check's executables by name) that plugins provide: those not in the
    tools folder, as the graph checks tell them apart."""
    if not tools:
        return frozenset()
    folder = Path(tools_dir).resolve() if tools_dir is not None else None
    return frozenset(name for name, path in tools.items()
                     if folder is None or not Path(path).resolve().is_relative_to(folder))
