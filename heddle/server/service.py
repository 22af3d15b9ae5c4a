"""What one server runs, prepared once at start-up, and how a request becomes a prepared run.

A server runs either one sealed bundle (requests carry only inputs) or the flows requests
name: inline, or by `flowPath` under `--flows-root`, with `--tools-dir` tools and, when
allowed, tools sent in the request. With `--session-store` it keeps sessions: a run in one is a
turn of heddle.sessions.turn, bound to the bundle's digest or to the digest of the flow it read.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from heddle.errors import HeddleError, SessionError, SessionNotFound
from heddle.server.admission import Admission
from heddle.server.config import ENV_SESSION_KEY, ServerConfig
from heddle.server.edition import Edition, Lease, build_edition
from heddle.server.errors import ApiError, bad_request
from heddle.server.flow_cache import FlowCache, Ready
from heddle.server.metrics import REQUEST_TOOL, Metrics
from heddle.server.model_policy import ModelPolicy, check_allow_net
from heddle.server.request_code import ToolFolder
from heddle.server.run_request import SESSIONS_OFF, RunRequest, missing_inputs, parse_run_request
from heddle.server.served_bundle import digest_of
from heddle.settings import RunSettings
from heddle.tools.command_run import with_commands

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.engine.run import PreparedRun
    from heddle.server.model_policy import PolicyPlan
    from heddle.sessions.store import SessionStore
    from heddle.sessions.turn import SessionUse
    from heddle.tools.commands import CommandSet

T = TypeVar("T")


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
                await asyncio.to_thread(folder.close)
        finally:
            self.close()


@dataclass
class _Resolved:
    flow: Any
    tools: dict[str, Path]
    tools_dir: Path | None
    source: str
    from_request: bool
    folder: ToolFolder | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    message: str | None = None
    request: RunRequest = field(default_factory=RunRequest)
    ready: Ready | None = None  # the flow as read (and prepared) from its document, perhaps kept (flow_cache)


def run_settings(config: ServerConfig, sealed: Any = None) -> RunSettings:
    """The settings of every run of this server: with a bundle, settled as `heddle run` settles
    them (its proposals yield to flags given; its own mounts and plugins come first)."""
    from heddle.settings import settle

    if sealed is None:
        return config.settings
    # Every proposal the manifest makes (a bundle of the old format has only its tool-round limit).
    manifest = getattr(sealed, "manifest", None)
    proposals = manifest.proposals if manifest is not None else {"max_tool_rounds": sealed.max_tool_rounds}
    return settle(config.settings, proposals, given=config.given,
                  mounts=sealed.mounts, plugins=getattr(sealed, "plugins", ()))


def load_plugins(config: ServerConfig, sealed: Any = None) -> Any:
    """One PluginHost for the whole server (a bundle's own plugins first, then --plugin), or None.
    Manifests are read and settings checked now; plugin processes start on first use."""
    settings = run_settings(config, sealed)
    if not settings.plugins:
        return None
    from heddle.plugin_host import PluginHost

    # keep_running: the processes serve every run of this server and stop with it (Service.aclose).
    return PluginHost.load(list(settings.plugins), config_specs=settings.plugin_configs,
                           timeout=settings.plugin_timeout, max_node_attempts=settings.max_node_attempts,
                           keep_running=True)


def run_options(config: ServerConfig, sealed: Any = None) -> Any:
    """The engine's RunOptions for every run of this server, its messages in the server's units."""
    from heddle.engine.options import with_egress
    from heddle.surface import SERVER

    manifest = getattr(sealed, "manifest", None)
    return with_egress(run_settings(config, sealed).run_options(surface=SERVER), getattr(manifest, "egress", None),
                       getattr(manifest, "secrets", None))


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1000)


def open_sessions(config: ServerConfig, host: Any = None) -> SessionStore | None:
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

    def __init__(self, config: ServerConfig, *, sealed: Any = None, oci_digest: str | None = None) -> None:
        self.config = config
        self.metrics = Metrics(config.max_concurrent)
        self.admission = Admission(config.max_concurrent, self.metrics)
        self.policy = ModelPolicy(allow_net=check_allow_net(config.allow_net), default_url=config.llm_default_url,
                                  default_key=config.llm_default_key if config.llm_default_url else None)
        # Everything that can be refused without a request is refused now, before the port opens.
        # The one reference to what is served: a following server swaps it whole (swap).
        self.edition: Edition = build_edition(config, self.policy, sealed, self.metrics.observer(from_request=False))
        self.edition.oci_digest = oci_digest  # the registry's digest of a bundle pulled by reference
        self._closing: set[asyncio.Task[None]] = set()
        self._retired: set[Edition] = set()  # swapped out, closed once their last run ends (or at aclose)
        # Request flows as read and prepared, by document (heddle.server.flow_cache).
        self.flows = FlowCache()
        self.follower: Any = None  # a heddle.server.follow.Follower when --pull-interval follows a tag
        self.metrics.bundle_served(sealed, oci_digest)
        # Last, so that nothing else can fail once it is open: the caller closes it (aclose).
        self.sessions = open_sessions(config, self.host)
        if self.sessions is not None:
            from heddle.server.sessions import Expiring

            self.sessions = Expiring(self.sessions, config.session_idle_timeout)

    # What the served edition holds, read through the one reference a swap changes.
    @property
    def sealed(self) -> Any:
        return self.edition.sealed

    @property
    def tools(self) -> dict[str, Path]:
        return self.edition.tools

    @property
    def tools_dir(self) -> Path | None:
        return self.edition.tools_dir

    @property
    def commands(self) -> CommandSet | None:
        return self.edition.commands

    @property
    def host(self) -> Any:
        return self.edition.host

    @property
    def node_types(self) -> frozenset[str]:
        return self.edition.node_types

    @property
    def options(self) -> Any:
        return self.edition.options

    @property
    def bundle_run(self) -> PreparedRun | None:
        return self.edition.bundle_run

    @property
    def tool_listing(self) -> dict[str, Any]:
        return self.edition.tool_listing

    def swap(self, edition: Edition) -> Edition:
        """Serve `edition` from the next request on. One assignment on the event loop, so a request is
        prepared wholly on the old edition or wholly on the new; runs already going keep the old one
        (their lease), which is closed once the last of them ends."""
        old, self.edition = self.edition, edition
        self.metrics.bundle_served(edition.sealed, edition.oci_digest)
        self._retired.add(old)
        old.retire(self._close_later)
        return old

    def _close_later(self, edition: Edition) -> None:
        async def close() -> None:
            try:
                await edition.aclose()
            finally:
                self._retired.discard(edition)

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    # ------------------------------------------------------------------ requests

    def _refuse_for_bundle(self, request: RunRequest) -> None:
        named = [name for name, given in (("flow", request.flow is not None),
                                          ("flowPath", request.flow_path is not None),
                                          ("tools", bool(request.tools))) if given]
        if named:
            raise bad_request(f"request field {named[0]!r}: this server runs the bundle {self.sealed.name!r} "
                              f"({digest_of(self.sealed)}) and nothing else; send only 'inputs'", "bundle_only")

    async def _resolve(self, body: dict[str, Any], *, run: bool = False) -> _Resolved:
        request = parse_run_request(body, allow_request_code=self.config.allow_request_code,
                                    sessions=self.sessions is not None if run else None)
        edition = self.edition
        if self.sealed is not None:
            self._refuse_for_bundle(request)
            self._strict(self.sealed.flow)
            return _Resolved(self.sealed.flow, self.tools, self.tools_dir, f"bundle {self.sealed.name}",
                             False, inputs={**self.sealed.input, **request.inputs}, message=request.message,
                             request=request)
        # A request's own tools make its preparation its own: such a flow is read (or found) here and
        # prepared later, with them.
        if request.flow is not None:
            ready = await self._ready_value(request.flow, edition, prepare=not request.tools)
            source, from_request = "flow", True
        elif request.flow_path is not None:
            if self.config.flows_root is None:
                raise bad_request("request field 'flowPath': this server has no --flows-root; send the "
                                  "document itself as 'flow'", "no_flows_root")
            ready = await asyncio.to_thread(self._ready_file, self.config.flows_root, request.flow_path, edition,
                                            prepare=not request.tools)
            source, from_request = f"flowPath {request.flow_path}", False
        else:
            raise bad_request("the request names no flow; give 'flow' (the document) or 'flowPath'")
        self._strict(ready.flow)
        tools, tools_dir, folder = dict(self.tools), self.tools_dir, None
        if request.tools:
            clash = sorted(t.name for t in request.tools if t.name in tools or t.name in self._command_names())
            if clash:
                raise bad_request(f"tools: {clash[0]!r} is already a tool of this server; give yours another name")
            folder = await asyncio.to_thread(ToolFolder, request.tools, parent=self.config.work_dir)
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
        from heddle.engine.run import prepare_run
        from heddle.runs import tracing_for

        def prepare(flow: Flow) -> PreparedRun:
            prepared = prepare_run(flow, tools=dict(edition.tools), tools_dir=edition.tools_dir,
                                   options=edition.options, sandbox_flags=self.config.sandbox_flags,
                                   plugins=with_commands(edition.host, edition.commands, flow),
                                   tracing=tracing_for(self.config.settings),
                                   observer=self.metrics.observer(from_request=from_request))
            self.policy.assign_keys(flow, prepared.endpoints, from_request=from_request)
            return prepared

        return prepare

    async def _ready_value(self, value: Any, edition: Edition, *, prepare: bool) -> Ready:
        """A request's `flow`, kept from an earlier request of the same document or read and prepared
        now, in one worker thread."""
        from heddle.server.documents import flow_from_value
        from heddle.server.flow_cache import read_ready, value_key

        keyed = value_key(value)
        if keyed is not None:
            kept = self.flows.get(keyed[0], edition)
            if kept is not None:
                return kept
        ready = await asyncio.to_thread(read_ready, lambda: flow_from_value(value, node_types=edition.node_types),
                                        self._preparer(edition, from_request=True) if prepare else None,
                                        edition=edition, plan=self.policy.plan, size=keyed[1] if keyed else 0)
        if keyed is not None:
            self.flows.put(keyed[0], ready)
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
        ready = read_ready(lambda: flow_from_text(text, name, node_types=edition.node_types),
                           self._preparer(edition, from_request=False) if prepare else None,
                           edition=edition, plan=None, size=len(data))
        self.flows.put(key, ready)
        return ready

    async def prepare(self, body: dict[str, Any]) -> Job:
        """The request as a job ready to run, or the 400 saying what is wrong with it."""
        # Leased before anything reads the edition, so that a swap meanwhile leaves this request on it.
        lease = self.edition.lease()
        try:
            resolved = await self._resolve(body, run=True)
        except BaseException:
            lease.release()
            raise
        request = resolved.request
        try:
            if request.session is None:
                self._refuse_waits(resolved.flow, resolved.source)
                check_run(resolved.flow, resolved.inputs, resolved.message, source=resolved.source)
            prepared = lease.edition.bundle_run or await self._prepare(resolved)
        except BaseException:
            lease.release()
            if resolved.folder is not None:
                await asyncio.to_thread(resolved.folder.close)
            raise
        # The server's plugins, if any, are in `prepared`: its runs go through their seams.
        job = Job(prepared, resolved.inputs, frozenset(self.tools) | self._plugin_tools() | self._command_names(),
                  resolved.folder,
                  resolved.message, source=resolved.source, lease=lease)
        if request.session is not None:
            # In a session the message and the inputs are checked once the turn is known: a run that
            # resumes keeps the ones it started with (heddle.sessions.turn).
            from heddle.sessions.turn import SessionUse
            from heddle.surface import SERVER

            assert self.sessions is not None, "parse_run_request refuses a session when there is no store"
            job.session = SessionUse(self.sessions, request.session, answer=request.answer, resume=request.resume,
                                     create=False, surface=SERVER)
            job.digest, job.document = self._binding(resolved)
            job.inputs_given = request.inputs_given
        return job

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

    def _binding(self, resolved: _Resolved) -> tuple[str, str]:
        """What a session run of `resolved` is bound to: the bundle's digest, or the digest of the flow
        the request named as heddle read it (as `heddle run` binds a document, so that an edit that
        changes what runs changes it), and its name for messages."""
        if self.sealed is not None:
            from heddle.bundle.verified import digest_text

            return digest_text(str(self.sealed.digest)), f"bundle {self.sealed.name!r}"
        from heddle.sessions.turn import flow_digest

        digest = resolved.ready.binding() if resolved.ready is not None else flow_digest(resolved.flow)
        document = resolved.source if resolved.request.flow_path is not None else f"flow {resolved.flow.name!r}"
        return digest, document

    # ------------------------------------------------------------------ sessions

    def _store(self) -> SessionStore:
        if self.sessions is None:
            raise bad_request(SESSIONS_OFF[0].upper() + SESSIONS_OFF[1:], "sessions_off")
        return self.sessions

    async def _call(self, store: SessionStore, call: Callable[[], T]) -> T:
        """A store call, off the event loop; its errors in the request's terms."""
        from heddle.server.sessions import for_http

        try:
            return await asyncio.to_thread(call)
        except SessionError as exc:
            raise for_http(exc, store.name) from None

    async def new_session(self) -> str:
        """A new, empty session with an id of the server's choosing. A bundle server binds it to its
        bundle now; otherwise its first run binds it to the document that run names."""
        from heddle.sessions.open import new_session_id
        from heddle.sessions.record import Record

        store = self._store()
        await self._call(store, lambda: self._room(store))
        sid = new_session_id()
        digest, document = "", ""
        if self.sealed is not None:
            from heddle.bundle.verified import digest_text

            digest, document = digest_text(str(self.sealed.digest)), f"bundle {self.sealed.name!r}"
        data = Record(id=sid, digest=digest, document=document).encode()
        await self._call(store, lambda: store.create(sid, data))
        return sid

    def _room(self, store: SessionStore) -> None:
        """Room for one more session under --max-sessions (expired ones are removed first); 507 when
        there is none. Servers sharing a store count it together, so at most a creation racing this
        one may pass the cap."""
        from heddle.server.sessions import Expiring

        live = store.sweep() if isinstance(store, Expiring) else len(store.index())
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
        stored = await self._call(store, lambda: store.get(session_id))
        if stored is None:
            raise self._unknown(session_id)
        return await self._call(store, lambda: decode(session_id, stored.data, store=store.name).summary())

    async def delete_session(self, session_id: str) -> None:
        from heddle.sessions.store import check_session_id

        store = self._store()
        check_session_id(session_id)
        if not await self._call(store, lambda: store.delete(session_id)):
            raise self._unknown(session_id)

    async def _prepare(self, resolved: _Resolved) -> Any:
        from heddle.engine.run import prepare_run
        from heddle.runs import tracing_for

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
        prepared = await asyncio.to_thread(
            prepare_run, resolved.flow, tools=resolved.tools, tools_dir=resolved.tools_dir,
            options=self.options, sandbox_flags=self.config.sandbox_flags,
            plugins=with_commands(self.host, self.commands, resolved.flow),
            tracing=tracing_for(self.config.settings),
            observer=self.metrics.observer(from_request=resolved.from_request))
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
            plugins = with_commands(self.host, self.commands, resolved.flow)
            tools = plugins.known_tools(resolved.tools) if plugins is not None else resolved.tools
            report = validation_report(resolved.flow, tools=tools, source=resolved.source,
                                       tools_dir=resolved.tools_dir)
            if self.sealed is not None:
                report["bundle"] = {"name": self.sealed.name, "digest": digest_of(self.sealed)}
            if self.host is not None:
                report["plugins"] = self.plugin_rows()
            if report["valid"]:
                # What the graph check cannot see: model URLs and keys, sandbox, mounts, plugins.
                try:
                    await self._prepare(resolved)
                except (ApiError, HeddleError) as exc:
                    report["problems"].append(exc.message)
                report["valid"] = not report["problems"]
        finally:
            lease.release()
            if resolved.folder is not None:
                await asyncio.to_thread(resolved.folder.close)
        return report

    # ------------------------------------------------------------------ plugins

    def _plugin_tools(self) -> frozenset[str]:
        return frozenset(self.host.tools) if self.host is not None else frozenset()

    def _command_names(self) -> frozenset[str]:
        return frozenset(self.commands.commands) if self.commands is not None else frozenset()

    def protocols(self) -> list[str]:
        """How a run's events can be rendered: heddle's own, and each loaded encoder plugin's."""
        return ["heddle", *sorted(self.host.encoders if self.host is not None else ())]

    def encoder(self, protocol: str | None) -> Any:
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
        """Stop the plugin processes, remove their homes and the bundle's temporary data folder
        (of the edition served and of any a swap retired)."""
        try:
            await self.edition.aclose()
            # And a retired edition a run still held when the server stopped (after a second signal).
            await asyncio.gather(*self._closing, *(edition.aclose() for edition in list(self._retired)),
                                 return_exceptions=True)
        finally:
            if self.sessions is not None:
                sessions, self.sessions = self.sessions, None
                await asyncio.to_thread(sessions.close)

    # ------------------------------------------------------------------ description

    def capabilities(self) -> dict[str, Any]:
        from heddle import __version__
        from heddle.engine.events import EVENT_TYPES

        config, options = self.config, self.options
        caps: dict[str, Any] = {
            "version": __version__,
            "allowRequestCode": config.allow_request_code,
            "acceptsFlowPath": self.sealed is None and config.flows_root is not None,
            "acceptsFlow": self.sealed is None,
            "sessions": self.sessions is not None,
            "sandbox": {"safe": options.sandbox.safe, "backend": options.sandbox.backend,
                        "denyNet": options.sandbox.deny_net},
            "tools": sorted({*self.tools, *self._command_names()}),
            "protocols": self.protocols(),
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
            caps["bundle"] = {"name": self.sealed.name, "digest": digest_of(self.sealed),
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
