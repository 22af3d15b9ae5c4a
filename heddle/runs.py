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

from heddle.bundle.verified import Bundle
from heddle.errors import UsageError

if TYPE_CHECKING:
    import httpx

    from heddle.bundle.runnable import SealedRun
    from heddle.engine.events import Event
    from heddle.engine.run import RunOutcome
    from heddle.engine.seams import Rendering
    from heddle.plugin_host.host import PluginHost
    from heddle.settings import RunSettings
    from heddle.spec.components import Flow
    from heddle.spec.document import Components

StrPath = str | os.PathLike[str]
EventSink = Callable[["Event"], None]


@dataclass(frozen=True)
class RunResult:
    """A finished run: the final state, every event in order, the document's outputs alone (a
    flow's declared outputs; for an agent document `result`, its final answer, and its declared outputs),
    and the messages the run showed the person running it (its OutputMessageNodes'), in order."""

    flow: str
    state: dict[str, Any]
    events: tuple[Event, ...]
    outputs: dict[str, Any] = field(default_factory=dict)
    messages: tuple[str, ...] = ()


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


def from_bundle(sealed: SealedRun, settings: RunSettings, *, given: Collection[str] = (),
                inputs: Mapping[str, Any] | None = None, load_plugins: PluginLoader | None = None) -> Loaded:
    """A verified bundle's run: its proposals yield to the settings `given`, its own mounts and plugins
    (run from the verified cache) come before any given; `inputs` None takes the input it proposes."""
    from heddle.settings import settle

    settings = settle(settings, sealed.manifest.proposals, given=given, mounts=sealed.mounts, plugins=sealed.plugins)
    host = (load_plugins or _plugin_host)(settings)
    return Loaded(sealed.flow, dict(sealed.tools), sealed.tools_dir, settings,
                  dict(inputs) if inputs is not None else dict(sealed.input), host)


def from_document(path: Path, settings: RunSettings, *, tools_dir: Path | None = None, fmt: str | None = None,
                  components: Path | Components | None = None, inputs: Mapping[str, Any] | None = None,
                  load_plugins: PluginLoader | None = None) -> Loaded:
    """A document's run, with the tools of `tools_dir` and, when given, shared components from a second file."""
    from heddle.spec import load_flow
    from heddle.tools.registry import discover_tools

    host = (load_plugins or _plugin_host)(settings)
    flow = load_flow(path, fmt=fmt, node_types=host.node_types() if host is not None else (), components=components)
    tools = discover_tools(tools_dir)
    return Loaded(flow, tools, tools_dir.absolute() if tools_dir is not None else None, settings,
                  dict(inputs or {}), host)


async def execute(loaded: Loaded, *, message: str | None = None, on_event: EventSink | None = None,
                  rendering: Rendering | None = None, transport: httpx.AsyncBaseTransport | None = None) -> RunOutcome:
    """Prepare `loaded` (every refusal before a node runs), run it to its end, then stop its plugins.

    `message` is the user's message to an agent document's agent."""
    from heddle.engine import events as ev
    from heddle.engine.run import prepare_run, run_prepared

    settings = loaded.settings
    try:
        prepared = prepare_run(loaded.flow, tools=loaded.tools, tools_dir=loaded.tools_dir,
                               options=settings.run_options(), sandbox_flags=settings.sandbox_flags,
                               plugins=loaded.host)
        return await run_prepared(prepared, loaded.inputs, on_event=on_event or ev.ignore, rendering=rendering,
                                  transport=transport, message=message)
    finally:
        if loaded.host is not None:
            await loaded.host.aclose()


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
) -> RunResult:
    """Run `target` (an opened `Bundle`, or the path of a document) to its end.

    `inputs` None runs a bundle with the input it proposes (a flow with none). `tools_dir` is
    the folder of a flow's tools; a bundle runs only its own. `settings` (a
    `heddle.RunSettings`) gives limits, mounts, sandbox and plugins; a bundle's proposals fill
    in the ones left at their defaults. `on_event` sees each event as it happens. `message` is the
    user's message to an agent document's agent (required there, refused for a flow). `components`
    is a file of shared components for a document (a bundle carries its own). Raises a
    `heddle.HeddleError` naming what failed.
    """
    from heddle.settings import RunSettings
    from heddle.spec.roots import check_message

    settings = settings if settings is not None else RunSettings()
    if not isinstance(settings, RunSettings):
        raise UsageError(f"settings: give a heddle.RunSettings, not {type(settings).__name__}")
    if message is not None and not isinstance(message, str):
        raise UsageError(f"message: give the user's message as a string, not {type(message).__name__}")
    if isinstance(target, Bundle):
        if tools_dir is not None:
            raise UsageError(f"tools_dir cannot be used with the bundle {target.path}: a sealed bundle runs only "
                             "its own tools")
        if components is not None:
            raise UsageError(f"components cannot be used with the bundle {target.path}: a sealed bundle carries "
                             "its own")
        loaded = from_bundle(target.runnable, settings, inputs=_inputs(inputs, target.runnable.input))
        source = str(target.path)
    else:
        path = _flow_path(target)
        loaded = from_document(path, settings, tools_dir=Path(tools_dir) if tools_dir is not None else None,
                               fmt=flow_format, components=Path(components) if components is not None else None,
                               inputs=_inputs(inputs, {}))
        source = str(path)
    try:
        check_message(loaded.flow, message, named="message", give="message=...", source=source)
    except BaseException:
        if loaded.host is not None:
            await loaded.host.aclose()
        raise
    events: list[Event] = []

    def keep(event: Event) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event)

    outcome = await execute(loaded, message=message, on_event=keep)
    return RunResult(flow=loaded.flow.name, state=outcome.state, events=tuple(events), outputs=outcome.outputs,
                     messages=outcome.messages)


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
) -> RunResult:
    """`arun` for callers without an event loop of their own: runs one to the end."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun(target, inputs=inputs, tools_dir=tools_dir, settings=settings, on_event=on_event,
                                flow_format=flow_format, message=message, components=components))
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
