"""`heddle bundle`'s side of sealing: its text flags read, `heddle.seal` called with the terminal's
progress bar, and the sealed bundle reported. The recipe itself is heddle.bundle.seal."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle.bundle.seal import SealSettings


def seal_flow(flow_path: Path, settings: SealSettings, *, input_text: str | None, requires_text: str | None,
              read_input: Callable[[str | None], dict[str, Any]], json_out: bool = False) -> None:
    """Seal the flow with `settings` and the text flags `--input` and `--requires`, then print what was
    written (as JSON with `json_out`)."""
    from heddle.bundle.requires import parse_requires
    from heddle.bundle.seal import seal
    from heddle.cli.bundle import print_seal_result
    from heddle.cli.output import warn
    from heddle.cli.progress import terminal_progress

    result = seal(flow_path, settings, input=read_input(input_text) if input_text is not None else None,
                  requires=parse_requires(requires_text) if requires_text is not None else None,
                  progress=terminal_progress())
    for warning in result.warnings:
        warn(warning)
    print_seal_result(result, json_out=json_out)
