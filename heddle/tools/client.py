"""ClientTool: a tool the client runs, not heddle. The run would hand the call to the client and
wait for its result, which needs a session (a later heddle version).

Until then an agent is still offered its ClientTools (the model must see the tools the document
gives it), and a call to one ends the run with a `NeedsSessionError`, before anything runs for
it. A ClientTool as a ToolNode's tool is refused when the document is read
(heddle.spec.refusals): that node can only wait.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.errors import NeedsSessionError
from heddle.tools.provided import DocumentTools

if TYPE_CHECKING:
    from heddle.engine.context import RunContext
    from heddle.engine.seams import ToolRequest
    from heddle.spec import components as c


def client_tools(flow: c.Flow) -> list[tuple[str, c.ClientTool]]:
    from heddle.spec import components as c
    from heddle.spec.walk import of_type

    return list(of_type(flow, c.ClientTool))


@dataclass(frozen=True)
class ClientCall:
    """One ClientTool as a run meets it (heddle.engine.seams.ProvidedTool)."""

    tool: c.ClientTool
    where: str

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        from heddle.tools.schema import checked_arguments

        return checked_arguments(self.tool, arguments)

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        arguments = json.dumps(request.arguments, ensure_ascii=False)
        raise NeedsSessionError(
            f"ClientTool {self.tool.name!r} at {self.where}: the model called it with {arguments}, and a "
            "ClientTool is run by the client, so heddle would wait for its result; that needs a session, "
            "which a later heddle version adds")


class ClientToolKind:
    def wants(self, flow: c.Flow) -> bool:
        return bool(client_tools(flow))

    def open(self, ctx: RunContext, flow: c.Flow) -> contextlib.AbstractAsyncContextManager[DocumentTools]:
        return self._open(flow)

    @contextlib.asynccontextmanager
    async def _open(self, flow: c.Flow) -> AsyncIterator[DocumentTools]:
        found: dict[str, ClientCall] = {}
        for where, tool in client_tools(flow):
            found.setdefault(tool.name, ClientCall(tool, where))
        yield DocumentTools(tools=dict(found))


KIND = ClientToolKind()
