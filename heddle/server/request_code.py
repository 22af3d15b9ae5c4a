"""Tools sent with a request (`--allow-request-code`): checked, written to a folder of the run's
own, and removed with it.

A tool is `{name, source, interpreter?}`. With an interpreter the file gets the matching `#!`
line (a `#!` line of the source's own is dropped); without one the source must carry its own
`#!` line or it runs under sh.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heddle.server.errors import bad_request

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")
INTERPRETERS = ("sh", "bash", "python3", "node")
MAX_TOOLS = 32
TOOL_KEYS = ("name", "source", "interpreter")


@dataclass(frozen=True)
class RequestTool:
    name: str
    source: str
    interpreter: str | None = None

    def file_text(self) -> str:
        source = self.source
        if self.interpreter is None:
            return source if source.startswith("#!") else "#!/bin/sh\n" + source
        if source.startswith("#!"):
            source = source.split("\n", 1)[1] if "\n" in source else ""
        return f"#!/usr/bin/env {self.interpreter}\n{source}"


def parse_tools(value: Any) -> tuple[RequestTool, ...]:
    if not isinstance(value, list):
        raise bad_request("request field 'tools' must be a list of {name, source, interpreter?} objects")
    if len(value) > MAX_TOOLS:
        raise bad_request(f"request field 'tools' has {len(value)} tools; at most {MAX_TOOLS} may be sent")
    tools: list[RequestTool] = []
    seen: set[str] = set()
    for i, item in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"{where} must be an object {{name, source, interpreter?}}, not {type(item).__name__}")
        unknown = sorted(set(item) - set(TOOL_KEYS))
        if unknown:
            raise bad_request(f"{where}.{unknown[0]} is unknown; a tool has name, source and interpreter")
        name = item.get("name")
        if not isinstance(name, str) or not NAME.match(name):
            raise bad_request(f"{where}.name {name!r}: use 1 to 64 letters, digits, '_' or '-'")
        if name in seen:
            raise bad_request(f"{where}.name {name!r} is sent twice; each tool needs its own name")
        seen.add(name)
        source = item.get("source")
        if not isinstance(source, str) or not source.strip():
            raise bad_request(f"{where}.source (tool {name!r}) must be the tool's program text")
        if "\0" in source:
            raise bad_request(f"{where}.source (tool {name!r}) contains a NUL byte; send program text")
        interpreter = item.get("interpreter")
        if interpreter is not None and interpreter not in INTERPRETERS:
            raise bad_request(f"{where}.interpreter {interpreter!r} (tool {name!r}): use one of "
                              + ", ".join(INTERPRETERS))
        tools.append(RequestTool(name=name, source=source, interpreter=interpreter))
    return tuple(tools)


class ToolFolder:
    """The folder a run's request tools live in. `close()` removes it; it is safe to call twice."""

    def __init__(self, tools: tuple[RequestTool, ...], *, parent: Path | None) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="heddle-request-tools-", dir=parent))
        try:
            self.tools: dict[str, Path] = {}
            for tool in tools:
                path = self.root / tool.name
                # Created executable and owner-only in one step: never a moment where it is
                # readable by others or not yet runnable.
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(tool.file_text())
                self.tools[tool.name] = path
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
