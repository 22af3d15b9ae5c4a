"""Running a bundle or a document: `heddle.run` and `heddle.arun`, and the core `heddle run` shares.

One path for both: a `Bundle`'s proposals are settled against the settings given (the bundle
proposes, the caller disposes), its own mounts and plugins come first (`from_bundle`), or a
document is read with its tools and plugins (`from_document`); then the run is prepared (every
refusal made before a node runs) and run to its end (`execute`). The CLI adds only what a terminal
needs (trust flags, a prompt for the message, printing). A flow path is read as a document only: a
bundle runs only once it is opened against a `TrustPolicy`, so a path to one is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.errors import UsageError

if TYPE_CHECKING:
    import httpx

    from heddle.agentspec.components import Flow
    from heddle.agentspec.document import Components
    from heddle.bundle.runnable import SealedRun
    from heddle.bundle.verified import Bundle
    from heddle.engine.events import Event
    from heddle.engine.journal import Answer
    from heddle.engine.options import RunOptions
    from heddle.engine.run import PreparedRun, RunOutcome
    from heddle.engine.seams import Plugins, Rendering
    from heddle.engine.tracing import Tracing
    from heddle.plugin_host.host import PluginHost
    from heddle.sessions.store import SessionStore
    from heddle.sessions.turn import SessionUse
    from heddle.settings import RunSettings
    from heddle.tools.commands import CommandSet

StrPath = str | os.PathLike[str]
EventSink = Callable[["Event"], None]


@dataclass(frozen=True)
class RunResult:
    """A finished run: the final state, every event in order, the document's outputs alone (a
    flow's declared outputs; for an agent document `result`, its final answer, and its declared outputs),
    and the messages the run showed the person running it (its OutputMessageNodes'), in order.

    A run in a session (`session`, its name) may instead stop to wait for a person: `waiting` is then
    what it waits for (`{"kind": "message" | "approval" | "client_tool", "node": ..., "prompt"?,
    "tool"?, "arguments"?}`), `state` and `outputs` are empty and `messages` are those this step
    showed; the next run in the session with `answer=` resumes it."""

    flow: str
    state: dict[str, Any]
    events: tuple[Event, ...]
    outputs: dict[str, Any] = field(default_factory=dict)
    messages: tuple[str, ...] = ()
    waiting: dict[str, Any] | None = None
    session: str | None = None


PluginLoader = Callable[["RunSettings"], "PluginHost | None"]


@dataclass
class Loaded:
    """A run's target read: the flow, its tools, the settings (a bundle's proposals settled), the
    input, and the plugins (read and checked; their processes start on first use)."""

    flow: Flow
    tools: Mapping[str, Path]
    tools_dir: Path | None
    settings: RunSettings
    inputs: dict[str, Any]
    host: PluginHost | None
    # What a session run is bound to: a bundle's digest ("" for a document: the digest of its flow,
    # heddle.sessions.turn.flow_digest, made only for a run in a session); and what to call it in messages.
    digest: str = ""
    source: str = ""
    # The commands its flow may name as tools (heddle.tools.commands), if any.
    commands: CommandSet | None = None
    # A bundle's signer key ids and tools' input-schema fingerprints, which its trace spans carry.
    signers: tuple[str, ...] = ()
    fingerprints: Mapping[str, str] = field(default_factory=dict)
    # A bundle's sealed egress allow-lists, if it declares any (heddle.egress).
    egress: Mapping[str, tuple[str, ...]] | None = None
    secrets: Mapping[str, Mapping[str, Any]] | None = None


def from_bundle(sealed: SealedRun, settings: RunSettings, *, given: Collection[str] = (),
                inputs: Mapping[str, Any] | None = None, load_plugins: PluginLoader | None = None) -> Loaded:
    """A verified bundle's run: its proposals yield to the settings `given`, its own mounts and plugins
    (run from the verified cache) come before any given; `inputs` None takes the input it proposes."""
    from heddle.settings import settle

    if settings.egress or settings.secrets:
        raise UsageError(f"{'--egress' if settings.egress else '--secret'}: bundle {sealed.name!r} has its egress list "
                         "and secrets sealed in it; seal it again to change them")
    settings = settle(settings, sealed.manifest.proposals, given=given, mounts=sealed.mounts, plugins=sealed.plugins)
    if settings.strict:
        from heddle.agentspec.document import check_strict

        check_strict(sealed.flow)
    host = (load_plugins or _plugin_host)(settings)
    from heddle.bundle.verified import digest_text

    return Loaded(sealed.flow, dict(sealed.tools), sealed.tools_dir, settings,
                  dict(inputs) if inputs is not None else dict(sealed.input), host,
                  digest=digest_text(sealed.digest), source=f"bundle {sealed.name!r}", commands=sealed.commands,
                  signers=tuple(sealed.signers), fingerprints=dict(sealed.tool_fingerprints),
                  egress=sealed.manifest.egress, secrets=sealed.manifest.secrets)


def from_document(path: Path, settings: RunSettings, *, tools_dir: Path | None = None, fmt: str | None = None,
                  components: Path | Components | None = None, inputs: Mapping[str, Any] | None = None,
                  load_plugins: PluginLoader | None = None, commands: Path | None = None) -> Loaded:
    """A document's run, with the tools of `tools_dir` and, when given, shared components from a second file
    and the commands of a commands file (heddle.tools.commands)."""
    from heddle.agentspec import load_flow
    from heddle.tools.registry import discover_tools

    declared = None
    if commands is not None:
        from heddle.tools.commands import read_commands

        declared = read_commands(commands)
    host = (load_plugins or _plugin_host)(settings)
    flow = load_flow(path, fmt=fmt, node_types=host.node_types() if host is not None else (), components=components,
                     strict=settings.strict)
    tools = discover_tools(tools_dir)
    from heddle.bundle.egress import parse_flags, parse_secret_flags, sealed_egress

    # As sealing decides it: anything declared (a flag, the commands file's or a plugin's section) makes
    # the list, with the document's own URLs.
    secrets = parse_secret_flags(settings.secrets, {})
    egress = sealed_egress(flow, (parse_flags(settings.egress), declared.egress if declared is not None else {},
                                  *(m.egress for m in (host.manifests.values() if host is not None else ()))),
                           secrets=secrets is not None)
    return Loaded(flow, tools, tools_dir.absolute() if tools_dir is not None else None, settings,
                  dict(inputs or {}), host, source=str(path), commands=declared, egress=egress, secrets=secrets)


async def execute(loaded: Loaded, *, message: str | None = None, on_event: EventSink | None = None,
                  rendering: Rendering | None = None, transport: httpx.AsyncBaseTransport | None = None,
                  session: SessionUse | None = None, inputs_given: bool = True) -> RunOutcome:
    """Prepare `loaded` (every refusal before a node runs), run it to its end (or, in a session, until
    it waits for a person), then stop its plugins.

    `message` is the user's message to an agent document's agent (in a session waiting for a
    message, the reply). `session` runs it as one turn of a session (heddle.sessions.turn), bound to
    `loaded.digest`; `inputs_given` says whether the caller gave `loaded.inputs` (a resumed run keeps
    the input it started with)."""
    from heddle.engine import events as ev
    from heddle.engine.options import with_egress
    from heddle.engine.run import prepare_run

    settings = loaded.settings
    sink = on_event or ev.ignore
    try:
        await discover(loaded.host, settings)
        plugins: Plugins | None = loaded.host
        if loaded.commands is not None:
            from heddle.tools.command_run import with_commands

            plugins = with_commands(loaded.host, loaded.commands, loaded.flow)
        prepared = prepare_run(loaded.flow, tools=loaded.tools, tools_dir=loaded.tools_dir,
                               options=with_egress(settings.run_options(), loaded.egress, loaded.secrets),
                               sandbox_flags=settings.sandbox_flags, plugins=plugins,
                               tracing=_tracing(loaded))
        if inputs_given:
            check_inputs(loaded.flow, loaded.inputs)
        if prepared.tracing is not None and "TRACEPARENT" in os.environ:
            # The process that started this one named its span: the run's spans are its children, as
            # the OTEL_* variables that turned tracing on are read from the same environment.
            from heddle.engine.tracing import continued

            with continued({"traceparent": os.environ["TRACEPARENT"]}):
                return await _run(loaded, prepared, session, sink=sink, rendering=rendering, transport=transport,
                                  message=message, inputs_given=inputs_given)
        return await _run(loaded, prepared, session, sink=sink, rendering=rendering, transport=transport,
                          message=message, inputs_given=inputs_given)
    finally:
        if loaded.host is not None:
            await loaded.host.aclose()


async def _run(loaded: Loaded, prepared: PreparedRun, session: SessionUse | None, *, sink: EventSink,
               rendering: Rendering | None, transport: httpx.AsyncBaseTransport | None, message: str | None,
               inputs_given: bool) -> RunOutcome:
    from heddle.engine.run import refuse_waits_without_session, run_prepared

    if session is None:
        # After the document's own checks (what is wrong with it comes first), before anything runs.
        refuse_waits_without_session(loaded.flow, source=loaded.source or None)
        return await run_prepared(prepared, loaded.inputs, on_event=sink, rendering=rendering,
                                  transport=transport, message=message)
    from heddle.sessions.turn import Turn, flow_digest, run_turn

    async def one(turn: Turn) -> RunOutcome:
        return await run_prepared(prepared, turn.inputs, on_event=sink, rendering=rendering, transport=transport,
                                  message=turn.message, journal=turn.journal, conversation=turn.conversation)

    done = await run_turn(session, digest=loaded.digest or flow_digest(loaded.flow), document=loaded.source,
                          inputs=loaded.inputs, inputs_given=inputs_given, message=message, run=one)
    return done.outcome


def _tracing(loaded: Loaded) -> Tracing | None:
    """How `loaded`'s run is traced: as the OTEL_* variables say, its spans naming its bundle."""
    from heddle.engine.tracing import Tracing

    tracing = Tracing.configured(capture_content=loaded.settings.otel_capture_content)
    if tracing is None or not loaded.digest:
        return tracing
    return tracing.for_bundle(loaded.digest, list(loaded.signers), loaded.fingerprints)


def tracing_for(settings: RunSettings, sealed: SealedRun | None = None) -> Tracing | None:
    """How runs with `settings` (of `sealed`, when given) are traced: what a server prepares its runs with."""
    from heddle.bundle.verified import digest_text
    from heddle.engine.tracing import Tracing

    tracing = Tracing.configured(capture_content=settings.otel_capture_content)
    if tracing is None or sealed is None:
        return tracing
    return tracing.for_bundle(digest_text(sealed.digest), list(sealed.signers), sealed.tool_fingerprints)


def check_inputs(flow: Flow, inputs: Mapping[str, Any]) -> None:
    """The given inputs against the types the StartNode declares, as heddle-server checks a
    request's: UsageError naming the input, before anything runs."""
    from heddle.engine.inputs import input_problem

    problem = input_problem(flow, dict(inputs))
    if problem is not None:
        raise UsageError(f"inputs: {problem} (as the flow {flow.name!r} declares in its StartNode); give values "
                         "of the declared types")


async def discover(host: PluginHost | None, settings: RunSettings, options: RunOptions | None = None) -> None:
    """With `discover_tools` (--discover-tools), ask the plugins whose manifests declare discoverTools
    which tools they serve, before the flow is checked against the tools (`options`: the run's, by default
    those of `settings` as the CLI names them)."""
    if not settings.discover_tools:
        return
    if host is None:
        raise UsageError("--discover-tools asks the loaded plugins which tools they serve, and none is loaded; "
                         "load one with --plugin MANIFEST")
    from heddle.workspace.sandbox import check_policy

    options = options or settings.run_options()
    # Asking starts the plugins: under the sandbox policy the run gives them, refused before anything starts.
    check_policy(options.sandbox, explicitly_set=settings.sandbox_flags)
    await host.discover_tools(options)


def discover_apart(host: PluginHost | None, settings: RunSettings, options: RunOptions | None = None) -> None:
    """`discover`, for a caller that runs later on another event loop (a server's, once it listens) or not at
    all (validating): asked on a loop of its own, in a thread of its own (so a running loop may call it), its
    plugin processes stopped afterwards; the tools they listed stay known to `host`."""
    if not settings.discover_tools:
        return
    import asyncio
    import concurrent.futures

    async def ask() -> None:
        try:
            await discover(host, settings, options)
        finally:
            if host is not None:
                await host.aclose()

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="heddle-discover") as pool:
        pool.submit(lambda: asyncio.run(ask())).result()


def _inputs(inputs: Mapping[str, Any] | None, proposed: Mapping[str, Any]) -> dict[str, Any]:
    if inputs is None:
        return dict(proposed)
    if not isinstance(inputs, Mapping) or not all(isinstance(k, str) for k in inputs):
        raise UsageError(f"inputs: give a mapping of input names to values, not {type(inputs).__name__}")
    return dict(inputs)


def _starts_like_bundle(path: Path) -> bool:
    from heddle.format.frame import GZIP_MAGIC, ZSTD_MAGIC
    from heddle.safeparse import open_regular

    try:
        fd = open_regular(path)
    except OSError:
        return False  # load_flow names what is wrong with the path
    try:
        head = os.read(fd, len(ZSTD_MAGIC))
    finally:
        os.close(fd)
    return head == ZSTD_MAGIC or head[: len(GZIP_MAGIC)] == GZIP_MAGIC


def _flow_path(target: object) -> Path:
    if not isinstance(target, str | os.PathLike):
        raise UsageError(f"target {target!r}: give a heddle.Bundle (from heddle.open_bundle) or the path of a "
                         "flow document")
    path = Path(target)
    if path.suffix.lower() == ".heddle" or _starts_like_bundle(path):
        raise UsageError(f"{path}: is a bundle; open it with heddle.open_bundle({str(path)!r}, trust=...) and run "
                         "the Bundle it returns")
    return path


async def arun(
    target: Bundle | StrPath,
    *,
    inputs: Mapping[str, Any] | None = None,
    tools_dir: StrPath | None = None,
    settings: RunSettings | None = None,
    on_event: EventSink | None = None,
    flow_format: str | None = None,
    message: str | None = None,
    components: StrPath | None = None,
    commands: StrPath | None = None,
    session: str | None = None,
    answer: Mapping[str, Any] | None = None,
    resume: bool = False,
) -> RunResult:
    """Run `target` (an opened `Bundle`, or the path of a document) to its end.

    `inputs` None runs a bundle with the input it proposes (a flow with none). `tools_dir` is
    the folder of a flow's tools; a bundle runs only its own. `settings` (a
    `heddle.RunSettings`) gives limits, mounts, sandbox and plugins; a bundle's proposals fill
    in the ones left at their defaults. `on_event` sees each event as it happens. `message` is the
    user's message to an agent document's agent (required there, refused for a flow). `components`
    is a file of shared components for a document (a bundle carries its own); `commands` a commands
    file (heddle.tools.commands) whose commands the document names as tools (a bundle carries its
    own).

    `session` names a session (in the store `settings.session_store` names: sqlite unless it says
    otherwise): a new name opens one, an existing one continues it (its next turn, bound to the
    document that opened it), and the run may stop to wait for a person (`RunResult.waiting`).
    `answer` resumes a run that waits, in the shape of the HTTP API: `{"message": TEXT}`,
    `{"approve": True}`, `{"deny": REASON}` or `{"tool_result": JSON}` (a `message` given to a
    session that waits for one is its answer too). `resume=True` continues a run of
    `settings.durable` that was stopped, from its last checkpoint. Raises a `heddle.HeddleError`
    naming what failed (a `heddle.SessionError` for a session that cannot be used as asked).
    """
    import asyncio

    from heddle.agentspec.roots import check_message
    from heddle.bundle.verified import Bundle
    from heddle.settings import RunSettings

    settings = settings if settings is not None else RunSettings()
    if not isinstance(settings, RunSettings):
        raise UsageError(f"settings: give a heddle.RunSettings, not {type(settings).__name__}")
    if message is not None and not isinstance(message, str):
        raise UsageError(f"message: give the user's message as a string, not {type(message).__name__}")
    reply = _session_request(settings, session, answer, resume)
    if isinstance(target, Bundle):
        if tools_dir is not None:
            raise UsageError(f"tools_dir cannot be used with the bundle {target.path}: a sealed bundle runs only "
                             "its own tools")
        for given, value in (("components", components), ("commands", commands)):
            if value is not None:
                raise UsageError(f"{given} cannot be used with the bundle {target.path}: a sealed bundle carries "
                                 "its own")
        loaded = from_bundle(target.runnable, settings, inputs=_inputs(inputs, target.runnable.input))
        source = str(target.path)
    else:
        path = _flow_path(target)
        loaded = from_document(path, settings, tools_dir=Path(tools_dir) if tools_dir is not None else None,
                               fmt=flow_format, components=Path(components) if components is not None else None,
                               inputs=_inputs(inputs, {}), commands=Path(commands) if commands is not None else None)
        source = str(path)
    store: SessionStore | None = None
    try:
        if session is None:
            check_message(loaded.flow, message, named="message", give="message=...", source=source)
        else:
            # In a session the turn decides what `message` is (the answer to a wait, or the next
            # turn's), and the run checks it then; the store is reached before anything runs.
            store = await asyncio.to_thread(_open_store, settings, loaded.host)
    except BaseException:
        if loaded.host is not None:
            await loaded.host.aclose()
        raise
    events: list[Event] = []

    def keep(event: Event) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event)

    use = None
    if store is not None and session is not None:
        from heddle.sessions.turn import SessionUse

        use = SessionUse(store, session, answer=reply, resume=resume, durable=settings.durable)
    try:
        outcome = await execute(loaded, message=message, on_event=keep, session=use, inputs_given=inputs is not None)
    finally:
        if store is not None:
            await asyncio.to_thread(store.close)
    return RunResult(flow=loaded.flow.name, state=outcome.state, events=tuple(events), outputs=outcome.outputs,
                     messages=outcome.messages,
                     waiting=outcome.waiting.as_json() if outcome.waiting is not None else None, session=session)


def _session_request(settings: RunSettings, session: object, answer: object, resume: object) -> Answer | None:
    """`session`, `answer` and `resume` checked before anything is read: the answer they give, if any."""
    if session is None:
        given = [name for name, on in (("answer", answer is not None), ("resume", resume is not False),
                                       ("settings.durable", settings.durable)) if on]
        if given:
            raise UsageError(f"{' and '.join(given)}: for a run in a session; give session=NAME too")
        return None
    if not isinstance(session, str):
        raise UsageError(f"session: give the session's name as a string, not {type(session).__name__}")
    if not isinstance(resume, bool):
        raise UsageError(f"resume: give True or False, not {type(resume).__name__}")
    from heddle.engine.journal import Answer
    from heddle.sessions.store import check_session_id

    check_session_id(session)
    if answer is None:
        return None
    if not isinstance(answer, Mapping):
        raise UsageError('answer: give a mapping: {"message": TEXT}, {"approve": True}, {"deny": REASON} or '
                         '{"tool_result": JSON}')
    return Answer.from_json(dict(answer))


def _open_store(settings: RunSettings, host: PluginHost | None) -> SessionStore:
    """The store `settings` names (sqlite unless `session_store` says otherwise), reachable; a file or
    folder setting for another kind of store than the one named is refused, not ignored."""
    from heddle.sessions.open import open_store

    spec = settings.session_store or "sqlite"
    shown = spec.split("://", 1)[0] + "://..." if "://" in spec else spec  # a URL may carry a password
    for name, value, kind in (("session_db", settings.session_db, "sqlite"),
                              ("session_dir", settings.session_dir, "file")):
        if value is not None and spec != kind:
            raise UsageError(f"settings.{name} is for the {kind} session store, and settings.session_store is "
                             f"{shown!r}; drop one of them")
    return open_store(spec, db=settings.session_db, directory=settings.session_dir, plugins=host,
                      key_file=settings.session_key)


def run(
    target: Bundle | StrPath,
    *,
    inputs: Mapping[str, Any] | None = None,
    tools_dir: StrPath | None = None,
    settings: RunSettings | None = None,
    on_event: EventSink | None = None,
    flow_format: str | None = None,
    message: str | None = None,
    components: StrPath | None = None,
    commands: StrPath | None = None,
    session: str | None = None,
    answer: Mapping[str, Any] | None = None,
    resume: bool = False,
) -> RunResult:
    """`arun` for callers without an event loop of their own: runs one to the end (or, in a session,
    until it waits for a person)."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun(target, inputs=inputs, tools_dir=tools_dir, settings=settings, on_event=on_event,
                                flow_format=flow_format, message=message, components=components,
                                commands=commands, session=session, answer=answer, resume=resume))
    raise UsageError("heddle.run() was called inside a running event loop; use `await heddle.arun(...)` there")


def _plugin_host(settings: RunSettings) -> PluginHost | None:
    """The plugins of `settings`, read and checked (their processes start on first use), or None."""
    if not settings.plugins:
        if settings.plugin_configs:
            raise UsageError("plugin_configs sets a plugin component's settings; load the plugin with plugins=")
        return None
    from heddle.plugin_host.host import PluginHost

    return PluginHost.load(settings.plugins, config_specs=settings.plugin_configs, timeout=settings.plugin_timeout,
                           max_node_attempts=settings.max_node_attempts)
