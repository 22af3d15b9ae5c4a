"""The engine calls its seams at every node, tool call, model call and agent round, and emits
each tool call's events once, plugins or not. In process: real tool subprocesses, no model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.engine.options import RunOptions
from heddle.engine.run import prepare_run, run_prepared
from heddle.engine.seams import (
    NO_PLUGINS,
    AgentRound,
    ModelRequest,
    ModelStep,
    NodeStep,
    NoPlugins,
    Outcome,
    PassThrough,
    Rendering,
    RoundResult,
    RoundStep,
    RunSeams,
    ToolRequest,
    ToolStep,
)
from heddle.model.turn import AssistantTurn, ToolCall
from heddle.agentspec import load_flow
from heddle.tools.registry import discover_tools
from tests.support.flows import FlowDoc, server_tool, write_tool


def tool_then_agent(tmp_path: Path) -> tuple[Any, Path]:
    tools = tmp_path / "tools"
    write_tool(tools, "echo.py", "out = {'echo': args['text']}")
    f = FlowDoc("seams")
    s = f.start(["text", "query"])
    t = f.tool_node("shout", server_tool("echo", ["text"]))
    # Nothing listens at this URL: the recording seams answer for the model.
    a = f.agent("helper", "http://127.0.0.1:9/v1", tools=[server_tool("echo", ["text"])])
    e = f.end(["echo", "result"])
    f.control(s, t)
    f.control(t, a)
    f.control(a, e)
    return load_flow(f.write(tmp_path / "flow.json")), tools


class Recorder(PassThrough):
    def __init__(self, turns: list[AssistantTurn]) -> None:
        self.turns = turns
        self.calls: list[tuple[Any, ...]] = []

    async def node(self, node: Any, inputs: dict[str, Any], next: NodeStep) -> Outcome:
        self.calls.append(("node", node.name))
        return await super().node(node, inputs, next)

    async def call_tool(self, request: ToolRequest, next: ToolStep) -> dict[str, Any]:
        self.calls.append(("tool", request.node, request.tool, request.arguments))
        return await super().call_tool(request, next)

    async def call_model(self, request: ModelRequest, next: ModelStep) -> AssistantTurn:
        self.calls.append(("model", request.node))
        return self.turns.pop(0)

    async def agent_round(self, agent_round: AgentRound, next: RoundStep) -> RoundResult:
        self.calls.append(("round", agent_round.number))
        return await super().agent_round(agent_round, next)


class Recording(NoPlugins):
    def __init__(self, seams: Recorder) -> None:
        self.seams = seams

    def start_run(self, ctx: Any, rendering: Rendering | None) -> RunSeams:
        return self.seams


def test_every_step_of_a_run_goes_through_its_seams(tmp_path: Path) -> None:
    flow, tools = tool_then_agent(tmp_path)
    recorder = Recorder([
        AssistantTurn(None, [ToolCall("c1", "echo", '{"text": "again"}')], "tool_calls"),
        AssistantTurn("done", [], "stop"),
    ])
    prepared = prepare_run(flow, tools=discover_tools(tools), tools_dir=tools, options=RunOptions(),
                           plugins=Recording(recorder))
    events: list[ev.Event] = []
    state = asyncio.run(run_prepared(prepared, {"text": "hi", "query": "q"}, on_event=events.append)).state
    assert state["echo"] == "hi" and state["result"] == "done"
    assert recorder.calls == [
        ("node", "start"),
        ("node", "shout"), ("tool", "shout", "echo", {"text": "hi"}),
        ("node", "helper"), ("round", 1), ("model", "helper"), ("tool", "helper", "echo", {"text": "again"}),
        ("round", 2), ("model", "helper"),
    ]
    calls = [(e.node, e.call_id) for e in events if isinstance(e, ev.ToolCall)]
    results = [(e.node, e.call_id, e.output) for e in events if isinstance(e, ev.ToolResult)]
    assert calls == [("shout", None), ("helper", "c1")]
    assert results == [("shout", None, {"echo": "hi"}), ("helper", "c1", {"echo": "again"})]


def test_without_plugins_the_run_passes_through_the_engines_own_seams(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    flow, tools = tool_then_agent(tmp_path)
    seen: list[str] = []
    for name in ("node", "call_tool"):
        real = getattr(PassThrough, name)

        async def noted(self: PassThrough, subject: Any, next: Any, *rest: Any, _real: Any = real,
                        _name: str = name) -> Any:
            seen.append(_name)
            return await _real(self, subject, next, *rest)

        monkeypatch.setattr(PassThrough, name, noted)

    async def no_model(self: PassThrough, request: ModelRequest, next: ModelStep) -> AssistantTurn:
        seen.append("call_model")
        return AssistantTurn("done", [], "stop")

    monkeypatch.setattr(PassThrough, "call_model", no_model)
    prepared = prepare_run(flow, tools=discover_tools(tools), tools_dir=tools, options=RunOptions())
    assert prepared.plugins is NO_PLUGINS
    state = asyncio.run(run_prepared(prepared, {"text": "hi", "query": "q"})).state
    assert state["echo"] == "hi" and state["result"] == "done"
    assert seen == ["node", "node", "call_tool", "node", "call_model"]


def test_a_protocol_without_an_encoder_plugin_is_refused(tmp_path: Path) -> None:
    from heddle.errors import UsageError

    flow, tools = tool_then_agent(tmp_path)
    prepared = prepare_run(flow, tools=discover_tools(tools), tools_dir=tools, options=RunOptions())
    with pytest.raises(UsageError, match="--protocol 'ndjson': no such protocol"):
        asyncio.run(run_prepared(prepared, {"text": "hi", "query": "q"}, rendering=Rendering("ndjson", print)))
