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


def arguments_fingerprint(arguments: dict[str, Any]) -> str:
    """What an answer to a call is bound to: sha256 of the canonical JSON of its exact arguments."""
    from heddle.canonical import fingerprint

    return fingerprint(arguments)


@dataclass(frozen=True)
class WaitingFor:
    """What a stopped run waits for, as the person (or the client) is shown it. A call's wait carries
    the fingerprint of its arguments: the answer is bound to it, and a call with other arguments is
    never run on it."""

    kind: WaitKind
    node: str  # the node's name
    prompt: str | None = None  # the question or message shown with it (kind message)
    tool: str | None = None  # kind approval / client_tool: the tool's name
    arguments: dict[str, Any] | None = None  # ... and the arguments the model or the node gave it
    fingerprint: str | None = None  # ... and theirs (arguments_fingerprint), made from them when not given

    def __post_init__(self) -> None:
        if self.arguments is not None and self.fingerprint is None:
            object.__setattr__(self, "fingerprint", arguments_fingerprint(self.arguments))

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "node": self.node}
        if self.prompt is not None:
            out["prompt"] = self.prompt
        if self.tool is not None:
            out["tool"] = self.tool
        if self.arguments is not None:
            out["arguments"] = self.arguments
            out["fingerprint"] = self.fingerprint
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WaitingFor:
        """A stored wait; ValueError when its fingerprint is not that of the arguments it shows."""
        if data["kind"] not in ("message", "approval", "client_tool") or not isinstance(data["node"], str):
            raise ValueError(f"a wait of kind {data['kind']!r} at {data['node']!r}")
        arguments = data.get("arguments")
        if arguments is not None and not isinstance(arguments, dict):
            raise ValueError("a wait's arguments are not an object")
        waiting = cls(kind=data["kind"], node=data["node"], prompt=data.get("prompt"), tool=data.get("tool"),
                      arguments=arguments)
        if data.get("fingerprint") != waiting.fingerprint:
            raise ValueError(f"the wait at node {waiting.node!r} shows arguments whose fingerprint is not the one "
                             "it keeps")
        return waiting


@dataclass(frozen=True)
class Answer:
    """A person's answer to a wait: `message` text, `approve` (True, or False with `reason`), or a
    ClientTool's `tool_result` (any JSON value)."""

    kind: WaitKind
    message: str | None = None
    approved: bool | None = None
    reason: str | None = None
    tool_result: Any = None
    # An answer to a call (approval, client_tool): the fingerprint of the arguments it answers. The
    # session sets it to the one of the call shown (a caller that sends one must send that one).
    fingerprint: str | None = None

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any]
        if self.kind == "message":
            out = {"message": self.message}
        elif self.kind == "approval":
            out = {"approve": True} if self.approved else {"deny": self.reason or ""}
        else:
            out = {"tool_result": self.tool_result}
        if self.fingerprint is not None:
            out["fingerprint"] = self.fingerprint
        return out

    def entry(self) -> dict[str, Any]:
        """The answer as the journal keeps it."""
        return {"kind": self.kind, "message": self.message, "approved": self.approved, "reason": self.reason,
                "tool_result": self.tool_result, "fingerprint": self.fingerprint}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        """The HTTP shape (`{"message": ...}`, `{"approve": true}`, `{"deny": "reason"}`,
        `{"tool_result": ...}`, an answer to a call with the `"fingerprint"` of the call it answers
        beside it); SessionError for anything else."""
        shapes = ('give exactly one of {"message": TEXT}, {"approve": true}, {"deny": REASON}, {"tool_result": '
                  'JSON} (an answer to a call may add the "fingerprint" of the call it answers)')
        if not isinstance(data, dict):
            raise SessionError(f"answer: {shapes}")
        fingerprint = data.get("fingerprint")
        rest = {k: v for k, v in data.items() if k != "fingerprint"}
        if len(rest) != 1:
            raise SessionError(f"answer: {shapes}")
        if fingerprint is not None and (not isinstance(fingerprint, str) or "message" in rest):
            raise SessionError(f'answer: "fingerprint" is the text a call\'s wait shows, for an answer to a call; '
                               f"{shapes}")
        (key, value), = rest.items()
        if key == "message" and isinstance(value, str):
            return cls("message", message=value)
        if key == "approve" and value is True:
            return cls("approval", approved=True, fingerprint=fingerprint)
        if key == "deny" and isinstance(value, str):
            return cls("approval", approved=False, reason=value, fingerprint=fingerprint)
        if key == "tool_result":
            return cls("client_tool", tool_result=value, fingerprint=fingerprint)
        raise SessionError(f"answer: {key!r} with {type(value).__name__} is not an answer; {shapes}")


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
            return _bound(waiting, Answer(**value))
        if self.waited == key and self.answer is not None:
            if self.answer.kind != waiting.kind:  # the session layer checks this before the run starts
                raise SessionError(f"the run waits for {_what(waiting.kind)} at node {waiting.node!r}, not for "
                                   f"{_what(self.answer.kind)}")
            answer, self.answer = _bound(waiting, self.answer), None
            self.record(key, answer.entry())
            return answer
        if self.answer is not None:
            # Replaying reached a wait that is not the one answered: the document or heddle changed.
            raise RunError(f"resuming the session reached a wait at node {waiting.node!r} before the one it "
                           "stopped at; the run cannot resume exactly where it stopped")
        self.waited = key
        raise Suspended(waiting)

    # ------------------------------------------------------------------ the record

    def as_json(self) -> dict[str, Any]:
        entries = self.entries
        if self.answer is not None and self.waited is not None:
            # Not reached yet, but given: a run resumed from this journal gets the same answer, never
            # waits there again.
            entries = {**entries, self.waited: self.answer.entry()}
        return {"entries": entries, "waited": self.waited}

    @classmethod
    def from_json(cls, data: dict[str, Any], *, answer: Answer | None = None) -> Journal:
        """A stored journal; ValueError (or TypeError) when it is not the shape heddle writes."""
        entries, waited = data.get("entries") or {}, data.get("waited")
        if not isinstance(entries, dict) or not (waited is None or isinstance(waited, str)):
            raise ValueError("a journal that is not the shape heddle writes")
        return cls(entries=dict(entries), waited=waited, answer=answer)


def _bound(waiting: WaitingFor, answer: Answer) -> Answer:
    """`answer`, when it answers the call `waiting` is for: a call's answer is bound to the fingerprint of
    the arguments shown, and a call with any other arguments is never run on it."""
    if waiting.kind != "message" and (answer.fingerprint is None or answer.fingerprint != waiting.fingerprint):
        from heddle.errors import SessionUnreadable

        raise SessionUnreadable(
            f"the call to tool {waiting.tool!r} at node {waiting.node!r} has arguments (fingerprint "
            f"{waiting.fingerprint}) other than those the answer was given for ({answer.fingerprint or 'none'}); it "
            "is not run: the session's record does not hold what was shown")
    return answer


def _what(kind: WaitKind) -> str:
    return {"message": "a message", "approval": "an approval", "client_tool": "a ClientTool's result"}[kind]


def no_session(waiting: WaitingFor, surface: Surface) -> NeedsSessionError:
    """What a wait raises in a run without a session (a document that surely waits is refused before it
    starts; this is a wait an agent's choice made: a tool that requires confirmation or a ClientTool
    it called)."""
    return NeedsSessionError(f"node {waiting.node!r} waits for {_what(waiting.kind)}: run it in a session "
                             f"({surface.say('session')})")


def describe(kind: WaitKind) -> str:
    return _what(kind)
