"""Running one admitted job for its HTTP caller, as one JSON answer or as a stream of events.

The run is a task of its own, watched together with the connection: when the caller goes
away the task is cancelled, which aborts model calls and kills the tools' process groups.
When the server cancels it (drain timeout, second signal) the caller hears 503. A stream's
status line waits for the run's first event, so that what is refused before the run starts
(a session that does not exist, an answer to nothing) is answered with its own status.

A run in a session is one turn of heddle.sessions.turn: its last event (`flow_complete`, or
`waiting` when it stopped to wait for a person) is held back until the turn is written, so a
caller never sees an end that a conflicting write then took back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias

from starlette.types import Receive, Scope, Send

from heddle.blocking import Tasks
from heddle.server import sse
from heddle.server.admission import Ticket
from heddle.server.body import disconnected
from heddle.server.errors import CANCELLED, json_answer, run_failure
from heddle.server.service import Job, Service

if TYPE_CHECKING:
    from heddle.engine.events import Event, EventSink
    from heddle.engine.run import RunOutcome
    from heddle.plugin_host.manifest import Component

# The run's task answers the final state and outputs; its queue carries events (or an encoder's text) and _DONE.
RunTask: TypeAlias = "asyncio.Task[RunOutcome]"
Items = asyncio.Queue[Any]

log = logging.getLogger("heddle.server")

_DONE = object()
_HOLD = object()  # on an encoder's queue: what follows renders the end of a run in a session


def _ignore(event: Event) -> None:
    pass


async def _settle(task: asyncio.Task[Any]) -> None:
    """Wait for a task to finish without taking on its exception or cancellation."""
    if not task.done():
        await asyncio.wait({task})


def _outcome(run: RunTask) -> str:
    if run.cancelled():
        return "cancelled"
    return "error" if run.exception() is not None else "ok"


def _reason(run: RunTask) -> str:
    failure = None if run.cancelled() else run.exception()
    return "cancelled" if failure is None else str(run_failure(failure)[1]["error"]["message"])



class RunResponse:
    """An ASGI response that runs the job while it answers."""

    def __init__(self, service: Service, job: Job, ticket: Ticket, *, stream: bool,
                 encoder: Component | None = None) -> None:
        self.service = service
        self.job = job
        self.ticket = ticket
        self.stream = stream
        self.encoder = encoder  # an encoder plugin's component: the run is rendered in its protocol
        self.started = asyncio.Event()  # the run emitted its first event
        self.last: Event | None = None  # a session run's last event, sent once its turn is written

    def _sink(self, queue: Items | None, *, rendered: Items | None = None) -> EventSink:
        from heddle.engine import events as ev

        job = self.job

        def deliver(event: Event) -> None:
            self.started.set()
            if job.session is not None and isinstance(event, (ev.FlowComplete, ev.Waiting)):
                self.last = event
                if rendered is not None:
                    rendered.put_nowait(_HOLD)
                return
            if queue is not None:
                queue.put_nowait(event)

        return deliver

    def _start(self, queue: Items | None, *, rendered: Items | None = None) -> RunTask:
        from heddle.engine.seams import Rendering

        rendering = None
        if self.encoder is not None:
            assert rendered is not None, "an encoder needs somewhere to write"
            assert self.encoder.protocol is not None, "an encoder names its protocol"
            rendering = Rendering(self.encoder.protocol, rendered.put_nowait)
        return self.service.start(self.job, self.ticket, self._sink(queue, rendered=rendered), rendering=rendering)

    def _last_frame(self, run: RunTask) -> bytes:
        """A session run's last event, once its turn is written: `flow_complete` with the session,
        or `waiting` with the answer a buffered request gets."""
        last = self.last
        session = self.job.session
        if last is None or session is None:
            return b""
        data = {**last.to_dict(), "session": session.session_id}
        outcome = run.result()
        if outcome.waiting is not None:
            data.update(self.job.answer(outcome))
        return sse.frame(last.type, data)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        outcome = "error"
        self.service.metrics.run_accepted()
        try:
            if self.encoder is not None:
                outcome = await self._encoded(receive, send)
            elif self.stream:
                outcome = await self._streamed(receive, send)
            else:
                outcome = await self._answered(receive, send)
        finally:
            await self._finish()
            self.service.metrics.run_finished(outcome, time.perf_counter() - started)

    async def _finish(self) -> None:
        """Free the slot and remove the run's folder. Called before the last bytes go out, so a
        caller that has its answer can count on both; safe to call again."""
        try:
            await self.job.aclose()
        finally:
            self.ticket.release()

    async def _watch(self, run: RunTask, receive: Receive) -> bool:
        """Wait for the run to end; True if the client left first (the run is then cancelled).

        The client is watched from the end of the run's first step: until then the loop runs
        nothing else, so nothing could be heard sooner (a disconnect meanwhile is still heard, as
        the connection keeps it), and a run that ends within that step needs no watcher at all.
        The run is awaited itself, so that its end wakes this task at once."""
        loop = asyncio.get_running_loop()
        watchers: Tasks | None = None  # made only when the client is watched
        gone: asyncio.Task[None] | None = None
        waiting = True

        def client_left(task: asyncio.Task[None]) -> None:
            if not task.cancelled():
                run.cancel()

        def watch() -> None:
            nonlocal gone, watchers
            if waiting and not run.done():
                watchers = Tasks()
                gone = watchers.start(disconnected(receive))
                gone.add_done_callback(client_left)

        loop.call_soon(watch)  # after the run's first step, which create_task scheduled before it
        try:
            await run
        except BaseException:
            me = asyncio.current_task()
            if me is not None and me.cancelling():
                raise  # this response was cancelled (and, awaiting the run, cancelled it too)
            # Else the run's own end, a failure or a cancellation: the caller reads it from the task.
        finally:
            waiting = False
            left = gone is not None and gone.done() and not gone.cancelled()
            if not run.done():
                run.cancel()
                await _settle(run)
            if watchers is not None:
                await watchers.aclose()
        return left and run.cancelled()

    async def _answered(self, receive: Receive, send: Send) -> str:
        if self.job.prepared.at_once and self.job.session is None:
            # A run that ends within the loop's step that starts it (heddle.engine.run.ends_at_once) runs on
            # this task: no task of its own nor a watcher of the client, as nothing could stop it part way;
            # a buffered answer outside a session shows no event.
            try:
                finished = await self.job.run(_ignore)
            except Exception as exc:  # noqa: BLE001 - the run's failure is its answer, as a run's task's is
                status, body, outcome = *run_failure(exc), "error"
            else:
                status, body, outcome = 200, self.job.answer(finished), "ok"
        else:
            run = self._start(None)
            if await self._watch(run, receive):
                return "disconnected"
            failure = None if run.cancelled() else run.exception()
            if run.cancelled():
                status, body = CANCELLED
            elif failure is not None:
                status, body = run_failure(failure)
            else:
                status, body = 200, self.job.answer(run.result())
            outcome = _outcome(run)
        await self._send_json(send, status, body)
        return outcome

    async def _send_json(self, send: Send, status: int, body: dict[str, Any]) -> None:
        data = json_answer(body)
        await self._finish()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    async def _streamed(self, receive: Receive, send: Send) -> str:
        queue: Items = asyncio.Queue()
        run = self._start(queue)

        def tail() -> bytes:
            if run.cancelled():
                return sse.frame("error", CANCELLED[1])
            failure = run.exception()
            if failure is not None:
                return sse.frame("error", run_failure(failure)[1])
            return self._last_frame(run)

        return await self._relay(run, queue, receive, send, headers=sse.HEADERS,
                                 render=lambda event: sse.frame(event.type, event.to_dict()),
                                 keepalive=sse.KEEPALIVE, tail=tail)

    async def _encoded(self, receive: Receive, send: Send) -> str:
        """The run rendered by an encoder plugin, its output passed on as it is written."""
        assert self.encoder is not None
        queue: Items = asyncio.Queue()
        run = self._start(None, rendered=queue)
        content_type = (self.encoder.content_type or "text/plain; charset=utf-8").encode("latin-1")
        headers = [(b"content-type", content_type), (b"cache-control", b"no-store"), (b"x-accel-buffering", b"no")]
        held: list[bytes] = []

        def tail() -> bytes | None:
            # A failure has already been rendered by the encoder, in its own protocol; but one of a
            # session's write comes after the encoder has rendered the end: its rendering is dropped
            # and the response left unfinished (None), so the caller cannot take it for a result.
            if self.job.session is not None and (run.cancelled() or run.exception() is not None):
                return None
            return b"".join(held)

        return await self._relay(run, queue, receive, send, headers=headers,
                                 render=lambda text: text.encode("utf-8"), keepalive=None, tail=tail, held=held)

    async def _first_event(self, run: RunTask, gone: asyncio.Task[None]) -> None:
        """Wait until the run emits its first event, ends, or the client goes."""
        waits = Tasks()
        started = waits.start(self.started.wait())
        try:
            await asyncio.wait({run, gone, started}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await waits.aclose()

    async def _relay(self, run: RunTask, queue: Items, receive: Receive, send: Send, *,
                     headers: list[tuple[bytes, bytes]], render: Callable[[Any], bytes],
                     keepalive: bytes | None, tail: Callable[[], bytes | None], held: list[bytes] | None = None
                     ) -> str:
        """Send what the run puts on `queue` as it comes, then `tail()`; stop the run if the client goes.
        After a _HOLD item, what comes is kept in `held` for `tail` to send or drop."""
        run.add_done_callback(lambda _: queue.put_nowait(_DONE))
        watchers = Tasks()
        gone = watchers.start(disconnected(receive))
        getter: asyncio.Task[Any] | None = None
        holding = False
        try:
            await self._first_event(run, gone)
            if gone.done() and not self.started.is_set() and not run.done():
                return "disconnected"
            if run.done() and not self.started.is_set():
                # Refused before it started: an answer with the status, as a buffered request gets.
                failure = None if run.cancelled() else run.exception()
                status, body = CANCELLED if failure is None else run_failure(failure)
                await self._send_json(send, status, body)
                return _outcome(run)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            while True:
                if getter is None:
                    getter = watchers.start(queue.get())
                done, _ = await asyncio.wait({getter, gone}, timeout=sse.KEEPALIVE_S if keepalive else None,
                                             return_when=asyncio.FIRST_COMPLETED)
                if gone in done:
                    return "disconnected"
                if getter not in done:
                    await send({"type": "http.response.body", "body": keepalive, "more_body": True})
                    continue
                item, getter = getter.result(), None
                if item is _DONE:
                    break
                if item is _HOLD:
                    holding = True
                    continue
                if holding and held is not None:
                    held.append(render(item))
                    continue
                await send({"type": "http.response.body", "body": render(item), "more_body": True})
            last = tail()
            await self._finish()
            if last is None:
                log.warning("a run in a session failed after its encoder had rendered it (%s); its response is "
                            "cut short", _reason(run))
                return _outcome(run)
            await send({"type": "http.response.body", "body": last, "more_body": False})
            return _outcome(run)
        finally:
            if not run.done():
                run.cancel()
                await _settle(run)
            await watchers.aclose()
