"""The knobs of one run, with the defaults the CLI and the server share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from heddle.surface import CLI, Surface

if TYPE_CHECKING:
    from heddle.workspace.sandbox import SandboxPolicy
    from heddle.workspace.workspace import WorkspaceOptions

DEFAULT_MAX_ITERATIONS = 50
DEFAULT_MAX_TOOL_ROUNDS = 10
DEFAULT_TIMEOUT_S = 300.0
DEFAULT_TOOL_TIMEOUT_S = 30.0


def _workspace_default() -> "WorkspaceOptions":
    from heddle.workspace.workspace import WorkspaceOptions

    return WorkspaceOptions()


def _sandbox_default() -> "SandboxPolicy":
    from heddle.workspace.sandbox import SandboxPolicy

    return SandboxPolicy()


@dataclass(frozen=True)
class RunOptions:
    max_iterations: int = DEFAULT_MAX_ITERATIONS
    max_tool_rounds: int | None = DEFAULT_MAX_TOOL_ROUNDS  # None: unlimited
    timeout: float | None = DEFAULT_TIMEOUT_S  # whole run, seconds
    tool_timeout: float | None = DEFAULT_TOOL_TIMEOUT_S
    stream: bool = True
    workspace: "WorkspaceOptions" = field(default_factory=_workspace_default)
    sandbox: "SandboxPolicy" = field(default_factory=_sandbox_default)
    # Model request settings; the client's own defaults otherwise.
    model_timeout: float = 120.0
    model_retries: int = 3
    extra: dict[str, Any] = field(default_factory=dict)
    # Whose flags and units messages about these limits name: the CLI's (seconds) or the server's.
    surface: Surface = CLI


def parse_max_tool_rounds(value: str | int | None) -> int | None:
    """`--max-tool-rounds N|unlimited`."""
    from heddle.errors import UsageError

    if value is None:
        return DEFAULT_MAX_TOOL_ROUNDS
    if isinstance(value, int):
        n = value
    elif str(value).strip().lower() in ("unlimited", "none", "inf"):
        return None
    else:
        try:
            n = int(str(value))
        except ValueError:
            raise UsageError(f"--max-tool-rounds {value!r}: give a positive whole number or 'unlimited'") from None
    if n < 1:
        raise UsageError(f"--max-tool-rounds {n}: must be at least 1 (or 'unlimited')")
    return n


def resolve_max_tool_rounds(given: str | None, proposal: int | str | None = None) -> int | None:
    """The tool-round limit of a run: `--max-tool-rounds` when given, else a bundle's proposal
    (a number or "unlimited"), else the default. None means unlimited. Both shells use this one."""
    if given is not None:
        return parse_max_tool_rounds(given)
    if proposal is not None:
        return parse_max_tool_rounds(proposal)
    return DEFAULT_MAX_TOOL_ROUNDS
