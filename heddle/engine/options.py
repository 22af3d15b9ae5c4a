"""The engine's form of a run's settings, where the engine's defaults are written: the flag table
(`heddle.settings.RunSettings`) reads them, and its settings turn into these options.

Kept light (the standard library, `heddle.errors` and `heddle.surface`): both shells read it, through
the flag table, before `--help`; the workspace and egress modules are imported when options are made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.errors import UsageError
from heddle.surface import NEUTRAL, Surface

if TYPE_CHECKING:
    from heddle.egress import EgressPolicy, Secrets
    from heddle.workspace.sandbox import SandboxPolicy
    from heddle.workspace.workspace import WorkspaceOptions


def _workspace_default() -> WorkspaceOptions:
    from heddle.workspace.workspace import WorkspaceOptions

    return WorkspaceOptions()


def _sandbox_default() -> SandboxPolicy:
    from heddle.workspace.sandbox import SandboxPolicy

    return SandboxPolicy()


@dataclass(frozen=True)
class RunOptions:
    max_iterations: int = 50
    max_tool_rounds: int | None = 10  # None: unlimited
    max_parallel: int = 4  # subflows one parallel node runs at once
    timeout: float | None = 300.0  # whole run, seconds
    tool_timeout: float | None = 30.0
    # Characters of one tool result an agent's model gets (heddle.engine.tool_output).
    tool_output_limit: int = 30000
    stream: bool = True
    workspace: WorkspaceOptions = field(default_factory=_workspace_default)
    sandbox: SandboxPolicy = field(default_factory=_sandbox_default)
    model_timeout: float = 120.0  # silence: connecting, or between two pieces of an answer
    model_deadline: float = 600.0  # one model request, its whole answer read
    # Decoded bytes of one answer read from the network (heddle.bounded), and of a tool's stdout.
    max_response_bytes: int = 16 * 2**20
    max_tool_stdout_bytes: int = 16 * 2**20
    model_retries: int = 3
    extra: dict[str, Any] = field(default_factory=dict)
    # --model-url: {llm config name or id: URL}, replacing those configs' urls for this run.
    model_urls: Mapping[str, str] = field(default_factory=dict)
    # Whose flags and units messages about these limits name: the shell's (heddle.settings: CLI, SERVER).
    surface: Surface = NEUTRAL
    # A bundle's sealed egress allow-lists (heddle.egress), which heddle's own requests for the document
    # obey; None: the bundle declares none, and nothing is restricted.
    egress: EgressPolicy | None = None
    # The secrets its tools use through the egress proxy without holding them, with their values.
    secrets: Secrets | None = None


def with_egress(options: RunOptions, egress: Mapping[str, tuple[str, ...]] | None,
                secrets: Mapping[str, Mapping[str, Any]] | None = None) -> RunOptions:
    """`options` holding a bundle's sealed egress allow-lists (a manifest's `egress`), if it has any, and
    its secrets (a manifest's `secrets`), their values read now from where they come from."""
    if egress is None:
        return options
    import dataclasses
    import os

    from heddle.egress import EgressError, EgressPolicy, Secrets

    read = None
    if secrets:
        try:
            read = Secrets.read(secrets, os.environ)
        except EgressError as exc:
            raise UsageError(str(exc)) from None
    return dataclasses.replace(options, egress=EgressPolicy.sealed(egress), secrets=read)
