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

Each entry is a typed record (`Entry`): a node finished, a model turn, a tool call done or failed,
a person's answer, a step begun (`Intent`), or a value the run saw (a clock, a cache's id, a row, an
A2A exchange). A call's entry names what it answers (the tool, the model or the ApiNode, and the
fingerprint of its request), and replay refuses, naming the position, an entry that does not answer
the call the run makes now: one call's result is never handed to another.

In a durable run each model and tool call is a step: its `Intent` is in the store before it starts
and its result before the next step begins (`Journal.append`). A step with an intent and no result
is the only one that runs again on resume, with the same idempotency key (`idempotency_key`: the
session, the run and the position, hashed).

The journal is internal: what a caller sees of a wait is its `WaitingFor` (kind, node, prompt, tool
and arguments), never the keys.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from heddle.canonical import fingerprint
from heddle.errors import NeedsSessionError, RunError, SessionError, SessionUnreadable

if TYPE_CHECKING:
    from heddle.surface import Surface

WaitKind = Literal["message", "approval", "client_tool"]

# Where in the run the current code is: "" at the top flow, "/node#1/..." inside nodes. A context
# variable, so each parallel branch (its own asyncio task) carries its own.
_SCOPE: contextvars.ContextVar[str] = contextvars.ContextVar("heddle_journal_scope", default="")


def arguments_fingerprint(arguments: dict[str, Any]) -> str:
    """What an answer to a call is bound to: sha256 of the canonical JSON of its exact arguments."""
    return fingerprint(arguments)


def call_fingerprint(name: str, request: Any) -> str:
    """What a recorded call answers: sha256 of the canonical JSON of the name called (a tool, a model, an
    ApiNode) and its request (a tool's arguments, a model's messages and tools, an ApiNode's inputs)."""
    return fingerprint({"name": name, "request": request})


CallKind = Literal["tool", "model", "api"]


@dataclass(frozen=True)
class Call:
    """A call the run is about to make, as the journal matches it against what it recorded."""

    kind: CallKind
    name: str  # the tool's, the model's or the ApiNode's
    fingerprint: str  # call_fingerprint of its request

    def __str__(self) -> str:
        return f"a call to {_CALLED[self.kind]} {self.name!r} (request {self.fingerprint})"


_CALLED: dict[str, str] = {"tool": "tool", "model": "model", "api": "ApiNode"}


class _Entry(BaseModel):
    # Built at first use: a run outside a session never validates an entry, and pays nothing for them.
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    def answers(self) -> Call | None:
        """The call this entry answers; None for an entry that is not a call's."""
        return None


class _CallEntry(_Entry):
    call: CallKind
    name: str
    fingerprint: str

    def answers(self) -> Call:
        return Call(self.call, self.name, self.fingerprint)


class NodeFinished(_Entry):
    """A node that finished: what it produced, the branch it left by, the messages it showed."""

    type: Literal["node"] = "node"
    outputs: dict[str, Any]
    branch: str | None
    shown: list[str]


class Intent(_CallEntry):
    """A step began: the call was made (or was about to be) and its result is not recorded yet."""

    type: Literal["intent"] = "intent"


class ModelTurn(_CallEntry):
    """A model's answer."""

    type: Literal["model"] = "model"
    call: CallKind = "model"
    content: str | None
    finish_reason: str | None
    tool_calls: list[dict[str, Any]]


class ToolDone(_CallEntry):
    """A tool's (or an ApiNode's) output."""

    type: Literal["tool_done"] = "tool_done"
    output: dict[str, Any]


class ToolFailed(_CallEntry):
    """A tool's (or an ApiNode's) failure, as its error says it."""

    type: Literal["tool_failed"] = "tool_failed"
    error: str


class Answered(_Entry):
    """A person's (or a client's) answer to a wait."""

    type: Literal["answered"] = "answered"
    kind: WaitKind
    message: str | None = None
    approved: bool | None = None
    reason: str | None = None
    tool_result: Any = None
    fingerprint: str | None = None


class Seen(_Entry):
    """A value the run saw and must see again when it resumes: a clock, a cache's id, a row read, an
    exchange with a remote agent."""

    type: Literal["seen"] = "seen"
    value: Any


Entry = Annotated[NodeFinished | Intent | ModelTurn | ToolDone | ToolFailed | Answered | Seen,
                  Field(discriminator="type")]


@functools.cache
def _entries() -> TypeAdapter[dict[str, Entry]]:
    return TypeAdapter(dict[str, Entry])


_HELD = {"node": "a finished node", "answered": "an answer", "seen": "a value the run saw"}

# The letters that end a position's key: what kind of thing happened there (see Journal.key).
_KINDS = "tmwhacd"


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

    def entry(self) -> Answered:
        """The answer as the journal keeps it."""
        return Answered(kind=self.kind, message=self.message, approved=self.approved, reason=self.reason,
                        tool_result=self.tool_result, fingerprint=self.fingerprint)

    @classmethod
    def of(cls, entry: Answered) -> Answer:
        return cls(kind=entry.kind, message=entry.message, approved=entry.approved, reason=entry.reason,
                   tool_result=entry.tool_result, fingerprint=entry.fingerprint)

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
# Called with each step's intent and result as it is recorded (a durable run's): in the store when it returns.
Append = Callable[[str, "Entry"], Awaitable[None]]


@dataclass
class Journal:
    """The journal of one run in a session (see the module's docstring).

    `entries` maps positions (keys) to what happened there; `waited` is the key of the wait the run
    stopped at and `answer` the person's answer to it, when the run resumes. `run` names this run
    (kept across its resumptions) and `session` its session: with the position, they make each
    call's idempotency key.
    """

    entries: dict[str, Entry] = field(default_factory=dict)
    waited: str | None = None
    answer: Answer | None = None
    checkpoint: Checkpoint | None = None
    append: Append | None = None
    run: str = field(default_factory=lambda: uuid.uuid4().hex)
    session: str = ""
    _counters: dict[str, int] = field(default_factory=dict)
    # The calls recorded as failed, with the exception each raised (see `undo_failure`).
    _failed: list[tuple[BaseException, str]] = field(default_factory=list)

    # ------------------------------------------------------------------ keys

    def key(self, kind: str) -> str:
        """The next key of `kind` in the current scope. The position (scope and count) is the call's; a
        position the record holds for another kind of thing is a run that went another way."""
        scope = _SCOPE.get()
        n = self._counters.get(scope, 0) + 1
        self._counters[scope] = n
        position = f"{scope}/{n}"
        for other in _KINDS:
            if other != kind and position + other in self.entries:
                raise _diverged(position + kind, self.entries[position + other], None)
        return position + kind

    @staticmethod
    @contextlib.contextmanager
    def scope(name: str) -> Iterator[str]:
        """Work inside `name` (a node visit, an iteration, a branch): its keys are its own."""
        token = _SCOPE.set(f"{_SCOPE.get()}/{name}")
        try:
            yield _SCOPE.get()
        finally:
            _SCOPE.reset(token)

    def idempotency_key(self, key: str) -> str:
        """The key a call at `key` is given (HEDDLE_IDEMPOTENCY_KEY, Idempotency-Key, ...): the same for the
        same session, run and position, so a step run again after a crash is known to be the same."""
        digest = hashlib.sha256(f"heddle-step\0{self.session}\0{self.run}\0{key}".encode()).hexdigest()
        return f"hk-{digest[:40]}"

    # ------------------------------------------------------------------ values seen

    def recorded(self, key: str) -> tuple[bool, Any]:
        """The value seen at `key` (`record`), if the journal holds one."""
        entry = self.entries.get(key)
        if entry is None:
            return False, None
        if not isinstance(entry, Seen):
            raise _diverged(key, entry, None)
        return True, entry.value

    def record(self, key: str, value: Any) -> None:
        self.entries[key] = Seen(value=value)

    def finished(self, prefix: str, key: str, value: NodeFinished) -> None:
        """A node finished: keep its outcome and drop what was recorded inside it (never needed again)."""
        inner = prefix + "/"
        for k in [k for k in self.entries if k.startswith(inner)]:
            del self.entries[k]
        self._failed = [(exc, k) for exc, k in self._failed if not k.startswith(inner)]
        self.entries[key] = value

    def node(self, key: str) -> NodeFinished | None:
        entry = self.entries.get(key)
        if entry is None or isinstance(entry, NodeFinished):
            return entry
        raise _diverged(key, entry, None)

    # ------------------------------------------------------------------ steps

    def replayed(self, key: str, call: Call) -> Entry | None:
        """The recorded result of `call` at `key`; None when the call is to be made (nothing is recorded,
        or only its intent: a step that began and whose result was lost). SessionUnreadable, naming the
        position, when the record holds another call (or anything else) there."""
        entry = self.entries.get(key)
        if entry is None:
            return None
        if entry.answers() != call:
            raise _diverged(key, entry, call)
        return None if isinstance(entry, Intent) else entry

    async def begin(self, key: str, call: Call) -> None:
        """A step begins: its intent is recorded (and, in a durable run, in the store) before it starts."""
        await self._keep(key, Intent(call=call.kind, name=call.name, fingerprint=call.fingerprint))

    async def done(self, key: str, result: Entry) -> None:
        """A step ended: its result is recorded (and, in a durable run, in the store) before the next one."""
        await self._keep(key, result)

    async def fail(self, key: str, result: ToolFailed, exc: BaseException) -> None:
        """A call failed with `exc`: its failure is its result, unless it fails its node (`undo_failure`)."""
        await self.done(key, result)
        self._failed.append((exc, key))

    async def undo_failure(self, exc: BaseException) -> None:
        """A node fails with `exc`: a call whose failure it is (not one an agent handed back to its model)
        becomes a step begun again, so that a resumed run, once the cause is fixed, makes it again (with
        its key) rather than fail the same way from the record."""
        chain: list[BaseException] = []
        found: BaseException | None = exc
        while found is not None and all(found is not seen for seen in chain):
            chain.append(found)
            found = found.__cause__ or found.__context__
        for failure, key in self._failed:
            entry = self.entries.get(key)
            if isinstance(entry, ToolFailed) and any(failure is seen for seen in chain):
                await self.begin(key, Call(entry.call, entry.name, entry.fingerprint))
        self._failed = [(failure, key) for failure, key in self._failed if all(failure is not e for e in chain)]

    async def _keep(self, key: str, entry: Entry) -> None:
        before = self.entries.get(key)
        self.entries[key] = entry
        if self.append is not None:
            try:
                await self.append(key, entry)
            except BaseException:
                # Not in the store: the journal says no more than the store does (what a crash here leaves).
                if before is None:
                    del self.entries[key]
                else:
                    self.entries[key] = before
                raise

    def extend(self, raw: dict[str, Any], *, where: str) -> None:
        """Add the entries of a durable run's steps (still JSON) to those of its checkpoint."""
        try:
            self.entries.update(_entries().validate_python(raw))
        except ValidationError as exc:
            raise SessionUnreadable(f"session {self.session!r} in {where}: a step is not one this heddle reads "
                                    f"({' '.join(str(exc).split())[:200]}); remove the session with "
                                    f"`heddle sessions rm {self.session}`") from None

    # ------------------------------------------------------------------ waiting

    def wait(self, waiting: WaitingFor) -> Answer:
        """The answer to this wait: recorded, or the one the run resumes with; else the run stops here."""
        key = self.key("w")
        entry = self.entries.get(key)
        if entry is not None:
            if not isinstance(entry, Answered):
                raise _diverged(key, entry, None)
            return _bound(waiting, Answer.of(entry))
        if self.waited == key and self.answer is not None:
            if self.answer.kind != waiting.kind:  # the session layer checks this before the run starts
                raise SessionError(f"the run waits for {_what(waiting.kind)} at node {waiting.node!r}, not for "
                                   f"{_what(self.answer.kind)}")
            answer, self.answer = _bound(waiting, self.answer), None
            self.entries[key] = answer.entry()
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
        return {"run": self.run, "entries": {k: v.model_dump(mode="json") for k, v in entries.items()},
                "waited": self.waited}

    @classmethod
    def from_json(cls, data: dict[str, Any], *, answer: Answer | None = None) -> Journal:
        """A stored journal; ValueError when it is not the shape heddle writes."""
        entries, waited, run = data.get("entries") or {}, data.get("waited"), data.get("run")
        if not isinstance(entries, dict) or not (waited is None or isinstance(waited, str)) \
                or not isinstance(run, str) or not run:
            raise ValueError("a journal that is not the shape heddle writes")
        return cls(entries=_entries().validate_python(entries), waited=waited, answer=answer, run=run)


def _diverged(key: str, entry: Entry, call: Call | None) -> SessionUnreadable:
    """The refusal of a record that holds, at `key`, something other than what the run does there now."""
    held = entry.answers()
    what = str(held) if held is not None else _HELD[entry.type]
    now = str(call) if call is not None else "something else"
    return SessionUnreadable(
        f"resuming the session: at journal position {key} the record holds {what}, but the run now makes {now} "
        "there (the document, its tools or heddle changed, or the run is not deterministic); nothing recorded is "
        "handed to another call: start a new session for this run")


def _bound(waiting: WaitingFor, answer: Answer) -> Answer:
    """`answer`, when it answers the call `waiting` is for: a call's answer is bound to the fingerprint of
    the arguments shown, and a call with any other arguments is never run on it."""
    if waiting.kind != "message" and (answer.fingerprint is None or answer.fingerprint != waiting.fingerprint):
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
