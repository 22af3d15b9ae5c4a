"""Tool results that fit the model: one that serializes to more than `--tool-output-limit` characters
(or its tool's tighter `metadata.truncate`) is written whole to the agent's workspace, under
`.heddle/tool-output/<call-id>.txt`, and the model gets its first half of the limit, a marker naming
that file and how many lines were cut, and its last half.

Only what goes back to a model is cut: a ToolNode's outputs reach the flow's state whole. The file
lives in the workspace of the agent's execution, where its tools run (and read it, as
`.heddle/tool-output/...` from their working directory); it goes with the workspace, or stays in a
kept `--workspace`. It is written without following any link, so a tool that replaced part of the
path with one cannot have heddle write elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.blocking import WORKSPACE_COPIES, run_blocking
from heddle.errors import RunError
from heddle.graph import truncate_of

if TYPE_CHECKING:
    from heddle.agentspec import components as c
    from heddle.engine.context import RunContext
    from heddle.workspace.workspace import Workspace

FOLDER = (".heddle", "tool-output")  # inside the workspace
MARKER = "[... {lines} lines cut; full output in {path}]"

_STEM = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
# In JSON text a backslash only ever starts an escape: `\n` there is a line break of the value.
_BREAK = re.compile(r"\n|\\(?:u[0-9a-fA-F]{4}|.)", re.DOTALL)


def limits_of(tools: Iterable[c.Component]) -> dict[str, int]:
    """{tool name: its own limit} for the tools an agent lists that set `metadata.truncate` (checked
    before the run, so a bad one is not met here)."""
    limits: dict[str, int] = {}
    for tool in tools:
        limit = truncate_of(tool)
        if limit is not None:
            limits[tool.name] = limit
    return limits


# --------------------------------------------------------------------------- cutting


def lines_cut(text: str, start: int, end: int) -> int:
    """How many lines of `text` the cut `text[start:end]` touches. A line break is a newline or, in
    JSON text, the escape `\\n`; a line owns the break that ends it."""
    if start >= end:
        return 0
    touched = 1
    for found in _breaks(text):
        last = found.end() - 1  # the break's last character, on the line it ends
        if last >= end - 1:
            break
        if last >= start:
            touched += 1
    return touched


def _breaks(text: str) -> Iterator[re.Match[str]]:
    for found in _BREAK.finditer(text):
        if found.group() in ("\n", "\\n"):
            yield found


def cut(text: str, limit: int, shown_path: str) -> str:
    """`text` as the model gets it: whole when it fits `limit`, else its first half of the limit,
    the marker naming `shown_path`, and its last half."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    marker = MARKER.format(lines=lines_cut(text, head, len(text) - tail), path=shown_path)
    return f"{text[:head]}{marker}{text[len(text) - tail:]}"


def file_stem(call_id: str | None) -> str:
    """A file name for a call id: the id itself when it is a plain name, else a digest of it (a
    model's ids are free text, and a file name must not climb, hide or grow without end)."""
    if call_id and _STEM.fullmatch(call_id) and ".." not in call_id:
        return call_id
    return "call-" + hashlib.sha256((call_id or "").encode("utf-8")).hexdigest()[:16]


def _write_new(root: Path, stem: str, data: bytes) -> str:
    """Write `data` to a new file `<stem>.txt` (or `<stem>-N.txt`, when a call id repeats) in the
    workspace's tool-output folder, opening every folder on the way without following a link; the
    file's name."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(root, flags)
    try:
        for part in FOLDER:
            try:
                os.mkdir(part, 0o755, dir_fd=fd)
            except FileExistsError:
                pass
            inner = os.open(part, flags, dir_fd=fd)
            os.close(fd)
            fd = inner
        n = 1
        while True:
            name = f"{stem}.txt" if n == 1 else f"{stem}-{n}.txt"
            try:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                              dir_fd=fd)
            except FileExistsError:
                n += 1
                continue
            with os.fdopen(out, "wb") as handle:
                handle.write(data)
            return name
    finally:
        os.close(fd)


async def fit_for_model(ctx: RunContext, workspace: Workspace, call_id: str | None, serialized: str, *,
                        limit: int | None = None) -> str:
    """`serialized` (a tool result as the model would get it) cut to the run's `--tool-output-limit`,
    or to `limit` (the tool's own `metadata.truncate`) when that is tighter; the whole text is then
    written to the workspace first, so the file the marker names exists while the agent runs."""
    most = ctx.options.tool_output_limit if limit is None else min(limit, ctx.options.tool_output_limit)
    if len(serialized) <= most:
        return serialized
    stem = file_stem(call_id)
    data = serialized.encode("utf-8")
    try:
        name = await run_blocking(WORKSPACE_COPIES, _write_new, workspace.root, stem, data)
    except OSError as exc:
        raise RunError(f"node {workspace.node_name!r}: the result of tool call {call_id!r} is longer than the "
                       f"{most} characters its model may get, and could not be written whole to "
                       f"{'/'.join(FOLDER)} in its workspace ({exc.strerror or exc}); a tool may have replaced "
                       "that folder") from None
    return cut(serialized, most, "/".join((*FOLDER, name)))


def serialize(result: Any) -> str:
    """A tool result as the model gets it: compact JSON, as written."""
    return json.dumps(result, ensure_ascii=False, separators=(",", ":"))


async def tool_message(ctx: RunContext, workspace: Workspace, call_id: str, result: Any, *,
                       limit: int | None = None) -> dict[str, Any]:
    """The `tool` message that gives the model `result`, cut to fit (see `fit_for_model`)."""
    content = await fit_for_model(ctx, workspace, call_id, serialize(result), limit=limit)
    return {"role": "tool", "tool_call_id": call_id, "content": content}
