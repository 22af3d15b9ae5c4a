"""Sessions as HTTP callers see them: the `waiting` answer, and session errors in their words.

The stores are shared with the CLI, so their messages name the store by its location and the
CLI's `heddle sessions` commands. A caller of the server has no business knowing where the operator
keeps the store: both are rewritten here, once. (The session layer's own messages speak the
request's terms already: heddle.surface.SERVER.)
"""

from __future__ import annotations

import math
import re
import time
from typing import TYPE_CHECKING, Any

from heddle.errors import SessionConflict, SessionError, SessionNotFound, SessionUnreadable

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from heddle.engine.run import RunOutcome
    from heddle.server.service import Service
    from heddle.sessions.record import Record
    from heddle.sessions.steps import StepLog, Steps
    from heddle.sessions.store import Index, SessionStore, Stored

STORE = "this server's session store"
# How many expired sessions a new session removes (more are removed by the next ones).
SWEEP_PAGE = 100

# What the stores themselves say (they serve the CLI too) in a caller's terms; the session layer's own
# messages are already in them (heddle.surface.SERVER).
_WORDS: tuple[tuple[str, str], ...] = (
    ("`heddle sessions ls` lists the sessions there are", "POST /v1/sessions issues a new one"),
)
_REMOVE = re.compile(r"`heddle sessions rm ([^`]+)`")


def for_http(exc: SessionError, store: str) -> SessionError:
    """`exc` with its message in the request's terms; the same class, so the same status."""
    message = exc.message.replace(f"{store}: ", "").replace(store, STORE) if store else exc.message
    for cli, http in _WORDS:
        message = message.replace(cli, http)
    message = _REMOVE.sub(r"DELETE /v1/sessions/\1", message)
    if message == exc.message:
        return exc
    return type(exc)(message)


class Expiring:
    """The server's store, whose sessions expire: one not written for `idle` seconds is removed when it
    is next named (and is then unknown, as one that never was) or when a new session is counted."""

    def __init__(self, store: SessionStore, idle: float) -> None:
        self.store = store
        self.name = store.name
        self.idle = idle

    def _expired(self, updated: float) -> bool:
        return updated < time.time() - self.idle

    async def open(self) -> None:
        await self.store.open()

    async def get(self, session_id: str) -> Stored | None:
        stored = await self.store.get(session_id)
        if stored is not None and self._expired(stored.updated):
            await self.store.delete(session_id)
            return None
        return stored

    async def create(self, session_id: str, data: bytes) -> Stored:
        return await self.store.create(session_id, data)

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        return await self.store.replace(session_id, data, version=version)

    async def claim(self, session_id: str, data: bytes, *, version: int) -> Stored:
        claim = getattr(self.store, "claim", None)
        if claim is None:
            return await self.store.replace(session_id, data, version=version)
        saved: Stored = await claim(session_id, data, version=version)
        return saved

    async def delete(self, session_id: str) -> bool:
        try:
            found = await self.get(session_id) is not None  # an expired session is gone already
        except SessionUnreadable:
            found = True  # removing it is how its caller gets rid of it
        return found and await self.store.delete(session_id)

    async def list(self) -> list[Stored]:
        return [s for s in await self.store.list() if not self._expired(s.updated)]

    async def index(self) -> Index:
        return [(sid, updated) for sid, updated in await self.store.index() if not self._expired(updated)]

    # A durable run's steps (heddle.sessions.steps), appended to the store beneath where it keeps them.
    @property
    def keeps_steps(self) -> bool:
        from heddle.sessions.steps import StepLog

        return isinstance(self.store, StepLog) and bool(getattr(self.store, "keeps_steps", True))

    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        await self._steps().append_step(session_id, base, seq, data)

    async def steps(self, session_id: str, base: int) -> Steps:
        return await self._steps().steps(session_id, base)

    async def drop_steps(self, session_id: str, below: int) -> None:
        await self._steps().drop_steps(session_id, below)

    def _steps(self) -> StepLog:
        from heddle.sessions.steps import StepLog

        assert isinstance(self.store, StepLog), "steps go only to a store that keeps them (keeps_steps)"
        return self.store

    async def index_page(self, *, since: float | None, until: float, after: tuple[float, str] | None,
                         limit: int) -> Index:
        from heddle.sessions.store import index_page

        # Expired sessions are not listed (as `index`), left out by the store so that a page stays whole.
        expired = time.time() - self.idle
        since = expired if since is None else max(since, expired)
        return await index_page(self.store, since=since, until=until, after=after, limit=limit)

    async def live(self, most: int) -> int:
        """The sessions not expired, counted up to `most`, once a page of the expired ones is removed:
        each new session reads two pages of the store's index at the most, never all of it."""
        from heddle.sessions.store import index_page

        expired = time.time() - self.idle
        for sid, _ in await index_page(self.store, since=None, until=expired, after=None, limit=SWEEP_PAGE):
            await self.store.delete(sid)
        return len(await index_page(self.store, since=expired, until=math.inf, after=None, limit=most))

    async def close(self) -> None:
        await self.store.close()


def waiting_body(flow: str, session: str, outcome: RunOutcome) -> dict[str, Any]:
    """What a run in a session that stopped to wait answers (and its stream's last frame carries):
    what the person must answer and the messages shown since the last step, never the journal."""
    assert outcome.waiting is not None
    return {"status": "waiting", "flow": flow, "session": session, "waiting_for": outcome.waiting.as_json(),
            "messages": list(outcome.messages)}


# How often a client following a session's run (GET /v1/sessions/{id}/events) has the record read again.
FOLLOW_EVERY = 0.5


def _going(record: Record) -> bool:
    """A run someone runs, or that a replica recovers once its owner's lease expired (a run that failed
    has no owner: it waits for a person's resume)."""
    return record.running and record.owner is not None


def _outcome_frame(session_id: str, record: Record) -> bytes | None:
    """The last frame of the stream of the session's last run, as the run's own stream ends it: a
    finished run's outputs (and whether another replica finished it), or what it waits for."""
    from heddle.server import sse

    if record.pending is None and record.last is not None:
        return sse.frame("flow_complete", {"type": "flow_complete", "session": session_id,
                                           "outputs": record.last.get("outputs"),
                                           "recovered": bool(record.last.get("recovered"))})
    if record.pending is not None and record.pending.waiting_for is not None:
        return sse.frame("waiting", {"type": "waiting", "status": "waiting", "session": session_id,
                                     "waiting_for": record.pending.waiting_for.as_json()})
    return None


async def followed(service: Service, session_id: str) -> AsyncIterator[bytes]:
    """The stream of GET /v1/sessions/{id}/events: for a client whose stream of a session's run was cut
    (the replica running it died, the connection dropped), the run's outcome once it has one, as that
    stream's last frame. Refused before the stream starts (SessionConflict) when the session has no
    run to follow: it never ran, or its run failed and waits for a resume."""
    from heddle.sessions.record import decode

    await service.session_summary(session_id)  # 400, 404 and an unreadable record: refused in the caller's words
    store = service.sessions
    assert store is not None, "session_summary refuses a server without sessions"
    stored = await store.get(session_id)
    record = decode(session_id, stored.data, store=store.name) if stored is not None else None
    if record is None or not (_going(record) or _outcome_frame(session_id, record)):
        raise SessionConflict(f"session {session_id!r} has no run to follow: it has not run yet, or its last run "
                              'stopped without finishing; continue it with "resume": true')
    return _follow(service, store, session_id, record)


async def _follow(service: Service, store: SessionStore, session_id: str, record: Record) -> AsyncIterator[bytes]:
    import asyncio

    from heddle.server import sse
    from heddle.server.errors import error_body
    from heddle.sessions.record import decode

    quiet = 0.0  # since the last bytes sent
    while _going(record):
        if service.admission.draining:
            yield sse.frame("error", error_body("draining", "the server is shutting down; follow the session on "
                                                           "another replica"))
            return
        if quiet >= sse.KEEPALIVE_S:
            quiet = 0.0
            yield sse.KEEPALIVE
        await asyncio.sleep(FOLLOW_EVERY)
        quiet += FOLLOW_EVERY
        try:
            stored = await store.get(session_id)
            if stored is None:
                raise SessionNotFound(f"session {session_id!r} was removed while its run was followed")
            record = decode(session_id, stored.data, store=store.name)
        except SessionError as exc:
            refused = for_http(exc, store.name)
            yield sse.frame("error", error_body(refused.kind, refused.message))
            return
    frame = _outcome_frame(session_id, record)
    if frame is None:
        frame = sse.frame("error", error_body("session_conflict", f"session {session_id!r}: its run stopped without "
                                                                  'finishing; continue it with "resume": true'))
    yield frame

