"""What a document names that heddle does not run, refused before anything runs.

Each refusal is one sentence naming the component (type and name), its path in the document
(`$.nodes[2].tool`, after `$component_ref`s are resolved) and what would run it. None of these
fields is read and then ignored:

- A BuiltinTool no loaded plugin provides: heddle has no built-in tools of its own. A plugin tool
  of its name runs it, given its arguments alone, so one that also gives a `configuration`, an
  `executor_name` or a `tool_version` is refused.
- One name for two different tools: a call names its tool by name alone.

These need the run's plugins (`flow_refusals`, with the graph checks). Where a document may wait
for a person (requires_confirmation, human_in_the_loop, ClientTools, InputMessageNodes) is
heddle.agentspec.waits; component types heddle does not read at all are refused with their reason by
heddle.agentspec.catalog.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from heddle.agentspec import components as c
from heddle.agentspec.walk import document_components, of_type

BUILTIN_TOOL = ("is a BuiltinTool, and heddle has no built-in tools of its own: a plugin that provides a tool "
                "named {name!r} runs it (--plugin MANIFEST)")

def flow_refusals(flow: c.Flow, *, plugin_tools: Collection[str] = ()) -> list[str]:
    """What `flow` names that only the run's plugins could run, and tool names it gives two
    different tools (a call names its tool by name alone)."""
    problems: list[str] = []
    for where, tool in of_type(flow, c.BuiltinTool):
        label = f"{where}: BuiltinTool {tool.name!r} (tool_type {tool.tool_type!r})"
        if tool.name not in plugin_tools:
            problems.append(f"{label} {BUILTIN_TOOL.format(name=tool.name)}")
            continue
        # A plugin's tool is given its arguments alone: what else the document says would be lost.
        unsent = [field for field in ("configuration", "executor_name", "tool_version") if getattr(tool, field)]
        if unsent:
            problems.append(f"{label} gives {', '.join(unsent)}, which heddle cannot pass to the plugin tool that "
                            "runs it (a plugin tool takes its arguments only); drop them, or give them to the "
                            "plugin as its settings (--plugin-config)")
    tool_types = (c.ServerTool, c.RemoteTool, c.ClientTool, c.BuiltinTool, c.MCPTool)
    first: dict[str, tuple[str, Any]] = {}
    for where, component in document_components(flow):
        if not isinstance(component, tool_types):
            continue
        seen = first.setdefault(component.name, (where, component))
        other = seen[1]
        if other is component or (isinstance(other, c.ServerTool) and isinstance(component, c.ServerTool)):
            continue
        if type(other) is not type(component) or _definition(other) != _definition(component):
            problems.append(f"{where}: {component.component_type} {component.name!r} has the name of the "
                            f"{other.component_type} at {seen[0]}, another tool; a tool is called by its name, so "
                            "give each its own")
    return problems


def _definition(tool: c.Component) -> dict[str, Any]:
    return tool.model_dump(exclude={"id", "metadata", "description"})


def plugin_tools(tools: Mapping[str, Path] | None, tools_dir: Path | None) -> frozenset[str]:
    """The names in `tools` (a check's executables by name) that plugins provide: those not in the
    tools folder, as the graph checks tell them apart."""
    if not tools:
        return frozenset()
    folder = Path(tools_dir).resolve() if tools_dir is not None else None
    return frozenset(name for name, path in tools.items()
                     if folder is None or not Path(path).resolve().is_relative_to(folder))
