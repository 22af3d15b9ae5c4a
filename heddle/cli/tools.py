"""`heddle tools`: every tool a run would have, as heddle.tools.catalog lists them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from heddle.cli.flags import COMPONENTS, FLOW, FORMAT, takes
from heddle.cli.output import QUIET, VERBOSE, json_option
from heddle.cli.output import use as use_output
from heddle.settings import RunSettings

_SETTINGS = ("tools_dir", "commands", "trust", "allow_unsigned", "plugins", "plugin_configs", "plugin_timeout",
             "discover_tools", "safe", "sandbox", "allow_read", "allow_write", "allow_env", "deny_net", "plain_http",
             "offline")


@takes(*_SETTINGS, help={"safe": "Start the plugins asked which tools they serve (--discover-tools) in a "
                                  "bubblewrap sandbox, as a run would."})
def tools(
    target: str | None = typer.Argument(None, metavar="FLOW|BUNDLE", show_default=False,
                                           help="A flow document (its own tools and the schemas it declares are "
                                                "listed too) or a sealed bundle (a .heddle path or a reference: "
                                                "oci://REGISTRY/REPO:TAG, an https:// URL); leave it out to list "
                                                "the tools folder's, the plugins' and the commands' tools."),
    flow_file: Path | None = FLOW,
    format: str | None = FORMAT,
    components: Path | None = COMPONENTS,
    json_out: bool = json_option("Print the tools as JSON: {\"tools\": [...], \"toolboxes\": [...]}."),
    verbose: bool = VERBOSE,
    quiet: bool = QUIET,
    *,
    settings: RunSettings,
    given: frozenset[str],
    tools_dir: Path | None,
    commands: Path | None,
    trust: list[Path],
    allow_unsigned: bool,
    plain_http: bool,
    offline: bool,
) -> None:
    """List every tool a run would have: its name, where it comes from, its description, its input
    schema and that schema's fingerprint.

    \b
    Examples:
      heddle tools --tools-dir tools
      heddle tools flow.yaml -t tools --plugin plugin/plugin.json --json
      heddle tools --plugin plugin/plugin.json --discover-tools
      heddle tools app.heddle --trust me.pub
    """
    use_output(quiet=quiet, verbose=verbose)
    import asyncio

    from heddle.cli.flags import bundle_options
    from heddle.core import load_plugins
    from heddle.errors import UsageError
    from heddle.runs import discover
    from heddle.tools.catalog import listed

    if target is None and flow_file is None:
        if trust or allow_unsigned or plain_http or offline:
            raise UsageError("--trust, --allow-unsigned, --plain-http and --offline apply to a bundle: give its path "
                             "or reference")
        from heddle.tools.commands import load_commands
        from heddle.tools.registry import discover_tools

        described = load_commands(commands) if commands is not None else []
        host = load_plugins(settings)
        found = asyncio.run(listed(tools=discover_tools(tools_dir), flow=None, host=host,
                                   discover=lambda: discover(host, settings), commands=described))
    else:
        from heddle.cli.target import Remote, resolve_target
        from heddle.runs import from_bundle, from_document

        resolved = resolve_target(target, flow_file, bundle_options=bundle_options(trust, allow_unsigned),
                                  remote=Remote(plain_http, offline))
        if resolved.is_bundle:
            from heddle.cli.opening import open_verified, refuse_others
            from heddle.format.trust import TrustPolicy

            refuse_others(resolved.path, tools_dir=tools_dir, components=components, commands=commands)
            policy = TrustPolicy.from_names(trust, allow_unsigned=allow_unsigned)
            sealed = open_verified(resolved.path, trust=policy, data_dir=None, fmt=format, seed_data=False,
                                   plugins=settings.plugins)
            loaded = from_bundle(sealed, settings, given=given)
        else:
            loaded = from_document(resolved.path, settings, tools_dir=tools_dir, fmt=format, components=components,
                                   commands=commands)
        core = loaded.core
        found = asyncio.run(listed(tools=core.tools, flow=loaded.flow, host=core.host,
                                   discover=lambda: discover(core.host, core.settings), commands=core.commands or ()))
    if json_out:
        from heddle.cli.output import print_json

        print_json(found.as_json())
        return
    _print(found)


def _print(found: Any) -> None:
    from heddle.textsafe import printable

    rows = [(t.name, _source(t), t.input_schema_fingerprint or "-", t.description) for t in found.tools]
    if not rows and not found.toolboxes:
        sys.stdout.write("no tools\n")
        return
    widths = [max((len(r[i]) for r in rows), default=0) for i in range(3)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        # A description is a document's or a plugin's own text.
        sys.stdout.write(printable("  ".join([*cells, row[3]])).rstrip() + "\n")
    for name in found.toolboxes:
        sys.stdout.write(f"toolbox {name} (mcp): its tools are listed by its server once a run starts it\n")


def _source(tool: Any) -> str:
    if tool.plugin is None:
        return str(tool.source)
    return f"plugin:{tool.plugin}" + (" (listed by its process)" if tool.discovered else "")
