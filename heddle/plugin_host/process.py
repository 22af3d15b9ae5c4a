"""One plugin process: started on its first call, spoken to in JSON Lines, restarted after a crash.

Calls are multiplexed by id, so runs share one process. A call whose process says nothing
(no answer, no partial, no request acting for it) for longer than the timeout is given up
and the process killed. When the process dies, every call in flight fails with the last
lines it wrote on stderr, and the next call starts it again.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.blocking import Tasks
from heddle.plugin_host import protocol
from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.launch import Launch
from heddle.surface import NEUTRAL, Surface

if TYPE_CHECKING:
    from heddle.workspace.egress_proxy import EgressCall

# Answers a plugin's request (method, params); raising CallbackError answers with an error.
Handler = Callable[[str, dict[str, Any]], Awaitable[Any]]
OnPartial = Callable[[Any], None]

STDERR_LINES = 20
SHUTDOWN_GRACE_S = 2.0
# Starting an interpreter is not silence: init may take this long even under a shorter timeout.
START_TIMEOUT_S = 10.0


class CallbackError(Exception):
    """Raised by a handler: the plugin's request is answered with this message."""


class PluginCallError(Exception):
    """The plugin answered a call with `{"error": {"message}}`."""


@dataclass
class _Pending:
    method: str
    future: asyncio.Future[Any]
    handler: Handler | None
    on_partial: OnPartial | None
    last_heard: float
    busy: int = 0  # our answers to the plugin's requests for this call still being worked out
    answers: Tasks = field(default_factory=Tasks)  # those answers: the call's end stops them

    def touch(self) -> None:
        self.last_heard = asyncio.get_running_loop().time()


@dataclass
class _Running:
    """One started process and the calls in flight on it."""

    proc: asyncio.subprocess.Process
    stderr: collections.deque[str] = field(default_factory=lambda: collections.deque(maxlen=STDERR_LINES))
    pending: dict[int, _Pending] = field(default_factory=dict)
    readers: tuple[asyncio.Task[None], ...] = ()
    dead: bool = False
    killed: bool = False  # set the moment heddle kills it, before its reader notices the exit
    reason: str | None = None  # why heddle killed it, when it did
    ended: str | None = None  # how it ended, with "{method}" for the call it ended during
    # What lives as long as the process: its egress proxy, when it has one.
    closing: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)

    @property
    def usable(self) -> bool:
        return not (self.dead or self.killed)

    def kill(self, reason: str | None = None) -> None:
        if reason and self.reason is None:
            self.reason = reason
        # A call made now must start a new process, not write to this dying one.
        self.killed = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)

    def write(self, line: bytes) -> None:
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            return
        with contextlib.suppress(ConnectionError, RuntimeError):
            stdin.write(line)

    def last_stderr(self, lines: int = 6) -> str:
        tail = [line for line in list(self.stderr)[-lines:] if line.strip()]
        return " | ".join(tail)


class PluginProcess:
    """A plugin's process, as calls: `await call(method, params)` starts it when needed."""

    def __init__(self, name: str, launch: Callable[..., Launch], *, timeout: float, capabilities: frozenset[str],
                 surface: Surface = NEUTRAL, max_line: int = protocol.MAX_LINE,
                 egress: Callable[[], contextlib.AbstractAsyncContextManager[EgressCall]] | None = None) -> None:
        self.name = name
        # Each process's egress proxy (heddle.workspace.egress_proxy), opened before it starts and handed to
        # `launch`, closed when it ends.
        self._egress = egress
        # The longest line heddle reads from it: a session store's answers carry whole records.
        self.max_line = max_line
        self._launch = launch
        self.timeout = timeout
        self.surface = surface  # whose units the silence limit is reported in
        self.capabilities = capabilities
        self._running: _Running | None = None
        self._start_lock = asyncio.Lock()
        # The readers of every process started: the host's close (ours) stops those still running.
        self._tasks = Tasks()
        self._next_id = 0
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self._running is not None and self._running.usable

    @property
    def pid(self) -> int | None:
        return self._running.proc.pid if self.alive else None  # type: ignore[union-attr]

    # ---------------------------------------------------------------- calls

    async def call(self, method: str, params: dict[str, Any], *, handler: Handler | None = None,
                   on_partial: OnPartial | None = None) -> Any:
        """Ask the plugin `method` and return its result; PluginError on any failure of the process,
        PluginCallError when the plugin answered with an error."""
        running = await self._ensure_started()
        return await self._call(running, method, params, handler, on_partial)

    async def _call(self, running: _Running, method: str, params: dict[str, Any], handler: Handler | None,
                    on_partial: OnPartial | None, timeout: float | None = None) -> Any:
        loop = asyncio.get_running_loop()
        timeout = self.timeout if timeout is None else timeout
        self._next_id += 1
        call_id = self._next_id
        if not running.usable:
            ended = running.ended or (f"was stopped: {running.reason}" if running.reason else "has stopped")
            raise PluginError(self.name, ended.replace("{method}", repr(method)))
        pending = _Pending(method, loop.create_future(), handler, on_partial, loop.time())
        running.pending[call_id] = pending
        try:
            running.write(protocol.request(call_id, method, params))
            while True:
                if pending.busy:
                    wait = timeout  # heddle is answering the plugin: the plugin is not silent
                else:
                    wait = timeout - (loop.time() - pending.last_heard)
                    if wait <= 0:
                        message = (f"call {method!r} was silent for more than {self.surface.duration(timeout)} "
                                   f"({self.surface.flag('plugin_timeout')}); it was cancelled and the process killed")
                        running.kill(f"killed because {message}")
                        raise PluginError(self.name, message)
                try:
                    return await asyncio.wait_for(asyncio.shield(pending.future), wait)
                except TimeoutError:
                    continue
        finally:
            running.pending.pop(call_id, None)
            if not pending.future.done():
                pending.future.cancel()
            await pending.answers.aclose()

    # ---------------------------------------------------------------- life

    async def _ensure_started(self) -> _Running:
        if self._running is not None and self._running.usable:
            return self._running
        async with self._start_lock:
            if self._running is not None and self._running.usable:
                return self._running
            running = await self._spawn()
            try:
                answer = await self._call(running, "init", {"protocol": protocol.PROTOCOL_VERSION,
                                                             "capabilities": sorted(self.capabilities)}, None, None,
                                          timeout=max(self.timeout, START_TIMEOUT_S))
            except PluginCallError as exc:
                running.kill()
                raise PluginError(self.name, f"refused init: {exc}") from None
            except BaseException:
                running.kill()
                raise
            version = answer.get("protocol") if isinstance(answer, dict) else None
            if version != protocol.PROTOCOL_VERSION:
                running.kill()
                raise PluginError(self.name, f"answered init with protocol {version!r}; heddle speaks protocol "
                                             f"{protocol.PROTOCOL_VERSION}, answer {{\"protocol\": 1}}")
            self._running = running
            return running

    async def _spawn(self) -> _Running:
        closing = contextlib.AsyncExitStack()
        try:
            if self._egress is not None:
                launch = self._launch(await closing.enter_async_context(self._egress()))
            else:
                launch = self._launch()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *launch.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, cwd=str(launch.cwd), env=launch.env,
                    start_new_session=True, limit=self.max_line,
                )
            except FileNotFoundError:
                raise PluginError(self.name, f"cannot start {launch.argv[0]}: not found") from None
            except PermissionError:
                raise PluginError(self.name, f"cannot start {launch.argv[0]}: not executable; run chmod +x on "
                                             "it") from None
            except OSError as exc:
                hint = " (a script needs a #! line)" if exc.errno == 8 else ""
                raise PluginError(self.name, f"cannot start {launch.argv[0]}: {exc.strerror}{hint}") from None
        except BaseException:
            await closing.aclose()
            raise
        self.starts += 1
        running = _Running(proc, closing=closing)
        err = self._tasks.start(self._read_stderr(running))
        out = self._tasks.start(self._read_stdout(running, err))
        running.readers = (err, out)
        return running

    async def _read_stderr(self, running: _Running) -> None:
        assert running.proc.stderr is not None
        with contextlib.suppress(ConnectionError):
            while True:
                try:
                    raw = await running.proc.stderr.readline()
                except ValueError:
                    # A line past the cap is dropped (the reader drops it too) and reading goes on:
                    # a stderr pipe left unread would block the plugin.
                    dropped = f"(a line longer than {self.max_line} bytes)"
                    if not running.stderr or running.stderr[-1] != dropped:
                        running.stderr.append(dropped)
                    continue
                if not raw:
                    break
                running.stderr.append(raw.decode("utf-8", "replace").rstrip()[:500])

    async def _read_stdout(self, running: _Running, stderr_task: asyncio.Task[None]) -> None:
        assert running.proc.stdout is not None
        try:
            while True:
                try:
                    line = await running.proc.stdout.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    running.kill(f"wrote a line longer than {self.max_line} bytes")
                    break
                if not line:
                    break
                if not line.strip():
                    continue
                try:
                    message = protocol.decode(line)
                except protocol.ProtocolViolation as exc:
                    running.kill(str(exc))
                    break
                self._dispatch(running, message)
        finally:
            await self._ended(running, stderr_task)

    async def _ended(self, running: _Running, stderr_task: asyncio.Task[None]) -> None:
        running.dead = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(running.proc.pid, signal.SIGKILL)  # children it left must not outlive it
        code = await running.proc.wait()
        await running.closing.aclose()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(stderr_task), 1.0)
        tail = running.last_stderr()
        if running.reason:
            what = "was stopped during {method}: " + running.reason
        elif code < 0:
            what = f"was killed by signal {-code} during " + "{method}"
        else:
            what = f"exited with status {code} during " + "{method}"
        if tail:
            what += f"; its last stderr lines: {tail}"
        elif not running.reason:
            what += "; it printed nothing on stderr"
        running.ended = what
        for pending in list(running.pending.values()):
            if not pending.future.done():
                pending.future.set_exception(PluginError(self.name, what.replace("{method}", repr(pending.method))))

    # ---------------------------------------------------------------- messages from the plugin

    def _dispatch(self, running: _Running, message: protocol.Message) -> None:
        if isinstance(message, protocol.Answer):
            pending = running.pending.get(message.id)  # type: ignore[arg-type]
            if pending is None or pending.future.done():
                return  # a call given up on (cancelled, timed out): its late answer is dropped
            if message.error is not None:
                pending.future.set_exception(PluginCallError(message.error))
            else:
                pending.future.set_result(message.result)
        elif isinstance(message, protocol.Partial):
            pending = running.pending.get(message.id)  # type: ignore[arg-type]
            if pending is not None and not pending.future.done():
                pending.touch()
                if pending.on_partial is not None:
                    try:
                        pending.on_partial(message.value)
                    except Exception as exc:  # noqa: BLE001 - a bad partial fails its call, not the reader
                        pending.future.set_exception(PluginError(self.name, f"sent a partial heddle cannot use: {exc}"))
        else:
            self._request(running, message)

    def _request(self, running: _Running, request: protocol.Request) -> None:
        method, params = request.method, request.params
        if method not in protocol.PLUGIN_METHODS:
            allowed = ", ".join(protocol.PLUGIN_METHODS)
            running.write(protocol.failure(request.id, f"unknown method {method!r}; a plugin may call {allowed}"))
            return
        if method not in self.capabilities:
            running.write(protocol.failure(
                request.id, f"{method}: this plugin was not granted the {method!r} capability; "
                            f"list it in the manifest's capabilities"))
            return
        target = params.get("for")
        pending = running.pending.get(target) if isinstance(target, int) and not isinstance(target, bool) else None
        if pending is None or pending.handler is None or pending.future.done():
            running.write(protocol.failure(
                request.id, f"{method}: params.for must name the heddle call this acts for, one still in flight "
                            f"(got {target!r})"))
            return
        pending.busy += 1
        pending.touch()
        pending.answers.start(self._answer(running, request, pending))

    async def _answer(self, running: _Running, request: protocol.Request, pending: _Pending) -> None:
        assert pending.handler is not None
        try:
            result = await pending.handler(request.method, request.params)
        except CallbackError as exc:
            running.write(protocol.failure(request.id, str(exc)))
        except asyncio.CancelledError:
            running.write(protocol.failure(request.id, f"{request.method}: cancelled"))
            raise
        except Exception as exc:  # noqa: BLE001 - the plugin hears every failure as an error answer
            running.write(protocol.failure(request.id, f"{request.method}: {exc}"))
        else:
            try:
                running.write(protocol.answer(request.id, result))
            except (TypeError, ValueError) as exc:
                running.write(protocol.failure(request.id, f"{request.method}: the result is not JSON ({exc})"))
        finally:
            pending.busy -= 1
            pending.touch()

    # ---------------------------------------------------------------- stopping

    async def close(self) -> None:
        """Ask the process to shut down, then make sure it and its children are gone."""
        running, self._running = self._running, None
        try:
            if running is not None:
                await self._stop(running)
        finally:
            await self._tasks.aclose()

    async def _stop(self, running: _Running) -> None:
        if not running.dead:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._call(running, "shutdown", {}, None, None), SHUTDOWN_GRACE_S)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(running.proc.wait(), SHUTDOWN_GRACE_S)
        running.kill()
        # The readers see the exit and fail the calls still in flight with it; the rest are cancelled.
        for task in running.readers:
            if not task.done():
                with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                    await asyncio.wait_for(asyncio.shield(task), 1.0)
        await running.closing.aclose()
