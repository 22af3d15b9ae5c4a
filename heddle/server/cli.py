"""`heddle-server`: serve flows, or one sealed bundle, over HTTP.

A typer command whose options are built from the settings table as `heddle run`'s are
(heddle.shell_options): the same help, units, completion and did-you-mean. Only typer and the
table are imported to read the command line, so `--help` stays fast; the server and the engine
are imported once it has been read.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.textsafe import write_line

if TYPE_CHECKING:
    from heddle.bundle.verified import Bundle
    from heddle.format.trust import TrustPolicy
    from heddle.oci import Pulled
    from heddle.server.config import ServerConfig
    from heddle.settings import Setting

EPILOG = """\
Environment:
  HEDDLE_AUTH_TOKEN       bearer token every route but /healthz and /readyz requires
                          (--auth-token wins; prefer this over the flag, which others can see in ps)
  HEDDLE_STREAM           1 (default) or 0: whether models are asked to stream their answers
  HEDDLE_LLM_DEFAULT_KEY  API key sent to the --llm-default-url endpoint (only with that flag)
  HEDDLE_SESSION_STORE    the --session-store, such as a postgres:// URL with its password (the flag
                          wins; this keeps the password out of ps, and no tool is given it)
  HEDDLE_SESSION_KEY      the key session records are authenticated with (--session-key FILE wins);
                          a postgres:// or plugin store needs one, the same on every replica

Browsers and proxies (every route, /healthz and /readyz too):
  Host     must name this server, at any port: localhost, 127.0.0.1, [::1], the --host address,
           or an --allowed-host name; with a wildcard --host (0.0.0.0, ::) any IP address too,
           so probes that send the pod's IP pass. Otherwise 421 (this stops DNS rebinding).
  Origin   a request that carries one (a web page's) needs --cors-origin to allow it, else 403.
  bodies   POST bodies must be Content-Type: application/json (charset=utf-8 at most), else 415.

Examples:
  heddle-server --bundle app.heddle --trust me.pub --port 4319
  heddle-server --flows-root flows --tools-dir tools --safe --deny-net
  heddle-server --bundle app.heddle --trust me.pub --session-store postgres://heddle@db/heddle
                # shared by replicas, each given the same HEDDLE_SESSION_KEY
  curl -s localhost:4319/v1/runs -H 'Content-Type: application/json' -d '{"inputs": {"query": "hi"}}'
"""


DESCRIPTION = "Serve Agent Spec flows, or one sealed .heddle bundle, over HTTP."
QUIET_HELP = "Print no notes on stderr (the log and the warnings stay, as --log-level says)."
VERBOSE_HELP = "Also say on stderr what the server serves as it starts: its protocols, its limits, its sessions."
_CTX = "heddle_click_context"


def _flags() -> list[Setting]:
    """Every setting heddle-server takes as a flag: its own, then the run settings."""
    from heddle.server.config import server_settings
    from heddle.settings import SETTINGS

    return [s for s in (*server_settings(), *SETTINGS) if s.server and s.flag is not None]


@dataclass(frozen=True)
class _Parsed:
    """The command line read: each option's value, and the names given on it."""

    values: Mapping[str, Any]
    given: frozenset[str]


@functools.cache
def command() -> Any:
    """The click command heddle-server is, its options built from the table as `heddle run`'s are."""
    import inspect

    import typer
    from typer.core import TyperCommand

    from heddle import __version__
    from heddle.server.config import GROUPS
    from heddle.shell_options import format_sections, option, quicken

    order = list(dict.fromkeys(GROUPS.values()))

    class ServerCommand(TyperCommand):
        def get_params(self, ctx: Any) -> list[Any]:
            params = super().get_params(ctx)
            quicken(params)
            return params

        def format_options(self, ctx: Any, formatter: Any) -> None:
            format_sections(self, ctx, formatter, order)

        def format_epilog(self, ctx: Any, formatter: Any) -> None:
            formatter.write("\n" + EPILOG)  # as written: click would rewrap its columns

    def version(given: bool) -> None:
        if given:
            typer.echo(f"heddle-server {__version__}")
            raise typer.Exit()

    keyword = inspect.Parameter.KEYWORD_ONLY
    params = []
    for spec in _flags():
        annotation, typed = option(spec, plain="ms", panel=GROUPS[spec.group])
        params.append(inspect.Parameter(spec.name, keyword, default=typed, annotation=annotation))
    params += [
        inspect.Parameter("quiet", keyword, annotation=bool, default=typer.Option(False, "--quiet", "-q",
                                                                                  help=QUIET_HELP)),
        inspect.Parameter("verbose", keyword, annotation=bool, default=typer.Option(False, "--verbose", "-v",
                                                                                    help=VERBOSE_HELP)),
        inspect.Parameter("version", keyword, annotation=bool, default=typer.Option(
            False, "--version", callback=version, is_eager=True, help="Print the version and exit.")),
        inspect.Parameter(_CTX, keyword, annotation=typer.Context),
    ]

    def read(**values: Any) -> _Parsed:
        ctx = values.pop(_CTX)
        sources = {name: ctx.get_parameter_source(name) for name in values}
        return _Parsed(values, frozenset(n for n, source in sources.items() if source and source.name != "DEFAULT"))

    read.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    read.__annotations__ = {p.name: p.annotation for p in params}
    app = typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False, add_completion=True,
                      context_settings={"help_option_names": ["-h", "--help"],
                                        **({"color": False} if "NO_COLOR" in os.environ else {})})
    app.command(cls=ServerCommand, help=DESCRIPTION, epilog=EPILOG)(read)
    return typer.main.get_command(app)


def parse(argv: Sequence[str]) -> _Parsed | int:
    """The command line read, or the exit status of one that was answered already (--help, --version,
    completion); UsageError, naming the option, for one that cannot be read."""
    from heddle.errors import UsageError
    from heddle.shell_options import usage_error_types

    try:
        parsed = command().main(args=list(argv), prog_name="heddle-server", standalone_mode=False)
    except usage_error_types() as exc:
        raise UsageError(f"{exc.format_message().rstrip('.')}; see heddle-server --help") from None  # type: ignore[attr-defined]
    return parsed if isinstance(parsed, _Parsed) else int(parsed or 0)


def config_from(argv: Sequence[str] | _Parsed, environ: Mapping[str, str]) -> ServerConfig:
    """The settings the command line and the environment give; UsageError naming the one at fault."""
    from heddle.errors import UsageError
    from heddle.server.config import (
        ENV_LLM_DEFAULT_KEY,
        ENV_SESSION_KEY,
        ENV_SESSION_STORE,
        ENV_STREAM,
        ServerConfig,
        auth_token_from,
        session_store_from_env,
        stream_from_env,
    )
    from heddle.settings import BY_NAME, RunSettings
    from heddle.shell_options import value

    parsed = argv if isinstance(argv, _Parsed) else parse(argv)
    assert isinstance(parsed, _Parsed), "--help and --version are answered by run()"
    quiet, verbose = parsed.values["quiet"], parsed.values["verbose"]
    if quiet and verbose:
        raise UsageError("give --quiet or --verbose, not both")

    def note(text: str) -> None:
        if not quiet:
            write_line(sys.stderr, f"note: {text}")

    own: dict[str, Any] = {}
    run: dict[str, Any] = {}
    for spec in _flags():
        if spec.name in parsed.given:
            raw = parsed.values[spec.name]
            (run if spec.name in BY_NAME else own)[spec.name] = value(spec, raw, plain="ms", note=note)
    # The server reads whether models stream from the environment, not a flag.
    if ENV_STREAM in environ:
        run["stream"] = stream_from_env(environ)
    own["auth_token"] = auth_token_from(own.get("auth_token"), environ)
    if "session_store" not in run and ENV_SESSION_STORE in environ:
        run["session_store"] = session_store_from_env(environ)
    return ServerConfig(**own, settings=RunSettings(**run), given=frozenset(run),
                        llm_default_key=environ.get(ENV_LLM_DEFAULT_KEY) or None,
                        session_key_env=environ.get(ENV_SESSION_KEY))


def _prepare_work_dir(work_dir: Path | None) -> Path | None:
    import tempfile

    from heddle.errors import UsageError
    from heddle.format.private import make_private_dir

    if work_dir is None:
        return None
    # Runs make their tools' folders and workspaces here and use them by path: another user able
    # to rename or write in it could swap what a tool runs in, or what an rw mount gets back.
    real = make_private_dir(work_dir, what="work folder", setting="--work-dir")
    if not os.access(real, os.W_OK | os.X_OK):
        raise UsageError(f"--work-dir {work_dir}: not writable; give a writable folder")
    # Workspaces are temporary folders too: this puts them under --work-dir with the rest.
    tempfile.tempdir = str(real)
    return real


def _announce(url: str) -> None:
    write_line(sys.stdout, f"heddle-server listening on {url}")


def run(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The whole command; returns the exit status."""
    environ = os.environ if environ is None else environ

    from dataclasses import replace

    from heddle.errors import HeddleError

    try:
        from heddle.server.config import check_config

        parsed = parse(sys.argv[1:] if argv is None else argv)
        if isinstance(parsed, int):
            return parsed
        config = config_from(parsed, environ)
        warnings = check_config(config)
        from heddle.server.config import DEFAULT_MAX_CONNECTIONS
        from heddle.server.connections import connection_cap

        connections, lowered = connection_cap(config.max_connections, DEFAULT_MAX_CONNECTIONS, config.max_concurrent)
        warnings += [lowered] if lowered else []
        config = replace(config, work_dir=_prepare_work_dir(config.work_dir), max_connections=connections)
        # The engine and the HTTP stack load only once the command line has passed its checks.
        from heddle.server.serve import serve
        from heddle.server.served_bundle import close_served, open_served, pull_served
        from heddle.server.service import Service

        sealed: Bundle | None = None
        pulled: Pulled | None = None
        policy: TrustPolicy | None = None
        if config.bundle is not None:
            from heddle.format.trust import TrustPolicy

            # Trust is decided here, once, and handed down whole (a following server's new digests too).
            policy = TrustPolicy.from_names(config.trust, allow_unsigned=config.allow_unsigned)
            pulled = pull_served(config)
            sealed = open_served(config, policy, pulled)
            if config.expect_name is not None and sealed.flow.name != config.expect_name:
                close_served(sealed)
                from heddle.format.release import DowngradeError

                raise DowngradeError(f"--bundle {config.bundle}: its flow is named {sealed.flow.name!r}, not "
                                     f"{config.expect_name!r} as --expect-name says")
        try:
            service = Service(config, sealed=sealed, oci_digest=pulled.oci_digest if pulled is not None else None)
        except BaseException:
            close_served(sealed)
            raise
        if config.pull_interval is not None:
            from heddle.server.follow import Follower, OciSource

            # check_config let --pull-interval through only with an oci:// tag, which pulling resolved.
            assert config.bundle is not None and pulled is not None and pulled.oci_digest is not None
            assert policy is not None
            source = OciSource(config.bundle, config=config, trust=policy, service=service,
                               plain_http=config.plain_http)
            service.follower = Follower(service, source, interval=config.pull_interval, digest=pulled.oci_digest,
                                        expect_name=config.expect_name)
        for warning in warnings:
            write_line(sys.stderr, f"warning: {warning}")
        if sealed is not None and not parsed.values["quiet"]:
            write_line(sys.stderr, f"heddle-server: serving bundle {sealed.name!r} {sealed.digest}")
        if parsed.values["verbose"]:
            # The kind alone: a postgres:// URL may carry its password.
            store = (config.settings.session_store or "none (stateless)").split(":", 1)[0]
            write_line(sys.stderr, f"heddle-server: answering on {', '.join(sorted(config.surfaces))}; up to "
                                   f"{config.max_concurrent} runs at once (--max-concurrent); sessions: {store}")
        return serve(service, on_ready=_announce)
    except HeddleError as exc:
        write_line(sys.stderr, f"error: {exc.message}")
        return exc.exit_code
    except KeyboardInterrupt:
        write_line(sys.stderr, "error: interrupted")
        return 130


def main() -> None:
    if sys.argv[1:] == ["--version"]:
        # The fast path: what the option prints, without building the command.
        from heddle import __version__

        write_line(sys.stdout, f"heddle-server {__version__}")
        sys.exit(0)
    from heddle.shell_options import without_pydantic_plugins

    without_pydantic_plugins()  # heddle.shell_options says why
    sys.exit(run())
