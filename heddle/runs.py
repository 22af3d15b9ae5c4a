"""Running a bundle or a flow document from a program: `heddle.run` and `heddle.arun`.

The same steps `heddle run` takes, without a terminal: a `Bundle`'s proposals are settled
against the settings given (the bundle proposes, the caller disposes), its own mounts and
plugins come first, the run is prepared (every refusal made before a node runs), then run
to its end while its events are kept. A flow path is read as a flow document only: a bundle
runs only once it is opened against a `TrustPolicy`, so a path to one is refused.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.bundle.verified import Bundle
from heddle.errors import UsageError

if TYPE_CHECKING:
    from heddle.engine.events import Event
    from heddle.plugin_host.host import PluginHost
    from heddle.settings import RunSettings

StrPath = str | os.PathLike[str]
EventSink = Callable[["Event"], None]


@dataclass(frozen=True)
class RunResult:
    """A finished run: the final state (the input of the EndNode reached) and every event, in order."""

    flow: str
    state: dict[str, Any]
    events: tuple[Event, ...]


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
) -> RunResult:
    """Run `target` (an opened `Bundle`, or the path of a flow document) to its end.

    `inputs` None runs a bundle with the input it proposes (a flow with none). `tools_dir` is
    the folder of a flow's tools; a bundle runs only its own. `settings` (a
    `heddle.RunSettings`) gives limits, mounts, sandbox and plugins; a bundle's proposals fill
    in the ones left at their defaults. `on_event` sees each event as it happens. Raises a
    `heddle.HeddleError` naming what failed.
    """
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.settings import RunSettings, settle

    settings = settings if settings is not None else RunSettings()
    if not isinstance(settings, RunSettings):
        raise UsageError(f"settings: give a heddle.RunSettings, not {type(settings).__name__}")
    tools_root: Path | None
    if isinstance(target, Bundle):
        if tools_dir is not None:
            raise UsageError(f"tools_dir cannot be used with the bundle {target.path}: a sealed bundle runs only "
                             "its own tools")
        sealed = target.runnable
        settings = settle(settings, sealed.manifest.proposals, mounts=sealed.mounts, plugins=sealed.plugins)
        run_inputs = _inputs(inputs, sealed.input)
        host = _plugin_host(settings)
        flow, tools, tools_root = sealed.flow, dict(sealed.tools), sealed.tools_dir
    else:
        from heddle.spec import load_flow
        from heddle.tools.registry import discover_tools

        path = _flow_path(target)
        run_inputs = _inputs(inputs, {})
        tools_path = Path(tools_dir) if tools_dir is not None else None
        host = _plugin_host(settings)
        flow = load_flow(path, fmt=flow_format, node_types=host.node_types() if host is not None else ())
        tools = discover_tools(tools_path)
        tools_root = tools_path.absolute() if tools_path is not None else None
    events: list[Event] = []

    def keep(event: Event) -> None:
        events.append(event)
        if on_event is not None:
            on_event(event)

    try:
        prepared = prepare_run(flow, tools=tools, tools_dir=tools_root, options=settings.run_options(),
                               sandbox_flags=settings.sandbox_flags, plugins=host)
        state = await run_prepared(prepared, run_inputs, on_event=keep)
    finally:
        if host is not None:
            await host.aclose()
    return RunResult(flow=flow.name, state=state, events=tuple(events))


def run(
    target: Bundle | StrPath,
    *,
    inputs: Mapping[str, Any] | None = None,
    tools_dir: StrPath | None = None,
    settings: RunSettings | None = None,
    on_event: EventSink | None = None,
    flow_format: str | None = None,
) -> RunResult:
    """`arun` for callers without an event loop of their own: runs one to the end."""
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun(target, inputs=inputs, tools_dir=tools_dir, settings=settings, on_event=on_event,
                                flow_format=flow_format))
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
