"""One session's record, as a store keeps it (canonical JSON bytes).

    {"format": 1, "id": ..., "digest": "sha256:...", "document": NAME, "created": T, "updated": T,
     "turns": N, "conversation": {...},
     "pending": null | {"status": "waiting" | "running", "inputs": {...}, "message": TEXT | null,
                        "journal": {...}, "waiting_for": {...} | null}}

`digest` binds the session to the document (or bundle) that opened it. `conversation` is what the
turns so far said (heddle.engine.conversation). `pending` is an unfinished run: one that stopped to
wait for a person (`waiting`, with what it waits for), or a `--durable` run's checkpoint that never
finished (`running`: killed, or still going elsewhere).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from heddle.engine.journal import WaitingFor
from heddle.errors import SessionError

FORMAT = 1

Status = Literal["idle", "waiting", "interrupted"]


@dataclass(frozen=True)
class Pending:
    status: Literal["waiting", "running"]
    inputs: dict[str, Any]
    message: str | None
    journal: dict[str, Any]
    waiting_for: WaitingFor | None = None

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "inputs": self.inputs, "message": self.message, "journal": self.journal,
                "waiting_for": self.waiting_for.as_json() if self.waiting_for is not None else None}


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

    @property
    def status(self) -> Status:
        if self.pending is None:
            return "idle"
        return "waiting" if self.pending.status == "waiting" else "interrupted"

    def with_(self, **changes: Any) -> Record:
        return replace(self, updated=time.time(), **changes)

    def as_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "id": self.id, "digest": self.digest, "document": self.document,
                "created": self.created, "updated": self.updated, "turns": self.turns,
                "conversation": self.conversation,
                "pending": self.pending.as_json() if self.pending is not None else None}

    def encode(self) -> bytes:
        from heddle.canonical import dumps

        return dumps(self.as_json(), strict=False)

    def summary(self) -> dict[str, Any]:
        """What `heddle sessions ls` and `show` print: never the journal."""
        out: dict[str, Any] = {"id": self.id, "status": self.status, "document": self.document,
                               "digest": self.digest, "turns": self.turns, "created": self.created,
                               "updated": self.updated}
        if self.pending is not None and self.pending.waiting_for is not None:
            out["waiting_for"] = self.pending.waiting_for.as_json()
        return out


def decode(session_id: str, data: bytes, *, store: str) -> Record:
    """A stored record; SessionError naming the session and the store when it is not one heddle wrote."""
    from heddle.safeparse import loads_json

    try:
        raw = loads_json(data.decode("utf-8"), max_depth=512)
        if not isinstance(raw, dict) or raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format') if isinstance(raw, dict) else None!r}, not {FORMAT}")
        pending = raw.get("pending")
        return Record(
            id=str(raw["id"]), digest=str(raw["digest"]), document=str(raw.get("document") or ""),
            created=float(raw["created"]), updated=float(raw["updated"]), turns=int(raw["turns"]),
            conversation=dict(raw.get("conversation") or {}),
            pending=None if pending is None else Pending(
                status=pending["status"], inputs=dict(pending["inputs"]), message=pending.get("message"),
                journal=dict(pending["journal"]),
                waiting_for=WaitingFor.from_json(pending["waiting_for"]) if pending.get("waiting_for") else None))
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise SessionError(f"session {session_id!r} in {store}: its record is not one this heddle reads ({exc}); "
                           f"remove it with `heddle sessions rm {session_id}`") from None
