"""`heddle run`, `heddle validate`, `heddle bundle` and `heddle init`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

# Options shared by the commands that run or check a flow. Declared once so the commands agree.
_TOOLS_DIR = typer.Option(None, "--tools-dir", "-t", help="Folder of tool executables (name = file name without extension).",
                          file_okay=False)
_FORMAT = typer.Option(None, "--format", help="Force the flow's format: json or yaml (default: by extension).")
_INPUT = typer.Option(None, "--input", "-i", help="The run's input: a JSON object, @FILE, or - for stdin.")
_MOUNT = typer.Option([], "--mount", "-m", metavar="SRC[:DEST][:ro|:rw]",
                      help="Put a file or folder into every workspace (repeatable; ro is a private copy, rw copies changes back).")
_PLUGIN = typer.Option([], "--plugin", metavar="MANIFEST", help="A plugin's plugin.json (repeatable).")
_PLUGIN_CONFIG = typer.Option([], "--plugin-config", metavar="TYPE=JSON|@FILE",
                              help="Settings of a plugin component type, checked against its configSchema (repeatable).")
_PLUGIN_TIMEOUT = typer.Option(30.0, "--plugin-timeout", min=0.001,
                               help="Seconds a plugin call may stay silent before it is cancelled and the plugin killed.")
_MAX_NODE_ATTEMPTS = typer.Option(3, "--max-node-attempts", min=1,
                                  help="Times a node may run when a nodeError plugin asks to retry it.")
_INCLUDE_SECRET = typer.Option([], "--include-secret", metavar="PATH",
                               help="Seal this file (or the files under this folder) though it looks like a secret "
                               "(repeatable).")


def _node_types(plugins: list[Path]) -> frozenset[str]:
    """The node types the `--plugin` manifests add (read only: nothing starts, no settings needed)."""
    if not plugins:
        return frozenset()
    from heddle.plugin_host.carried import read_carried

    return read_carried(plugins).node_types


def _load_plugins(plugins: list[Path], configs: list[str], timeout: float, max_node_attempts: int, *,
                  require_settings: bool = True):
    """The plugins named on the command line, read and checked (nothing starts), or None."""
    if not plugins:
        if configs:
            from heddle.errors import UsageError

            raise UsageError("--plugin-config sets a plugin component's settings; load the plugin with --plugin MANIFEST")
        return None
    from heddle.plugin_host import PluginHost

    return PluginHost.load(plugins, config_specs=configs, timeout=timeout, max_node_attempts=max_node_attempts,
                           require_settings=require_settings)


def _read_input(value: str | None) -> dict:
    import json

    from heddle.errors import UsageError

    if value is None:
        return {}
    source = "--input"
    text = value
    if value == "-":
        text, source = sys.stdin.read(), "--input - (stdin)"
    elif value.startswith("@"):
        path = Path(value[1:])
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"--input {value}: cannot read {path}: {exc.strerror}") from None
        source = f"--input {value}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); "
                         "give a JSON object such as '{\"query\": \"hi\"}'") from None
    if not isinstance(data, dict):
        raise UsageError(f"{source} must be a JSON object, not {type(data).__name__}")
    return data


def _sandbox_flags(safe: bool, sandbox: str | None, allow_read: list[Path], allow_write: list[Path],
                   allow_env: list[str], deny_net: bool):
    from heddle.workspace.sandbox import SandboxPolicy

    # The policy shows every safe-only flag but an explicit `--sandbox auto`; check_policy
    # refuses them all without --safe.
    given = ("--sandbox",) if sandbox is not None else ()
    policy = SandboxPolicy(safe=safe, backend=sandbox or "auto", allow_read=tuple(allow_read),
                           allow_write=tuple(allow_write), allow_env=tuple(allow_env), deny_net=deny_net)
    return policy, given


_FLOW = typer.Option(None, "--flow", metavar="PATH", dir_okay=False,
                     help="Read PATH as a flow document whatever its name (instead of the FLOW|BUNDLE argument).")


def _bundle_options(trust: list[Path], allow_unsigned: bool, data_dir: Path | None = None) -> list[str]:
    """The options given that only a bundle takes: with any of them the path must be a bundle."""
    return [name for name, given in (("--trust", trust), ("--allow-unsigned", allow_unsigned),
                                     ("--data-dir", data_dir is not None)) if given]


def run(
    target: Optional[Path] = typer.Argument(None, metavar="FLOW|BUNDLE", show_default=False,
                                            help="A sealed .heddle bundle, or a flow document (.json, .yaml, .yml)."),
    flow_file: Optional[Path] = _FLOW,
    tools_dir: Optional[Path] = _TOOLS_DIR,
    input: Optional[str] = _INPUT,
    format: Optional[str] = _FORMAT,
    stream: bool = typer.Option(True, "--stream/--no-stream", help="Ask the model to stream its answers (default) or not."),
    max_tool_rounds: Optional[str] = typer.Option(None, "--max-tool-rounds", metavar="N|unlimited",
                                                  help="Model calls an agent may make per execution [default: 10]."),
    max_iterations: int = typer.Option(50, "--max-iterations", min=1, help="Node executions per run."),
    timeout: float = typer.Option(300.0, "--timeout", min=0.001, help="Seconds the whole run may take."),
    tool_timeout: float = typer.Option(30.0, "--tool-timeout", min=0.001, help="Seconds one tool call may take."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show nodes and tool calls on stderr."),
    protocol: Optional[str] = typer.Option(None, "--protocol", help="Print events on stdout instead of the final state: heddle (JSON lines), or an encoder plugin's protocol."),
    mount: list[str] = _MOUNT,
    workspace: Optional[Path] = typer.Option(None, "--workspace", help="Keep each node's workspace at DIR/<node-name> instead of removing it."),
    no_mount_tools: bool = typer.Option(False, "--no-mount-tools", help="Leave .heddle/bin empty in workspaces."),
    mount_max_entries: int = typer.Option(4096, "--mount-max-entries", min=1, help="Most files and folders one mount may hold."),
    mount_max_bytes: int = typer.Option(64 * 2**20, "--mount-max-bytes", min=1, help="Most bytes one mount may hold."),
    safe: bool = typer.Option(False, "--safe", help="Run each tool call in a bubblewrap sandbox."),
    sandbox: Optional[str] = typer.Option(None, "--sandbox", help="Sandbox backend under --safe: auto or bubblewrap."),
    allow_read: list[Path] = typer.Option([], "--allow-read", help="Under --safe, also let tools read PATH (repeatable)."),
    allow_write: list[Path] = typer.Option([], "--allow-write", help="Under --safe, also let tools write PATH (repeatable)."),
    allow_env: list[str] = typer.Option([], "--allow-env", help="Under --safe, pass environment variable NAME to tools (repeatable)."),
    deny_net: bool = typer.Option(False, "--deny-net", help="Under --safe, give tools no network."),
    trust: list[Path] = typer.Option([], "--trust", help="With a bundle: a public key (.pub) trusted for this command (repeatable)."),
    allow_unsigned: bool = typer.Option(False, "--allow-unsigned", help="With a bundle: admit a bundle that carries no signature at all."),
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="With a bundle: where rw mounts are seeded (default: a temporary folder)."),
    plugin: list[Path] = _PLUGIN,
    plugin_config: list[str] = _PLUGIN_CONFIG,
    plugin_timeout: float = _PLUGIN_TIMEOUT,
    max_node_attempts: int = _MAX_NODE_ATTEMPTS,
) -> None:
    """Run a flow (or a sealed bundle) and print its final state as one JSON object.

    \b
    Examples:
      heddle run flow.yaml --tools-dir tools --input '{"query": "hi"}'
      heddle run app.heddle --trust me.pub --input @input.json
      heddle run flow.yaml -t tools --safe --deny-net --mount ./skills
      heddle run --flow agent.txt --format yaml -t tools

    A path ending in .heddle, or given with --trust, --allow-unsigned or --data-dir, runs only
    as a verified bundle; a flow is read from .json, .yaml or .yml, or from any file with --flow.
    """
    import asyncio
    import json

    from heddle.cli.output import EventPrinter
    from heddle.engine import RunOptions, prepare_run, run_prepared
    from heddle.engine.options import resolve_max_tool_rounds
    from heddle.errors import UsageError
    from heddle.workspace.mounts import parse_mount
    from heddle.workspace.workspace import WorkspaceOptions

    policy, given = _sandbox_flags(safe, sandbox, allow_read, allow_write, allow_env, deny_net)
    inputs = _read_input(input)
    mounts = [parse_mount(m) for m in mount]
    rounds = resolve_max_tool_rounds(max_tool_rounds)

    from heddle.cli.target import resolve_target

    resolved = resolve_target(target, flow_file, bundle_options=_bundle_options(trust, allow_unsigned, data_dir))
    target = resolved.path
    if resolved.is_bundle:
        from heddle.cli.sealed import load_sealed

        if tools_dir is not None:
            raise UsageError(f"--tools-dir cannot be used with the bundle {target}: a sealed bundle runs only its own tools")
        sealed = load_sealed(target, trust=trust, allow_unsigned=allow_unsigned, data_dir=data_dir,
                             fmt=format, verbose=verbose, node_types=_node_types(plugin))
        # The bundle's own plugins run from the verified cache, before any given here.
        host = _load_plugins([*getattr(sealed, "plugins", ()), *plugin], plugin_config, plugin_timeout,
                             max_node_attempts)
        flow, tools, tools_root = sealed.flow, sealed.tools, sealed.tools_dir
        mounts = [*sealed.mounts, *mounts]
        if input is None:
            inputs = dict(sealed.input)
        rounds = resolve_max_tool_rounds(max_tool_rounds, sealed.max_tool_rounds)
    else:
        from heddle.spec import load_flow
        from heddle.tools.registry import discover_tools

        host = _load_plugins(plugin, plugin_config, plugin_timeout, max_node_attempts)
        flow = load_flow(target, fmt=format, node_types=host.node_types() if host else ())
        tools = discover_tools(tools_dir)
        tools_root = tools_dir.absolute() if tools_dir else None
    if protocol not in (None, "heddle"):
        from heddle.plugin_host.encoder import encoder_for

        encoder_for(host, protocol)

    options = RunOptions(
        max_iterations=max_iterations, max_tool_rounds=rounds, timeout=timeout, tool_timeout=tool_timeout,
        stream=stream,
        workspace=WorkspaceOptions(mounts=tuple(mounts), keep_root=workspace, mount_tools=not no_mount_tools,
                                   max_entries=mount_max_entries, max_bytes=mount_max_bytes),
        sandbox=policy,
    )
    prepared = prepare_run(flow, tools=tools, tools_dir=tools_root, options=options, sandbox_flags=given,
                           plugins=host)
    printer = EventPrinter(verbose=verbose, protocol=protocol if protocol == "heddle" else None)
    if host is None:
        state = asyncio.run(run_prepared(prepared, inputs, on_event=printer))
    else:
        from heddle.plugin_host.runner import run_with_plugins

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        encoder = protocol if protocol not in (None, "heddle") else None
        state = asyncio.run(run_with_plugins(prepared, inputs, host=host, on_event=printer, protocol=encoder,
                                             write=write))
    if protocol is None:
        sys.stdout.write(json.dumps(state, ensure_ascii=False) + "\n")


def validate(
    target: Optional[Path] = typer.Argument(None, metavar="FLOW|BUNDLE", show_default=False,
                                            help="A sealed .heddle bundle, or a flow document (.json, .yaml, .yml)."),
    flow_file: Optional[Path] = _FLOW,
    tools_dir: Optional[Path] = _TOOLS_DIR,
    format: Optional[str] = _FORMAT,
    trust: list[Path] = typer.Option([], "--trust", help="With a bundle: a public key trusted for this command."),
    allow_unsigned: bool = typer.Option(False, "--allow-unsigned", help="With a bundle: admit an unsigned bundle."),
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    plugin: list[Path] = _PLUGIN,
    plugin_config: list[str] = _PLUGIN_CONFIG,
    plugin_timeout: float = _PLUGIN_TIMEOUT,
    max_node_attempts: int = _MAX_NODE_ATTEMPTS,
) -> None:
    """Check a flow without running it: parse, graph, tools and their input-schema fingerprints.

    Exits 0 only when the flow is valid (2 otherwise), printing every problem at once.
    """
    import json

    from heddle.cli.report import validation_report
    from heddle.cli.target import resolve_target
    from heddle.errors import GraphError, UsageError

    resolved = resolve_target(target, flow_file, bundle_options=_bundle_options(trust, allow_unsigned))
    target = resolved.path
    if resolved.is_bundle:
        from heddle.cli.sealed import load_sealed

        if tools_dir is not None:
            raise UsageError(f"--tools-dir cannot be used with the bundle {target}: a sealed bundle runs only its own tools")
        sealed = load_sealed(target, trust=trust, allow_unsigned=allow_unsigned, data_dir=None, fmt=format,
                             verbose=False, seed_data=False, node_types=_node_types(plugin))
        host = _load_plugins([*getattr(sealed, "plugins", ()), *plugin], plugin_config, plugin_timeout,
                             max_node_attempts)
        flow, tools, source = sealed.flow, sealed.tools, f"{target} (sealed {sealed.digest})"
    else:
        from heddle.spec import load_flow
        from heddle.tools.registry import discover_tools

        host = _load_plugins(plugin, plugin_config, plugin_timeout, max_node_attempts)
        flow = load_flow(target, fmt=format, node_types=host.node_types() if host else ())
        tools = discover_tools(tools_dir) if tools_dir is not None else None
        source = str(target)
    if host is not None:
        if tools is not None or host.tools:
            tools = host.known_tools(tools or {})
        report = validation_report(flow, tools=tools, source=source, tools_dir=tools_dir)
        report["problems"] += host.check_flow(flow)
        report["valid"] = not report["problems"]
        report["plugins"] = host.describe()
    else:
        report = validation_report(flow, tools=tools, source=source, tools_dir=tools_dir)
    if json_out:
        sys.stdout.write(json.dumps(report, ensure_ascii=False, indent=2) + "\n")
    else:
        from heddle.cli.report import print_validation

        print_validation(report)
        for row in report.get("plugins", []):
            kinds = ", ".join(f"{c['componentType']} ({c['kind']})" for c in row["components"]) or "no components"
            sys.stdout.write(f"plugin    {row['name']} {row['version']}: {kinds}; {len(row['tools'])} tool(s)\n")
    if report["problems"]:
        raise GraphError(report["problems"])


def bundle(
    flow_path: Optional[Path] = typer.Argument(None, metavar="FLOW", show_default=False,
                                               help="The flow document to seal (.json, .yaml, .yml)."),
    flow_file: Optional[Path] = _FLOW,
    tools_dir: Optional[Path] = _TOOLS_DIR,
    mount: list[str] = _MOUNT,
    plugin: list[Path] = _PLUGIN,
    plugin_config: list[str] = _PLUGIN_CONFIG,
    plugin_timeout: float = _PLUGIN_TIMEOUT,
    max_node_attempts: int = _MAX_NODE_ATTEMPTS,
    input: Optional[str] = typer.Option(None, "--input", "-i", help="The default input recorded in the bundle (JSON, @FILE or -)."),
    requires: Optional[str] = typer.Option(None, "--requires", help='What the bundle needs on the host: JSON or @FILE, e.g. {"bins": ["git"], "env": ["OPENAI_API_KEY"]}.'),
    max_tool_rounds: Optional[str] = typer.Option(None, "--max-tool-rounds", metavar="N|unlimited", help="Proposed tool-round limit recorded in the bundle."),
    sign_key: Optional[Path] = typer.Option(None, "--sign-key", help="Private key (from heddle keygen) to sign with."),
    name: Optional[str] = typer.Option(None, "--name", help="Bundle name (default: the flow's name)."),
    format: Optional[str] = _FORMAT,
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Where to write the bundle (default: <name>.heddle)."),
    mount_max_entries: int = typer.Option(4096, "--mount-max-entries", min=1, help="Most files and folders one mount may hold."),
    mount_max_bytes: int = typer.Option(64 * 2**20, "--mount-max-bytes", min=1, help="Most bytes one mount may hold."),
    include_secret: list[Path] = _INCLUDE_SECRET,
) -> None:
    """Seal a flow, its tools, mounts and plugins into one signed .heddle file.

    Everything is checked first (the flow validates, every tool it names is carried, mounts pass the
    mount rules, no links or devices, plugin commands run only what their folder holds). Files that look
    like secrets (private keys by name or content, .env files, credentials files, anything under .ssh/,
    .aws/, .gnupg/) are refused unless --include-secret names them, and so is a model api_key written in
    the flow (write api_key: "$VAR"); .git folders are left out and listed.
    The file is written atomically: on any failure nothing is left at the output path.

    \b
    Example:
      heddle keygen --out me
      heddle bundle flow.yaml --tools-dir tools --mount ./skills --sign-key me.key -o app.heddle
    """
    from heddle.cli.sealed import seal
    from heddle.cli.target import resolve_flow

    flow = resolve_flow(flow_path, flow_file)
    # Manifests, and the settings given, are checked before anything is packed; settings are
    # not sealed: the operator gives them where the bundle runs.
    _load_plugins(plugin, plugin_config, plugin_timeout, max_node_attempts, require_settings=False)
    seal(flow, tools_dir=tools_dir, mounts=mount, plugins=plugin, input_text=input, requires=requires,
         max_tool_rounds=max_tool_rounds, sign_key=sign_key, name=name, fmt=format, output=output,
         max_entries=mount_max_entries, max_bytes=mount_max_bytes, read_input=_read_input,
         include_secrets=include_secret)


def init(
    directory: Path = typer.Argument(..., metavar="DIR", help="Folder to create the starter in (must be empty or new)."),
    port: int = typer.Option(0, "--port", min=0, max=65535, show_default=False, metavar="PORT",
                             help="Port of the scripted model the flow calls; default: a free port picked now."),
) -> None:
    """Write a starter agent that runs as printed.

    A flow, one tool and a model script, and the exact commands that run them.
    """
    from heddle.starter import write_starter

    for line in write_starter(directory, port):
        typer.echo(line)
