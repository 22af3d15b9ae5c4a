"""`agentspec_version`: which versions heddle reads, and features newer than a document declares.

heddle reads Agent Spec 25.4.x through 26.x. A document names the version it is written in, and, as
the specification's reader (pyagentspec) does, heddle refuses one that uses a component type, or
gives a field a value other than its default, that a later version introduced, naming the
component's place, the field, the version that introduced it and the declared one.

Which types and fields are newer than 25.4.1, the initial release, and each field's default, are
pyagentspec's (agentspec_versions.json, printed by scripts/agentspec_versions.py from the release
it names; a test holds the file to the installed release).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from heddle.agentspec.fields import components_of

Version = tuple[int, int, int]

OLDEST: Version = (25, 4, 0)
NEWEST_MAJOR = 26
READS = "25.4.x through 26.x"

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[.-][0-9A-Za-z.+-]*)?")


@functools.cache
def _table() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(__file__).with_name("agentspec_versions.json").read_text("utf-8"))
    return data


def _version(text: str) -> Version:
    major, minor, patch = (int(part) for part in text.split("."))
    return major, minor, patch


INTRODUCED: Mapping[str, Version] = MappingProxyType({
    name: _version(text) for name, text in _table()["types"].items()})
"""The first version of each component type newer than 25.4.1."""

FIELDS: Mapping[str, Mapping[str, tuple[Version, Any]]] = MappingProxyType({
    name: MappingProxyType({field: (_version(entry["since"]), entry["default"]) for field, entry in fields.items()})
    for name, fields in _table()["fields"].items()})
"""For each component type, its fields newer than 25.4.1: the first version and the field's default."""


# A RemoteTool's or ApiNode's `data` other than an object: 25.4.2 (pyagentspec's
# _infer_min_agentspec_version_from_configuration, a rule on the value that no field table holds).
_DATA: Mapping[str, tuple[Version, Any]] = MappingProxyType({
    "RemoteTool": ((25, 4, 2), {}), "ApiNode": ((25, 4, 2), {})})


def parse_version(text: str) -> Version | None:
    """`25.4.1` as (25, 4, 1) (a missing patch is 0; a suffix such as `.dev1` is left out), or None."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def readable(version: Version) -> bool:
    return OLDEST <= version and version[0] <= NEWEST_MAJOR


def spelled(version: Version) -> str:
    return ".".join(str(part) for part in version)


def newer_features(document: Any, declared_text: str, *, source: str) -> list[str]:
    """A problem for each component type of the (resolved) document, and each field it gives a value
    other than its default, that its declared version predates: pyagentspec refuses the document."""
    declared = parse_version(declared_text)
    if declared is None:
        return []
    problems: list[str] = []
    named: set[str] = set()
    for path, component in components_of(document):
        ctype = component["component_type"]
        introduced = INTRODUCED.get(ctype)
        if introduced is not None and introduced > declared:
            # The type names the version its fields need: one problem for it, once.
            if ctype not in named:
                named.add(ctype)
                problems.append(f"{source}: {path} is a {ctype}, which Agent Spec {spelled(introduced)} introduced, "
                                f"but the document declares agentspec_version {declared_text}; declare "
                                f"{spelled(introduced)} or later")
            continue
        fields = dict(FIELDS.get(ctype, {}))
        if ctype in _DATA and not isinstance(component.get("data", {}), dict):
            fields["data"] = _DATA[ctype]  # pyagentspec dates a data that is not an object, not the field
        for field, (since, default) in fields.items():
            if since > declared and field in component and component[field] != default:
                problems.append(f"{source}: {path}: {ctype} {component.get('name')!r} sets {field}, which Agent Spec "
                                f"{spelled(since)} introduced, but the document declares agentspec_version "
                                f"{declared_text}; declare {spelled(since)} or later, or drop {field}")
    return problems
