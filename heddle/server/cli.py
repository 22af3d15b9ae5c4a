"""`heddle-server`: serve flows, or one sealed bundle, over HTTP.

Only the standard library is imported at start-up, so `--help` and `--version` stay fast;
the server and the engine are imported once the command line has been read.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from heddle.textsafe import write_line

if TYPE_CHECKING:
    from heddle.format.trust import TrustPolicy
    from heddle.oci import Pulled
    from heddle.server.config import ServerConfig
    from heddle.settings import Setting

EPILOG = """\
environment:
  HEDDLE_AUTH_TOKEN       bearer token every route but /healthz and /readyz requires
                          (--auth-token wins; prefer this over the flag, which others can see in ps)
  HEDDLE_STREAM           1 (default) or 0: whether models are asked to stream their answers
  HEDDLE_LLM_DEFAULT_KEY  API key sent to the --llm-default-url endpoint (only with that flag)
  HEDDLE_SESSION_STORE    the --session-store, such as a postgres:// URL with its password (the flag
                          wins; this keeps the password out of ps, and no tool is given it)
  HEDDLE_SESSION_KEY      the key session records are authenticated with (--session-key FILE wins);
                          a postgres:// or plugin store needs one, the same on every replica

browsers and proxies (every route, /healthz and /readyz too):
  Host     must name this server, at any port: localhost, 127.0.0.1, [::1], the --host address,
           or an --allowed-host name; with a wildcard --host (0.0.0.0, ::) any IP address too,
           so probes that send the pod's IP pass. Otherwise 421 (this stops DNS rebinding).
  Origin   a request that carries one (a web page's) needs --cors-origin to allow it, else 403.
  bodies   POST bodies must be Content-Type: application/json (charset=utf-8 at most), else 415.

examples:
  heddle-server --bundle app.heddle --trust me.pub --port 4319
  heddle-server --flows-root flows --tools-dir tools --safe --deny-net
  heddle-server --bundle app.heddle --trust me.pub --session-store postgres://heddle@db/heddle
                # shared by replicas, each given the same HEDDLE_SESSION_KEY
  curl -s localhost:4319/v1/runs -H 'Content-Type: application/json' -d '{"inputs": {"query": "hi"}}'
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming the flag at fault, as every heddle command reports bad input.
        self.exit(2, f"error: {message}; see heddle-server --help\n")


def _reader(spec: Setting) -> Callable[[str], str]:
    """An argparse `type` that refuses what `spec` cannot read (argparse names the flag), and keeps
    the text: config_from reads it again, to note a plain duration once and check its range."""

    def read(text: str) -> str:
        if spec.kind != "rounds":  # refused by config_from, naming the limit's own rule
            try:
                spec.read(text, plain="ms")
            except ValueError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return text

    return read


def _help(spec: Setting) -> str:
    shown = spec.show_default()
    return spec.help_for("ms") + (f" [default: {shown}]" if shown is not None else "")


def _add(group: argparse._ArgumentGroup, spec: Setting) -> None:
    assert spec.flag is not None
    # Every default is None here, so config_from knows what was given; the defaults are the table's.
    if spec.kind == "flag":
        group.add_argument(spec.flag, dest=spec.name, action="store_const", const=not spec.default, default=None,
                           help=_help(spec))
    elif spec.kind in ("paths", "texts"):
        group.add_argument(spec.flag, dest=spec.name, action="append", default=None, metavar=spec.metavar,
                           type=Path if spec.kind == "paths" else str, help=_help(spec))
    else:
        group.add_argument(spec.flag, dest=spec.name, default=None, metavar=spec.metavar,
                           type=Path if spec.kind == "path" else _reader(spec), help=_help(spec))


def _flags() -> list[Setting]:
    """Every setting heddle-server takes as a flag: its own, then the run settings."""
    from heddle.server.config import server_settings
    from heddle.settings import SETTINGS

    return [s for s in (*server_settings(), *SETTINGS) if s.server and s.flag is not None]


def parser() -> argparse.ArgumentParser:
    from heddle import __version__
    from heddle.server.config import GROUPS

    p = _Parser(prog="heddle-server", description="Serve Agent Spec flows, or one sealed .heddle bundle, over HTTP.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"heddle-server {__version__}")
    flags = _flags()
    groups: dict[str, argparse._ArgumentGroup] = {}
    for title in dict.fromkeys(GROUPS.values()):
        groups[title] = p.add_argument_group(title)
    for spec in flags:
        _add(groups[GROUPS[spec.group]], spec)
    return p


def _value(spec: Setting, raw: Any) -> Any:

    if spec.kind in ("paths", "texts"):
        return tuple(raw)
    if spec.kind in ("flag", "path"):
        return raw
    if spec.kind == "text":
        return str(raw)
    value, note = spec.parse(str(raw), plain="ms")
    if note is not None:
        write_line(sys.stderr, f"note: {note}")
    return value


def config_from(args: argparse.Namespace, environ: Mapping[str, str]) -> ServerConfig:
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

    own: dict[str, Any] = {}
    run: dict[str, Any] = {}
    for spec in _flags():
        raw = getattr(args, spec.name)
        if raw is not None:
            (run if spec.name in BY_NAME else own)[spec.name] = _value(spec, raw)
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
    args = parser().parse_args(argv)
    environ = os.environ if environ is None else environ

    from dataclasses import replace

    from heddle.errors import HeddleError

    try:
        from heddle.server.config import check_config

        config = config_from(args, environ)
        warnings = check_config(config)
        from heddle.server.config import DEFAULT_MAX_CONNECTIONS
        from heddle.server.connections import connection_cap

        connections, lowered = connection_cap(config.max_connections, DEFAULT_MAX_CONNECTIONS, config.max_concurrent)
        warnings += [lowered] if lowered else []
        config = replace(config, work_dir=_prepare_work_dir(config.work_dir), max_connections=connections)
        # The engine and the HTTP stack load only once the command line has passed its checks.
        from heddle.server.serve import serve
        from heddle.server.served_bundle import close_served, digest_of, open_served, pull_served
        from heddle.server.service import Service

        sealed: Any = None
        pulled: Pulled | None = None
        policy: TrustPolicy | None = None
        if config.bundle is not None:
            from heddle.format.trust import TrustPolicy

            # Trust is decided here, once, and handed down whole (a following server's new digests too).
            policy = TrustPolicy.from_names(config.trust, allow_unsigned=config.allow_unsigned)
            pulled = pull_served(config)
            sealed = open_served(config, policy, pulled).runnable
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
        if sealed is not None:
            write_line(sys.stderr, f"heddle-server: serving bundle {sealed.name!r} {digest_of(sealed)}")
        return serve(service, on_ready=_announce)
    except HeddleError as exc:
        write_line(sys.stderr, f"error: {exc.message}")
        return exc.exit_code
    except KeyboardInterrupt:
        write_line(sys.stderr, "error: interrupted")
        return 130


def main() -> None:
    sys.exit(run())
