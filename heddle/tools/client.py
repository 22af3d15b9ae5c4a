"""ClientTool: a tool the client runs, not heddle. A call to one stops the run to wait for the
client's result (heddle.engine.journal): the run resumes with it (`--tool-result JSON`, or
`{"tool_result": ...}` over HTTP) as the tool's output. Runs in a session only: a ClientTool in a
ToolNode is refused without one before the run starts, and an agent's call to one ends a run without
one there (heddle.agentspec.waits).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec.walk import of_type
from heddle.engine.journal import WaitingFor
from heddle.tools.provided import DocumentTools
from heddle.tools.schema import checked_arguments

if TYPE_CHECKING:
    from heddle.engine.context import RunContext
    from heddle.engine.seams import ToolRequest


def client_tools(flow: c.Flow) -> list[tuple[str, c.ClientTool]]:
    return list(of_type(flow, c.ClientTool))


@dataclass(frozen=True)
class ClientCall:
    """One ClientTool as a run meets it (heddle.engine.seams.ProvidedTool)."""

    tool: c.ClientTool
    where: str
    ctx: RunContext

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return checked_arguments(self.tool, arguments)

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        answer = self.ctx.wait(WaitingFor("client_tool", request.node, tool=self.tool.name,
                                          arguments=request.arguments))
        return as_output(self.tool, answer.tool_result)


def as_output(tool: c.ClientTool, result: Any) -> dict[str, Any]:
    """The client's result as the tool's output: an object as it is; another value as the tool's one
    declared output (or `result` when it declares none or several)."""
    if isinstance(result, dict):
        return result
    titles = tool.output_titles()
    return {titles[0] if len(titles) == 1 else "result": result}


class ClientToolKind:
    def wants(self, flow: c.Flow) -> bool:
        return bool(client_tools(flow))

    def open(self, ctx: RunContext, flow: c.Flow) -> contextlib.AbstractAsyncContextManager[DocumentTools]:
        return self._open(ctx, flow)

    @contextlib.asynccontextmanager
    async def _open(self, ctx: RunContext, flow: c.Flow) -> AsyncIterator[DocumentTools]:
        found: dict[str, ClientCall] = {}
        for where, tool in client_tools(flow):
            found.setdefault(tool.name, ClientCall(tool, where, ctx))
        yield DocumentTools(tools=dict(found))


KIND = ClientToolKind()
