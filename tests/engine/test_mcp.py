"""MCPTool and MCPToolBox against real MCP servers: one written with the `mcp` package on stdio
(a script run with this Python) and over streamable HTTP and SSE (uvicorn on 127.0.0.1, port 0),
and a standard-library one where start-up time matters (the sandbox, a changed listing)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.settings import RunSettings
from tests.support.flows import FlowDoc, llm_config, prop
from tests.support.inproc import URL, refusal, run_doc, served_model

SERVER = '''
import os, sys
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

with open(sys.argv[1], "a") as log:
    log.write(f"{os.getpid()} {os.getcwd()}\\n")
server = MCPServer("heddle-test")


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Say it back."""
    return "echo: " + text


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ToolError(reason)


@server.tool()
def hidden() -> str:
    """Left out by the toolbox's filter."""
    return "should not be called"


if __name__ == "__main__":
    server.run()
'''

# A standard-library MCP server (JSON-RPC lines on stdio): it starts in milliseconds, and its one
# tool's schema and answer come from its command line.
STUB = '''
import json, os, sys
schema = json.loads(sys.argv[1])
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    if method == "initialize":
        res = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
               "serverInfo": {"name": "stub", "version": "1"}}
    elif method == "tools/list":
        res = {"tools": [{"name": "where", "description": "Where am I?", "inputSchema": schema}]}
    elif method == "tools/call":
        seen = {"cwd": os.getcwd(), "env": sorted(os.environ), "home": os.path.exists(sys.argv[2])}
        res = {"content": [{"type": "text", "text": json.dumps(seen)}], "structuredContent": seen}
    else:
        res = {}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}), flush=True)
'''


def _state(result: Any) -> dict[str, Any]:
    return dict(getattr(result, "state", result))


def _stdio(script: Path, *args: str, name: str = "test server") -> dict[str, Any]:
    return {"component_type": "StdioTransport", "id": f"t-{name}", "name": name, "command": sys.executable,
            "args": [str(script), *args], "session_parameters": {"read_timeout_seconds": 20}}


def _mcp_tool(name: str, transport: dict[str, Any], inputs: list[dict[str, Any]] | None = None,
              outputs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    tool: dict[str, Any] = {"component_type": "MCPTool", "id": f"mcp-{name}", "name": name,
                            "client_transport": transport, "outputs": outputs or []}
    if inputs is not None:
        tool["inputs"] = inputs
    return tool


def _adder_flow(transport: dict[str, Any], tool: str = "add", *, declared: bool = True) -> FlowDoc:
    """start(a, b) -> ToolNode `tool` -> end(total); the tool's inputs declared, or left to the server."""
    f = FlowDoc("mcp-add")
    ab = [prop("a", "integer"), prop("b", "integer")]
    start = f.start(ab)
    node = f.tool_node("sum", _mcp_tool(tool, transport, ab if declared else None, [prop("total", "integer")]),
                       inputs=ab)
    end = f.end([prop("total", "integer")])
    f.control(start, node)
    f.control(node, end)
    return f


def test_stdio_tool_and_toolbox_share_one_server(tmp_path: Path) -> None:
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    starts = tmp_path / "starts.log"
    transport = _stdio(script, str(starts))
    f = _adder_flow(transport)
    toolbox = {"component_type": "MCPToolBox", "id": "box", "name": "box", "client_transport": transport,
               "tool_filter": ["echo", {"component_type": "MCPToolSpec", "name": "fail",
                                        "description": "Fails, as documented here."}]}
    agent = f.agent("helper", llm_config(URL), inputs=[], outputs=["result"])
    f.components[agent]["agent"]["toolboxes"] = [toolbox]
    # The ToolNode's tool again, for the model.
    f.components[agent]["agent"]["tools"] = [f.components[f.order[1]]["tool"]]
    end = f.order[2]
    f.controls.pop()
    f.control(f.order[1], agent)
    f.control(agent, end)
    path = f.write(tmp_path / "flow.json")
    script_answers: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "echo", "arguments": {"text": "hi"}},
                        {"name": "fail", "arguments": {"reason": "no such payslip"}},
                        {"name": "hidden", "arguments": {}},
                        {"name": "add", "arguments": {"a": 1, "b": 2}}]},
        {"content": "done"},
    ]
    events: list[ev.Event] = []
    with served_model(script_answers) as m:
        state = _state(run_doc(path, None, {"a": 2, "b": 3}, transport=m.transport, events=events))
        first, second = m.requests()[0]["body"], m.requests()[1]["body"]

    assert state["total"] == 5
    offered = {t["function"]["name"]: t["function"] for t in first["tools"]}
    assert sorted(offered) == ["add", "echo", "fail"]
    assert offered["add"]["description"] == "Add two numbers."
    assert offered["add"]["parameters"]["required"] == ["a", "b"]
    assert offered["fail"]["description"] == "Fails, as documented here."
    assert offered["echo"]["parameters"]["required"] == ["text"]
    replies = [msg["content"] for msg in second["messages"] if msg["role"] == "tool"]
    assert "echo: hi" in replies[0]
    assert "Error:" in replies[1] and "no such payslip" in replies[1]
    assert "no tool named 'hidden'" in replies[2]
    assert json.loads(replies[3]) == {"total": 3}
    calls = [(e.tool, e.ok) for e in events if isinstance(e, ev.ToolResult)]
    assert calls == [("add", True), ("echo", True), ("fail", False), ("add", True)]
    # One server process for the three uses, started in a workspace of its own.
    lines = starts.read_text().splitlines()
    assert len(lines) == 1
    assert "heddle-mcp-test_server" in lines[0]


@pytest.fixture(scope="module")
def http_server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    with serving_http() as served:
        yield served


@contextmanager
def serving_http() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """The `mcp` package's server on loopback, in a thread (streamable HTTP at /mcp, SSE at
    /sse-app/sse): its base URL and the headers of every request it gets."""
    import uvicorn
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
    from starlette.applications import Starlette
    from starlette.routing import Mount

    server = MCPServer("heddle-http-test")

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @server.tool()
    def fail(a: int, b: int) -> int:
        """Always fails."""
        raise ToolError("the adder is broken")

    @server.tool()
    def flood(a: int, b: int) -> str:
        """Answers far more than a run reads."""
        return "x" * (3 << 20)

    streamable = server.streamable_http_app()
    # The streamable app's lifespan runs its session manager; mounted, it must be run by the outer app.
    app = Starlette(routes=[Mount("/sse-app", app=server.sse_app()), Mount("/", app=streamable)],
                    lifespan=lambda _app: streamable.router.lifespan_context(streamable))  # type: ignore[arg-type]
    headers: list[dict[str, str]] = []

    async def recording(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await app(scope, receive, send)

    config = uvicorn.Config(recording, host="127.0.0.1", port=0, log_level="error")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        threading.Event().wait(0.01)
    port = runner.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", headers
    runner.should_exit = True
    thread.join(10)


@pytest.mark.parametrize(("kind", "path"), [("StreamableHTTPTransport", "/mcp"), ("SSETransport", "/sse-app/sse")])
def test_http_servers(tmp_path: Path, http_server: tuple[str, list[dict[str, str]]], kind: str, path: str,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    base, headers = http_server
    monkeypatch.setenv("MCP_TEST_TOKEN", "s3cret")
    transport = {"component_type": kind, "id": "http", "name": "adder", "url": base + path,
                 "headers": {"X-Team": "heddle"}, "sensitive_headers": {"Authorization": "$MCP_TEST_TOKEN"}}
    headers.clear()
    flow = _adder_flow(transport, declared=False).write(tmp_path / "flow.json")
    state = _state(run_doc(flow, None, {"a": 40, "b": 2}))
    assert state["total"] == 42
    assert headers and all(h.get("x-team") == "heddle" and h.get("authorization") == "s3cret" for h in headers)

    code, error = refusal(_adder_flow(transport, "fail").write(tmp_path / "fail.json"), None, {"a": 1, "b": 1})
    assert code != 0
    assert "tool 'fail'" in error and "the adder is broken" in error


@pytest.mark.parametrize(("kind", "path"), [("StreamableHTTPTransport", "/mcp"), ("SSETransport", "/sse-app/sse")])
def test_an_answer_over_the_cap_fails_the_call(tmp_path: Path, http_server: tuple[str, list[dict[str, str]]],
                                               kind: str, path: str) -> None:
    transport = {"component_type": kind, "id": "http", "name": "adder", "url": http_server[0] + path}
    flow = _adder_flow(transport, "flood", declared=False).write(tmp_path / "flood.json")
    code, error = refusal(flow, None, {"a": 1, "b": 1}, settings=RunSettings(max_response_bytes=1 << 20,
                                                                            tool_timeout=20))
    assert code == 1 and "tool 'flood'" in error and "over 1 MiB once decoded" in error, error
    assert "--max-response-bytes" in error and "\n" not in error


def test_a_listing_unlike_the_declared_inputs_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "stub.py"
    script.write_text(STUB)
    schema = {"type": "object", "properties": {"a": {"type": "string", "title": "A"}}, "required": ["a"]}
    transport = _stdio(script, json.dumps(schema), "/")
    f = FlowDoc("mismatch")
    start = f.start([prop("a", "integer")])
    node = f.tool_node("where", _mcp_tool("where", transport, [prop("a", "integer")], []))
    end = f.end([])
    f.control(start, node)
    f.control(node, end)
    code, error = refusal(f.write(tmp_path / "flow.json"), None, {"a": 1})
    assert code != 0
    assert "MCPTool 'where'" in error and "a: the document says integer, the server string" in error


@pytest.mark.parametrize("safe", [False, True])
def test_stdio_server_runs_like_a_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, safe: bool) -> None:
    import shutil

    if safe and shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    monkeypatch.setenv("HEDDLE_AUTH_TOKEN", "server-secret")
    monkeypatch.setenv("USER", "someone")
    folder = tmp_path / "srv"
    folder.mkdir()
    (folder / "stub.py").write_text(STUB)
    transport = _stdio(folder / "stub.py", json.dumps({"type": "object", "properties": {}}), str(Path.home()))
    # As documents write it: found on PATH, in the sandbox the system's.
    transport.update(command="python3", env={"STUB_MODE": "test"})
    f = FlowDoc("whereami")
    start = f.start([])
    outputs = [prop("cwd"), prop("env", "array"), prop("home", "boolean")]
    node = f.tool_node("where", _mcp_tool("where", transport, outputs=outputs), inputs=[])
    end = f.end([prop("cwd"), prop("env", "array"), prop("home", "boolean")])
    f.control(start, node)
    f.control(node, end)
    settings = RunSettings(safe=True, allow_read=(folder,)) if safe else RunSettings()
    state = _state(run_doc(f.write(tmp_path / "flow.json"), None, {}, settings=settings))
    assert "heddle-mcp-test_server" in state["cwd"]
    assert "HEDDLE_AUTH_TOKEN" not in state["env"] and "STUB_MODE" in state["env"]
    assert "HEDDLE_WORKSPACE" in state["env"]
    if safe:
        assert "USER" not in state["env"]
        assert state["home"] is False  # the sandbox shows the system folders, not the user's
    else:
        assert "USER" in state["env"]


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("cwd", "/etc", "outside the server's workspace"),
    ("sensitive_headers", {"Authorization": "Bearer abc"}, "must be a $VAR reference"),
    ("retry_policy", {"max_attempts": 3}, "retry_policy is not supported"),
])
def test_what_heddle_cannot_run_is_refused_when_the_document_loads(tmp_path: Path, field: str, value: Any,
                                                                  expected: str) -> None:
    from heddle.errors import DocumentError
    from heddle.agentspec import load_flow

    if field in ("cwd",):
        transport: dict[str, Any] = _stdio(tmp_path / "server.py")
    else:
        transport = {"component_type": "StreamableHTTPTransport", "id": "h", "name": "h",
                     "url": "https://mcp.example/mcp"}
    tool = _mcp_tool("add", transport, [prop("a", "integer")])
    transport[field] = value
    f = FlowDoc("refused")
    start = f.start([prop("a", "integer")])
    node = f.tool_node("sum", tool)
    end = f.end([])
    f.control(start, node)
    f.control(node, end)
    with pytest.raises(DocumentError) as caught:
        load_flow(f.write(tmp_path / "flow.json"))
    message = str(caught.value)
    assert expected in message and ".tool" in message and "\n" not in message


def test_requires_confirmation_needs_a_session_on_a_tool_node_and_is_asked_for_on_a_toolbox(tmp_path: Path) -> None:
    from heddle.errors import NeedsSessionError
    from heddle.runs import execute, from_document
    from heddle.agentspec import load_flow
    from heddle.agentspec.roots import document_root

    transport = {"component_type": "StreamableHTTPTransport", "id": "h", "name": "h", "url": "https://mcp.example/mcp"}
    f = FlowDoc("confirmed")
    start = f.start([prop("a", "integer")])
    node = f.tool_node("sum", {**_mcp_tool("add", transport, [prop("a", "integer")]), "requires_confirmation": True})
    end = f.end([])
    f.control(start, node)
    f.control(node, end)
    flow = f.write(tmp_path / "flow.json")
    # Each call waits for a person's approval: run in a session, refused without one before any server is reached.
    with pytest.raises(NeedsSessionError) as caught:
        asyncio.run(execute(from_document(flow, RunSettings(), inputs={"a": 1})))
    assert "$.nodes[1].tool: MCPTool 'add' of ToolNode 'sum' has requires_confirmation: true" in str(caught.value)
    toolbox = {"component_type": "MCPToolBox", "id": "box", "name": "box", "client_transport": transport,
               "requires_confirmation": True}
    f = FlowDoc("boxed")
    start = f.start([])
    agent = f.agent("helper", llm_config(URL), inputs=[], outputs=["result"])
    f.components[agent]["agent"]["toolboxes"] = [toolbox]
    end = f.end([])
    f.control(start, agent)
    f.control(agent, end)
    # A toolbox's calls are asked for when its agent makes them (tests/engine/test_reference_readings.py).
    assert document_root(load_flow(f.write(tmp_path / "boxed.json"))).waits == ()


def test_a_request_flow_may_not_start_a_stdio_server(tmp_path: Path) -> None:
    from heddle.server.errors import ApiError
    from heddle.server.model_policy import ModelPolicy
    from heddle.agentspec import load_flow

    flow = load_flow(_adder_flow(_stdio(tmp_path / "server.py")).write(tmp_path / "flow.json"))
    with pytest.raises(ApiError) as caught:
        asyncio.run(ModelPolicy().check(ModelPolicy().plan(flow)))
    assert caught.value.status == 400 and "may not start a program" in str(caught.value)
    remote = {"component_type": "StreamableHTTPTransport", "id": "h", "name": "h", "url": "http://127.0.0.1:9/mcp"}
    flow = load_flow(_adder_flow(remote).write(tmp_path / "remote.json"))
    with pytest.raises(ApiError) as caught:
        asyncio.run(ModelPolicy().check(ModelPolicy().plan(flow)))
    assert "MCP server url" in str(caught.value) and "--allow-net" in str(caught.value)
