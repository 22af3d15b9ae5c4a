"""`agentspec_version`: which versions heddle reads, and features newer than a document declares.

heddle reads Agent Spec 25.4.x through 26.x. A document names the version it is written in; one
that uses a component type a later version introduced still runs (its meaning is not in doubt),
with a warning naming both versions, so the author can correct the declaration before another
runtime refuses the document.

`INTRODUCED` lists the component types the Agent Spec changelog and language reference give a
first version after 25.4.1, the initial release; a type it does not date is never warned about.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

Version = tuple[int, int, int]

OLDEST: Version = (25, 4, 0)
NEWEST_MAJOR = 26
READS = "25.4.x through 26.x"

_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[.-][0-9A-Za-z.+-]*)?")

# Agent Spec 25.4.2's changelog: ParallelFlowNode and ParallelMapNode, toolboxes, BuiltinTool,
# Swarm, agent specialization and ManagerWorkers. CatchExceptionNode: the 26.1.2 language reference.
INTRODUCED: Mapping[str, Version] = MappingProxyType({
    "ParallelFlowNode": (25, 4, 2),
    "ParallelMapNode": (25, 4, 2),
    "MCPToolBox": (25, 4, 2),
    "BuiltinTool": (25, 4, 2),
    "Swarm": (25, 4, 2),
    "SpecializedAgent": (25, 4, 2),
    "AgentSpecializationParameters": (25, 4, 2),
    "ManagerWorkers": (25, 4, 2),
    "CatchExceptionNode": (26, 1, 2),
})


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


def _component_types(document: Any) -> Iterator[tuple[str, str]]:
    """(JSON path, component_type) of every component, in document order; each container once."""
    stack: list[tuple[str, Any]] = [("$", document)]
    seen: set[int] = set()
    while stack:
        path, node = stack.pop()
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            ctype = node.get("component_type")
            if isinstance(ctype, str):
                yield path, ctype
            stack.extend((f"{path}.{key}", value) for key, value in reversed(node.items()) if key != "metadata")
        else:
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(node))))


def newer_features(document: Any, declared_text: str, *, source: str) -> list[str]:
    """A warning for each component type of the (resolved) document that its declared version predates."""
    declared = parse_version(declared_text)
    if declared is None:
        return []
    warnings: list[str] = []
    warned: set[str] = set()
    for path, ctype in _component_types(document):
        introduced = INTRODUCED.get(ctype)
        if introduced is None or introduced <= declared or ctype in warned:
            continue
        warned.add(ctype)
        warnings.append(f"{source}: {path} is a {ctype}, which Agent Spec {spelled(introduced)} introduced, but "
                        f"the document declares agentspec_version {declared_text}; declare "
                        f"{spelled(introduced)} or later")
    return warnings
