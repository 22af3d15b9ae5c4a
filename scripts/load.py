"""Load driver for `heddle-server`: N runs at concurrency C against a server it starts itself.

    scripts/load [--runs 200] [--concurrency 1,8] [--max-concurrent 4] [--bundle X --trust K.pub]

Bounded and loopback only: the server is started on 127.0.0.1 with a port of its own, the
run count and concurrency are capped, and nothing else is contacted. Without --bundle (or
--flow) it builds a 3-ToolNode demo agent and seals it with the real `heddle` CLI.

For each concurrency it completes N runs and reports runs/s, p50/p99 latency of the runs that
succeeded, how many attempts were refused with 429 (and tried again 10 ms later), and the server's peak RSS; afterwards it checks that no tool process
is left and that the server's work folder is empty. Prints one markdown table; exits 1 if a
check failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_RUNS = 20_000
MAX_CONCURRENCY = 256
HOST = "127.0.0.1"
BIN = Path(sys.executable).parent
ECHO_TOOL = "#!/bin/sh\ncat\n"
RETRY_PAUSE_S = 0.01
MAX_ATTEMPTS = 1000


@dataclass
class Result:
    concurrency: int
    runs: int
    ok: int = 0
    refused: int = 0  # 429 answers (each refused attempt was tried again)
    failed: int = 0  # runs that ended in anything but 200
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    peak_rss_kib: int = 0
    leftover_processes: list[int] = field(default_factory=list)
    leftover_files: list[str] = field(default_factory=list)
    exit_status: int | None = None

    @property
    def runs_per_s(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

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
                              env=child_env(root))
        if done.returncode != 0:
            raise SystemExit(f"load: {' '.join(argv[1:3])} failed: {done.stderr.strip()}")
    return demo / "app.heddle", Path(f"{key}.pub")


# ------------------------------------------------------------------ the server

def start_server(args: list[str], work: Path, root: Path) -> tuple[subprocess.Popen[bytes], str]:
    argv = [str(BIN / "heddle-server"), "--host", HOST, "--port", "0", "--work-dir", str(work), *args]
    log = root / "server.log"
    with open(log, "ab") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL,
                                env=child_env(root))
    assert proc.stdout is not None
    line = proc.stdout.readline().decode("utf-8", "replace").strip()
    prefix = "heddle-server listening on "
    if not line.startswith(prefix):
        proc.kill()
        proc.wait()
        raise SystemExit(f"load: heddle-server did not start: {log.read_text(errors='replace')[-2000:]}")
    return proc, line[len(prefix):]


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

async def drive(url: str, runs: int, concurrency: int, body: dict[str, Any], result: Result) -> None:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        warm = await client.post("/v1/runs", json=body)
        if warm.status_code != 200:
            raise SystemExit(f"load: the warm-up run failed with {warm.status_code}: {warm.text[:500]}")
        counter = iter(range(runs))

        async def worker() -> None:
            for _ in counter:
                # A refused run is tried again after a short pause: the server never queues, so
                # the caller does, and every refusal is counted.
                for _attempt in range(MAX_ATTEMPTS):
                    started = time.perf_counter()
                    response = await client.post("/v1/runs", json=body)
                    elapsed = (time.perf_counter() - started) * 1000
                    if response.status_code != 429:
                        break
                    result.refused += 1
                    await asyncio.sleep(RETRY_PAUSE_S)
                if response.status_code == 200:
                    result.ok += 1
                    result.latencies_ms.append(elapsed)
                else:
                    result.failed += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.seconds = time.perf_counter() - started


def measure(server_args: list[str], body: dict[str, Any], runs: int, concurrency: int, root: Path) -> Result:
    work = root / f"work-c{concurrency}"
    work.mkdir()
    proc, url = start_server(server_args, work, root)
    result = Result(concurrency=concurrency, runs=runs)
    try:
        asyncio.run(drive(url, runs, concurrency, body, result))
        result.peak_rss_kib = peak_rss_kib(proc.pid)
        # Idle now: every tool must be gone already, not merely when the server stops.
        time.sleep(0.2)
        result.leftover_processes = tool_processes(work)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            result.exit_status = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            result.exit_status = proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    result.leftover_processes = sorted(set(result.leftover_processes) | set(tool_processes(work)))
    result.leftover_files = sorted(str(p.relative_to(work)) for p in work.iterdir())
    return result


def table(results: list[Result], *, what: str, max_concurrent: int) -> str:
    lines = [f"Served: {what}; --max-concurrent {max_concurrent}; {os.cpu_count()} CPU(s).", "",
             "| concurrency | runs | ok | 429 | other errors | runs/s | p50 ms | p99 ms | peak RSS MiB | left behind |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        left = "nothing" if r.clean else (f"{len(r.leftover_processes)} process(es), {len(r.leftover_files)} "
                                          f"file(s), exit {r.exit_status}")
        lines.append(f"| {r.concurrency} | {r.runs} | {r.ok} | {r.refused} | {r.failed} | {r.runs_per_s:.1f} | "
                     f"{r.percentile(50):.1f} | {r.percentile(99):.1f} | {r.peak_rss_kib / 1024:.1f} | {left} |")
    return "\n".join(lines)


def _levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole numbers separated by commas, e.g. 1,8") from None
    if not levels or any(not 1 <= c <= MAX_CONCURRENCY for c in levels):
        raise argparse.ArgumentTypeError(f"{text!r}: each concurrency must be 1 to {MAX_CONCURRENCY}")
    return levels


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/load", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=200, help=f"Runs per concurrency level (at most {MAX_RUNS}).")
    p.add_argument("--concurrency", type=_levels, default=[1, 8], help="Comma-separated levels [1,8].")
    p.add_argument("--max-concurrent", type=int, default=4, help="The server's --max-concurrent [4].")
    p.add_argument("--bundle", type=Path, help="Serve this bundle instead of the sealed demo.")
    p.add_argument("--trust", type=Path, action="append", default=[], help="With --bundle: a trusted key.")
    p.add_argument("--flow", type=Path, help="Serve this flow document (by flowPath) instead of a bundle.")
    p.add_argument("--tools-dir", type=Path, help="With --flow: its tools.")
    p.add_argument("--input", default='{"x": "hello"}', help="The run's input (JSON object).")
    args = p.parse_args(argv)
    if not 1 <= args.runs <= MAX_RUNS:
        p.error(f"--runs {args.runs}: give 1 to {MAX_RUNS}")
    inputs = json.loads(args.input)
    root = Path(tempfile.mkdtemp(prefix="heddle-load-"))
    try:
        if args.flow is not None:
            flows = root / "flows"
            flows.mkdir()
            shutil.copy(args.flow, flows / args.flow.name)
            server_args = ["--flows-root", str(flows)]
            if args.tools_dir:
                server_args += ["--tools-dir", str(args.tools_dir.resolve())]
            body: dict[str, Any] = {"flowPath": args.flow.name, "inputs": inputs}
            what = f"flow {args.flow}"
        else:
            if args.bundle is not None:
                bundle, trust = args.bundle.resolve(), [t.resolve() for t in args.trust]
                what = f"bundle {args.bundle}"
            else:
                bundle, key = seal_demo(root)
                trust = [key]
                what = "the sealed 3-ToolNode demo bundle (sh tools)"
            server_args = ["--bundle", str(bundle), *[a for t in trust for a in ("--trust", str(t))]]
            body = {"inputs": inputs}
        server_args += ["--max-concurrent", str(args.max_concurrent)]
        results = [measure(server_args, body, args.runs, c, root) for c in args.concurrency]
        print(table(results, what=what, max_concurrent=args.max_concurrent))
        bad = [r for r in results if not r.clean or r.failed]
        for r in bad:
            print(f"load: concurrency {r.concurrency}: {r.failed} run(s) failed; left behind "
                  f"processes {r.leftover_processes}, files {r.leftover_files}; server exit {r.exit_status}",
                  file=sys.stderr)
        return 1 if bad else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
