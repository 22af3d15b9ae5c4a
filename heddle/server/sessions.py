"""Sessions as HTTP callers see them: the `waiting` answer, and session errors in their words.

The stores are shared with the CLI, so their messages name the store by its location and the
CLI's `heddle sessions` commands. A caller of the server has no business knowing where the operator
keeps the store: both are rewritten here, once. (The session layer's own messages speak the
request's terms already: heddle.surface.SERVER.)
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from heddle.errors import SessionError

if TYPE_CHECKING:
    from heddle.engine.run import RunOutcome

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


def waiting_body(flow: str, session: str, outcome: RunOutcome) -> dict[str, Any]:
    """What a run in a session that stopped to wait answers (and its stream's last frame carries):
    what the person must answer and the messages shown since the last step, never the journal."""
    assert outcome.waiting is not None
    return {"status": "waiting", "flow": flow, "session": session, "waiting_for": outcome.waiting.as_json(),
            "messages": list(outcome.messages)}
