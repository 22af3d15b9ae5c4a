"""Data flow as the Agent Spec reference defines it: data edges carry a source node's outputs to a
destination node's inputs, a flow without data edges wires by name, the EndNode's inputs are the
flow's outputs, and an input nothing can give is refused before any tool or model is called.

Tools are real subprocesses; the scripted model is served in-process (tests.support.inproc).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_tool
from tests.support.inproc import check_doc, refusal, run_outcome, served_model


def stamp_tools(tmp_path: Path) -> Path:
    """`first` and `second` both answer an output titled `text`; `show` echoes its `text`."""
    tools = tmp_path / "tools"
    write_tool(tools, "first.py", "out = {'text': 'from first'}")
    write_tool(tools, "second.py", "out = {'text': 'from second'}")
    write_tool(tools, "show.py", "out = {'shown': 'show saw ' + args['text']}")
    return tools


def test_two_nodes_writing_one_title_keep_their_own_values_on_their_edges(tmp_path: Path) -> None:
    tools = stamp_tools(tmp_path)
    f = FlowDoc("same-title")
    s = f.start()
    a = f.tool_node("a", server_tool("first", [], ["text"]))
    b = f.tool_node("b", server_tool("second", [], ["text"]))
    show = f.tool_node("show", server_tool("show", ["text"], ["shown"]))
    e = f.end(["from_a", "from_b", "shown"])
    for x, y in ((s, a), (a, b), (b, show), (show, e)):
        f.control(x, y)
    f.data(a, "text", show, "text")  # `b` ran last, but the edge names `a`
    f.data(a, "text", e, "from_a")
    f.data(b, "text", e, "from_b")
    f.data(show, "shown", e, "shown")
    outcome = run_outcome(f.write(tmp_path / "f.json"), tools)
    assert outcome.outputs == {"from_a": "from first", "from_b": "from second", "shown": "show saw from first"}
    assert outcome.state["from_a"] == "from first" and outcome.state["shown"] == "show saw from first"


def test_several_edges_into_one_input_take_the_source_that_ran_last(tmp_path: Path) -> None:
    tools = stamp_tools(tmp_path)
    f = FlowDoc("latest")
    s = f.start()
    a = f.tool_node("a", server_tool("first", [], ["text"]))
    b = f.tool_node("b", server_tool("second", [], ["text"]))
    e = f.end(["text"])
    for x, y in ((s, b), (b, a), (a, e)):
        f.control(x, y)
    f.data(b, "text", e, "text")
    f.data(a, "text", e, "text")
    assert run_outcome(f.write(tmp_path / "f.json"), tools).outputs == {"text": "from first"}


def test_a_flow_without_data_edges_wires_by_name_the_latest_output(tmp_path: Path) -> None:
    tools = stamp_tools(tmp_path)
    f = FlowDoc("by-name")
    s = f.start()
    a = f.tool_node("a", server_tool("first", [], ["text"]))
    b = f.tool_node("b", server_tool("second", [], ["text"]))
    show = f.tool_node("show", server_tool("show", ["text"], ["shown"]))
    e = f.end(["shown"])
    for x, y in ((s, a), (a, b), (b, show), (show, e)):
        f.control(x, y)
    doc = f.document()
    doc["data_flow_connections"] = None
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    outcome = run_outcome(path, tools)
    assert outcome.outputs == {"shown": "show saw from second"}


def llm_flow(tmp_path: Path, url: str) -> Path:
    """Start(n) -> LlmNode(prompt {{n}}, output `answer`) -> End(answer, kept with a default).

    The EndNode's `kept` has a default and no edge: it keeps it, whatever the LlmNode is called.
    The flow's `extra` output is not the EndNode's at all: it takes the flow's default.
    """
    f = FlowDoc("defaults")
    s = f.start([prop("n", "integer")])
    llm = f.llm("ask", llm_config(url), "What is {{n}}?", [prop("n", "integer")],
                [prop("answer"), prop("kept")])
    e = f.end(["answer", prop("kept", default="default kept")])
    f.control(s, llm)
    f.control(llm, e)
    f.data(s, "n", llm, "n")
    f.data(llm, "answer", e, "answer")
    doc = f.document()
    doc["outputs"] = [prop("answer"), prop("kept"), prop("extra", "boolean", default=True)]
    path = tmp_path / "defaults.json"
    path.write_text(json.dumps(doc))
    return path


def test_the_end_node_inputs_are_the_flow_outputs_with_defaults_filled_in(tmp_path: Path) -> None:
    script: list[dict[str, Any]] = [{"content": '{"answer": "four", "kept": "from the model"}'}]
    with served_model(script) as model:
        outcome = run_outcome(llm_flow(tmp_path, model.url), None, {"n": 4}, transport=model.transport)
        body = model.requests()[0]["body"]
    assert outcome.outputs == {"answer": "four", "kept": "default kept", "extra": True}
    # The printed state holds every value produced, each flow output with exactly its value.
    assert outcome.state["n"] == 4 and outcome.state["kept"] == "default kept" and outcome.state["extra"] is True
    assert body["messages"][0]["content"] == "What is 4?"


def test_a_flow_node_gives_exactly_its_subflow_outputs_and_leaves_by_its_end_branch(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "shout.py", "out = {'loud': args['text'].upper(), 'scratch': 'inner only'}")
    write_tool(tools, "mark.py", "out = {'marked': args['loud'] + '!'}")
    sub = FlowDoc("sub", use_refs=False)
    ss = sub.start(["text"])
    st = sub.tool_node("shout", server_tool("shout", ["text"], ["loud", "scratch"]))
    se = sub.end(["loud"])
    sub.components[se]["branch_name"] = "shouted"
    sub.control(ss, st)
    sub.control(st, se)
    sub.data(ss, "text", st, "text")
    sub.data(st, "loud", se, "loud")
    f = FlowDoc("outer")
    s = f.start(["words"])
    fn = f.flow_node("inner", sub.document(), inputs=["text"], outputs=["loud"])
    mark = f.tool_node("mark", server_tool("mark", ["loud"], ["marked"]))
    e = f.end(["marked"])
    f.control(s, fn)
    f.control(fn, mark, "shouted")
    f.control(mark, e)
    f.data(s, "words", fn, "text")
    f.data(fn, "loud", mark, "loud")
    f.data(mark, "marked", e, "marked")
    outcome = run_outcome(f.write(tmp_path / "f.json"), tools, {"words": "hi"})
    assert outcome.outputs == {"marked": "HI!"}
    assert outcome.state["loud"] == "HI" and "scratch" not in outcome.state


def marker_tool(tmp_path: Path) -> tuple[Path, Path]:
    """A tool that leaves a file behind when it runs: a refused flow must never reach it."""
    tools = tmp_path / "tools"
    marker = tmp_path / "ran"
    write_tool(tools, "touch.py", f"open({str(marker)!r}, 'w').close()\nout = {{'done': True}}")
    return tools, marker


def test_an_input_nothing_gives_is_refused_before_anything_runs(tmp_path: Path) -> None:
    tools, marker = marker_tool(tmp_path)
    f = FlowDoc("unbound")
    s = f.start(["a"])
    t = f.tool_node("touch", server_tool("touch", [], ["done"]))
    needs = f.tool_node("needs", server_tool("touch", ["a", "from_machine"], ["done"]))
    e = f.end(["done"])
    for x, y in ((s, t), (t, needs), (needs, e)):
        f.control(x, y)
    f.data(s, "a", needs, "a")
    path = f.write(tmp_path / "f.json")
    code, line = refusal(path, tools, {"a": "x"})
    assert code == 2 and "ToolNode 'needs' needs input 'from_machine'" in line and "no default" in line
    assert "'a'" not in line.split("needs input")[1]
    assert check_doc(path, tools)[1] == line
    assert not marker.exists()


def test_an_unfilled_placeholder_is_refused_naming_node_and_placeholder(tmp_path: Path) -> None:
    with served_model([{"content": "never"}]) as model:
        f = FlowDoc("placeholders")
        s = f.start(["topic"])
        llm = f.llm("writer", llm_config(model.url), "Write about {{ topic }} for {{audience}}.", [])
        e = f.end(["generated_text"])
        for x, y in ((s, llm), (llm, e)):
            f.control(x, y)
        f.data(s, "topic", llm, "topic")
        f.data(llm, "generated_text", e, "generated_text")
        code, line = refusal(f.write(tmp_path / "f.json"), None, {"topic": "tea"}, transport=model.transport)
        assert model.requests() == []
    assert code == 2
    assert "LlmNode 'writer' needs input 'audience' (the placeholder {{audience}} in its prompt_template)" in line
    assert "'topic'" not in line

    # Declared inputs that leave a placeholder out: the placeholder is named, not sent as written.
    f = FlowDoc("declared")
    s = f.start(["topic"])
    llm = f.llm("writer", llm_config("http://127.0.0.1:9/v1"), "About {{topic}} for {{audience}}.", ["topic"])
    e = f.end(["generated_text"])
    for x, y in ((s, llm), (llm, e)):
        f.control(x, y)
    code, line = check_doc(f.write(tmp_path / "g.json"))
    assert code == 2 and "placeholder {{audience}} in its prompt_template is not one of its inputs (topic)" in line


def test_data_edges_naming_a_missing_output_or_input_are_named(tmp_path: Path) -> None:
    tools, marker = marker_tool(tmp_path)
    f = FlowDoc("edges")
    s = f.start(["a"])
    t = f.tool_node("touch", server_tool("touch", ["a"], ["done"]))
    e = f.end(["done"])
    f.control(s, t)
    f.control(t, e)
    f.data(s, "a", t, "a")
    f.data(t, "dnoe", e, "done")
    f.data(s, "a", t, "b")
    path = f.write(tmp_path / "f.json")
    code, line = refusal(path, tools, {"a": "x"})
    assert code == 2
    assert "data edge 'touch_dnoe_to_end': ToolNode 'touch' has no output 'dnoe' (its outputs: done)" in line
    assert "data edge 'start_a_to_touch': ToolNode 'touch' has no input 'b' (its inputs: a)" in line
    assert not marker.exists()


def test_a_flow_output_without_a_default_must_be_given_by_every_end_node(tmp_path: Path) -> None:
    tools, _ = marker_tool(tmp_path)
    f = FlowDoc("two-ends")
    s = f.start(["kind"])
    router = f.branching("router", {"a": "a"}, input_title="kind")
    ea = f.end(["kind"], name="end_a")
    eb = f.end([], name="end_b")
    f.control(s, router)
    f.control(router, ea, "a")
    f.control(router, eb, "default")
    doc = f.document()
    doc["outputs"] = [prop("kind")]
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    code, line = check_doc(path, tools)
    assert code == 2 and "the flow's output 'kind' has no default, and EndNode 'end_b' does not give it" in line
    assert "end_a" not in line
    doc["outputs"] = [prop("kind", default="none")]
    path.write_text(json.dumps(doc))
    assert check_doc(path, tools) == (0, "")
    assert run_outcome(path, tools, {"kind": "zzz"}).outputs == {"kind": "none"}
