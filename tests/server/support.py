"""Start the real `heddle-server` for a test, talk to it over HTTP, stop it by PID."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from tests.support.cli import env_with
from tests.support.scripted_model import _read_line
from tests.support.server_thread import Reachable

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
SERVER = BIN / "heddle-server"
READY_TIMEOUT_S = 20.0


@dataclass
class Server(Reachable):
    url: str
    process: subprocess.Popen[bytes]
    stderr_path: Path

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        os.kill(self.process.pid, sig)

    def wait(self, timeout: float = 20) -> int:
        return self.process.wait(timeout=timeout)

    def stop(self) -> int | None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode




def start_server(tmp_path: Path, *args: Any, env: dict[str, str] | None = None,
                 wrap: tuple[str, ...] = ()) -> Server:
    """Start `heddle-server --port 0 ARGS` and wait until it prints the URL it listens on.
    `wrap` goes before the command (e.g. a shell that lowers a limit, then execs it)."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    stderr_path = tmp_path / f"server-{time.monotonic_ns()}.err"
    argv = [*wrap, str(SERVER), "--port", "0", *[str(a) for a in args]]
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                   env=env_with(env), cwd=tmp_path)
    line = _read_line(process, time.monotonic() + READY_TIMEOUT_S).decode("utf-8", "replace").strip()
    prefix = "heddle-server listening on "
    if not line.startswith(prefix):
        code = process.poll()
        if code is None:
            process.kill()
            process.wait()
        raise AssertionError(f"heddle-server did not start (exit {process.returncode}, stdout {line!r}); "
                             f"stderr: {stderr_path.read_text(errors='replace')[-3000:]}")
    return Server(url=line[len(prefix):], process=process, stderr_path=stderr_path)


def run_server_to_exit(tmp_path: Path, *args: Any, env: dict[str, str] | None = None,
                       timeout: float = 30, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """Run a `heddle-server` that is expected to refuse to start."""
    argv = [*wrap, str(SERVER), "--port", "0", *[str(a) for a in args]]
    return subprocess.run(argv, capture_output=True, text=True, env=env_with(env), cwd=tmp_path,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def sse_frames(text: str) -> list[tuple[str, Any]]:
    """(event, data) for every frame of a Server-Sent Events body; comments are skipped."""
    frames = []
    for block in text.split("\n\n"):
        event, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                event = line[len("event: "):]
            elif line.startswith("data: "):
                data.append(line[len("data: "):])
        if event is not None:
            frames.append((event, json.loads("\n".join(data))))
    return frames


def raw_request(port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
                ) -> socket.socket:
    """Send one request on a plain socket and return the socket, so a test can hang up mid-run."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json",
             f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
    return sock


def wait_for_file(path: Path, timeout: float = 15) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text().strip()
            if text:
                return text
        time.sleep(0.02)
    raise AssertionError(f"{path} did not appear within {timeout} s")


def process_gone(pid: int) -> bool:
    """True once `pid` no longer exists (a zombie still counts as there: nobody reaped it)."""
    return not Path(f"/proc/{pid}").exists()


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process_gone(pid):
            return True
        time.sleep(0.02)
    return process_gone(pid)


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text, e.g. metric(t, "heddle_runs_rejected_total", 'reason="busy"')."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        if key == wanted:
            return float(value)
    raise AssertionError(f"no sample {wanted} in the metrics")


CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def fuzz(server: Server, tmp_path: Path, token: str, examples: int = 5,
         *extra: str) -> subprocess.CompletedProcess[str]:
    """Run schemathesis against the server's own /openapi.json (bounded, seeded, derandomized).

    Every operation the document lists is fuzzed, in both modes (about three cases an operation at
    5 examples: valid bodies that run, and bodies that break the schema and must be a 4xx). The
    generation is derandomized, so every suite run sends the same requests and a failure reproduces
    (and no example database: nothing a past run found changes what this one sends); a longer
    search passes `examples`. One worker: with two, the generator's own threads now and then crash
    inside CPython's parser while describing a strategy (an "AST constructor recursion depth
    mismatch" SystemError), a failure of the tool, not of heddle. Hypothesis's tables of Unicode
    characters by category and codec, the same for every run, are kept in pytest's cache folder of
    the checkout, as tests/conftest.py keeps bytecode: made afresh in each test's folder, they cost
    more CPU than the fuzzing itself.
    """
    tables = REPO / ".pytest_cache" / f"hypothesis-{os.getuid()}"
    argv = [str(BIN / "schemathesis"), "run", f"{server.url}/openapi.json", "--header",
            f"Authorization: Bearer {token}", "--checks", CHECKS, "--phases", "examples,fuzzing",
            "--mode", "all", "--max-examples", str(examples), "--seed", "20240601", "--generation-deterministic",
            "--no-shrink", "--workers", "1", "--request-timeout", "30", "--report-dir", str(tmp_path / "report"),
            *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          stdin=subprocess.DEVNULL, env={**os.environ, "HYPOTHESIS_STORAGE_DIRECTORY": str(tables)})


def in_process(service: Any, test: Any) -> None:
    """`test(client)` against `service`'s app through the ASGI interface (no socket, no process), the
    service closed after, as the server closes it."""
    import asyncio

    import httpx

    from heddle.server.app import build_app

    async def main() -> None:
        try:
            transport = httpx.ASGITransport(app=build_app(service))
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                await test(client)
        finally:
            await service.aclose()

    asyncio.run(main())
