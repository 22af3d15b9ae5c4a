"""`heddle run`, `heddle validate`, `heddle bundle` and `heddle init`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import typer

from heddle.cli.collector import resume_collector
from heddle.cli.flags import BUNDLE_FLAGS, RESUMES_COLLECTOR, BundleFlags, bundle_options, takes
from heddle.cli.flags import COMPONENTS as _COMPONENTS
from heddle.cli.flags import FLOW as _FLOW
from heddle.cli.flags import FORMAT as _FORMAT
from heddle.cli.output import QUIET, VERBOSE, json_option
from heddle.cli.output import use as use_output  # by name: `bundle` has an `output` parameter
from heddle.settings import SETTINGS, RunSettings
from heddle.textsafe import printable_json

# The options that are run settings (limits, mounts, sandbox, plugins, bundles) are generated from
# heddle.settings by @takes; these few belong to the commands themselves.
_INPUT = typer.Option(None, "--input", "-i", metavar="JSON|@FILE|-",
                      help="The run's input: a JSON object, @FILE, or - for stdin.")
_INCLUDE_SECRET = typer.Option([], "--include-secret", metavar="PATH",
                               help="Seal this file (or the files under this folder) though it looks like a secret "
                               "(repeatable).")


def _read_input(value: str | None) -> dict[str, Any]:
    from heddle.errors import UsageError
    from heddle.safeparse import json_problem, loads_strict_json

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
        except UnicodeDecodeError:
            raise UsageError(f"--input {value}: {path} is not UTF-8 text") from None
        source = f"--input {value}"
    try:
        # As the server reads a request's inputs: no duplicate keys, no NaN, no lone surrogate.
        data = loads_strict_json(text)
    except ValueError as exc:
        raise UsageError(f"{source} is not valid JSON ({json_problem(exc)}); "
                         "give a JSON object such as '{\"query\": \"hi\"}'") from None
    if not isinstance(data, dict):
        raise UsageError(f"{source} must be a JSON object, not {type(data).__name__}")
    return data




def _spelled(mount: Any) -> str:
    """A mount as `SRC[:DEST][:ro|:rw]`, as the sealer reads it."""
    return mount if isinstance(mount, str) else str(mount.describe())


# `heddle run` takes every run setting the command line sets, and how to find and trust a bundle.
_RUN_SETTINGS = ("tools_dir", "commands", *(s.name for s in SETTINGS if s.cli and s.flag), *BUNDLE_FLAGS,
                 "log_format", "log_level")
_TARGET_HELP = ("A sealed bundle (a .heddle path, oci://REGISTRY/REPO:TAG, oci://REGISTRY/REPO@sha256:DIGEST or an "
                "https:// URL), or a flow document (.json, .yaml, .yml).")


@takes(*_RUN_SETTINGS)
def run(
    target: str | None = typer.Argument(None, metavar="FLOW|BUNDLE", show_default=False, help=_TARGET_HELP),
    flow_file: Path | None = _FLOW,
    input: str | None = _INPUT,
    format: str | None = _FORMAT,
    protocol: str | None = typer.Option(None, "--protocol", metavar="NAME",
                                           help="Print events on stdout instead of the final state: heddle (JSON "
                                                "lines), or an encoder plugin's protocol."),
    message: str | None = typer.Option(None, "--message", metavar="TEXT",
                                          help="The user's message to an agent document's agent (asked for on a "
                                               "terminal when left out)."),
    outputs: bool = typer.Option(False, "--outputs",
                                 help="Print the document's outputs alone instead of the final state (for an agent "
                                      "document: result, its answer, and its declared outputs), with the "
                                      "messages the run showed under \"messages\"."),
    components: Path | None = _COMPONENTS,
    session: str | None = typer.Option(None, "--session", metavar="NAME", rich_help_panel="Sessions",
                                          help="Run in the session NAME: a new name starts one, a known one "
                                               "continues its conversation or resumes its waiting run."),
    approve: bool = typer.Option(False, "--approve", rich_help_panel="Sessions",
                                 help="Resume the session's run, which waits for an approval: run the tool."),
    deny: str | None = typer.Option(None, "--deny", metavar="REASON", rich_help_panel="Sessions",
                                       help="Resume the session's run, which waits for an approval: do not run "
                                            "the tool, and tell the model REASON."),
    tool_result: str | None = typer.Option(None, "--tool-result", metavar="JSON", rich_help_panel="Sessions",
                                              help="Resume the session's run, which waits for a ClientTool: JSON "
                                                   "is the tool's result (any JSON value)."),
    resume: bool = typer.Option(False, "--resume", rich_help_panel="Sessions",
                                help="Continue the session's --durable run that was stopped, after the last node "
                                     "it finished."),
    no_input: bool = typer.Option(False, "--no-input", rich_help_panel="Sessions",
                                  help="Never ask on the terminal: a run that waits prints its waiting object and "
                                       "exits 10, and a missing --message is an error."),
    verbose: bool = VERBOSE,
    quiet: bool = QUIET,
    *,
    settings: RunSettings,
    given: frozenset[str],
    tools_dir: Path | None,
    commands: Path | None,
    bundle_flags: BundleFlags,
    log_format: str | None,
    log_level: str | None,
) -> None:
    """Run a flow, an agent or a node (or a sealed bundle) and print its final state as one JSON object.

    \b
    Examples:
      heddle run flow.yaml --tools-dir tools --input '{"query": "hi"}'
      heddle run agent.yaml -t tools --input '{"user": "Ann"}' --message "hello" --outputs
      heddle run app.heddle --trust me.pub --input @input.json
      heddle run oci://registry.example.com/agents/app:prod --trust me.pub
      heddle run flow.yaml -t tools --safe --deny-net --mount ./skills
      heddle run main.json --components shared.json --model-url gpt=http://127.0.0.1:8000/v1
      heddle run --flow agent.txt --format yaml -t tools
      heddle run review.yaml -t tools --session s1 --no-input     (exits 10 when it waits)
      heddle run review.yaml -t tools --session s1 --approve      (resumes it)

    A path ending in .heddle, or given with --trust, --allow-unsigned or --data-dir, runs only
    as a verified bundle; a flow is read from .json, .yaml or .yml, or from any file with --flow.
    A reference is pulled into the cache, then verified exactly as a local bundle.

    A document that may wait for a person (an InputMessageNode, a tool with requires_confirmation,
    a ClientTool, a human_in_the_loop agent in a flow) runs only in a session. When its run waits,
    a terminal is asked for the answer and the run goes on; elsewhere (or with --no-input) it
    prints {"status": "waiting", "session": NAME, "waiting_for": WHAT, "messages": SHOWN} and
    exits 10, and the next run with --session NAME and --message, --approve, --deny or --tool-result
    resumes it exactly there.

    \b
    Exit status: 0 done; 1 the run failed; 2 a usage error, an invalid document or a session
    that cannot be used as asked; 10 the run waits for a person (in a session); bundle
    verification failures have their own (bundle-format/SPEC.md).
    """
    use_output(quiet=quiet, verbose=verbose)
    from heddle.cli.output import use_log
    from heddle.settings import LOG_FORMAT, LOG_LEVEL

    use_log(log_format or LOG_FORMAT.default, log_level or LOG_LEVEL.default)
    from heddle.cli.target import resolve_target
    from heddle.errors import UsageError
    from heddle.runs import from_bundle, from_document

    if outputs and protocol is not None:
        raise UsageError("--outputs prints the outputs instead of the final state, and --protocol prints events "
                         "instead of either: give one of them")
    from heddle.cli.answers import answer_from_flags, refuse_without_session

    answer = answer_from_flags(approve=approve, deny=deny, tool_result=tool_result)
    if session is None:
        refuse_without_session(given, {"--approve": approve, "--deny": deny is not None,
                                       "--tool-result": tool_result is not None, "--resume": resume})
    else:
        from heddle.sessions.open import check_session_id

        check_session_id(session)
        if resume and answer is not None:
            raise UsageError("--resume continues a --durable run that was stopped, which waits for no answer; "
                             "drop --resume to answer the run that waits")
        if answer is not None and message is not None:
            raise UsageError("--message and an answer flag: give one answer to what the session waits for")
    inputs = _read_input(input) if input is not None else None
    if target is not None and "://" in target:
        resume_collector()  # a reference is pulled (downloaded into the cache) with the collector on
    resolved = resolve_target(target, flow_file, bundle_options=bundle_flags.options(), remote=bundle_flags.remote())
    path = resolved.path
    if resolved.is_bundle:
        # A bundle's payload is read, checked and written with the collector on, as any command's.
        resume_collector()
        from heddle.cli.opening import open_verified, refuse_others

        refuse_others(resolved.name, tools_dir=tools_dir, components=components, commands=commands)
        sealed = open_verified(path, trust=bundle_flags.policy(), data_dir=bundle_flags.data_dir, fmt=format,
                               plugins=settings.plugins)
        if resolved.seen_key is not None:
            from heddle.oci.seen import remember

            remember(resolved.seen_key, sealed)
        loaded = from_bundle(sealed, settings, given=given, inputs=inputs)
    else:
        loaded = from_document(path, settings, tools_dir=tools_dir, fmt=format, components=components,
                               inputs=inputs, commands=commands)
    if protocol not in (None, "heddle"):
        from heddle.plugin_host.encoder import encoder_for

        encoder_for(loaded.core.host, protocol)
    if session is None:
        message = _message(loaded.flow, message, resolved.name, ask=not no_input)
        _show_model_urls(loaded)
        _run_once(loaded, message=message, outputs=outputs, protocol=protocol, verbose=verbose)
        return
    import asyncio

    from heddle.cli.sessions import open_cli_store, pending_run

    # Before anything runs: a store that cannot be reached is one line naming it.
    store = open_cli_store(settings, plugins=loaded.core.host)
    try:
        pending = asyncio.run(pending_run(store, session))
        # A resumed run goes on with the message it started with (and --message may be the answer it
        # waits for); only a new run, or the next turn of a conversation, needs one of its own.
        if pending is None:
            message = _message(loaded.flow, message, resolved.name, ask=not no_input)
        elif pending.status == "waiting" and answer is None and message is None and pending.waiting_for \
                and not resume:
            from heddle.cli.waiting import ask, on_terminal

            if on_terminal(no_input):
                answer = ask(pending.waiting_for)
        _show_model_urls(loaded)
        _run_in_session(loaded, store, session, message=message, answer=answer, resume=resume,
                        inputs_given=input is not None, outputs=outputs,
                        protocol=protocol, verbose=verbose, quiet=quiet, no_input=no_input)
    finally:
        asyncio.run(store.close())


# Its document is read with the collector still paused; it comes back on as the flow starts.
setattr(run, RESUMES_COLLECTOR, True)


def _printer(protocol: str | None, verbose: bool) -> tuple[Any, Any]:
    """What shows the run's events (on stderr, or on stdout with --protocol heddle) and, for an
    encoder plugin's protocol, the rendering that writes its output."""
    from heddle.cli.output import EventPrinter

    printer = EventPrinter(verbose=verbose, protocol=protocol if protocol == "heddle" else None)
    rendering = None
    if protocol not in (None, "heddle"):
        from heddle.engine.seams import Rendering

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        rendering = Rendering(protocol, write)
    return printer, rendering


def _print_result(outcome: Any, *, outputs: bool, protocol: str | None, messages: tuple[str, ...]) -> None:
    import json

    if protocol is None:
        from heddle.agentspec.messages import with_messages

        printed = with_messages(outcome.outputs, messages) if outputs else outcome.state
        sys.stdout.write(printable_json(json.dumps(printed, ensure_ascii=False)) + "\n")


def _run_once(loaded: Any, *, message: str | None, outputs: bool, protocol: str | None, verbose: bool) -> None:
    import asyncio

    from heddle.runs import execute

    printer, rendering = _printer(protocol, verbose)
    resume_collector()
    # The policy shows every safe-only flag but an explicit `--sandbox auto`; check_policy (in
    # prepare_run) refuses them all without --safe.
    outcome = asyncio.run(execute(loaded, message=message, on_event=printer, rendering=rendering))
    _print_result(outcome, outputs=outputs, protocol=protocol, messages=outcome.messages)


def _run_in_session(loaded: Any, store: Any, session: str, *, message: str | None, answer: Any, resume: bool,
                    inputs_given: bool, outputs: bool, protocol: str | None, verbose: bool,
                    quiet: bool, no_input: bool) -> None:
    """One turn of the session; on a terminal, each wait is answered here and the run goes on until
    it ends. Elsewhere a wait prints the waiting object and exits WAITING_EXIT."""
    import asyncio
    import json

    from heddle.cli.errors import WAITING_EXIT
    from heddle.cli.waiting import ask, on_terminal, waiting_object
    from heddle.runs import execute

    printer, rendering = _printer(protocol, verbose)
    resume_collector()
    core = loaded.core
    core.sessions = store
    use = core.session(session, answer=answer, resume=resume)
    shown: list[str] = []  # what the run showed over the steps answered here: one run for the person
    while True:
        outcome = asyncio.run(execute(loaded, message=message, on_event=printer, rendering=rendering, session=use,
                                      inputs_given=inputs_given))
        shown += outcome.messages
        if outcome.waiting is None:
            _print_result(outcome, outputs=outputs, protocol=protocol, messages=tuple(shown))
            return
        if not on_terminal(no_input):
            if protocol is None:  # else the event stream on stdout ended with its `waiting` event
                sys.stdout.write(printable_json(json.dumps(waiting_object(session, outcome.waiting, outcome.messages),
                                                           ensure_ascii=False)) + "\n")
                sys.stdout.flush()
            raise typer.Exit(WAITING_EXIT)
        # -q kept the run's messages off stderr; the person answering must see them all the same.
        answer = ask(outcome.waiting, outcome.messages if quiet else ())
        use = core.session(session, answer=answer)
        # The run resumes with the message and the input it started with.
        message, inputs_given = None, False


def _message(flow: Any, message: str | None, source: str, *, ask: bool = True) -> str | None:
    """The user's message for an agent document: --message, else asked for on a terminal (unless
    --no-input)."""
    from heddle.agentspec.roots import check_message, document_root

    if message is None and ask and document_root(flow).conversational and sys.stdin.isatty():
        from heddle.cli.waiting import read_line

        message = read_line("Message: ")  # on stderr: stdout carries the result alone
    check_message(flow, message, source=source)
    return message


def _show_model_urls(loaded: Any) -> None:
    """With --verbose: each llm config --model-url redirects (an unknown NAME is refused here)."""
    if not loaded.core.settings.model_urls:
        return
    from heddle.cli.output import detail
    from heddle.graph import llm_configs
    from heddle.model.endpoints import describe_overrides, parse_model_urls

    for line in describe_overrides(list(llm_configs(loaded.flow)), parse_model_urls(loaded.core.settings.model_urls)):
        detail(f"model url {line}")


@takes("tools_dir", "commands", "trust", "allow_unsigned", "plugins", "plugin_configs", "plugin_timeout",
       "max_node_attempts", "discover_tools", "plain_http", "offline", "strict")
def validate(
    target: str | None = typer.Argument(None, metavar="FLOW|BUNDLE", show_default=False, help=_TARGET_HELP),
    flow_file: Path | None = _FLOW,
    format: str | None = _FORMAT,
    components: Path | None = _COMPONENTS,
    json_out: bool = typer.Option(False, "--json", help="Print the report as JSON."),
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
    """Check a flow without running it: parse, graph, tools and their input-schema fingerprints.

    Exits 0 only when the flow is valid (2 otherwise), printing every problem at once.
    """
    use_output(quiet=quiet, verbose=verbose)
    from heddle.cli.target import Remote, resolve_target
    from heddle.core import load_plugins
    from heddle.errors import GraphError
    from heddle.settings import settle
    from heddle.validation import validation_report

    resolved = resolve_target(target, flow_file, bundle_options=bundle_options(trust, allow_unsigned),
                              remote=Remote(plain_http, offline))
    path = resolved.path
    if resolved.is_bundle:
        from heddle.cli.opening import open_verified, refuse_others
        from heddle.format.trust import TrustPolicy

        refuse_others(resolved.name, tools_dir=tools_dir, components=components, commands=commands)
        policy = TrustPolicy.from_names(trust, allow_unsigned=allow_unsigned)
        sealed = open_verified(path, trust=policy, data_dir=None, fmt=format, seed_data=False,
                               plugins=settings.plugins)
        host = load_plugins(settle(settings, given=given, plugins=sealed.plugins))
        tools: dict[str, Path] | None = dict(sealed.tools)
        flow, source = sealed.flow, f"{resolved.name} (sealed {sealed.digest})"
        if settings.strict:
            from heddle.agentspec.document import check_strict

            check_strict(flow)
        declared = sealed.commands
    else:
        from heddle.agentspec import load_flow
        from heddle.tools.commands import read_commands
        from heddle.tools.registry import discover_tools

        declared = read_commands(commands) if commands is not None else None
        host = load_plugins(settings)
        flow = load_flow(path, fmt=format, node_types=host.node_types() if host else (), components=components,
                         strict=settings.strict)
        tools = discover_tools(tools_dir) if tools_dir is not None else None
        source = str(path)
    from heddle.agentspec.roots import document_root
    from heddle.cli.output import warn
    from heddle.runs import discover_apart

    discover_apart(host, settings)  # --discover-tools: the tools the plugins list join theirs
    for warning in (*document_root(flow).warnings, *(declared.warnings if declared is not None else ())):
        warn(warning)
    from heddle.tools.command_run import with_commands

    plugins = with_commands(host, declared, flow)
    if plugins is not None:
        if tools is not None or declared is not None or (host is not None and host.tools):
            tools = plugins.known_tools(tools or {})
        report = validation_report(flow, tools=tools, source=source, tools_dir=tools_dir)
        report["problems"] += plugins.check_flow(flow)
        report["valid"] = not report["problems"]
        if host is not None:
            report["plugins"] = host.describe()
    else:
        report = validation_report(flow, tools=tools, source=source, tools_dir=tools_dir)
    if declared is not None:
        report["commands"] = [{**row, "executable_path": pin.path if pin else None,
                               "executable_sha256": pin.sha256 if pin else None}
                              for row in declared.describe()
                              for pin in [declared.commands[row["name"]].program]]
        for row in report["tools"]:
            if row["name"] in declared.commands:
                row["executable"], row["command"] = None, declared.commands[row["name"]].revision
    if json_out:
        from heddle.cli.output import print_json

        print_json(report)  # then GraphError, when the report has problems: it is their one JSON object
    else:
        from heddle.cli.report import print_validation

        print_validation(report)
        for row in report.get("plugins", []):
            kinds = ", ".join(f"{c['componentType']} ({c['kind']})" for c in row["components"]) or "no components"
            sys.stdout.write(f"plugin    {row['name']} {row['version']}: {kinds}; {len(row['tools'])} tool(s)\n")
    if report["problems"]:
        raise GraphError(report["problems"])


@takes("tools_dir", "commands", "mounts", "mount_max_entries", "mount_max_bytes", "max_tool_rounds", "plugins",
       "plugin_configs", "plugin_timeout", "max_node_attempts", "level", "safe", "strict",
       help={"max_tool_rounds": "Proposed tool-round limit recorded in the bundle; where it runs, "
                                "--max-tool-rounds wins over it.",
             "safe": "Propose safe mode, recorded in the bundle: wherever it runs, its tools run in the sandbox "
                     "(as with --safe), and `heddle doctor` checks that bubblewrap works there."})
def bundle(
    flow_path: Path | None = typer.Argument(None, metavar="FLOW", show_default=False,
                                               help="The flow document to seal (.json, .yaml, .yml)."),
    flow_file: Path | None = _FLOW,
    input: str | None = typer.Option(None, "--input", "-i", metavar="JSON|@FILE|-",
                                        help="The default input recorded in the bundle (JSON, @FILE or -)."),
    requires: str | None = typer.Option(None, "--requires", metavar="JSON|@FILE",
                                           help='What the bundle needs on the host: JSON or @FILE, e.g. '
                                                '{"bins": ["git"], "env": ["OPENAI_API_KEY"]}.'),
    sign_key: Path | None = typer.Option(None, "--sign-key", metavar="KEY",
                                            help="Private key (from heddle keygen) to sign with."),
    name: str | None = typer.Option(None, "--name", metavar="NAME", help="Bundle name (default: the flow's name)."),
    release: int | None = typer.Option(None, "--release", metavar="N",
                                       help="A release number sealed in the manifest (a whole number): where the "
                                            "bundle's tag is followed, a lower release than the one seen is "
                                            "refused."),
    format: str | None = _FORMAT,
    components: Path | None = _COMPONENTS,
    egress: list[str] = typer.Option([], "--egress", metavar="TOOL=HOST[:PORT][,HOST]",
                                     help="The hosts a tool (or an MCP transport, ApiNode or llm config, by name) "
                                          "may reach, sealed in the manifest (repeatable; HOST may be *.name, no "
                                          "port means 443 and 80). Any egress declared makes the list complete: "
                                          "the document's URLs are added, and nothing else is reached."),
    egress_file: Path | None = typer.Option(None, "--egress-file", metavar="FILE",
                                            help="A YAML or JSON file with an egress: mapping of tool name to a "
                                                 "list of HOST[:PORT], as --egress, and a secrets: mapping, as "
                                                 "--secret (each with env or file, hosts and header)."),
    secret: list[str] = typer.Option([], "--secret", metavar="NAME=ENV@HOST[:PORT][,HOST]",
                                     help="A secret the tools use without holding it (repeatable): under --safe "
                                          "a tool's $NAME is a placeholder, which heddle's egress proxy replaces "
                                          "by the value of ENV, read where the bundle runs, in the header "
                                          "'Authorization: Bearer {}' of requests to those hosts alone."),
    output: Path | None = typer.Option(None, "-o", "--output", metavar="PATH",
                                          help="Where to write the bundle (default: <name>.heddle)."),
    include_secret: list[Path] = _INCLUDE_SECRET,
    json_out: bool = json_option("Print what was sealed as JSON."),
    verbose: bool = VERBOSE,
    quiet: bool = QUIET,
    *,
    settings: RunSettings,
    given: frozenset[str],
    tools_dir: Path | None,
    commands: Path | None,
    level: str | None,
) -> None:
    """Seal a flow, its tools, commands, mounts and plugins into one signed .heddle file.

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
    use_output(quiet=quiet, verbose=verbose)
    from heddle.bundle.seal import SealSettings
    from heddle.cli.seal import seal_flow as seal
    from heddle.cli.target import resolve_flow
    from heddle.settings import LEVEL

    zstd_level = LEVEL.default if level is None else LEVEL.parse(level, plain="s")[0]
    flow = resolve_flow(flow_path, flow_file)
    # Manifests, and the settings given, are checked before anything is packed; settings are
    # not sealed: the operator gives them where the bundle runs. heddle.core brings the engine,
    # which sealing never runs: only a plugin flag needs it.
    plugin_nodes: frozenset[str] = frozenset()
    if settings.plugins or settings.plugin_configs:
        from heddle.core import load_plugins

        host = load_plugins(settings, require_settings=False)
        plugin_nodes = host.node_types() if host else frozenset()
    if settings.strict:
        # Refused here as every --strict run of it would be; the bundle seals the document as written.
        from heddle.agentspec import load_flow

        load_flow(flow, fmt=format, node_types=plugin_nodes, components=components, strict=True)
    # Only a limit given here is proposed; "unlimited" is a proposal too.
    rounds = settings.max_tool_rounds
    proposal = None if "max_tool_rounds" not in given else "unlimited" if rounds is None else str(rounds)
    sealing = SealSettings(
        output=output, tools_dir=tools_dir, mounts=[_spelled(m) for m in settings.mounts], plugins=settings.plugins,
        sign_key=sign_key, name=name, max_tool_rounds=proposal, include_secrets=include_secret, flow_format=format,
        mount_max_entries=settings.mount_max_entries, mount_max_bytes=settings.mount_max_bytes, components=components,
        commands=commands, level=zstd_level, release=release, safe=settings.safe, egress=egress,
        egress_file=egress_file, secrets=secret)
    seal(flow, sealing, input_text=input, requires_text=requires, read_input=_read_input, json_out=json_out)


def init(
    directory: Path = typer.Argument(..., metavar="DIR",
                                     help="Folder to create the starter in (must be empty or new)."),
    port: int = typer.Option(0, "--port", show_default=False, metavar="PORT",
                             help="Port of the scripted model the flow calls (0 to 65535); default: a free port "
                                  "picked now."),
    verbose: bool = VERBOSE,
    quiet: bool = QUIET,
) -> None:
    """Write a starter agent that runs as printed.

    A flow, one tool and a model script, and the exact commands that run them.
    """
    use_output(quiet=quiet, verbose=verbose)
    from heddle.errors import UsageError
    from heddle.starter import write_starter

    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: give a port number from 0 to 65535")

    for line in write_starter(directory, port):
        typer.echo(line)
