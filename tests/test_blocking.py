"""The capacity limiters: the capacity holds, and a cancelled caller leaks neither a token nor a thread."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from heddle.blocking import Limiter, run_blocking, run_blocking_undoable

GUARD = 30  # seconds: only a broken limiter waits this long, no test measures time


def test_capacity_holds_under_concurrent_calls() -> None:
    limiter = Limiter("test", 2)
    lock = threading.Lock()
    running = peak = 0
    # Two calls meet at the barrier: with one token they never would, with three a third
    # call would run beside them and raise the peak.
    barrier = threading.Barrier(2)

    def work(i: int) -> int:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        barrier.wait(GUARD)
        with lock:
            running -= 1
        return i * i

    async def main() -> list[int]:
        return await asyncio.gather(*(run_blocking(limiter, work, i) for i in range(10)))

    assert asyncio.run(main()) == [i * i for i in range(10)]
    assert peak == 2


def test_capacity_is_shared_by_event_loops() -> None:
    limiter = Limiter("test", 1)
    lock = threading.Lock()
    running = peak = 0

    def work() -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        with lock:
            running -= 1

    def loop() -> None:
        async def main() -> None:
            await asyncio.gather(*(run_blocking(limiter, work) for _ in range(20)))

        asyncio.run(main())

    threads = [threading.Thread(target=loop) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(GUARD)
    assert peak == 1


def test_a_caller_cancelled_while_queued_drops_its_call_and_its_token() -> None:
    limiter = Limiter("test", 1)
    release = threading.Event()
    ran: list[str] = []

    def hold() -> None:
        release.wait(GUARD)
        ran.append("hold")

    async def main() -> None:
        holding = asyncio.ensure_future(run_blocking(limiter, hold))
        queued = asyncio.ensure_future(run_blocking(limiter, ran.append, "queued"))
        await asyncio.sleep(0)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        release.set()
        await holding
        # The token the cancelled call waited for is free: the next call runs.
        await run_blocking(limiter, ran.append, "next")

    asyncio.run(main())
    assert ran == ["hold", "next"]


def test_a_caller_cancelled_while_running_waits_it_out_and_undoes_it() -> None:
    limiter = Limiter("test", 1)
    started = threading.Event()
    release = threading.Event()
    events: list[str] = []

    def make() -> str:
        started.set()
        release.wait(GUARD)
        events.append("made")
        return "thing"

    async def main() -> None:
        task = asyncio.ensure_future(run_blocking_undoable(limiter, make, lambda made: events.append(f"undo {made}")))
        await asyncio.to_thread(started.wait, GUARD)
        task.cancel()
        await asyncio.sleep(0)
        task.cancel()  # cancelled twice: still waits the thread out
        await asyncio.sleep(0)
        assert not task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        events.append("cancelled")

    asyncio.run(main())
    assert events == ["made", "undo thing", "cancelled"]


def test_errors_and_context_reach_the_caller() -> None:
    limiter = Limiter("test", 1)
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var")

    def fail() -> None:
        raise OSError("disk full")

    async def main() -> str:
        var.set("caller")
        with pytest.raises(OSError, match="disk full"):
            await run_blocking(limiter, fail)
        return await run_blocking(limiter, var.get)

    assert asyncio.run(main()) == "caller"


def test_a_limiter_has_a_token() -> None:
    with pytest.raises(ValueError, match="'none'"):
        Limiter("none", 0)
