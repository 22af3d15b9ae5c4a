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
import contextlib
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from heddle.blocking import Tasks
from heddle.canonical import fingerprint
from heddle.engine.conversation import Conversation
from heddle.engine.journal import Answer, Entry, Journal, WaitingFor, describe
from heddle.errors import (
    CallDenied,
    SessionAlreadyAnswered,
    SessionConflict,
    SessionError,
    SessionNotFound,
    SessionOfAnotherDocument,
    SessionTooLarge,
)
from heddle.sessions import LEASE_SECONDS
from heddle.sessions.lease import Owner, new_owner, running
from heddle.sessions.record import Pending, Record, decode
from heddle.sessions.steps import StepLog, read_steps, step_line
from heddle.surface import NEUTRAL, Surface

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
    # How long the lease of a run this use writes `running` lasts unless renewed (heddle.sessions.lease).
    lease: float = LEASE_SECONDS
    # A server finishing the run of a replica that died (heddle.server.recovery): its result says so.
    recovered: bool = False
    create: bool = True
    # How the shell that asks names what a person gives (--approve, or "answer": {"approve": true}).
    surface: Surface = NEUTRAL
    # The session's record as the face read it just before (a server, to choose the release it runs on):
    # the turn starts from it rather than reading it again; its writes compare-and-swap on its version.
    read: Stored | None = None


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
    return fingerprint(document)


def flow_digest(flow: Flow) -> str:
    """`document_digest` of the flow heddle read from a document (an edit that changes what runs changes
    it; one of layout alone does not): what the CLI, the library and the server bind sessions to."""
    return document_digest(flow.model_dump(mode="json", by_alias=True))


async def run_turn(use: SessionUse, *, digest: str, document: str, inputs: dict[str, Any], inputs_given: bool,
                   message: str | None, run: Runner) -> TurnResult:
    """Run one turn of `use`'s session (see the module's docstring). `inputs` are what a new run would
    take; `inputs_given` says the caller gave them (a resumed run keeps its own, and refuses others)."""
    # The run's owner is known to this process from before its first write to after its last.
    with running(new_owner(use.lease)) as me:
        return await _run_turn(use, me, digest=digest, document=document, inputs=inputs, inputs_given=inputs_given,
                               message=message, run=run)


async def _run_turn(use: SessionUse, me: Owner, *, digest: str, document: str, inputs: dict[str, Any],
                    inputs_given: bool, message: str | None, run: Runner) -> TurnResult:
    store, sid = use.store, use.session_id
    stored = use.read if use.read is not None else await store.get(sid)
    record, version = _opened(use, stored, digest=digest, document=document)
    turn = _turn(use, record, inputs=inputs, inputs_given=inputs_given, message=message)
    if use.resume:
        # A resumed run stays durable: killed again, the next --resume goes on from where this one got.
        use = replace(use, durable=True)
    written = version
    turn.journal.session = sid
    # A store that appends steps (heddle.sessions.steps); the others get the whole record at each step.
    log = store if isinstance(store, StepLog) and getattr(store, "keeps_steps", True) else None
    steps_since = 0  # the steps appended after the record's version `written`
    if log is not None and record.pending is not None and record.pending.status == "running":
        # The run resumes from its last checkpoint and the steps appended after it.
        lines = await log.steps(sid, version)
        turn.journal.extend(read_steps(sid, lines, run=turn.journal.run, store=store.name), where=store.name)
        steps_since = len(lines)

    holding = True  # every record this run writes `running` names it the owner, with its lease renewed
    # Taking over a run another owner left: its first write goes through the store's `claim` where it has
    # one (Postgres: a row another taker holds at that moment is skipped, not waited for).
    taking_over = record.owner is not None and record.running

    async def write(new: Record) -> None:
        nonlocal written, record, steps_since, taking_over
        if new.running:
            new = replace(new, owner=me.renewed(use.lease) if holding else None)
        data = new.encode()
        if written == 0:
            if log is not None and use.durable:
                # Steps that a removed session of this name left behind are not this one's.
                await log.drop_steps(sid, sys.maxsize)
            saved = await store.create(sid, data)
        else:
            swap = getattr(store, "claim", None) if taking_over else None
            saved = await (swap or store.replace)(sid, data, version=written)
        written, record, taking_over = saved.version, new, False
        if log is not None and steps_since:
            # The record holds what they said now; steps of an older version are never read again.
            steps_since = 0
            with contextlib.suppress(SessionError):
                await log.drop_steps(sid, written)

    # Parallel branches finish nodes at once: their checkpoints go one at a time (each on the
    # version the last one wrote), each with the journal as it is when it is written; so does the
    # renewal of the lease.
    one_at_a_time = asyncio.Lock()
    if use.durable:

        async def checkpoint(journal: Journal) -> None:
            async with one_at_a_time:
                await write(record.with_(pending=Pending("running", turn.inputs, turn.message, journal.as_json(),
                                                         answered=turn.answered)))

        async def append(key: str, entry: Entry) -> None:
            # A step's intent or result, in the store before the run goes on.
            nonlocal steps_since
            async with one_at_a_time:
                if log is None or written == 0:
                    await write(record.with_(pending=Pending("running", turn.inputs, turn.message,
                                                             turn.journal.as_json(), answered=turn.answered)))
                    return
                steps_since += 1
                await log.append_step(sid, written, steps_since,
                                      step_line(turn.journal.run, key, entry.model_dump(mode="json")))

        # The first checkpoint is the StartNode's: a run killed after it resumes from its start, while
        # one refused before it (no message, a missing input) leaves the session as it was.
        turn.journal.checkpoint = checkpoint
        turn.journal.append = append
    if turn.claim:
        # Before anything runs: the wait is answered (or the stopped run resumed) once. The record says
        # so, its journal holds the answer, and every other answer to it is refused from now on.
        try:
            await write(record.with_(pending=Pending("running", turn.inputs, turn.message, turn.journal.as_json(),
                                                     answered=turn.answered)))
        except SessionConflict:
            if turn.answered is not None:
                raise _already_answered(use, turn.answered) from None
            await _taken(use)
            raise

    async def restore() -> None:
        # What this run made cannot be kept (its record would be over the cap), so nothing of it is: the
        # session is put back as it was before the run, owned by nobody.
        nonlocal holding
        holding = False
        with contextlib.suppress(SessionError):
            async with one_at_a_time:
                if written == version:
                    return
                if stored is None:
                    await store.delete(sid)
                else:
                    await write(decode(sid, stored.data, store=store.name))

    def now_running() -> Record:
        # The record as it was written; with the steps appended since, the journal as it is now (which
        # holds them: written in the record, they are dropped from the log).
        if not use.durable or not steps_since:
            return record.with_()
        return record.with_(pending=Pending("running", turn.inputs, turn.message, turn.journal.as_json(),
                                            answered=turn.answered))

    async def renew() -> None:
        async with one_at_a_time:
            if record.running and holding:  # else nothing written names this run yet
                await write(now_running())

    try:
        outcome = await _leased(use, run(turn), renew)
    except SessionTooLarge:
        await restore()
        raise
    except Exception as exc:
        if turn.answered is not None and (not use.durable or isinstance(exc, CallDenied)):
            # The run the answer resumed ended: the session waits no more, and what the answer let run is
            # not run again unasked (a --durable run keeps its checkpoints for --resume, but past a denial).
            try:
                await write(record.with_(pending=None))
            except SessionError:
                pass  # another run wrote first, or the store is gone: the run's own failure is the news
        elif record.running and record.owner is not None and not isinstance(exc, SessionConflict):
            # A run that failed is not one a replica picks up when its lease expires: it waits for
            # --resume. (One that was cancelled, or whose process died, keeps its lease to expire.)
            holding = False
            with contextlib.suppress(SessionError):
                async with one_at_a_time:
                    await write(now_running())
        raise
    try:
        if outcome.waiting is not None:
            await write(record.with_(pending=Pending("waiting", turn.inputs, turn.message, turn.journal.as_json(),
                                                     outcome.waiting)))
        else:
            await write(record.with_(pending=None, turns=record.turns + 1, conversation=turn.conversation.as_json(),
                                     inputs=turn.inputs, last={"outputs": outcome.outputs,
                                                               **({"recovered": True} if use.recovered else {})}))
    except SessionTooLarge:
        await restore()
        raise
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
        raise SessionOfAnotherDocument(
            f"session {sid!r} belongs to {record.document or 'another document'} ({record.digest}), not to "
            f"{document} ({digest}); a session resumes only with the document that opened it: use "
            f"{say('new_session')}")
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
        if record.owner is not None and record.owner.holds():
            raise _owned(use, record.owner)
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


def _owned(use: SessionUse, owner: Owner) -> SessionConflict:
    until = time.strftime("%H:%M:%S", time.localtime(owner.until))
    return SessionConflict(
        f"session {use.session_id!r}: its last run is still going on in {owner.describe()} (its lease, renewed "
        f"while it runs, holds until {until}); wait for it to finish, or continue it with "
        f"{use.surface.say('resume')} once that process has stopped and its lease has expired")


async def _taken(use: SessionUse) -> None:
    """After a claim lost its compare-and-swap: the refusal naming the run's new owner, if it has one."""
    try:
        stored = await use.store.get(use.session_id)
        record = decode(use.session_id, stored.data, store=use.store.name) if stored is not None else None
    except SessionError:
        return
    if record is not None and record.running and record.owner is not None and record.owner.holds():
        raise _owned(use, record.owner) from None


async def _leased(use: SessionUse, work: Awaitable[RunOutcome], renew: Callable[[], Awaitable[None]]) -> RunOutcome:
    """`work`, with `renew` called every third of the lease while it runs. When a renewal finds the
    record taken over (the lease had expired, and another process took the run), the run stops."""
    lost: list[SessionConflict] = []
    ended = asyncio.Event()  # no renewal starts once the run ended

    async def keep(task: asyncio.Task[RunOutcome]) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended.wait(), use.lease / 3)
            if ended.is_set():
                return
            try:
                await renew()
            except SessionConflict:
                lost.append(SessionConflict(
                    f"session {use.session_id!r}: this run's lease expired and another process took the run over; "
                    "this one stopped, and the run goes on there"))
                task.cancel()
                return
            except SessionError:
                continue  # the store is out of reach for now: the lease runs on until the next try

    keeper = Tasks()
    task = keeper.start(work)
    renewing = keeper.start(keep(task), name=f"lease of session {use.session_id}")
    try:
        return await task
    except asyncio.CancelledError:
        if lost:
            raise lost[0] from None
        raise
    finally:
        # A renewal under way finishes rather than being cut off: the store may apply a write whose
        # caller was cancelled, and the run's next write would then meet its own renewal as another
        # run's (a conflict that loses the turn, and leaves the run for recovery to do again).
        ended.set()
        try:
            await asyncio.wait({renewing})
        finally:  # a cancelled wait still leaves no renewal without its owner
            await keeper.aclose()
