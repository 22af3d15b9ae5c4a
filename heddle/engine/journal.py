"""What a run in a session did, so that it can stop to wait for a person and later resume exactly there.

A run in a session keeps a journal: each node that finished (its outputs, its branch, the messages it
showed) and, inside the nodes still running, each model answer, tool result and person's answer, under
a key that names where in the run it happened. The key is made of the run's scopes (a node's visit,
a map iteration, a parallel branch) and a counter per scope, so it does not depend on the order in
which parallel work happened to finish.

Resuming runs the document again from its StartNode with the journal: a finished node is not run
again (its recorded outputs are taken), a model call or tool call recorded is answered from the
journal (nothing is sent, nothing runs, no event is emitted), and the wait the run stopped at gets
the person's answer. The first thing not in the journal runs for real: from there the run is live.

The journal is internal: what a caller sees of a wait is its `WaitingFor` (kind, node, prompt, tool
and arguments), never the keys.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from heddle.errors import NeedsSessionError, RunError, SessionError

if TYPE_CHECKING:
    from heddle.surface import Surface

WaitKind = Literal["message", "approval", "client_tool"]

# Where in the run the current code is: "" at the top flow, "/node#1/..." inside nodes. A context
# variable, so each parallel branch (its own asyncio task) carries its own.
_SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("heddle_journal_scope", default="")


@dataclass(frozen=True)
class WaitingFor:
    """What a stopped run waits for, as the person (or the client) is shown it."""

    kind: WaitKind
    node: str  # the node's name
    prompt: str | None = None  # the question or message shown with it (kind message)
    tool: str | None = None  # kind approval / client_tool: the tool's name
    arguments: dict[str, Any] | None = None  # ... and the arguments the model or the node gave it

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "node": self.node}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.tool is not None:
            out["tool"] = self.tool
        if self.arguments is not None:
            out["arguments"] = self.arguments
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WaitingFor:
        return cls(kind=data["kind"], node=data["node"], prompt=data.get("prompt"), tool=data.get("tool"),
                   arguments=data.get("arguments"))


@dataclass(frozen=True)
class Answer:
    """A person's answer to a wait: `message` text, `approve` (True, or False with `reason`), or a
    ClientTool's `tool_result` (any JSON value)."""

    kind: WaitKind
    message: str | None = None
    approved: bool | None = None
    reason: str | None = None
    tool_result: Any = None

    def as_json(self) -> dict[str, Any]:
        if self.kind == "message":
            return {"message": self.message}
        if self.kind == "approval":
            return {"approve": True} if self.approved else {"deny": self.reason or ""}
        return {"tool_result": self.tool_result}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        """The HTTP shape (`{"message": ...}`, `{"approve": true}`, `{"deny": "reason"}`,
        `{"tool_result": ...}`); SessionError for anything else."""
        if not isinstance(data, dict) or len(data) != 1:
            raise SessionError('answer: give exactly one of {"message": TEXT}, {"approve": true}, '
                               '{"deny": REASON}, {"tool_result": JSON}')
        (key, value), = data.items()
        if key == "message" and isinstance(value, str):
            return cls("message", message=value)
        if key == "approve" and value is True:
            return cls("approval", approved=True)
        if key == "deny" and isinstance(value, str):
            return cls("approval", approved=False, reason=value)
        if key == "tool_result":
            return cls("client_tool", tool_result=value)
        raise SessionError(f'answer: {key!r} with {type(value).__name__} is not an answer; give exactly one of '
                           '{"message": TEXT}, {"approve": true}, {"deny": REASON}, {"tool_result": JSON}')


class Suspended(Exception):
    """Raised where a run must wait; the session layer catches it, keeps the journal and reports `waiting`."""

    def __init__(self, waiting: WaitingFor) -> None:
        super().__init__(f"waiting for {waiting.kind} at node {waiting.node!r}")
        self.waiting = waiting


# Called after each node finishes, with the journal as it is then: a durable run writes its checkpoint.
Checkpoint = Callable[["Journal"], Awaitable[None]]


@dataclass
class Journal:
    """The journal of one run in a session (see the module's docstring).

    `entries` maps keys to what happened there; `waited` is the key of the wait the run stopped at
    and `answer` the person's answer to it, when the run resumes.
    """

    entries: dict[str, Any] = field(default_factory=dict)
    waited: str | None = None
    answer: Answer | None = None
    checkpoint: Checkpoint | None = None
    _counters: dict[str, int] = field(default_factory=dict)

    # ------------------------------------------------------------------ keys

    def key(self, kind: str) -> str:
        """The next key of `kind` in the current scope."""
        scope = _SCOPE.get()
        n = self._counters.get(scope, 0) + 1
        self._counters[scope] = n
        return f"{scope}/{n}{kind}"

    @staticmethod
    @contextlib.contextmanager
    def scope(name: str) -> Iterator[str]:
        """Work inside `name` (a node visit, an iteration, a branch): its keys are its own."""
        token = _SCOPE.set(f"{_SCOPE.get()}/{name}")
        try:
            yield _SCOPE.get()
        finally:
            _SCOPE.reset(token)

    def recorded(self, key: str) -> tuple[bool, Any]:
        if key in self.entries:
            return True, self.entries[key]
        return False, None

    def record(self, key: str, value: Any) -> None:
        self.entries[key] = value

    def finished(self, prefix: str, key: str, value: Any) -> None:
        """A node finished: keep its outcome and drop what was recorded inside it (never needed again)."""
        inner = prefix + "/"
        for k in [k for k in self.entries if k.startswith(inner)]:
            del self.entries[k]
        self.entries[key] = value

    # ------------------------------------------------------------------ waiting

    def wait(self, waiting: WaitingFor) -> Answer:
        """The answer to this wait: recorded, or the one the run resumes with; else the run stops here."""
        key = self.key("w")
        found, value = self.recorded(key)
        if found:
            return Answer(**value)
        if self.waited == key and self.answer is not None:
            if self.answer.kind != waiting.kind:  # the session layer checks this before the run starts
                raise SessionError(f"the run waits for {_what(waiting.kind)} at node {waiting.node!r}, not for "
                                   f"{_what(self.answer.kind)}")
            answer, self.answer = self.answer, None
            self.record(key, {"kind": answer.kind, "message": answer.message, "approved": answer.approved,
                              "reason": answer.reason, "tool_result": answer.tool_result})
            return answer
        if self.answer is not None:
            # Replaying reached a wait that is not the one answered: the document or heddle changed.
            raise RunError(f"resuming the session reached a wait at node {waiting.node!r} before the one it "
                           "stopped at; the run cannot resume exactly where it stopped")
        self.waited = key
        raise Suspended(waiting)

    # ------------------------------------------------------------------ the record

    def as_json(self) -> dict[str, Any]:
        return {"entries": self.entries, "waited": self.waited}

    @classmethod
    def from_json(cls, data: dict[str, Any], *, answer: Answer | None = None) -> Journal:
        return cls(entries=dict(data.get("entries") or {}), waited=data.get("waited"), answer=answer)


def _what(kind: WaitKind) -> str:
    return {"message": "a message", "approval": "an approval", "client_tool": "a ClientTool's result"}[kind]


def no_session(waiting: WaitingFor, surface: Surface) -> NeedsSessionError:
    """What a wait raises in a run without a session (documents that may wait are refused before they
    start, so this is only reached by a wait no check could see coming: a ClientTool an agent called)."""
    return NeedsSessionError(f"node {waiting.node!r} waits for {_what(waiting.kind)}: run it in a session "
                             f"({surface.say('session')})")


def describe(kind: WaitKind) -> str:
    return _what(kind)
