"""Run the real `heddle model serve` for a test.

    with scripted_model([{"content": "hi"}], tmp_path) as m:
        ...  # point a flow or a ModelClient at m.url
        assert m.requests()[0]["body"]["stream"] is True

The server is a separate process, started the way a user starts it, and stopped by PID.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

READY_TIMEOUT_S = 20.0


def serve_command() -> list[str]:
    """The argv prefix that runs `heddle model serve` with the interpreter running the tests."""
    return [sys.executable, "-m", "heddle", "model", "serve"]


@dataclass
class ScriptedModelProcess:
    url: str  # base URL, ending in /v1
    process: subprocess.Popen[bytes]
    record_path: Path
    stderr_path: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1].split("/", 1)[0])

    def requests(self) -> list[dict[str, Any]]:
        """Every request the server has received so far: {"path", "headers", "body"}."""
        if not self.record_path.exists():
            return []
        lines = self.record_path.read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")


def _read_line(process: subprocess.Popen[bytes], deadline: float) -> bytes:
    assert process.stdout is not None
    fd = process.stdout.fileno()
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            break
        piece = os.read(fd, 4096)
        if not piece:
            break
        data += piece
    return data


def start_scripted_model(script: list[dict[str, Any]] | Path, tmp_path: Path,
                         extra_args: list[str] | None = None) -> ScriptedModelProcess:
    """Start the server and wait for its URL line. The caller stops it with `stop()`."""
    workdir = Path(tempfile.mkdtemp(prefix="scripted-model-", dir=tmp_path))
    if isinstance(script, Path):
        script_path = script
    else:
        script_path = workdir / "script.json"
        script_path.write_text(json.dumps(script, ensure_ascii=False), encoding="utf-8")
    record_path = workdir / "requests.jsonl"
    stderr_path = workdir / "stderr.txt"
    argv = [*serve_command(), "--script", str(script_path), "--record", str(record_path), *(extra_args or [])]
    with open(stderr_path, "wb") as stderr:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr,
                                   cwd=workdir)
    line = _read_line(process, time.monotonic() + READY_TIMEOUT_S)
    url = line.decode("utf-8", "replace").strip()
    if not url.startswith("http://"):
        stop(process)
        raise RuntimeError(f"`heddle model serve` did not print its URL (got {line!r}); "
                           f"exit {process.returncode}; stderr: {stderr_path.read_text(errors='replace')[-2000:]}")
    return ScriptedModelProcess(url=url, process=process, record_path=record_path, stderr_path=stderr_path)


def stop(process: subprocess.Popen[bytes]) -> int:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    if process.stdout is not None:
        process.stdout.close()
    return process.returncode


@contextmanager
def scripted_model(script: list[dict[str, Any]] | Path, tmp_path: Path,
                   extra_args: list[str] | None = None) -> Iterator[ScriptedModelProcess]:
    model = start_scripted_model(script, tmp_path, extra_args)
    try:
        yield model
    finally:
        stop(model.process)
