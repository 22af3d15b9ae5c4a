"""MapNode, ParallelMapNode, ParallelFlowNode and CatchExceptionNode, in-process with real tool subprocesses.

Concurrency is measured, never timed: the tools of parallel runs record their start and stop in
files, and each waits until another run is in flight, so a run that is not concurrent fails and
one that exceeds --max-parallel is seen doing it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.errors import DocumentError, GraphError, LimitError
from heddle.settings import RunSettings
from tests.support.flows import FlowDoc, prop, server_tool, write_tool
from tests.support.inproc import refusal, run_doc

INT, NUM = "integer", "number"

# Waits (polling, with a deadline that only a broken engine reaches) until at least `want` runs of the
# tool are in flight, or every run has started; then records how many were in flight.
GATED = """
import time
log = args["log"]
me = str(os.getpid())
def count(prefix):
    return sum(1 for n in os.listdir(log) if n.startswith(prefix))
open(os.path.join(log, "start-" + me), "w").write(str(os.getpid()))
open("mine", "w").write(me)  # in this run's own workspace
deadline = time.monotonic() + 20
while count("start-") - count("stop-") < args["want"] and count("start-") < args["total"]:
    if time.monotonic() > deadline:
        sys.exit("no other run came")
    time.sleep(0.005)
open(os.path.join(log, "seen-" + me), "w").write(str(count("start-") - count("stop-")))
open(os.path.join(log, "stop-" + me), "w").write("")
out = {"y": args["x"]}
"""


def subflow(name: str, tool: dict[str, Any], inputs: list[dict[str, Any]], outputs: list[dict[str, Any]],
            **flow: Any) -> dict[str, Any]:
    """start -> one ToolNode -> end, its inputs and outputs wired by name."""
    f = FlowDoc(name)
    s = f.start(inputs, name=f"{name}-start")
    t = f.tool_node(f"{name}-tool", tool)
    e = f.end(outputs, name=f"{name}-end")
    f.control(s, t)
    f.control(t, e)
    for p in inputs:
        f.data(s, p["title"], t, p["title"])
    for p in outputs:
        f.data(t, p["title"], e, p["title"])
    doc = f.document()
    doc.update(inputs=inputs, outputs=outputs, **flow)
    return doc


def outer(tmp_path: Path, inputs: list[dict[str, Any]], component_type: str, node_fields: dict[str, Any],
          node_inputs: list[dict[str, Any]], node_outputs: list[dict[str, Any]]) -> Path:
    """start -> the composite node -> end, every input and output passed through by name."""
    f = FlowDoc("outer")
    s = f.start(inputs)
    n = f._node(component_type, "composite", node_inputs, node_outputs, **node_fields)
    passed = [p for p in node_outputs if p["title"] != "caught_exception_info"]
    e = f.end(passed)
    f.control(s, n)
    f.control(n, e)
    for p in node_inputs:
        f.data(s, p["title"], n, p["title"])
    for p in passed:
        f.data(n, p["title"], e, p["title"])
    return f.write(tmp_path / "flow.json")


def edit_node(flow: Path, change: Callable[[dict[str, Any]], object]) -> None:
    """Change the composite node of a written document in place."""
    doc = json.loads(flow.read_text())
    change(next(v for v in doc["$referenced_components"].values() if v["name"] == "composite"))
    flow.write_text(json.dumps(doc))


def tool_runs(events: list[ev.Event]) -> int:
    return sum(1 for e in events if isinstance(e, ev.ToolCall))


# ------------------------------------------------------------------ MapNode reducers

def reducer_flow(tmp_path: Path, component_type: str, reducers: dict[str, str]) -> tuple[Path, Path]:
    tools = tmp_path / "tools"
    write_tool(tools, "scale.py", "v = args['x'] * args['factor']\n"
                                  "out = {'a': v, 's': v, 'avg': args['x'] / 2, 'mx': v, 'mn': v}")
    outs = [prop("a", INT), prop("s", INT), prop("avg", NUM), prop("mx", INT), prop("mn", INT)]
    ins = [prop("x", INT), prop("factor", INT)]
    sub = subflow("scale", server_tool("scale", ins, outs), ins, outs)
    collected = [({"title": f"collected_{p['title']}", "type": "array", "items": p} if reducers[p["title"]] == "append"
                  else {**p, "title": f"collected_{p['title']}"}) for p in outs if p["title"] in reducers]
    flow = outer(tmp_path, [prop("iterated_x", "array", items={"type": INT}), prop("iterated_factor", INT)],
                 component_type, {"subflow": sub, "reducers": reducers},
                 [prop("iterated_x", "array", items={"type": INT}), prop("iterated_factor", INT)], collected)
    return flow, tools


@pytest.mark.parametrize("component_type", ["MapNode", "ParallelMapNode"])
def test_each_reducer_over_the_runs_in_list_order(tmp_path: Path, component_type: str) -> None:
    flow, tools = reducer_flow(tmp_path, component_type,
                               {"a": "append", "s": "sum", "avg": "average", "mx": "max", "mn": "min"})
    # the list is iterated, the single integer given to every run
    state = run_doc(flow, tools, {"iterated_x": [3, 1, 2], "iterated_factor": 2})
    assert {k: state[k] for k in state if k.startswith("collected_")} == {
        "collected_a": [6, 2, 4], "collected_s": 12, "collected_avg": 1.0, "collected_mx": 6, "collected_mn": 2}
    assert type(state["collected_s"]) is int and type(state["collected_avg"]) is float


def test_without_reducers_every_output_is_appended(tmp_path: Path) -> None:
    flow, tools = reducer_flow(tmp_path, "MapNode", dict.fromkeys(("a", "s", "avg", "mx", "mn"), "append"))
    edit_node(flow, lambda node: node.update(reducers=None))
    state = run_doc(flow, tools, {"iterated_x": [1, 2], "iterated_factor": 3})
    assert state["collected_s"] == [3, 6] and state["collected_avg"] == [0.5, 1.0]


def test_an_empty_list_runs_nothing_and_reduces_to_the_empty_values(tmp_path: Path) -> None:
    flow, tools = reducer_flow(tmp_path, "MapNode", {"a": "append", "s": "sum"})
    events: list[ev.Event] = []
    state = run_doc(flow, tools, {"iterated_x": [], "iterated_factor": 2}, events=events)
    assert (state["collected_a"], state["collected_s"], tool_runs(events)) == ([], 0, 0)


def test_the_average_of_an_empty_list_is_refused_without_a_default(tmp_path: Path) -> None:
    flow, tools = reducer_flow(tmp_path, "MapNode", {"avg": "average"})
    code, line = refusal(flow, tools, {"iterated_x": [], "iterated_factor": 2})
    assert code == 1 and "MapNode 'composite': the average of no values is undefined" in line
    assert "give output 'collected_avg' a default" in line
    edit_node(flow, lambda node: node["outputs"][0].update(default=-1.0))
    assert run_doc(flow, tools, {"iterated_x": [], "iterated_factor": 2})["collected_avg"] == -1.0


def test_iterated_lists_of_different_lengths_are_refused(tmp_path: Path) -> None:
    flow, tools = reducer_flow(tmp_path, "MapNode", {"a": "append"})
    edit_node(flow, lambda node: node["inputs"][1].update(type="array", items={"type": INT}))
    _, line = refusal(flow, tools, {"iterated_x": [1, 2, 3], "iterated_factor": [1, 2]})
    assert "its iterated lists have different lengths (iterated_x: 3, iterated_factor: 2)" in line


@pytest.mark.parametrize(("reducers", "message"), [
    ({"a": "sum", "nope": "append"}, "reducer 'nope' names no output of its subflow"),
    ({"a": "avg"}, "reducers.a: Input should be 'append', 'sum', 'average', 'max' or 'min'"),
])
def test_bad_reducers_are_refused_when_the_document_is_read(tmp_path: Path, reducers: dict[str, str],
                                                             message: str) -> None:
    flow, tools = reducer_flow(tmp_path, "MapNode", {"a": "append"})
    edit_node(flow, lambda node: node.update(reducers=reducers))
    with pytest.raises(DocumentError, match=message):
        run_doc(flow, tools, {"iterated_x": [1], "iterated_factor": 1})


def test_a_numeric_reducer_on_a_string_output_is_refused(tmp_path: Path) -> None:
    sub = subflow("s", server_tool("t", [prop("x")], [prop("word")]), [prop("x")], [prop("word")])
    flow = outer(tmp_path, [prop("iterated_x", "array")], "MapNode", {"subflow": sub, "reducers": {"word": "max"}},
                 [prop("iterated_x", "array")], [prop("collected_word")])
    with pytest.raises(DocumentError, match="reducer 'max' of 'word' needs an integer or number output, not string"):
        run_doc(flow, None, {"iterated_x": ["a"]})


# ------------------------------------------------------------------ concurrency

def gated_tool(tmp_path: Path) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    tools = tmp_path / "tools"
    write_tool(tools, "gated.py", GATED)
    ins = [prop("x", INT), prop("log"), prop("want", INT), prop("total", INT)]
    return tools, server_tool("gated", ins, [prop("y", INT)]), ins


def in_flight(log: Path) -> list[int]:
    return sorted(int(p.read_text()) for p in log.glob("seen-*"))


def test_parallel_map_runs_concurrently_within_max_parallel(tmp_path: Path) -> None:
    max_parallel = 2
    tools, tool, ins = gated_tool(tmp_path)
    sub = subflow("gate", tool, ins, [prop("y", INT)])
    shared = [prop("iterated_log"), prop("iterated_want", INT), prop("iterated_total", INT)]
    flow = outer(tmp_path, [prop("iterated_x", "array", items={"type": INT}), *shared], "ParallelMapNode",
                 {"subflow": sub}, [prop("iterated_x", "array", items={"type": INT}), *shared],
                 [{"title": "collected_y", "type": "array", "items": {"type": INT}}])
    log = tmp_path / "log"
    log.mkdir()
    kept = tmp_path / "kept"
    state = run_doc(flow, tools, {"iterated_x": [0, 1, 2, 3, 4], "iterated_log": str(log),
                                  "iterated_want": max_parallel, "iterated_total": 5},
                    settings=RunSettings(max_parallel=max_parallel, workspace=kept))
    assert state["collected_y"] == [0, 1, 2, 3, 4]
    assert max(in_flight(log)) == max_parallel
    # one node name, five runs at once: each had a workspace of its own
    folders = sorted(p.name for p in kept.glob("gate-tool*"))
    assert folders == ["gate-tool", *(f"gate-tool-{n}" for n in range(2, 6))]
    assert len({(kept / f / "mine").read_text() for f in folders}) == 5


def renaming_branch(i: int, tool: dict[str, Any], ins: list[dict[str, Any]]) -> dict[str, Any]:
    """start -> the tool -> end, the tool's `y` given as the subflow's own output `y<i>`."""
    f = FlowDoc(f"branch{i}")
    s = f.start(ins, name=f"b{i}-start")
    t = f.tool_node(f"b{i}-tool", tool)
    e = f.end([prop(f"y{i}", INT)], name=f"b{i}-end")
    f.control(s, t)
    f.control(t, e)
    for p in ins:
        f.data(s, p["title"], t, p["title"])
    f.data(t, "y", e, f"y{i}")
    doc = f.document()
    doc.update(inputs=ins, outputs=[prop(f"y{i}", INT)])
    return doc


def test_parallel_flows_run_concurrently_within_max_parallel_and_merge_their_outputs(tmp_path: Path) -> None:
    tools, tool, ins = gated_tool(tmp_path)
    names = [f"y{i}" for i in range(5)]
    flow = outer(tmp_path, ins, "ParallelFlowNode", {"subflows": [renaming_branch(i, tool, ins) for i in range(5)]},
                 ins, [prop(n, INT) for n in names])
    log = tmp_path / "log"
    log.mkdir()
    state = run_doc(flow, tools, {"x": 7, "log": str(log), "want": 3, "total": 5},
                    settings=RunSettings(max_parallel=3))
    assert {n: state[n] for n in names} == dict.fromkeys(names, 7)
    assert max(in_flight(log)) == 3


def test_a_failing_branch_cancels_the_others_and_its_failure_is_reported(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    log = tmp_path / "log"
    log.mkdir()
    # `hang` starts, then waits for a file nobody writes; `fail` fails once `hang` is running.
    write_tool(tools, "hang.py", "import time\nopen(os.path.join(args['log'], 'hang'), 'w').write(str(os.getpid()))\n"
                                 "while not os.path.exists(os.path.join(args['log'], 'never')):\n"
                                 "    time.sleep(0.01)\nopen(os.path.join(args['log'], 'hang-done'), 'w')\n"
                                 "out = {'h': 1}")
    write_tool(tools, "fail.py", "import time\nwhile not os.path.exists(os.path.join(args['log'], 'hang')):\n"
                                 "    time.sleep(0.005)\nsys.exit('fail: on purpose')")
    ins = [prop("log")]
    subs = [subflow("hanging", server_tool("hang", ins, [prop("h", INT)]), ins, [prop("h", INT)]),
            subflow("failing", server_tool("fail", ins, [prop("f", INT)]), ins, [prop("f", INT)])]
    flow = outer(tmp_path, ins, "ParallelFlowNode", {"subflows": subs}, ins, [prop("h", INT), prop("f", INT)])
    code, line = refusal(flow, tools, {"log": str(log)})
    assert code == 1 and line == "error: tool 'fail': exited with status 1: fail: on purpose"
    pid = int((log / "hang").read_text())
    assert not (log / "hang-done").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped before the run returned


# ------------------------------------------------------------------ CatchExceptionNode

def catch_flow(tmp_path: Path, *, caught_edge: bool = True, default: bool = True) -> tuple[Path, Path]:
    tools = tmp_path / "tools"
    write_tool(tools, "flaky.py", "if args['fail']:\n    sys.exit('flaky: asked to fail')\nout = {'r': 'fine'}")
    write_tool(tools, "handle.py", "out = {'handled': args['info']}")
    ins, outs = [prop("fail", "boolean")], [prop("r", default="none") if default else prop("r")]
    sub = subflow("flaky", server_tool("flaky", ins, [prop("r")]), ins, outs)
    f = FlowDoc("outer")
    s = f.start(ins)
    catch = f._node("CatchExceptionNode", "catch", ins,
                    [*outs, {"title": "caught_exception_info", "anyOf": [{"type": "string"}, {"type": "null"}],
                             "default": None}],
                    subflow=sub, branches=["caught_exception_branch", "next"])
    handle = f.tool_node("handle", server_tool("handle", [prop("info")], [prop("handled")]))
    ok, failed = f.end(["r"], name="ok"), f.end(["r", "handled"], name="failed")
    f.control(s, catch)
    f.control(catch, ok)
    if caught_edge:
        f.control(catch, handle, "caught_exception_branch")
    f.control(handle, failed)
    f.data(s, "fail", catch, "fail")
    f.data(catch, "caught_exception_info", handle, "info")
    f.data(catch, "r", ok, "r")
    f.data(catch, "r", failed, "r")
    f.data(handle, "handled", failed, "handled")
    return f.write(tmp_path / "flow.json"), tools


def test_a_caught_failure_takes_the_exception_branch_with_its_info_and_the_defaults(tmp_path: Path) -> None:
    flow, tools = catch_flow(tmp_path)
    events: list[ev.Event] = []
    state = run_doc(flow, tools, {"fail": True}, events=events)
    info = "ToolError: tool 'flaky': exited with status 1: flaky: asked to fail"
    assert (state["r"], state["caught_exception_info"], state["handled"]) == ("none", info, info)
    catch = next(e for e in events if isinstance(e, ev.NodeComplete) and e.node == "catch")
    assert catch.branch == "caught_exception_branch"
    assert any(isinstance(e, ev.NodeError) and e.node == "flaky-tool" for e in events)


def test_without_a_failure_the_subflow_outputs_leave_by_its_branch(tmp_path: Path) -> None:
    flow, tools = catch_flow(tmp_path)
    events: list[ev.Event] = []
    state = run_doc(flow, tools, {"fail": False}, events=events)
    assert (state["r"], state["caught_exception_info"]) == ("fine", None) and "handled" not in state
    assert next(e for e in events if isinstance(e, ev.NodeComplete) and e.node == "catch").branch == "next"


def test_a_run_limit_is_not_caught(tmp_path: Path) -> None:
    flow, tools = catch_flow(tmp_path)
    # start, catch, the subflow's start and tool: the fifth node execution is over the limit
    code, line = refusal(flow, tools, {"fail": True}, settings=RunSettings(max_iterations=4))
    assert code == LimitError.exit_code and "the run exceeded --max-iterations 4" in line


def test_an_output_without_default_or_an_unreachable_handler_is_refused(tmp_path: Path) -> None:
    flow, tools = catch_flow(tmp_path, default=False)
    with pytest.raises(DocumentError, match="output 'r' has no default, which it must give when the subflow fails"):
        run_doc(flow, tools, {"fail": True})
    # Without the edge, the nodes only it led to are unreachable, which the reference runtime refuses (a
    # caught failure with no edge of its own ends the flow: tests/engine/test_reference_readings.py).
    flow, tools = catch_flow(tmp_path, caught_edge=False)
    with pytest.raises(GraphError, match="ToolNode 'handle' is not reachable from the start node"):
        run_doc(flow, tools, {"fail": True})


def test_parallel_subflows_giving_one_output_name_are_refused(tmp_path: Path) -> None:
    ins = [prop("x")]
    subs = [subflow(n, server_tool(n, ins, [prop("y")]), ins, [prop("y")]) for n in ("one", "two")]
    flow = outer(tmp_path, ins, "ParallelFlowNode", {"subflows": subs}, ins, [prop("y")])
    with pytest.raises(DocumentError, match=r"subflows\[0\] 'one' and subflows\[1\] 'two' both give output 'y'"):
        run_doc(flow, None, {"x": "a"})



def test_parallel_runs_count_towards_max_iterations(tmp_path: Path) -> None:
    flow, tools = reducer_flow(tmp_path, "ParallelMapNode", {"a": "append"})
    # 3 outer nodes and 3 per run: two runs make 9 node executions
    code, line = refusal(flow, tools, {"iterated_x": [1, 2], "iterated_factor": 1},
                         settings=RunSettings(max_iterations=8))
    assert code == LimitError.exit_code and "the run exceeded --max-iterations 8 node executions" in line
    assert run_doc(flow, tools, {"iterated_x": [1, 2], "iterated_factor": 1},
                   settings=RunSettings(max_iterations=9))["collected_a"] == [1, 2]
