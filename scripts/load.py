"""Load driver for `heddle-server`: N requests at concurrency C against servers it starts itself.

    scripts/load [--runs 200] [--concurrency 1,4,16] [--serve echo,no-tool,3-tool]
    scripts/load [--bundle X --trust K.pub | --flow F --tools-dir T] [--max-concurrent N] [--otel]

Bounded and loopback only: every server is started on 127.0.0.1 with a port of its own, the
run count and concurrency are capped, and nothing else is contacted. What it serves by default:

- `echo`: the floor, a bare ASGI app answering each JSON body back as JSON, served by the same
  uvicorn (its h11 protocol) in a process of its own;
- `no-tool`: heddle-server running a StartNode -> EndNode flow sent inline in every request;
- `3-tool`: heddle-server running a 3-ToolNode demo flow (sh tools), sealed with the real CLI.

`--bundle` or `--flow` serve that instead. For each concurrency it completes N requests over
keep-alive connections (one per caller) and reports requests/s, p50/p99 latency of those that
succeeded, how many attempts were refused with 429 (each tried again 10 ms later), and the
server's peak RSS; afterwards it checks that no tool process is left and that the server's work
folder is empty. Then, with the floor measured, each server's requests/s as a ratio to it.
Prints markdown tables; exits 1 if a check failed.

`--otel` also measures each heddle-server with tracing on (OTEL_EXPORTER_OTLP_ENDPOINT set to an
OTLP/HTTP sink this driver runs, which answers and discards every export), labelled `+otel`, and
prints its requests/s as a share of the same server's untraced (the aim: within 3% on 3-tool).

The client is a few lines over asyncio streams rather than an HTTP library: it shares the
machine's cores with the server, and its own cost per request is in every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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
MAX_ATTEMPTS = 1000
# With more than one server, each level's runs are driven in this many turns, one server after another.
ROUNDS = 5
LISTENING = "heddle-server listening on "
ECHO_LISTENING = "load echo listening on "
SERVABLE = ("echo", "no-tool", "3-tool")
# The server's aims (docs/benchmarks.md): a no-tool flow within 2x the floor's requests/s at these levels.
AIM_RATIO = 2.0
AIM_LEVELS = (1, 16)
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
    heddle = str(BIN / "heddle")
    key = demo / "load"
    for argv in ([heddle, "keygen", "--out", str(key), "--no-passphrase"],
                 [heddle, "bundle", str(flow), "--tools-dir", str(tools), "--sign-key", f"{key}.key",
                  "-o", str(demo / "app.heddle")]):
        done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120,
                              env=child_env(root), check=False)
        if done.returncode != 0:
            raise SystemExit(f"load: {' '.join(argv[1:3])} failed: {done.stderr.strip()}")
    return demo / "app.heddle", Path(f"{key}.pub")


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
        if not length.isdigit() or int(length) > BODY_LIMIT:
            raise SystemExit(f"load: an answer without a usable Content-Length: {head[:500]!r}")
        status = int(status_line.split(" ", 2)[1])
        body = await reader.readexactly(int(length))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body

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
            if _answered(status, answer):
                result.ok += 1
                result.latencies_ms.append(elapsed)
            else:
                result.failed += 1

    cpu = cpu_seconds(target.proc.pid)
    started = time.perf_counter()
    await asyncio.gather(*(worker(c) for c in target.callers))
    result.seconds += time.perf_counter() - started
    result.cpu_s += cpu_seconds(target.proc.pid) - cpu


async def drive(targets: list[Target], runs: int, concurrency: int, rounds: int) -> None:
    """`runs` runs on each target at `concurrency`, in `rounds` turns taken in order, so that what else
    the machine does meanwhile falls on every target alike."""
    try:
        for target in targets:
            parts = urlsplit(target.url)
            host, port = parts.hostname or HOST, parts.port or 80
            payload = json.dumps(target.served.body).encode()
            request = (f"POST /v1/runs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                       f"Content-Length: {len(payload)}\r\n\r\n").encode("latin-1") + payload
            target.callers = [Caller(host, port, request) for _ in range(concurrency)]
            # The warm-up: imports, caches and the first connection are not what is measured.
            status, answer = await target.callers[0].post()
            if not _answered(status, answer):
                raise SystemExit(f"load: {target.served.label}: the warm-up run failed with {status}: "
                                 f"{answer[:500]!r}")
        counts = [runs // rounds + (1 if i < runs % rounds else 0) for i in range(rounds)]
        for count in counts:
            for target in targets:
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


def measure(served: list[Served], runs: int, concurrency: int, root: Path) -> list[Result]:
    """One level: every server started, driven in turns, checked and stopped."""
    targets: list[Target] = []
    try:
        for one in served:
            work = root / f"work-{one.label}-c{concurrency}"
            work.mkdir()
            proc, url = start_server(one.args, work, root, one.env)
            targets.append(Target(one, proc, url, work, Result(concurrency=concurrency, runs=runs, label=one.label)))
        rounds = max(1, min(ROUNDS if len(targets) > 1 else 1, runs // concurrency))
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


def tracing_cost(results: list[Result]) -> str:
    """Each traced server's requests/s as a share of the same server's untraced, per level."""
    plain = {(r.label, r.concurrency): r for r in results}
    lines = ["| traced | concurrency | runs/s | untraced runs/s | share |", "|---|---:|---:|---:|---:|"]
    for r in results:
        base = plain.get((r.label.removesuffix("+otel"), r.concurrency))
        if not r.label.endswith("+otel") or base is None or not base.runs_per_s:
            continue
        lines.append(f"| {r.label} | {r.concurrency} | {r.runs_per_s:.1f} | {base.runs_per_s:.1f} "
                     f"| {100 * r.runs_per_s / base.runs_per_s:.1f}% |")
    return "\n".join(lines)


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


def what_to_serve(args: argparse.Namespace, inputs: dict[str, Any], root: Path, limit: list[str]) -> list[Served]:
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
        trust = [a for t in args.trust for a in ("--trust", str(t.resolve()))]
        return [Served("bundle", f"bundle {args.bundle}", ["--bundle", str(args.bundle.resolve()), *trust, *limit],
                       {"inputs": inputs})]
    served = []
    for name in args.serve:
        if name == "echo":
            served.append(Served("echo", "the floor: a bare ASGI JSON echo app on the same uvicorn (h11)", None,
                                 {"inputs": inputs}))
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
                   help=f"What to measure, without --bundle or --flow [{','.join(SERVABLE)}].")
    p.add_argument("--bundle", type=Path, help="Serve this bundle instead.")
    p.add_argument("--trust", type=Path, action="append", default=[], help="With --bundle: a trusted key.")
    p.add_argument("--flow", type=Path, help="Serve this flow document (by flowPath) instead.")
    p.add_argument("--tools-dir", type=Path, help="With --flow: its tools.")
    p.add_argument("--input", default='{"x": "hello"}', help="The run's input (JSON object).")
    p.add_argument("--otel", action="store_true",
                   help="Also measure each heddle-server with tracing on, spans sent to a sink that discards them.")
    p.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)  # the floor's own process
    args = p.parse_args(argv)
    if args.serve_echo:
        return serve_echo()
    if not 1 <= args.runs <= MAX_RUNS:
        p.error(f"--runs {args.runs}: give 1 to {MAX_RUNS}")
    # Nothing given is left unused: each of these says what to serve, or goes with one that does.
    if args.bundle is not None and args.flow is not None:
        p.error("--bundle and --flow: give one")
    if args.serve is not None and (args.bundle is not None or args.flow is not None):
        p.error("--serve chooses among the built-in servers; with --bundle or --flow, that is what is served")
    if args.trust and args.bundle is None:
        p.error("--trust is for --bundle; give the bundle too")
    if args.tools_dir is not None and args.flow is None:
        p.error("--tools-dir is for --flow; give the flow too")
    args.serve = args.serve or list(SERVABLE)
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
        served = what_to_serve(args, inputs, root, ["--max-concurrent", str(max_concurrent)])
        if args.otel:
            endpoint = sink.enter_context(otlp_sink())
            served += [Served(f"{s.label}+otel", f"{s.what}, traced", s.args, s.body,
                              {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}) for s in served if s.args is not None]
        results = [r for c in args.concurrency for r in measure(served, args.runs, c, root)]
        for one in served:
            mine = [r for r in results if r.label == one.label]
            print(table(mine, what=one.what, max_concurrent=None if one.args is None else max_concurrent) + "\n")
        if any(r.label == "echo" for r in results) and any(r.label != "echo" for r in results):
            print(ratios(results))
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
