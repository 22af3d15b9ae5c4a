"""A durable run's steps, appended beside its session's record rather than rewriting it.

Each model or tool call of a durable run is a step: its intent is appended before it starts and its
result after (heddle.engine.journal). A step line is

    {"run": RUN, "key": POSITION, "entry": <the journal entry>}

kept under the session's id, the version of the record it follows (`base`) and its number after that
record (`seq`, from 1). A store that keeps steps (`StepLog`: a table in sqlite and Postgres, an
append-only file beside the record for the file store) never rewrites them; each line is sealed with
the session key as the record is (heddle.sessions.seal), over the session, base, seq and line, so a
line moved, reordered or edited fails its check. The next checkpoint of the record holds what they
said: the steps before it are dropped then, and a finished node's inner steps go with it.

On resume the record's journal is read with the steps that follow its version and belong to its run;
a store that keeps no steps (a plugin's) gets the whole record written at each step instead.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from heddle.canonical import dumps
from heddle.errors import SessionConflict, SessionUnreadable
from heddle.safeparse import loads_json

# The cap on one step line: a tool's output or a model's answer, not a data store (the record's cap
# holds for the journal the steps make too).
MAX_STEP_BYTES = 4 * 1024 * 1024

# A session's steps after one version of its record: (seq, line), in order.
Steps = list[tuple[int, bytes]]


@runtime_checkable
class StepLog(Protocol):
    """A store that appends steps (sqlite, Postgres, file)."""

    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        """Append step `seq` after record version `base`; SessionConflict when that step is there already
        (another process runs the session)."""

    async def steps(self, session_id: str, base: int) -> Steps:
        """The steps after record version `base`, in order: (seq, line)."""

    async def drop_steps(self, session_id: str, below: int) -> None:
        """Remove the steps of record versions below `below` (a checkpoint holds them now)."""


def step_line(run: str, key: str, entry: dict[str, Any]) -> bytes:
    return dumps({"run": run, "key": key, "entry": entry}, strict=False)


def read_steps(session_id: str, lines: Steps, *, run: str, store: str) -> dict[str, Any]:
    """The journal entries (position -> entry, still JSON) the lines of run `run` hold, the later one
    at a position winning; SessionUnreadable when a line is not one heddle wrote or a step is missing."""
    entries: dict[str, Any] = {}
    for expected, (seq, line) in enumerate(lines, start=1):
        if seq != expected:
            raise _unreadable(session_id, store, f"step {expected} is missing before step {seq}")
        try:
            raw = loads_json(line.decode("utf-8"), max_depth=512)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise _unreadable(session_id, store, f"step {seq} is not JSON ({exc})") from None
        if not isinstance(raw, dict) or set(raw) != {"run", "key", "entry"} or not isinstance(raw["key"], str) \
                or not isinstance(raw["entry"], dict):
            raise _unreadable(session_id, store, f"step {seq} is not the shape heddle writes")
        if raw["run"] == run:
            entries[raw["key"]] = raw["entry"]
    return entries


def _unreadable(session_id: str, store: str, problem: str) -> SessionUnreadable:
    return SessionUnreadable(f"session {session_id!r} in {store}: its steps are not those heddle wrote ({problem}); "
                             f"nothing of them is used: remove it with `heddle sessions rm {session_id}`")


def step_taken(session_id: str, base: int, seq: int, *, store: str) -> SessionConflict:
    """The refusal of a step that another process appended first: two processes run the session."""
    return SessionConflict(f"{store}: session {session_id!r}: step {seq} after version {base} was written by another "
                           "run: another process runs this session; this one stops here")
