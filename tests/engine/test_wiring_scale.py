"""Checking how a flow wires its inputs grows with the flow's size, not with its size squared.

The shape is asserted by counting the steps of the walk (each look-up of the edges leaving a node),
never by timing: ten times the nodes must cost at most about ten times the steps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heddle.agentspec import load_flow
from heddle.graph import FlowGraph, check_flow
from heddle.wiring import check_wiring
from tests.support.flows import FlowDoc, server_tool


class _Counted(dict[str, Any]):
    steps = 0

    def get(self, key: str, default: Any = None) -> Any:
        type(self).steps += 1
        return super().get(key, default)


def _chain(tmp_path: Path, n: int, *, handed_on: bool) -> FlowGraph:
    """START -> n ToolNodes -> END; each node reads the start's `x`, or (handed_on) the output of the one before."""
    f = FlowDoc(f"chain-{n}")
    prev = f.start(["x"])
    for i in range(n):
        read = ("x" if i == 0 else f"out{i - 1}") if handed_on else "x"
        node = f.tool_node(f"n{i}", server_tool("step", [read], [f"out{i}"]))
        f.control(prev, node)
        prev = node
    f.control(prev, f.end([]))
    graph = FlowGraph.build(load_flow(f.write(tmp_path / f"chain-{n}-{handed_on}.json")))
    graph.edges_from = _Counted(graph.edges_from)
    return graph


def _steps(graph: FlowGraph) -> int:
    _Counted.steps = 0
    assert check_wiring(graph) == []
    return _Counted.steps


def test_checking_the_wiring_of_a_chain_is_linear_in_its_length(tmp_path: Path) -> None:
    for handed_on in (False, True):
        small = _steps(_chain(tmp_path, 25, handed_on=handed_on))
        big = _steps(_chain(tmp_path, 250, handed_on=handed_on))
        # Linear: 10x the nodes, about 10x the steps; a reachability set per node was about 100x.
        assert big <= 12 * small, (handed_on, small, big)


def test_a_chain_still_refuses_an_input_nothing_before_it_gives(tmp_path: Path) -> None:
    f = FlowDoc("gap")
    prev = f.start(["x"])
    for i in range(30):
        node = f.tool_node(f"n{i}", server_tool("step", ["late" if i == 3 else "x"], ["late" if i == 20 else "y"]))
        f.control(prev, node)
        prev = node
    f.control(prev, f.end([]))
    problems = check_flow(load_flow(f.write(tmp_path / "gap.json")))
    assert len(problems) == 1 and "ToolNode 'n3' needs input 'late'" in problems[0], problems
