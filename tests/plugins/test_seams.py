"""Middleware at the five seams, with real plugin processes, real tools and the scripted model (in-process)."""

from __future__ import annotations

import json

import pytest

from heddle.errors import GraphError, RunError
from heddle.plugin_host.errors import PluginError
from tests.plugins.support import make_plugin, middleware, node_type, run_in_process, tool_chain_flow, warnings
from tests.support.flows import FlowDoc, server_tool, write_tool
from tests.support.inproc import served_model


def answer(ctype: str, phase: str, seam: str, verdict: str) -> str:
    return f'''
@plugin.{phase}("{ctype}", "{seam}")
def handler(call):
    return {verdict}
'''


@pytest.mark.parametrize("seam, phase, verdict, refused", [
    ("toolCall", "before", 'retry()', "verdict 'retry', which toolCall.before does not admit; it admits proceed, "
                                       "modify, replace, reject"),
    ("toolCall", "after", 'reject("no")', "verdict 'reject', which toolCall.after does not admit; it admits pass, "
                                          "replace, fail"),
    ("node", "after", 'modify(input={})', "verdict 'modify', which node.after does not admit; it admits pass, "
                                          "replace, fail"),
    ("node", "before", 'replace()', "a 'replace' verdict without 'output'; give the new output"),
    ("node", "before", 'modify(input=[1])', "a 'modify' verdict whose 'input' is not a JSON object"),
    ("node", "before", '"proceed"', "\"proceed\"; answer {\"verdict\": ...} (or null to proceed)"),
    ("nodeError", "after", 'proceed()', "verdict 'proceed', which nodeError.after does not admit; it admits pass, "
                                        "replace, retry, fail"),
    ("toolCall", "before", 'replace(output={}, branch="x")', "a 'replace' verdict with a 'branch' it cannot carry"),
])
def test_a_verdict_the_seam_does_not_admit_is_refused(tmp_path, seam, phase, verdict, refused):
    flow, tools = tool_chain_flow(tmp_path, tools=("boom",) if seam == "nodeError" else ("first",))
    if seam == "nodeError":
        write_tool(tools, "boom.py", "raise SystemExit('down')")
    plugin = make_plugin(tmp_path / "p", components=[middleware("Odd", f"{seam}.{phase}")],
                         code=answer("Odd", phase, seam, verdict))
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"n": 1})
    assert isinstance(state, PluginError)
    assert state.message == f"plugin 'p': Odd answered {seam}.{phase} with {refused}"
    assert [e["error"] for e in events if e["type"] == "node_error"] == [state.message]


def test_node_seam_modify_replace_reject_and_fail(tmp_path):
    flow, tools = tool_chain_flow(tmp_path)
    code = '''
@plugin.before("Shape", "node")
def before(call):
    name = call.node["name"]
    if name == "first":
        return modify(input={**call.input, "n": 10})
    if name == "second" and call.config.get("skip"):
        return replace(output={"second": -1})
    if name == "second" and call.config.get("refuse"):
        return reject("second is closed today")

@plugin.after("Shape", "node")
def after(call):
    if call.node["name"] == "first" and call.config.get("fail"):
        return fail("first gave " + str(call.params["output"]))
    if call.node["name"] == "first":
        return replace(output={"first": call.params["output"]["first"] * 100})
'''
    plugin = make_plugin(tmp_path / "p", components=[middleware("Shape", "node", configSchema={"type": "object"})],
                         code=code)
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"n": 1})
    assert state["first"] == 1100 and state["second"] == 2  # only first's input was changed
    assert warnings(events) == ["plugin 'p' (Shape) replaced the output of node 'first'"]
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"n": 1},
                                      config=['Shape={"skip": true}'])
    assert state["second"] == -1 and not [e for e in events if e["type"] == "tool_call" and e["tool"] == "second"]
    assert "plugin 'p' (Shape) replaced the output of node 'second' before it ran" in warnings(events)
    state, _, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"n": 1},
                                 config=['Shape={"refuse": true}'])
    assert isinstance(state, RunError) and state.message == ("node 'second' was rejected by plugin 'p' (Shape): "
                                                             "second is closed today")
    state, _, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"n": 1},
                                 config=['Shape={"fail": true}'])
    assert state.message == "node 'first' was failed by plugin 'p' (Shape): first gave {'first': 11}"


def test_tool_call_seam_and_the_order_of_a_chain(tmp_path):
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    seen = tmp_path / "seen.jsonl"

    def shaper(name: str, add: int) -> str:
        return f'''
import json
@plugin.before("{name}", "toolCall")
def before(call):
    with open({str(seen)!r}, "a") as f:
        f.write(json.dumps(["{name}", "before", call.params["arguments"]]) + "\\n")
    return modify(arguments={{"n": call.params["arguments"]["n"] + {add}}})

@plugin.after("{name}", "toolCall")
def after(call):
    with open({str(seen)!r}, "a") as f:
        f.write(json.dumps(["{name}", "after", call.params["output"]]) + "\\n")
    return replace(output={{"first": call.params["output"]["first"] * 2}})
'''
    a = make_plugin(tmp_path / "a", components=[middleware("A", "toolCall")], code=shaper("A", 10))
    b = make_plugin(tmp_path / "b", components=[middleware("B", "toolCall")], code=shaper("B", 100))
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[a, b], inputs={"n": 1})
    # before: A then B (n 1 -> 11 -> 111, the tool adds 1); after: B then A, each doubling.
    assert state["first"] == 112 * 4
    order = [json.loads(line) for line in seen.read_text().splitlines()]
    assert order == [["A", "before", {"n": 1}], ["B", "before", {"n": 11}],
                     ["B", "after", {"first": 112}], ["A", "after", {"first": 224}]]
    call = next(e for e in events if e["type"] == "tool_call")
    assert call["arguments"] == {"n": 111}
    assert warnings(events) == ["plugin 'b' (B) replaced the result of tool 'first'",
                                "plugin 'a' (A) replaced the result of tool 'first'"]


def test_a_rejected_tool_call_in_a_tool_node_fails_the_node_and_recovery_after_a_failure(tmp_path):
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    write_tool(tools, "first.py", "raise SystemExit('service down')")
    code = '''
@plugin.before("Gate", "toolCall")
def before(call):
    if call.config["mode"] == "reject":
        return reject("not during a freeze")

@plugin.after("Gate", "toolCall")
def after(call):
    if not call.params["ok"] and call.config["mode"] == "recover":
        return replace(output={"first": 0, "recovered": call.params["error"]})
'''
    plugin = make_plugin(tmp_path / "p", components=[middleware("Gate", "toolCall", configSchema={"type": "object"})],
                         code=code)
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={}, config=['Gate={"mode": "reject"}'])
    assert state.message == "tool 'first': the call was rejected by plugin 'p' (Gate): not during a freeze"
    result = next(e for e in events if e["type"] == "tool_result")
    assert result["ok"] is False and "not during a freeze" in result["output"]["error"]
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={}, config=['Gate={"mode": "recover"}'])
    assert state["first"] == 0 and "service down" in state["recovered"]
    state, _, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={}, config=['Gate={"mode": "pass"}'])
    assert "exited with status 1: service down" in state.message


def test_node_error_retry_is_capped_by_max_node_attempts_and_replace_ends_it(tmp_path):
    flow, tools = tool_chain_flow(tmp_path, tools=("flaky",))
    write_tool(tools, "flaky.py", "raise SystemExit('still down')")
    code = '''
@plugin.after("Again", "nodeError")
def again(call):
    if call.config["give"] and call.params["attempt"] == 2:
        return replace(output={"flaky": "fallback"})
    return retry(0.01, reason="try " + str(call.params["attempt"]))
'''
    plugin = make_plugin(tmp_path / "p", components=[middleware("Again", "nodeError", configSchema={"type": "object"})],
                         code=code)
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={}, max_node_attempts=3,
                                      config=['Again={"give": false}'])
    assert "still down" in state.message
    assert len([e for e in events if e["type"] == "tool_call"]) == 3
    assert warnings(events) == [
        "plugin 'p' (Again) retried node 'flaky' (attempt 2 of 3, after 0.01 s) (try 1) after: tool 'flaky': exited "
        "with status 1: still down",
        "plugin 'p' (Again) retried node 'flaky' (attempt 3 of 3, after 0.01 s) (try 2) after: tool 'flaky': exited "
        "with status 1: still down",
        "plugin 'p' (Again) asked to retry node 'flaky', but it has run 3 time(s), the --max-node-attempts 3; the "
        "error stands"]
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={}, config=['Again={"give": true}'])
    assert state["flaky"] == "fallback"
    assert warnings(events)[-1].startswith("plugin 'p' (Again) replaced the output of node 'flaky', which failed")


def agent_flow(tmp_path, url: str, tools=()):
    f = FlowDoc("agent")
    s = f.start(["query"])
    a = f.agent("helper", url, tools=list(tools))
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    return f.write(tmp_path / "agent.json")


def test_model_call_and_agent_round_seams(tmp_path):
    tools = tmp_path / "tools"
    write_tool(tools, "echo.py", "out = {'echo': args['text']}")
    code = '''
@plugin.before("Model", "modelCall")
def before(call):
    messages = call.params["messages"]
    return modify(messages=[{"role": "system", "content": "Be brief."}, *messages])

@plugin.after("Model", "modelCall")
def after(call):
    content = call.params["response"]["content"] or ""
    if "lorem" in content and call.params["attempt"] == 1:
        return retry(0, reason="rambling")
    if content == "SECRET":
        return replace(response={"content": "[redacted]"})

@plugin.before("Rounds", "agentRound")
def rounds(call):
    if call.params["round"] > call.config["max"]:
        return reject("enough rounds")

@plugin.after("Rounds", "agentRound")
def after_round(call):
    call.log(f"round {call.params['round']}: {len(call.params['toolResults'])} tool result(s)")
'''
    plugin = make_plugin(tmp_path / "p", components=[middleware("Model", "modelCall"),
                                                     middleware("Rounds", "agentRound",
                                                                configSchema={"type": "object"})], code=code)
    script = [{"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}}]}, {"content": "lorem ipsum"},
              {"content": "SECRET"}]
    with served_model(script) as model:
        flow = agent_flow(tmp_path, model.url, tools=[server_tool("echo", ["text"])])
        state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"query": "q"},
                                          config=['Rounds={"max": 5}'], transport=model.transport)
        requests = model.requests()
    assert state["result"] == "[redacted]"
    assert len(requests) == 3 and all(r["body"]["messages"][0]["content"] == "Be brief." for r in requests)
    assert "plugin 'p' (Model) retried the model call of node 'helper' (attempt 2 of 3): rambling" in warnings(events)
    assert "plugin 'p' (Model) replaced the model's answer to node 'helper'" in warnings(events)
    logs = [e["message"] for e in events if e["type"] == "plugin_log"]
    assert logs == ["round 1: 1 tool result(s)", "round 2: 0 tool result(s)"]

    with served_model(script) as model:
        flow = agent_flow(tmp_path, model.url, tools=[server_tool("echo", ["text"])])
        state, _, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"query": "q"},
                                     config=['Rounds={"max": 1}'], transport=model.transport)
        assert len(model.requests()) == 1
    assert state.message == "agent 'helper' was stopped before round 2 by plugin 'p' (Rounds): enough rounds"


def test_a_rejected_tool_call_is_what_the_model_sees(tmp_path):
    tools = tmp_path / "tools"
    write_tool(tools, "delete.py", "out = {'deleted': args['path']}")
    code = '''
@plugin.before("Gate", "toolCall")
def gate(call):
    if call.params["arguments"]["path"].startswith("/"):
        return reject("absolute paths need approval")
'''
    plugin = make_plugin(tmp_path / "p", components=[middleware("Gate", "toolCall.before")], code=code)
    script = [{"tool_calls": [{"name": "delete", "arguments": {"path": "/etc"}}]},
              {"tool_calls": [{"name": "delete", "arguments": {"path": "tmp/x"}}]}, {"content": "done"}]
    with served_model(script) as model:
        flow = agent_flow(tmp_path, model.url, tools=[server_tool("delete", ["path"])])
        state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={"query": "q"},
                                          transport=model.transport)
        requests = model.requests()
    assert state["result"] == "done"
    refused = [m for m in requests[1]["body"]["messages"] if m["role"] == "tool"][0]["content"]
    assert json.loads(refused) == {"error": "Error: tool 'delete': the call was rejected by plugin 'p' (Gate): "
                                            "absolute paths need approval"}
    assert [e["output"] for e in events if e["type"] == "tool_result" and e["ok"]] == [{"deleted": "tmp/x"}]


def test_plugin_nodes_inputs_outputs_branches_and_callbacks(tmp_path):
    tools = tmp_path / "tools"
    write_tool(tools, "upper.py", "out = {'text': args['text'].upper()}")
    code = '''
@plugin.node("Route")
def route(call):
    text = call.input["text"]
    if call.node["properties"].get("broken") == "branch":
        return {"kind": "x"}, "sideways"
    if call.node["properties"].get("broken") == "output":
        return {}
    up = call.run_tool("upper", {"text": text})["text"]
    call.emit("routed", {"text": up})
    call.partial({"text": "thinking"})
    reply = call.call_model([{"role": "user", "content": text}])
    return {"kind": up + "/" + reply["content"]}, ("long" if len(text) > 3 else "short")
'''
    plugin = make_plugin(tmp_path / "p", components=[node_type("Route", ["text"], ["kind"], branches=["short", "long"])],
                         code=code)

    def flow_with(url: str, start=("text",), **properties):
        f = FlowDoc("route")
        s = f.start(list(start))
        r = f._node("Route", "route", [], [], llm_config={"component_type": "OpenAiCompatibleConfig", "id": "m",
                                                          "name": "m", "model_id": "scripted", "url": url},
                    **properties)
        short, long = f.end(["kind"], name="short_end"), f.end(["kind"], name="long_end")
        f.control(s, r)
        f.control(r, short, "short")
        f.control(r, long, "long")
        return f.write(tmp_path / "route.json")

    with served_model([{"content": "ok"}]) as model:
        state, events, _ = run_in_process(flow_with(model.url), tools_dir=tools, plugins=[plugin],
                                          inputs={"text": "hello"}, transport=model.transport)
        assert model.requests()[0]["body"]["messages"] == [{"role": "user", "content": "hello"}]
    assert state["kind"] == "HELLO/ok"
    assert [e["node"] for e in events if e["type"] == "node_start"] == ["start", "route", "long_end"]
    assert {"type": "plugin_event", "plugin": "p", "name": "routed", "data": {"text": "HELLO"}, "node": "route"} in [
        {k: v for k, v in e.items() if k != "ts"} for e in events]
    assert any(e["type"] == "token_delta" and e["text"] == "thinking" for e in events)
    call = next(e for e in events if e["type"] == "tool_call")
    assert call["node"] == "route" and call["tool"] == "upper"

    state, _, _ = run_in_process(flow_with("http://127.0.0.1:9/v1", broken="branch"), tools_dir=tools,
                                 plugins=[plugin], inputs={"text": "hi"})
    assert state.message == "plugin 'p': Route node 'route' chose branch 'sideways'; it declares short, long"
    state, _, _ = run_in_process(flow_with("http://127.0.0.1:9/v1", broken="output"), tools_dir=tools,
                                 plugins=[plugin], inputs={"text": "hi"})
    assert state.message == "plugin 'p': Route node 'route' returned no output 'kind', which it declares"
    state, _, _ = run_in_process(flow_with("http://127.0.0.1:9/v1", start=()), tools_dir=tools, plugins=[plugin],
                                 inputs={})
    assert state.message == "Route 'route' needs input 'text'; give it from an earlier node's output or the flow's input"


def test_plugin_node_branches_are_checked_before_the_run(tmp_path):
    plugin = make_plugin(tmp_path / "p", components=[node_type("Route", branches=["yes", "no"])], code="")
    f = FlowDoc("route")
    s = f.start([])
    r = f._node("Route", "route", [], [])
    e = f.end([])
    f.control(s, r)
    f.control(r, e, "yes")
    f.control(r, e, "maybe")
    state, events, _ = run_in_process(f.write(tmp_path / "f.json"), tools_dir=None, plugins=[plugin], inputs={})
    assert isinstance(state, GraphError) and not events
    assert state.problems == [
        "control edge 'route_to_end' leaves Route 'route' by branch 'maybe', which plugin 'p' (Route) does not "
        "declare (it declares: yes, no)",
        "Route 'route' can take branch 'no' but no control edge leaves by it"]


def test_plugin_tools_from_the_folder_and_from_the_process(tmp_path):
    root = tmp_path / "p"
    write_tool(root / "bin", "stamp.py", "out = {'stamped': args['text'] + '!', 'cwd': os.getcwd()}")
    code = '''
@plugin.tool("reverse")
def reverse(call):
    return {"reversed": call.arguments["text"][::-1]}
'''
    schema = {"type": "object", "required": ["text"], "properties": {"text": {"type": "string", "maxLength": 10}}}
    plugin = make_plugin(root, code=code, tools=[
        {"name": "stamp", "description": "d", "inputSchema": schema, "path": "bin/stamp.py"},
        {"name": "reverse", "description": "d", "inputSchema": schema, "componentType": "Reverser"}])
    f = FlowDoc("tools")
    s = f.start(["text"])
    a = f.tool_node("stamp", server_tool("stamp", ["text"]))
    b = f.tool_node("reverse", server_tool("reverse", ["text"]))
    e = f.end(["stamped", "reversed"])
    f.control(s, a)
    f.control(a, b)
    f.control(b, e)
    flow = f.write(tmp_path / "f.json")
    state, events, _ = run_in_process(flow, tools_dir=None, plugins=[plugin], inputs={"text": "abc"})
    assert state["stamped"] == "abc!" and state["reversed"] == "cba"
    assert state["cwd"] != str(root)  # a plugin's tool runs in its node's workspace
    state, _, _ = run_in_process(flow, tools_dir=None, plugins=[plugin], inputs={"text": "much too long"})
    assert state.message == ("tool 'stamp': the arguments do not match the input schema of plugin 'p''s tool: "
                             "text: 'much too long' is too long")


def test_a_plugin_tool_gets_its_idempotency_key_from_the_folder_and_from_the_process(tmp_path):
    from heddle.engine.journal import Journal

    root = tmp_path / "p"
    write_tool(root / "bin", "stamp.py", "out = {'stamped': os.environ['HEDDLE_IDEMPOTENCY_KEY']}")
    code = '@plugin.tool("reverse")\ndef reverse(call):\n    return {"reversed": str(call.idempotency_key)}\n'
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    plugin = make_plugin(root, code=code, tools=[
        {"name": "stamp", "description": "d", "inputSchema": schema, "path": "bin/stamp.py"},
        {"name": "reverse", "description": "d", "inputSchema": schema, "componentType": "Reverser"}])
    f = FlowDoc("keys")
    s = f.start(["text"])
    a = f.tool_node("stamp", server_tool("stamp", ["text"]))
    b = f.tool_node("reverse", server_tool("reverse", ["text"]))
    e = f.end(["stamped", "reversed"])
    f.control(s, a)
    f.control(a, b)
    f.control(b, e)
    flow = f.write(tmp_path / "f.json")
    journal = Journal(session="s")
    state, _, _ = run_in_process(flow, tools_dir=None, plugins=[plugin], inputs={"text": "abc"}, journal=journal)
    assert state["stamped"].startswith("hk-") and state["reversed"].startswith("hk-")
    assert state["stamped"] != state["reversed"]
    # Outside a session a call has no key.
    state, _, _ = run_in_process(flow, tools_dir=None, plugins=[plugin], inputs={"text": "abc"})
    assert (state["stamped"], state["reversed"]) == ("", "None")


def test_a_plugin_crash_mid_run_fails_the_call_and_the_next_call_restarts_it(tmp_path):
    flow, tools = tool_chain_flow(tmp_path, tools=("first", "second"))
    marker = tmp_path / "crashed-once"
    code = f'''
import os, sys
@plugin.before("Fragile", "toolCall")
def before(call):
    if call.params["tool"] == "second" and not os.path.exists({str(marker)!r}):
        open({str(marker)!r}, "w").close()
        sys.stderr.write("fragile: out of memory\\n")
        sys.stderr.flush()
        os._exit(9)
'''
    fragile = make_plugin(tmp_path / "fragile", components=[middleware("Fragile", "toolCall.before")], code=code)
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[fragile], inputs={"n": 1})
    assert state.message == ("plugin 'fragile': exited with status 9 during 'before'; its last stderr lines: "
                             "fragile: out of memory")
    assert [e["node"] for e in events if e["type"] == "node_error"] == ["second"]
    # With a retry policy the node runs again, and the plugin, restarted, lets it through.
    marker.unlink()
    retry = make_plugin(tmp_path / "retry", components=[middleware("Retry", "nodeError")],
                        code='@plugin.after("Retry", "nodeError")\ndef r(call):\n    return retry(0)\n')
    state, events, _ = run_in_process(flow, tools_dir=tools, plugins=[fragile, retry], inputs={"n": 1})
    assert state["second"] == 2
    assert any("retried node 'second'" in w and "out of memory" in w for w in warnings(events))


def test_plugin_files_are_in_every_workspace_like_a_ro_mount(tmp_path):
    from heddle.engine import RunOptions
    from heddle.errors import UsageError
    from heddle.workspace.mounts import parse_mount
    from heddle.workspace.workspace import WorkspaceOptions

    root = tmp_path / "p"
    (root / "policy").mkdir(parents=True)
    (root / "policy" / "rules.txt").write_text("no deletes")
    plugin = make_plugin(root, files=["policy"])
    flow, tools = tool_chain_flow(tmp_path, tools=("first",))
    write_tool(tools, "first.py", "out = {'first': 1, 'rules': open('policy/rules.txt').read()}\n"
                                  "open('policy/rules.txt', 'w').write('anything goes')")
    state, _, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={})
    assert state["rules"] == "no deletes"
    assert (root / "policy" / "rules.txt").read_text() == "no deletes"  # a private copy, never copied back
    (tmp_path / "mine").mkdir()
    clash = RunOptions(workspace=WorkspaceOptions(mounts=(parse_mount(f"{tmp_path / 'mine'}:policy"),)))
    state, _, _ = run_in_process(flow, tools_dir=tools, plugins=[plugin], inputs={}, options=clash)
    assert isinstance(state, UsageError) and "DEST 'policy' is already used by mount" in state.message
