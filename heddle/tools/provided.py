"""Tools a document brings itself, beside the tools folder's executables: a RemoteTool's HTTP
request, an MCP server's tools. Each kind is a `ToolKind` that knows its components; a run opens
them all once (`open_document_tools`), so an MCP server starts and lists its tools before the
first node and stops when the run ends, however it ended.

The engine looks a tool up here by name after the seams' tools and before the tools folder.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from heddle.agentspec.walk import components

if TYPE_CHECKING:
    from heddle.agentspec import components as c
    from heddle.engine.context import RunContext
    from heddle.engine.seams import ProvidedTool


class ToolKind(Protocol):
    """One kind of document tool (RemoteTool, MCP): what it needs started for a run."""

    def wants(self, flow: c.Flow) -> bool:
        """Whether `flow` (or a subflow, an agent of it) uses a tool of this kind."""
        ...

    def open(self, ctx: RunContext, flow: c.Flow) -> contextlib.AbstractAsyncContextManager[DocumentTools]:
        """Start what the tools of `flow` need for one run and yield them; leaving stops it."""
        ...


@dataclass
class DocumentTools:
    """The document's own tools of one run, by name, and the agents' extra tool definitions.

    `by_agent` holds, per agent id, the tools it is offered that its document does not list
    one by one (an MCP toolbox's, known only once its server answered).
    """

    tools: dict[str, ProvidedTool] = field(default_factory=dict)
    by_agent: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Per agent id, the names of those tools whose calls a person approves first (a toolbox's
    # requires_confirmation).
    confirm: dict[str, set[str]] = field(default_factory=dict)

    def merge(self, other: DocumentTools) -> None:
        self.tools.update(other.tools)
        for agent, definitions in other.by_agent.items():
            self.by_agent.setdefault(agent, []).extend(definitions)
        for agent, names in other.confirm.items():
            self.confirm.setdefault(agent, set()).update(names)


# Each module names its kind `KIND`, by the component classes it runs: a module is imported, and
# asked whether it `wants` the flow, only when the flow has a component of one of them.
_KIND_MODULES: dict[str, tuple[str, ...]] = {
    "heddle.tools.mcp": ("MCPTool", "MCPToolBox"),
    "heddle.tools.remote": ("RemoteTool",),
    "heddle.tools.client": ("ClientTool",),
}


def kinds(flow: c.Flow) -> Sequence[ToolKind]:
    """The kinds of document tool `flow` has components of, found in one walk of it."""
    import importlib


    present = {type(component).__name__ for _, component in components(flow)}
    return tuple(importlib.import_module(name).KIND for name, types in _KIND_MODULES.items()
                 if present.intersection(types))


@contextlib.asynccontextmanager
async def open_document_tools(ctx: RunContext, flow: c.Flow, found_kinds: Sequence[ToolKind] | None = None
                              ) -> AsyncIterator[Mapping[str, ProvidedTool]]:
    """Every document tool of `flow`, open for the run. `found_kinds` are its `kinds`, when found
    before (a prepared run found them once for all its runs)."""
    found = DocumentTools()
    async with contextlib.AsyncExitStack() as stack:
        for kind in kinds(flow) if found_kinds is None else found_kinds:
            if kind.wants(flow):
                found.merge(await stack.enter_async_context(kind.open(ctx, flow)))
        ctx.document_tools = found
        yield found.tools
