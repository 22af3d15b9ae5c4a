"""Under --safe with an allow-list, the processes heddle keeps for a run (an MCP server over stdio, a plugin)
reach the network through the egress proxy alone, as a tool call does: each tries the ways past it that
matter (raw TCP to an IP literal, `curl --noproxy '*'`, an unlisted host) and fails, reported; the listed
host answers. Real bubblewrap and real processes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from heddle.engine import events as ev
from heddle.settings import RunSettings
from heddle.workspace.sandbox import find_bwrap
from tests.plugins.support import make_plugin, node_type, run_in_process
from tests.support.flows import FlowDoc, prop

pytestmark = pytest.mark.skipif(find_bwrap() is None or shutil.which("curl") is None
                                or not os.access("/usr/bin/python3", os.X_OK),
                                reason="needs bubblewrap, curl and /usr/bin/python3")

# Each attempt: [ok, what happened].
ATTEMPTS = r'''
import json, socket, subprocess, urllib.request

def attempt(op):
    kind, arg = op
    try:
        if kind == "get":
            with urllib.request.urlopen(arg, timeout=10) as r:
                return [True, r.read().decode()]
        if kind == "curl":
            done = subprocess.run(["/usr/bin/curl", "-sS", "--max-time", "10", *arg], capture_output=True, text=True)
            return [done.returncode == 0, done.stdout + done.stderr]
        if kind == "tcp":
            with socket.create_connection((arg[0], arg[1]), timeout=3):
                return [True, "connected"]
    except Exception as exc:
        return [False, f"{type(exc).__name__}: {exc}"]
'''

# A standard-library MCP server over stdio whose one tool makes the attempts it is given.
MCP_SERVER = ATTEMPTS + r'''
import sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, params = msg["method"], msg.get("params") or {}
    if method == "initialize":
        res = {"protocolVersion": params["protocolVersion"], "capabilities": {"tools": {}},
               "serverInfo": {"name": "probe", "version": "1"}}
    elif method == "tools/list":
        res = {"tools": [{"name": "probe", "description": "Try the network.",
                          "inputSchema": {"type": "object", "properties": {"ops": {"type": "string"}}}}]}
    elif method == "tools/call":
        report = {"report": json.dumps([attempt(op) for op in json.loads(params["arguments"]["ops"])])}
        res = {"content": [{"type": "text", "text": json.dumps(report)}], "structuredContent": report}
    else:
        res = {}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": res}), flush=True)
'''

PLUGIN = ATTEMPTS + r'''
@plugin.node("Probe")
def probe(call):
    return {"report": json.dumps([attempt(op) for op in json.loads(call.input["ops"])])}
'''


class _Api(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        data = b"hello from the listed host"
        self.send_response(200)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def api() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Api)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _ops(port: int) -> list[list[Any]]:
    return [
        ["get", f"http://api.test:{port}/ok"],                          # 0 the listed host, through the proxy
        ["tcp", ["127.0.0.1", port]],                                   # 1 raw TCP to an IP literal
        ["curl", ["--noproxy", "*", f"http://127.0.0.1:{port}/ok"]],    # 2 the proxy variables ignored
        ["get", f"http://unlisted.test:{port}/ok"],                     # 3 a host not on the list
    ]


def _check(results: list[list[Any]]) -> None:
    assert results[0] == [True, "hello from the listed host"], results
    for i in (1, 2, 3):
        assert not results[i][0], (i, results[i])


def _options(egress: dict[str, tuple[str, ...]], **settings: Any) -> Any:
    from heddle.engine.options import with_egress

    return with_egress(RunSettings(safe=True, tool_timeout=60, **settings).run_options(), egress)


def test_an_mcp_stdio_server_reaches_only_its_declared_hosts(tmp_path: Path, api: int,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.agentspec import load_flow
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.workspace import egress_proxy

    monkeypatch.setitem(egress_proxy.HOSTS, "api.test", "127.0.0.1")
    monkeypatch.setitem(egress_proxy.HOSTS, "unlisted.test", "127.0.0.1")
    folder = tmp_path / "srv"
    folder.mkdir()
    (folder / "server.py").write_text(MCP_SERVER)
    transport = {"component_type": "StdioTransport", "id": "t-probe", "name": "prober",
                 "command": "/usr/bin/python3", "args": [str(folder / "server.py")],
                 "session_parameters": {"read_timeout_seconds": 60}}
    tool = {"component_type": "MCPTool", "id": "mcp-probe", "name": "probe", "client_transport": transport,
            "inputs": [prop("ops")], "outputs": [prop("report")]}
    f = FlowDoc("mcp-egress")
    s = f.start([prop("ops")])
    t = f.tool_node("probe", tool, inputs=[prop("ops")])
    e = f.end([prop("report")])
    f.control(s, t)
    f.control(t, e)
    flow = load_flow(f.write(tmp_path / "flow.json"))
    options = _options({"prober": (f"api.test:{api}",)}, allow_read=(folder,))
    prepared = prepare_run(flow, tools={}, tools_dir=None, options=options)
    events: list[ev.Event] = []
    state = asyncio.run(run_prepared(prepared, {"ops": json.dumps(_ops(api))}, on_event=events.append)).state
    _check(json.loads(state["report"]))
    refused = [(e.tool, e.host, e.port) for e in events if isinstance(e, ev.EgressRefused)]
    assert refused == [("prober", "unlisted.test", api)], refused


def test_a_plugin_process_reaches_only_its_manifests_hosts(tmp_path: Path, api: int, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    from heddle.bundle.egress import sealed_egress
    from heddle.workspace import egress_proxy

    monkeypatch.setitem(egress_proxy.HOSTS, "api.test", "127.0.0.1")
    monkeypatch.setitem(egress_proxy.HOSTS, "unlisted.test", "127.0.0.1")
    manifest = make_plugin(tmp_path / "prober", components=[node_type("Probe", [prop("ops")], [prop("report")])],
                           code=PLUGIN, egress={"prober": [f"api.test:{api}"]})
    f = FlowDoc("plugin-egress")
    s = f.start([prop("ops")])
    p = f._node("Probe", "probe", [prop("ops")], [prop("report")])
    e = f.end([prop("report")])
    f.control(s, p)
    f.control(p, e)
    flow = f.write(tmp_path / "flow.json")
    # The list as a run of the document gets it: the plugin manifest's section declares it.
    from heddle.agentspec import load_flow
    from heddle.plugin_host import PluginHost

    host = PluginHost.load([manifest])
    egress = sealed_egress(load_flow(flow, node_types=host.node_types()),
                           [m.egress for m in host.manifests.values()])
    assert egress == {"prober": (f"api.test:{api}",)}
    with caplog.at_level(logging.WARNING, logger="heddle.egress"):
        state, _, _ = run_in_process(flow, tools_dir=None, plugins=[manifest], inputs={"ops": json.dumps(
            _ops(api))}, options=_options(egress))
    assert isinstance(state, dict), state
    _check(json.loads(state["report"]))
    logged = [r.getMessage() for r in caplog.records if r.name == "heddle.egress"]
    assert len(logged) == 1 and "process 'prober'" in logged[0] and "unlisted.test" in logged[0], logged


def test_a_tool_calls_proxy_listens_in_its_namespace_or_else_a_relay_starts_in_its_sandbox(
        tmp_path: Path, api: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.tools import spawner
    from heddle.workspace.egress_proxy import PROXY_PORT, runner_problem
    from tests.workspace.test_egress_sandbox import run_tool

    problem = runner_problem()  # asked once per process, by a probe that asks for a listener too
    if problem is not None:
        pytest.skip(problem)
    asked: list[int] = []
    real = spawner.SPAWNER.ask_listener

    def ask_listener(info: int, block: int, port: int) -> Any:
        asked.append(port)
        return real(info, block, port)

    monkeypatch.setattr(spawner.SPAWNER, "ask_listener", ask_listener)
    ops = [["get", f"http://127.0.0.1:{api}/ok"], ["tcp", ["127.0.0.1", api]]]
    egress = {"net": (f"127.0.0.1:{api}",)}
    results, _ = run_tool(tmp_path, ops, egress)
    assert results[0] == [True, "hello from the listed host"] and not results[1][0], results
    assert asked == [PROXY_PORT]
    # Where the kernel does not allow it, the sandbox makes the namespace and starts the relay in it.
    monkeypatch.setattr(spawner, "own_network_problem", lambda port, argv: "refused here")
    asked.clear()
    results, _ = run_tool(tmp_path, ops, egress)
    assert results[0] == [True, "hello from the listed host"] and not results[1][0], results
    assert asked == []


def _own_network_sandbox(tmp_path: Path, script: str) -> list[str]:
    """A bubblewrap command line as a tool call under an allow-list gets it, running `script` (sh)."""
    return [str(find_bwrap()), "--unshare-user", "--unshare-pid", "--unshare-net", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev",
            "--bind", str(tmp_path), str(tmp_path), "--", "/bin/sh", "-c", script]


def test_calls_at_once_each_get_the_listener_of_their_own_namespace(tmp_path: Path) -> None:
    from heddle.tools.process import run_process
    from heddle.tools.spawner import OwnNetwork
    from heddle.workspace.egress_proxy import PROXY_PORT, runner_problem

    if (problem := runner_problem()) is not None:
        pytest.skip(problem)
    # Each tool says what its listener answered and which user namespace it is in (while all three run).
    client = (f"import os, socket; s = socket.create_connection(('127.0.0.1', {PROXY_PORT})); "
              "print(s.recv(64).decode(), os.readlink('/proc/self/ns/user'))")

    async def calls() -> list[str]:
        servers: list[asyncio.Server] = []
        connected: list[int] = []
        everyone = asyncio.Event()

        def network(n: int) -> OwnNetwork:
            async def greet(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                connected.append(n)
                if len(connected) == 3:
                    everyone.set()
                await everyone.wait()
                writer.write(f"call {n}".encode())
                await writer.drain()
                writer.close()

            async def adopt(listener: Any) -> None:
                servers.append(await asyncio.start_server(greet, sock=listener))

            return OwnNetwork(PROXY_PORT, adopt)

        try:
            done = await asyncio.gather(*(run_process(
                "net", _own_network_sandbox(tmp_path, f"/usr/bin/python3 -I -S -c \"{client}\""), b"",
                sandboxed=True, netns=network(n), timeout=30) for n in range(3)))
        finally:
            for server in servers:
                server.close()
        return [d.stdout.decode().strip() or d.stderr.decode() for d in done]

    said = [line.split(" ", 2) for line in asyncio.run(calls())]
    assert [" ".join(words[:2]) for words in said] == ["call 0", "call 1", "call 2"], said
    # A user namespace of each call's own, as under --safe without a list: none shares the kernel's user
    # keyrings with another.
    namespaces = {words[2] for words in said}
    assert len(namespaces) == 3 and os.readlink("/proc/self/ns/user") not in namespaces, said


def test_a_call_whose_listener_cannot_be_made_never_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from heddle.errors import ToolError
    from heddle.tools import spawner
    from heddle.tools.process import run_process
    from heddle.workspace.egress_proxy import PROXY_PORT, runner_problem

    if (problem := runner_problem()) is not None:
        pytest.skip(problem)

    def refused(info: int, block: int, port: int) -> socket.socket:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            theirs.send(b"error 1")  # as the runner's fork answers when it cannot enter the namespace
        return mine

    monkeypatch.setattr(spawner.SPAWNER, "ask_listener", refused)

    async def adopt(listener: Any) -> None:
        raise AssertionError("no listener was made")

    marker = tmp_path / "ran"
    with pytest.raises(ToolError, match="its network namespace could not be made: Operation not permitted"):
        asyncio.run(run_process("net", _own_network_sandbox(tmp_path, f"touch {marker}"), b"", sandboxed=True,
                                netns=spawner.OwnNetwork(PROXY_PORT, adopt), timeout=60))
    assert not marker.exists()
