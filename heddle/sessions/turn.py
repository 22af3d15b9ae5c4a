"""One turn of a session: the run a caller asked for, started, resumed or continued in its session.

The same for the CLI, the library and the server: given the store, the session and what the caller
brings (inputs, a message, an answer, `--resume`, `--durable`), decide what the run is before
anything runs (a new run, the next user turn of a conversation, the resumption of a run waiting for
a person, or of a durable run that was killed), run it with its journal and conversation, and write
the session back with one compare-and-swap on the version read at the start. A run that fails
writes nothing (a durable run's checkpoints stay, for `--resume`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from heddle.engine.conversation import Conversation
from heddle.engine.journal import Answer, Journal, WaitingFor, describe
from heddle.errors import CallDenied, SessionAlreadyAnswered, SessionConflict, SessionError, SessionNotFound
from heddle.sessions.record import Pending, Record, decode
from heddle.surface import CLI, Surface

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.engine.run import RunOutcome
    from heddle.sessions.store import SessionStore, Stored


@dataclass(frozen=True)
class SessionUse:
    """How a run uses a session.

    `create`: an unknown id opens a new session (the CLI's names), else it is SessionNotFound (the
    server's ids, issued by POST /v1/sessions). `answer` resumes a run that waits; `resume`
    continues a `--durable` run that never finished; `durable` writes a checkpoint after every node.
    """

    store: SessionStore
    session_id: str
    answer: Answer | None = None
    resume: bool = False
    durable: bool = False
    create: bool = True
    # How the shell that asks names what a person gives (--approve, or "answer": {"approve": true}).
    surface: Surface = CLI


@dataclass(frozen=True)
class Turn:
    """What a turn runs: its inputs and message, the journal to resume from, the conversation so far."""

    inputs: dict[str, Any]
    message: str | None
    journal: Journal
    conversation: Conversation
    # A run resumed with an answer (or with --resume after one): the wait it answers. Claimed before
    # anything runs, so that of answers racing to one wait exactly one runs.
    answered: WaitingFor | None = None
    claim: bool = False


# The run itself, given the turn: heddle.runs.execute with the turn's journal and conversation.
Runner = Callable[[Turn], Awaitable["RunOutcome"]]


@dataclass(frozen=True)
class TurnResult:
    outcome: RunOutcome
    session: str
    version: int  # the session's version after this turn


def document_digest(document: Any) -> str:
    """The digest a document run outside a bundle binds its sessions to: sha256 of its canonical JSON."""
    from heddle.canonical import fingerprint

    return fingerprint(document)


def flow_digest(flow: Flow) -> str:
    """`document_digest` of the flow heddle read from a document (an edit that changes what runs changes
    it; one of layout alone does not): what the CLI, the library and the server bind sessions to."""
    return document_digest(flow.model_dump(mode="json", by_alias=True))


async def run_turn(use: SessionUse, *, digest: str, document: str, inputs: dict[str, Any], inputs_given: bool,
                   message: str | None, run: Runner) -> TurnResult:
    """Run one turn of `use`'s session (see the module's docstring). `inputs` are what a new run would
    take; `inputs_given` says the caller gave them (a resumed run keeps its own, and refuses others)."""
    store, sid = use.store, use.session_id
    stored = await asyncio.to_thread(store.get, sid)
    record, version = _opened(use, stored, digest=digest, document=document)
    turn = _turn(use, record, inputs=inputs, inputs_given=inputs_given, message=message)
    written = version

    async def write(new: Record) -> None:
        nonlocal written, record
        data = new.encode()
        if written == 0:
            saved = await asyncio.to_thread(store.create, sid, data)
        else:
            saved = await asyncio.to_thread(store.replace, sid, data, version=written)
        written, record = saved.version, new

    if use.durable:
        # Parallel branches finish nodes at once: their checkpoints go one at a time (each on the
        # version the last one wrote), each with the journal as it is when it is written.
        one_at_a_time = asyncio.Lock()

        async def checkpoint(journal: Journal) -> None:
            async with one_at_a_time:
                await write(record.with_(pending=Pending("running", turn.inputs, turn.message, journal.as_json(),
                                                         answered=turn.answered)))

        # The first checkpoint is the StartNode's: a run killed after it resumes from its start, while
        # one refused before it (no message, a missing input) leaves the session as it was.
        turn.journal.checkpoint = checkpoint
    if turn.claim:
        # Before anything runs: the wait is answered (or the stopped run resumed) once. The record says
        # so, its journal holds the answer, and every other answer to it is refused from now on.
        try:
            await write(record.with_(pending=Pending("running", turn.inputs, turn.message, turn.journal.as_json(),
                                                     answered=turn.answered)))
        except SessionConflict:
            if turn.answered is not None:
                raise _already_answered(use, turn.answered) from None
            raise
    try:
        outcome = await run(turn)
    except Exception as exc:
        if turn.answered is not None and (not use.durable or isinstance(exc, CallDenied)):
            # The run the answer resumed ended: the session waits no more, and what the answer let run is
            # not run again unasked (a --durable run keeps its checkpoints for --resume, but past a denial).
            try:
                await write(record.with_(pending=None))
            except SessionError:
                pass  # another run wrote first, or the store is gone: the run's own failure is the news
        raise
    if outcome.waiting is not None:
        await write(record.with_(pending=Pending("waiting", turn.inputs, turn.message, turn.journal.as_json(),
                                                 outcome.waiting)))
    else:
        await write(record.with_(pending=None, turns=record.turns + 1, conversation=turn.conversation.as_json(),
                                 inputs=turn.inputs))
    return TurnResult(outcome, sid, written)


def _opened(use: SessionUse, stored: Stored | None, *, digest: str, document: str) -> tuple[Record, int]:
    """The session's record and version (0: not written yet), checked against the document."""
    sid, where, say = use.session_id, use.store.name, use.surface.say
    if stored is None:
        if not use.create:
            raise SessionNotFound(f"session {sid!r}: there is no such session in {where}; start one "
                                  "(POST /v1/sessions) and use the id it gives")
        if use.answer is not None or use.resume:
            what = say("resume") if use.resume else say(use.answer.kind) if use.answer else ""
            raise SessionNotFound(f"session {sid!r}: there is no such session in {where}, so nothing waits for "
                                  f"{what}; start the run without it")
        return Record(id=sid, digest=digest, document=document), 0
    record = decode(sid, stored.data, store=where)
    if not record.digest:
        # Issued by POST /v1/sessions before any run: its first run binds it, in the same write as its turn.
        return replace(record, digest=digest, document=document), stored.version
    if record.digest != digest:
        raise SessionError(f"session {sid!r} belongs to {record.document or 'another document'} ({record.digest}), "
                           f"not to {document} ({digest}); a session resumes only with the document that opened "
                           f"it: use {say('new_session')}")
    return record, stored.version


def _turn(use: SessionUse, record: Record, *, inputs: dict[str, Any], inputs_given: bool,
          message: str | None) -> Turn:
    sid, answer, pending, say = use.session_id, use.answer, record.pending, use.surface.say
    conversation = Conversation.from_json(record.conversation)
    if pending is None:
        if answer is not None:
            raise SessionError(f"session {sid!r} waits for nothing: its last run finished; run the next turn "
                               f"without {say(answer.kind)}")
        if use.resume:
            raise SessionError(f"session {sid!r} has no unfinished run to resume: its last run finished; drop "
                               f"{say('resume')}")
        # A later turn runs with the inputs the session has, but for those it names itself.
        return Turn({**record.inputs, **inputs}, message, Journal(), conversation)
    if inputs_given and {**pending.inputs, **inputs} != pending.inputs:
        raise SessionError(f"session {sid!r}: its unfinished run resumes with the input it started with; drop "
                           f"{say('input')} (or use {say('new_session')} for other input)")
    if pending.status == "running":
        if answer is not None and pending.answered is not None:
            raise _already_answered(use, pending.answered)
        if not use.resume:
            what = (f"resumed with the answer to {describe(pending.answered.kind)} at node "
                    f"{pending.answered.node!r}" if pending.answered is not None else f"({say('durable')})")
            raise SessionError(f"session {sid!r}: its last run {what} did not finish (it was stopped, or it is "
                               f"still running elsewhere); continue it from its last checkpoint with "
                               f"{say('resume')}")
        if answer is not None:
            raise SessionError(f"session {sid!r}: its unfinished run waits for no answer; drop "
                               f"{say(answer.kind)} and resume it with {say('resume')}")
        journal = Journal.from_json(pending.journal)
        if pending.answered is not None and journal.waited is not None:
            # A run that took an answer did not finish: it may still be going on elsewhere, so the answer is
            # not taken a second time. Unless the node that waited finished, the run waits for it again.
            journal.entries.pop(journal.waited, None)
        return Turn(pending.inputs, pending.message, journal, conversation, claim=True)
    waiting = pending.waiting_for
    assert waiting is not None, "a waiting run records what it waits for"
    if use.resume:
        raise SessionError(f"session {sid!r} waits for {describe(waiting.kind)} at node {waiting.node!r}: "
                           f"{say('resume')} continues a durable run that was stopped; answer it with "
                           f"{say(waiting.kind)} instead")
    if answer is None and message is not None and waiting.kind == "message":
        answer, message = Answer("message", message=message), None  # --message is the reply it waits for
    if answer is None:
        raise SessionError(f"session {sid!r} waits for {describe(waiting.kind)} at node {waiting.node!r}; "
                           f"answer with {say(waiting.kind)}")
    if answer.kind != waiting.kind:
        raise SessionError(f"session {sid!r} waits for {describe(waiting.kind)} at node {waiting.node!r}, not "
                           f"for {describe(answer.kind)}; answer with {say(waiting.kind)}")
    if message is not None:
        raise SessionError(f"session {sid!r} waits for {describe(waiting.kind)} at node {waiting.node!r}; "
                           f"{say('reply')} is not its answer: answer with {say(waiting.kind)}")
    if waiting.kind != "message":
        # Bound to the call shown: its fingerprint, checked again when the call is reached.
        if answer.fingerprint is not None and answer.fingerprint != waiting.fingerprint:
            raise SessionConflict(
                f"session {sid!r} waits for {describe(waiting.kind)} of the call to tool {waiting.tool!r} at node "
                f"{waiting.node!r} with arguments of fingerprint {waiting.fingerprint}, not {answer.fingerprint}: "
                "the answer was given for another call, and nothing ran; answer the call the session shows")
        answer = replace(answer, fingerprint=waiting.fingerprint)
    return Turn(pending.inputs, pending.message, Journal.from_json(pending.journal, answer=answer), conversation,
                answered=waiting, claim=True)


def _already_answered(use: SessionUse, waiting: WaitingFor) -> SessionAlreadyAnswered:
    return SessionAlreadyAnswered(
        f"session {use.session_id!r}: its wait for {describe(waiting.kind)} at node {waiting.node!r} was already "
        "answered (another answer was taken first); this one ran nothing")
