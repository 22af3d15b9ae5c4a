"""Blocking work off the event loop, within a named capacity per kind of work.

trio's `CapacityLimiter` idea over asyncio: each kind of blocking work (workspace copies,
store reads and writes, flow preparation) has a `Limiter` with a fixed number of tokens,
and `run_blocking(limiter, fn, ...)` runs `fn` in a worker thread once a token is free.
One kind cannot starve another (a burst of copies leaves the store its own threads), and
no kind runs more threads than its resource serves well.

The tokens are the workers of the limiter's own thread pool, so the capacity holds for
every event loop and thread in the process, and a token cannot leak: a caller cancelled
while its call waits for a worker drops the call before it starts. A thread cannot be
stopped, so a caller cancelled while its call runs waits the call out before the
cancellation goes on (with `run_blocking_undoable`, what it made is undone first): a
cancelled run leaves nothing writing behind it.

`Tasks` holds the tasks one owner (a run, a plugin host's process, a call) starts, so that
the owner's end cancels and awaits every one still running: none outlives what it worked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class Limiter:
    """A named number of tokens: at most `total_tokens` calls of this kind run at once."""

    def __init__(self, name: str, total_tokens: int) -> None:
        if total_tokens < 1:
            raise ValueError(f"limiter {name!r}: total_tokens must be at least 1")
        self.name = name
        self.total_tokens = total_tokens
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Limiter({self.name!r}, {self.total_tokens})"

    def _submit(self, call: Callable[[], T]) -> Future[T]:
        # The pool is made at first use: a kind of work a process never does costs no thread.
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.total_tokens, thread_name_prefix=f"heddle-{self.name}")
            pool = self._pool
        return pool.submit(contextvars.copy_context().run, call)


# The sizes, decided here once. The machine heddle runs on is small as often as not (2 cores
# in CI and in the usual container), and every figure below is per process, shared by all
# the runs a server holds.

# Copying mounts and tools into a workspace, copying `rw` mounts back, removing the trees:
# bound by the disk, which a few parallel copies already keep busy; more only interleave.
WORKSPACE_COPIES = Limiter("workspace-copies", 4)
# Proving a pinned program's bytes before each call of it (a stat, and a hash when it changed):
# short reads kept apart from the copies, so a tool call never waits behind a large mount.
PROGRAM_CHECKS = Limiter("program-checks", 4)
# A session store's writes: sqlite lets one writer in at a time and makes the rest wait on
# its lock, so more threads would only hold a connection each while they wait.
STORE_WRITES = Limiter("store-writes", 2)
# A session store's reads: short and parallel in every store (sqlite's WAL readers too).
STORE_READS = Limiter("store-reads", 8)
# Reading, validating and wiring a flow: CPU work under the GIL, which more threads do not
# finish sooner, beside a few short waits on a probe (the sandbox's, the egress relay's); a
# cap keeps a burst of first requests from holding many half-built flows at once.
FLOW_PREPARATION = Limiter("flow-preparation", 4)


async def run_blocking(limiter: Limiter, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`fn(*args, **kwargs)` in a worker thread of `limiter`, the loop serving everything else."""
    return await _run(limiter, functools.partial(fn, *args, **kwargs), None)


async def run_blocking_undoable(limiter: Limiter, work: Callable[[], T], undo: Callable[[T], object]) -> T:
    """`run_blocking` for work that makes something (a workspace): when the caller is cancelled
    while `work` runs, what it made is handed to `undo` (in a worker thread too) before the
    cancellation goes on, so nothing half-kept is left behind."""
    return await _run(limiter, work, undo)


async def _run(limiter: Limiter, work: Callable[[], T], undo: Callable[[T], object] | None) -> T:
    submitted = limiter._submit(work)
    waited = asyncio.wrap_future(submitted)
    try:
        return await asyncio.shield(waited)
    except asyncio.CancelledError:
        if not submitted.cancel():  # already running: it has to finish first
            await _wait_out(waited, limiter, undo)
        raise


async def _wait_out(waited: asyncio.Future[T], limiter: Limiter, undo: Callable[[T], object] | None) -> None:
    while not waited.done():
        # Cancelled again: the thread still has to finish first.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({waited})
    if undo is None or waited.cancelled() or waited.exception() is not None:
        return
    made = waited.result()
    await _wait_out(asyncio.wrap_future(limiter._submit(functools.partial(undo, made))), limiter, None)


class Tasks:
    """The tasks one owner started; `aclose` cancels and awaits those still running.

    Unlike `asyncio.TaskGroup`, neither a task's failure nor the owner's own error is turned into
    an exception group: a task's result is awaited where the owner needs it, and the owner's error
    stays the one its callers expect.
    """

    def __init__(self, log: logging.Logger | None = None) -> None:
        self._running: set[asyncio.Task[Any]] = set()
        # An owner whose tasks nobody awaits (a server's drain, its following of a tag) gives a log:
        # a task's failure is written there as it ends, not lost.
        self._log = log

    def start(self, work: Awaitable[T], *, name: str | None = None) -> asyncio.Task[T]:
        coro = work if asyncio.iscoroutine(work) else _awaited(work)
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._running.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if self._log is not None and not task.cancelled() and task.exception() is not None:
            self._log.error("task %s failed", task.get_name(), exc_info=task.exception())

    async def wait(self) -> None:
        """Wait for every task to end of itself (one started meanwhile too)."""
        while self._running:
            await asyncio.wait(set(self._running))

    async def aclose(self) -> None:
        interrupted = False
        while self._running:
            tasks = set(self._running)
            for task in tasks:
                task.cancel()
            try:
                await asyncio.wait(tasks)
            except asyncio.CancelledError:
                interrupted = True  # the tasks are still awaited: none may outlive the owner
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # a failure nobody is left to hear: retrieved, not logged as lost
        if interrupted:
            raise asyncio.CancelledError


async def _awaited(work: Awaitable[T]) -> T:
    return await work
