"""`heddle mcp BUNDLE`: a sealed bundle's agent as one MCP tool, over stdio, for desktop clients.

The bundle is verified exactly as `heddle run` verifies it (the same trust flags, before anything
runs); the tool is the one `heddle-server` serves at /mcp (heddle.server.surfaces.mcp), run by the
same admission and limits. stdout carries the protocol alone; everything else goes to stderr.
"""

from __future__ import annotations

import asyncio
from typing import Any

import typer

from heddle.cli.flags import BUNDLE_FLAGS, RESUMES_COLLECTOR, BundleFlags, takes
from heddle.settings import SETTINGS, RunSettings

_MCP_SETTINGS = (*(s.name for s in SETTINGS if s.cli and s.flag), *BUNDLE_FLAGS, "log_format", "log_level")


@takes(*_MCP_SETTINGS)
def mcp(
    target: str = typer.Argument(..., metavar="BUNDLE", show_default=False,
                                 help="A sealed bundle (a .heddle path, oci://REGISTRY/REPO:TAG, "
                                      "oci://REGISTRY/REPO@sha256:DIGEST or an https:// URL)."),
    *,
    settings: RunSettings,
    given: frozenset[str],
    bundle_flags: BundleFlags,
    log_format: str | None,
    log_level: str | None,
) -> None:
    """Serve a sealed bundle's agent as one MCP tool over stdio (for Claude Desktop, IDEs, other agents).

    The tool's input schema is the agent's StartNode inputs (and `message` for an agent); its result
    is the run's outputs. With --session-store, a conversation continues through the `session` the
    last result gave, and a run that waits for a person asks the client (an elicitation).

    \b
    Examples:
      heddle mcp app.heddle --trust me.pub
      heddle mcp oci://registry.example.com/agents/app:prod --trust me.pub --session-store sqlite

    \b
    Claude Desktop (claude_desktop_config.json):
      {"mcpServers": {"app": {"command": "heddle", "args": ["mcp", "/path/app.heddle", "--trust",
                                                            "/path/me.pub"]}}}
    """
    from heddle.cli.collector import resume_collector
    from heddle.cli.opening import open_verified
    from heddle.cli.output import use_log
    from heddle.cli.target import resolve_target
    from heddle.errors import UsageError
    from heddle.settings import LOG_FORMAT, LOG_LEVEL

    use_log(log_format or LOG_FORMAT.default, log_level or LOG_LEVEL.default)
    resolved = resolve_target(target, None, bundle_options=bundle_flags.options(), remote=bundle_flags.remote())
    if not resolved.is_bundle:
        raise UsageError(f"{target}: heddle mcp serves a sealed bundle, and this is a flow document; seal it first "
                         "(heddle bundle) and serve the .heddle file")
    resume_collector()
    bundle = open_verified(resolved.path, trust=bundle_flags.policy(), data_dir=bundle_flags.data_dir, fmt=None,
                           plugins=settings.plugins)
    if resolved.seen_key is not None:
        from heddle.oci.seen import remember

        remember(resolved.seen_key, bundle)
    from heddle.server.config import ServerConfig

    config = ServerConfig(bundle=str(resolved.path), trust=tuple(bundle_flags.trust),
                          allow_unsigned=bundle_flags.allow_unsigned, data_dir=bundle_flags.data_dir,
                          settings=settings, given=given, serve="mcp")
    asyncio.run(_serve(config, bundle))


setattr(mcp, RESUMES_COLLECTOR, True)  # the bundle is opened first, as `heddle run` opens one


async def _serve(config: Any, sealed: Any) -> None:
    from mcp.server.stdio import stdio_server

    from heddle.server.service import Service
    from heddle.server.surfaces.mcp import McpSurface

    service = Service(config, sealed=sealed)
    try:
        server = McpSurface(service).server
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())
    finally:
        await service.aclose()
