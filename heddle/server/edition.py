"""What a server runs of one bundle (or, without a bundle, of its flags), prepared whole.

Everything that depends on the bundle lives in one `Edition`, and the service holds exactly one
reference to the edition it serves. A following server (heddle.server.follow) builds the next
edition off the event loop and swaps the reference between requests: a run leases the edition
it was prepared on and keeps it to its end, so the old one's plugin processes and data folder
are released only once its last run has ended.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.blocking import WORKSPACE_COPIES, run_blocking

if TYPE_CHECKING:
    from heddle.bundle.verified import Bundle
    from heddle.core import RunCore
    from heddle.engine.run import PreparedRun
    from heddle.engine.tracing import ModelObserver
    from heddle.server.config import ServerConfig
    from heddle.server.model_policy import ModelPolicy

log = logging.getLogger("heddle.server")


@dataclass(eq=False)
class Edition:
    """One bundle's run core (tools, plugins, options) and prepared run, as a server serves them."""

    core: RunCore
    bundle_run: PreparedRun | None
    tool_listing: dict[str, Any] = field(default_factory=dict)
    oci_digest: str | None = None  # the registry's digest of the artifact it came from, when it came from one
    _leases: int = 0
    _retired: bool = False
    _closed: bool = False
    _on_idle: Callable[[Edition], None] | None = None

    @property
    def sealed(self) -> Bundle | None:
        """The bundle served, or None for a server of flows."""
        return self.core.bundle

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
            await self.core.aclose()
        finally:
            await run_blocking(WORKSPACE_COPIES, close_served, self.sealed)

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


def build_edition(config: ServerConfig, policy: ModelPolicy, sealed: Bundle | None = None,
                  observer: ModelObserver | None = None) -> Edition:
    """Everything a server runs of `sealed` (or of its flags), checked and prepared: every refusal
    that needs no request is made here. Blocking (plugin discovery, the sandbox probe, preparing
    the run): call it before the loop starts or in a worker thread."""
    from heddle.core import RunCore
    from heddle.runs import discover_apart
    from heddle.settings import SERVER
    from heddle.tools.catalog import catalog
    from heddle.workspace.sandbox import check_policy
    from heddle.workspace.workspace import Workspaces

    # A host's processes start on first use (discovery stops its own): one refused below leaves nothing behind;
    # keep_running: they serve every run of this server and stop with it (Service.aclose).
    if sealed is not None:
        core = RunCore.of_bundle(sealed, config.settings, given=config.given, surface=SERVER, keep_running=True)
    else:
        core = RunCore.of_settings(config.settings, tools_dir=config.tools_dir, commands=config.commands,
                                   surface=SERVER, keep_running=True)
    options = core.options_for()
    check_policy(options.sandbox, explicitly_set=config.sandbox_flags)
    if sealed is None and (core.settings.egress or core.settings.secrets):
        # A flag that cannot be read, a secret's missing variable or one no tool could use: refused at start-up,
        # not at every request (each request's document gets its list as `heddle run` gives one, at prepare).
        from heddle.bundle.egress import parse_flags, parse_secret_flags
        from heddle.engine.options import with_egress
        from heddle.workspace.egress_proxy import check_secrets

        parse_flags(core.settings.egress)
        check_secrets(with_egress(options, {}, parse_secret_flags(core.settings.secrets, {})))
    Workspaces(options.workspace, core.tools, tools_dir=core.tools_dir, warn=lambda message: None).check()
    # --discover-tools: the plugins asked now which tools they serve (never a plugin a request brings).
    discover_apart(core.host, core.settings, options)
    bundle_run = None
    if sealed is not None:
        bundle_run = core.prepare(sealed.flow, observer=observer)
        policy.assign_keys(sealed.flow, bundle_run.endpoints, from_request=False)
    # What GET /v1/tools answers, listed once (a plugin tool taking a tools folder's name is refused now):
    # without paths, programs or argv templates.
    listing = catalog(tools=core.tools, flow=sealed.flow if sealed is not None else None, host=core.host,
                      commands=core.commands or ()).as_json(public=True)
    return Edition(core, bundle_run, listing)
