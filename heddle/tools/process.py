"""Running one tool call as a subprocess.

The tool gets one JSON object on stdin and prints one on stdout. Stdin is written while stdout
and stderr are read (asyncio's communicate does all three at once), so megabytes in either
direction cannot deadlock on a full pipe. The tool runs in its own process group, and a timeout
or a cancelled run kills the whole group: a tool's children must not outlive the call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from heddle.errors import ToolError

STDERR_CAP = 2000


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(data: bytes, cap: int = STDERR_CAP) -> str:
    text = data.decode("utf-8", "replace").strip()
    if len(text) > cap:
        text = "..." + text[-cap:]
    return text


def parse_output(name: str, stdout: bytes) -> dict[str, Any]:
    text = stdout.decode("utf-8", "replace").strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        preview = text[:120].replace("\n", "\\n")
        raise ToolError(
            name, f"printed invalid JSON on stdout ({exc.msg} at char {exc.pos}): {preview!r}; "
            "a tool must print one JSON object"
        ) from None
    if not isinstance(value, dict):
        raise ToolError(name, f"printed JSON {type(value).__name__}, not an object; a tool must print one JSON object")
    return value


async def run_tool_process(
    name: str,
    argv: Sequence[str],
    arguments: Mapping[str, Any],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 30.0,
) -> dict[str, Any]:
    """Run one tool call and return its JSON object output; raise ToolError on any failure."""
    payload = json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=str(cwd) if cwd else None,
            env=dict(env) if env is not None else None,
            start_new_session=True,
        )
    except PermissionError:
        raise ToolError(name, f"{argv[0]} is not executable; run chmod +x on it") from None
    except FileNotFoundError:
        raise ToolError(name, f"{argv[0]} was not found") from None
    except OSError as exc:
        hint = " (a script needs a #! line)" if exc.errno == 8 else ""
        raise ToolError(name, f"{argv[0]} could not be started: {exc.strerror}{hint}") from None
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(payload), timeout)
    except asyncio.TimeoutError:
        _kill_group(proc)
        await proc.wait()
        raise ToolError(name, f"timed out after {timeout:g} s and was killed (raise --tool-timeout if it needs longer)") from None
    except BaseException:
        # Cancellation (client gone, run timeout, Ctrl-C): the tool and its children go too.
        _kill_group(proc)
        await asyncio.shield(proc.wait())
        raise
    finally:
        # Children the tool left behind in its group must not outlive the call either.
        if proc.returncode is not None:
            _kill_group(proc)
    if proc.returncode != 0:
        detail = _tail(stderr)
        how = f"was killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exited with status {proc.returncode}"
        raise ToolError(name, f"{how}" + (f": {detail}" if detail else " and printed nothing on stderr"))
    return parse_output(name, stdout)
