"""What heddle reads as JSON from outside holds JSON's values only, and a run's inputs are checked
as heddle-server checks a request's.

`heddle run --input` with a value of the wrong type is refused before anything runs, naming the
input, with the server's words; `NaN`, `Infinity`, `-Infinity` and a literal past the largest
float are refused wherever heddle reads JSON it did not write (`--input`, a request body, a
tool's output, a plugin's message, a model's tool-call arguments); a lone surrogate in `--input`
is one line, not a traceback.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import error_line, heddle
from tests.support.cli_inproc import heddle_inproc
from tests.support.flows import FlowDoc, llm_config, server_tool, write_tool

NOT_FINITE = ("NaN", "Infinity", "-Infinity", "1e999", "-1e999")


def echo_flow(tmp_path: Path) -> tuple[Path, Path]:
    """A flow whose one tool leaves a mark when it runs; (flow, tools folder)."""
    mark = tmp_path / "ran"
    tools = tmp_path / "tools"
    write_tool(tools, "echo.py", f"open({str(mark)!r}, 'a').write('x')\nout = {{'text': str(args['text'])}}")
    f = FlowDoc("echoes")
    start = f.start(["text"])
    node = f.tool_node("echo", server_tool("echo", ["text"], ["text"]))
    end = f.end(["text"])
    f.control(start, node)
    f.control(node, end)
    return f.write(tmp_path / "flow.json"), tools


def test_run_checks_its_inputs_as_the_server_does(tmp_path: Path, capsys: Any) -> None:
    from heddle.server.errors import ApiError
    from heddle.server.service import check_run
    from heddle.agentspec import load_flow

    flow, tools = echo_flow(tmp_path)
    rc, out, err = heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", '{"text": 5}')
    assert rc == 2 and out == "" and not (tmp_path / "ran").exists()
    with pytest.raises(ApiError) as served:
        check_run(load_flow(flow), {"text": 5}, None, source="flow")
    said = served.value.message.removeprefix("inputs: ").split(" (as the flow")[0]
    assert said.startswith("text: ") and said in err and len(err.strip().splitlines()) == 1
    assert heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", '{"text": "5"}')[0] == 0


@pytest.mark.parametrize("literal", NOT_FINITE)
def test_non_finite_numbers_are_refused_in_input(tmp_path: Path, capsys: Any, literal: str) -> None:
    flow, tools = echo_flow(tmp_path)
    rc, _, err = heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", f'{{"text": {literal}}}')
    assert rc == 2 and err.startswith("error: --input is not valid JSON (") and literal in err
    assert not (tmp_path / "ran").exists()


def test_a_lone_surrogate_in_input_is_one_line(tmp_path: Path, capsys: Any) -> None:
    flow, tools = echo_flow(tmp_path)
    for given in ('{"text": "\\ud800"}', '{"text": "a\\udc00b"}', '{"text": "\\ud83d"}'):
        rc, _, err = heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", given)
        assert rc == 2 and "lone surrogate" in err and len(err.strip().splitlines()) == 1, err
    # A pair is one character, and runs.
    rc, out, _ = heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", '{"text": "\\ud83d\\ude00"}')
    assert rc == 0 and json.loads(out)["text"] == "\U0001f600"


def test_the_real_command_refuses_them_in_one_line(tmp_path: Path) -> None:
    flow, tools = echo_flow(tmp_path)
    for given, said in (('{"text": 5}', "inputs: text: 5 is not of type 'string'"),
                        ('{"text": NaN}', "--input is not valid JSON"),
                        ('{"text": "\\ud800"}', "lone surrogate (\\ud800)")):
        proc = heddle("run", flow, "--tools-dir", tools, "--input", given)
        assert proc.returncode == 2 and said in error_line(proc), proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "ran").exists()


def test_a_tools_non_finite_output_fails_its_call(tmp_path: Path, capsys: Any) -> None:
    flow, tools = echo_flow(tmp_path)
    write_tool(tools, "echo.py", "out = {'text': float('nan')}")
    rc, out, err = heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", '{"text": "x"}')
    assert rc == 1 and out == "" and "tool 'echo'" in err and "NaN is not a JSON number" in err
    # Half a surrogate pair, which no file or terminal could take, is refused there too.
    write_tool(tools, "echo.py", "sys.stdout.write('{\"text\": \"\\\\ud800\"}')\nsys.exit(0)")
    rc, out, err = heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", '{"text": "x"}')
    assert rc == 1 and out == "" and "tool 'echo'" in err and "lone surrogate (\\ud800)" in err, err


PLUGIN_CODE = """
@plugin.tool("echo")
def echo(call):
    return {"text": float("nan")}
"""


def test_a_plugins_non_finite_message_is_a_protocol_violation(tmp_path: Path, capsys: Any) -> None:
    from heddle.plugin_host.protocol import ProtocolViolation, decode
    from tests.plugins.support import make_plugin

    for literal in NOT_FINITE:
        with pytest.raises(ProtocolViolation, match="not JSON"):
            decode(f'{{"type": "result", "id": 1, "value": {literal}}}'.encode())
    # A plugin's tool that answers NaN (the SDK writes what Python's json writes) fails its call.
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
    tool = {"name": "echo", "description": "Echo", "inputSchema": schema, "componentType": "Echo"}
    plugin = make_plugin(tmp_path / "p", capabilities=(), code=PLUGIN_CODE, tools=[tool])
    flow, _ = echo_flow(tmp_path)
    rc, out, err = heddle_inproc(capsys, "run", flow, "--plugin", plugin, "--input", '{"text": "x"}')
    assert rc != 0 and out == "" and "not JSON" in err and "NaN" in err, err


@contextmanager
def model_calling(arguments: str) -> Iterator[list[dict[str, Any]]]:
    """A model that asks for `echo` with `arguments` (the text it sends), then answers "done";
    the requests it received, in order."""
    received: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            if len(received) == 1:
                call = {"index": 0, "id": "c1", "type": "function",
                        "function": {"name": "echo", "arguments": arguments}}
                deltas = [{"role": "assistant", "tool_calls": [call]}]
                finish = "tool_calls"
            else:
                deltas, finish = [{"role": "assistant", "content": "done"}], "stop"
            chunks = [{"choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
            body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        received.append({"url": f"http://127.0.0.1:{server.server_address[1]}/v1"})
        yield received
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_models_non_finite_arguments_run_no_tool(tmp_path: Path, capsys: Any) -> None:
    mark = tmp_path / "ran"
    tools = tmp_path / "tools"
    write_tool(tools, "echo.py", f"open({str(mark)!r}, 'a').write('x')\nout = {{'text': str(args['text'])}}")
    with model_calling('{"text": NaN}') as received:
        url = received.pop(0)["url"]
        f = FlowDoc("asks")
        start = f.start(["query"])
        agent = f.agent("agent", llm_config(url), tools=[server_tool("echo", ["text"], ["text"])])
        end = f.end(["result"])
        f.control(start, agent)
        f.control(agent, end)
        flow = f.write(tmp_path / "agent.json")
        rc, out, err = heddle_inproc(capsys, "run", flow, "--tools-dir", tools, "--input", '{"query": "hi"}')
    assert rc == 0, err
    assert json.loads(out)["result"] == "done" and not mark.exists()
    told = [m for m in received[1]["messages"] if m.get("role") == "tool"]
    assert len(told) == 1 and "not valid JSON" in told[0]["content"] and "NaN" in told[0]["content"]
