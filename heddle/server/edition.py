"""What a server runs of one bundle (or, without a bundle, of its flags), prepared whole.

Everything that depends on the bundle lives in one `Edition`, and the service holds exactly one
reference to the edition it serves. A following server (heddle.server.follow) builds the next
edition off the event loop and swaps the reference between requests: a run leases the edition
it was prepared on and keeps it to its end, so the old one's plugin processes and data folder
are released only once its last run has ended.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle.engine.run import PreparedRun
    from heddle.server.config import ServerConfig
    from heddle.server.model_policy import ModelPolicy
    from heddle.tools.commands import CommandSet

log = logging.getLogger("heddle.server")


@dataclass(eq=False)
class Edition:
    """One bundle's tools, plugins, options and prepared run, as a server serves them."""

    sealed: Any  # the bundle's SealedRun, or None for a server of flows
    tools: dict[str, Path]
    tools_dir: Path | None
    commands: CommandSet | None
    host: Any  # the PluginHost of its runs, or None
    node_types: frozenset[str]
    options: Any  # the engine's RunOptions
    bundle_run: PreparedRun | None
    tool_listing: dict[str, Any] = field(default_factory=dict)
    oci_digest: str | None = None  # the registry's digest of the artifact it came from, when it came from one
    _leases: int = 0
    _retired: bool = False
    _closed: bool = False
    _on_idle: Callable[[Edition], None] | None = None

    def lease(self) -> Lease:
        """A hold on this edition for one request; released exactly once."""
        self._leases += 1
        return Lease(self)

    def _release(self) -> None:
        self._leases -= 1
        if self._retired and self._leases == 0 and self._on_idle is not None:
            self._on_idle(self)

    def retire(self, on_idle: Callable[[Edition], None]) -> None:
        """No new request gets this edition; `on_idle` is called (on the loop) once none holds it."""
        self._retired = True
        self._on_idle = on_idle
        if self._leases == 0:
            on_idle(self)

    async def aclose(self) -> None:
        """Stop its plugin processes and remove the data folder opening made; safe to call again."""
        from heddle.server.served_bundle import close_served

        if self._closed:
            return
        self._closed = True
        try:
            if self.host is not None:
                await self.host.aclose()
        finally:
            await asyncio.to_thread(close_served, self.sealed)

    def close_unused(self) -> None:
        """Release an edition that was built but never served (its plugin processes never started)."""
        from heddle.server.served_bundle import close_served

        if not self._closed:
            self._closed = True
            close_served(self.sealed)


class Lease:
    """One request's hold on the edition it was prepared on."""

    def __init__(self, edition: Edition) -> None:
        self.edition = edition
        self._held = True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.edition._release()


def build_edition(config: ServerConfig, policy: ModelPolicy, sealed: Any = None, observer: Any = None) -> Edition:
    """Everything a server runs of `sealed` (or of its flags), checked and prepared: every refusal
    that needs no request is made here. Blocking (plugin discovery, the sandbox probe, preparing
    the run): call it before the loop starts or in a worker thread."""
    from heddle.engine.run import prepare_run
    from heddle.runs import discover_apart, tracing_for
    from heddle.server.service import load_plugins, run_options, run_settings
    from heddle.tools.catalog import catalog
    from heddle.tools.command_run import with_commands
    from heddle.tools.registry import discover_tools
    from heddle.workspace.sandbox import check_policy
    from heddle.workspace.workspace import Workspaces

    if sealed is not None:
        tools: dict[str, Path] = dict(sealed.tools)
        tools_dir: Path | None = sealed.tools_dir
        commands: CommandSet | None = sealed.commands
    else:
        from heddle.tools.commands import read_commands

        tools = discover_tools(config.tools_dir)
        tools_dir = config.tools_dir.absolute() if config.tools_dir else None
        commands = read_commands(config.commands) if config.commands is not None else None
    # A host's processes start on first use (discovery stops its own): one refused below leaves nothing behind.
    host = load_plugins(config, sealed)
    node_types: frozenset[str] = host.node_types() if host is not None else frozenset()
    options = run_options(config, sealed)
    check_policy(options.sandbox, explicitly_set=config.sandbox_flags)
    Workspaces(options.workspace, tools, tools_dir=tools_dir, warn=lambda message: None).check()
    # --discover-tools: the plugins asked now which tools they serve (never a plugin a request brings).
    discover_apart(host, run_settings(config, sealed), options)
    bundle_run = None
    if sealed is not None:
        bundle_run = prepare_run(sealed.flow, tools=tools, tools_dir=tools_dir, options=options,
                                 sandbox_flags=config.sandbox_flags, plugins=with_commands(host, commands, sealed.flow),
                                 tracing=tracing_for(config.settings, sealed), observer=observer)
        policy.assign_keys(sealed.flow, bundle_run.endpoints, from_request=False)
    # What GET /v1/tools answers, listed once (a plugin tool taking a tools folder's name is refused now):
    # without paths, programs or argv templates.
    listing = catalog(tools=tools, flow=sealed.flow if sealed is not None else None, host=host,
                      commands=commands or ()).as_json(public=True)
    return Edition(sealed, tools, tools_dir, commands, host, node_types, options, bundle_run, listing)

