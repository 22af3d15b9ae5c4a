"""Running a bundle or a document: `heddle.run` and `heddle.arun`, and the core `heddle run` shares.

One path for both, over heddle.core.RunCore: a `Bundle`'s core settles its proposals against the
settings given (the bundle proposes, the caller disposes), its own mounts and plugins first
(`from_bundle`), or a document is read on a core of its tools and plugins (`from_document`); then
the core prepares the run (every refusal made before a node runs) and runs it to its end (`execute`).
The CLI adds only what a terminal needs (trust flags, a prompt for the message, printing). A flow
path is read as a document only: a bundle runs only once it is opened against a `TrustPolicy`, so a
path to one is refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.agentspec import load_flow
from heddle.agentspec.document import check_strict
from heddle.agentspec.roots import check_message
from heddle.blocking import STORE_WRITES, run_blocking
from heddle.core import RunCore
from heddle.engine.inputs import input_problem
from heddle.engine.journal import Answer
from heddle.engine.tracing import continued
from heddle.errors import UsageError
from heddle.format.frame import starts_like_bundle
from heddle.settings import RunSettings
from heddle.workspace.sandbox import check_policy

if TYPE_CHECKING:
    import httpx

    from heddle.agentspec.components import Flow
    from heddle.agentspec.document import Components
    from heddle.bundle.verified import Bundle
    from heddle.engine.events import Event
    from heddle.engine.options import RunOptions
    from heddle.engine.run import RunOutcome
    from heddle.engine.seams import Rendering
    from heddle.plugin_host.host import PluginHost
    from heddle.sessions.store import SessionStore
    from heddle.sessions.turn import SessionUse

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


@dataclass
class Target:
    """A run's target read: the core it runs on (a bundle's proposals settled, its plugins read and
    checked: their processes start on first use), the flow, the input, and what to call it in messages."""

    core: RunCore
    flow: Flow
    inputs: dict[str, Any]
    source: str = ""


def from_bundle(sealed: Bundle, settings: RunSettings, *, given: Collection[str] = (),
                inputs: Mapping[str, Any] | None = None) -> Target:
    """A verified bundle's run (heddle.core.RunCore.of_bundle); `inputs` None takes the input it proposes."""
    core = RunCore.of_bundle(sealed, settings, given=given)
    if core.settings.strict:
        check_strict(sealed.flow)
    return Target(core, sealed.flow, dict(inputs) if inputs is not None else dict(sealed.input),
                  source=f"bundle {sealed.name!r}")


def from_document(path: Path, settings: RunSettings, *, tools_dir: Path | None = None, fmt: str | None = None,
                  components: Path | Components | None = None, inputs: Mapping[str, Any] | None = None,
                  commands: Path | None = None) -> Target:
    """A document's run, with the tools of `tools_dir` and, when given, shared components from a second file
    and the commands of a commands file (heddle.tools.commands)."""
    core = RunCore.of_settings(settings, tools_dir=tools_dir, commands=commands)
    flow = load_flow(path, fmt=fmt, node_types=core.node_types, components=components, strict=settings.strict)
    return Target(core, flow, dict(inputs or {}), source=str(path))


async def execute(loaded: Target, *, message: str | None = None, on_event: EventSink | None = None,
                  rendering: Rendering | None = None, transport: httpx.AsyncBaseTransport | None = None,
                  session: SessionUse | None = None, inputs_given: bool = True) -> RunOutcome:
    """Prepare `loaded` (every refusal before a node runs), run it to its end (or, in a session, until
    it waits for a person), then stop its plugins.

    `message` is the user's message to an agent document's agent (in a session waiting for a
    message, the reply). `session` runs it as one turn of a session (heddle.sessions.turn), bound to
    the bundle's digest or the flow's; `inputs_given` says whether the caller gave `loaded.inputs` (a
    resumed run keeps the input it started with)."""
    core = loaded.core
    try:
        await discover(core.host, core.settings)
        prepared = core.prepare(loaded.flow)
        if inputs_given:
            check_inputs(loaded.flow, loaded.inputs)
        run = core.run(prepared, loaded.inputs, message=message, on_event=on_event, rendering=rendering,
                       transport=transport, session=session, document=loaded.source, inputs_given=inputs_given)
        if prepared.tracing is not None and "TRACEPARENT" in os.environ:
            # The process that started this one named its span: the run's spans are its children, as
            # the OTEL_* variables that turned tracing on are read from the same environment.
            with continued({"traceparent": os.environ["TRACEPARENT"]}):
                return await run
        return await run
    finally:
        await core.aclose()


def check_inputs(flow: Flow, inputs: Mapping[str, Any]) -> None:
    """The given inputs against the types the StartNode declares, as heddle-server checks a
    request's: UsageError naming the input, before anything runs."""
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
    try:
        return starts_like_bundle(path)
    except OSError:
        return False  # load_flow names what is wrong with the path


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
    settings = settings if settings is not None else RunSettings()
    if not isinstance(settings, RunSettings):
        raise UsageError(f"settings: give a heddle.RunSettings, not {type(settings).__name__}")
    if message is not None and not isinstance(message, str):
        raise UsageError(f"message: give the user's message as a string, not {type(message).__name__}")
    reply = _session_request(settings, session, answer, resume)
    if settings.plugin_configs and not settings.plugins:
        raise UsageError("plugin_configs sets a plugin component's settings; load the plugin with plugins=")
    if isinstance(target, str | os.PathLike):
        path = _flow_path(target)
        loaded = from_document(path, settings, tools_dir=Path(tools_dir) if tools_dir is not None else None,
                               fmt=flow_format, components=Path(components) if components is not None else None,
                               inputs=_inputs(inputs, {}), commands=Path(commands) if commands is not None else None)
        source = str(path)
    else:
        # Only a Bundle brings the verifier and the format (heddle.bundle.verified): a document's run
        # never loads them, and an object given as a Bundle was made by them.
        from heddle.bundle.verified import Bundle

        if not isinstance(target, Bundle):
            _flow_path(target)  # refused, naming what a target may be
        if tools_dir is not None:
            raise UsageError(f"tools_dir cannot be used with the bundle {target.path}: a sealed bundle runs only "
                             "its own tools")
        for given, value in (("components", components), ("commands", commands)):
            if value is not None:
                raise UsageError(f"{given} cannot be used with the bundle {target.path}: a sealed bundle carries "
                                 "its own")
        loaded = from_bundle(target, settings, inputs=_inputs(inputs, target.input))
        source = str(target.path)
    store: SessionStore | None = None
    try:
        if session is None:
            check_message(loaded.flow, message, named="message", give="message=...", source=source)
        else:
            # In a session the turn decides what `message` is (the answer to a wait, or the next
            # turn's), and the run checks it then; the store is reached before anything runs.
            store = loaded.core.sessions = await run_blocking(STORE_WRITES, _open_store, settings, loaded.core.host)
    except BaseException:
        await loaded.core.aclose()
        raise
    events: list[Event] = []

    def keep(event: Event) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event)

    use = loaded.core.session(session, answer=reply, resume=resume) if session is not None else None
    try:
        outcome = await execute(loaded, message=message, on_event=keep, session=use, inputs_given=inputs is not None)
    finally:
        if store is not None:
            await store.close()
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

    # The session store is loaded only for a run in a session.
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
    spec = settings.session_store or "sqlite"
    shown = spec.split("://", 1)[0] + "://..." if "://" in spec else spec  # a URL may carry a password
    for name, value, kind in (("session_db", settings.session_db, "sqlite"),
                              ("session_dir", settings.session_dir, "file")):
        if value is not None and spec != kind:
            raise UsageError(f"settings.{name} is for the {kind} session store, and settings.session_store is "
                             f"{shown!r}; drop one of them")
    # The stores and their drivers load only for a run in a session.
    from heddle.sessions.open import open_store

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
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun(target, inputs=inputs, tools_dir=tools_dir, settings=settings, on_event=on_event,
                                flow_format=flow_format, message=message, components=components,
                                commands=commands, session=session, answer=answer, resume=resume))
    raise UsageError("heddle.run() was called inside a running event loop; use `await heddle.arun(...)` there")
