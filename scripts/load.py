"""Load driver for `heddle-server`: N requests at concurrency C against servers it starts itself.

    scripts/load [--runs 200] [--concurrency 1,4,16] [--serve echo,no-tool,3-tool,surfaces]
    scripts/load [--bundle X --trust K.pub | --flow F --tools-dir T] [--max-concurrent N] [--otel]
    scripts/load --url http://127.0.0.1:PORT [--seconds 10] [--workers 6]   (a mixed load, load_mixed.py)
    scripts/load --wrk 5 --serve echo,no-tool --concurrency 16,64 [--turns 4]   (Debian's wrk)

Bounded and loopback only: every server is started on 127.0.0.1 with a port of its own, the
run count and concurrency are capped, and nothing else is contacted. What it serves by default:

- `echo`: the floor, a bare ASGI app answering each JSON body back as JSON, served by the same
  uvicorn (its h11 protocol) in a process of its own;
- `no-tool`: heddle-server running a StartNode -> EndNode flow sent inline in every request;
- `3-tool`: heddle-server running a 3-ToolNode demo flow (sh tools), sealed with the real CLI.

- `surfaces` (only when named): the StartNode -> EndNode flow sealed into a bundle, run over
  `/v1/runs` and over each other protocol heddle-server serves from a bundle (MCP tools/call at
  `/mcp`, A2A SendMessage at `/a2a`, `/v1/runs?protocol=ag-ui` streamed), each by a server of its
  own; and an agent (a model this driver starts with `heddle model serve`, one answer) over
  `/v1/runs` and `POST /v1/responses`, which serves agents only. Then each surface's latency added
  to that of `/v1/runs` on the same bundle (the aim: within 2 ms at p50).

`--bundle` or `--flow` serve that instead. For each concurrency it completes N requests over
keep-alive connections (one per caller) and reports requests/s, p50/p99 latency of those that
succeeded, how many attempts were refused with 429 (each tried again 10 ms later), and the
server's peak RSS; afterwards it checks that no tool process is left and that the server's work
folder is empty. Then, with the floor measured, each server's requests/s as a ratio to it.
Prints markdown tables; exits 1 if a check failed.

`--otel` also measures each heddle-server with tracing on (OTEL_EXPORTER_OTLP_ENDPOINT set to an
OTLP/HTTP sink this driver runs, which answers and discards every export), labelled `+otel`, and
the same untraced server a second time, labelled `+twin`; then prints the traced one's requests/s
as a share of the untraced's, turn by turn, beside the twin's share: what two identical servers
differ by on this machine, the noise the aim is read against. The aim (within 3% on 3-tool) is read on
the traced turn's share of the mean of the two untraced turns on either side of it (the servers take
their turns in the order untraced, traced, twin, then back), so that neither baseline's luck, nor the
machine getting busier or quieter through a turn, falls on the traced server alone.

The client is a few lines over asyncio streams rather than an HTTP library: it shares the
machine's cores with the server, and its own cost per request is in every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

MAX_RUNS = 20_000
MAX_CONCURRENCY = 256
HOST = "127.0.0.1"
BIN = Path(sys.executable).parent
ECHO_TOOL = "#!/bin/sh\ncat\n"
RETRY_PAUSE_S = 0.01
IDLE_REOPEN_S = 1.0
MAX_ATTEMPTS = 1000
# With more than one server, each level's runs are driven in this many turns, one server after another.
ROUNDS = 5
LISTENING = "heddle-server listening on "
ECHO_LISTENING = "load echo listening on "
SERVABLE = ("echo", "no-tool", "3-tool", "surfaces")
SERVED_BY_DEFAULT = ("echo", "no-tool", "3-tool")
# A surface's p50 latency over that of /v1/runs on the same bundle (docs/load.md).
AIM_SURFACE_MS = 2.0
MCP_VERSION = "2026-07-28"  # the stateless era: one POST per call, no session to open first
# The server's aims (docs/benchmarks.md): a no-tool flow within 2x the floor's requests/s at these levels.
AIM_RATIO = 2.0
AIM_LEVELS = (1, 16)
# Tracing's (docs/observability.md): a traced server's requests/s at least this share of the untraced's.
AIM_TRACED = 97.0
# Answers of these servers are far smaller: past these the driver stops rather than read on.
HEAD_LIMIT = 64 << 10
BODY_LIMIT = 64 << 20


@dataclass
class Served:
    """One server to measure: heddle-server with `args` (None: the echo floor), sent `body`."""

    label: str
    what: str
    args: list[str] | None
    body: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)  # beside child_env's, for this server alone
    path: str = "/v1/runs"
    headers: dict[str, str] = field(default_factory=dict)
    check: str = "runs"  # which of ANSWERED says a run succeeded
    base: str | None = None  # a surface: the label of the /v1/runs server its latency is compared to


@dataclass
class Result:
    concurrency: int
    runs: int
    label: str = ""
    ok: int = 0
    refused: int = 0  # 429 answers (each refused attempt was tried again)
    failed: int = 0  # runs that ended in anything but 200
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0  # the server's, while its runs were driven
    peak_rss_kib: int = 0
    leftover_processes: list[int] = field(default_factory=list)
    leftover_files: list[str] = field(default_factory=list)
    exit_status: int | None = None
    turns: list[tuple[int, float, float]] = field(default_factory=list)  # each turn's (ok, seconds, cpu_s)

    @property
    def runs_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float:
        """The server's CPU per request: less shaken than requests/s by what else the machine runs."""
        done = self.ok + self.failed
        return self.cpu_s * 1000 / done if done else 0.0

    def percentile(self, p: float) -> float:
        if not self.latencies_ms:
            return float("nan")
        if len(self.latencies_ms) == 1:
            return self.latencies_ms[0]
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[int(p) - 1]

    @property
    def clean(self) -> bool:
        return not self.leftover_processes and not self.leftover_files and self.exit_status == 0


# ------------------------------------------------------------------ what is served

def write_demo(root: Path) -> tuple[Path, Path]:
    """A flow of three ToolNodes (each an sh tool passing its input on) and its tools folder."""
    tools = root / "tools"
    tools.mkdir(parents=True)
    for name in ("fetch", "shape", "store"):
        path = tools / name
        path.write_text(ECHO_TOOL, encoding="utf-8")
        path.chmod(0o755)

    def node(i: int, name: str) -> dict[str, Any]:
        tool = {"component_type": "ServerTool", "id": f"tool-{name}", "name": name,
                "description": f"the {name} step", "inputs": [], "outputs": [{"title": "x", "type": "string"}]}
        return {"component_type": "ToolNode", "id": f"n{i}", "name": f"{name}-node", "inputs": [],
                "outputs": [{"title": "x", "type": "string"}], "tool": tool}

    nodes = [{"component_type": "StartNode", "id": "start", "name": "start",
              "inputs": [{"title": "x", "type": "string"}], "outputs": [{"title": "x", "type": "string"}]}]
    nodes += [node(i, name) for i, name in enumerate(("fetch", "shape", "store"), 1)]
    nodes.append({"component_type": "EndNode", "id": "end", "name": "end", "branches": [],
                  "inputs": [{"title": "x", "type": "string"}], "outputs": [{"title": "x", "type": "string"}]})
    edges = [{"component_type": "ControlFlowEdge", "id": f"c{i}", "name": f"c{i}",
              "from_node": {"$component_ref": nodes[i]["id"]}, "from_branch": None,
              "to_node": {"$component_ref": nodes[i + 1]["id"]}} for i in range(len(nodes) - 1)]
    flow = {"component_type": "Flow", "agentspec_version": "26.1.0", "id": "load-demo", "name": "load-demo",
            "inputs": nodes[0]["inputs"], "outputs": [], "start_node": {"$component_ref": "start"},
            "nodes": [{"$component_ref": n["id"]} for n in nodes], "control_flow_connections": edges,
            "data_flow_connections": [], "$referenced_components": {n["id"]: n for n in nodes}}
    path = root / "flow.json"
    path.write_text(json.dumps(flow, indent=2), encoding="utf-8")
    return path, tools


def no_tool_flow() -> dict[str, Any]:
    """StartNode(x) -> EndNode(x): what the server does per request beyond running tools."""
    port = [{"title": "x", "type": "string"}]
    nodes = [{"component_type": "StartNode", "id": "start", "name": "start", "inputs": port, "outputs": port},
             {"component_type": "EndNode", "id": "end", "name": "end", "branches": [], "inputs": port,
              "outputs": port}]
    edge = {"component_type": "ControlFlowEdge", "id": "c0", "name": "c0", "from_node": {"$component_ref": "start"},
            "from_branch": None, "to_node": {"$component_ref": "end"}}
    return {"component_type": "Flow", "agentspec_version": "26.1.0", "id": "no-tool", "name": "no-tool",
            "inputs": port, "outputs": port, "start_node": {"$component_ref": "start"},
            "nodes": [{"$component_ref": n["id"]} for n in nodes], "control_flow_connections": [edge],
            "data_flow_connections": [], "$referenced_components": {n["id"]: n for n in nodes}}


def child_env(root: Path) -> dict[str, str]:
    """The environment of every process this driver starts: this interpreter's tools first on PATH,
    and the bundle cache kept under `root`, removed with it."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["HEDDLE_CACHE_DIR"] = str(root / "cache")
    return env


def seal_demo(root: Path) -> tuple[Path, Path]:
    """Seal the demo under `root`/demo with the real CLI; returns (bundle, public key)."""
    demo = root / "demo"
    flow, tools = write_demo(demo)
    return seal(demo, flow, tools)


def seal(folder: Path, flow: Path, tools: Path | None = None) -> tuple[Path, Path]:
    """Seal `flow` (and its `tools`) into `folder`/app.heddle with the real CLI, signed with a key made
    for it; returns (bundle, public key)."""
    root = folder.parent
    key = folder / "load"
    tools_args = ["--tools-dir", str(tools)] if tools is not None else []
    _heddle(root, ["keygen", "--out", str(key), "--no-passphrase"])
    _heddle(root, ["bundle", str(flow), *tools_args, "--sign-key", f"{key}.key", "-o", str(folder / "app.heddle")])
    warm(folder / "app.heddle", [Path(f"{key}.pub")], root)
    return folder / "app.heddle", Path(f"{key}.pub")


def _heddle(root: Path, args: list[str], timeout: float = 120) -> None:
    """The real `heddle` CLI with `args`, run to its end; SystemExit saying why when it fails."""
    done = subprocess.run([str(BIN / "heddle"), *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=timeout, env=child_env(root), check=False)
    if done.returncode != 0:
        raise SystemExit(f"load: heddle {' '.join(args[:2])} failed: {done.stderr.strip()}")


def warm(bundle: Path, trust: list[Path], root: Path) -> None:
    """Verify `bundle` into the cache the servers share, before any starts: each then opens it warm,
    alike. Else the first one started proves and unpacks it cold and keeps that heap, and spent 1 to 3%
    more CPU a request than the others through a whole run."""
    _heddle(root, ["verify", str(bundle), *[a for t in trust for a in ("--trust", str(t))]], timeout=300)


def sealed_document(root: Path, name: str, document: dict[str, Any]) -> tuple[Path, Path]:
    folder = root / name
    folder.mkdir()
    path = folder / "flow.json"
    path.write_text(json.dumps(document, indent=2), encoding="utf-8")
    return seal(folder, path)


@contextlib.contextmanager
def scripted_model(root: Path) -> Iterator[str]:
    """`heddle model serve` answering every chat request with one message; its base URL."""
    script = root / "model-script.json"
    script.write_text(json.dumps([{"content": "Hello."}]), encoding="utf-8")
    with open(root / "model.log", "ab") as err:
        proc = subprocess.Popen([str(BIN / "heddle"), "model", "serve", "--script", str(script), "--loop"],
                                stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, env=child_env(root))
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().decode("utf-8", "replace").strip()
        if not url.startswith("http://"):
            raise SystemExit(f"load: heddle model serve did not start: {(root / 'model.log').read_text()[-2000:]}")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def agent_document(model_url: str) -> dict[str, Any]:
    """An Agent with no tools: one model call a turn, its answer the run's."""
    llm = {"component_type": "OpenAiCompatibleConfig", "id": "llm", "name": "scripted", "model_id": "scripted",
           "url": model_url}
    return {"component_type": "Agent", "agentspec_version": "26.1.0", "id": "load-agent", "name": "load-agent",
            "description": "Answers.", "llm_config": llm, "system_prompt": "You answer.", "tools": []}


def surfaces_served(root: Path, inputs: dict[str, Any], limit: list[str], model_url: str) -> list[Served]:
    """The no-tool flow, sealed, over /v1/runs and each surface; an agent over /v1/runs and Responses."""
    bundle, key = sealed_document(root, "surfaces", no_tool_flow())
    args = ["--bundle", str(bundle), "--trust", str(key), *limit]
    what = "the StartNode -> EndNode flow, sealed"
    mcp_meta = {"io.modelcontextprotocol/protocolVersion": MCP_VERSION,
                "io.modelcontextprotocol/clientCapabilities": {}}
    served = [
        Served("runs", f"{what}, POST /v1/runs", args, {"inputs": inputs}),
        Served("mcp", f"{what}, MCP tools/call at /mcp ({MCP_VERSION})", args,
               {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "no-tool", "arguments": inputs, "_meta": mcp_meta}},
               path="/mcp", headers={"Accept": "application/json, text/event-stream",
                                     "MCP-Protocol-Version": MCP_VERSION, "Mcp-Method": "tools/call",
                                     "Mcp-Name": "no-tool"}, check="mcp", base="runs"),
        Served("a2a", f"{what}, A2A SendMessage (JSON-RPC) at /a2a", args,
               {"jsonrpc": "2.0", "id": 1, "method": "SendMessage",
                "params": {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"data": inputs}]}}},
               path="/a2a", headers={"A2A-Version": "1.0"}, check="a2a", base="runs"),
        Served("ag-ui", f"{what}, POST /v1/runs?protocol=ag-ui (streamed)", args, {"inputs": inputs},
               path="/v1/runs?protocol=ag-ui", check="ag-ui", base="runs"),
    ]
    agent, agent_key = sealed_document(root, "agent", agent_document(model_url))
    args = ["--bundle", str(agent), "--trust", str(agent_key), *limit]
    what = "an Agent with no tools (one model call, `heddle model serve`), sealed"
    served += [
        Served("agent-runs", f"{what}, POST /v1/runs", args, {"message": "hello"}),
        Served("responses", f"{what}, POST /v1/responses", args, {"model": "load-agent", "input": "hello"},
               path="/v1/responses", check="responses", base="agent-runs"),
    ]
    return served


# ------------------------------------------------------------------ the server

def start_server(args: list[str] | None, work: Path, root: Path,
                 env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], str]:
    """heddle-server with `args`, or with None the echo floor; returns the process and its URL."""
    if args is None:
        argv, prefix, name = [sys.executable, str(Path(__file__).resolve()), "--serve-echo"], ECHO_LISTENING, "echo"
    else:
        argv = [str(BIN / "heddle-server"), "--host", HOST, "--port", "0", "--work-dir", str(work), *args]
        prefix, name = LISTENING, "heddle-server"
    log = root / "server.log"
    with open(log, "ab") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                env={**child_env(root), **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline().decode("utf-8", "replace").strip()
    if not line.startswith(prefix):
        proc.kill()
        proc.wait()
        raise SystemExit(f"load: {name} did not start: {log.read_text(errors='replace')[-2000:]}")
    return proc, line[len(prefix):]


async def echo_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """The floor: each request's JSON body, parsed and answered back as JSON, and nothing else."""
    if scope["type"] != "http":
        return
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    data = json.dumps({"outputs": json.loads(b"".join(chunks) or b"{}")}).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def serve_echo() -> int:
    """Serve `echo_app` on a free port of 127.0.0.1 until SIGTERM, with the protocol heddle-server uses
    (uvicorn's h11), binding as uvicorn does by itself; the first line out names the URL."""
    import socket

    import uvicorn

    class Echo(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                port = self.servers[0].sockets[0].getsockname()[1]
                print(f"{ECHO_LISTENING}http://{HOST}:{port}", flush=True)

        def handle_exit(self, sig: int, frame: Any) -> None:
            self.should_exit = True  # a signal is how it stops: exit 0, not re-raised

    config = uvicorn.Config(echo_app, host=HOST, port=0, http="h11", lifespan="off", log_config=None,
                            log_level="warning", access_log=False, server_header=False)
    Echo(config).run()
    return 0


def peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tool_processes(work: Path) -> list[int]:
    """Processes whose workspace is under `work`: tools the engine started, still alive."""
    marker = f"HEDDLE_WORKSPACE={work}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if any(item.startswith(marker) for item in environ.split(b"\0")):
            found.append(int(entry.name))
    return found


# ------------------------------------------------------------------ the load

class Caller:
    """One keep-alive HTTP/1.1 connection posting the same request again and again. Each answer
    must carry a Content-Length (every answer of heddle-server to a buffered run, and of the floor,
    does); anything else stops the load, saying what came."""

    def __init__(self, host: str, port: int, request: bytes) -> None:
        self.host, self.port, self.request = host, port, request
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.used = time.monotonic()  # when its last answer came

    async def post(self) -> tuple[int, bytes]:
        if self._streams is not None and self._streams[0].at_eof():
            self.close()  # closed by the server while idle (its keep-alive timeout, while others were driven)
        if self._streams is None:
            self._streams = await asyncio.open_connection(self.host, self.port, limit=HEAD_LIMIT)
        reader, writer = self._streams
        writer.write(self.request)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError) as exc:
            raise SystemExit(f"load: the server closed the connection or sent no answer ({exc!r})") from None
        status_line, *lines = head.split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "")
        status = int(status_line.split(" ", 2)[1])
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunks(reader)
        elif not length.isdigit() or int(length) > BODY_LIMIT:
            raise SystemExit(f"load: an answer without a usable Content-Length: {head[:500]!r}")
        else:
            body = await reader.readexactly(int(length))
        if headers.get("connection", "").lower() == "close":
            self.close()
        self.used = time.monotonic()
        return status, body

    @staticmethod
    async def _chunks(reader: asyncio.StreamReader) -> bytes:
        """A chunked body (a stream's), whole: at most BODY_LIMIT bytes."""
        body = bytearray()
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                    pass
                return bytes(body)
            if len(body) + size > BODY_LIMIT:
                raise SystemExit(f"load: a streamed answer of over {BODY_LIMIT} bytes")
            body += await reader.readexactly(size)
            await reader.readexactly(2)

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


def _answered(status: int, body: bytes) -> bool:
    """A run that succeeded: a 200 whose body is an object with the run's outputs."""
    if status != 200:
        return False
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and isinstance(answer.get("outputs"), dict)


def _json_result(status: int, body: bytes) -> dict[str, Any]:
    try:
        answer = json.loads(body) if status == 200 else None
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


# Whether an answer is a run that succeeded, in each surface's own shape.
ANSWERED: dict[str, Any] = {
    "runs": _answered,
    "mcp": lambda status, body: (_json_result(status, body).get("result") or {}).get("isError") is False,
    "a2a": lambda status, body: ((_json_result(status, body).get("result") or {}).get("task") or {}).get(
        "status", {}).get("state") == "TASK_STATE_COMPLETED",
    "ag-ui": lambda status, body: status == 200 and b'"type":"RUN_FINISHED"' in body,
    "responses": lambda status, body: _json_result(status, body).get("status") == "completed",
}


def _stats() -> dict[int, list[str]]:
    """Every process's /proc stat fields after its command's name (field 3, state, first)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                found[int(entry)] = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
    return found


def cpu_seconds(pid: int) -> float:
    """CPU time of `pid` and of every process below it, user and system: each live one's own and
    that of the children it has waited for. So a tool counts whether the server waited for it or
    the reaper server it runs under did, which lives as long as the server (heddle/tools/reaper.py)."""
    stats = _stats()
    children: dict[int, list[int]] = {}
    for child, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(child)
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        fields = stats.get(current)
        if fields is None:
            continue
        # utime, stime, cutime, cstime (fields 14-17) are 11-14 here.
        total += sum(int(f) for f in fields[11:15])
        pending.extend(children.get(current, ()))
    return total / os.sysconf("SC_CLK_TCK")


@dataclass
class Target:
    """One started server of a level, its result so far, and its callers' connections."""

    served: Served
    proc: subprocess.Popen[bytes]
    url: str
    work: Path
    result: Result
    callers: list[Caller] = field(default_factory=list)


async def batch(target: Target, count: int) -> None:
    """`count` runs on `target` by all its callers at once, added to its result."""
    result = target.result
    counter = iter(range(count))
    check = ANSWERED[target.served.check]

    async def worker(caller: Caller) -> None:
        for _ in counter:
            # A refused run is tried again after a short pause: the server never queues, so
            # the caller does, and every refusal is counted.
            for _attempt in range(MAX_ATTEMPTS):
                started = time.perf_counter()
                status, answer = await caller.post()
                elapsed = (time.perf_counter() - started) * 1000
                if status != 429:
                    break
                result.refused += 1
                await asyncio.sleep(RETRY_PAUSE_S)
            if check(status, answer):
                result.ok += 1
                result.latencies_ms.append(elapsed)
            else:
                result.failed += 1

    for caller in target.callers:
        # A connection left idle while the other servers took their turn may be closing under the
        # server's keep-alive timeout (5 s) just as it is used again: one idle for long is opened anew.
        if time.monotonic() - caller.used > IDLE_REOPEN_S:
            caller.close()
    cpu, ok = cpu_seconds(target.proc.pid), result.ok
    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in target.callers))
    seconds, cpu = time.perf_counter() - started, cpu_seconds(target.proc.pid) - cpu
    result.seconds += seconds
    result.cpu_s += cpu
    result.turns.append((result.ok - ok, seconds, cpu))


async def drive(targets: list[Target], runs: int, concurrency: int, rounds: int) -> None:
    """`runs` runs on each target at `concurrency`, in `rounds` turns taken in order, so that what else
    the machine does meanwhile falls on every target alike."""
    try:
        for target in targets:
            parts = urlsplit(target.url)
            host, port = parts.hostname or HOST, parts.port or 80
            served = target.served
            payload = json.dumps(served.body).encode()
            extra = "".join(f"{name}: {value}\r\n" for name, value in served.headers.items())
            request = (f"POST {served.path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                       f"{extra}Content-Length: {len(payload)}\r\n\r\n").encode("latin-1") + payload
            target.callers = [Caller(host, port, request) for _ in range(concurrency)]
            # The warm-up: imports (the MCP surface imports `mcp` on its first request), caches and the
            # first connection are not what is measured.
            for _ in range(3):
                status, answer = await target.callers[0].post()
            if not ANSWERED[served.check](status, answer):
                raise SystemExit(f"load: {target.served.label}: the warm-up run failed with {status}: "
                                 f"{answer[:500]!r}")
        counts = [runs // rounds + (1 if i < runs % rounds else 0) for i in range(rounds)]
        for i, count in enumerate(counts):
            # Back and forth: a machine getting busier or quieter through the turns falls on each alike.
            for target in targets if i % 2 == 0 else targets[::-1]:
                await batch(target, count)
    finally:
        for target in targets:
            for caller in target.callers:
                caller.close()


def stop(target: Target) -> None:
    proc, result = target.proc, target.result
    proc.send_signal(signal.SIGTERM)
    try:
        result.exit_status = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        result.exit_status = proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    result.leftover_processes = sorted(set(result.leftover_processes) | set(tool_processes(target.work)))
    result.leftover_files = sorted(str(p.relative_to(target.work)) for p in target.work.iterdir())


def measure(served: list[Served], runs: int, concurrency: int, root: Path, turns: int = ROUNDS) -> list[Result]:
    """One level: every server started, driven in turns, checked and stopped."""
    targets: list[Target] = []
    try:
        for one in served:
            work = root / f"work-{one.label}-c{concurrency}"
            work.mkdir()
            proc, url = start_server(one.args, work, root, one.env)
            targets.append(Target(one, proc, url, work, Result(concurrency=concurrency, runs=runs, label=one.label)))
        rounds = max(1, min(turns if len(targets) > 1 else 1, runs // concurrency))
        asyncio.run(drive(targets, runs, concurrency, rounds))
        for target in targets:
            target.result.peak_rss_kib = peak_rss_kib(target.proc.pid)
        # Idle now: every tool must be gone already, not merely when the server stops.
        time.sleep(0.2)
        for target in targets:
            target.result.leftover_processes = tool_processes(target.work)
    finally:
        for target in targets:
            stop(target)
    return [target.result for target in targets]


def table(results: list[Result], *, what: str, max_concurrent: int | None) -> str:
    limit = f"; --max-concurrent {max_concurrent}" if max_concurrent is not None else ""
    lines = [f"Served: {what}{limit}; {os.cpu_count()} CPU(s).", "",
             ("| concurrency | requests | ok | 429 | other errors | requests/s | p50 ms | p99 ms | peak RSS MiB "
              "| server CPU ms/request | left behind |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        left = "nothing" if r.clean else (f"{len(r.leftover_processes)} process(es), {len(r.leftover_files)} "
                                          f"file(s), exit {r.exit_status}")
        lines.append(f"| {r.concurrency} | {r.runs} | {r.ok} | {r.refused} | {r.failed} | {r.runs_per_s:.1f} | "
                     f"{r.percentile(50):.1f} | {r.percentile(99):.1f} | {r.peak_rss_kib / 1024:.1f} | "
                     f"{r.cpu_ms:.2f} | {left} |")
    return "\n".join(lines)


def ratios(results: list[Result]) -> str:
    """Each server's requests/s against the floor's at the same concurrency."""
    floor = {r.concurrency: r for r in results if r.label == "echo"}
    lines = [("| served | concurrency | requests/s | echo requests/s | echo / served | server CPU per request, "
              "served / echo | aim |"),
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in results:
        echo = floor.get(r.concurrency)
        if r.label == "echo" or echo is None or not echo.runs_per_s or not r.runs_per_s:
            continue
        ratio = echo.runs_per_s / r.runs_per_s
        cpu = f"{r.cpu_ms / echo.cpu_ms:.1f}x" if echo.cpu_ms else ""
        aim = ""
        if r.label == "no-tool" and r.concurrency in AIM_LEVELS:
            aim = f"within {AIM_RATIO:g}x: " + ("met" if ratio <= AIM_RATIO else "missed")
        lines.append(f"| {r.label} | {r.concurrency} | {r.runs_per_s:.1f} | {echo.runs_per_s:.1f} | {ratio:.2f}x "
                     f"| {cpu} | {aim} |")
    return "\n".join(lines)


def surface_latency(results: list[Result], served: list[Served]) -> str:
    """Each surface's p50 and p99 latency over that of /v1/runs on the same bundle, per level."""
    base_of = {one.label: one.base for one in served if one.base is not None}
    by = {(r.label, r.concurrency): r for r in results}
    lines = [("| surface | concurrency | p50 ms | /v1/runs p50 ms | added p50 ms | added p99 ms "
              "| server CPU ms/request, added | aim |"), "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        base = by.get((base_of.get(r.label, ""), r.concurrency))
        if base is None or not r.latencies_ms or not base.latencies_ms:
            continue
        added = r.percentile(50) - base.percentile(50)
        aim = f"within {AIM_SURFACE_MS:g} ms: " + ("met" if added <= AIM_SURFACE_MS else "missed")
        lines.append(f"| {r.label} (vs {base.label}) | {r.concurrency} | {r.percentile(50):.2f} | "
                     f"{base.percentile(50):.2f} | {added:+.2f} | {r.percentile(99) - base.percentile(99):+.2f} | "
                     f"{r.cpu_ms - base.cpu_ms:+.2f} | {aim} |")
    return "\n".join(lines)


def _rates(r: Result) -> list[float]:
    """`r`'s requests/s in each turn (0 for a turn with none that succeeded)."""
    return [ok / seconds if ok else 0.0 for ok, seconds, _ in r.turns]


def _shares(r: Result, base: Result) -> list[float]:
    """`r`'s requests/s as a share of `base`'s, turn by turn (the two were driven one after the other)."""
    return [100 * a / b for a, b in zip(_rates(r), _rates(base), strict=False) if a and b]


def _pooled(r: Result, base: Result, twin: Result) -> list[float]:
    """`r`'s requests/s as a share of the mean of `base`'s and `twin`'s, turn by turn: two untraced
    baselines, driven just before and just after `r` in each turn."""
    return [100 * a / ((b + c) / 2)
            for a, b, c in zip(_rates(r), _rates(base), _rates(twin), strict=False) if a and b and c]


def _cpu(r: Result, base: Result) -> str:
    """The median, over the turns, of `r`'s server CPU a request over `base`'s: steadier than requests/s
    on a shared machine, as what else runs there slows a server more than it adds to its CPU."""
    ratios = [(a_cpu / a_ok) / (b_cpu / b_ok) for (a_ok, _, a_cpu), (b_ok, _, b_cpu)
              in zip(r.turns, base.turns, strict=False) if a_ok and b_ok and a_cpu and b_cpu]
    return f"{100 * statistics.median(ratios):.1f}%" if ratios else ""


def _spread(shares: list[float]) -> str:
    return f"{statistics.median(shares):.1f}% ({min(shares):.1f} to {max(shares):.1f})" if shares else ""


def tracing_cost(results: list[Result]) -> str:
    """Each traced server's requests/s as a share of the same server's untraced, per level: over the
    whole level, and the median of its turns (each traced turn against the untraced one beside it).
    The untraced twin, a second untraced server driven in the same turns, is the noise floor: what
    two identical servers differ by on this machine now; and with it the aim is read on each traced
    turn against the mean of both untraced turns around it (`_pooled`)."""
    plain = {(r.label, r.concurrency): r for r in results}
    lines = [("| traced | concurrency | runs/s | untraced runs/s | share | share a turn, median (range) "
              "| untraced twin's share a turn, median (range) | share of both untraced a turn, median (range) "
              "| server CPU ms/request, traced / untraced "
              "| CPU a request, traced / untraced, a turn (median) | the twin's | aim |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        name = r.label.removesuffix("+otel")
        base = plain.get((name, r.concurrency))
        if not r.label.endswith("+otel") or base is None or not base.runs_per_s:
            continue
        shares = _shares(r, base)
        twin = plain.get((f"{name}+twin", r.concurrency))
        noise = _shares(twin, base) if twin is not None else []
        pooled = _pooled(r, base, twin) if twin is not None else []
        judged = pooled or shares
        share = statistics.median(judged) if judged else 100 * r.runs_per_s / base.runs_per_s
        # Read against the twin: when two untraced servers differ by more than the aim, so may this.
        floor = abs(100 - statistics.median(noise)) if noise else 0.0
        aim = f"within {100 - AIM_TRACED:g}%: " + ("met" if share >= AIM_TRACED else "missed")
        if floor > 100 - AIM_TRACED:
            aim += f", but the twin is {floor:.1f}% off: not shown"
        lines.append(f"| {r.label} | {r.concurrency} | {r.runs_per_s:.1f} | {base.runs_per_s:.1f} "
                     f"| {100 * r.runs_per_s / base.runs_per_s:.1f}% | {_spread(shares)} | {_spread(noise)} "
                     f"| {_spread(pooled)} "
                     f"| {r.cpu_ms:.2f} / {base.cpu_ms:.2f} | {_cpu(r, base)} "
                     f"| {_cpu(twin, base) if twin is not None else ''} | {aim} |")
    return "\n".join(lines)


def _wrk(url: str, served: Served, concurrency: int, seconds: float, script: Path) -> tuple[float, float, int]:
    """One `wrk -t1` turn: (requests/s, p99 ms, answers that were not 2xx)."""
    script.write_text("wrk.method = \"POST\"\nwrk.headers[\"Content-Type\"] = \"application/json\"\n"
                      f"wrk.body = {json.dumps(json.dumps(served.body))}\n")
    out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{seconds:g}s", "--latency", "-s", str(script),
                          url.rstrip("/") + served.path], capture_output=True, text=True, check=True).stdout
    return parse_wrk(out)


def parse_wrk(out: str) -> tuple[float, float, int]:
    """(requests/s, p99 ms, answers not 2xx and socket errors) of what `wrk --latency` printed."""
    rps = p99 = None
    bad = 0
    for line in out.splitlines():
        parts = line.split()
        if line.startswith("Requests/sec:"):
            rps = float(parts[1])
        elif parts[:1] == ["99%"]:
            unit = parts[1].lstrip("0123456789.")
            p99 = float(parts[1][:-len(unit)]) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[unit]
        elif line.strip().startswith("Non-2xx or 3xx responses:"):
            bad += int(parts[-1])
        elif line.strip().startswith("Socket errors:"):
            bad += sum(int(x.rstrip(",")) for x in parts[3::2])
    if rps is None or p99 is None:
        raise SystemExit(f"load: wrk printed no figures:\n{out}")
    return rps, p99, bad


def wrk_turns(served: list[Served], levels: list[int], seconds: float, turns: int, root: Path) -> str:
    """Each server measured with Debian's `wrk` (one thread, `--latency`) in turns, the order reversed
    each turn; the server's CPU a request from /proc over the same turns. Medians of the turns."""
    rows = [("| served | concurrency | requests/s | echo requests/s | echo / served | server CPU per request, "
             "served / echo | p99 ms | echo p99 ms | aim |"), "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    script = root / "post.lua"
    failed = 0
    for concurrency in levels:
        started = []
        try:
            for one in served:
                work = root / f"wrk-{one.label}-c{concurrency}"
                work.mkdir()
                started.append((one, *start_server(one.args, work, root, one.env)))
            figures: dict[str, list[tuple[float, float, float]]] = {one.label: [] for one in served}
            for turn in range(turns):
                for one, proc, url in started if turn % 2 == 0 else started[::-1]:
                    cpu = cpu_seconds(proc.pid)
                    rps, p99, bad = _wrk(url, one, concurrency, seconds, script)
                    cpu = cpu_seconds(proc.pid) - cpu
                    failed += bad
                    figures[one.label].append((rps, p99, cpu * 1000 / max(1.0, rps * seconds)))
        finally:
            for _one, proc, _url in started:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
                if proc.stdout is not None:
                    proc.stdout.close()
        median = {label: tuple(statistics.median(f[i] for f in turns_) for i in range(3))
                  for label, turns_ in figures.items()}
        echo = median.get("echo")
        for one in served:
            if one.label == "echo" or echo is None:
                continue
            rps, p99, cpu = median[one.label]
            aims = []
            if one.label == "no-tool" and concurrency == 16:
                aims.append(f"CPU within 2x: {'met' if cpu <= 2 * echo[2] else 'missed'}; "
                            f"requests/s within 2.5x: {'met' if echo[0] <= 2.5 * rps else 'missed'}")
            if one.label == "no-tool" and concurrency == 64:
                aims.append(f"p99 under 100 ms: {'met' if p99 < 100 else 'missed'}")
            rows.append(f"| {one.label} | {concurrency} | {rps:.1f} | {echo[0]:.1f} | {echo[0] / rps:.2f}x | "
                        f"{cpu / echo[2]:.2f}x ({cpu:.2f} / {echo[2]:.2f} ms) | {p99:.1f} | {echo[1]:.1f} | "
                        f"{'; '.join(aims)} |")
    if failed:
        raise SystemExit(f"load: {failed} answer(s) under wrk were not 2xx or met a socket error")
    return "\n".join(rows)


@contextlib.contextmanager
def otlp_sink() -> Iterator[str]:
    """An OTLP/HTTP endpoint on loopback that answers every export with 200 and keeps nothing."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Sink(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("content-length") or 0))
            self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

    server = ThreadingHTTPServer((HOST, 0), Sink)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://{HOST}:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _served(names: str) -> list[str]:
    chosen = [part.strip() for part in names.split(",") if part.strip()]
    unknown = [name for name in chosen if name not in SERVABLE]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(f"{names!r}: choose among {', '.join(SERVABLE)}, separated by commas")
    return chosen


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,8") from None
    if not levels or any(not 1 <= c <= MAX_CONCURRENCY for c in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: each concurrency must be 1 to {MAX_CONCURRENCY}")
    return levels


def what_to_serve(args: argparse.Namespace, inputs: dict[str, Any], root: Path, limit: list[str],
                  stack: contextlib.ExitStack) -> list[Served]:
    if args.flow is not None:
        flows = root / "flows"
        flows.mkdir()
        shutil.copy(args.flow, flows / args.flow.name)
        server_args = ["--flows-root", str(flows)]
        if args.tools_dir:
            server_args += ["--tools-dir", str(args.tools_dir.resolve())]
        return [Served("flow", f"flow {args.flow} (by flowPath)", [*server_args, *limit],
                       {"flowPath": args.flow.name, "inputs": inputs})]
    if args.bundle is not None:
        warm(args.bundle.resolve(), [t.resolve() for t in args.trust], root)
        trust = [a for t in args.trust for a in ("--trust", str(t.resolve()))]
        return [Served("bundle", f"bundle {args.bundle}", ["--bundle", str(args.bundle.resolve()), *trust, *limit],
                       {"inputs": inputs})]
    served = []
    for name in args.serve:
        if name == "echo":
            served.append(Served("echo", "the floor: a bare ASGI JSON echo app on the same uvicorn (h11)", None,
                                 {"inputs": inputs}))
        elif name == "surfaces":
            served += surfaces_served(root, inputs, limit, stack.enter_context(scripted_model(root)))
        elif name == "no-tool":
            served.append(Served("no-tool", "a StartNode -> EndNode flow sent inline in each request", limit,
                                 {"flow": no_tool_flow(), "inputs": inputs}))
        else:
            bundle, key = seal_demo(root)
            served.append(Served("3-tool", "the sealed 3-ToolNode demo bundle (sh tools)",
                                 ["--bundle", str(bundle), "--trust", str(key), *limit], {"inputs": inputs}))
    return served


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/load", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200, help=f"Requests per concurrency level (at most {MAX_RUNS}).")
    p.add_argument("--concurrency", type=_levels, default=[1, 4, 16], help="Comma-separated levels [1,4,16].")
    p.add_argument("--max-concurrent", type=int, default=None,
                   help="The server's --max-concurrent [the highest --concurrency: nothing is refused].")
    p.add_argument("--serve", type=_served, default=None,
                   help=f"What to measure, without --bundle or --flow, among {','.join(SERVABLE)} "
                        f"[{','.join(SERVED_BY_DEFAULT)}].")
    p.add_argument("--bundle", type=Path, help="Serve this bundle instead.")
    p.add_argument("--trust", type=Path, action="append", default=[], help="With --bundle: a trusted key.")
    p.add_argument("--flow", type=Path, help="Serve this flow document (by flowPath) instead.")
    p.add_argument("--tools-dir", type=Path, help="With --flow: its tools.")
    p.add_argument("--input", default='{"x": "hello"}', help="The run's input (JSON object).")
    p.add_argument("--otel", action="store_true",
                   help="Also measure each heddle-server with tracing on, spans sent to a sink that discards them.")
    p.add_argument("--turns", type=int, default=ROUNDS,
                   help=f"With more than one server, the turns each level's runs are driven in, one server after "
                        f"another, the order reversed each turn [{ROUNDS}]; more give a steadier comparison.")
    p.add_argument("--wrk", type=float, metavar="SECONDS", default=None,
                   help="Measure with Debian's wrk instead (-t1, SECONDS a turn, --turns turns), the server's CPU "
                        "from /proc: e.g. --wrk 5 --serve echo,no-tool --concurrency 16,64.")
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)  # the floor's own process
    p.add_argument("--url", help="Drive a server already running (or a load balancer) with a mixed load instead: "
                                 "stateless runs, session turns and durable runs (scripts/load_mixed.py).")
    p.add_argument("--seconds", type=float, default=10.0, help="With --url: how long the load runs [10].")
    p.add_argument("--workers", type=int, default=6, help="With --url: client threads, each a kind in turn [6].")
    args = p.parse_args(argv)
    if args.serve_echo:
        return serve_echo()
    if args.url is not None:
        if urlsplit(args.url).hostname not in ("127.0.0.1", "localhost", "::1"):
            p.error(f"--url {args.url}: this driver loads loopback servers only")
        from load_mixed import drive

        return drive(args.url, seconds=args.seconds, workers=max(1, min(args.workers, MAX_CONCURRENCY)))
    if not 1 <= args.runs <= MAX_RUNS:
        p.error(f"--runs {args.runs}: give 1 to {MAX_RUNS}")
    if args.turns < 1:
        p.error(f"--turns {args.turns}: give 1 or more (a level of fewer runs is driven in as many turns as it has)")
    # Nothing given is left unused: each of these says what to serve, or goes with one that does.
    if args.bundle is not None and args.flow is not None:
        p.error("--bundle and --flow: give one")
    if args.serve is not None and (args.bundle is not None or args.flow is not None):
        p.error("--serve chooses among the built-in servers; with --bundle or --flow, that is what is served")
    if args.trust and args.bundle is None:
        p.error("--trust is for --bundle; give the bundle too")
    if args.tools_dir is not None and args.flow is None:
        p.error("--tools-dir is for --flow; give the flow too")
    args.serve = args.serve or list(SERVED_BY_DEFAULT)
    try:
        inputs = json.loads(args.input)
    except ValueError as exc:
        p.error(f"--input {args.input!r} is not JSON ({exc}); give an object, e.g. '{{\"x\": \"hello\"}}'")
    if not isinstance(inputs, dict):
        p.error(f"--input {args.input!r}: give a JSON object, e.g. '{{\"x\": \"hello\"}}'")
    max_concurrent = args.max_concurrent if args.max_concurrent is not None else max(args.concurrency)
    root = Path(tempfile.mkdtemp(prefix="heddle-load-"))
    sink = contextlib.ExitStack()
    try:
        served = what_to_serve(args, inputs, root, ["--max-concurrent", str(max_concurrent)], sink)
        if args.wrk is not None:
            if shutil.which("wrk") is None:
                p.error("--wrk needs wrk on PATH (Debian: apt-get install wrk)")
            print(wrk_turns(served, args.concurrency, args.wrk, args.turns, root))
            return 0
        if args.otel:
            endpoint = sink.enter_context(otlp_sink())
            served += [dataclasses.replace(s, label=f"{s.label}+otel", what=f"{s.what}, traced",
                                           env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint},
                                           base=None if s.base is None else f"{s.base}+otel")
                       for s in served if s.args is not None]
            # The same untraced server again, driven in the same turns: how far two alike differ.
            served += [dataclasses.replace(s, label=f"{s.label}+twin", what=f"{s.what}, untraced again (noise)",
                                           base=None if s.base is None else f"{s.base}+twin")
                       for s in served if s.args is not None and not s.label.endswith("+otel")]
        results = [r for c in args.concurrency for r in measure(served, args.runs, c, root, args.turns)]
        for one in served:
            mine = [r for r in results if r.label == one.label]
            print(table(mine, what=one.what, max_concurrent=None if one.args is None else max_concurrent) + "\n")
        if any(r.label == "echo" for r in results) and any(r.label != "echo" for r in results):
            print(ratios(results))
        if any(one.base is not None for one in served):
            print("\n" + surface_latency(results, served))
        if args.otel:
            print("\n" + tracing_cost(results))
        bad = [r for r in results if not r.clean or r.failed]
        for r in bad:
            print(f"load: {r.label}, concurrency {r.concurrency}: {r.failed} run(s) failed; left behind "
                  f"processes {r.leftover_processes}, files {r.leftover_files}; server exit {r.exit_status}",
                  file=sys.stderr)
        return 1 if bad else 0
    finally:
        sink.close()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
