"""The graph checks run by `heddle validate` and before every run.

Every problem is collected and reported at once, each naming the node or edge at fault, so a
user fixes a flow in one pass rather than one error at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from heddle.spec.components import (
    BranchingNode,
    ControlFlowEdge,
    EndNode,
    Flow,
    FlowNode,
    LlmConfig,
    Node,
    ServerTool,
    StartNode,
)


def node_key(node: Node) -> str:
    """Nodes are identified by id (names need not be unique); fall back to the name."""
    return node.id or node.name


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
        edges = self.edges_from.get(node_key(node), [])
        if branch is not None:
            for edge in edges:
                if edge.from_branch == branch:
                    return edge
        for edge in edges:
            if edge.from_branch is None:
                return edge
        return None

    def reachable(self) -> list[str]:
        start = node_key(self.flow.start_node)
        seen: list[str] = []
        stack = [start]
        while stack:
            key = stack.pop()
            if key in seen:
                continue
            seen.append(key)
            for edge in self.edges_from.get(key, []):
                stack.append(node_key(edge.to_node))
        return seen


def _label(node: Node) -> str:
    return f"{node.component_type} {node.name!r}"


def check_flow(
    flow: Flow, *, tools: Mapping[str, Path] | None = None, tools_dir: Path | None = None,
    where: str = "flow",
) -> list[str]:
    """Return every problem with `flow`'s graph; empty when it is runnable.

    `tools` (name -> executable) is checked against the ServerTools the flow names when given.
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

    reachable = graph.reachable() if start_key in graph.nodes else []
    for key, node in graph.nodes.items():
        if key not in reachable:
            problems.append(f"{prefix}{_label(node)} is not reachable from the start node")
    if reachable and not any(isinstance(graph.nodes.get(k), EndNode) for k in reachable):
        problems.append(f"{prefix}no EndNode is reachable from the start node")

    for key in reachable:
        reached = graph.nodes.get(key)
        if reached is None or isinstance(reached, EndNode):
            continue
        node = reached
        edges = graph.edges_from.get(key, [])
        if not edges:
            problems.append(f"{prefix}{_label(node)} has no outgoing control edge")
            continue
        if isinstance(node, BranchingNode) and not any(e.from_branch is None for e in edges):
            covered = {e.from_branch for e in edges}
            for branch in node.next_branches():
                if branch not in covered:
                    problems.append(
                        f"{prefix}{_label(node)} can take branch {branch!r} but no control edge leaves by it"
                    )
        if isinstance(node, FlowNode):
            problems.extend(check_flow(node.subflow, tools=tools, tools_dir=tools_dir,
                                       where=f"{where} > FlowNode {node.name!r}"))

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
    return problems


def referenced_tools(flow: Flow) -> dict[str, ServerTool]:
    """Every ServerTool the flow (and its subflows) names, by name."""
    from heddle.spec.components import AgentNode, ToolNode

    found: dict[str, ServerTool] = {}
    for node in flow.nodes:
        if isinstance(node, ToolNode):
            found.setdefault(node.tool.name, node.tool)
        elif isinstance(node, AgentNode):
            for tool in node.agent.tools:
                found.setdefault(tool.name, tool)
        elif isinstance(node, FlowNode):
            for name, tool in referenced_tools(node.subflow).items():
                found.setdefault(name, tool)
    return found


def llm_configs(flow: Flow) -> Iterator[tuple[str, LlmConfig]]:
    """(node label, llm config) for every model the flow and its subflows call, plugin nodes included."""
    from heddle.spec.components import AgentNode, LlmNode, PluginNode

    for node in flow.nodes:
        if isinstance(node, LlmNode):
            yield _label(node), node.llm_config
        elif isinstance(node, AgentNode):
            yield _label(node), node.agent.llm_config
        elif isinstance(node, FlowNode):
            yield from llm_configs(node.subflow)
        elif isinstance(node, PluginNode) and node.llm_config is not None:
            # A plugin node's model is called through the plugin (callModel): the same rules apply.
            yield _label(node), node.llm_config
