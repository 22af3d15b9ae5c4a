"""One session's record, as a store keeps it (canonical JSON bytes).

    {"format": 3, "heddle": VERSION, "id": ..., "digest": "sha256:...", "document": NAME, "created": T, "updated": T,
     "turns": N, "conversation": {...}, "inputs": {...},
     "pending": null | {"status": "waiting" | "running", "inputs": {...}, "message": TEXT | null,
                        "journal": {...}, "waiting_for": {...} | null, "answered": {...} | null},
     "owner": null | {"host": ..., "pid": N, "run": TOKEN, "until": T, "space": ...},
     "last": null | {"outputs": {...}, "recovered": true?}}

`digest` binds the session to the document (or bundle) that opened it. `conversation` is what the
turns so far said (heddle.engine.conversation). `inputs` are those the last finished turn ran with:
the next turn's, but for what it names itself. `pending` is an unfinished run: one that stopped to
wait for a person (`waiting`, with what it waits for), or one that runs or ran and never finished
(`running`: a `--durable` run's checkpoint, or a run resumed with an answer, which claims the wait
before anything runs: `answered` is the wait it answered, and its journal holds the answer).
`owner` names the process a `running` run runs in and until when its lease holds
(heddle.sessions.lease); null once its run failed, and whenever no run is running. `last` holds
the outputs of the last run that finished (`recovered` when a server finished it for another).

A store keeps the record sealed (heddle.sessions.seal). `format` names this layout and `heddle` the
version that wrote it: 3 since the journal's entries are typed records naming the call each answers
(heddle.engine.journal). A record of format 2 (waits bound to their call's fingerprint, untyped
journal entries) is read when it holds no unfinished run, and refused by name when it does; any other
format is refused by name.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from heddle.canonical import dumps
from heddle.engine.conversation import Conversation
from heddle.engine.journal import Journal, WaitingFor
from heddle.errors import SessionError, SessionUnreadable
from heddle.safeparse import loads_json
from heddle.sessions.lease import Owner
from heddle.version import __version__

FORMAT = 3
# The earlier layout still read: its conversation and inputs are this one's; its journal is not.
_READS = (2, 3)

Status = Literal["idle", "waiting", "interrupted"]


def _version() -> str:
    return __version__


@dataclass(frozen=True)
class Pending:
    status: Literal["waiting", "running"]
    inputs: dict[str, Any]
    message: str | None
    journal: dict[str, Any]
    waiting_for: WaitingFor | None = None
    answered: WaitingFor | None = None  # status running: the wait this run was resumed to answer

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "inputs": self.inputs, "message": self.message, "journal": self.journal,
                "waiting_for": self.waiting_for.as_json() if self.waiting_for is not None else None,
                "answered": self.answered.as_json() if self.answered is not None else None}


@dataclass(frozen=True)
class Record:
    id: str
    digest: str
    document: str
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    turns: int = 0
    conversation: dict[str, Any] = field(default_factory=dict)
    pending: Pending | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    heddle: str = field(default_factory=_version)  # the version that wrote it
    # Who runs the unfinished run, and until when (heddle.sessions.lease); kept while it is `running`.
    owner: Owner | None = None
    # The last finished run's outputs, and whether a server finished it for a replica that died.
    last: dict[str, Any] | None = None

    @property
    def status(self) -> Status:
        if self.pending is None:
            return "idle"
        return "waiting" if self.pending.status == "waiting" else "interrupted"

    def with_(self, **changes: Any) -> Record:
        return replace(self, updated=time.time(), heddle=_version(), **changes)

    def as_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "heddle": self.heddle, "id": self.id, "digest": self.digest,
                "document": self.document, "created": self.created, "updated": self.updated, "turns": self.turns,
                "conversation": self.conversation, "inputs": self.inputs,
                "pending": self.pending.as_json() if self.pending is not None else None,
                "owner": self.owner.as_json() if self.owner is not None and self.running else None,
                "last": self.last}

    @property
    def running(self) -> bool:
        return self.pending is not None and self.pending.status == "running"

    def encode(self) -> bytes:
        return dumps(self.as_json(), strict=False)

    def summary(self) -> dict[str, Any]:
        """What `heddle sessions ls` and `show` print: never the journal."""
        out: dict[str, Any] = {"id": self.id, "status": self.status, "document": self.document,
                               "digest": self.digest, "turns": self.turns, "created": self.created,
                               "updated": self.updated}
        if self.last is not None:
            out["last"] = self.last
        if self.pending is not None and self.pending.waiting_for is not None:
            out["waiting_for"] = self.pending.waiting_for.as_json()
        return out


def decode(session_id: str, data: bytes, *, store: str) -> Record:
    """A stored record, its every part of the shape heddle writes; SessionUnreadable (one line) naming the
    session and the store when it is not one heddle wrote."""
    try:
        raw = loads_json(data.decode("utf-8"), max_depth=512)
        if not isinstance(raw, dict):
            raise TypeError(f"{type(raw).__name__} where a record belongs")
        _check_format(session_id, raw, store=store)
        if raw["id"] != session_id:
            raise ValueError(f"it is the record of session {raw['id']!r}")
        pending = raw.get("pending")
        record = Record(
            id=session_id, digest=_text(raw["digest"]), document=_text(raw.get("document") or ""),
            created=float(raw["created"]), updated=float(raw["updated"]), turns=int(raw["turns"]),
            conversation=_object(raw.get("conversation") or {}), inputs=_object(raw.get("inputs") or {}),
            pending=None if pending is None else _pending(_object(pending)),
            heddle=_text(raw.get("heddle") or "unknown"),
            owner=Owner.from_json(raw["owner"]) if raw.get("owner") is not None else None,
            last=_object(raw["last"]) if raw.get("last") is not None else None)
        # What a turn makes of its parts, made here, so that a record of the wrong shape is refused now.
        Conversation.from_json(record.conversation)
        if record.pending is not None:
            Journal.from_json(record.pending.journal)
        return record
    except SessionUnreadable:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError, RecursionError, SessionError) as exc:
        raise SessionUnreadable(f"session {session_id!r} in {store}: its record is not one this heddle reads "
                                f"({' '.join(str(exc).split())[:200]}); remove it with "
                                f"`heddle sessions rm {session_id}`") from None


def _check_format(session_id: str, raw: dict[str, Any], *, store: str) -> None:
    """A record of a format this heddle reads, or SessionUnreadable naming the format and who wrote it."""
    found, by = raw.get("format"), raw.get("heddle")
    writer = f"heddle {by}" if isinstance(by, str) else "an earlier heddle"
    if found == 2 and raw.get("pending") is not None:
        raise SessionUnreadable(
            f"session {session_id!r} in {store}: its unfinished run was recorded in record format 2 by {writer}, "
            f"whose journal this heddle (format {FORMAT}) does not replay: finish it with that heddle, or remove "
            f"it with `heddle sessions rm {session_id}`")
    if found not in _READS:
        later = isinstance(found, int) and not isinstance(found, bool) and found > FORMAT
        fix = "upgrade heddle to continue it, or" if later else "it cannot be continued:"
        raise SessionUnreadable(
            f"session {session_id!r} in {store}: its record is format {found!r} (written by {writer}); this heddle "
            f"reads formats {', '.join(map(str, _READS))}: {fix} remove it with `heddle sessions rm {session_id}`")


def _pending(raw: dict[str, Any]) -> Pending:
    status = raw["status"]
    if status not in ("waiting", "running"):
        raise ValueError(f"an unfinished run of status {status!r}")
    message = raw.get("message")
    waiting = WaitingFor.from_json(_object(raw["waiting_for"])) if raw.get("waiting_for") else None
    if (status == "waiting") != (waiting is not None):
        raise ValueError(f"an unfinished run of status {status!r} {'without' if waiting is None else 'with'} a wait")
    return Pending(status=status, inputs=_object(raw["inputs"]), message=None if message is None else _text(message),
                   journal=_object(raw["journal"]), waiting_for=waiting,
                   answered=WaitingFor.from_json(_object(raw["answered"])) if raw.get("answered") else None)


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{type(value).__name__} where an object belongs")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{type(value).__name__} where text belongs")
    return value
