"""What a document's top level may be: a Flow, an Agent, a single node, a `$component_ref` to one,
with shared components from a second file; agentspec_version; model URLs chosen at run time.

In-process (the scripted model over ASGITransport, tools as real subprocesses)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import DocumentError, UsageError
from heddle.settings import RunSettings
from heddle.agentspec import load_flow
from heddle.agentspec.components import EndNode
from heddle.agentspec.roots import document_root
from heddle.agentspec.versions import newer_features
from tests.support.flows import llm_config, prop, server_tool, write_tool
from tests.support.inproc import URL, run_outcome, served_model


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


def agent_doc(*, outputs: list[dict[str, Any]] | None = None, tools: list[dict[str, Any]] | None = None,
              url: str = URL, version: str = "25.4.1") -> dict[str, Any]:
    return {"component_type": "Agent", "id": "helper", "name": "helper", "agentspec_version": version,
            "inputs": [prop("user")], "outputs": outputs or [],
            "llm_config": llm_config(url, name="brain"),
            "system_prompt": "You help {{user}}.", "tools": tools or []}


def llm_node_doc(url: str = URL, **extra: Any) -> dict[str, Any]:
    return {"component_type": "LlmNode", "id": "shout", "name": "shout", "agentspec_version": "26.1.0",
            "llm_config": llm_config(url, name="brain"), "prompt_template": "Shout {{word}}.", **extra}


# --------------------------------------------------------------------------- an Agent at the top


def test_an_agent_document_answers_the_users_message(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "double", 'out = {"twice": args["n"] * 2}')
    doc = write(tmp_path / "agent.json", agent_doc(tools=[server_tool("double", [prop("n", "integer")],
                                                                      [prop("twice", "integer")])]))
    script: list[dict[str, Any]] = [{"tool_calls": [{"name": "double", "arguments": {"n": 21}}]},
                                    {"content": "It is 42, Ann."}]
    with served_model(script) as model:
        outcome = run_outcome(doc, tools, {"user": "Ann"}, transport=model.transport, message="Double 21")
        first = model.requests()[0]["body"]["messages"]
    # One turn: the system prompt rendered with the inputs, then the user's own words (not the inputs as JSON).
    assert first == [{"role": "system", "content": "You help Ann."}, {"role": "user", "content": "Double 21"}]
    assert outcome.outputs == {"result": "It is 42, Ann."}


def test_a_declared_output_named_result_wins_over_the_answer_text(tmp_path: Path) -> None:
    doc = write(tmp_path / "agent.json", agent_doc(outputs=[prop("result", "integer"), prop("note")]))
    with served_model([{"content": '{"result": 7, "note": "counted"}'}]) as model:
        outcome = run_outcome(doc, None, {"user": "Ann"}, transport=model.transport, message="count")
    assert outcome.outputs == {"result": 7, "note": "counted"}


def test_an_agent_needs_a_message_and_a_flow_takes_none(tmp_path: Path) -> None:
    doc = write(tmp_path / "agent.json", agent_doc())
    with pytest.raises(UsageError, match=r"\(its top level is Agent 'helper'\) answers a user: give the user's "
                                         r"message with message=$"):
        run_outcome(doc, None, {"user": "Ann"})
    node = write(tmp_path / "node.json", llm_node_doc())
    with pytest.raises(UsageError, match=r"^message: .* is not an agent \(its top level is LlmNode 'shout'\)"):
        run_outcome(node, None, {"word": "hi"}, message="hello")


def test_an_agent_inside_a_flow_is_still_handed_its_inputs(tmp_path: Path) -> None:
    inner = agent_doc()
    flow = {"component_type": "Flow", "id": "f", "name": "f", "agentspec_version": "25.4.1",
            "start_node": {"$component_ref": "s"}, "nodes": [{"$component_ref": n} for n in ("s", "a", "e")],
            "control_flow_connections": [
                {"component_type": "ControlFlowEdge", "name": "s-a", "from_node": {"$component_ref": "s"},
                 "to_node": {"$component_ref": "a"}},
                {"component_type": "ControlFlowEdge", "name": "a-e", "from_node": {"$component_ref": "a"},
                 "to_node": {"$component_ref": "e"}}],
            "data_flow_connections": None,
            "$referenced_components": {
                "s": {"component_type": "StartNode", "id": "s", "name": "s", "inputs": [prop("user")]},
                "a": {"component_type": "AgentNode", "id": "a", "name": "a", "agent": inner,
                      "inputs": [prop("user")], "outputs": []},
                "e": {"component_type": "EndNode", "id": "e", "name": "e"}}}
    doc = write(tmp_path / "flow.json", flow)
    with served_model([{"content": "done"}]) as model:
        run_outcome(doc, None, {"user": "Ann"}, transport=model.transport)
        assert model.requests()[0]["body"]["messages"][1] == {"role": "user", "content": '{"user": "Ann"}'}
    assert document_root(load_flow(doc)).kind == "flow"


# --------------------------------------------------------------------------- a node at the top


def test_an_llm_node_runs_as_a_one_node_flow(tmp_path: Path) -> None:
    doc = write(tmp_path / "node.json", llm_node_doc())
    flow = load_flow(doc)
    assert [n.component_type for n in flow.nodes] == ["StartNode", "LlmNode", "EndNode"]
    assert document_root(flow).kind == "node" and not document_root(flow).conversational
    with served_model([{"content": "HI!"}]) as model:
        outcome = run_outcome(doc, None, {"word": "hi"}, transport=model.transport)
        assert model.requests()[0]["body"]["messages"] == [{"role": "user", "content": "Shout hi."}]
    assert outcome.outputs == {"generated_text": "HI!"}


def test_a_tool_node_runs_its_tool_and_a_branching_node_ends_by_its_branch(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "upper", 'out = {"loud": args["text"].upper()}')
    tool_doc = {"component_type": "ToolNode", "id": "t", "name": "t", "agentspec_version": "25.4.1",
                "tool": server_tool("upper", [prop("text")], [prop("loud")])}
    outcome = run_outcome(write(tmp_path / "tool.json", tool_doc), tools, {"text": "hey"})
    assert outcome.outputs == {"loud": "HEY"}

    branching = {"component_type": "BranchingNode", "id": "b", "name": "b", "mapping": {"y": "yes"}}
    flow = load_flow(write(tmp_path / "branch.json", branching))
    ends = [n for n in flow.nodes if isinstance(n, EndNode)]
    assert sorted(n.branch_name or "" for n in ends) == ["default", "yes"]
    assert run_outcome(tmp_path / "branch.json", None, {"branching_mapping_key": "y"}).outputs == {}


@pytest.mark.parametrize(("component", "hint"), [
    ({"component_type": "ServerTool", "name": "lonely"}, "put it in a ToolNode or an Agent's tools"),
    (llm_config(URL, name="brain"), "use it as the llm_config of an LlmNode or an Agent"),
    ({"component_type": "StartNode", "name": "s"}, "a flow needs one around it"),
])
def test_a_component_with_nothing_to_run_is_refused_at_the_top(tmp_path: Path, component: dict[str, Any],
                                                               hint: str) -> None:
    with pytest.raises(DocumentError) as caught:
        load_flow(write(tmp_path / "doc.json", component))
    message = caught.value.message
    assert f"$ is a {component['component_type']} {component['name']!r}, which heddle cannot run" in message
    assert hint in message and "\n" not in message


# --------------------------------------------------------------------------- references and components


def test_a_root_reference_resolves_like_any_other(tmp_path: Path) -> None:
    doc = {"$component_ref": "main", "agentspec_version": "25.4.1",
           "$referenced_components": {"main": {**llm_node_doc(), "llm_config": {"$component_ref": "brain"}},
                                      "brain": llm_config(URL, name="brain")}}
    flow = load_flow(write(tmp_path / "doc.json", doc))
    assert document_root(flow).component_type == "LlmNode"


def test_shared_components_come_from_a_second_file(tmp_path: Path) -> None:
    main = write(tmp_path / "main.json", {**agent_doc(), "llm_config": {"$component_ref": "brain"}})
    comps = tmp_path / "comps.yaml"
    comps.write_text("$referenced_components:\n  brain:\n    component_type: OpenAiCompatibleConfig\n"
                     f"    id: brain\n    name: brain\n    model_id: m\n    url: {URL}\n", encoding="utf-8")
    with pytest.raises(DocumentError, match=r"'brain', which is not in any enclosing .*--components FILE"):
        load_flow(main)
    with served_model([{"content": "hello Ann"}]) as model:
        outcome = run_outcome(main, None, {"user": "Ann"}, transport=model.transport, message="hi",
                              components=comps)
    assert outcome.outputs == {"result": "hello Ann"}
    # An id both files define is refused: which of the two was meant cannot be guessed.
    clash = write(tmp_path / "clash.json", {**agent_doc(), "llm_config": {"$component_ref": "brain"},
                                             "$referenced_components": {"brain": llm_config(URL, name="b2")}})
    with pytest.raises(DocumentError, match=rf"defines 'brain', which --components {comps} also defines"):
        load_flow(clash, components=comps)
    bad = write(tmp_path / "bad.json", {"brain": llm_config(URL)})
    with pytest.raises(DocumentError, match=r"a components file is an object with one key, \$referenced_components"):
        load_flow(main, components=bad)


# --------------------------------------------------------------------------- agentspec_version


@pytest.mark.parametrize("version", ["25.4.1", "25.4.2", "26.1", "26.3.1", "26.2.0.dev1"])
def test_versions_from_25_4_through_26_are_read(tmp_path: Path, version: str) -> None:
    load_flow(write(tmp_path / "doc.json", {**llm_node_doc(), "agentspec_version": version}))


@pytest.mark.parametrize("version", ["25.3.1", "24.1.0", "27.0.0", "latest"])
def test_other_versions_are_refused(tmp_path: Path, version: str) -> None:
    with pytest.raises(DocumentError, match=rf"agentspec_version '{version}' is not supported; heddle reads "
                                            r"25.4.x through 26.x"):
        load_flow(write(tmp_path / "doc.json", {**llm_node_doc(), "agentspec_version": version}))


def test_a_feature_newer_than_the_declared_version_is_refused(tmp_path: Path) -> None:
    # pyagentspec 26.3.1 refuses a component whose type a later version introduced ("Invalid
    # agentspec_version: ... the minimum allowed version is 26.1.2").
    sub = {"component_type": "Flow", "id": "sub", "name": "sub", "start_node": {"$component_ref": "ss"},
           "nodes": [{"$component_ref": "ss"}, {"$component_ref": "se"}],
           "control_flow_connections": [{"component_type": "ControlFlowEdge", "name": "x",
                                         "from_node": {"$component_ref": "ss"}, "to_node": {"$component_ref": "se"}}],
           "$referenced_components": {"ss": {"component_type": "StartNode", "id": "ss", "name": "ss"},
                                      "se": {"component_type": "EndNode", "id": "se", "name": "se"}}}
    catch = {"component_type": "CatchExceptionNode", "id": "c", "name": "guard", "subflow": sub,
             "agentspec_version": "25.4.1"}
    with pytest.raises(DocumentError) as caught:
        load_flow(write(tmp_path / "doc.json", catch))
    assert str(caught.value) == (f"{tmp_path / 'doc.json'}: $ is a CatchExceptionNode, which Agent Spec 26.1.2 "
                                 "introduced, but the document declares agentspec_version 25.4.1; declare 26.1.2 "
                                 "or later")
    assert newer_features({"component_type": "MapNode"}, "25.4.1", source="d") == []  # in 25.4.1 already
    newer = load_flow(write(tmp_path / "new.json", {**catch, "agentspec_version": "26.1.2"}))
    assert document_root(newer).warnings == ()


@pytest.mark.parametrize(("field", "value", "declared", "since"), [
    # pyagentspec 26.3.1 refuses each of these: a field its declared version predates, given a value
    # other than its default.
    ("url_allow_list", ["https://example.com/"], "26.1.0", "26.1.2"),
    ("sensitive_headers", {"Authorization": "$TOKEN"}, "25.4.1", "25.4.2"),
    ("requires_confirmation", True, "25.4.1", "25.4.2"),
    ("data", "a text body", "25.4.1", "25.4.2"),
])
def test_a_field_newer_than_the_declared_version_is_refused(tmp_path: Path, field: str, value: Any, declared: str,
                                                            since: str) -> None:
    tool = {"component_type": "RemoteTool", "id": "t", "name": "fetch", "url": "https://example.com/a",
            "http_method": "GET", "inputs": [], "outputs": [], field: value}
    doc = {"component_type": "Agent", "id": "a", "name": "a", "system_prompt": "hi",
           "llm_config": llm_config(URL), "tools": [tool], "agentspec_version": declared}
    with pytest.raises(DocumentError) as caught:
        load_flow(write(tmp_path / "doc.json", doc))
    assert (f"$.tools[0]: RemoteTool 'fetch' sets {field}, which Agent Spec {since} introduced, but the document "
            f"declares agentspec_version {declared}; declare {since} or later") in str(caught.value)
    # The field at its default is no newer feature (pyagentspec accepts it); nor is it in its version.
    default = {"url_allow_list": None, "sensitive_headers": {}, "requires_confirmation": False, "data": {}}[field]
    load_flow(write(tmp_path / "default.json", {**doc, "tools": [{**tool, field: default}]}))
    load_flow(write(tmp_path / "since.json", {**doc, "agentspec_version": since}))


# --------------------------------------------------------------------------- model URLs at run time


def test_a_model_url_read_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = write(tmp_path / "node.json", llm_node_doc(url="$SHOUT_URL"))
    monkeypatch.delenv("SHOUT_URL", raising=False)
    with pytest.raises(UsageError) as caught:
        run_outcome(doc, None, {"word": "hi"})
    assert caught.value.message == ("llm_config 'brain' of LlmNode 'shout': url names environment variable "
                                    "SHOUT_URL, which is not set; export SHOUT_URL=http://HOST[:PORT][/PATH] "
                                    "before running")
    monkeypatch.setenv("SHOUT_URL", "http://from-env.test/v9")
    with served_model([{"content": "HI"}]) as model:
        run_outcome(doc, None, {"word": "hi"}, transport=model.transport)
        request = model.requests()[0]
    assert request["headers"]["host"] == "from-env.test" and request["path"] == "/v9/chat/completions"


def test_a_model_url_given_for_one_run(tmp_path: Path) -> None:
    doc = write(tmp_path / "node.json", llm_node_doc(url="http://written.test/v1"))
    by_id = load_flow(doc).nodes[1].llm_config.id  # type: ignore[union-attr]
    for name in ("brain", by_id):
        settings = RunSettings(model_urls=(f"{name}=http://given.test/v2",))
        with served_model([{"content": "HI"}]) as model:
            run_outcome(doc, None, {"word": "hi"}, settings=settings, transport=model.transport)
            assert model.requests()[0]["headers"]["host"] == "given.test"
    with pytest.raises(UsageError, match=r"^--model-url nope: the document has no llm config of that name or id; "
                                         r"its llm configs are: 'brain' \(id "):
        run_outcome(doc, None, {"word": "hi"}, settings=RunSettings(model_urls=("nope=http://x.test",)))
    with pytest.raises(UsageError, match=r"^--model-url 'brain': give NAME=URL"):
        RunSettings(model_urls=("brain",))


# --------------------------------------------------------------------------- the library


def test_heddle_run_gives_the_outputs_and_takes_the_message_and_components(tmp_path: Path) -> None:
    import heddle

    tools = tmp_path / "tools"
    write_tool(tools, "upper", 'out = {"loud": args["text"].upper()}')
    main = write(tmp_path / "node.json", {"component_type": "ToolNode", "id": "t", "name": "t",
                                          "tool": {"$component_ref": "upper"}})
    comps = write(tmp_path / "comps.json", {"$referenced_components": {
        "upper": server_tool("upper", [prop("text")], [prop("loud")])}})
    result = heddle.run(main, inputs={"text": "hey"}, tools_dir=tools, components=comps)
    assert result.outputs == {"loud": "HEY"} and result.state == {"text": "hey", "loud": "HEY"}
    with pytest.raises(UsageError, match=r"^message: .* is not an agent"):
        heddle.run(main, inputs={"text": "hey"}, tools_dir=tools, components=comps, message="hi")
    agent = write(tmp_path / "agent.json", agent_doc())
    with pytest.raises(UsageError, match=r"give the user's message with message=\.\.\.$"):
        heddle.run(agent, inputs={"user": "Ann"})
