"""Streaming a surface's answer: SSE frames as the run makes them, and the run stopped when the caller goes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Send

from heddle.blocking import Tasks
from heddle.server import sse
from heddle.server.body import Gone, disconnected

if TYPE_CHECKING:
    from heddle.engine.run import RunOutcome
    from heddle.server.service import Submitted


def task_of(submitted: Submitted) -> asyncio.Task[RunOutcome]:
    """The task of a run Service.submit started (it always has one)."""
    assert submitted.task is not None, "Service.submit starts the run"
    return submitted.task


async def watched(work: Awaitable[Any], receive: Receive) -> Any:
    """`work`, cancelled if the client goes away meanwhile (its run then stops)."""
    tasks = Tasks()
    task = tasks.start(work)
    gone = tasks.start(disconnected(receive))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():
            raise Gone()
        return task.result()
    finally:
        await tasks.aclose()


async def relay(updates: AsyncIterator[Any], first: Any, render: Callable[[Any], bytes], receive: Receive,
                 send: Send) -> None:
    """Send the stream's items as SSE frames as they come; stop it when the client goes."""
    await send({"type": "http.response.start", "status": 200, "headers": sse.HEADERS})
    tasks = Tasks()
    gone = tasks.start(disconnected(receive))
    step: asyncio.Task[Any] | None = None
    try:
        await send({"type": "http.response.body", "body": render(first), "more_body": True})
        while True:
            if step is None:
                step = tasks.start(anext(updates))
            done, _ = await asyncio.wait({step, gone}, timeout=sse.KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED)
            if gone in done:
                return
            if step not in done:
                # A quiet run (a long tool call): a comment keeps proxies from closing the stream.
                await send({"type": "http.response.body", "body": sse.KEEPALIVE, "more_body": True})
                continue
            try:
                item = step.result()
            except StopAsyncIteration:
                break
            step = None
            await send({"type": "http.response.body", "body": render(item), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await tasks.aclose()
        await updates.aclose()  # type: ignore[attr-defined]


async def first_item(updates: AsyncIterator[Any]) -> Any:
    """The stream's first item; the stream closed (its run stopped) if there is none or it fails."""
    try:
        return await anext(updates)
    except BaseException:
        await updates.aclose()  # type: ignore[attr-defined]
        raise
