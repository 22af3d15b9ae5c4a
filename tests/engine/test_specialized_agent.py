"""SpecializedAgent: its base agent with the additional instructions after the system prompt, the
additional tools after its tools, and the union of both inputs, at the top level and in an AgentNode."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import DocumentError
from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_tool
from tests.support.inproc import URL, run_doc, served_model


def specialized(**params: Any) -> dict[str, Any]:
    base = {"component_type": "Agent", "id": "base", "name": "base agent", "llm_config": llm_config(URL),
            "system_prompt": "You write about {{animal}}.", "inputs": [prop("animal")],
            "tools": [server_tool("lookup", ["query"], ["facts"])]}
    return {"component_type": "SpecializedAgent", "id": "special", "name": "newsletter agent", "agent": base,
            "agent_specialization_parameters": {
                "component_type": "AgentSpecializationParameters", "id": "params", "name": "newsletter",
                "additional_instructions": "Keep it under {{words}} words.",
                "additional_tools": [server_tool("publish", ["text"], ["ok"])], **params}}


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"agentspec_version": "26.1.0", **doc}), encoding="utf-8")
    return path


def tools_dir(tmp_path: Path) -> Path:
    tools = tmp_path / "tools"
    write_tool(tools, "lookup.py", "out = {'facts': 'cats sleep a lot'}")
    write_tool(tools, "publish.py", "out = {'ok': True}")
    return tools


def run_message(path: Path, tools: Path, inputs: dict[str, Any], message: str, transport: Any) -> Any:
    from heddle.engine.options import RunOptions
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.agentspec import load_flow
    from heddle.tools.registry import discover_tools

    prepared = prepare_run(load_flow(path), tools=discover_tools(tools), tools_dir=tools, options=RunOptions())
    return asyncio.run(run_prepared(prepared, inputs, transport=transport, message=message))


SCRIPT = [{"tool_calls": [{"name": "lookup", "arguments": {"query": "cats"}}]},
          {"tool_calls": [{"name": "publish", "arguments": {"text": "Cats sleep."}}]},
          {"content": "Published."}]


def check_requests(sent: list[dict[str, Any]]) -> None:
    body = sent[0]["body"]
    assert body["messages"][0] == {"role": "system", "content": "You write about cats.\n\nKeep it under 50 words."}
    assert [t["function"]["name"] for t in body["tools"]] == ["lookup", "publish"]
    assert "cats sleep a lot" in json.dumps(sent[1]["body"]["messages"])


def test_a_top_level_specialized_agent_runs_as_its_specialised_agent(tmp_path):
    from heddle.agentspec import load_flow

    doc = write(tmp_path / "agent.json", specialized())
    flow = load_flow(doc)
    # Its inputs are the union of the agent's and the specialisation's (from its placeholders).
    assert [p["title"] for p in flow.inputs] == ["animal", "words"]
    with served_model(SCRIPT) as model:
        outcome = run_message(doc, tools_dir(tmp_path), {"animal": "cats", "words": "50"}, "Write one.",
                              model.transport)
        sent = model.requests()
    assert outcome.outputs == {"result": "Published."}
    check_requests(sent)
    assert sent[0]["body"]["messages"][-1]["content"] == "Write one."


def test_in_an_agent_node(tmp_path):
    f = FlowDoc("news")
    s = f.start(["animal", "words"])
    a = f._node("AgentNode", "write", ["animal", "words"], ["result"], agent=specialized(human_in_the_loop=False))
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    with served_model(SCRIPT) as model:
        state = run_doc(f.write(tmp_path / "flow.json"), tools_dir(tmp_path), {"animal": "cats", "words": "50"},
                        transport=model.transport)
        sent = model.requests()
    assert state["result"] == "Published."
    check_requests(sent)


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d["agent_specialization_parameters"]["additional_tools"].append(server_tool("lookup", ["q"])),
     "both have a tool named 'lookup'"),
    (lambda d: d["agent_specialization_parameters"].update(inputs=[prop("animal", "integer")]),
     "input 'animal' is string in its agent and integer"),
])
def test_what_a_specialisation_cannot_say(tmp_path, change, expected):
    from heddle.agentspec import load_flow

    doc = specialized()
    change(doc)
    with pytest.raises(DocumentError) as err:
        load_flow(write(tmp_path / "agent.json", doc))
    assert expected in str(err.value) and "SpecializedAgent 'newsletter agent'" in str(err.value)


def test_a_field_of_its_agent_written_on_the_specialisation_is_not_read(tmp_path):
    # pyagentspec 26.3.1 drops it (a SpecializedAgent has no system_prompt of its own): the agent's is used.
    from heddle.agentspec import load_flow
    from heddle.agentspec.roots import document_root

    doc = specialized()
    doc["system_prompt"] = "mine"
    flow = load_flow(write(tmp_path / "agent.json", doc))
    assert "SpecializedAgent 'newsletter agent' has field 'system_prompt'" in " ".join(document_root(flow).warnings)
    assert "mine" not in json.dumps(flow.model_dump(mode="json"))
