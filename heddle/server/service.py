"""What one server runs, prepared once at start-up, and how a request becomes a prepared run.

A server runs either one sealed bundle (requests carry only inputs) or the flows requests
name: inline, or by `flowPath` under `--flows-root`, with `--tools-dir` tools and, when
allowed, tools sent in the request. With `--session-store` it keeps sessions: a run in one is a
turn of heddle.sessions.turn, bound to the bundle's digest or to the digest of the flow it read.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from heddle.blocking import FLOW_PREPARATION, STORE_READS, WORKSPACE_COPIES, Tasks, run_blocking, run_blocking_undoable
from heddle.errors import HeddleError, SessionError, SessionNotFound, SessionOfAnotherDocument
from heddle.server.admission import Admission
from heddle.server.config import ENV_SESSION_KEY, SURFACES, ServerConfig
from heddle.server.edition import Edition, Lease, build_edition
from heddle.server.errors import ApiError, bad_request
from heddle.server.flow_cache import FlowCache, Ready
from heddle.server.metrics import REQUEST_TOOL, Metrics
from heddle.server.model_policy import ModelPolicy, check_allow_net
from heddle.server.request_code import ToolFolder
from heddle.server.run_request import SESSIONS_OFF, RunRequest, missing_inputs, parse_run_request

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.bundle.verified import Bundle
    from heddle.core import RunCore
    from heddle.engine.events import Event, EventSink
    from heddle.engine.run import PreparedRun, RunOutcome
    from heddle.engine.seams import Rendering
    from heddle.plugin_host.host import PluginHost
    from heddle.plugin_host.manifest import Component
    from heddle.server.admission import Ticket
    from heddle.server.follow import Follower
    from heddle.server.model_policy import PolicyPlan
    from heddle.server.recovery import Recovery
    from heddle.sessions.store import SessionStore, Stored
    from heddle.sessions.turn import SessionUse

T = TypeVar("T")

# How many releases a server with sessions keeps after a swap took them out of service, for the sessions
# begun on them (Service.swap): a conversation keeps the release it began on.
KEPT_RELEASES = 2

log = logging.getLogger("heddle.server")


@dataclass
class Job:
    """One admitted request, prepared and ready to run. `close()` removes what it wrote."""

    prepared: PreparedRun
    inputs: dict[str, Any]
    known_tools: frozenset[str]
    folder: ToolFolder | None = None
    message: str | None = None  # the user's message, for an agent document
    # A run in a session: the session, what it is bound to (a digest, and its name for messages),
    # whether the request gave 'inputs', and what the inputs are checked against once the turn is known.
    session: SessionUse | None = None
    digest: str = ""
    document: str = ""
    inputs_given: bool = False
    source: str = ""
    # The edition it was prepared on, held until the run ends (a following server may swap meanwhile).
    lease: Lease | None = None

    @property
    def flow_name(self) -> str:
        return self.prepared.flow.name

    def tool_label(self, tool: str) -> str:
        return tool if tool in self.known_tools else REQUEST_TOOL

    def close(self) -> None:
        if self.folder is not None:
            self.folder.close()
            self.folder = None
        if self.lease is not None:
            self.lease.release()

    async def aclose(self) -> None:
        """`close`, the request's tools folder removed in a worker thread while the loop serves others."""
        folder, self.folder = self.folder, None
        try:
            if folder is not None:
                await run_blocking(WORKSPACE_COPIES, folder.close)
        finally:
            self.close()

    async def run(self, on_event: EventSink, rendering: Rendering | None = None) -> RunOutcome:
        """The job on the core of the edition it was prepared on; in a session, one turn of it (started,
        continued or resumed, then written back), its session errors in the request's terms."""
        from heddle.server.sessions import for_http

        assert self.lease is not None, "a job holds the edition it was prepared on"
        try:
            return await self.lease.edition.core.run(
                self.prepared, self.inputs, message=self.message, on_event=on_event, rendering=rendering,
                session=self.session, digest=self.digest, document=self.document, inputs_given=self.inputs_given,
                check=lambda flow, inputs, message: check_run(flow, inputs, message, source=self.source))
        except SessionError as exc:
            said = for_http(exc, self.session.store.name if self.session is not None else "")
            if isinstance(exc, SessionOfAnotherDocument) and self.lease.edition.sealed is not None:
                # Not the caller's mistake: the server moved on to another release (docs/sessions.md).
                raise ApiError(409, "release_retired", said.message) from None
            raise said from None

    def answer(self, outcome: RunOutcome) -> dict[str, Any]:
        """POST /v1/runs's answer of a run that ended: its result, or in a session what it waits for."""
        session = self.session
        if outcome.waiting is not None:
            from heddle.server.sessions import waiting_body

            assert session is not None, "only a run in a session waits"
            return waiting_body(self.flow_name, session.session_id, outcome)
        body: dict[str, Any] = {"flow": self.flow_name, "state": outcome.state, "outputs": outcome.outputs}
        if outcome.messages:  # what the run showed its person (heddle.agentspec.messages)
            body["messages"] = list(outcome.messages)
        if session is not None:
            body["session"] = session.session_id
        return body


@dataclass(eq=False)
class Submitted:
    """A run a surface started (`Service.submit`): its job and its task. `aclose()` in a `finally`: a run
    still going is cancelled (its tools killed); slot, folder and metrics released."""

    service: Service
    job: Job
    ticket: Ticket
    on_event: EventSink
    task: asyncio.Task[RunOutcome] | None = None
    began: float = field(default_factory=time.perf_counter)
    # A session run's last event (flow_complete, waiting), held until its turn is written: a caller never
    # sees an end that a conflicting write then took back.
    held: list[Event] = field(default_factory=list)
    _closed: bool = False

    @property
    def session(self) -> str | None:
        return self.job.session.session_id if self.job.session is not None else None

    def deliver(self, event: Event) -> None:
        from heddle.engine.events import FlowComplete, Waiting

        if self.job.session is not None and isinstance(event, FlowComplete | Waiting):
            self.held.append(event)
        else:
            self.on_event(event)

    async def outcome(self) -> RunOutcome:
        """The run's end (the outcome's `waiting` is set when it stopped to wait for a person), then a
        session's held last event; raises its error (a HeddleError, or an ApiError for a caller's
        mistake found once its turn was known)."""
        assert self.task is not None
        outcome = await self.task
        while self.held:
            self.on_event(self.held.pop(0))
        return outcome

    def answer(self, outcome: RunOutcome) -> dict[str, Any]:
        """POST /v1/runs's JSON answer: the result, or in a session what the run waits for."""
        return self.job.answer(outcome)

    async def aclose(self) -> None:
        task = self.task
        if self._closed or task is None:
            return
        self._closed = True
        if not task.done():
            task.cancel()
            await asyncio.wait({task})
        try:
            await self.job.aclose()
        finally:
            self.ticket.release()
            ended = "cancelled" if task.cancelled() else "error" if task.exception() is not None else "ok"
            self.service.metrics.run_finished(ended, time.perf_counter() - self.began)


@dataclass
class _Resolved:
    flow: Flow
    tools: dict[str, Path]
    tools_dir: Path | None
    source: str
    from_request: bool
    folder: ToolFolder | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    message: str | None = None
    request: RunRequest = field(default_factory=RunRequest)
    ready: Ready | None = None  # the flow as read (and prepared) from its document, perhaps kept (flow_cache)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def open_sessions(config: ServerConfig, host: PluginHost | None = None) -> SessionStore | None:
    """The `--session-store`, opened and reachable (StoreUnavailable naming it and the cause), or
    None: without one the server is stateless."""
    settings = config.settings
    if settings.session_store is None:
        return None
    from heddle.sessions.open import open_store

    manifests = tuple(host.manifests.values()) if host is not None else ()
    return open_store(settings.session_store, db=settings.session_db, directory=settings.session_dir,
                      plugins=manifests, key_file=settings.session_key,
                      environ={} if config.session_key_env is None else {ENV_SESSION_KEY: config.session_key_env})


def check_run(flow: Flow, inputs: dict[str, Any], message: str | None, *, source: str) -> None:
    """What a run's message and inputs must be, checked before it starts (400 naming what is wrong)."""
    from heddle.agentspec.roots import check_message
    from heddle.engine.inputs import input_problem

    check_message(flow, message, named="request field 'message'", give="'message' in the request",
                  source=f"the {source}")
    missing = missing_inputs(flow, inputs)
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise bad_request(f"inputs: the flow {flow.name!r} needs {names}; send "
                          f'{{"inputs": {{"{missing[0]}": ...}}}}', "missing_input")
    problem = input_problem(flow, inputs)
    if problem is not None:
        raise bad_request(f"inputs: {problem} (as the flow {flow.name!r} declares in its "
                          "StartNode); send values of the declared types", "invalid_input")


class Service:
    """The server's state: its configuration, what it runs, its run slots and its metrics."""

    def __init__(self, config: ServerConfig, *, sealed: Bundle | None = None, oci_digest: str | None = None) -> None:
        self.config = config
        self.metrics = Metrics(config.max_concurrent)
        self.admission = Admission(config.max_concurrent, self.metrics)
        self.policy = ModelPolicy(allow_net=check_allow_net(config.allow_net), default_url=config.llm_default_url,
                                  default_key=config.llm_default_key if config.llm_default_url else None)
        # Everything that can be refused without a request is refused now, before the port opens.
        # The one reference to what is served: a following server swaps it whole (swap).
        self.edition: Edition = build_edition(config, self.policy, sealed, self.metrics.observer(from_request=False))
        self.edition.oci_digest = oci_digest  # the registry's digest of a bundle pulled by reference
        # Every task the server starts is owned here, so that its end (aclose) stops and awaits each one.
        # Its own, which nobody awaits (draining, following a tag, a surface's transport): a failure is logged.
        self.tasks = Tasks(log)
        # The runs: the request that started one hears how it ended.
        self.runs = Tasks()
        self._closing = Tasks(log)  # retired editions being closed: awaited, never cut short
        self._retired: set[Edition] = set()  # swapped out, closed once their last run ends (or at aclose)
        # Of those, the releases kept for the sessions begun on them, by bundle digest, with their last use.
        self._kept: dict[str, tuple[Edition, float]] = {}
        # Request flows as read and prepared, by document (heddle.server.flow_cache).
        self.flows = FlowCache()
        self.follower: Follower | None = None  # when --pull-interval follows a tag
        self.metrics.bundle_served(sealed, oci_digest)
        # Last, so that nothing else can fail once it is open: the caller closes it (aclose).
        self.sessions = open_sessions(config, self.host)
        if self.sessions is not None:
            from heddle.server.sessions import Expiring

            self.sessions = Expiring(self.sessions, config.session_idle_timeout)
        self.edition.core.sessions = self.sessions
        self.recovery: Recovery | None = None  # started with the port open (heddle.server.serve)
        if self.sessions is not None:
            from heddle.server.recovery import Recovery, recovers

            if recovers(config):
                self.recovery = Recovery(self, self.sessions, lease=self.core.settings.session_lease)

    # What the served edition holds, read through the one reference a swap changes.
    @property
    def core(self) -> RunCore:
        return self.edition.core

    @property
    def sealed(self) -> Bundle | None:
        return self.edition.core.bundle

    @property
    def host(self) -> PluginHost | None:
        return self.edition.core.host

    def swap(self, edition: Edition) -> Edition:
        """Serve `edition` from the next request on. One assignment on the event loop, so a request is
        prepared wholly on the old edition or wholly on the new; runs already going keep the old one
        (their lease), which is closed once the last of them ends. With sessions, the old release is kept
        for the sessions begun on it (their next turns run on it, `_release_of`): the last KEPT_RELEASES,
        each until a newer one pushes it out or none of its sessions came back for --session-idle-timeout
        (by then they have expired)."""
        old, self.edition = self.edition, edition
        edition.core.sessions = self.sessions
        self.metrics.bundle_served(edition.sealed, edition.oci_digest)
        self._retired.add(old)
        if self.sessions is not None and old.sealed is not None:
            self._kept[old.core.digest] = (old, time.monotonic())
            self._let_go()
        else:
            old.retire(self._close_later)
        return old

    def _let_go(self) -> None:
        """Retire the kept releases past KEPT_RELEASES (the oldest first) and those unused for the idle timeout."""
        stale = time.monotonic() - self.config.session_idle_timeout
        for digest, (edition, used) in list(self._kept.items()):
            if len(self._kept) > KEPT_RELEASES or used < stale:
                del self._kept[digest]
                edition.retire(self._close_later)

    def runs_release(self, digest: str) -> bool:
        """Whether a session run bound to `digest` runs here: the bundle served, or a release kept for it
        (recovery asks on each sweep, so an idle release is let go then too, not only on a session's turn)."""
        self._let_go()
        return self.sealed is not None and (digest == self.core.digest or digest in self._kept)

    async def _release_of(self, session_id: str) -> tuple[Stored | None, Edition | None]:
        """The session's record as read now (its turn starts from it), and the release it is bound to when
        this server holds it: served, kept, or (following a tag) pulled now because another replica
        already serves it. Only a following server, or one that keeps a release, looks."""
        from heddle.sessions.record import decode

        self._let_go()
        store = self.sessions
        if store is None or not (self._kept or self.follower is not None):
            return None, None
        try:
            stored = await store.get(session_id)
            if stored is None:
                return None, None
            data = stored.data
            digest = (await run_blocking(STORE_READS, lambda: decode(session_id, data, store=store.name))).digest
        except SessionError:
            return None, None  # the turn answers what is wrong with the session
        if digest and digest != self.core.digest and digest not in self._kept and self.follower is not None:
            await self.follower.catch_up(digest)
        # Looked up after the reads: a release let go meanwhile is not leased again.
        if digest == self.core.digest:
            return stored, self.edition
        kept = self._kept.get(digest)
        if kept is None:
            return stored, None
        self._kept[digest] = (kept[0], time.monotonic())
        return stored, kept[0]

    def _close_later(self, edition: Edition) -> None:
        async def close() -> None:
            try:
                await edition.aclose()
            finally:
                self._retired.discard(edition)

        self._closing.start(close(), name="closing a retired edition")

    # ------------------------------------------------------------------ requests

    @staticmethod
    def _refuse_for_bundle(sealed: Bundle, request: RunRequest) -> None:
        named = [name for name, given in (("flow", request.flow is not None),
                                          ("flowPath", request.flow_path is not None),
                                          ("tools", bool(request.tools))) if given]
        if named:
            raise bad_request(f"request field {named[0]!r}: this server runs the bundle {sealed.name!r} "
                              f"({sealed.digest}) and nothing else; send only 'inputs'", "bundle_only")

    async def _resolve(self, body: dict[str, Any], *, run: bool = False, edition: Edition | None = None,
                       flow_text: str | None = None) -> _Resolved:
        request = parse_run_request(body, allow_request_code=self.config.allow_request_code,
                                    sessions=self.sessions is not None if run else None)
        edition = edition or self.edition
        sealed = edition.sealed
        if sealed is not None:
            self._refuse_for_bundle(sealed, request)
            self._strict(sealed.flow)
            return _Resolved(sealed.flow, edition.core.tools, edition.core.tools_dir, f"bundle {sealed.name}",
                             False, inputs={**sealed.input, **request.inputs}, message=request.message,
                             request=request)
        # A request's own tools make its preparation its own: such a flow is read (or found) here and
        # prepared later, with them.
        if request.flow is not None:
            ready = await self._ready_value(request.flow, edition, prepare=not request.tools, text=flow_text)
            source, from_request = "flow", True
        elif request.flow_path is not None:
            if self.config.flows_root is None:
                raise bad_request("request field 'flowPath': this server has no --flows-root; send the "
                                  "document itself as 'flow'", "no_flows_root")
            ready = await run_blocking(FLOW_PREPARATION, self._ready_file, self.config.flows_root, request.flow_path,
                                       edition, prepare=not request.tools)
            source, from_request = f"flowPath {request.flow_path}", False
        else:
            raise bad_request("the request names no flow; give 'flow' (the document) or 'flowPath'")
        self._strict(ready.flow)
        tools, tools_dir, folder = edition.core.tools, edition.core.tools_dir, None
        if request.tools:
            tools = dict(tools)  # the edition's, with the request's own added
            clash = sorted(t.name for t in request.tools if t.name in tools or t.name in self._command_names())
            if clash:
                raise bad_request(f"tools: {clash[0]!r} is already a tool of this server; give yours another name")
            # A request cancelled while its tools are written leaves no folder behind.
            folder = await run_blocking_undoable(
                WORKSPACE_COPIES, lambda: ToolFolder(request.tools, parent=self.config.work_dir), ToolFolder.close)
            tools.update(folder.tools)
            tools_dir = tools_dir or folder.root
        return _Resolved(ready.flow, tools, tools_dir, source, from_request, folder, dict(request.inputs),
                         request.message, request, ready)

    def _strict(self, flow: Flow) -> None:
        """Under --strict, a document with a field the specification does not define is refused."""
        if self.config.settings.strict:
            from heddle.agentspec.document import check_strict

            check_strict(flow)

    def _preparer(self, edition: Edition, *, from_request: bool) -> Callable[[Flow], PreparedRun]:
        """How a request flow without tools of its own is prepared on `edition` (in a worker thread)."""

        def prepare(flow: Flow) -> PreparedRun:
            prepared = edition.core.prepare(flow, observer=self.metrics.observer(from_request=from_request))
            self.policy.assign_keys(flow, prepared.endpoints, from_request=from_request)
            return prepared

        return prepare

    async def _ready_value(self, value: Any, edition: Edition, *, prepare: bool, text: str | None = None) -> Ready:
        """A request's `flow`, kept from an earlier request of the same document or read and prepared
        now, in one worker thread."""
        from heddle.server.documents import flow_from_value
        from heddle.server.flow_cache import KnownFlow, read_ready, value_key

        if isinstance(value, KnownFlow):  # the text of a kept entry (FlowCache.known): not read again
            kept = self.flows.get(value.key, edition)
            if kept is not None:
                return kept
            text, value = value.text, value.read()  # let go meanwhile: read as any other
        keyed = value_key(value, text)
        if keyed is not None:
            kept = self.flows.get(keyed[0], edition)
            if kept is not None:
                return kept
        ready = await run_blocking(FLOW_PREPARATION, read_ready,
                                   lambda: flow_from_value(value, node_types=edition.core.node_types),
                                   self._preparer(edition, from_request=True) if prepare else None,
                                   edition=edition, plan=self.policy.plan, size=keyed[1] if keyed else 0)
        if keyed is not None:
            self.flows.put(keyed[0], ready, text=text if isinstance(value, dict) else None)
        return ready

    def _ready_file(self, root: Path, name: str, edition: Edition, *, prepare: bool) -> Ready:
        """A request's `flowPath`, read again (it may have changed) and, unless its bytes are those of
        a kept one, parsed and prepared. Blocking: runs in a worker thread."""
        from heddle.server.documents import flow_from_text
        from heddle.server.flow_cache import file_key, read_ready
        from heddle.server.flows_root import read_flow_text

        text = read_flow_text(root, name)
        data = text.encode("utf-8")
        key = file_key(name, data)
        kept = self.flows.get(key, edition)
        if kept is not None:
            return kept
        ready = read_ready(lambda: flow_from_text(text, name, node_types=edition.core.node_types),
                           self._preparer(edition, from_request=False) if prepare else None,
                           edition=edition, plan=None, size=len(data))
        self.flows.put(key, ready)
        return ready

    async def prepare(self, body: dict[str, Any], *, flow_text: str | None = None) -> Job:
        """The request as a job ready to run, or the 400 saying what is wrong with it. `flow_text`: its
        `flow` as the body wrote it (heddle.server.body.read_json_members), when the body was read here."""
        # Leased before anything reads the edition, so that a swap meanwhile leaves this request on it.
        lease = self.edition.lease()
        try:
            resolved = await self._resolve(body, run=True, edition=lease.edition, flow_text=flow_text)
            read = None
            if resolved.request.session is not None and lease.edition.sealed is not None:
                # A conversation keeps the release it began on, where this server holds it.
                read, began = await self._release_of(resolved.request.session)
                if began is not None and began is not lease.edition:
                    lease.release()
                    lease = began.lease()
                    resolved = await self._resolve(body, run=True, edition=began, flow_text=flow_text)
        except BaseException:
            lease.release()
            raise
        request = resolved.request
        try:
            if request.session is None:
                self._refuse_waits(resolved.flow, resolved.source)
                check_run(resolved.flow, resolved.inputs, resolved.message, source=resolved.source)
            prepared = lease.edition.bundle_run or await self._prepare(resolved, lease.edition.core)
        except BaseException:
            lease.release()
            if resolved.folder is not None:
                await run_blocking(WORKSPACE_COPIES, resolved.folder.close)
            raise
        # The server's plugins, if any, are in `prepared`: its runs go through their seams.
        job = Job(prepared, resolved.inputs, _tool_names(lease.edition.core), resolved.folder,
                  resolved.message, source=resolved.source, lease=lease)
        if request.session is not None:
            # In a session the message and the inputs are checked once the turn is known: a run that
            # resumes keeps the ones it started with (heddle.sessions.turn).
            job.session = lease.edition.core.session(request.session, answer=request.answer, resume=request.resume)
            if read is not None:
                job.session = replace(job.session, read=read)
            job.digest, job.document = self._binding(resolved, lease.edition)
            job.inputs_given = request.inputs_given
        return job

    def start(self, job: Job, ticket: Ticket, on_event: EventSink, *,
              rendering: Rendering | None = None) -> asyncio.Task[RunOutcome]:
        """Run `job` as a task of its own, which draining cancels; its tool calls counted, its events
        handed to `on_event` on the loop's thread, in order."""
        from heddle.engine.events import ToolResult

        loop, loop_thread, metrics = asyncio.get_running_loop(), threading.get_ident(), self.metrics

        def deliver(event: Event) -> None:
            if isinstance(event, ToolResult):
                metrics.tool_called(job.tool_label(event.tool), event.ok, event.duration_ms)
                metrics.command_called(job.tool_label(event.tool), event.output, event.duration_ms)
            on_event(event)

        def sink(event: Event) -> None:
            if threading.get_ident() == loop_thread:
                deliver(event)
            else:
                loop.call_soon_threadsafe(deliver, event)

        task = self.runs.start(job.run(sink, rendering))
        ticket.attach(task)
        task.add_done_callback(metrics.run_ended)
        return task

    async def submit(self, body: dict[str, Any], on_event: EventSink, *,
                     rendering: Rendering | None = None) -> Submitted:
        """What POST /v1/runs does with `body` (its shape), for another surface: a slot taken (ApiError
        429 busy, 503 draining), the request prepared (a 4xx for what is wrong with it), the run started."""
        ticket = self.admission.admit()
        try:
            job = await self.prepare(body)
        except BaseException:
            ticket.release()
            raise
        self.metrics.run_accepted()
        run = Submitted(self, job, ticket, on_event)
        run.task = self.start(job, ticket, run.deliver, rendering=rendering)
        return run

    def _refuse_waits(self, flow: Flow, source: str) -> None:
        """A document that may wait for a person, run without a session: refused before it starts."""
        from heddle.agentspec.roots import document_root

        waits = document_root(flow).waits
        if not waits:
            return
        more = f" (and {len(waits) - 1} more)" if len(waits) > 1 else ""
        how = ('send "session" with an id POST /v1/sessions issues, so that it can stop and resume'
               if self.sessions is not None else SESSIONS_OFF)
        raise ApiError(400, "needs_session", f"the {source} may wait for a person: {waits[0]}{more}; it runs only "
                                             f"in a session, and {how}")

    def _binding(self, resolved: _Resolved, edition: Edition) -> tuple[str, str]:
        """What a session run of `resolved` is bound to: the bundle's digest, or the digest of the flow
        the request named as heddle read it (as `heddle run` binds a document, so that an edit that
        changes what runs changes it), and its name for messages."""
        if edition.sealed is not None:
            return edition.core.digest, f"bundle {edition.sealed.name!r}"
        from heddle.sessions.turn import flow_digest

        digest = resolved.ready.binding() if resolved.ready is not None else flow_digest(resolved.flow)
        document = resolved.source if resolved.request.flow_path is not None else f"flow {resolved.flow.name!r}"
        return digest, document

    # ------------------------------------------------------------------ sessions

    def _store(self) -> SessionStore:
        if self.sessions is None:
            raise bad_request(SESSIONS_OFF[0].upper() + SESSIONS_OFF[1:], "sessions_off")
        return self.sessions

    async def _call(self, store: SessionStore, call: Awaitable[T]) -> T:
        """A store call; its errors in the request's terms."""
        from heddle.server.sessions import for_http

        try:
            return await call
        except SessionError as exc:
            raise for_http(exc, store.name) from None

    async def new_session(self) -> str:
        """A new, empty session with an id of the server's choosing. A bundle server binds it to its
        bundle now; otherwise its first run binds it to the document that run names."""
        from heddle.sessions.open import new_session_id
        from heddle.sessions.record import Record

        store = self._store()
        self.admission.check_open(run=False)
        await self._call(store, self._room(store))
        sid = new_session_id()
        digest, document = "", ""
        if self.sealed is not None:
            digest, document = self.sealed.digest, f"bundle {self.sealed.name!r}"
        data = Record(id=sid, digest=digest, document=document).encode()
        await self._call(store, store.create(sid, data))
        return sid

    async def _room(self, store: SessionStore) -> None:
        """Room for one more session under --max-sessions (expired ones are removed first); 507 when
        there is none. Servers sharing a store count it together, so at most a creation racing this
        one may pass the cap."""
        from heddle.server.sessions import Expiring

        assert isinstance(store, Expiring), "the server's store is always wrapped (Service.__init__)"
        live = await store.live(self.config.max_sessions)
        if live >= self.config.max_sessions:
            raise ApiError(507, "too_many_sessions",
                           f"this server holds {live} sessions, its cap (--max-sessions {self.config.max_sessions}); "
                           "a new one can be started once sessions expire or are removed (DELETE /v1/sessions/ID)")

    def _unknown(self, session_id: str) -> SessionNotFound:
        return SessionNotFound(f"there is no session {session_id!r} (it was never issued, or it was removed); "
                               "POST /v1/sessions issues a new one")

    async def session_summary(self, session_id: str) -> dict[str, Any]:
        """What GET /v1/sessions/{id} shows (Record.summary: never the journal)."""
        from heddle.sessions.record import decode
        from heddle.sessions.store import check_session_id

        store = self._store()
        check_session_id(session_id)
        stored = await self._call(store, store.get(session_id))
        if stored is None:
            raise self._unknown(session_id)
        return await self._call(store, run_blocking(STORE_READS, lambda: decode(session_id, stored.data,
                                                                               store=store.name).summary()))

    async def delete_session(self, session_id: str) -> None:
        from heddle.sessions.store import check_session_id

        store = self._store()
        check_session_id(session_id)
        if not await self._call(store, store.delete(session_id)):
            raise self._unknown(session_id)

    async def _prepare(self, resolved: _Resolved, core: RunCore) -> PreparedRun:
        ready = resolved.ready
        if resolved.from_request:
            # Every request: the plan's refusals raised and its addresses resolved again.
            plan: PolicyPlan | None = ready.plan if ready is not None else None
            await self.policy.check(plan if plan is not None else self.policy.plan(resolved.flow))
        if ready is not None and resolved.folder is None:
            if ready.failure is not None:
                raise ready.failure
            if ready.run is not None:
                return ready.run
        prepared = await run_blocking(FLOW_PREPARATION, lambda: core.prepare(
            resolved.flow, tools=resolved.tools, tools_dir=resolved.tools_dir,
            observer=self.metrics.observer(from_request=resolved.from_request)))
        self.policy.assign_keys(resolved.flow, prepared.endpoints, from_request=resolved.from_request)
        return prepared

    async def validate(self, body: dict[str, Any]) -> dict[str, Any]:
        """The validation report for the request's flow (or the bundle's); nothing runs."""
        from heddle.validation import validation_report

        lease = self.edition.lease()
        try:
            resolved = await self._resolve(body)
        except BaseException:
            lease.release()
            raise
        try:
            plugins = lease.edition.core.plugins_for(resolved.flow)
            tools = plugins.known_tools(resolved.tools) if plugins is not None else resolved.tools
            report = validation_report(resolved.flow, tools=tools, source=resolved.source,
                                       tools_dir=resolved.tools_dir)
            if self.sealed is not None:
                report["bundle"] = {"name": self.sealed.name, "digest": self.sealed.digest}
            if self.host is not None:
                report["plugins"] = self.plugin_rows()
            if report["valid"]:
                # What the graph check cannot see: model URLs and keys, sandbox, mounts, plugins.
                try:
                    await self._prepare(resolved, lease.edition.core)
                except (ApiError, HeddleError) as exc:
                    report["problems"].append(exc.message)
                report["valid"] = not report["problems"]
        finally:
            lease.release()
            if resolved.folder is not None:
                await run_blocking(WORKSPACE_COPIES, resolved.folder.close)
        return report

    # ------------------------------------------------------------------ plugins


    def _command_names(self) -> frozenset[str]:
        return frozenset(self.core.commands.commands) if self.core.commands is not None else frozenset()

    def protocols(self) -> list[str]:
        """How a run's events can be rendered: heddle's own, and each loaded encoder plugin's."""
        built_in = ["ag-ui"] if "ag-ui" in self.config.surfaces else []
        return ["heddle", *built_in, *sorted(self.host.encoders if self.host is not None else ())]

    def encoder(self, protocol: str | None) -> Component | None:
        """The encoder component for `?protocol=`, None for heddle's own events, or the 400."""
        if protocol is None or protocol == "heddle":
            return None
        component = self.host.encoders.get(protocol) if self.host is not None else None
        if component is None:
            raise bad_request(f"query parameter protocol={protocol!r}: no such protocol; this server has: "
                              + ", ".join(self.protocols()), "unknown_protocol")
        return component

    def plugin_rows(self) -> list[dict[str, Any]]:
        """The loaded plugins as a caller may see them (without where their files are)."""
        assert self.host is not None
        return [{k: v for k, v in row.items() if k != "manifest"} for row in self.host.describe()]

    async def aclose(self) -> None:
        """Stop every task the server started (cancelled and awaited) and the plugin processes, and remove
        their homes and the bundle's temporary data folder (of the edition served and of any a swap retired)."""
        try:
            # What outlived the drain (after a second signal, or without one): stopped before what they use.
            if self.recovery is not None:
                await self.recovery.aclose()
            await self.tasks.aclose()
            await self.runs.aclose()
            await self.edition.aclose()
            # And a retired edition a run still held when the server stopped, beside those closing.
            await asyncio.gather(*(edition.aclose() for edition in list(self._retired)), return_exceptions=True)
            await self._closing.wait()
        finally:
            await self._closing.aclose()
            if self.sessions is not None:
                sessions, self.sessions = self.sessions, None
                await sessions.close()

    # ------------------------------------------------------------------ description

    def capabilities(self) -> dict[str, Any]:
        from heddle import __version__
        from heddle.engine.events import EVENT_TYPES

        config, options = self.config, self.core.options
        caps: dict[str, Any] = {
            "version": __version__,
            "allowRequestCode": config.allow_request_code,
            "acceptsFlowPath": self.sealed is None and config.flows_root is not None,
            "acceptsFlow": self.sealed is None,
            "sessions": self.sessions is not None,
            "sandbox": {"safe": options.sandbox.safe, "backend": options.sandbox.backend,
                        "denyNet": options.sandbox.deny_net},
            "tools": sorted({*self.core.tools, *self._command_names()}),
            "protocols": self.protocols(),
            # The surfaces answered on (--serve), in the order they are documented.
            "serve": [name for name in SURFACES if name in config.surfaces],
            "events": list(EVENT_TYPES),
            "limits": {
                "maxConcurrent": config.max_concurrent,
                "timeoutMs": _ms(options.timeout),
                "toolTimeoutMs": _ms(options.tool_timeout),
                "toolOutputLimit": options.tool_output_limit,
                "maxIterations": options.max_iterations,
                "maxToolRounds": options.max_tool_rounds,
                "maxParallel": options.max_parallel,
                "maxBodyBytes": config.max_body_bytes,
                "drainTimeoutMs": _ms(config.drain_timeout),
                "headerTimeoutMs": _ms(config.header_timeout),
                "bodyTimeoutMs": _ms(config.body_timeout),
                "maxConnections": config.max_connections,
                "mountMaxBytes": options.workspace.max_bytes,
                "mountMaxEntries": options.workspace.max_entries,
            },
            "runsInFlight": self.admission.active,
            "runSaturation": self.admission.saturation,
            "draining": self.admission.draining,
        }
        if self.host is not None:
            caps["plugins"] = self.plugin_rows()
        if self.sealed is not None:
            caps["bundle"] = {"name": self.sealed.name, "digest": self.sealed.digest,
                              "signers": list(self.sealed.signers), "tools": dict(self.sealed.tool_fingerprints)}
            if self.edition.oci_digest is not None:
                caps["bundle"]["ociDigest"] = self.edition.oci_digest
            # What orders it against the next digest of a followed tag (bundle-format/SPEC.md, section 6.1).
            caps["bundle"]["signedAt"] = self.sealed.signed_at
            if self.sealed.manifest.release is not None:
                caps["bundle"]["release"] = self.sealed.manifest.release
        if self.follower is not None:
            caps["follow"] = self.follower.describe()
        return caps


def _tool_names(core: RunCore) -> frozenset[str]:
    """The tools an edition serves (its folder's, its plugins', its commands'), named in the metrics;
    any other a request flow's own. The edition a run leased: a kept release's are not the served one's."""
    plugins = frozenset(core.host.tools) if core.host is not None else frozenset()
    commands = frozenset(core.commands.commands) if core.commands is not None else frozenset()
    return frozenset(core.tools) | plugins | commands
