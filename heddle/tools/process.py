"""Running one tool call as a subprocess.

The tool gets one JSON object on stdin and prints one on stdout. Stdin is written while stdout
and stderr are read (the event loop does all three at once), so megabytes in either
direction cannot deadlock on a full pipe.

A tool's children must not outlive the call, whatever sessions they make. On Linux each call
runs under its own reaper, a child subreaper forked for it by the reaper server
(heddle/tools/reaper.py, started once per heddle process by heddle/tools/spawner.py) that kills
everything the tool left behind once it exits (and on a timeout, a cancelled run, or heddle's
own death). Under `--safe` the sandbox's pid namespace does the same, so a sandboxed call needs
no reaper; under an egress list its sandbox also gets a network namespace of its own whose one
listener heddle holds (spawner.OwnNetwork). Elsewhere the tool's process group is killed, which a
`setsid` child escapes.

The call ends when the tool exits, not when its pipes close: what it wrote before exiting is
read for a short grace, and a process that escaped the kill and still holds a pipe is cut off.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from heddle.bounded import size_text
from heddle.engine.options import RunOptions
from heddle.errors import ToolError, ToolOverrun
from heddle.safeparse import ParseLimitError, loads_json
from heddle.surface import NEUTRAL, Surface
from heddle.tools import spawner

STDERR_CAP = 2000
# Bytes of a tool's stderr kept (its end): messages quote its tail, so more is never needed.
STDERR_KEEP = 64 * 1024
# Seconds of reading after the tool's exit: ample for what is already in the pipes, short
# enough that a process still holding them does not hold the call.
DRAIN_GRACE = 1.0
# Seconds a stopped call gives the reaper to kill the tool before killing both outright.
STOP_GRACE = 5.0

def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Call(asyncio.SubprocessProtocol):
    """One tool process: its output, its exit, and the end of its output, apart."""

    def __init__(self, loop: asyncio.AbstractEventLoop, max_out: int) -> None:
        self.out = bytearray()
        self.err = bytearray()
        self.max_out = max_out
        self.exited: asyncio.Future[None] = loop.create_future()
        self.drained: asyncio.Future[None] = loop.create_future()
        # Set when stdout passed `max_out`: the call is over, its output not kept.
        self.overflowed: asyncio.Future[None] = loop.create_future()
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 1:
            if len(self.out) + len(data) > self.max_out:
                if not self.overflowed.done():
                    self.overflowed.set_result(None)
                return
            self.out.extend(data)
            return
        self.err.extend(data)
        if len(self.err) > 2 * STDERR_KEEP:
            del self.err[:-STDERR_KEEP]

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


class _Running(Protocol):
    """A started call, however it was started."""

    def feed(self, payload: bytes) -> None:
        """Write the tool's whole input and close its stdin."""

    async def stop(self) -> None:
        """Kill the tool and what it started, and wait for that."""

    def after_exit(self) -> None:
        """What the tool's exit leaves to do before its output is drained."""

    def outcome(self, name: str, program: str, cwd: Path | None) -> int:
        """The tool's exit status (negative: killed by that signal); ToolError when it never ran."""

    def close(self) -> None:
        """Release the call's pipes and transports, while the loop runs."""


class _Grouped:
    """A process started directly, leader of a process group of its own: inside a sandbox,
    whose end takes every process in it along, or where no reaper can run."""

    def __init__(self, transport: asyncio.SubprocessTransport, call: _Call) -> None:
        self.transport, self.call = transport, call

    @classmethod
    async def start(cls, call: _Call, name: str, argv: Sequence[str], cwd: Path | None,
                    env: Mapping[str, str] | None, netns: spawner.OwnNetwork | None = None) -> _Grouped:
        """`netns`: `argv` is a bubblewrap command line, whose sandbox is given its network namespace."""
        loop = asyncio.get_running_loop()
        answer = None  # where the listener comes, for a call given its network namespace
        theirs: list[int] = []
        # heddle's own copy of the end written to let the program start: while it is open, a fork that failed
        # or died cannot let the program start by closing its copy, and heddle stops it first.
        hold: int | None = None
        if netns is not None:
            made: list[int] = []
            try:
                for _ in range(2):
                    made.extend(os.pipe())
                info_r, info_w, block_r, hold = made
                # Asked before the sandbox starts, so that the fork that makes the listener is made meanwhile.
                answer = spawner.SPAWNER.ask_listener(info_r, hold, netns.port)
            except OSError as exc:
                for fd in made:
                    os.close(fd)
                raise ToolError(name, f"its network namespace could not be made: {exc.strerror or exc}") from None
            os.close(info_r)  # the fork's now
            theirs = [info_w, block_r]
            argv = spawner.own_network_argv(argv, info_w, block_r)
        try:
            transport, _ = await loop.subprocess_exec(
                lambda: call, *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, cwd=str(cwd) if cwd else None,
                env=dict(env) if env is not None else None, start_new_session=True,
                pass_fds=theirs)
        except BaseException as exc:
            if answer is not None:
                answer.close()
            if hold is not None:
                os.close(hold)
            if isinstance(exc, OSError):
                raise _start_error(name, argv[0], exc.errno or 0, exc.strerror) from None
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        self = cls(transport, call)
        if netns is None or answer is None or hold is None:
            return self
        try:
            with answer:
                async with asyncio.timeout(spawner.PROBE_WAIT):
                    await _readable(answer.fileno())
                listener = spawner.take_listener(answer)
            await netns.adopt(listener)
        except (OSError, TimeoutError) as exc:
            await self.stop()
            self.close()
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "it took too long"
            detail = _tail(bytes(call.err))
            raise ToolError(name, f"its network namespace could not be made: {why}"
                            + (f" ({detail})" if detail else "")) from None
        except BaseException:
            await asyncio.shield(self.stop())
            self.close()
            raise
        finally:
            os.close(hold)
        return self

    def feed(self, payload: bytes) -> None:
        stdin = self.transport.get_pipe_transport(0)
        if isinstance(stdin, asyncio.WriteTransport):
            # Buffered by the transport and flushed as the tool reads; a tool that exits unread
            # just closes the pipe.
            stdin.write(payload)
            stdin.close()

    async def stop(self) -> None:
        _kill_group(self.transport.get_pid())
        await self.call.exited

    def after_exit(self) -> None:
        # Children the tool left behind in its group must not outlive the call either.
        _kill_group(self.transport.get_pid())

    def outcome(self, name: str, program: str, cwd: Path | None) -> int:
        returncode = self.transport.get_returncode()
        assert returncode is not None  # process_exited has run
        return returncode

    def close(self) -> None:
        # Closed here, while the loop runs: a transport left to the garbage collector closes
        # its pipes on a loop that may be gone.
        self.transport.close()


class _Reader(asyncio.Protocol):
    """One of a reaped call's output pipes, read into its `_Call` as a subprocess's would be."""

    def __init__(self, call: _Call, fd: int) -> None:
        self.call, self.fd = call, fd

    def data_received(self, data: bytes) -> None:
        self.call.pipe_data_received(self.fd, data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.call.pipe_connection_lost(self.fd, exc)


class _Status(asyncio.Protocol):
    """A reaped call's status pipe: the reaper's report, and by the pipe's end the call's end."""

    def __init__(self, call: _Call) -> None:
        self.call = call
        self.text = bytearray()

    def data_received(self, data: bytes) -> None:
        self.text.extend(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.call.process_exited()

    def lines(self) -> list[str]:
        return [line.strip() for line in self.text.decode("ascii", "replace").splitlines() if line.strip()]

    def reaper_pid(self) -> int | None:
        kind, _, value = (self.lines() or [""])[0].partition(" ")
        return int(value) if kind == "pid" and value.isdigit() else None


class _Reaped:
    """A call under a reaper of its own, forked by this process's reaper server."""

    def __init__(self, call: _Call, control: int) -> None:
        self.call = call
        self.control: int | None = control
        self.status = _Status(call)
        self.stdin: asyncio.WriteTransport | None = None
        self.transports: list[asyncio.BaseTransport] = []

    @classmethod
    async def start(cls, call: _Call, name: str, argv: Sequence[str], cwd: Path | None,
                    env: Mapping[str, str] | None) -> _Reaped:
        try:
            pipes = spawner.SPAWNER.spawn(argv, os.environ if env is None else env, str(cwd) if cwd else None)
        except OSError as exc:
            raise ToolError(name, f"its runner ({spawner.REAPER}) could not be started: "
                            f"{exc.strerror or exc}") from None
        self = cls(call, pipes.control)
        # Each transport closes its own file.
        files = [os.fdopen(fd, "rb" if fd != pipes.stdin else "wb", buffering=0)
                 for fd in (pipes.stdout, pipes.stderr, pipes.status, pipes.stdin)]
        loop = asyncio.get_running_loop()
        try:
            for file, protocol in zip(files, (_Reader(call, 1), _Reader(call, 2), self.status), strict=False):
                transport, _ = await loop.connect_read_pipe(lambda p=protocol: p, file)  # type: ignore[misc]
                self.transports.append(transport)
            stdin, _ = await loop.connect_write_pipe(asyncio.Protocol, files[3])
            self.transports.append(stdin)
            self.stdin = stdin
        except BaseException:
            self.close()
            for file in files:
                file.close()
            raise
        return self

    def feed(self, payload: bytes) -> None:
        assert self.stdin is not None
        self.stdin.write(payload)
        self.stdin.close()

    def _close_control(self) -> None:
        if self.control is not None:
            os.close(self.control)
            self.control = None

    async def stop(self) -> None:
        self._close_control()  # the reaper kills the tool and what it left
        try:
            await asyncio.wait_for(asyncio.shield(self.call.exited), STOP_GRACE)
            return
        except TimeoutError:
            pass
        # A reaper that did not end in time is killed with its group; one that never reported
        # has nothing to kill yet, and stops its tool as soon as it starts, its control closed.
        pid = self.status.reaper_pid()
        if pid is not None:
            _kill_group(pid)
            await self.call.exited

    def after_exit(self) -> None:
        pass  # the reaper has killed the tool's leftovers before its report

    def outcome(self, name: str, program: str, cwd: Path | None) -> int:
        kind, _, value = (self.status.lines() or [""])[-1].partition(" ")
        if kind == "exit" and value.lstrip("-").isdigit():
            return int(value)
        if value.isdigit() and kind == "exec":
            raise _start_error(name, program, int(value))
        if value.isdigit() and kind == "cwd":
            raise ToolError(name, f"its working folder {cwd} could not be entered: {os.strerror(int(value))}")
        if value.isdigit() and kind == "fork":
            raise ToolError(name, f"{program} could not be started: {os.strerror(int(value))}")
        detail = _tail(bytes(self.call.err))
        raise ToolError(name, f"its runner {spawner.REAPER} ended without a report"
                        + (f": {detail}" if detail else ""))

    def close(self) -> None:
        self._close_control()
        for transport in self.transports:
            transport.close()


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
    except ValueError as exc:  # a number that is not finite, a lone surrogate, an int too long to read
        raise ToolError(name, f"printed JSON on stdout that heddle does not read ({exc}); a tool must print one "
                              "JSON object of finite numbers and text") from None
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
    surface: Surface = NEUTRAL,
    sandboxed: bool = False,
    max_stdout: int | None = None,
    netns: spawner.OwnNetwork | None = None,
) -> dict[str, Any]:
    """Run one tool call and return its JSON object output; raise ToolError on any failure.
    `surface` names the timeout as the shell that set it takes it; `sandboxed` says `argv`
    starts a sandbox whose end takes every process in it along; `netns`, see run_process."""
    payload = json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    done = await run_process(name, argv, payload, cwd=cwd, env=env, timeout=timeout, sandboxed=sandboxed,
                             netns=netns,
                             timeout_hint=f"raise {surface.flag('tool_timeout')} if it needs longer",
                             timeout_text=surface.duration(timeout or 0), max_stdout=max_stdout,
                             stdout_hint=f"raise {surface.flag('max_tool_stdout_bytes')} if it needs more")
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
    max_stdout: int | None = None,
    stdout_hint: str = "",
    netns: spawner.OwnNetwork | None = None,
) -> Exited:
    """Run `argv` (no shell) with `stdin` as its input, to its exit, its descendants killed with it
    (see the module docstring), with exactly `env` (heddle's own environment when None);
    ToolError naming `name` when it cannot start, runs out of time (`timeout_text` says the
    limit, `timeout_hint` how to raise it) or prints more than `max_stdout` bytes on stdout
    (the run's default cap when None; `stdout_hint` how to raise it). Only the end of its stderr
    is kept (`STDERR_KEEP`). `netns`: `argv` is a bubblewrap sandbox (`sandboxed`), which is given a network
    namespace of its own whose one way out is a listener made there before the program starts and handed
    to `netns.adopt` (spawner.OwnNetwork)."""
    max_stdout = RunOptions.max_tool_stdout_bytes if max_stdout is None else max_stdout
    call = _Call(asyncio.get_running_loop(), max_stdout)
    running: _Running
    if sandboxed or netns is not None or not spawner.available():
        running = await _Grouped.start(call, name, argv, cwd, env, netns)
    else:
        running = await _Reaped.start(call, name, argv, cwd, env)
    try:
        try:
            await _converse(running, call, stdin, timeout)
        except TimeoutError:
            hint = f" ({timeout_hint})" if timeout_hint else ""
            raise ToolError(name, f"timed out after {timeout_text or f'{timeout} s'} and was killed{hint}") from None
        except _Overflowed:
            hint = f" ({stdout_hint})" if stdout_hint else ""
            raise ToolOverrun(name, f"printed more than {size_text(max_stdout)} on stdout and was killed"
                                    f"{hint}") from None
        returncode = running.outcome(name, argv[0], cwd)
    finally:
        running.close()
    return Exited(returncode, bytes(call.out), bytes(call.err))


class _Overflowed(Exception):
    """The tool printed more on stdout than the call keeps."""


async def _readable(fd: int) -> None:
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(fd, wake)
    try:
        await ready
    finally:
        loop.remove_reader(fd)


async def _converse(running: _Running, call: _Call, payload: bytes, timeout: float | None) -> None:
    """Give the tool its input, wait for its exit and its output. TimeoutError when it ran out
    of time, _Overflowed when its stdout passed the cap, killed either way."""
    running.feed(payload)
    try:
        async with asyncio.timeout(timeout):
            await asyncio.wait({call.exited, call.overflowed}, return_when=asyncio.FIRST_COMPLETED)
    except TimeoutError:
        await running.stop()
        raise
    except BaseException:
        # Cancellation (client gone, run timeout, Ctrl-C): the tool and its children go too.
        await asyncio.shield(running.stop())
        raise
    if call.overflowed.done():
        await running.stop()
        raise _Overflowed
    running.after_exit()
    try:
        await asyncio.wait_for(asyncio.shield(call.drained), DRAIN_GRACE)
    except TimeoutError:
        pass
    if call.overflowed.done():  # what it printed before its exit, drained, was over the cap
        raise _Overflowed
