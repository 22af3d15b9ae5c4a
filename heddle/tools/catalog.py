"""Every tool a run would have: its name, where it comes from, its description, its input schema and
that schema's fingerprint. `heddle tools` prints it and `GET /v1/tools` answers with it.

A name is listed once, as the engine would resolve a call of it: a plugin's tool (its manifest's, or
one its process listed under --discover-tools), else the document's own (RemoteTool, ClientTool,
MCP), else a command (--commands) or the tools folder's program. A tools folder's program has no
schema of its own: a ServerTool of its name in the flow gives it one (the schema a bundle seals and
fingerprints); without a flow it is null, as for an MCP tool its server describes only once a run
starts it. An MCP toolbox without a `tool_filter` lists its tools only then: it is named apart.

The fingerprint is `heddle.canonical.fingerprint` of the schema, `sha256:` and the lowercase hex
sha256 of its compact, key-sorted UTF-8 JSON, as bundles, `heddle validate` and plugins show it.
Served (`public`), a row leaves out where the tool's program is.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from heddle.agentspec import components as c
from heddle.agentspec.walk import document_components
from heddle.canonical import fingerprint
from heddle.errors import UsageError
from heddle.graph import referenced_tools
from heddle.tools.schema import input_schema

if TYPE_CHECKING:
    from heddle.plugin_host.host import PluginHost

Source = Literal["tools-dir", "plugin", "command", "remote", "client", "mcp"]


class Described(Protocol):
    """What the catalog reads of a command (heddle.tools.commands.Command): nothing of how it runs."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def input_schema(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class ListedTool:
    name: str
    source: Source
    description: str = ""
    input_schema: Mapping[str, Any] | None = None
    path: Path | None = None  # the program on this machine, when the tool is one (never served)
    plugin: str | None = None  # the plugin that provides it
    discovered: bool = False  # listed by its plugin's process (--discover-tools), not its manifest

    @property
    def input_schema_fingerprint(self) -> str | None:
        return None if self.input_schema is None else fingerprint(self.input_schema)

    def row(self, *, public: bool = False) -> dict[str, Any]:
        row: dict[str, Any] = {"name": self.name, "source": self.source, "description": self.description,
                               "input_schema": None if self.input_schema is None else dict(self.input_schema),
                               "input_schema_fingerprint": self.input_schema_fingerprint}
        if self.plugin is not None:
            row["plugin"] = self.plugin
            row["discovered"] = self.discovered
        if not public and self.path is not None:
            row["path"] = str(self.path)
        return row


@dataclass(frozen=True)
class Catalog:
    tools: tuple[ListedTool, ...]  # by name
    toolboxes: tuple[str, ...] = ()  # MCP toolboxes whose tools their server lists once a run starts it

    def as_json(self, *, public: bool = False) -> dict[str, Any]:
        return {"tools": [t.row(public=public) for t in self.tools],
                "toolboxes": [{"name": name, "source": "mcp"} for name in self.toolboxes]}


def catalog(*, tools: Mapping[str, Path], flow: c.Flow | None = None, host: PluginHost | None = None,
            commands: Iterable[Described] = ()) -> Catalog:
    """The tools a run of `flow` (or of any flow, without one) would have: the tools folder's `tools`,
    the `commands`, the plugins of `host` (their listed tools too, once it has discovered them) and
    the flow's own. A name two of them claim in a way the run refuses is refused here too."""
    found: dict[str, ListedTool] = {name: ListedTool(name, "tools-dir", path=Path(path))
                                    for name, path in tools.items()}
    claimed = dict(tools)  # what a plugin tool may take only with "shadows": the folder's and the commands' names
    for command in commands:
        if command.name in found:
            raise UsageError(f"command {command.name!r} has the name of the tool {tools[command.name]}; a flow "
                             "names a tool by its name alone, so rename one of them")
        found[command.name] = ListedTool(command.name, "command", command.description, dict(command.input_schema))
        claimed[command.name] = Path(getattr(command, "source", "--commands"))
    if flow is not None:
        _declared(found, flow)
        toolboxes = _document_tools(found, flow)
    else:
        toolboxes = []
    if host is not None:
        host.known_tools(claimed)  # as a run refuses a plugin tool that takes one of those names
        for name, tool in host.tools.items():
            found[name] = ListedTool(name, "plugin", tool.description, tool.input_schema, path=tool.path,
                                     plugin=tool.plugin, discovered=tool.discovered)
    return Catalog(tuple(found[name] for name in sorted(found)), tuple(sorted(set(toolboxes))))


def _declared(found: dict[str, ListedTool], flow: c.Flow) -> None:
    """The tools folder's programs the flow names as ServerTools, with the flow's description and schema."""
    for name, tool in referenced_tools(flow).items():
        listed = found.get(name)
        if listed is not None and listed.source == "tools-dir":
            found[name] = ListedTool(name, "tools-dir", tool.description or "", input_schema(tool), path=listed.path)


def _document_tools(found: dict[str, ListedTool], flow: c.Flow) -> list[str]:
    """The flow's own tools added to `found` (they answer before a command or the tools folder); the
    names of the MCP toolboxes whose tools only their server can list."""
    sources: dict[type[c.Component], Source] = {c.RemoteTool: "remote", c.ClientTool: "client", c.MCPTool: "mcp"}
    toolboxes: list[str] = []
    for _, component in document_components(flow):
        source = sources.get(type(component))
        if source is not None and isinstance(component, c.WithIO):
            declared = not isinstance(component, c.MCPTool) or component.declares_inputs()
            found[component.name] = ListedTool(component.name, source, component.description or "",
                                               input_schema(component) if declared else None)
        elif isinstance(component, c.MCPToolBox):
            if component.tool_filter is None:
                toolboxes.append(component.name)
                continue
            for entry in component.tool_filter:
                if isinstance(entry, str):
                    found[entry] = ListedTool(entry, "mcp")
                else:
                    found[entry.name] = ListedTool(entry.name, "mcp", entry.description or "",
                                                   input_schema(entry) if entry.declares_inputs() else None)
    return toolboxes


async def listed(*, tools: Mapping[str, Path], flow: c.Flow | None, host: PluginHost | None,
                 discover: Callable[[], Awaitable[None]], commands: Iterable[Described] = ()) -> Catalog:
    """`catalog`, with the plugins asked which tools they serve first (`discover`: heddle.runs.discover,
    which does when the settings say --discover-tools); the plugins' processes are stopped before it returns."""
    try:
        await discover()
        return catalog(tools=tools, flow=flow, host=host, commands=commands)
    finally:
        if host is not None:
            await host.aclose()
