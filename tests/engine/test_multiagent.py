"""Swarm and ManagerWorkers: agents reaching each other with send_message and handoff_conversation,
each on its own model and tools, the user's conversation carried to the next turn; at the top level
and as an AgentNode's agent. A2AAgent stays refused."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.engine.conversation import Conversation
from heddle.errors import DocumentError
from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_tool
from tests.support.inproc import URL, run_doc, served_model


def agent(name: str, prompt: str, *, tools: list[dict[str, Any]] | None = None, **fields: Any) -> dict[str, Any]:
    return {"component_type": "Agent", "id": f"agent-{name}", "name": name, "description": f"{name} helps",
            "llm_config": fields.pop("llm", None) or llm_config(URL), "system_prompt": prompt,
            "tools": tools or [], **fields}


def write(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"agentspec_version": "26.1.0", **doc}), encoding="utf-8")
    return path


def run_turn(doc: Path, tools: Path | None, message: str, transport: Any, *, inputs: dict[str, Any] | None = None,
             conversation: Conversation | None = None, events: list[ev.Event] | None = None) -> Any:
    from heddle.engine.options import RunOptions
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.agentspec import load_flow
    from heddle.tools.registry import discover_tools

    prepared = prepare_run(load_flow(doc), tools=discover_tools(tools), tools_dir=tools, options=RunOptions())
    sink = events.append if events is not None else ev.ignore
    return asyncio.run(run_prepared(prepared, inputs or {}, transport=transport, message=message,
                                    conversation=conversation, on_event=sink))


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = request["body"]["messages"]
    return sent


def tool_names(request: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in request["body"].get("tools") or []]


def test_a_manager_asks_a_worker_on_its_own_model_and_answers_with_its_reply(tmp_path: Path) -> None:
    from heddle.graph import llm_configs
    from heddle.agentspec import load_flow

    tools = tmp_path / "tools"
    write_tool(tools, "refund.py", "out = {'status': 'refund RF-1 of ' + str(args['amount'])}")
    worker = agent("Refunds", "You process refunds.", tools=[server_tool("refund", [prop("amount", "number")],
                                                                          ["status"])],
                   llm=llm_config(URL, name="worker model"))
    manager = agent("Manager", "You serve customer {{customer}}.")
    doc = write(tmp_path / "team.json", {"component_type": "ManagerWorkers", "id": "team", "name": "team",
                                         "group_manager": manager, "workers": [worker]})
    flow = load_flow(doc)
    assert [p["title"] for p in flow.inputs] == ["customer"]  # the agents' placeholders
    assert [config.name for _, config in llm_configs(flow)] == ["scripted", "worker model"]
    script = [call("send_message", recipient="Refunds", message="Refund 25.5 to C-7"),
              call("refund", amount=25.5), {"content": "Refund RF-1 done"}, {"content": "Your refund is on its way."}]
    events: list[ev.Event] = []
    with served_model(script) as model:
        outcome = run_turn(doc, tools, "Refund my order", model.transport, inputs={"customer": "C-7"}, events=events)
        sent = model.requests()
    assert outcome.outputs == {"result": "Your refund is on its way."}
    assert messages(sent[0]) == [{"role": "system", "content": "You serve customer C-7."},
                                 {"role": "user", "content": "Refund my order"}]
    assert tool_names(sent[0]) == ["send_message"]
    assert "- Refunds: Refunds helps" in sent[0]["body"]["tools"][0]["function"]["description"]
    # The worker sees the manager's message alone, with its own tools and no one to ask.
    assert messages(sent[1]) == [{"role": "system", "content": "You process refunds."},
                                 {"role": "user", "content": "Refund 25.5 to C-7"}]
    assert tool_names(sent[1]) == ["refund"]
    # Its answer comes back to the manager as the tool's result, as it said it.
    assert messages(sent[3])[-1] == {"role": "tool", "tool_call_id": "call_0_0", "content": "Refund RF-1 done"}
    calls = [(e.type, e.tool) for e in events if isinstance(e, ev.ToolCall | ev.ToolResult)]
    assert calls == [("tool_call", "send_message"), ("tool_call", "refund"), ("tool_result", "refund"),
                     ("tool_result", "send_message")]


def swarm(handoff: Any = True) -> dict[str, Any]:
    doctor = agent("Doctor", "You are a general practitioner.")
    skin = agent("Dermatologist", "You treat skin conditions.")
    pharmacy = agent("Pharmacist", "You know about medication.")
    return {"component_type": "Swarm", "id": "clinic", "name": "clinic", "first_agent": doctor,
            "relationships": [[doctor, skin], [doctor, pharmacy], [skin, pharmacy]], "handoff": handoff}


def test_a_swarm_hands_the_conversation_over_and_the_next_turn_continues_with_that_agent(tmp_path: Path) -> None:
    doc = write(tmp_path / "clinic.json", swarm())
    conversation = Conversation()
    first = [call("handoff_conversation", recipient="Dermatologist"), {"content": "It is eczema."}]
    with served_model(first) as model:
        outcome = run_turn(doc, None, "My arm itches", model.transport, conversation=conversation)
        sent = model.requests()
    assert outcome.outputs == {"result": "It is eczema."}
    assert tool_names(sent[0]) == ["send_message", "handoff_conversation"]
    # The dermatologist takes the whole conversation over, under its own prompt.
    history = messages(sent[1])
    assert history[0] == {"role": "system", "content": "You treat skin conditions."}
    assert history[1] == {"role": "user", "content": "My arm itches"}
    assert "handed over from agent 'Doctor' to agent 'Dermatologist'" in history[-1]["content"]
    assert conversation.active == {"clinic": "Dermatologist"}

    # The session keeps it as JSON; the next turn is the dermatologist's, with the history.
    kept = Conversation.from_json(json.loads(json.dumps(conversation.as_json())))
    second = [call("send_message", recipient="Pharmacist", message="Is cetirizine in stock?"),
              {"content": "In stock."}, {"content": "Yes, take cetirizine."}]
    with served_model(second) as model:
        outcome = run_turn(doc, None, "Can I take cetirizine?", model.transport, conversation=kept)
        sent = model.requests()
    assert outcome.outputs == {"result": "Yes, take cetirizine."}
    history = messages(sent[0])
    assert history[0]["content"] == "You treat skin conditions."
    assert [m["content"] for m in history if m["role"] == "user"] == ["My arm itches", "Can I take cetirizine?"]
    assert {"role": "assistant", "content": "It is eczema."} in history
    assert messages(sent[1]) == [{"role": "system", "content": "You know about medication."},
                                 {"role": "user", "content": "Is cetirizine in stock?"}]
    assert messages(sent[2])[-1]["content"] == "In stock."
    assert kept.agents["clinic:Dermatologist -> Pharmacist"][-1] == {"role": "assistant", "content": "In stock."}


@pytest.mark.parametrize(("handoff", "offered"), [
    ("never", ["send_message"]), ("optional", ["send_message", "handoff_conversation"]),
    ("always", ["handoff_conversation"]), (False, ["send_message"])])
def test_the_handoff_mode_says_which_tools_the_agents_get(tmp_path: Path, handoff: Any, offered: list[str]) -> None:
    doc = write(tmp_path / "clinic.json", swarm(handoff))
    with served_model([{"content": "Hello."}]) as model:
        assert run_turn(doc, None, "Hi", model.transport).outputs == {"result": "Hello."}
        assert tool_names(model.requests()[0]) == offered


def test_asking_an_agent_out_of_reach_is_an_error_the_model_recovers_from(tmp_path: Path) -> None:
    a, b = agent("A", "You are A."), agent("B", "You are B.")
    c = agent("C", "You are C.")
    doc = write(tmp_path / "swarm.json", {"component_type": "Swarm", "id": "s", "name": "s", "first_agent": a,
                                          "relationships": [[a, b], [b, a], [b, c]], "handoff": "never"})
    script = [call("send_message", recipient="C", message="hello"),  # A cannot reach C
              call("send_message", recipient="B", message="What is 2+2?"),
              call("send_message", recipient="A", message="Which sum?"),  # A waits for B: B cannot ask it
              {"content": "4"}, {"content": "2+2 is 4."}]
    with served_model(script) as model:
        outcome = run_turn(doc, None, "Ask B for 2+2", model.transport)
        sent = model.requests()
    assert outcome.outputs == {"result": "2+2 is 4."}
    refused = json.loads(messages(sent[1])[-1]["content"])["error"]
    assert refused == "Error: agent 'A' cannot send a message to 'C': the agents it can are 'B'"
    waiting = json.loads(messages(sent[3])[-1]["content"])["error"]
    assert "agent 'A' is waiting for your answer" in waiting
    assert messages(sent[4])[-1]["content"] == "4"


def test_a_group_as_an_agent_node_takes_its_inputs_and_gives_its_outputs(tmp_path: Path) -> None:
    lead = agent("Lead", "Summarise {{topic}}.", human_in_the_loop=False)
    helper = agent("Helper", "You find facts.", human_in_the_loop=False)
    team = {"component_type": "ManagerWorkers", "id": "team", "name": "team", "group_manager": lead,
            "workers": [helper], "outputs": [prop("summary"), prop("facts", "integer")]}
    f = FlowDoc("research", use_refs=False)
    s = f.start(["topic"])
    n = f._node("AgentNode", "research", ["topic"], team["outputs"], agent=team)
    e = f.end(["summary", "facts"])
    f.control(s, n)
    f.control(n, e)
    f.data(s, "topic", n, "topic")
    f.data(n, "summary", e, "summary")
    f.data(n, "facts", e, "facts")
    script = [call("send_message", recipient="Helper", message="Facts about owls?"), {"content": "Owls hoot."},
              {"content": json.dumps({"summary": "Owls hoot.", "facts": 1})}]
    with served_model(script) as model:
        state = run_doc(f.write(tmp_path / "flow.json"), None, {"topic": "owls"}, transport=model.transport)
        sent = model.requests()
    assert (state["summary"], state["facts"]) == ("Owls hoot.", 1)
    assert messages(sent[0])[0]["content"].startswith("Summarise owls.\n\nWhen you give your final answer")
    assert json.loads(messages(sent[0])[-1]["content"]) == {"topic": "owls"}


def test_an_a2a_agent_or_a_group_in_a_group_is_refused_naming_why(tmp_path: Path) -> None:
    from heddle.agentspec import load_flow

    remote = {"component_type": "A2AAgent", "id": "far", "name": "far away", "agent_url": "http://example.test"}
    team = {"component_type": "ManagerWorkers", "id": "team", "name": "team",
            "group_manager": agent("Manager", "You lead."), "workers": [remote]}
    with pytest.raises(DocumentError) as err:
        load_flow(write(tmp_path / "a2a.json", team))
    assert ("workers[0] is an A2AAgent: the reference runtime takes only Agents as a Swarm's or a ManagerWorkers' "
            "agents") in str(err.value)
    with pytest.raises(DocumentError) as err:
        load_flow(write(tmp_path / "nested.json", {**team, "workers": [swarm()]}))
    assert "workers[0] is a Swarm: heddle runs a Swarm's or a ManagerWorkers' agents when they are Agents" in str(
        err.value)
