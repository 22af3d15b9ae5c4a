"""`requires`: what a bundle says the machine must already have, and checking it.

Checking only looks: a name on PATH, a variable being set (its value is never read out),
a path existing. Nothing a bundle declares is installed or run. The variables the sealed
flow reads (its llm configs' `$VAR`s) are requirements too, whether declared or not.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from heddle import canonical
from heddle.format.errors import PackError
from heddle.format.manifest import Requires

if TYPE_CHECKING:
    from heddle.bundle.flowenv import EnvRead


@dataclass(frozen=True)
class RequirementCheck:
    kind: str  # "bin", "env" or "file"
    name: str
    ok: bool
    detail: str
    required: bool = True  # False: used when there, and a run goes on without it


def parse_requires(text: str) -> Requires:
    """`--requires JSON|@file`: an object with optional `bins`, `env`, `files` lists of strings."""
    source = "--requires"
    if text.startswith("@"):
        path = Path(text[1:])
        source = f"--requires {text}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise PackError(f"{source}: cannot read {path}: {exc.strerror}") from None
    try:
        data = canonical.loads_strict(text)
    except ValueError as exc:
        raise PackError(f"{source}: not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise PackError(f"{source}: must be a JSON object with bins, env and files lists")
    unknown = sorted(set(data) - {"bins", "env", "files"})
    if unknown:
        raise PackError(f"{source}: unknown key {unknown[0]!r}; use bins, env and files")
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("bins", "env", "files"):
        items = data.get(key, [])
        if not isinstance(items, list) or not all(isinstance(i, str) and i for i in items):
            raise PackError(f"{source}: {key} must be a list of non-empty strings")
        lists[key] = tuple(items)
    return Requires(**lists)


def check_requires(requires: Requires) -> list[RequirementCheck]:
    checks: list[RequirementCheck] = []
    for name in requires.bins:
        found = shutil.which(name)
        checks.append(RequirementCheck("bin", name, found is not None, found or "not found on PATH"))
    for name in requires.env:
        present = bool(os.environ.get(name))
        checks.append(RequirementCheck("env", name, present, "set" if present else "not set"))
    for name in requires.files:
        exists = Path(name).expanduser().exists()
        checks.append(RequirementCheck("file", name, exists, "present" if exists else "missing"))
    return checks


def check_flow_env(reads: Iterable[EnvRead], *, declared: Iterable[str] = ()) -> list[RequirementCheck]:
    """A check for each variable the flow reads that `requires.env` does not already list."""
    listed = set(declared)
    checks: list[RequirementCheck] = []
    for read in reads:
        if read.name in listed:
            continue
        present = bool(os.environ.get(read.name))
        state = "set" if present else "not set"
        checks.append(RequirementCheck("env", read.name, present, f"{state}; the flow reads it ({read.where})",
                                       required=read.required))
    return checks
