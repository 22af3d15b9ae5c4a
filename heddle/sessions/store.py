"""The session store interface every backend implements (sqlite, file, postgres, a plugin's).

A store keeps opaque session records (canonical JSON bytes, heddle.sessions.record) under an id,
each with a version. Every write is compare-and-swap on that version, so two runs racing on one
session get one success and one SessionConflict, never a lost turn. Stores are asynchronous: a store
whose work blocks (sqlite, files) does it in heddle.blocking's store limiters, never on the loop.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from heddle.errors import SessionConflict, SessionError, SessionNotFound, SessionTooLarge

# The cap on one session's record: a conversation and a checkpoint, not a data store.
MAX_SESSION_BYTES = 16 * 1024 * 1024
# What a store holds of a record is sealed (heddle.sessions.seal): the record and its MAC. The record
# is held to the cap above before it is sealed; a store holds it to the cap and this room.
SEAL_ROOM = 128

# Each session's id and the time of its last write (Unix seconds): what `index` lists.
Index = list[tuple[str, float]]


@dataclass(frozen=True)
class Stored:
    """One session as the store holds it."""

    id: str
    version: int  # 1 when created; each replace adds one
    data: bytes  # the record, canonical JSON (heddle.sessions.record)
    updated: float  # Unix seconds of the last write


class SessionStore(Protocol):
    """A place sessions live. `name` says which, for messages (`sqlite /path/sessions.db`)."""

    name: str

    async def open(self) -> None:
        """Reach the store (a plugin's process, a database connection) before the first call needs it,
        so that an unreachable store is reported before anything runs; the other calls open it too."""

    async def get(self, session_id: str) -> Stored | None:
        """The session, or None when there is none of that id."""

    async def create(self, session_id: str, data: bytes) -> Stored:
        """A new session at version 1; SessionConflict when the id exists."""

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        """Write `data` if the session is still at `version` (then at version + 1); else
        SessionConflict, or SessionNotFound when it is gone."""

    async def delete(self, session_id: str) -> bool:
        """Remove it; False when there was none."""

    async def list(self) -> list[Stored]:
        """Every session, most recently written first."""

    async def index(self) -> Index:
        """Every session's id and the time of its last write (Unix seconds), without its record."""

    async def close(self) -> None:
        """Release connections and files."""


@runtime_checkable
class Paged(Protocol):
    """A store that lists its sessions a page at a time (sqlite, Postgres), so that a look over a large
    store (a server recovering runs) never holds every session's id at once."""

    async def index_page(self, *, since: float | None, until: float, after: tuple[float, str] | None,
                         limit: int) -> Index:
        """At most `limit` of the sessions last written after `since` (None: at any time) and at or before
        `until`, in order of (time of the last write, id), those after `after` in that order."""


async def index_page(store: SessionStore, *, since: float | None, until: float, after: tuple[float, str] | None,
                     limit: int) -> Index:
    """`Paged.index_page` of `store`, or the same page cut from its `index` (a store that has no paging)."""
    if isinstance(store, Paged):
        return await store.index_page(since=since, until=until, after=after, limit=limit)
    rows = sorted((updated, sid) for sid, updated in await store.index() if (since is None or updated > since)
                  and updated <= until and (after is None or (updated, sid) > after))
    return [(sid, updated) for updated, sid in rows[:limit]]


def _at(store: str) -> str:
    return f"{store}: " if store else ""


def check_size(session_id: str, data: bytes, limit: int = MAX_SESSION_BYTES + SEAL_ROOM, *, store: str = "") -> None:
    """SessionTooLarge before anything is written: every backend calls this first. `store` is the
    store's name, put in front of the message."""
    if len(data) > limit:
        raise SessionTooLarge(
            f"{_at(store)}session {session_id!r}: its record would be {len(data)} bytes, over the cap of {limit} "
            "bytes (a session holds a conversation and a checkpoint; keep large data in files the tools read)")


def conflict(session_id: str, version: int, found: int, *, store: str = "") -> SessionConflict:
    return SessionConflict(
        f"{_at(store)}session {session_id!r} changed while this run used it (it was at version {version}, it is "
        f"now at {found}): another run took its turn first; this turn is not recorded, run it again")


def exists(session_id: str, *, store: str = "") -> SessionConflict:
    """The refusal of `create` for an id that is taken."""
    return SessionConflict(f"{_at(store)}session {session_id!r} already exists; continue it, or choose another name")


def not_found(session_id: str, *, store: str = "") -> SessionNotFound:
    return SessionNotFound(f"{_at(store)}there is no session {session_id!r} (it was never created, or it was "
                           "removed); `heddle sessions ls` lists the sessions there are")


# A session name is also a file name (the file store) and a word on a command line: no path
# separators, no leading dot (hidden files, `..`) and no leading dash (an option).
_SESSION_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,127}")


def check_session_id(name: str) -> str:
    """`name` if it is a valid session name, else a one-line SessionError naming it."""
    if not isinstance(name, str) or _SESSION_ID.fullmatch(name) is None:
        raise SessionError(
            f"session name {name!r} is not valid: give 1 to 128 characters of letters, digits, '.', '_' and '-', "
            "not starting with '.' or '-'")
    return name
