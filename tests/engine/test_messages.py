"""OutputMessageNode shows its message (an event, and `messages` beside the outputs); InputMessageNode
waits for the user's message, in a session (tests/engine/test_sessions.py), and is refused without
one. In-process, but for one `heddle run --outputs` as a user types it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import heddle
from heddle.engine import events as ev
from heddle.errors import DocumentError
from heddle.graph import check_flow
from heddle.agentspec import load_flow
from tests.support.cli import state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, llm_config, prop
from tests.support.inproc import URL, check_doc, run_outcome, served_model


def greeting_flow(tmp_path: Path, message: str = "Hello {{name}}, you have {{items}}.", *,
                  outputs: tuple[str, ...] = ("name",), **node: Any) -> Path:
    """start(name, items) -> an OutputMessageNode -> end(outputs), wired by data edges."""
    f = FlowDoc("greet")
    start = f.start(["name", prop("items", "array", items={"type": "integer"})])
    shown = f._node("OutputMessageNode", "hello", ["name", "items"], [], message=message, **node)
    end = f.end(list(outputs))
    f.control(start, shown)
    f.control(shown, end)
    f.data(start, "name", shown, "name")
    f.data(start, "items", shown, "items")
    for title in outputs:
        f.data(start, title, end, title)
    return f.write(tmp_path / "flow.json")


def test_the_message_is_rendered_from_the_node_inputs_shown_and_kept_beside_the_outputs(tmp_path: Path) -> None:
    flow = greeting_flow(tmp_path)
    events: list[ev.Event] = []
    outcome = run_outcome(flow, inputs={"name": "Ann", "items": [1, 2]}, events=events)
    # Strings go in as they are, other values as compact JSON; the node gives no outputs.
    assert outcome.messages == ("Hello Ann, you have [1,2].",)
    assert [(e.node, e.text) for e in events if isinstance(e, ev.Message)] == [("hello", "Hello Ann, you have [1,2].")]
    assert outcome.outputs == {"name": "Ann"}
    assert outcome.state == {"name": "Ann", "items": [1, 2]}  # the final state stays what it was
    result = heddle.run(flow, inputs={"name": "Bo", "items": []})
    assert result.messages == ("Hello Bo, you have [].",) and result.outputs == {"name": "Bo"}
    assert any(isinstance(e, heddle.Message) and e.to_dict()["type"] == "message" for e in result.events)


def test_messages_of_subflows_are_shown_in_the_order_they_run(tmp_path: Path) -> None:
    sub = FlowDoc("say")
    s = sub.start(["x"], name="say-start")
    m = sub._node("OutputMessageNode", "say", [], [], message="item {{x}}")  # inputs inferred from the message
    e = sub.end([], name="say-end")
    sub.control(s, m)
    sub.control(m, e)
    sub.data(s, "x", m, "x")
    outer = FlowDoc("outer")
    start = outer.start([prop("iterated_x", "array", items={"type": "string"})])
    each = outer._node("MapNode", "each", [prop("iterated_x", "array", items={"type": "string"})], [],
                       subflow={**sub.document(), "outputs": []}, reducers={})
    done = outer._node("OutputMessageNode", "done", [], [], message="all done")
    end = outer.end([])
    outer.control(start, each)
    outer.control(each, done)
    outer.control(done, end)
    outer.data(start, "iterated_x", each, "iterated_x")
    outcome = run_outcome(outer.write(tmp_path / "flow.json"), inputs={"iterated_x": ["a", "b"]})
    assert outcome.messages == ("item a", "item b", "all done")


def test_an_agent_after_the_message_sees_it_in_the_flow_conversation(tmp_path: Path) -> None:
    f = FlowDoc("welcome")
    start = f.start(["query"])
    shown = f._node("OutputMessageNode", "welcome", [], [], message="Welcome, I am the assistant.")
    agent = f.agent("helper", llm_config(URL))
    end = f.end(["result"])
    f.control(start, shown)
    f.control(shown, agent)
    f.control(agent, end)
    f.data(start, "query", agent, "query")
    f.data(agent, "result", end, "result")
    with served_model([{"content": "Glad to help."}]) as model:
        outcome = run_outcome(f.write(tmp_path / "flow.json"), inputs={"query": "hi"}, transport=model.transport)
        sent = model.requests()[0]["body"]["messages"]
    assert outcome.outputs == {"result": "Glad to help."} and outcome.messages == ("Welcome, I am the assistant.",)
    assert [(m["role"], m["content"]) for m in sent] == [
        ("system", "You help."), ("assistant", "Welcome, I am the assistant."), ("user", '{"query": "hi"}')]


def test_a_flow_output_named_messages_is_refused_where_messages_are_shown(tmp_path: Path) -> None:
    flow = greeting_flow(tmp_path, outputs=("messages",))
    code, error = check_doc(flow)
    assert code != 0
    assert ("flow 'greet' declares an output named 'messages', and $.nodes[1] (OutputMessageNode 'hello') shows "
            "messages") in error
    # Without an OutputMessageNode the name is the document's to use.
    f = FlowDoc("plain")
    start = f.start(["messages"])
    end = f.end(["messages"])
    f.control(start, end)
    f.data(start, "messages", end, "messages")
    assert check_doc(f.write(tmp_path / "plain.json")) == (0, "")


@pytest.mark.parametrize(("change", "expected"), [
    ({"outputs": [prop("shown")]}, ("OutputMessageNode 'hello': it declares outputs ['shown'], but an "
                                    "OutputMessageNode gives none")),
])
def test_what_an_output_message_node_cannot_honour_is_refused_by_name(tmp_path: Path, change: dict[str, Any],
                                                                      expected: str) -> None:
    flow = greeting_flow(tmp_path)
    doc = json.loads(flow.read_text())
    node = next(v for v in doc["$referenced_components"].values() if v["name"] == "hello")
    node.update(change)
    flow.write_text(json.dumps(doc))
    with pytest.raises(DocumentError) as refused:
        load_flow(flow)
    assert expected in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize("field", ["rephrase", "message_type"])
def test_a_runtimes_own_message_field_is_not_read_and_is_named(tmp_path: Path, field: str) -> None:
    # The specification gives an OutputMessageNode only `message`: its reader drops the rest, so the
    # reference runtime shows the message as written; heddle too, naming the field (--strict refuses it).
    from heddle.agentspec.roots import document_root

    flow = greeting_flow(tmp_path)
    doc = json.loads(flow.read_text())
    node = next(v for v in doc["$referenced_components"].values() if v["name"] == "hello")
    node[field] = "USER" if field == "message_type" else True
    flow.write_text(json.dumps(doc))
    warned = document_root(load_flow(flow)).warnings
    assert any(f"OutputMessageNode 'hello' has field {field!r}" in w for w in warned), warned
    with pytest.raises(DocumentError) as refused:
        load_flow(flow, strict=True)
    assert f"has field {field!r}" in str(refused.value) and "\n" not in str(refused.value)


def test_a_message_is_required_and_each_placeholder_needs_a_value(tmp_path: Path) -> None:
    flow = greeting_flow(tmp_path)
    doc = json.loads(flow.read_text())
    node = next(v for v in doc["$referenced_components"].values() if v["name"] == "hello")
    del node["message"]
    flow.write_text(json.dumps(doc))
    with pytest.raises(DocumentError, match=r"\$\.nodes\[1\]\.message: Field required"):
        load_flow(flow)
    # A placeholder nothing gives is refused before the run, naming the node and the placeholder.
    unfed = greeting_flow(tmp_path, "Hello {{nobody}}")
    code, error = check_doc(unfed)
    assert code != 0 and "OutputMessageNode 'hello': the placeholder {{nobody}} in its message" in error


def test_an_input_message_node_needs_a_session(tmp_path: Path) -> None:
    f = FlowDoc("ask")
    start = f.start([])
    ask = f._node("InputMessageNode", "ask_user", [], ["user_input"], message="What now?")
    end = f.end(["user_input"])
    f.control(start, ask)
    f.control(ask, end)
    f.data(ask, "user_input", end, "user_input")
    flow = f.write(tmp_path / "flow.json")
    assert check_doc(flow) == (0, "")  # valid: it runs in a session
    from heddle.errors import NeedsSessionError
    from heddle.runs import execute, from_document
    from heddle.settings import RunSettings

    with pytest.raises(NeedsSessionError) as refused:
        asyncio.run(execute(from_document(flow, RunSettings())))
    assert str(refused.value).startswith(f"{flow} may wait for a person: $.nodes[1]: InputMessageNode 'ask_user' "
                                         "waits for the user's message; run it in a session (--session NAME")
    assert refused.value.exit_code == 2


def test_messages_inside_parallel_subflows_are_warned_about(tmp_path: Path) -> None:
    sub = FlowDoc("branch")
    s = sub.start([], name="branch-start")
    m = sub._node("OutputMessageNode", "branch_says", [], [], message="hi")
    e = sub.end([], name="branch-end")
    sub.control(s, m)
    sub.control(m, e)
    outer = FlowDoc("outer")
    start = outer.start([])
    both = outer._node("ParallelFlowNode", "both", [], [], subflows=[{**sub.document(), "outputs": []}])
    end = outer.end([])
    outer.control(start, both)
    outer.control(both, end)
    warnings: list[str] = []
    assert check_flow(load_flow(outer.write(tmp_path / "flow.json")), warnings=warnings) == []
    assert [w for w in warnings if "OutputMessageNode 'branch_says' runs inside ParallelFlowNode 'both'" in w]


def test_the_server_answer_carries_the_messages(tmp_path: Path) -> None:
    from heddle.server.app import build_app
    from heddle.server.config import ServerConfig
    from heddle.server.service import Service

    doc = json.loads(greeting_flow(tmp_path).read_text())
    app = build_app(Service(ServerConfig()))

    async def post(query: str = "") -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
            return await client.post(f"/v1/runs{query}", json={"flow": doc, "inputs": {"name": "Ann", "items": [3]}})

    answer = asyncio.run(post())
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == {"name": "Ann"}
    assert answer.json()["messages"] == ["Hello Ann, you have [3]."]
    streamed = asyncio.run(post("?stream=true"))
    assert "event: message\n" in streamed.text and '"text":"Hello Ann, you have [3]."' in streamed.text


def test_heddle_run_outputs_prints_the_messages_in_its_one_json_object(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    # The command's entry function in this process (`--outputs` from a process:
    # tests/bundle/test_documents_cli.py).
    flow = greeting_flow(tmp_path)
    proc = heddle_here(capsys, "run", flow, "--outputs", "--input", '{"name": "Ann", "items": [1]}')
    assert state_of(proc) == {"name": "Ann", "messages": ["Hello Ann, you have [1]."]}
    assert "message from hello: Hello Ann, you have [1]." in proc.stderr
