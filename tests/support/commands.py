"""Commands for tests (heddle.tools.commands): one that wraps the real `date`, and a flow whose
ToolNode calls it."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support.flows import FlowDoc, server_tool

DATE = shutil.which("date") or "/usr/bin/date"
SORT = next((f"{d}/sort" for d in ("/usr/local/bin", "/usr/bin", "/bin") if os.access(f"{d}/sort", os.X_OK)),
            "/usr/bin/sort")


@functools.cache
def version_of(program: str) -> str:
    """What the program's `--version` prints with an empty environment, as heddle's probe runs it."""
    done = subprocess.run([program, "--version"], env={}, capture_output=True, text=True, check=True, timeout=10)
    return done.stdout.strip()


def entry(**fields: Any) -> dict[str, Any]:
    """A command that prints the UTC day of a Unix time with the real `date`."""
    base: dict[str, Any] = {
        "name": "day_of", "description": "The UTC calendar day of a Unix time.",
        "input_schema": {"type": "object", "properties": {"seconds": {"type": "integer"}}, "required": ["seconds"]},
        "executable": "date", "version_probe": ["--version"], "expected_version": version_of(DATE),
        "argv": ["-u", "-d", "@{seconds}", "+%Y-%m-%d"], "timeout_seconds": 10, "working_directory": "workspace",
        "adapter_version": "1", "output": "text",
    }
    base.update(fields)
    return base


def write_commands(path: Path, *entries: dict[str, Any]) -> Path:
    path.write_text(json.dumps({"commands": list(entries)}), encoding="utf-8")
    return path


def day_flow(path: Path) -> Path:
    f = FlowDoc("day")
    start = f.start([{"title": "seconds", "type": "integer"}])
    tool = server_tool("day_of", [{"title": "seconds", "type": "integer"}],
                       [{"title": "stdout", "type": "string"}, {"title": "exit_code", "type": "integer"}])
    node = f.tool_node("day", tool)
    end = f.end(["stdout"])
    f.control(start, node)
    f.control(node, end)
    return f.write(path)


def sort_entry(argv: list[str], prop: dict[str, Any] | None = None) -> dict[str, Any]:
    """`sort` over one path: given `--output=FILE` instead, sort would write FILE."""
    return {"name": "sort_file", "description": "Sorts the lines of a file.",
            "input_schema": {"type": "object", "properties": {"path": prop or {"type": "string"}},
                             "required": ["path"]},
            "executable": "sort", "version_probe": ["--version"], "expected_version": version_of(SORT),
            "argv": argv, "timeout_seconds": 10, "working_directory": "workspace", "adapter_version": "1",
            "output": "text"}


def sort_flow(path: Path) -> Path:
    """One ToolNode calling `sort_file` with the input `path`."""
    f = FlowDoc("sorter")
    start = f.start(["path"])
    outputs = [{"title": "exit_code", "type": "integer"}, "stdout"]
    node = f.tool_node("sort", server_tool("sort_file", ["path"], outputs))
    end = f.end(outputs)
    f.control(start, node)
    f.control(node, end)
    return f.write(path)
