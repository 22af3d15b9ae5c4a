"""An MCP server over stdio, each message it prints read within a cap.

The `mcp` package's own stdio client reads a server's stdout a line at a time with no bound on a
line: a server printing one endless line would grow the run's memory without limit. Here stdout
is read in chunks of at most 64 KiB and split into lines (one JSON-RPC message each) here; a line
longer than the cap is refused before it is held whole: the message is put in `overruns`, the
server is killed, and the session's pending requests fail at once (each request still waits no
longer than its own deadline: the call's timeout, the session's `read_timeout_seconds`). Memory
stays within the cap plus one chunk.

Stopping follows the MCP specification's order: stdin closed, a grace period, SIGTERM, then
SIGKILL to the server's process group, children included (it starts in a session of its own).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from anyio.abc import Process

# Time the server has to exit after its stdin closes, and after SIGTERM.
GRACE_S = 2.0
# Time the session's last messages have to be written before stdin closes.
FLUSH_S = 0.5


class LineOverrun(Exception):
    """A line of the server's stdout past the cap."""


class _Lines:
    """The lines (newline left out) of a stream fed in chunks, none held past `cap` bytes."""

    def __init__(self, cap: int, overrun: str) -> None:
        self._cap, self._overrun = cap, overrun
        self._pending = bytearray()

    def feed(self, chunk: bytes) -> Iterator[bytearray]:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            stop = len(chunk) if end < 0 else end
            if len(self._pending) + stop - start > self._cap:
                self._pending = bytearray()
                raise LineOverrun(self._overrun)
            self._pending += chunk[start:stop]
            if end < 0:
                return
            yield self._take()
            start = end + 1

    def _take(self) -> bytearray:
        # Handed on, not copied, and not held here once handed on.
        line, self._pending = self._pending, bytearray()
        return line


@contextlib.asynccontextmanager
async def stdio_streams(argv: list[str], *, env: dict[str, str], cwd: str, errlog: TextIO, cap: int,
                        overrun: str, overruns: list[str]) -> AsyncIterator[tuple[Any, Any]]:
    """Start `argv` (with exactly `env`, in `cwd`, its stderr to `errlog`) and yield the read and write
    streams a `mcp.ClientSession` takes. A line over `cap` bytes puts `overrun` (the one-line error)
    in `overruns`, ends the session's read stream (its pending requests fail) and kills the server."""
    import anyio
    import mcp_types
    from mcp.shared.message import SessionMessage

    process = await anyio.open_process(argv, env=env, cwd=cwd, stderr=errlog, start_new_session=True)
    # No await from the start to the task group: a cancellation there would leave the server running.
    to_session, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, from_session = anyio.create_memory_object_stream[SessionMessage](0)
    written, drained = anyio.Event(), anyio.Event()

    async def read() -> None:
        assert process.stdout is not None
        lines = _Lines(cap, overrun)
        try:
            async with to_session:
                async for chunk in process.stdout:  # at most 64 KiB at a time
                    for line in lines.feed(chunk):
                        if not line.strip():
                            continue
                        try:
                            item: SessionMessage | Exception = SessionMessage(
                                mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False))
                        except ValueError as exc:  # the session hands a line it cannot read to its handler
                            item = exc
                        del line
                        await to_session.send(item)
        except LineOverrun as exc:
            # Closing the stream (above) fails the pending requests now; a stream cut mid-message
            # cannot go on, so the server is stopped too.
            overruns.append(str(exc))
            _signal(process, signal.SIGKILL)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass  # the session is gone, or the stream was closed under the read
        try:
            # Read on to the end and drop it: a server blocked writing its stdout could not see its
            # stdin's end and exit; and at the pipe's end its transport closes.
            with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                async for _ in process.stdout:
                    pass
        finally:
            drained.set()

    async def write() -> None:
        assert process.stdin is not None
        try:
            async with from_session:
                async for message in from_session:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send(data.encode() + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            # The server stopped reading: the session sees the connection end instead of waiting.
            await to_session.aclose()
        finally:
            written.set()

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(read)
        tasks.start_soon(write)
        try:
            yield read_stream, write_stream
        finally:
            # Shielded: a cancelled run still stops its server (every wait here is bounded).
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(FLUSH_S):
                    await written.wait()
                await _stop(process)
                # A child it left may hold its stdout open: it is not waited for long.
                with anyio.move_on_after(GRACE_S):
                    await drained.wait()
            tasks.cancel_scope.cancel()


async def _stop(process: Process) -> None:
    import anyio

    assert process.stdin is not None
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        await process.stdin.aclose()
    if not await _exited(process, GRACE_S):
        _signal(process, signal.SIGTERM)
        await _exited(process, GRACE_S)
    # Whatever is left of its group (what it started too) does not outlive it.
    _signal(process, signal.SIGKILL)
    await _exited(process, GRACE_S)


def _signal(process: Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


async def _exited(process: Process, within: float) -> bool:
    """Whether the server exited within `within` seconds. Its return code is watched, not `wait()`:
    that also waits for the pipes' end, which a child it left may hold open."""
    import anyio

    with anyio.move_on_after(within):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None
