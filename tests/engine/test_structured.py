"""Structured generation: an LlmNode or an Agent whose outputs are anything but one string asks the
model for them (response_format, or an instruction where a schema-constrained turn cannot work),
reads real JSON values back, checks them against the declared types, asks again once, then fails
naming the output and its type.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_tool
from tests.support.inproc import refusal, run_outcome, served_model


def llm_flow(tmp_path: Path, url: str, outputs: list[dict[str, Any]]) -> Path:
    f = FlowDoc("structured")
    s = f.start(["article"])
    llm = f.llm("extract", llm_config(url), "Read: {{article}}", ["article"], outputs)
    e = f.end([p["title"] for p in outputs])
    f.control(s, llm)
    f.control(llm, e)
    f.data(s, "article", llm, "article")
    for p in outputs:
        f.data(llm, p["title"], e, p["title"])
    doc = f.document()
    doc["outputs"] = outputs
    ref = doc["$referenced_components"]
    for node in ref.values():
        if node["component_type"] == "EndNode":
            node["inputs"] = node["outputs"] = outputs
    path = tmp_path / "flow.json"
    path.write_text(json.dumps(doc))
    return path


ANIMAL = [prop("name"), prop("legs", "integer"), prop("threats", "array", items={"type": "string"}),
          prop("endangered", "boolean", default=False)]


def test_several_outputs_are_asked_for_with_a_json_schema_and_come_back_typed(tmp_path: Path) -> None:
    answer = '{"name": "sea turtle", "legs": 4.0, "threats": ["nets", "plastic"]}'
    with served_model([{"content": answer}]) as model:
        outcome = run_outcome(llm_flow(tmp_path, model.url, ANIMAL), None, {"article": "turtles"},
                              transport=model.transport)
        body = model.requests()[0]["body"]
    assert outcome.outputs == {"name": "sea turtle", "legs": 4, "threats": ["nets", "plastic"], "endangered": False}
    assert type(outcome.outputs["legs"]) is int and "generated_text" not in outcome.state
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "extract"
    schema = fmt["json_schema"]["schema"]
    assert schema["required"] == ["name", "legs", "threats"]
    assert schema["properties"]["threats"] == {"type": "array", "items": {"type": "string"}}
    assert body["messages"] == [{"role": "user", "content": "Read: turtles"}]


def test_one_object_output_is_the_whole_answer_and_one_array_is_keyed_by_its_name(tmp_path: Path) -> None:
    person = prop("person", "object", properties={"age": {"type": "integer"}}, required=["age"])
    with served_model([{"content": '```json\n{"age": 7}\n```'}]) as model:
        outcome = run_outcome(llm_flow(tmp_path, model.url, [person]), None, {"article": "a"},
                              transport=model.transport)
        schema = model.requests()[0]["body"]["response_format"]["json_schema"]["schema"]
    assert outcome.outputs == {"person": {"age": 7}}
    assert schema == {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}

    scores = prop("scores", "array", items={"type": "number"})
    with served_model([{"content": '{"scores": [1.5, 2]}'}, {"content": "[3]"}]) as model:
        (tmp_path / "b").mkdir()
        flow = llm_flow(tmp_path / "b", model.url, [scores])
        assert run_outcome(flow, None, {"article": "a"}, transport=model.transport).outputs == {"scores": [1.5, 2]}
        assert run_outcome(flow, None, {"article": "a"}, transport=model.transport).outputs == {"scores": [3]}


def test_an_answer_that_does_not_fit_is_asked_again_once_then_fails_naming_the_output(tmp_path: Path) -> None:
    wrong = '{"name": "turtle", "legs": "four", "threats": []}'
    right = '{"name": "turtle", "legs": 4, "threats": []}'
    with served_model([{"content": wrong}, {"content": right}]) as model:
        outcome = run_outcome(llm_flow(tmp_path, model.url, ANIMAL), None, {"article": "a"},
                              transport=model.transport)
        again = model.requests()[1]["body"]["messages"]
    assert outcome.outputs["legs"] == 4
    assert again[1] == {"role": "assistant", "content": wrong}
    assert again[2]["role"] == "user" and "output 'legs' must be integer" in again[2]["content"]

    with served_model([{"content": "a turtle, I think"}, {"content": wrong}]) as model:
        code, line = refusal(llm_flow(tmp_path, model.url, ANIMAL), None, {"article": "a"},
                             transport=model.transport)
        assert len(model.requests()) == 2
    assert code == 1 and "LlmNode 'extract'" in line
    assert "output 'legs' must be integer" in line and "legs (integer)" in line


def agent_flow(tmp_path: Path, url: str, tools: list[dict[str, Any]], **agent_fields: Any) -> Path:
    outputs = [prop("weather", default="unknown"), prop("rating", "integer", default=1)]
    f = FlowDoc("weather")
    s = f.start(["city"])
    a = f.agent("agent", llm_config(url), tools=tools, system_prompt="You report the weather in {{city}}.",
                inputs=["city"], outputs=outputs)
    f.components[a]["agent"].update(agent_fields)
    e = f.end(["weather", "rating"])
    f.control(s, a)
    f.control(a, e)
    f.data(s, "city", a, "city")
    f.data(a, "weather", e, "weather")
    f.data(a, "rating", e, "rating")
    return f.write(tmp_path / "agent.json")


def test_an_agent_without_tools_gets_a_response_format_and_gives_typed_outputs(tmp_path: Path) -> None:
    answer = '{"weather": "sunny", "rating": 5}'
    with served_model([{"content": answer}]) as model:
        outcome = run_outcome(agent_flow(tmp_path, model.url, []), None, {"city": "Agadir"},
                              transport=model.transport)
        body = model.requests()[0]["body"]
    assert outcome.outputs == {"weather": "sunny", "rating": 5}
    assert outcome.state["result"] == answer
    assert set(body["response_format"]["json_schema"]["schema"]["properties"]) == {"weather", "rating"}
    assert body["messages"][0] == {"role": "system", "content": "You report the weather in Agadir."}


def test_an_agent_with_tools_is_told_the_shape_and_asked_again_after_plain_text(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "get_weather.py", "out = {'report': 'hot in ' + args['city']}")
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Agadir"}}]},
        {"content": "It is hot."},
        {"content": '{"weather": "hot", "rating": 5.0}'},
    ]
    with served_model(script) as model:
        # An agent that may not talk to the user (a prose answer from one that may is its question to
        # the user: tests/engine/test_refusals.py)
        flow = agent_flow(tmp_path, model.url, [server_tool("get_weather", ["city"], ["report"])],
                          human_in_the_loop=False)
        outcome = run_outcome(flow, tools, {"city": "Agadir"}, transport=model.transport)
        reqs = model.requests()
    assert outcome.outputs == {"weather": "hot", "rating": 5} and type(outcome.outputs["rating"]) is int
    first = reqs[0]["body"]
    assert "response_format" not in first  # a schema-constrained turn could not call the tool
    assert "When you give your final answer" in first["messages"][0]["content"]
    assert '"rating":{"type":"integer"' in first["messages"][0]["content"]
    retry = reqs[2]["body"]["messages"]
    assert retry[-2] == {"role": "assistant", "content": "It is hot."}
    assert "the answer is not JSON" in retry[-1]["content"]
