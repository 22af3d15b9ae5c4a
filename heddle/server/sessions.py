"""Sessions as HTTP callers see them: the `waiting` answer, and session errors in their words.

The stores are shared with the CLI, so their messages name the store by its location and the
CLI's `heddle sessions` commands. A caller of the server has no business knowing where the operator
keeps the store: both are rewritten here, once. (The session layer's own messages speak the
request's terms already: heddle.surface.SERVER.)
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from heddle.errors import SessionError, SessionUnreadable

if TYPE_CHECKING:
    from heddle.engine.run import RunOutcome
    from heddle.sessions.store import Index, SessionStore, Stored

STORE = "this server's session store"

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

    def get(self, session_id: str) -> Stored | None:
        stored = self.store.get(session_id)
        if stored is not None and self._expired(stored.updated):
            self.store.delete(session_id)
            return None
        return stored

    def create(self, session_id: str, data: bytes) -> Stored:
        return self.store.create(session_id, data)

    def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        return self.store.replace(session_id, data, version=version)

    def delete(self, session_id: str) -> bool:
        try:
            found = self.get(session_id) is not None  # an expired session is gone already
        except SessionUnreadable:
            found = True  # removing it is how its caller gets rid of it
        return found and self.store.delete(session_id)

    def list(self) -> list[Stored]:
        return [s for s in self.store.list() if not self._expired(s.updated)]

    def index(self) -> Index:
        return [(sid, updated) for sid, updated in self.store.index() if not self._expired(updated)]

    def sweep(self) -> int:
        """Remove the expired sessions; the number of the others."""
        live = 0
        for sid, updated in self.store.index():
            if self._expired(updated):
                self.store.delete(sid)
            else:
                live += 1
        return live

    def close(self) -> None:
        self.store.close()


def waiting_body(flow: str, session: str, outcome: RunOutcome) -> dict[str, Any]:
    """What a run in a session that stopped to wait answers (and its stream's last frame carries):
    what the person must answer and the messages shown since the last step, never the journal."""
    assert outcome.waiting is not None
    return {"status": "waiting", "flow": flow, "session": session, "waiting_for": outcome.waiting.as_json(),
            "messages": list(outcome.messages)}
