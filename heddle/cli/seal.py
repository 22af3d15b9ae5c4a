"""`heddle bundle`'s side of sealing: its text flags read, `heddle.seal` called with the terminal's
progress bar, and the sealed bundle reported. The recipe itself is heddle.bundle.seal."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def seal_flow(
    flow_path: Path,
    *,
    tools_dir: Path | None,
    mounts: Sequence[str],
    plugins: Sequence[Path],
    input_text: str | None,
    requires: str | None,
    max_tool_rounds: str | None,
    sign_key: Path | None,
    name: str | None,
    fmt: str | None,
    output: Path | None,
    max_entries: int,
    max_bytes: int,
    read_input: Callable[[str | None], dict[str, Any]],
    include_secrets: Sequence[Path] | None = None,
    json_out: bool = False,
    components: Path | None = None,
    commands: Path | None = None,
    level: int | None = None,
    release: int | None = None,
    safe: bool = False,
    egress: Sequence[str] = (),
    egress_file: Path | None = None,
    secrets: Sequence[str] = (),
) -> None:
    """Seal the flow as the flags say and print what was written (as JSON with `json_out`)."""
    from heddle.bundle.requires import parse_requires
    from heddle.bundle.seal import seal
    from heddle.cli.bundle import print_seal_result
    from heddle.cli.output import warn
    from heddle.cli.progress import terminal_progress

    result = seal(
        flow_path, output=output, tools_dir=tools_dir, mounts=mounts, plugins=plugins, sign_key=sign_key, name=name,
        input=read_input(input_text) if input_text is not None else None,
        requires=parse_requires(requires) if requires is not None else None,
        max_tool_rounds=max_tool_rounds, include_secrets=include_secrets or (), flow_format=fmt,
        mount_max_entries=max_entries, mount_max_bytes=max_bytes, progress=terminal_progress(),
        components=components, commands=commands, level=level, release=release, safe=safe,
        egress=egress, egress_file=egress_file, secrets=secrets,
    )
    for warning in result.warnings:
        warn(warning)
    print_seal_result(result, json_out=json_out)
