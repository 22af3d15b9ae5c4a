"""Every message heddle reads from an MCP server is bounded: over stdio a line (one message) past
`--max-response-bytes` fails the call, or the run, with one line naming the server and the cap,
and the memory of the `heddle` reading it stays where it was; over SSE the cap is per event, an
event ending at a blank line whichever line endings the stream uses."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from heddle.settings import RunSettings
from tests.support.cli import BIN, env_with
from tests.support.flows import FlowDoc, llm_config, prop
from tests.support.inproc import URL, refusal, run_doc, served_model

pytestmark = pytest.mark.timeout(90)

# A standard-library MCP server: a valid handshake, then, as its first argument says, a tool answer
# (`small`), or a line that never ends as the answer to tools/call (`call`) or tools/list (`list`).
SERVER = r'''
import json, sys
mode = sys.argv[1]

def send(ident, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": ident, "result": result}) + "\n")
    sys.stdout.flush()

def endless(ident, head):
    sys.stdout.write('{"jsonrpc": "2.0", "id": %d, "result": %s' % (ident, head))
    chunk = "x" * 65536
    while True:
        sys.stdout.write(chunk)

for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    if method == "initialize":
        send(msg["id"], {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
                         "serverInfo": {"name": "flood", "version": "1"}})
    elif method == "tools/list":
        if mode == "list":
            endless(msg["id"], '{"tools": [{"name": "')
        send(msg["id"], {"tools": [{"name": "flood", "description": "Answers.",
                                    "inputSchema": {"type": "object", "properties": {}}}]})
    elif method == "tools/call":
        if mode != "small":
            endless(msg["id"], '{"content": [{"type": "text", "text": "')
        send(msg["id"], {"content": [{"type": "text", "text": "fine"}]})
    else:
        send(msg["id"], {})
'''


def _transport(script: Path, mode: str) -> dict[str, Any]:
    return {"component_type": "StdioTransport", "id": "t-flood", "name": "flooder", "command": sys.executable,
            "args": [str(script), mode]}


def _tool(script: Path, mode: str) -> dict[str, Any]:
    return {"component_type": "MCPTool", "id": "mcp-flood", "name": "flood",
            "client_transport": _transport(script, mode), "inputs": [], "outputs": [prop("text")]}


def _tool_node_flow(tmp_path: Path, mode: str) -> Path:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    f = FlowDoc(f"flood-{mode}")
    start = f.start([])
    node = f.tool_node("call", _tool(script, mode), inputs=[])
    end = f.end([prop("text")])
    f.control(start, node)
    f.control(node, end)
    return f.write(tmp_path / f"{mode}.json")


def _run(tmp_path: Path, flow: Path) -> tuple[int, str, str, int]:
    """`heddle run FLOW`: its exit code, stdout, stderr and peak RSS in KiB."""
    out, err = tmp_path / f"run-{time.monotonic_ns()}.out", tmp_path / f"run-{time.monotonic_ns()}.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen([str(BIN / "heddle"), "run", str(flow), "--tool-timeout", "20s"],
                                stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env_with())
    _, status, usage = os.wait4(proc.pid, 0)
    return (os.waitstatus_to_exitcode(status), out.read_text(errors="replace"), err.read_text(errors="replace"),
            usage.ru_maxrss)


def test_an_endless_line_fails_the_run_in_one_line_and_costs_no_memory(tmp_path: Path) -> None:
    code, out, err, baseline = _run(tmp_path, _tool_node_flow(tmp_path, "small"))
    assert code == 0 and '"fine"' in out, err
    code, out, err, peak = _run(tmp_path, _tool_node_flow(tmp_path, "call"))
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("error: tool 'flood': MCP server 'flooder' (StdioTransport "), err
    assert lines[0].endswith(": a message on its stdout is over 16 MiB (raise --max-response-bytes if it needs "
                             "more); the server was stopped"), err
    assert peak - baseline < 50 * 1024, (baseline, peak)


def test_an_endless_line_is_an_error_result_for_an_agent(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    f = FlowDoc("flood-agent")
    start = f.start([])
    agent = f.agent("helper", llm_config(URL), inputs=[], outputs=["result"])
    f.components[agent]["agent"]["tools"] = [_tool(script, "call")]
    end = f.end([prop("result")])
    f.control(start, agent)
    f.control(agent, end)
    answers: list[dict[str, Any]] = [{"tool_calls": [{"name": "flood", "arguments": {}}]},
                                     {"content": "the tool failed"}]
    with served_model(answers) as m:
        state = run_doc(f.write(tmp_path / "flow.json"), None, {}, transport=m.transport,
                        settings=RunSettings(max_response_bytes=1 << 20))
        second = m.requests()[1]["body"]
    assert dict(getattr(state, "state", state))["result"] == "the tool failed"
    reply = next(msg["content"] for msg in second["messages"] if msg["role"] == "tool")
    assert "MCP server 'flooder'" in reply and "a message on its stdout is over 1 MiB" in reply, reply


def test_an_endless_listing_fails_the_run_naming_the_server(tmp_path: Path) -> None:
    code, error = refusal(_tool_node_flow(tmp_path, "list"), None, {},
                          settings=RunSettings(max_response_bytes=1 << 20))
    assert code == 1 and "\n" not in error, error
    assert error.startswith("error: MCP server 'flooder' (StdioTransport ") and "over 1 MiB" in error, error


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r", "mixed"])
def test_an_event_stream_is_capped_per_event(ending: str) -> None:
    import httpx2

    from heddle.tools.mcp import _capped_transport

    endings = ["\n", "\r\n", "\r"] if ending == "mixed" else [ending]
    events = []
    for i in range(64):
        eol = endings[i % len(endings)]
        blank = endings[(i + 1) % len(endings)]
        events.append(f"event: message{eol}data: {'x' * 900}{eol}{blank}")
    body = "".join(events).encode()
    big = f"data: {'y' * 3000}\n\n".encode()

    class Inner(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            return httpx2.Response(200, headers={"Content-Type": "text/event-stream"},
                                   content=big if request.url.path == "/big" else body)

    async def read(path: str) -> bytes:
        overruns: list[str] = []
        async with httpx2.AsyncClient(transport=_capped_transport(Inner(), 2048, "MCP server 'e'", overruns)) as client:
            response = await client.get(f"http://mcp.example{path}")
            return await response.aread()

    # 64 events of about 1 KiB each: 60 KiB in all, within a 2 KiB cap each.
    assert asyncio.run(read("/")) == body
    with pytest.raises(httpx2.ReadError, match="one event of its stream is over 2 KiB"):
        asyncio.run(read("/big"))
