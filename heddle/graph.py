"""The graph checks run by `heddle validate` and before every run.

Every problem is collected and reported at once, each naming the node or edge at fault, so a
user fixes a flow in one pass rather than one error at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from heddle.agentspec import components as c
from heddle.agentspec.catalog import refusal_message
from heddle.agentspec.components import (
    CAUGHT_EXCEPTION_BRANCH,
    MULTI_AGENT,
    Agent,
    AgentNode,
    BuiltinTool,
    ClientTool,
    Component,
    ControlFlowEdge,
    EndNode,
    Flow,
    FlowNode,
    LlmConfig,
    LlmNode,
    MCPTool,
    Node,
    PluginNode,
    RemoteTool,
    ServerTool,
    StartNode,
    ToolNode,
    agents_of,
    node_key,
)
from heddle.agentspec.env_reads import secret_reads
from heddle.agentspec.messages import message_problems
from heddle.agentspec.refusals import flow_refusals, plugin_tools
from heddle.agentspec.walk import document_components
from heddle.wiring import check_wiring


@dataclass
class FlowGraph:
    """A flow's nodes and edges indexed for the engine."""

    flow: Flow
    nodes: dict[str, Node] = field(default_factory=dict)
    edges_from: dict[str, list[ControlFlowEdge]] = field(default_factory=dict)

    @classmethod
    def build(cls, flow: Flow) -> FlowGraph:
        graph = cls(flow)
        for node in flow.nodes:
            graph.nodes.setdefault(node_key(node), node)
        for edge in flow.control_flow_connections:
            graph.edges_from.setdefault(node_key(edge.from_node), []).append(edge)
        return graph

    def next_edge(self, node: Node, branch: str | None) -> ControlFlowEdge | None:
        """The edge the node leaves by after taking `branch`; None when no edge leaves by it (the
        flow then ends there)."""
        edges = self.edges_from.get(node_key(node), [])
        if branch is not None:
            for edge in edges:
                if edge.from_branch == branch:
                    return edge
        if branch == CAUGHT_EXCEPTION_BRANCH:
            return None  # a caught failure never leaves by the edge of the subflow's success
        for edge in edges:
            if edge.from_branch is None:
                return edge
        return None

    def reachable(self) -> list[str]:
        start = node_key(self.flow.start_node)
        seen: dict[str, None] = {}  # in the order reached; a dict, so each test of it is one lookup
        stack = [start]
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen[key] = None
            for edge in self.edges_from.get(key, []):
                stack.append(node_key(edge.to_node))
        return list(seen)


def _label(node: Node) -> str:
    return f"{node.component_type} {node.name!r}"


def subflows(node: Node) -> list[tuple[str, Flow]]:
    """The flows a node runs, each with the label its problems are reported under."""
    if isinstance(node, (FlowNode, c.MapNode, c.ParallelMapNode, c.CatchExceptionNode)):
        return [(_label(node), node.subflow)]
    if isinstance(node, c.ParallelFlowNode):
        return [(f"{_label(node)} subflows[{i}] {sub.name!r}", sub) for i, sub in enumerate(node.subflows)]
    return []


ENDS_THERE = "the flow ends there if it takes it, with the outputs it has (their defaults for the rest)"


def _check_catch(node: Node, edges: list[ControlFlowEdge], prefix: str, warnings: list[str] | None) -> None:
    caught = any(e.from_branch == c.CAUGHT_EXCEPTION_BRANCH for e in edges)
    if isinstance(node, c.CatchExceptionNode) and not caught and warnings is not None:
        warnings.append(f"{prefix}{_label(node)} has no control edge for branch {c.CAUGHT_EXCEPTION_BRANCH!r}: "
                        f"a failure it catches ends the flow there, with the outputs it has (their defaults "
                        "for the rest)")


def _check_branches(node: Node, edges: list[ControlFlowEdge], prefix: str,
                    warnings: list[str] | None) -> list[str]:
    """Edges leaving `node` by a branch it does not have, or two by one branch: the reference
    runtime refuses both, though the specification's reader does not. A branch that no edge leaves
    by is a warning: the specification allows it, and taking it ends the flow."""
    problems: list[str] = []
    by_branch: dict[str, list[str]] = {}
    for edge in edges:
        by_branch.setdefault(edge.from_branch or "next", []).append(edge.name or edge.id)
    for branch, names in by_branch.items():
        if len(names) > 1:
            problems.append(f"{prefix}control edges {', '.join(map(repr, names))} all leave {_label(node)} by "
                            f"branch {branch!r}; a branch leads to one node: keep one of them")
    if isinstance(node, PluginNode):
        return problems  # the plugin host checks a plugin node's branches against its manifest
    branches = node.next_branches()
    for edge in edges:
        if edge.from_branch is not None and edge.from_branch not in branches:
            problems.append(f"{prefix}control edge {edge.name or edge.id!r} leaves {_label(node)} by branch "
                            f"{edge.from_branch!r}, which it does not have (its branches: {', '.join(branches)})")
    if edges and not any(e.from_branch is None for e in edges):
        for branch in branches:
            if branch in by_branch or branch == CAUGHT_EXCEPTION_BRANCH:  # that one: _check_catch
                continue
            if warnings is not None:
                warnings.append(f"{prefix}{_label(node)} can take branch {branch!r} but no control edge leaves by "
                                f"it: {ENDS_THERE}")
    return problems


def _not_executable(name: str, path: Path, tools_dir: Path | None) -> str | None:
    """Why the tools folder's executable for `name` cannot be started, as the run would find out."""
    import os

    # A plugin's tools are its own to start; only the tools folder's files are run directly.
    if tools_dir is None or not path.resolve().is_relative_to(Path(tools_dir).resolve()):
        return None
    if os.access(path, os.X_OK):
        return None
    return f"ServerTool {name!r}: {path} is not executable; run chmod +x on it"


def _bad_model_url(url: str) -> bool:
    from urllib.parse import urlsplit

    if url.startswith("$"):
        return False  # read from the environment when the run starts
    parts = urlsplit(url.strip())
    return parts.scheme not in ("http", "https") or not parts.netloc


def _refused_nodes(flow: Flow, prefix: str) -> list[str]:
    """The nodes of types heddle reads but does not run (heddle.agentspec.catalog says why, and what would)."""
    found = []
    for i, node in enumerate(flow.nodes):
        if isinstance(node, PluginNode):
            continue  # a plugin runs it
        where = f"$.nodes[{i}]" if not prefix else f"nodes[{i}]"
        refused = refusal_message(node.component_type, name=node.name, path=where)
        if refused is not None:
            found.append(prefix + refused)
    return found


def check_flow(
    flow: Flow, *, tools: Mapping[str, Path] | None = None, tools_dir: Path | None = None,
    where: str = "flow", warnings: list[str] | None = None, wiring: bool = True,
    model_urls: Mapping[str, str] | None = None,
) -> list[str]:
    """Return every problem with `flow`'s graph; empty when it is runnable.

    `tools` (name -> executable) is checked against the ServerTools the flow names when given.
    What the specification allows but a run may trip on is added to `warnings`, when given.
    The llm configs `model_urls` names (by name or id, as `--model-url` does) do not use their own url.
    """
    problems: list[str] = []
    graph = FlowGraph.build(flow)
    prefix = "" if where == "flow" else f"{where}: "

    start_key = node_key(flow.start_node)
    if not isinstance(flow.start_node, StartNode):
        problems.append(f"{prefix}start_node {flow.start_node.name!r} is a "
                        f"{flow.start_node.component_type}, not a StartNode")
    if start_key not in graph.nodes:
        problems.append(f"{prefix}start node {flow.start_node.name!r} is not listed in nodes")
    if wiring:  # a node read but not run is the run's to refuse: a later heddle may run the bundle
        problems.extend(_refused_nodes(flow, prefix))

    for control in flow.control_flow_connections:
        for end, node in (("from_node", control.from_node), ("to_node", control.to_node)):
            if node_key(node) not in graph.nodes:
                problems.append(
                    f"{prefix}control edge {control.name!r}: {end} {node.name!r} is not in the flow's nodes"
                )
    for data in flow.data_flow_connections or []:
        for end, node in (("source_node", data.source_node), ("destination_node", data.destination_node)):
            if node_key(node) not in graph.nodes:
                problems.append(f"{prefix}data edge {data.name!r}: {end} {node.name!r} is not in the flow's nodes")
    if wiring:  # without: the graph alone (sealing refuses only what it cannot seal)
        problems.extend(check_wiring(graph, prefix))

    reachable = graph.reachable() if start_key in graph.nodes else []
    reached_set = set(reachable)
    for key, node in graph.nodes.items():
        if key not in reached_set:
            problems.append(f"{prefix}{_label(node)} is not reachable from the start node")
    if reachable and not any(isinstance(graph.nodes.get(k), EndNode) for k in reachable):
        problems.append(f"{prefix}no EndNode is reachable from the start node")

    for key in reachable:
        reached = graph.nodes.get(key)
        if reached is None or isinstance(reached, EndNode):
            continue
        node = reached
        edges = graph.edges_from.get(key, [])
        if not edges and warnings is not None:
            # The specification and its reference runtime allow it: the flow ends after the node.
            warnings.append(f"{prefix}{_label(node)} has no outgoing control edge: the flow ends after it, with "
                            "the outputs it has (their defaults for the rest)")
        problems.extend(_check_branches(node, edges, prefix, warnings))
        _check_catch(node, edges, prefix, warnings)
        for label, sub in subflows(node):
            problems.extend(check_flow(sub, tools=tools, tools_dir=tools_dir, where=f"{where} > {label}",
                                       warnings=warnings, wiring=wiring))

    if tools is not None and where == "flow":
        if tools_dir is None:
            folder = "no --tools-dir was given"
        elif not Path(tools_dir).exists():
            folder = f"the tools directory {tools_dir} does not exist"
        else:
            folder = f"expected {tools_dir}/{{name}} or {{name}}.<ext>"
        for name in sorted(referenced_tools(flow)):
            if name not in tools:
                problems.append(f"{prefix}ServerTool {name!r} has no executable ("
                                + folder.format(name=name) + ")")
            elif (unusable := _not_executable(name, tools[name], tools_dir)) is not None:
                problems.append(prefix + unusable)
    if where == "flow":
        problems.extend(flow_refusals(flow, plugin_tools=plugin_tools(tools, tools_dir)))
        problems.extend(secret_reads(flow))
        problems.extend(message_problems(flow, warnings))
        problems.extend(truncate_problems(flow))
        seen: set[int] = set()
        for label, config in llm_configs(flow):
            url = getattr(config, "url", None)
            replaced = model_urls is not None and (config.name in model_urls or config.id in model_urls)
            if id(config) in seen or replaced or not isinstance(url, str) or not _bad_model_url(url):
                continue
            seen.add(id(config))
            problems.append(f"{prefix}llm_config {config.name!r} of {label}: model url {url!r} is not an http(s) "
                            "URL; write it as http://HOST[:PORT][/PATH]")
    return problems


# --------------------------------------------------------------------------- a tool's own output limit

TRUNCATE = "truncate"  # the metadata key of a tool's own, tighter limit (heddle.engine.tool_output)


def truncate_of(tool: Component) -> int | None:
    """The tool's `metadata.truncate` (a positive whole number of characters), or None when it sets
    none. ValueError saying what is wrong with one it sets."""
    metadata = tool.metadata or {}
    if TRUNCATE not in metadata:
        return None
    value = metadata[TRUNCATE]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"metadata.truncate {value!r} is not a positive whole number; give the most characters "
                         "of one of its results the model gets (e.g. 2000), or drop it")
    return value


def truncate_problems(flow: Flow) -> list[str]:
    """One line for each tool of the document whose `metadata.truncate` is not a positive whole number."""
    problems = []
    for where, component in document_components(flow):
        if not isinstance(component, (ServerTool, RemoteTool, ClientTool, BuiltinTool, MCPTool)):
            continue
        try:
            truncate_of(component)
        except ValueError as exc:
            problems.append(f"{where}: {component.component_type} {component.name!r} {exc}")
    return problems


def referenced_tools(flow: Flow) -> dict[str, ServerTool]:
    """Every ServerTool the flow (and its subflows) names, by name."""
    found: dict[str, ServerTool] = {}
    for node in flow.nodes:
        if isinstance(node, ToolNode):
            if isinstance(node.tool, ServerTool):
                found.setdefault(node.tool.name, node.tool)
        elif isinstance(node, AgentNode):
            for tool in (t for agent in agents_of(node.agent) for t in agent.tools):
                if isinstance(tool, ServerTool):
                    found.setdefault(tool.name, tool)
        else:
            for _, sub in subflows(node):
                for name, tool in referenced_tools(sub).items():
                    found.setdefault(name, tool)
    return found


def llm_configs(flow: Flow) -> Iterator[tuple[str, LlmConfig]]:
    """(node label, llm config) for every model the flow and its subflows call, plugin nodes included."""
    for node in flow.nodes:
        if isinstance(node, LlmNode):
            yield _label(node), node.llm_config
        elif isinstance(node, AgentNode):
            agent = node.agent
            if isinstance(agent, MULTI_AGENT):
                # Each agent of a Swarm or a ManagerWorkers calls its own model.
                for _, member in agent.members():
                    yield f"{_label(node)} agent {member.name!r}", member.llm_config
            elif isinstance(agent, Agent):  # an A2AAgent's model is the remote agent's own
                yield _label(node), agent.llm_config
                for transform in agent.transforms:
                    # Its summaries are asked of a model of their own.
                    yield f"{_label(node)} transform {transform.name!r}", transform.llm
        elif subflows(node):
            for _, sub in subflows(node):
                yield from llm_configs(sub)
        elif isinstance(node, PluginNode) and node.llm_config is not None:
            # A plugin node's model is called through the plugin (callModel): the same rules apply.
            yield _label(node), node.llm_config
