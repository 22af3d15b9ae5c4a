"""Traces: a run exports its spans over OTLP/HTTP to the collector the standard variables name, here a
real receiver the test starts (tests/support/otlp.py), decoded with opentelemetry-proto. Names,
parentage and attributes follow the GenAI semantic conventions; content only when asked for."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.settings import RunSettings
from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_tool
from tests.support.inproc import URL, served_model
from tests.support.otlp import Receiver, otlp_receiver

SECRET_WORD = "plum-tart-7"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    with otlp_receiver() as found:
        for name in list(__import__("os").environ):
            if name.startswith("OTEL_"):
                monkeypatch.delenv(name)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", found.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "heddle-test")
        yield found


@pytest.fixture
def echo_api() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """An HTTP API that records each request's headers and answers {"ok": "yes"}."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            seen.append({k.lower(): v for k, v in self.headers.items()})
            body = b'{"ok": "yes"}'
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def _flow(tmp_path: Path, api: str) -> tuple[Path, Path]:
    """An agent calling `add` (fine) and `boom` (exits 3), then a program tool printing its TRACEPARENT,
    then a RemoteTool."""
    tools = tmp_path / "tools"
    write_tool(tools, "add.py", "out = {'sum': args['a'] + args['b']}")
    write_tool(tools, "boom.py", "sys.stderr.write('nope'); sys.exit(3)")
    write_tool(tools, "whereami.py", "out = {'parent': os.environ.get('TRACEPARENT', '')}")
    add = server_tool("add", [prop("a", "integer"), prop("b", "integer")], [prop("sum", "integer")])
    boom = server_tool("boom", [prop("why")], [prop("never")])
    f = FlowDoc("traced")
    s = f.start([prop("query")])
    agent = f.agent("helper", llm_config(URL), tools=[add, boom])
    where = f.tool_node("where", server_tool("whereami", [], [prop("parent")]))
    remote = f.tool_node("remote", {"component_type": "RemoteTool", "id": "remote-api", "name": "api",
                                    "description": "the API", "url": api + "/thing", "http_method": "GET",
                                    "inputs": [], "outputs": [prop("ok")]})
    e = f.end([prop("result"), prop("parent"), prop("ok")])
    for a, b in ((s, agent), (agent, where), (where, remote), (remote, e)):
        f.control(a, b)
    return f.write(tmp_path / "flow.json"), tools


SCRIPT = [{"tool_calls": [{"name": "add", "arguments": {"a": 2, "b": 3}},
                          {"name": "boom", "arguments": {"why": SECRET_WORD}}]},
          {"content": "five"}]


def _run(flow: Path, tools: Path, settings: RunSettings, transport: Any) -> dict[str, Any]:
    from heddle.runs import execute, from_document

    loaded = from_document(flow, settings, tools_dir=tools, inputs={"query": SECRET_WORD})
    events: list[ev.Event] = []
    outcome = asyncio.run(execute(loaded, on_event=events.append, transport=transport))
    return outcome.state


def test_a_run_exports_genai_spans(tmp_path: Path, receiver: Receiver, echo_api: Any) -> None:
    api, seen = echo_api
    flow, tools = _flow(tmp_path, api)
    with served_model(SCRIPT) as model:
        # Unstreamed: the answer reports its token usage (a stream reports it only when its server adds it).
        state = _run(flow, tools, RunSettings(stream=False), model.transport)
    assert state["result"] == "five" and json.loads(state["ok"]) == {"ok": "yes"}
    spans = receiver.wait_for("invoke_agent traced", "invoke_agent helper-agent", "chat scripted",
                              "execute_tool add", "execute_tool boom", "execute_tool whereami", "execute_tool api")
    by_id = {s["span_id"]: s for s in spans}
    root = receiver.named("invoke_agent traced")[0]
    agent = receiver.named("invoke_agent helper-agent")[0]
    # One trace, the flow's span its root; the agent's model calls and tool calls inside the agent's span.
    assert {s["trace_id"] for s in spans if s["name"] != "heddle.bundle.verify"} == {root["trace_id"]}
    assert root["parent_span_id"] is None and agent["parent_span_id"] == root["span_id"]
    assert root["resource"]["service.name"] == "heddle-test"
    assert root["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert root["attributes"]["gen_ai.agent.name"] == "traced"
    chats = receiver.named("chat scripted")
    assert len(chats) == 2 and all(c["parent_span_id"] == agent["span_id"] for c in chats)
    chat = chats[0]
    assert chat["kind"] == "client"
    assert chat["attributes"]["gen_ai.operation.name"] == "chat"
    assert chat["attributes"]["gen_ai.request.model"] == "scripted"
    assert (chat["attributes"]["server.address"], chat["attributes"]["server.port"]) == ("scripted.test", 80)
    assert chat["attributes"]["gen_ai.usage.input_tokens"] == 1
    assert chat["attributes"]["gen_ai.usage.output_tokens"] == 1
    assert chat["attributes"]["gen_ai.response.finish_reasons"] == ["tool_calls"]
    add = receiver.named("execute_tool add")[0]
    assert add["parent_span_id"] == agent["span_id"] and add["status"]["code"] == "unset"
    assert add["attributes"]["gen_ai.tool.name"] == "add"
    assert add["attributes"]["gen_ai.operation.name"] == "execute_tool"
    assert add["attributes"]["heddle.tool.kind"] == "program" and add["attributes"]["heddle.tool.outcome"] == "ok"
    assert add["attributes"]["gen_ai.tool.call.id"].startswith("call_")
    # The failing tool: its span failed, with the error's type and no message (it may quote content).
    boom = receiver.named("execute_tool boom")[0]
    assert boom["status"] == {"code": "error", "message": ""}
    assert boom["attributes"]["error.type"] == "ToolError" and boom["attributes"]["heddle.tool.outcome"] == "error"
    # Without --safe no sandbox runs, and there is no span of one: the program is handed its tool call's.
    where = receiver.named("execute_tool whereami")[0]
    assert where["parent_span_id"] == root["span_id"]
    assert state["parent"].startswith(f"00-{root['trace_id']}-{where['span_id']}-")
    assert not receiver.named("heddle.sandbox") and by_id[where["span_id"]] is where
    # The RemoteTool's request carried the traceparent of its tool span.
    remote = receiver.named("execute_tool api")[0]
    assert remote["attributes"]["heddle.tool.kind"] == "remote"
    assert remote["attributes"]["gen_ai.tool.type"] == "extension"
    assert seen[-1]["traceparent"].startswith(f"00-{root['trace_id']}-{remote['span_id']}-")
    # Without content capture, no prompt, argument or output appears anywhere.
    assert SECRET_WORD not in json.dumps(spans) and "five" not in json.dumps(spans)


def test_a_sandboxed_program_runs_inside_its_sandbox_span(tmp_path: Path, receiver: Receiver) -> None:
    from tests.workspace.tooling import PYTHON_READ

    tools = tmp_path / "tools"
    write_tool(tools, "whereami.py", "out = {'parent': os.environ.get('TRACEPARENT', '')}")
    f = FlowDoc("boxed")
    s = f.start([])
    where = f.tool_node("where", server_tool("whereami", [], [prop("parent")]))
    e = f.end([prop("parent")])
    f.control(s, where)
    f.control(where, e)
    from heddle.runs import execute, from_document

    loaded = from_document(f.write(tmp_path / "flow.json"), RunSettings(safe=True, allow_read=PYTHON_READ),
                           tools_dir=tools, inputs={})
    state = asyncio.run(execute(loaded, on_event=lambda event: None)).state
    receiver.wait_for("execute_tool whereami", "heddle.sandbox")
    (tool,), (box,) = receiver.named("execute_tool whereami"), receiver.named("heddle.sandbox")
    assert box["parent_span_id"] == tool["span_id"]
    assert box["attributes"]["heddle.sandbox.safe"] is True
    assert box["attributes"]["heddle.sandbox.backend"] == "bubblewrap"
    assert box["attributes"]["gen_ai.tool.name"] == "whereami"
    assert state["parent"].startswith(f"00-{tool['trace_id']}-{box['span_id']}-")


def test_an_api_node_and_its_request_are_in_the_runs_trace(tmp_path: Path, receiver: Receiver,
                                                            echo_api: Any) -> None:
    api, seen = echo_api
    f = FlowDoc("called")
    s = f.start([])
    a = f._node("ApiNode", "call", [], [prop("ok")], url=api + "/thing", http_method="GET")
    e = f.end([prop("ok")])
    f.control(s, a)
    f.control(a, e)
    state = _run_inputs(f.write(tmp_path / "flow.json"), {})
    assert state["ok"] == "yes"
    (root,) = receiver.wait_for("invoke_agent called")
    assert seen[-1]["traceparent"].startswith(f"00-{root['trace_id']}-")


def test_a_run_started_with_a_traceparent_is_a_child_of_that_span(tmp_path: Path, receiver: Receiver,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    monkeypatch.setenv("TRACEPARENT", f"00-{trace_id}-{span_id}-01")
    f = FlowDoc("child")
    s = f.start([prop("x")])
    e = f.end([prop("x")])
    f.control(s, e)
    f.data(s, "x", e, "x")
    assert _run_inputs(f.write(tmp_path / "flow.json"), {"x": "y"})["x"] == "y"
    (root,) = receiver.wait_for("invoke_agent child")
    assert (root["trace_id"], root["parent_span_id"]) == (trace_id, span_id)


def _run_inputs(flow: Path, inputs: dict[str, Any]) -> dict[str, Any]:
    from heddle.runs import execute, from_document

    loaded = from_document(flow, RunSettings(), inputs=inputs)
    outcome = asyncio.run(execute(loaded, on_event=lambda event: None))
    return outcome.state


def test_content_is_captured_only_when_asked(tmp_path: Path, receiver: Receiver, echo_api: Any) -> None:
    api, _ = echo_api
    flow, tools = _flow(tmp_path, api)
    with served_model(SCRIPT) as model:
        _run(flow, tools, RunSettings(otel_capture_content=True), model.transport)
    receiver.wait_for("invoke_agent traced", "execute_tool boom", "chat scripted")
    chat = receiver.named("chat scripted")[0]
    assert SECRET_WORD in chat["attributes"]["gen_ai.input.messages"]
    boom = receiver.named("execute_tool boom")[0]
    assert json.loads(boom["attributes"]["gen_ai.tool.call.arguments"]) == {"why": SECRET_WORD}
    assert "exited with" in boom["status"]["message"] or "nope" in boom["status"]["message"]
    final = [c for c in receiver.named("chat scripted") if "five" in c["attributes"].get("gen_ai.output.messages", "")]
    assert final


def test_without_a_collector_nothing_is_traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.engine import tracing

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    assert tracing.endpoint() is None and tracing.Tracing.configured() is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    assert tracing.endpoint() == "http://127.0.0.1:9"
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert tracing.endpoint() is None


def _bundle(tmp_path: Path) -> Path:
    import heddle
    from tests.server.flows import ECHO, tool_chain, write_tools

    tools = write_tools(tmp_path / "tools", {"fetch": ECHO})
    flow = tool_chain("doctored", ["fetch"]).write(tmp_path / "flow.json")
    return heddle.seal(flow, tools_dir=tools, input={"x": "a"}, output=tmp_path / "app.heddle").path


def _cli(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    from heddle.cli import app
    from heddle.cli.errors import run_app

    capsys.readouterr()
    rc = run_app(app, [str(a) for a in args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_doctor_says_whether_runs_are_traced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from heddle.engine import tracing

    bundle = _bundle(tmp_path)
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    rc, out, _ = _cli(capsys, "doctor", bundle)
    assert rc == 0 and "ok      otel tracing: off (OTEL_EXPORTER_OTLP_ENDPOINT is not set)" in out
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:s3cret-word@127.0.0.1:4318")
    rc, out, _ = _cli(capsys, "doctor", bundle, "--json")
    assert rc == 0 and json.loads(out)["tracing"] == {
        "ok": True, "detail": "spans sent to http://127.0.0.1:4318 over OTLP/HTTP"}
    # Asked for without the SDK: what a run would refuse, doctor reports missing (exit 9).
    from heddle.bundle import machine

    monkeypatch.setattr(tracing, "installed", lambda: False)
    monkeypatch.setattr(machine, "installed", lambda: False)  # doctor's own name for it
    rc, out, err = _cli(capsys, "doctor", bundle)
    assert rc == 9 and "MISSING otel tracing: spans for http://127.0.0.1:4318 need the OpenTelemetry SDK" in out
    assert "s3cret-word" not in out + err
    rc, _, err = _cli(capsys, "run", bundle, "--allow-unsigned")
    assert rc == 2 and "pip install 'heddle[otel]'" in err


def test_run_writes_its_stderr_as_json_lines_from_the_level_given(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools"
    write_tool(tools, "boom.py", "sys.exit(3)")
    f = FlowDoc("failing")
    s, t, e = f.start([prop("x")]), f.tool_node("boom", server_tool("boom", [prop("x")], [prop("y")])), f.end([])
    f.control(s, t)
    f.control(t, e)
    flow = f.write(tmp_path / "flow.json")
    rc, _, err = _cli(capsys, "run", flow, "-t", tools, "--input", '{"x": "a"}', "--log-format", "json")
    lines = [json.loads(line) for line in err.splitlines()]
    assert rc == 1 and lines[-1]["level"] == "error" and lines[-1]["message"].startswith("error: tool 'boom'")
    rc, _, err = _cli(capsys, "run", flow, "-t", tools, "--input", '{"x": "a"}', "--log-level", "loud")
    assert rc == 2 and err.strip() == "error: --log-level 'loud': use debug or info or warning or error"
