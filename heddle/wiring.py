"""How values reach a node's inputs, checked before anything runs.

A flow with data edges (`data_flow_connections`, even an empty list) wires what its edges say: an
input no edge reaches takes its default, and without one the latest output of its name. A flow
whose `data_flow_connections` is null wires by name: an input reads the latest output of that name.
Either way an input that nothing can give and that has no default would fail the run half-way
through, so it is refused here, with the edge or input at fault named, before any tool or model
is called. The engine (heddle.engine.run) wires by the same rules at run time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from heddle.agentspec import components as c
from heddle.agentspec import io
from heddle.agentspec.components import node_key
from heddle.agentspec.templates import placeholders

if TYPE_CHECKING:
    from heddle.graph import FlowGraph


def _label(node: c.Node) -> str:
    return f"{node.component_type} {node.name!r}"


def _listed(names: list[str]) -> str:
    return ", ".join(names) if names else "none"


def successors(graph: FlowGraph, key: str) -> set[str]:
    """Every node reachable from `key` by at least one control edge (`key` itself only on a loop)."""
    seen: set[str] = set()
    stack = [node_key(edge.to_node) for edge in graph.edges_from.get(key, [])]
    while stack:
        here = stack.pop()
        if here in seen:
            continue
        seen.add(here)
        stack.extend(node_key(edge.to_node) for edge in graph.edges_from.get(here, []))
    return seen


def _placeholder_of(node: c.Node, title: str) -> str:
    for field, text in io.templates_of(node):
        if title in placeholders(text):
            return f" (the placeholder {{{{{title}}}}} in its {field})"
    return ""


def check_wiring(graph: FlowGraph, prefix: str = "") -> list[str]:
    """Every problem with how the flow of `graph` (not its subflows) gives its nodes their inputs."""
    problems: list[str] = []
    flow = graph.flow
    edges = flow.data_flow_connections

    for node in graph.nodes.values():
        declared = io.inputs_of(node)
        if declared is None:
            continue
        names = io.titles(declared)
        for field, text in io.templates_of(node):
            for name in placeholders(text):
                if name not in names:
                    problems.append(f"{prefix}{_label(node)}: the placeholder {{{{{name}}}}} in its {field} is not "
                                    f"one of its inputs ({_listed(names)}); add {name!r} to its inputs")

    for edge in edges or []:
        source = graph.nodes.get(node_key(edge.source_node))
        destination = graph.nodes.get(node_key(edge.destination_node))
        if source is not None:
            outputs = io.outputs_of(source)
            if outputs is not None and edge.source_output not in io.titles(outputs):
                problems.append(f"{prefix}data edge {edge.name!r}: {_label(source)} has no output "
                                f"{edge.source_output!r} (its outputs: {_listed(io.titles(outputs))})")
        if destination is not None:
            inputs = io.inputs_of(destination)
            if inputs is not None and edge.destination_input not in io.titles(inputs):
                problems.append(f"{prefix}data edge {edge.name!r}: {_label(destination)} has no input "
                                f"{edge.destination_input!r} (its inputs: {_listed(io.titles(inputs))})")

    # A flow output is the EndNode's input of that name; an EndNode that has none needs the default.
    for output in io.flow_outputs(flow) if "outputs" in flow.model_fields_set else []:
        if "default" in output:
            continue
        for end in io.end_nodes(flow):
            if output["title"] not in io.titles(io.inputs_of(end)):
                problems.append(f"{prefix}the flow's output {output['title']!r} has no default, and EndNode "
                                f"{end.name!r} does not give it; give the output a default or the EndNode that input")

    start = node_key(flow.start_node)
    if start not in graph.nodes:
        return problems  # reported by the graph checks; nothing is reachable
    reachable = {start} | successors(graph, start)
    edged = {(node_key(e.destination_node), e.destination_input) for e in edges or []}
    # The inputs only the latest output of their name can give, in the order of the nodes.
    wanted: list[tuple[str, str]] = []
    for key, node in graph.nodes.items():
        if key not in reachable or isinstance(node, c.StartNode):
            continue  # a StartNode's inputs are the run's
        wanted.extend((key, prop["title"]) for prop in io.inputs_of(node) or []
                      if "default" not in prop and (key, prop["title"]) not in edged)
    given = _given_earlier(graph, reachable, wanted)
    for key, title in wanted:
        if (key, title) in given:
            continue
        node = graph.nodes[key]
        if edges is not None:
            why = "no data edge gives it, no node that can run before it has an output of that name,"
            fix = "connect an output to it with a DataFlowEdge"
        else:
            why = "no node that can run before it has an output of that name"
            fix = "give an earlier node an output of that name"
        problems.append(f"{prefix}{_label(node)} needs input {title!r}{_placeholder_of(node, title)}, but {why} "
                        f"and it has no default; {fix}, or give the input a default")
    return problems


def _given_earlier(graph: FlowGraph, reachable: set[str], wanted: list[tuple[str, str]]) -> set[tuple[str, str]]:
    """The (node, title) pairs of `wanted` that a reachable node with an output of that name can run before.

    One walk per title, from every node giving it, that stops once it has met every node wanting it:
    an output is mostly read a few nodes after it is made, so the walks stay short, and checking a
    flow grows with its size rather than its size squared (a reachability set per node).
    """
    wanting: dict[str, set[str]] = {}
    for key, title in wanted:
        wanting.setdefault(title, set()).add(key)
    makers: dict[str, list[str]] = {title: [] for title in wanting}
    for key, node in graph.nodes.items():
        if key not in reachable:
            continue
        outputs = io.outputs_of(node)
        for title in wanting if outputs is None else io.titles(outputs):  # undeclared outputs: any name
            if title in makers:
                makers[title].append(key)
    given: set[tuple[str, str]] = set()
    for title, left in wanting.items():
        seen: set[str] = set()
        stack = [node_key(edge.to_node) for maker in makers[title] for edge in graph.edges_from.get(maker, [])]
        while stack and left:
            here = stack.pop()
            if here in seen:
                continue
            seen.add(here)
            if here in left:
                left.discard(here)
                given.add((here, title))
            stack.extend(node_key(edge.to_node) for edge in graph.edges_from.get(here, []))
    return given

