"""Graph checks: every problem at once, each naming its node or edge; `heddle validate` output.

`heddle validate` shows the report and its refusal from a real process; `validate --json` and
`heddle run`'s refusals go through the command's entry function in this process (a refusal of
`heddle run` from a process is tests/engine/test_run.py's); single graph rules are checked
in-process (the same load and prepare steps, no process start each)."""

from __future__ import annotations

import json

from tests.support.cli import heddle
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_tool
from tests.support.inproc import check_doc


def test_validate_prints_what_it_parsed_and_fingerprints(tmp_path, capsys):
    f = FlowDoc("calc")
    s = f.start(["a", "b"])
    add = server_tool("add", [{"title": "a", "type": "integer"}, {"title": "b", "type": "integer", "default": 1}])
    t = f.tool_node("adder", add)
    e = f.end(["sum"])
    f.control(s, t)
    f.control(t, e)
    path = f.write(tmp_path / "flow.json")
    write_tool(tmp_path / "tools", "add.py", "out = {'sum': args['a'] + args['b']}")
    proc = heddle("validate", path, "--tools-dir", tmp_path / "tools")
    assert proc.returncode == 0, proc.stderr
    assert "'calc'" in proc.stdout and "1 StartNode" in proc.stdout and "graph     valid" in proc.stdout
    from heddle.canonical import fingerprint

    expected = fingerprint({"type": "object", "required": ["a"], "properties": {
        "a": {"title": "a", "type": "integer"}, "b": {"title": "b", "type": "integer", "default": 1}}})
    assert expected in proc.stdout and "add.py" in proc.stdout
    report = json.loads(heddle_here(capsys, "validate", path, "--tools-dir", tmp_path / "tools", "--json").stdout)
    assert report["valid"] is True and report["tools"][0]["fingerprint"] == expected


def test_every_problem_is_reported_at_once(tmp_path):
    f = FlowDoc("broken")
    s = f.start(["x"])
    router = f.branching("router", {"yes": "go", "no": "stop"}, "x")
    dead_end = f.tool_node("dead_end", server_tool("ghost"))
    f.end(["x"], name="island")
    f.control(s, router)
    f.control(router, dead_end, "go")
    path = f.write(tmp_path / "flow.json")
    proc = heddle("validate", path, "--tools-dir", tmp_path)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    for needle in [
        "EndNode 'island' is not reachable from the start node",
        "no EndNode is reachable",
        "ToolNode 'dead_end' has no outgoing control edge",
        "BranchingNode 'router' can take branch 'stop' but no control edge leaves by it",
        "BranchingNode 'router' can take branch 'default'",
        "ServerTool 'ghost' has no executable",
    ]:
        assert needle in out, needle


def test_unconditional_edge_covers_every_branch(tmp_path):
    f = FlowDoc()
    s = f.start(["x"])
    router = f.branching("router", {"a": "A"}, "x")
    e = f.end(["x"])
    f.control(s, router)
    f.control(router, e)
    assert check_doc(f.write(tmp_path / "f.json")) == (0, "")


def test_edge_to_a_node_not_in_the_flow(tmp_path):
    f = FlowDoc()
    s = f.start(["x"])
    e = f.end(["x"])
    stray = f.end(["x"], name="stray")
    f.control(s, e)
    f.data(stray, "x", e, "x")
    f.order.remove(stray)
    code, error = check_doc(f.write(tmp_path / "f.json"))
    assert code == 2
    assert "data edge 'stray_x_to_end': source_node 'stray' is not in the flow's nodes" in error


def test_start_node_must_be_a_start_node(tmp_path):
    f = FlowDoc()
    s = f.start(["x"])
    e = f.end(["x"])
    f.control(s, e)
    f.start_id = e
    code, error = check_doc(f.write(tmp_path / "f.json"))
    assert code == 2 and "start_node 'end' is a EndNode, not a StartNode" in error


def test_missing_tools_are_refused_before_a_run(tmp_path, capsys):
    f = FlowDoc()
    s = f.start(["x"])
    t = f.tool_node("step", server_tool("ghost"))
    e = f.end(["x"])
    f.control(s, t)
    f.control(t, e)
    path = f.write(tmp_path / "f.json")
    proc = heddle_here(capsys, "run", path, "--input", '{"x": 1}')
    assert proc.returncode == 2
    assert "ServerTool 'ghost' has no executable (no --tools-dir was given)" in proc.stderr
    proc = heddle_here(capsys, "run", path, "--tools-dir", tmp_path / "nowhere", "--input", '{"x": 1}')
    assert "the tools directory" in proc.stderr and "does not exist" in proc.stderr


def test_two_files_for_one_tool_name_are_refused(tmp_path):
    tools = tmp_path / "tools"
    write_tool(tools, "echo.py", "out = args")
    write_tool(tools, "echo.sh", "out = args")
    f = FlowDoc()
    s = f.start(["x"])
    e = f.end(["x"])
    f.control(s, e)
    code, error = check_doc(f.write(tmp_path / "f.json"), tools)
    assert code == 2 and "echo.py and echo.sh both define tool 'echo'" in error
