"""The protocols other agents and apps speak, each a face of the server's one run core.

Every surface's routes are mounted inside the one application (heddle.server.app), behind the same
Host/Origin guard, authentication and access log as /v1/runs, and every run they start is admitted,
limited, drained and counted as a run of /v1/runs is. `--serve` chooses which are mounted.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.routing import BaseRoute

    from heddle.server.service import Service

# The module serving each surface with routes of its own (ag-ui is an encoding of /v1/runs' stream);
# each has `routes(service) -> list[BaseRoute]`.
ROUTED: dict[str, str] = {
    "a2a": "heddle.server.surfaces.a2a",
    "mcp": "heddle.server.surfaces.mcp",
    "responses": "heddle.server.surfaces.responses",
}


def surface_routes(service: Service) -> list[BaseRoute]:
    """The routes of every surface this server serves, besides /v1/runs."""
    routes: list[BaseRoute] = []
    for surface, module in ROUTED.items():
        if surface in service.config.surfaces:
            routes += importlib.import_module(module).routes(service)
    return routes
