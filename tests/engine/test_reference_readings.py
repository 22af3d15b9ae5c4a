"""Documents the specification's reader (pyagentspec 26.3.1) accepts, run as its reference runtime
(WayFlow 26.3.1) runs them, written in the style of the real-documents corpus. Each test states what
the reference gives for its document, as checked against WayFlow itself where it loads the document.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.errors import DocumentError, NeedsSessionError
from heddle.runs import execute, from_document
from heddle.settings import RunSettings
from tests.engine.test_mcp import STUB, _stdio, serving_http
from tests.engine.test_sessions import logging_tool, ran, step
from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_tool
from tests.support.inproc import URL, check_doc, refusal, run_doc, run_outcome, served_model
from tests.support.memstore import MemStore

# start(kind) -> router (BranchingNode: fruit -> sweet) --sweet--> judge (a tool) -> end(kind, verdict);
# no control edge leaves the router by `default`.
ROUTED = """
component_type: Flow
id: routed
name: routed
agentspec_version: 26.1.0
outputs:
- {title: kind, type: string}
- {title: verdict, type: string, default: none yet}
start_node: {$component_ref: s}
nodes: [{$component_ref: s}, {$component_ref: r}, {$component_ref: t}, {$component_ref: e}]
control_flow_connections:
- {component_type: ControlFlowEdge, id: c1, name: c1, from_node: {$component_ref: s}, to_node: {$component_ref: r}}
- {component_type: ControlFlowEdge, id: c2, name: c2, from_node: {$component_ref: r}, from_branch: sweet,
   to_node: {$component_ref: t}}
- {component_type: ControlFlowEdge, id: c3, name: c3, from_node: {$component_ref: t}, to_node: {$component_ref: e}}
data_flow_connections: null
$referenced_components:
  s: {component_type: StartNode, id: s, name: start, inputs: [{title: kind, type: string}],
      outputs: [{title: kind, type: string}]}
  r: {component_type: BranchingNode, id: r, name: router, mapping: {fruit: sweet},
      inputs: [{title: kind, type: string}]}
  t: {component_type: ToolNode, id: t, name: judge,
      tool: {component_type: ServerTool, id: st, name: judge, inputs: [{title: kind, type: string}],
             outputs: [{title: verdict, type: string}]}}
  e: {component_type: EndNode, id: e, name: end, inputs: [{title: kind, type: string}, {title: verdict, type: string}],
      outputs: [{title: kind, type: string}, {title: verdict, type: string}]}
"""


def _routed(tmp_path: Path, text: str = ROUTED) -> tuple[Path, Path]:
    tools = tmp_path / "tools"
    write_tool(tools, "judge.py", "out = {'verdict': 'good ' + args['kind']}")
    doc = tmp_path / "routed.yaml"
    doc.write_text(text)
    return doc, tools


# ------------------------------------------------------------------ a branch no control edge leaves

def test_a_default_branch_without_an_edge_ends_the_flow_with_the_outputs_it_has(tmp_path: Path) -> None:
    # WayFlow, the flow's outputs being `kind` alone: "rock" takes `default`, which no edge leaves:
    # FinishedStatus {"kind": "rock"}; "fruit" runs the tool to the EndNode: {"kind": "fruit"}.
    doc, tools = _routed(tmp_path, ROUTED.replace("- {title: verdict, type: string, default: none yet}\n", ""))
    assert check_doc(doc, tools) == (0, "")
    events: list[ev.Event] = []
    outcome = run_outcome(doc, tools, {"kind": "rock"}, events=events)
    assert outcome.outputs == {"kind": "rock"}
    assert any(isinstance(e, ev.Warning) and "branch 'default' but no control edge leaves by it: the flow ends there"
               in e.message for e in events)
    assert run_outcome(doc, tools, {"kind": "fruit"}).outputs == {"kind": "fruit"}


def test_an_output_with_a_default_takes_it_when_the_flow_ends_before_it_is_given(tmp_path: Path) -> None:
    # pyagentspec accepts the document; WayFlow refuses it at load (an output not given where the flow
    # may end). heddle runs what the specification accepts: the output's default where nothing gave it.
    doc, tools = _routed(tmp_path)
    assert run_outcome(doc, tools, {"kind": "rock"}).outputs == {"kind": "rock", "verdict": "none yet"}
    assert run_outcome(doc, tools, {"kind": "fruit"}).outputs == {"kind": "fruit", "verdict": "good fruit"}


def test_a_node_without_an_outgoing_edge_ends_the_flow(tmp_path: Path) -> None:
    # WayFlow: "fruit" runs the tool, whose `next` leads nowhere: FinishedStatus {"kind": "fruit"};
    # "rock" reaches the EndNode: {"kind": "rock"} (the flow's outputs are `kind`).
    text = ROUTED.replace("- {component_type: ControlFlowEdge, id: c3, name: c3, from_node: {$component_ref: t}, "
                          "to_node: {$component_ref: e}}\n", "- {component_type: ControlFlowEdge, id: c3, name: c3, "
                          "from_node: {$component_ref: r}, from_branch: default, to_node: {$component_ref: e}}\n")
    text = text.replace("- {title: verdict, type: string, default: none yet}\n", "").replace(
        "{title: verdict, type: string}],\n", "{title: verdict, type: string, default: none yet}],\n").replace(
        "{title: verdict, type: string}]}", "{title: verdict, type: string, default: none yet}]}")
    doc, tools = _routed(tmp_path, text)
    assert check_doc(doc, tools) == (0, "")
    assert run_outcome(doc, tools, {"kind": "fruit"}).outputs == {"kind": "fruit"}
    assert run_outcome(doc, tools, {"kind": "rock"}).outputs == {"kind": "rock"}


def test_an_output_nothing_gave_before_the_flow_ended_fails_the_run_naming_it(tmp_path: Path) -> None:
    # WayFlow refuses this document at load (the output is not produced where the flow may end); the
    # specification's reader accepts it: heddle runs it, and fails only when that end is reached.
    doc, tools = _routed(tmp_path, ROUTED.replace("{title: verdict, type: string, default: none yet}",
                                                  "{title: verdict, type: string}"))
    assert run_outcome(doc, tools, {"kind": "fruit"}).outputs["verdict"] == "good fruit"
    code, error = refusal(doc, tools, {"kind": "rock"})
    assert code == 1 and "took branch 'default' that no control edge leaves by" in error and "'verdict'" in error


CAUGHT_INFO = {"title": "caught_exception_info", "anyOf": [{"type": "string"}, {"type": "null"}], "default": None}


def test_a_caught_failure_without_its_edge_ends_the_flow_with_the_defaults(tmp_path: Path) -> None:
    # The specification: a failure leaves by caught_exception_branch with the outputs' defaults; no
    # edge leaves by it, so the flow ends there (WayFlow 26.3.1 cannot load a CatchExceptionNode).
    tools = tmp_path / "tools"
    write_tool(tools, "boom.py", "sys.exit(1)")
    sub = FlowDoc("risky")
    s = sub.start(["kind"])
    t = sub.tool_node("boom", server_tool("boom", ["kind"], [prop("verdict", default="unknown")]))
    e = sub.end([prop("verdict", default="unknown")])
    sub.control(s, t)
    sub.control(t, e)
    f = FlowDoc("guarded")
    s = f.start(["kind"])
    guard = f._node("CatchExceptionNode", "guard", ["kind"],
                    [prop("verdict", default="unknown"), CAUGHT_INFO],
                    subflow=sub.document())
    end = f.end(["kind", "verdict"])
    f.control(s, guard)
    f.control(guard, end)
    doc = f.write(tmp_path / "flow.json")
    assert check_doc(doc, tools) == (0, "")
    assert run_outcome(doc, tools, {"kind": "x"}).outputs == {"kind": "x", "verdict": "unknown"}


def test_two_edges_by_one_branch_stay_refused_as_the_reference_runtime_refuses_them(tmp_path: Path) -> None:
    # pyagentspec accepts it; WayFlow refuses it at load ("duplicate control flow edges with same
    # source_branch"): heddle takes WayFlow's reading (docs/agentspec.md).
    doc, tools = _routed(tmp_path, ROUTED.replace(
        "data_flow_connections: null", "- {component_type: ControlFlowEdge, id: c4, name: c4, from_node: "
        "{$component_ref: r}, from_branch: sweet, to_node: {$component_ref: e}}\ndata_flow_connections: null"))
    code, error = check_doc(doc, tools)
    assert code == 2 and "all leave BranchingNode 'router' by branch 'sweet'" in error


# ------------------------------------------------------------------ schemas compared for compatibility

def _mcp_flow(tmp_path: Path, transport: dict[str, Any], inputs: list[dict[str, Any]],
              outputs: list[dict[str, Any]], tool: str = "add") -> Path:
    f = FlowDoc("mcp")
    start = f.start([p for p in inputs if "default" not in p])
    node = f.tool_node("call", {"component_type": "MCPTool", "id": "m", "name": tool, "client_transport": transport,
                                "inputs": inputs, "outputs": outputs})
    end = f.end(outputs)
    f.control(start, node)
    f.control(node, end)
    return f.write(tmp_path / "flow.json")


@pytest.fixture(scope="module")
def adder() -> Iterator[dict[str, Any]]:
    """A transport to the `mcp` package's server of tests/engine/test_mcp.py, one for the module,
    which lists add(a: integer, b: integer) -> integer. The schemas compared are the server's
    whatever carries them (the stdio transport has tests of its own there), and one server in this
    process spares each test a Python start that imports the `mcp` package."""
    with serving_http() as (base, _):
        yield {"component_type": "StreamableHTTPTransport", "id": "http", "name": "adder", "url": base + "/mcp"}


def test_a_narrower_declaration_than_the_servers_runs(tmp_path: Path, adder: dict[str, Any]) -> None:
    # The server (the `mcp` package) lists add(a: integer, b: integer) -> integer. The document takes
    # `a` from an enum of integers, gives `b` a default, and reads the result as a number: every
    # argument it may send is accepted and every result fits, so the tool runs.
    doc = _mcp_flow(tmp_path, adder, [prop("a", "integer", enum=[1, 2, 3]), prop("b", "integer", default=10)],
                    [prop("total", "number")])
    assert run_doc(doc, None, {"a": 2})["total"] == 12


def _where(tmp_path: Path, listed: dict[str, Any], inputs: list[dict[str, Any]]) -> Path:
    """A flow calling the stub's tool `where`, whose server lists `listed` (and takes any call)."""
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    schema = {"type": "object", "properties": listed, "required": sorted(listed)}
    return _mcp_flow(tmp_path, _stdio(script, json.dumps(schema), "/"), inputs, [prop("cwd")], tool="where")


def test_a_number_declared_where_the_server_lists_integer_runs_and_each_call_is_checked(tmp_path: Path) -> None:
    # WayFlow 26.3.1 loads this document (it logs that the descriptors differ and compares nothing);
    # it sends a=1 and the server answers, and it sends a=1.5 and the server (the `mcp` package)
    # refuses it ("Input should be a valid integer"). heddle runs it too, and checks each call
    # against the server's listed schema before sending it: 1.5 fails as that tool call, naming the
    # argument and both declarations (the stub would have taken it).
    doc = _where(tmp_path, {"a": {"type": "integer"}, "b": {"type": "integer"}},
                 [prop("a", "number"), prop("b", "integer")])
    assert run_doc(doc, None, {"a": 1, "b": 2})["cwd"]  # the server answered
    code, error = refusal(doc, None, {"a": 1.5, "b": 2})
    assert code != 0 and "'where'" in error and "\n" not in error
    assert "the server's input schema refuses argument 'a' (a: 1.5 is not of type 'integer')" in error
    assert 'the document declares {"type": "number"}, the server lists {"type": "integer"}' in error


def test_an_agent_is_told_when_its_call_is_refused_by_the_servers_schema(tmp_path: Path) -> None:
    # The model's call breaks the server's schema, not the document's: it gets the error as the
    # tool's result and answers again, as with a call the server itself refuses.
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    tool = {"component_type": "MCPTool", "id": "m", "name": "where", "description": "Where am I?",
            "client_transport": _stdio(script, json.dumps(schema), "/"), "inputs": [prop("a", "number")]}
    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "a",
                               "llm_config": llm_config(URL), "system_prompt": "You look.", "tools": [tool]}))
    call = {"tool_calls": [{"name": "where", "arguments": {"a": 1.5}}]}
    done = step(doc, MemStore(), message="where?", script=[call, {"content": "sorry"}])
    assert done.outcome.outputs == {"result": "sorry"}
    told = done.requests[1]["body"]["messages"][-1]
    assert told["role"] == "tool" and "the server's input schema refuses argument 'a'" in told["content"]


@pytest.mark.parametrize(("listed", "inputs", "named"), [
    ({"a": {"type": "integer"}}, [prop("a", "string")], "a: the document says string, the server integer"),
    ({"a": {"enum": ["x", "y"]}}, [prop("a", "string", enum=["p", "q"])],
     'a: none of the document\'s values ["p", "q"] is admitted by {"enum": ["x", "y"]}'),
    ({"a": {"type": "string"}, "b": {"type": "string"}}, [prop("a", "string")],
     "b: the server requires it, and the document has no way to send it"),
])
def test_a_real_conflict_is_refused_naming_both(tmp_path: Path, listed: dict[str, Any], inputs: list[dict[str, Any]],
                                                named: str) -> None:
    # WayFlow loads these too, and the server refuses every call; as no value the document may send
    # could be taken, heddle refuses before any tool runs, naming both schemas.
    doc = _where(tmp_path, listed, inputs)
    code, error = refusal(doc, None, {"a": "p"})
    assert code != 0 and "MCPTool 'where'" in error and named in error
    assert "declared {" in error and "listed {" in error


@pytest.mark.parametrize(("kind", "refused"), [("number", False), ("string", True)])
def test_the_servers_output_schema_must_meet_the_documents_outputs(
        tmp_path: Path, adder: dict[str, Any], kind: str, refused: bool) -> None:
    # The `mcp` package lists add's outputSchema as {result: integer}. An output `result` read as a
    # number meets it (each result is checked against it as it comes); one read as a string cannot.
    # WayFlow logs that the descriptors differ and calls the tool.
    doc = _mcp_flow(tmp_path, adder, [prop("a", "integer"), prop("b", "integer")],
                    [prop("result", kind)])
    if not refused:
        assert run_doc(doc, None, {"a": 2, "b": 3})["result"] == 5
        return
    code, error = refusal(doc, None, {"a": 2, "b": 3})
    assert code != 0 and "MCPTool 'add'" in error
    assert "results the document's outputs cannot take (result: the document says string, the server integer)" in error


def test_an_integer_declared_where_the_server_lists_number_runs(tmp_path: Path) -> None:
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    schema = {"type": "object", "properties": {"a": {"type": ["number", "null"]}, "note": {"type": "string"}},
              "required": ["a"]}
    doc = _mcp_flow(tmp_path, _stdio(script, json.dumps(schema), "/"), [prop("a", "integer")], [], tool="where")
    assert run_doc(doc, None, {"a": 1}) is not None


@pytest.mark.parametrize(("mine", "theirs", "meet"), [
    ({"type": "integer"}, {"type": "number"}, True),
    ({"type": "number"}, {"type": "integer"}, True),  # the integers: each call is checked
    ({"type": "string"}, {"type": "integer"}, False),
    ({"enum": ["a", "b"]}, {"type": "string"}, True),
    ({"type": "string"}, {"enum": ["a", "b"]}, True),
    ({"enum": ["a", "b"]}, {"enum": ["c"]}, False),
    ({"enum": [1, 2]}, {"type": "string"}, False),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, {"type": "string"}, True),
    ({"anyOf": [{"type": "boolean"}, {"type": "null"}]}, {"type": "string"}, False),
    ({"type": "string"}, {"anyOf": [{"type": "integer"}, {"type": "null"}]}, False),
    ({"type": ["string", "null"]}, {"type": "integer", "nullable": True}, True),
    ({"type": "integer"}, {"type": "integer", "minimum": 0}, True),  # left to each call
    ({"type": "array", "items": {"type": "string"}}, {"type": "array", "items": {"type": "integer"}}, True),  # []
    ({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
     {"type": "object", "properties": {"x": {"type": "integer"}}}, False),
    ({"type": "object", "properties": {"x": {"type": "string"}}},
     {"type": "object", "properties": {"x": {"type": "integer"}}}, True),  # x may be left out
    ({"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": False},
     {"type": "object", "required": ["y"]}, False),
    ({"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
     {"type": "object", "properties": {"y": {"type": "string"}}, "additionalProperties": False}, False),
    ({"type": ["object", "null"], "properties": {"x": {"type": "string"}}, "required": ["x"]},
     {"type": ["object", "null"], "properties": {"x": {"type": "integer"}}, "required": ["x"]}, True),  # null
])
def test_the_compatibility_relation(mine: dict[str, Any], theirs: dict[str, Any], meet: bool) -> None:
    from heddle.tools.compat import conflict

    assert (conflict(mine, theirs) is None) is meet


# ------------------------------------------------------------------ a confirmation never skipped

def test_a_client_tool_that_requires_confirmation_in_a_tool_node_asks_first(tmp_path: Path) -> None:
    # WayFlow: ToolExecutionConfirmationStatus first; once confirmed, ToolRequestStatus (the client's
    # result is asked for only then).
    f = FlowDoc("confirm-client")
    s = f.start(["city"])
    node = f.tool_node("lookup", {"component_type": "ClientTool", "id": "ct", "name": "get_weather",
                                  "inputs": [prop("city")], "outputs": [prop("forecast")],
                                  "requires_confirmation": True})
    e = f.end(["forecast"])
    f.control(s, node)
    f.control(node, e)
    doc = f.write(tmp_path / "flow.json")
    store = MemStore()
    first = step(doc, store, inputs={"city": "Zurich"})
    assert first.outcome.waiting is not None and first.outcome.waiting.kind == "approval"
    assert first.outcome.waiting.tool == "get_weather"
    second = step(doc, store, answer={"approve": True})
    assert second.outcome.waiting is not None and second.outcome.waiting.kind == "client_tool"
    third = step(doc, store, answer={"tool_result": "snow"})
    assert third.outcome.outputs == {"forecast": "snow"}


def test_a_toolbox_that_requires_confirmation_asks_before_each_call(tmp_path: Path) -> None:
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    box = {"component_type": "MCPToolBox", "id": "box", "name": "box", "requires_confirmation": True,
           "client_transport": _stdio(script, json.dumps({"type": "object", "properties": {}}), "/")}
    doc = tmp_path / "agent.json"
    # A toolbox's requires_confirmation is of Agent Spec 26.1.2.
    doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.2", "id": "a", "name": "a",
                               "llm_config": llm_config(URL), "system_prompt": "You add.", "toolboxes": [box]}))
    store = MemStore()
    call = {"tool_calls": [{"name": "where", "arguments": {}}]}
    first = step(doc, store, message="where?", script=[call])
    assert first.outcome.waiting is not None and first.outcome.waiting.kind == "approval"
    assert first.outcome.waiting.tool == "where"
    second = step(doc, store, answer={"approve": True}, script=[{"content": "here"}])
    assert second.outcome.outputs == {"result": "here"}
    told = second.requests[0]["body"]["messages"][-1]
    assert told["role"] == "tool" and "cwd" in told["content"]  # the server's answer, once approved


# ------------------------------------------------------------------ fields the specification does not define

AGENT_WITH_FLOWS = {
    "component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "helper", "system_prompt": "Help.",
    # Not a field of an Agent: pyagentspec drops it, WayFlow never sees the ApiNode inside.
    "flows": [{"component_type": "ApiNode", "id": "api", "name": "api", "url": "http://x", "http_method": "GET"}],
}


def test_a_field_the_specification_does_not_define_is_not_read_and_is_named(tmp_path: Path) -> None:
    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({**AGENT_WITH_FLOWS, "llm_config": llm_config(URL)}))
    events: list[ev.Event] = []
    with served_model([{"content": "hello"}]) as model:
        out = run_doc(doc, message="hi", transport=model.transport, events=events)
    assert out["result"] == "hello"
    warned = [e.message for e in events if isinstance(e, ev.Warning)]
    assert any("$: Agent 'helper' has field 'flows', which the specification does not define for Agent" in w
               for w in warned), warned


def test_strict_refuses_a_field_the_specification_does_not_define(tmp_path: Path) -> None:
    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({**AGENT_WITH_FLOWS, "llm_config": llm_config(URL)}))
    with pytest.raises(DocumentError) as refused:
        from_document(doc, RunSettings(strict=True))
    assert "Agent 'helper' has field 'flows'" in str(refused.value) and "--strict" in str(refused.value)


def test_a_field_the_specification_defines_is_still_read(tmp_path: Path) -> None:
    # human_in_the_loop is an Agent's field: false is honoured (the agent never waits for the user).
    f = FlowDoc("triage")
    s = f.start(["query"])
    a = f.agent("triage", URL, inputs=("query",), outputs=("topic", "summary"))
    f.components[a]["agent"]["human_in_the_loop"] = False
    e = f.end(["topic", "summary"])
    f.control(s, a)
    f.control(a, e)
    doc = f.write(tmp_path / "flow.json")
    with served_model([{"content": "a question?"}, {"content": json.dumps({"topic": "t", "summary": "s"})}]) as m:
        assert run_doc(doc, inputs={"query": "q"}, transport=m.transport)["topic"] == "t"


# ------------------------------------------------------------------ a session keeps its inputs

def test_a_later_turn_keeps_the_first_turns_inputs_and_overrides_only_what_it_names(tmp_path: Path) -> None:
    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "a",
                               "llm_config": llm_config(URL),
                               "system_prompt": "You help {{user}} in {{language}}."}))
    store = MemStore()
    first = step(doc, store, inputs={"user": "Ada", "language": "French"}, message="hi", script=[{"content": "1"}])
    assert first.outcome.outputs == {"result": "1"}
    second = step(doc, store, message="again", script=[{"content": "2"}])
    assert second.requests[0]["body"]["messages"][0]["content"] == "You help Ada in French."
    third = step(doc, store, inputs={"language": "German"}, message="more", script=[{"content": "3"}])
    assert third.requests[0]["body"]["messages"][0]["content"] == "You help Ada in German."


# ------------------------------------------------------------------ refused only for what is certain

def _hitl_flow(tmp_path: Path) -> Path:
    f = FlowDoc("triage")
    s = f.start(["query"])
    a = f.agent("triage", URL, inputs=("query",), outputs=("topic", "summary"))  # human_in_the_loop: the default
    e = f.end(["topic", "summary"])
    f.control(s, a)
    f.control(a, e)
    return f.write(tmp_path / "flow.json")


def test_an_agent_that_may_ask_the_user_runs_without_a_session_when_it_gives_its_outputs(tmp_path: Path) -> None:
    doc = _hitl_flow(tmp_path)
    with served_model([{"content": json.dumps({"topic": "wifi", "summary": "drops"})}]) as model:
        out = run_doc(doc, inputs={"query": "my wifi drops"}, transport=model.transport)
    assert (out["topic"], out["summary"]) == ("wifi", "drops")


def test_an_agent_that_asks_the_user_without_a_session_ends_the_run_naming_session(tmp_path: Path) -> None:
    doc = _hitl_flow(tmp_path)
    with served_model([{"content": "Which laptop?"}]) as model, pytest.raises(NeedsSessionError) as err:
        asyncio.run(execute(from_document(doc, RunSettings(), inputs={"query": "q"}), transport=model.transport))
    assert err.value.exit_code == 2 and err.value.http_status == 400
    assert "--session NAME" in str(err.value) and "\n" not in str(err.value)


def test_an_agents_confirmation_is_asked_for_when_it_calls_the_tool(tmp_path: Path) -> None:
    tools, log = tmp_path / "tools", tmp_path / "log"
    logging_tool(tools, "stamp", log, "{'stamped': args['text'] + '!'}")
    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({
        "component_type": "Agent", "agentspec_version": "26.1.0", "id": "clerk", "name": "clerk",
        "llm_config": llm_config(URL), "system_prompt": "You stamp.",
        "tools": [{**server_tool("stamp", ["text"], ["stamped"]), "requires_confirmation": True}]}))
    with served_model([{"content": "Nothing to stamp."}]) as model:
        out = run_doc(doc, tools, message="hello", transport=model.transport)
    assert out["result"] == "Nothing to stamp."
    call = {"tool_calls": [{"name": "stamp", "arguments": {"text": "x"}}]}
    with served_model([call]) as model, pytest.raises(NeedsSessionError) as err:
        run_doc(doc, tools, message="stamp x", transport=model.transport)
    assert "waits for an approval" in str(err.value) and "--session NAME" in str(err.value)
    assert ran(log) == []


def test_a_node_that_always_waits_is_still_refused_before_anything_runs(tmp_path: Path) -> None:
    f = FlowDoc("asks")
    s = f.start([])
    ask = f._node("InputMessageNode", "ask", [], ["user_input"])
    e = f.end(["user_input"])
    f.control(s, ask)
    f.control(ask, e)
    with pytest.raises(NeedsSessionError):
        asyncio.run(execute(from_document(f.write(tmp_path / "flow.json"), RunSettings())))




def test_strict_on_validate_bundle_and_the_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tests.support.cli_inproc import heddle_inproc
    from tests.support.server_thread import threaded_server

    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({**AGENT_WITH_FLOWS, "llm_config": llm_config(URL)}))
    rc, _, err = heddle_inproc(capsys, "validate", doc)
    assert rc == 0 and "has field 'flows'" in err
    rc, _, err = heddle_inproc(capsys, "validate", doc, "--strict")
    assert rc == 2 and "has field 'flows'" in err and "--strict" in err
    rc, _, err = heddle_inproc(capsys, "bundle", doc, "--strict", "-o", tmp_path / "x.heddle")
    assert rc == 2 and "has field 'flows'" in err and not (tmp_path / "x.heddle").exists()
    body = {"flow": json.loads(doc.read_text()), "message": "hi"}
    with threaded_server(tmp_path / "srv", "--strict") as server, server.client() as client:
        answer = client.post("/v1/runs", json=body)
    assert answer.status_code == 400 and "has field 'flows'" in answer.text


def test_a_wait_reached_without_a_session_over_http_is_a_400_naming_session(tmp_path: Path) -> None:
    from tests.support.server_thread import threaded_server
    from tests.support.threaded_model import threaded_model

    with threaded_model([{"content": "Which laptop?"}]) as model:
        f = FlowDoc("triage")
        s = f.start(["query"])
        a = f.agent("triage", model.url, inputs=("query",), outputs=("topic", "summary"))
        e = f.end(["topic", "summary"])
        f.control(s, a)
        f.control(a, e)
        with threaded_server(tmp_path / "srv", "--allow-net", "127.0.0.1") as server, server.client() as client:
            answer = client.post("/v1/runs", json={"flow": f.document(), "inputs": {"query": "q"}})
    error = answer.json()["error"]
    assert answer.status_code == 400 and error["type"] == "needs_session" and '"session"' in error["message"]


@pytest.mark.parametrize(("field", "value", "refused"), [
    ("api_type", "chat_completions", False),  # the default: nothing left undone
    ("api_type", "responses", True),  # another API than heddle calls
    ("retry_policy", None, False),
])
def test_a_field_the_specification_defines_and_heddle_does_not_read_is_refused_unless_default(
        tmp_path: Path, field: str, value: Any, refused: bool) -> None:
    from heddle.agentspec import load_flow

    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "a",
                               "llm_config": {**llm_config(URL, name="m"), field: value}}))
    if not refused:
        load_flow(doc)
        return
    with pytest.raises(DocumentError) as err:
        load_flow(doc)
    assert f"$.llm_config: OpenAiCompatibleConfig 'm' gives {field} {value!r}, which heddle does not honour" in str(
        err.value)
