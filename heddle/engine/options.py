"""The engine's form of a run's settings: `heddle.settings.RunSettings` (where every default is
written) turned into workspace and sandbox options, with the surface messages speak to."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.settings import RunSettings, parse_rounds
from heddle.surface import CLI, Surface

if TYPE_CHECKING:
    from heddle.egress import EgressPolicy, Secrets
    from heddle.workspace.sandbox import SandboxPolicy
    from heddle.workspace.workspace import WorkspaceOptions

_DEFAULTS = RunSettings()
DEFAULT_MAX_ITERATIONS = _DEFAULTS.max_iterations
DEFAULT_MAX_TOOL_ROUNDS = _DEFAULTS.max_tool_rounds
DEFAULT_TIMEOUT_S = _DEFAULTS.timeout
DEFAULT_TOOL_TIMEOUT_S = _DEFAULTS.tool_timeout


def _workspace_default() -> WorkspaceOptions:
    from heddle.workspace.workspace import WorkspaceOptions

    return WorkspaceOptions()


def _sandbox_default() -> SandboxPolicy:
    from heddle.workspace.sandbox import SandboxPolicy

    return SandboxPolicy()


@dataclass(frozen=True)
class RunOptions:
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_tool_rounds: int | None = DEFAULT_MAX_TOOL_ROUNDS  # None: unlimited
    max_parallel: int = _DEFAULTS.max_parallel  # subflows one parallel node runs at once
    timeout: float | None = DEFAULT_TIMEOUT_S  # whole run, seconds
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT_S
    # Characters of one tool result an agent's model gets (heddle.engine.tool_output).
    tool_output_limit: int = _DEFAULTS.tool_output_limit
    stream: bool = _DEFAULTS.stream
    workspace: WorkspaceOptions = field(default_factory=_workspace_default)
    sandbox: SandboxPolicy = field(default_factory=_sandbox_default)
    model_timeout: float = _DEFAULTS.model_timeout
    model_deadline: float = _DEFAULTS.model_deadline
    # Decoded bytes of one answer read from the network (heddle.bounded), and of a tool's stdout.
    max_response_bytes: int = _DEFAULTS.max_response_bytes
    max_tool_stdout_bytes: int = _DEFAULTS.max_tool_stdout_bytes
    model_retries: int = _DEFAULTS.model_retries
    extra: dict[str, Any] = field(default_factory=dict)
    # --model-url: {llm config name or id: URL}, replacing those configs' urls for this run.
    model_urls: Mapping[str, str] = field(default_factory=dict)
    # Whose flags and units messages about these limits name: the CLI's (seconds) or the server's.
    surface: Surface = CLI
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
            from heddle.errors import UsageError

            raise UsageError(str(exc)) from None
    return dataclasses.replace(options, egress=EgressPolicy.sealed(egress), secrets=read)


def parse_max_tool_rounds(value: str | int | None) -> int | None:
    """`--max-tool-rounds N|unlimited`."""
    return parse_rounds(value)

