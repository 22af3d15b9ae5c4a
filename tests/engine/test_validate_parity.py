"""`heddle validate` refuses what `heddle run` would then fail on, and accepts what the specification
accepts; both say it in the same words, because both run the same checks before any node.

Single rules are checked in-process (check_doc takes the steps `heddle validate`/`heddle run` take
before a node runs); one test shows the two commands agreeing, through their entry function."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.cli import error_line
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, llm_config, server_tool, write_tool
from tests.support.inproc import check_doc, run_doc


def _tool_flow(tmp_path: Path) -> Path:
    f = FlowDoc("echo")
    s = f.start(["text"])
    t = f.tool_node("echo", server_tool("echo", ["text"], ["text"]))
    e = f.end(["text"])
    f.control(s, t)
    f.control(t, e)
    return f.write(tmp_path / "flow.json")


def test_a_tool_without_the_exec_bit_is_refused_before_it_would_be_started(tmp_path: Path) -> None:
    tool = write_tool(tmp_path / "tools", "echo.py", "out = args")
    tool.chmod(0o644)
    code, error = check_doc(_tool_flow(tmp_path), tmp_path / "tools")
    assert code == 2 and f"ServerTool 'echo': {tool.resolve()} is not executable; run chmod +x on it" in error


def test_a_model_url_without_a_scheme_is_refused(tmp_path: Path) -> None:
    f = FlowDoc()
    s = f.start(["q"])
    llm = f.llm("ask", llm_config("localhost:8000/v1", name="local"), "{{q}}", inputs=["q"])
    e = f.end(["generated_text"])
    f.control(s, llm)
    f.control(llm, e)
    code, error = check_doc(f.write(tmp_path / "f.json"))
    assert code == 2
    assert "llm_config 'local' of LlmNode 'ask': model url 'localhost:8000/v1' is not an http(s) URL" in error


def _routed(tmp_path: Path, edges: list[tuple[str, str | None]], mapping: dict[str, str] | None = None) -> Path:
    """start -> router (BranchingNode on `kind`) -> one EndNode per (end name, branch) edge."""
    f = FlowDoc("routed")
    s = f.start(["kind"])
    router = f.branching("router", mapping or {"fruit": "sweet"}, input_title="kind")
    f.control(s, router)
    for name, branch in edges:
        f.control(router, f.end(["kind"], name=name), branch)
    return f.write(tmp_path / "f.json")


def test_two_edges_leaving_one_branch_are_named(tmp_path: Path) -> None:
    code, error = check_doc(_routed(tmp_path, [("a", "sweet"), ("b", "sweet"), ("c", "default")]))
    assert code == 2
    assert "control edges 'router_to_a', 'router_to_b' all leave BranchingNode 'router' by branch 'sweet'" in error


def test_an_edge_by_a_branch_the_node_does_not_have_is_named(tmp_path: Path) -> None:
    code, error = check_doc(_routed(tmp_path, [("a", "sweet"), ("b", "default"), ("c", "sour")]))
    assert code == 2
    assert ("control edge 'router_to_c' leaves BranchingNode 'router' by branch 'sour', which it does not have "
            "(its branches: sweet, default)") in error


def test_a_default_branch_without_an_edge_is_a_warning_and_ends_the_flow_when_taken(tmp_path: Path) -> None:
    flow = _routed(tmp_path, [("a", "sweet")])
    assert check_doc(flow) == (0, "")
    from heddle.engine import events as ev

    events: list[ev.Event] = []
    assert run_doc(flow, inputs={"kind": "fruit"}, events=events)["kind"] == "fruit"
    warnings = [e.message for e in events if isinstance(e, ev.Warning)]
    expected = ("BranchingNode 'router' can take branch 'default' but no control edge leaves by it: the flow ends "
                "there if it takes it, with the outputs it has (their defaults for the rest)")
    assert warnings == [expected]
    from heddle.agentspec import load_flow
    from heddle.validation import validation_report

    report = validation_report(load_flow(flow), tools=None, source=str(flow))
    assert report["valid"] is True and report["warnings"] == [expected]
    # As the reference runtime ends it: the flow ends normally with the outputs it has.
    assert run_doc(flow, inputs={"kind": "stone"})["kind"] == "stone"


def test_an_input_message_node_is_valid_and_the_other_problems_are_named(tmp_path: Path) -> None:
    # Until sessions, the InputMessageNode here was refused with the other problems; it now runs (in a
    # session), and validation names only what is wrong.
    f = FlowDoc()
    s = f.start(["q"])
    ask = f._node("InputMessageNode", "ask", [], ["answer"])
    show = f._node("OutputMessageNode", "show", ["answer"], [], message="{{answer}}")
    e = f.end([], name="end")
    f.control(s, ask)
    f.control(ask, show)
    f.control(show, e, "nowhere")
    code, error = check_doc(f.write(tmp_path / "f.json"))
    assert code == 2
    assert "InputMessageNode" not in error
    assert "control edge 'show_to_end' leaves OutputMessageNode 'show' by branch 'nowhere'" in error  # and the rest


def test_a_component_type_the_reader_does_not_have_is_refused_with_its_reason(tmp_path: Path) -> None:
    f = FlowDoc()
    s = f.start(["q"])
    oci = {"component_type": "OciAgent", "id": "oci", "name": "weather", "agent_endpoint_id": "ocid1.x",
           "client_config": {"component_type": "OciClientConfigWithApiKey", "id": "c", "name": "c",
                             "service_endpoint": "https://example.test", "auth_profile": "DEFAULT",
                             "auth_file_location": "~/.oci/config"}}
    api = f._node("AgentNode", "weather", ["q"], ["weather"], agent=oci)
    e = f.end(["weather"])
    f.control(s, api)
    f.control(api, e)
    code, error = check_doc(f.write(tmp_path / "f.json"))
    assert code == 2
    assert error.endswith("$.nodes[1].agent: OciAgent 'weather' cannot run in heddle: it is an agent hosted by OCI "
                          "Generative AI Agents, which heddle does not call; what would run it: a later heddle")
    assert "\n" not in error


def test_validate_and_run_agree(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tool = write_tool(tmp_path / "tools", "echo.py", "out = args")
    tool.chmod(0o644)
    f = FlowDoc("echo")
    s = f.start(["kind"])
    router = f.branching("router", {"x": "go"}, input_title="kind")
    t = f.tool_node("echo", server_tool("echo", ["kind"], ["kind"]))
    e = f.end(["kind"])
    f.control(s, router)
    f.control(router, t, "go")
    f.control(t, e)
    flow = f.write(tmp_path / "flow.json")
    # Both commands through their entry function in this process: what they decide is the subject
    # (their refusals from a process are tests/engine/test_graph.py's and test_run.py's).
    checked = heddle_here(capsys, "validate", flow, "--tools-dir", tmp_path / "tools")
    ran = heddle_here(capsys, "run", flow, "--tools-dir", tmp_path / "tools", "--input", '{"kind": "x"}')
    assert checked.returncode == ran.returncode == 2
    problem = f"ServerTool 'echo': {tool.resolve()} is not executable; run chmod +x on it"
    assert f"  - {problem}\n" in checked.stdout and problem in error_line(ran)
    assert "warning   BranchingNode 'router' can take branch 'default' but no control edge" in checked.stdout
