"""The run core: what every run of one configuration shares, and the one way a flow is prepared and run.

A `RunCore` is built once from a verified bundle (its proposals settled against the settings given,
its own mounts and plugins first) or from settings alone (documents), in the words of the shell that
asks (`heddle.settings`: CLI, SERVER): the settled settings, the tools, the commands, the plugin host and the
engine's options. `prepare` is the only caller of the engine's preparation and `run` the only caller
of its run and of a session's turn: `heddle.run`/`arun` and `heddle run` (heddle.runs), and every
`heddle-server` route (heddle.server.edition, one core per edition) are faces of it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.bundle.egress import parse_flags, parse_secret_flags, sealed_egress
from heddle.engine import events as ev
from heddle.engine.options import RunOptions, with_egress
from heddle.engine.run import PreparedRun, RunOutcome, prepare_run, refuse_waits_without_session, run_prepared
from heddle.engine.tracing import Tracing
from heddle.errors import UsageError
from heddle.settings import CLI, RunSettings, settle
from heddle.surface import Surface
from heddle.tools.registry import discover_tools

if TYPE_CHECKING:
    import httpx

    from heddle.agentspec.components import Flow
    from heddle.bundle.verified import Bundle
    from heddle.engine.conversation import Conversation
    from heddle.engine.events import EventSink
    from heddle.engine.journal import Answer, Journal
    from heddle.engine.seams import Plugins, Rendering
    from heddle.engine.tracing import ModelObserver
    from heddle.plugin_host.host import PluginHost
    from heddle.sessions.store import SessionStore
    from heddle.sessions.turn import SessionUse, Turn
    from heddle.tools.commands import CommandSet

# What a face checks of a turn's inputs and message once the turn is known (a resumed run keeps its own).
Check = Callable[["Flow", dict[str, Any], "str | None"], None]


def load_plugins(settings: RunSettings, *, keep_running: bool = False,
                 require_settings: bool = True) -> PluginHost | None:
    """The plugins of `settings` (a bundle's own first, once settled), read and checked (their processes
    start on first use), or None. `keep_running`: one host serves every run (a server's) until it closes."""
    if not settings.plugins:
        if settings.plugin_configs:
            raise UsageError("--plugin-config sets a plugin component's settings; load the plugin with "
                             "--plugin MANIFEST")
        return None
    # Here, not at the top: a run without plugins loads no plugin code (heddle run's start-up).
    from heddle.plugin_host.host import PluginHost

    return PluginHost.load(list(settings.plugins), config_specs=settings.plugin_configs,
                           timeout=settings.plugin_timeout, max_node_attempts=settings.max_node_attempts,
                           require_settings=require_settings, keep_running=keep_running)


@dataclass(eq=False)
class RunCore:
    """The configuration of a shell's runs, held once: see the module's docstring."""

    settings: RunSettings  # settled: a bundle's proposals applied
    tools: dict[str, Path]
    tools_dir: Path | None
    commands: CommandSet | None
    host: PluginHost | None
    options: RunOptions  # the engine's, in the surface's words (a bundle's sealed egress joins them at prepare)
    surface: Surface = CLI
    bundle: Bundle | None = None
    sessions: SessionStore | None = None

    @classmethod
    def of_bundle(cls, bundle: Bundle, settings: RunSettings, *, given: Collection[str] = (),
                  surface: Surface = CLI, keep_running: bool = False) -> RunCore:
        """A verified bundle's core: every proposal its manifest makes yields to the settings `given`
        (by name, or any that differs from its default); its own mounts and plugins come first."""
        if settings.egress or settings.secrets:
            raise UsageError(f"{'--egress' if settings.egress else '--secret'}: bundle {bundle.name!r} has its "
                             "egress list and secrets sealed in it; seal it again to change them")
        settled = settle(settings, bundle.manifest.proposals, given=given, mounts=bundle.mounts,
                         plugins=bundle.plugins)
        host = load_plugins(settled, keep_running=keep_running)
        return cls(settled, dict(bundle.tools), bundle.tools_dir, bundle.commands, host,
                   settled.run_options(surface=surface), surface, bundle)

    @classmethod
    def of_settings(cls, settings: RunSettings, *, tools_dir: Path | None = None, commands: Path | None = None,
                    surface: Surface = CLI, keep_running: bool = False) -> RunCore:
        """The core of documents run with `settings`: the tools of `tools_dir`, the commands of a
        commands file (heddle.tools.commands), the plugins the settings load."""
        declared: CommandSet | None = None
        if commands is not None:
            # The commands' modules load only for a run given a commands file.
            from heddle.tools.commands import read_commands

            declared = read_commands(commands)
        host = load_plugins(settings, keep_running=keep_running)
        return cls(settings, discover_tools(tools_dir), tools_dir.absolute() if tools_dir is not None else None,
                   declared, host, settings.run_options(surface=surface), surface)

    @property
    def digest(self) -> str:
        """The bundle's digest as reports print it (what its sessions are bound to); "" for documents."""
        return self.bundle.digest if self.bundle is not None else ""

    @property
    def node_types(self) -> frozenset[str]:
        """The node types the plugins add, which a document may use."""
        return self.host.node_types() if self.host is not None else frozenset()

    def plugins_for(self, flow: Flow) -> Plugins | None:
        """The plugins a run of `flow` goes through: the host's, with the commands it names as tools."""
        if self.commands is None:
            return self.host
        # The commands' modules load only for a run that has commands (a commands file's, or a bundle's).
        from heddle.tools.command_run import with_commands

        return with_commands(self.host, self.commands, flow)

    def document_egress(self, flow: Flow) -> tuple[dict[str, tuple[str, ...]] | None, dict[str, Any] | None]:
        """A document's egress allow-lists and secrets as sealing would decide them: `--egress`, `--secret`,
        the commands file's and the plugins' `egress:` sections and, once anything is declared, the
        document's own URLs (heddle.bundle.egress); (None, None) when nothing is."""
        secrets = parse_secret_flags(self.settings.secrets, {})
        declared = self.commands.egress if self.commands is not None else {}
        egress = sealed_egress(flow, (parse_flags(self.settings.egress), declared,
                                      *(m.egress for m in (self.host.manifests.values() if self.host else ()))),
                               secrets=secrets is not None)
        return egress, secrets

    def options_for(self, egress: Mapping[str, tuple[str, ...]] | None = None,
                    secrets: Mapping[str, Any] | None = None) -> RunOptions:
        """The options of a run: with the bundle's sealed egress and secrets (their values read now), or a
        document's `egress` and `secrets`."""
        if self.bundle is not None:
            egress, secrets = self.bundle.manifest.egress, self.bundle.manifest.secrets
        return with_egress(self.options, egress, secrets)

    def prepare(self, flow: Flow, *, tools: Mapping[str, Path] | None = None, tools_dir: Path | None = None,
                egress: Mapping[str, tuple[str, ...]] | None = None, secrets: Mapping[str, Any] | None = None,
                observer: ModelObserver | None = None) -> PreparedRun:
        """`flow` checked against everything before a node runs (engine.run.prepare_run), with this core's
        tools (or `tools` and `tools_dir`, a request's added), plugins, commands and options, and the
        bundle's sealed egress and secrets (a document's: `egress`, `secrets`, or else as
        `document_egress` decides them), read now. Blocking."""
        if self.bundle is None and egress is None and secrets is None:
            egress, secrets = self.document_egress(flow)
        tracing = Tracing.configured(capture_content=self.settings.otel_capture_content)
        if tracing is not None and self.bundle is not None:
            tracing = tracing.for_bundle(self.digest, list(self.bundle.signers), self.bundle.tool_fingerprints)
        return prepare_run(flow, tools=self.tools if tools is None else tools,
                           tools_dir=self.tools_dir if tools is None else tools_dir,
                           options=self.options_for(egress, secrets), sandbox_flags=self.settings.sandbox_flags,
                           plugins=self.plugins_for(flow), tracing=tracing, observer=observer)

    def session(self, session_id: str, *, answer: Answer | None = None, resume: bool = False) -> SessionUse:
        """How a run uses the session `session_id` of this core's store: the CLI's names open a session,
        the server's must have been issued (POST /v1/sessions)."""
        assert self.sessions is not None, "a face opens the store before it runs in a session"
        # The sessions' records and leases load only for a run in a session.
        from heddle.sessions.turn import SessionUse

        # A server runs every session run durably: a replica that dies leaves it for another to finish.
        return SessionUse(self.sessions, session_id, answer=answer, resume=resume,
                          durable=self.settings.durable or self.surface is not CLI, create=self.surface is CLI,
                          surface=self.surface, lease=self.settings.session_lease)

    async def run(self, prepared: PreparedRun, inputs: dict[str, Any], *, message: str | None = None,
                  on_event: EventSink | None = None, rendering: Rendering | None = None,
                  transport: httpx.AsyncBaseTransport | None = None, session: SessionUse | None = None,
                  digest: str = "", document: str = "", inputs_given: bool = True,
                  check: Check | None = None) -> RunOutcome:
        """Run `prepared` to its end (engine.run.run_prepared) or, in `session`, as one turn of it
        (sessions.turn.run_turn: bound to `digest`, by default the bundle's or the flow's, and named
        `document` in messages), until it waits for a person. `check` sees a session turn's inputs and
        message before it runs."""
        async def one(inputs: dict[str, Any], message: str | None, journal: Journal | None = None,
                      conversation: Conversation | None = None) -> RunOutcome:
            return await run_prepared(prepared, inputs, on_event=on_event or ev.ignore, rendering=rendering,
                                      transport=transport, message=message, journal=journal,
                                      conversation=conversation)

        if session is None:
            # After the document's own checks (what is wrong with it comes first), before anything runs.
            refuse_waits_without_session(prepared.flow, source=document or None)
            return await one(inputs, message)
        # The sessions' records and leases load only for a run in a session.
        from heddle.sessions.turn import flow_digest, run_turn

        async def turn_run(turn: Turn) -> RunOutcome:
            if check is not None:
                check(prepared.flow, turn.inputs, turn.message)
            return await one(turn.inputs, turn.message, turn.journal, turn.conversation)

        done = await run_turn(session, digest=digest or self.digest or flow_digest(prepared.flow), document=document,
                              inputs=inputs, inputs_given=inputs_given, message=message, run=turn_run)
        return dataclasses.replace(done.outcome, session_version=done.version)

    async def aclose(self) -> None:
        """Stop the plugin processes (safe to call again)."""
        if self.host is not None:
            await self.host.aclose()
