"""Running one tool call as a subprocess.

The tool gets one JSON object on stdin and prints one on stdout. Stdin is written while stdout
and stderr are read (the event loop does all three at once), so megabytes in either
direction cannot deadlock on a full pipe.

A tool's children must not outlive the call, whatever sessions they make. On Linux each call
runs under `reaper.py`, a child subreaper that kills everything the tool left behind once it
exits (and on a timeout, a cancelled run, or heddle's own death). Under `--safe` the
sandbox's pid namespace does the same, so a sandboxed call needs no reaper. Elsewhere the
tool's process group is killed, which a `setsid` child escapes.

The call ends when the tool exits, not when its pipes close: what it wrote before exiting is
read for a short grace, and a process that escaped the kill and still holds a pipe is cut off.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.errors import ToolError
from heddle.safeparse import ParseLimitError, loads_json
from heddle.surface import CLI, Surface

STDERR_CAP = 2000
# Seconds of reading after the tool's exit: ample for what is already in the pipes, short
# enough that a process still holding them does not hold the call.
DRAIN_GRACE = 1.0
# Seconds a stopped call gives the reaper to kill the tool before killing both outright.
STOP_GRACE = 5.0

REAPER = Path(__file__).with_name("reaper.py")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reaper_available() -> bool:
    return (sys.platform.startswith("linux") and bool(sys.executable)
            and not getattr(sys, "frozen", False) and REAPER.is_file())


class _Call(asyncio.SubprocessProtocol):
    """One tool process: its output, its exit, and the end of its output, apart."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.drained: asyncio.Future[None] = loop.create_future()
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        (self.out if fd == 1 else self.err).extend(data)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open and not self.drained.done():
            self.drained.set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def _start_error(name: str, program: str, code: int, strerror: str | None = None) -> ToolError:
    if code == errno.EACCES:
        return ToolError(name, f"{program} is not executable; run chmod +x on it")
    if code == errno.ENOENT:
        return ToolError(name, f"{program} was not found")
    hint = " (a script needs a #! line)" if code == errno.ENOEXEC else ""
    return ToolError(name, f"{program} could not be started: {strerror or os.strerror(code)}{hint}")


def _read_status(fd: int) -> str:
    """The reaper's report; it has exited, so the pipe holds all there will be."""
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    except BlockingIOError:
        return ""


async def _stop(transport: asyncio.SubprocessTransport, call: _Call, reaper: bool) -> None:
    """Kill a running call and wait for it: through the reaper, which takes the tool's
    descendants along, or by process group."""
    pid = transport.get_pid()
    if reaper:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            await asyncio.wait_for(asyncio.shield(call.exited), STOP_GRACE)
            return
        except TimeoutError:
            pass
    _kill_group(pid)
    await call.exited


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
        value = loads_json(text)
    except ParseLimitError as exc:
        raise ToolError(name, f"printed JSON on stdout that {exc}; print a flatter JSON object") from None
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
    surface: Surface = CLI,
    sandboxed: bool = False,
) -> dict[str, Any]:
    """Run one tool call and return its JSON object output; raise ToolError on any failure.
    `surface` names the timeout as the shell that set it takes it; `sandboxed` says `argv`
    starts a sandbox whose end takes every process in it along."""
    payload = json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    done = await run_process(name, argv, payload, cwd=cwd, env=env, timeout=timeout, sandboxed=sandboxed,
                             timeout_hint=f"raise {surface.flag('tool_timeout')} if it needs longer",
                             timeout_text=surface.duration(timeout or 0))
    if done.returncode != 0:
        detail = _tail(done.stderr)
        how = (f"was killed by signal {-done.returncode}" if done.returncode < 0
               else f"exited with status {done.returncode}")
        raise ToolError(name, f"{how}" + (f": {detail}" if detail else " and printed nothing on stderr"))
    return parse_output(name, done.stdout)


@dataclass(frozen=True)
class Exited:
    """A process that ran to its exit: its status (negative: killed by that signal) and output."""

    returncode: int
    stdout: bytes
    stderr: bytes


async def run_process(
    name: str,
    argv: Sequence[str],
    stdin: bytes,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 30.0,
    sandboxed: bool = False,
    timeout_hint: str = "",
    timeout_text: str = "",
    exact_env: bool = False,
) -> Exited:
    """Run `argv` (no shell) with `stdin` as its input, to its exit, its descendants killed with it
    (see the module docstring); ToolError naming `name` when it cannot start or runs out of time
    (`timeout_text` says the limit, `timeout_hint` how to raise it). `exact_env`: the program gets
    `env` and nothing more, not even the LC_CTYPE the reaper's Python sets where there is no locale."""
    loop = asyncio.get_running_loop()
    reaper = not sandboxed and _reaper_available()
    command = list(argv)
    status_read = status_write = -1
    if reaper:
        status_read, status_write = os.pipe()
        unset = ["-u", "LC_CTYPE"] if exact_env and env is not None and "LC_CTYPE" not in env else []
        command = [sys.executable, "-I", "-S", str(REAPER), str(status_write), str(os.getpid()), *unset, "--",
                   *argv]
    try:
        try:
            transport, call = await loop.subprocess_exec(
                lambda: _Call(loop),
                *command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                cwd=str(cwd) if cwd else None,
                env=dict(env) if env is not None else None,
                start_new_session=True,
                pass_fds=(status_write,) if reaper else (),
            )
        except OSError as exc:
            raise _start_error(name, command[0], exc.errno or 0, exc.strerror) from None
        finally:
            if status_write >= 0:
                os.close(status_write)
        try:
            returncode = await _converse(transport, call, stdin, timeout, reaper)
        except TimeoutError:
            hint = f" ({timeout_hint})" if timeout_hint else ""
            raise ToolError(name, f"timed out after {timeout_text or f'{timeout} s'} and was killed{hint}") from None
        finally:
            # Closed here, while the loop runs: a transport left to the garbage collector
            # closes its pipes on a loop that may be gone.
            transport.close()
        if reaper:
            returncode = _reaper_outcome(name, argv[0], _read_status(status_read), returncode, call)
    finally:
        if status_read >= 0:
            os.close(status_read)
    return Exited(returncode, bytes(call.out), bytes(call.err))


async def _converse(transport: asyncio.SubprocessTransport, call: _Call, payload: bytes,
                    timeout: float | None, reaper: bool) -> int:
    """Give the tool its input, wait for its exit and its output; its exit status.
    TimeoutError when it ran out of time, killed."""
    stdin = transport.get_pipe_transport(0)
    if isinstance(stdin, asyncio.WriteTransport):
        # Buffered by the transport and flushed as the tool reads; a tool that exits unread
        # just closes the pipe.
        stdin.write(payload)
        stdin.close()
    try:
        await asyncio.wait_for(asyncio.shield(call.exited), timeout)
    except TimeoutError:
        await _stop(transport, call, reaper)
        raise
    except BaseException:
        # Cancellation (client gone, run timeout, Ctrl-C): the tool and its children go too.
        await asyncio.shield(_stop(transport, call, reaper))
        raise
    if not reaper:
        # Children the tool left behind in its group must not outlive the call either.
        _kill_group(transport.get_pid())
    try:
        await asyncio.wait_for(asyncio.shield(call.drained), DRAIN_GRACE)
    except TimeoutError:
        pass
    returncode = transport.get_returncode()
    assert returncode is not None  # process_exited has run
    return returncode


def _reaper_outcome(name: str, program: str, status: str, returncode: int, call: _Call) -> int:
    """The tool's exit status from the reaper's report."""
    kind, _, value = status.partition(" ")
    if kind == "exit" and value.lstrip("-").isdigit():
        return int(value)
    if kind == "exec" and value.isdigit():
        raise _start_error(name, program, int(value))
    detail = _tail(bytes(call.err))
    raise ToolError(name, f"its runner {REAPER} ended without a report (exit status {returncode})"
                    + (f": {detail}" if detail else ""))
