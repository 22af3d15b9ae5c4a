"""What heddle does not run is refused before anything runs, in one line naming the component,
its path in the document and what would run it: Swarm, ManagerWorkers, BuiltinTools no plugin
provides, one tool name for two tools. What may wait for a person (requires_confirmation,
human_in_the_loop inside a flow, a ClientTool in a ToolNode) runs in a session and is refused
without one, before anything runs, naming where it would wait; a ClientTool an agent calls fails
there without one (tests/engine/test_sessions.py runs them all in one)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import DocumentError, NeedsSessionError
from tests.plugins.support import make_plugin, run_in_process
from tests.support.cli import error_line
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_script, write_tool
from tests.support.inproc import URL, check_doc, run_doc, served_model


def agent(name: str = "helper", *, tools=(), **fields: Any) -> dict[str, Any]:
    return {"component_type": "Agent", "id": f"agent-{name}", "name": name, "llm_config": llm_config(URL),
            "system_prompt": "You help.", "tools": list(tools), **fields}


def write(tmp_path: Path, doc: dict[str, Any], name: str = "doc.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"agentspec_version": "26.1.0", **doc}), encoding="utf-8")
    return path


def agent_node_flow(tmp_path: Path, the_agent: dict[str, Any]) -> Path:
    f = FlowDoc("with-agent", use_refs=False)
    s = f.start(["query"])
    a = f._node("AgentNode", "ask", ["query"], ["result"], agent=the_agent)
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    return f.write(tmp_path / "flow.json")


def refused(path: Path) -> str:
    from heddle.agentspec import load_flow

    with pytest.raises(DocumentError) as err:
        load_flow(path)
    message = str(err.value)
    assert "\n" not in message
    return message


def may_wait(path: Path) -> tuple[str, ...]:
    """Where the document at `path` may wait for a person, as heddle found when it read it."""
    from heddle.agentspec import load_flow
    from heddle.agentspec.roots import document_root

    return document_root(load_flow(path)).waits


def needs_session(path: Path, tools: Path | None = None, message: str | None = None) -> str:
    """The refusal of a run without a session of a document that may wait: before the model is
    asked or a tool runs, in one line naming the document and saying to pass --session."""
    from heddle.runs import execute, from_document
    from heddle.settings import RunSettings

    with served_model([{"content": "never"}]) as model:
        with pytest.raises(NeedsSessionError) as err:
            asyncio.run(execute(from_document(path, RunSettings(), tools_dir=tools), message=message,
                                transport=model.transport))
        assert model.requests() == []
    text = str(err.value)
    assert "\n" not in text and err.value.exit_code == 2 and text.startswith(f"{path} may wait for a person: ")
    assert "--session NAME" in text
    return text


def test_requires_confirmation_needs_a_session_wherever_it_is(tmp_path):
    tool = {**server_tool("get_weather", ["city"]), "requires_confirmation": True}
    tools = tmp_path / "tools"
    write_tool(tools, "get_weather.py", "out = {}")
    # An agent may never call it: it runs without a session, and a call it makes ends the run then
    # (tests/engine/test_reference_readings.py).
    assert may_wait(write(tmp_path, agent("weather", tools=[tool]))) == ()
    f = FlowDoc("confirm")
    s = f.start(["city"])
    t = f.tool_node("ask", tool)
    e = f.end()
    f.control(s, t)
    f.control(t, e)
    message = needs_session(f.write(tmp_path / "flow.json"), tools)
    assert "$.nodes[1].tool: ServerTool 'get_weather' of ToolNode 'ask' has requires_confirmation: true" in message
    # false, or not written, is what heddle does: run the tool.
    assert may_wait(write(tmp_path, agent(tools=[{**tool, "requires_confirmation": False}]))) == ()


def test_human_in_the_loop_inside_a_flow_may_wait_but_is_not_refused_before_it_does(tmp_path):
    # It may give its outputs without asking anyone: refused only when it does ask (test_reference_readings.py).
    for allowed in (agent(human_in_the_loop=True), agent(human_in_the_loop=False), agent()):
        assert check_doc(agent_node_flow(tmp_path, allowed)) == (0, "")
        assert may_wait(agent_node_flow(tmp_path, allowed)) == ()
    top = write(tmp_path, agent(human_in_the_loop=True))
    with served_model([{"content": "hello"}]) as model:
        assert run_message(top, "hi", model.transport).outputs == {"result": "hello"}


def run_message(path: Path, message: str, transport: Any) -> Any:
    """One turn of an agent document, as `heddle run DOC --message TEXT` takes it."""
    from heddle.engine.options import RunOptions
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.agentspec import load_flow

    prepared = prepare_run(load_flow(path), tools={}, tools_dir=None, options=RunOptions())
    return asyncio.run(run_prepared(prepared, {}, transport=transport, message=message))


def test_a_specialisation_decides_human_in_the_loop(tmp_path):
    def specialised(base: Any, override: Any) -> dict[str, Any]:
        return {"component_type": "SpecializedAgent", "id": "sa", "name": "special",
                "agent": agent(human_in_the_loop=base),
                "agent_specialization_parameters": {"component_type": "AgentSpecializationParameters", "id": "p",
                                                    "name": "p", "human_in_the_loop": override}}

    from heddle.agentspec.waits import wait_points

    def possible(doc: dict[str, Any]) -> list[str]:
        # What would be refused inside parallel work: where the agent may wait.
        flow = {"component_type": "ParallelFlowNode", "id": "par", "name": "par", "subflows": [
            {"component_type": "Flow", "id": "f", "name": "f", "nodes": [{"component_type": "AgentNode", "id": "n",
                                                                          "name": "n", "agent": doc}]}]}
        return wait_points(flow)[1]

    assert "SpecializedAgent 'special' has human_in_the_loop: true" in possible(specialised(True, None))[0]
    assert "SpecializedAgent 'special' has human_in_the_loop: true" in possible(specialised(False, True))[0]
    assert possible(specialised(True, False)) == []
    assert check_doc(agent_node_flow(tmp_path, specialised(True, False))) == (0, "")


def test_a_client_tool_needs_a_session_in_a_tool_node_and_when_an_agent_calls_it(tmp_path):
    client = {"component_type": "ClientTool", "id": "ct", "name": "get_weather", "inputs": [prop("city")],
              "outputs": [prop("forecast")]}
    f = FlowDoc("client")
    s = f.start(["city"])
    t = f.tool_node("ask", client)
    e = f.end(["forecast"])
    f.control(s, t)
    f.control(t, e)
    message = needs_session(f.write(tmp_path / "flow.json"))
    assert "$.nodes[1].tool: ClientTool 'get_weather' of ToolNode 'ask' is a ClientTool" in message
    # Offered to an agent (the model sees it), it runs without a session; a call waits for the
    # client's result, which needs one: the run fails there, the tool not run.
    flow = agent_node_flow(tmp_path, agent(tools=[client]))
    script = [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Bern"}}]}, {"content": "never"}]
    with served_model(script) as model:
        with pytest.raises(NeedsSessionError) as err:
            run_doc(flow, inputs={"query": "weather?"}, transport=model.transport)
        sent = model.requests()
    assert len(sent) == 1 and sent[0]["body"]["tools"][0]["function"]["name"] == "get_weather"
    assert "waits for a ClientTool's result" in str(err.value) and "--session NAME" in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.parametrize(("kind", "why"), [("Swarm", "relationships is empty"), ("ManagerWorkers", "workers is empty")])
def test_multi_agent_components_without_agents_to_reach_are_refused(tmp_path, kind, why):
    # They run (tests/engine/test_multiagent.py), but not without anyone for their agents to reach.
    doc = {"component_type": kind, "id": "team", "name": "team", "first_agent": agent("a"),
           "relationships": [], "group_manager": agent("m"), "workers": []}
    message = refused(write(tmp_path, doc))
    assert message.startswith(f"{tmp_path / 'doc.json'}: $: ") and f"{kind} 'team': {why}" in message
    message = refused(agent_node_flow(tmp_path, doc))
    assert "$.nodes[1].agent" in message and f"{kind} 'team': {why}" in message


def builtin_flow(tmp_path: Path) -> Path:
    tool = {"component_type": "BuiltinTool", "id": "bt", "name": "web_search", "tool_type": "search",
            "inputs": [prop("q")], "outputs": [prop("hits")]}
    f = FlowDoc("builtin")
    s = f.start(["q"])
    t = f.tool_node("search", tool)
    e = f.end(["hits"])
    f.control(s, t)
    f.control(t, e)
    return f.write(tmp_path / "flow.json")


def test_a_builtin_tool_runs_only_when_a_plugin_provides_it(tmp_path):
    flow = builtin_flow(tmp_path)
    code, line = check_doc(flow)
    assert code == 2 and ("$.nodes[1].tool: BuiltinTool 'web_search' (tool_type 'search') is a BuiltinTool, and "
                          "heddle has no built-in tools of its own: a plugin that provides a tool named 'web_search' "
                          "runs it (--plugin MANIFEST)") in line
    # At the top level, an agent's paths are the document's own.
    builtin = {"component_type": "BuiltinTool", "id": "bt", "name": "web_search", "tool_type": "search"}
    assert "$.tools[0]: BuiltinTool 'web_search'" in check_doc(write(tmp_path, agent(tools=[builtin])))[1]
    # A tools-folder executable of that name is not a built-in tool.
    tools = tmp_path / "tools"
    tools.mkdir()
    script = tools / "web_search.py"
    script.write_text("#!/usr/bin/env python3\nprint('{\"hits\": \"folder\"}')\n", encoding="utf-8")
    script.chmod(0o755)
    assert check_doc(flow, tools)[0] == 2
    plugin_root = tmp_path / "p"
    (plugin_root / "bin").mkdir(parents=True)
    search = plugin_root / "bin" / "search.py"
    search.write_text("#!/usr/bin/env python3\nimport json, sys\nq = json.load(sys.stdin)['q']\n"
                      "print(json.dumps({'hits': 'plugin found ' + q}))\n", encoding="utf-8")
    search.chmod(0o755)
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    manifest = make_plugin(plugin_root, tools=[{"name": "web_search", "description": "searches",
                                                "path": "bin/search.py", "inputSchema": schema}])
    state, _, _ = run_in_process(flow, tools_dir=None, plugins=[manifest], inputs={"q": "otters"})
    assert state["hits"] == "plugin found otters"
    # What the plugin's tool would never see is not accepted.
    doc = json.loads(flow.read_text())
    next(n for n in doc["$referenced_components"].values() if n["component_type"] == "ToolNode")["tool"][
        "configuration"] = {"top_k": 3}
    flow.write_text(json.dumps(doc))
    state, _, _ = run_in_process(flow, tools_dir=None, plugins=[manifest], inputs={"q": "otters"})
    assert "gives configuration, which heddle cannot pass to the plugin tool" in str(state)


def test_one_name_for_two_tools_is_refused(tmp_path):
    remote = {"component_type": "RemoteTool", "id": "rt", "name": "lookup", "url": "https://example.com/x",
              "http_method": "GET", "inputs": [], "outputs": [prop("result")]}
    f = FlowDoc("clash")
    s = f.start(["query"])
    a = f.agent("agent", llm_config(URL), tools=[server_tool("lookup", ["query"]), remote])
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    code, line = check_doc(f.write(tmp_path / "flow.json"))
    assert code == 2 and ("$.nodes[1].agent.tools[1]: RemoteTool 'lookup' has the name of the ServerTool at "
                          "$.nodes[1].agent.tools[0], another tool") in line


def test_the_cli_refuses_in_one_line(tmp_path, capsys):
    tool = {**server_tool("get_weather", ["city"]), "requires_confirmation": True}
    f = FlowDoc("confirm")
    s = f.start(["city"])
    t = f.tool_node("ask", tool)
    e = f.end()
    f.control(s, t)
    f.control(t, e)
    doc = f.write(tmp_path / "flow.json")
    # The document is otherwise runnable (its tool is in the tools folder): what is refused is running
    # it without a session.
    write_script(tmp_path / "tools", "get_weather", 'print("{}")')
    # The command's entry function in this process (a one-line refusal from a process: test_run.py's).
    proc = heddle_here(capsys, "run", doc, "--tools-dir", tmp_path / "tools", "--input", '{"city": "Paris"}')
    assert proc.returncode == 2 and proc.stdout == ""
    line = error_line(proc)
    assert "requires_confirmation: true" in line and "--session NAME" in line and str(doc) in line
    assert len([x for x in proc.stderr.splitlines() if x.strip()]) == 1


def _typed_agent_flow(tmp_path: Path, **fields: Any) -> Path:
    f = FlowDoc("typed-agent")
    s = f.start(["query"])
    a = f.agent("triage", URL, inputs=("query",), outputs=("topic", "summary"))
    f.components[a]["agent"].update(fields)
    e = f.end(["topic", "summary"])
    f.control(s, a)
    f.control(a, e)
    return f.write(tmp_path / "flow.json")


def test_an_agent_in_a_flow_that_answers_the_user_needs_a_session(tmp_path):
    # human_in_the_loop is true unless the document says otherwise: prose where its JSON outputs
    # were asked for is the agent talking to the person, and nobody is there to answer it.
    with served_model([{"content": "Which laptop do you use?"}]) as model:
        with pytest.raises(NeedsSessionError) as err:
            run_doc(_typed_agent_flow(tmp_path), None, {"query": "my wifi drops"}, transport=model.transport)
        assert len(model.requests()) == 1  # not asked again: the answer was meant for the user
    assert "answered the user instead of giving its outputs" in str(err.value)
    assert "human_in_the_loop: false" in str(err.value)


def test_an_agent_that_never_waits_is_asked_again_then_fails_naming_its_outputs(tmp_path):
    from heddle.errors import HeddleError

    script = [{"content": "Which laptop do you use?"}, {"content": "Still prose."}]
    with served_model(script) as model:
        with pytest.raises(HeddleError) as err:
            run_doc(_typed_agent_flow(tmp_path, human_in_the_loop=False), None, {"query": "x"},
                    transport=model.transport)
        assert len(model.requests()) == 2
    assert not isinstance(err.value, NeedsSessionError)
    assert "topic (string), summary (string)" in str(err.value)
