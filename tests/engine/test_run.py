"""Running flows: real tool subprocesses; the engine in-process where the CLI adds nothing.

A few tests run `heddle run` and the real `heddle model serve` end to end; the rest run the
same flow documents through tests.support.inproc (the scripted model over ASGITransport).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from heddle.settings import RunSettings
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, llm_config, server_tool, write_script, write_tool
from tests.support.inproc import refusal, run_doc, served_model
from tests.support.threaded_model import threaded_model


def chain(tmp_path: Path) -> tuple[Path, Path]:
    tools = tmp_path / "tools"
    write_tool(tools, "add.py", "out = {'sum': args['a'] + args['b']}")
    write_tool(tools, "double.py", "out = {'doubled': args['x'] * 2}")
    f = FlowDoc("chain")
    s = f.start([{"title": "a", "type": "integer"}, {"title": "b", "type": "integer"}])
    add = f.tool_node("adder", server_tool("add", [{"title": "a", "type": "integer"},
                                                   {"title": "b", "type": "integer"}]))
    dbl = f.tool_node("doubler", server_tool("double", [{"title": "x", "type": "integer"}]))
    e = f.end(["sum", "doubled"])
    f.control(s, add)
    f.control(add, dbl)
    f.control(dbl, e)
    f.data(add, "sum", dbl, "x")
    return f.write(tmp_path / "flow.json"), tools


def test_tool_chain_with_a_renaming_data_edge(tmp_path: Path) -> None:
    flow, tools = chain(tmp_path)
    assert run_doc(flow, tools, {"a": 2, "b": 3}) == {"a": 2, "b": 3, "sum": 5, "doubled": 10}


def test_input_that_is_not_a_json_object_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # `--input @FILE` and `--input -` are read by the --verbose and --protocol heddle runs below.
    flow, tools = chain(tmp_path)
    proc = heddle("run", flow, "-t", tools, "--input", "[1]")
    assert proc.returncode == 2 and "--input must be a JSON object, not list" in error_line(proc)
    # The second refusal: the same command in this process.
    rc, _, err = heddle_inproc(capsys, "run", flow, "-t", tools, "--input", "{nope")
    assert rc == 2 and "--input is not valid JSON" in err.splitlines()[-1], err


def test_missing_flow_input_is_named(tmp_path: Path) -> None:
    flow, tools = chain(tmp_path)
    code, line = refusal(flow, tools, {"a": 1})
    assert code == 2 and "the flow needs input 'b'" in line


def test_tool_declared_inputs_filter_and_defaults_fill(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "show.py", "out = {'seen': sorted(args.items())}")
    f = FlowDoc()
    s = f.start(["a", "noise"])
    t = f.tool_node("show", server_tool("show", ["a", {"title": "unit", "type": "string", "default": "cm"}]))
    e = f.end(["seen"])
    f.control(s, t)
    f.control(t, e)
    state = run_doc(f.write(tmp_path / "f.json"), tools, {"a": "1", "noise": "x"})
    assert state["seen"] == [["a", "1"], ["unit", "cm"]]


def test_tool_without_declared_inputs_gets_the_whole_node_input(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "keys.py", "out = {'keys': sorted(args)}")
    f = FlowDoc()
    s = f.start(["a", "b"])
    t = f.tool_node("k", server_tool("keys"))
    e = f.end(["keys"])
    f.control(s, t)
    f.control(t, e)
    state = run_doc(f.write(tmp_path / "f.json"), tools, {"a": 1, "b": 2})
    assert state["keys"] == ["a", "b"]


def test_branching_routes_by_its_declared_input(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "mark.py", "out = {'route': 'marked:' + args['label']}")
    f = FlowDoc()
    s = f.start(["kind"])
    router = f.branching("router", {"fruit": "sweet", "DEFAULT_BRANCH": "other"}, input_title="kind")
    sweet = f.tool_node("sweet", server_tool("mark", ["label"]))
    e1 = f.end(["route"], name="end_sweet")
    e2 = f.end(["kind"], name="end_other")
    f.control(s, router)
    f.control(router, sweet, "sweet")
    f.control(router, e2, "other")
    f.control(sweet, e1)
    f.data(s, "kind", sweet, "label")
    path = f.write(tmp_path / "f.json")
    assert run_doc(path, tools, {"kind": "fruit"})["route"] == "marked:fruit"
    assert "route" not in run_doc(path, tools, {"kind": "rock"})


def test_a_loop_that_ends_through_a_branching_node(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "inc.py", "n = args['n'] + 1\nout = {'n': n, 'done': 'yes' if n >= 3 else 'no'}")
    f = FlowDoc("loop")
    s = f.start([{"title": "n", "type": "integer"}])
    inc = f.tool_node("inc", server_tool("inc", [{"title": "n", "type": "integer"}]))
    check = f.branching("check", {"yes": "stop", "no": "again"}, input_title="done")
    e = f.end(["n"])
    f.control(s, inc)
    f.control(inc, check)
    f.control(check, inc, "again")
    f.control(check, e, "stop")
    f.control(check, e, "default")
    path = f.write(tmp_path / "f.json")
    assert run_doc(path, tools, {"n": 0})["n"] == 3
    code, line = refusal(path, tools, {"n": -100}, settings=RunSettings(max_iterations=10))
    assert code == 1 and "--max-iterations 10" in line


def test_flow_node_runs_a_subflow(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "shout.py", "out = {'loud': args['text'].upper()}")
    sub = FlowDoc("sub", use_refs=False)
    ss = sub.start(["text"])
    st = sub.tool_node("shout", server_tool("shout", ["text"]))
    se = sub.end(["loud"])
    sub.control(ss, st)
    sub.control(st, se)
    f = FlowDoc("outer")
    s = f.start(["words"])
    fn = f.flow_node("inner", sub.document(), inputs=["text"], outputs=["loud"])
    e = f.end(["loud"])
    f.control(s, fn)
    f.control(fn, e)
    f.data(s, "words", fn, "text")
    state = run_doc(f.write(tmp_path / "f.json"), tools, {"words": "ça va"})
    assert state["loud"] == "ÇA VA" and state["words"] == "ça va"


def test_five_mebibytes_through_a_tool_both_ways(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "big.py", "out = {'back': args['blob'] + 'é', 'size': len(args['blob'])}")
    f = FlowDoc()
    s = f.start(["blob"])
    t = f.tool_node("big", server_tool("big", ["blob"]))
    e = f.end(["size", "back"])
    f.control(s, t)
    f.control(t, e)
    blob = "x" * (5 * 2**20)
    # The tool's pipes are the engine's: in-process, the tool still a real subprocess.
    state = run_doc(f.write(tmp_path / "f.json"), tools, {"blob": blob})
    assert state["size"] == len(blob) and state["back"] == blob + "é"


def failing_flow(tmp_path: Path, body: str, *, script: str | None = None) -> tuple[Path, Path]:
    tools = tmp_path / "tools"
    if script is not None:
        write_script(tools, "step.sh", script)
    else:
        write_tool(tools, "step.py", body)
    f = FlowDoc()
    s = f.start(["x"])
    t = f.tool_node("step", server_tool("step"))
    e = f.end(["x"])
    f.control(s, t)
    f.control(t, e)
    return f.write(tmp_path / "f.json"), tools


def test_tool_failures_fail_the_run_with_a_clear_message(tmp_path: Path) -> None:
    flow, tools = failing_flow(tmp_path, "sys.stderr.write('disk on fire\\n'); sys.exit(3)")
    assert refusal(flow, tools, {"x": 1}) == (1, "error: tool 'step': exited with status 3: disk on fire")
    flow, tools = failing_flow(tmp_path / "b", "", script="#!/bin/sh\necho 'not json'\n")
    code, line = refusal(flow, tools, {"x": 1})
    assert code == 1 and "printed invalid JSON on stdout" in line
    flow, tools = failing_flow(tmp_path / "c", "", script="#!/bin/sh\necho '[1, 2]'\n")
    assert "printed JSON list, not an object" in refusal(flow, tools, {"x": 1})[1]


def test_a_tool_that_hangs_is_killed_with_its_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    script = f"#!/bin/sh\nsleep 60 &\necho $! > {pidfile}\nwait\n"
    flow, tools = failing_flow(tmp_path, "", script=script)
    started = time.monotonic()
    code, line = refusal(flow, tools, {"x": 1}, settings=RunSettings(tool_timeout=0.5))
    assert time.monotonic() - started < 10
    assert code == 1 and "timed out after 0.5 s" in line
    child = int(pidfile.read_text())
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the tool's child outlived the call")


def test_the_run_timeout_stops_everything(tmp_path: Path) -> None:
    flow, tools = failing_flow(tmp_path, "", script="#!/bin/sh\nsleep 30\n")
    code, line = refusal(flow, tools, {"x": 1}, settings=RunSettings(timeout=0.5))
    assert code == 1 and "exceeded --timeout 0.5 s" in line


def test_protocol_heddle_prints_events_as_json_lines(tmp_path: Path) -> None:
    flow, tools = chain(tmp_path)
    proc = heddle("run", flow, "-t", tools, "--input", "-", "--protocol", "heddle", input='{"a": 1, "b": 2}')
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    types = [e["type"] for e in events]
    assert types[0] == "flow_start" and types[-1] == "flow_complete"
    assert types.count("tool_call") == 2 and types.count("tool_result") == 2
    assert events[-1]["state"]["doubled"] == 6
    assert all(e["duration_ms"] >= 0 for e in events if e["type"] == "tool_result")


def test_verbose_shows_nodes_and_tools_on_stderr_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The command in this process: its streams as a process has them are the runs above and below.
    flow, tools = chain(tmp_path)
    (tmp_path / "in.json").write_text('{"a": 1, "b": 1}')
    proc = heddle_here(capsys, "run", flow, "-t", tools, "--input", f"@{tmp_path / 'in.json'}", "--verbose")
    assert state_of(proc) == {"a": 1, "b": 1, "sum": 2, "doubled": 4}
    assert "> ToolNode adder" in proc.stderr and "tool add ok" in proc.stderr


def agent_flow(tmp_path: Path, url: str, *, tools: Sequence[dict[str, Any]] = (), config: dict[str, Any] | None = None,
               system_prompt: str = "You help with {{query}}.") -> Path:
    f = FlowDoc("agentic")
    s = f.start(["query"])
    a = f.agent("agent", config or llm_config(url), tools=tools, system_prompt=system_prompt)
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    f.data(s, "query", a, "query")
    f.data(a, "result", e, "result")
    return f.write(tmp_path / "agent.json")


def test_agent_loop_recovers_from_every_model_mistake(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "add.py", "out = {'sum': args['a'] + args['b'], 'unit': args['unit']}")
    write_tool(tools, "boom.py", "sys.stderr.write('kaput'); sys.exit(1)")
    add = server_tool("add", [{"title": "a", "type": "integer"}, {"title": "b", "type": "integer"},
                              {"title": "unit", "type": "string", "default": "apples"}], description="Adds")
    boom = server_tool("boom")
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "nope", "arguments": {}}]},
        {"tool_calls": [{"name": "add", "arguments": {"a": "two", "b": 3}}]},
        {"tool_calls": [{"name": "boom", "arguments": {}}, {"name": "add", "arguments": {"a": 2, "b": 3}}]},
        {"content": "{\"answer\": 5, \"note\": \"naïve\"}"},
    ]
    with served_model(script) as model:
        flow = agent_flow(tmp_path, model.url, tools=[add, boom])
        state = run_doc(flow, tools, {"query": "add 2 and 3"}, transport=model.transport)
        reqs = model.requests()
    assert state["answer"] == 5 and state["note"] == "naïve" and state["query"] == "add 2 and 3"
    assert json.loads(state["result"]) == {"answer": 5, "note": "naïve"}
    first = reqs[0]["body"]
    assert first["messages"][0] == {"role": "system", "content": "You help with add 2 and 3."}
    assert json.loads(first["messages"][1]["content"]) == {"query": "add 2 and 3"}
    fn = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert fn["add"]["parameters"]["required"] == ["a", "b"] and fn["add"]["description"] == "Adds"
    tool_msgs = [m for m in reqs[3]["body"]["messages"] if m["role"] == "tool"]
    assert "there is no tool named 'nope'" in tool_msgs[0]["content"]
    assert "do not match its input schema" in tool_msgs[1]["content"]
    assert "kaput" in tool_msgs[2]["content"] and "Error" in tool_msgs[2]["content"]
    assert json.loads(tool_msgs[3]["content"]) == {"sum": 5, "unit": "apples"}


def test_max_tool_rounds_and_unlimited(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools"
    write_script(tools, "echo.sh", "#!/bin/sh\ncat\n")  # 22 calls: a shell starts faster than python
    echo = server_tool("echo", ["m"])
    calls = [{"tool_calls": [{"name": "echo", "arguments": {"m": str(i)}}]} for i in range(12)]
    with served_model([*calls, {"content": "done"}]) as model:
        flow = agent_flow(tmp_path, model.url, tools=[echo])
        code, line = refusal(flow, tools, {"query": "q"}, transport=model.transport)
        assert code == 1 and "exceeded --max-tool-rounds 10" in line
        assert len(model.requests()) == 10
    with served_model([*calls, {"content": "done"}]) as model:
        flow = agent_flow(tmp_path, model.url, tools=[echo])
        unlimited = RunSettings(max_tool_rounds=None)
        assert run_doc(flow, tools, {"query": "q"}, settings=unlimited, transport=model.transport)["result"] == "done"
    # The command's refusal of a setting, in this process (a refusal from a process: the first tests).
    proc = heddle_here(capsys, "run", flow, "-t", tools, "--max-tool-rounds", "0")
    assert proc.returncode == 2 and "--max-tool-rounds 0: must be at least 1" in error_line(proc)


def test_llm_node_and_a_shared_llm_config_by_reference(tmp_path: Path) -> None:
    with served_model([{"content": "Bonjour"}, {"content": "Hallo"}]) as model:
        f = FlowDoc("two-llms")
        cfg = llm_config(model.url, default_generation_parameters={"temperature": 0.2, "max_tokens": 50})
        f.extra_refs["shared-llm"] = cfg
        s = f.start(["text"])
        fr = f.llm("french", {"$component_ref": "shared-llm"}, "Translate to French: {{text}}", ["text"], ["fr"])
        de = f.llm("german", {"$component_ref": "shared-llm"}, "Translate to German: {{ text }}", ["text"])
        e = f.end(["fr", "generated_text"])
        f.control(s, fr)
        f.control(fr, de)
        f.control(de, e)
        state = run_doc(f.write(tmp_path / "f.json"), None, {"text": "hello"}, transport=model.transport)
        reqs = model.requests()
    assert state["fr"] == "Bonjour" and state["generated_text"] == "Hallo"
    assert reqs[0]["body"]["messages"] == [{"role": "user", "content": "Translate to French: hello"}]
    assert reqs[1]["body"]["messages"][0]["content"] == "Translate to German: hello"
    assert reqs[0]["body"]["temperature"] == 0.2 and reqs[1]["body"]["max_tokens"] == 50
    assert reqs[0]["body"]["model"] == "scripted"


def test_non_ascii_end_to_end(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "rev.py", "out = {'reversed': args['text'][::-1]}")
    rev = server_tool("rev", ["text"])
    text = "日本語 ✓ naïve — ünïcödé"
    script: list[dict[str, Any]] = [{"tool_calls": [{"name": "rev", "arguments": {"text": text}}]},
                                    {"content": f"Réponse: {text}"}]
    with threaded_model(script) as model:
        flow = agent_flow(tmp_path, model.url, tools=[rev])
        state = state_of(heddle("run", flow, "-t", tools, "--input", json.dumps({"query": text})))
        reqs = model.requests()
    assert state["result"] == f"Réponse: {text}" and state["query"] == text
    assert text[::-1] in json.dumps(reqs[1]["body"], ensure_ascii=False)


def test_api_key_from_environment_and_openai_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MY_KEY", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with served_model([{"content": "a"}, {"content": "b"}]) as model:
        flow = agent_flow(tmp_path, model.url, config=llm_config(model.url, api_key="$MY_KEY"))
        code, line = refusal(flow, None, {"query": "q"}, transport=model.transport)
        assert code == 2 and "MY_KEY" in line
        assert model.requests() == []
        monkeypatch.setenv("MY_KEY", "k1")
        assert run_doc(flow, None, {"query": "q"}, transport=model.transport)["result"] == "a"
        flow = agent_flow(tmp_path, model.url, config=llm_config(model.url, component_type="OpenAiConfig"))
        monkeypatch.setenv("OPENAI_API_KEY", "k2")
        assert run_doc(flow, None, {"query": "q"}, transport=model.transport)["result"] == "b"
        reqs = model.requests()
    assert reqs[0]["headers"]["authorization"] == "Bearer k1"
    assert reqs[1]["headers"]["authorization"] == "Bearer k2"


def test_no_key_no_authorization_header_and_no_stream(tmp_path: Path) -> None:
    with served_model([{"content": "a"}]) as model:
        flow = agent_flow(tmp_path, model.url)
        no_stream = RunSettings(stream=False)
        assert run_doc(flow, None, {"query": "q"}, settings=no_stream, transport=model.transport)["result"] == "a"
        req = model.requests()[0]
    assert "authorization" not in req["headers"] and not req["body"].get("stream")


def test_model_unreachable_is_a_run_failure(tmp_path: Path) -> None:
    flow = agent_flow(tmp_path, "http://127.0.0.1:9/v1")
    # Retries are tests/model/test_retries.py's; here one refused connection is enough.
    code, line = refusal(flow, None, {"query": "q"}, settings=RunSettings(model_retries=0))
    assert code == 1 and "127.0.0.1:9" in line
