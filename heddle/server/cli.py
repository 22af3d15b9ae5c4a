"""`heddle-server`: serve flows, or one sealed bundle, over HTTP.

Only the standard library is imported at start-up, so `--help` and `--version` stay fast;
the server and the engine are imported once the command line has been read.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

EPILOG = """\
environment:
  HEDDLE_AUTH_TOKEN       bearer token every route but /healthz and /readyz requires
                          (--auth-token wins; prefer this over the flag, which others can see in ps)
  HEDDLE_STREAM           1 (default) or 0: whether models are asked to stream their answers
  HEDDLE_LLM_DEFAULT_KEY  API key sent to the --llm-default-url endpoint (only with that flag)

browsers and proxies (every route, /healthz and /readyz too):
  Host     must name this server, at any port: localhost, 127.0.0.1, [::1], the --host address,
           or an --allowed-host name; with a wildcard --host (0.0.0.0, ::) any IP address too,
           so probes that send the pod's IP pass. Otherwise 421 (this stops DNS rebinding).
  Origin   a request that carries one (a web page's) needs --cors-origin to allow it, else 403.
  bodies   POST bodies must be Content-Type: application/json (charset=utf-8 at most), else 415.

examples:
  heddle-server --bundle app.heddle --trust me.pub --port 4319
  heddle-server --flows-root flows --tools-dir tools --safe --deny-net
  curl -s localhost:4319/v1/runs -H 'Content-Type: application/json' -d '{"inputs": {"query": "hi"}}'
"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming the flag at fault, as every heddle command reports bad input.
        self.exit(2, f"error: {message}; see heddle-server --help\n")


def _ms(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of milliseconds") from None
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def parser() -> argparse.ArgumentParser:
    from heddle import __version__

    p = _Parser(prog="heddle-server", description="Serve Agent Spec flows, or one sealed .heddle bundle, over HTTP.",
                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"heddle-server {__version__}")
    g = p.add_argument_group("what to serve")
    g.add_argument("--bundle", type=Path, metavar="X.heddle", help="Serve this sealed bundle, verified before the port opens.")
    g.add_argument("--trust", type=Path, action="append", default=[], metavar="KEY.pub",
                   help="With --bundle: a public key trusted to have signed it (repeatable).")
    g.add_argument("--allow-unsigned", action="store_true", help="With --bundle: admit a bundle with no signature.")
    g.add_argument("--data-dir", type=Path, metavar="D",
                   help="With --bundle: where its rw mounts are seeded and kept [default: a temporary folder, "
                        "removed when the server stops].")
    g.add_argument("--tools-dir", type=Path, metavar="D", help="Folder of tool executables for request flows.")
    g.add_argument("--flows-root", type=Path, metavar="D", help="Requests may name flows under D with flowPath.")
    g = p.add_argument_group("network")
    g.add_argument("--host", default="127.0.0.1", help="Address to listen on [default: 127.0.0.1].")
    g.add_argument("--port", type=_int, default=4319, help="Port to listen on; 0 picks a free one [default: 4319].")
    g.add_argument("--cors-origin", action="append", default=[], metavar="O",
                   help="Let browser pages from origin O (such as https://app.example.com) call the server "
                        "(repeatable; * for any). Requests from other pages get 403.")
    g.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="Also accept requests whose Host header is NAME, at any port (repeatable; * for any "
                        "name, for a server behind a proxy). Others get 421; see below.")
    g.add_argument("--auth-token", metavar="T", help="Require 'Authorization: Bearer T' (see HEDDLE_AUTH_TOKEN).")
    g = p.add_argument_group("limits (durations in milliseconds)")
    g.add_argument("--max-concurrent", type=_int, default=4, metavar="N",
                   help="Runs at once; more are refused with 429, never queued [default: 4].")
    g.add_argument("--timeout", type=_ms, default=300_000, metavar="MS", help="Time one run may take [default: 300000].")
    g.add_argument("--tool-timeout", type=_ms, default=30_000, metavar="MS",
                   help="Time one tool call may take [default: 30000].")
    g.add_argument("--max-iterations", type=_int, default=50, metavar="N", help="Node executions per run [default: 50].")
    g.add_argument("--max-tool-rounds", metavar="N|unlimited",
                   help="Model calls an agent may make per execution [default: the bundle's, else 10].")
    g.add_argument("--drain-timeout", type=_ms, default=30_000, metavar="MS",
                   help="On SIGTERM, how long runs in flight may finish before they are cancelled [default: 30000].")
    g.add_argument("--header-timeout", type=_ms, default=10_000, metavar="MS",
                   help="Milliseconds a connection may take to send a request's line and headers, from when it "
                        "opens or sends its first byte; then it gets 408 and is closed [default: 10000].")
    g.add_argument("--body-timeout", type=_ms, default=30_000, metavar="MS",
                   help="Milliseconds a request may take to send its body once its headers are in; then it "
                        "gets 408 and is closed [default: 30000].")
    g.add_argument("--max-connections", type=_int, metavar="N",
                   help="Open connections at once; more are answered 503 and closed [default: 512, lowered "
                        "to fit the open-file limit (ulimit -n) with a warning].")
    g = p.add_argument_group("request code and models")
    g.add_argument("--allow-request-code", action="store_true",
                   help="Accept tools sent in requests (written to a per-run folder, removed afterwards).")
    g.add_argument("--allow-net", action="append", default=[], metavar="HOST",
                   help="Let request flows call models on HOST even if it is loopback or private (repeatable).")
    g.add_argument("--llm-default-url", metavar="URL",
                   help="The operator's model endpoint: always reachable, and sent HEDDLE_LLM_DEFAULT_KEY.")
    g.add_argument("--work-dir", type=Path, metavar="D", help="Where per-run folders and workspaces are made.")
    g = p.add_argument_group("plugins")
    g.add_argument("--plugin", type=Path, action="append", default=[], metavar="MANIFEST",
                   help="Load a plugin's plugin.json for every run (repeatable; with --bundle, after the bundle's own).")
    g.add_argument("--plugin-config", action="append", default=[], metavar="TYPE=JSON|@FILE",
                   help="Settings of a plugin component type, checked against its configSchema (repeatable).")
    g.add_argument("--plugin-timeout", type=_ms, default=30_000, metavar="MS",
                   help="Time a plugin call may stay silent before the plugin is killed [default: 30000].")
    g.add_argument("--max-node-attempts", type=_int, default=3, metavar="N",
                   help="Times a node may run when a nodeError plugin asks to retry it [default: 3].")
    g = p.add_argument_group("workspaces")
    g.add_argument("--mount", action="append", default=[], metavar="SRC[:DEST][:ro|:rw]",
                   help="Put a file or folder into every workspace (repeatable).")
    g.add_argument("--workspace", type=Path, metavar="D", help="Keep each node's workspace under D.")
    g.add_argument("--mount-max-bytes", type=_int, default=64 * 2**20, metavar="N", help="Most bytes one mount may hold.")
    g.add_argument("--mount-max-entries", type=_int, default=4096, metavar="N",
                   help="Most files and folders one mount may hold.")
    g.add_argument("--no-mount-tools", action="store_true", help="Leave .heddle/bin empty in workspaces.")
    g = p.add_argument_group("sandbox")
    g.add_argument("--safe", action="store_true", help="Run each tool call in a bubblewrap sandbox.")
    g.add_argument("--sandbox", metavar="B", help="Sandbox backend under --safe: auto or bubblewrap.")
    g.add_argument("--allow-read", type=Path, action="append", default=[], metavar="P",
                   help="Under --safe, also let tools read P (repeatable).")
    g.add_argument("--allow-write", type=Path, action="append", default=[], metavar="P",
                   help="Under --safe, also let tools write P (repeatable).")
    g.add_argument("--allow-env", action="append", default=[], metavar="N",
                   help="Under --safe, pass environment variable N to tools (repeatable).")
    g.add_argument("--deny-net", action="store_true", help="Under --safe, give tools no network.")
    return p


def config_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Any:
    from heddle.server.config import ENV_LLM_DEFAULT_KEY, ServerConfig, auth_token_from, stream_from_env

    return ServerConfig(
        bundle=args.bundle, trust=tuple(args.trust), allow_unsigned=args.allow_unsigned,
        tools_dir=args.tools_dir, flows_root=args.flows_root, host=args.host, port=args.port,
        max_concurrent=args.max_concurrent, timeout_ms=args.timeout, tool_timeout_ms=args.tool_timeout,
        max_iterations=args.max_iterations, max_tool_rounds=args.max_tool_rounds,
        drain_timeout_ms=args.drain_timeout, cors_origins=tuple(args.cors_origin),
        allowed_hosts=tuple(args.allowed_host), header_timeout_ms=args.header_timeout,
        body_timeout_ms=args.body_timeout, max_connections=args.max_connections,
        allow_request_code=args.allow_request_code, allow_net=tuple(args.allow_net), work_dir=args.work_dir,
        data_dir=args.data_dir,
        mounts=tuple(args.mount), workspace=args.workspace, mount_max_bytes=args.mount_max_bytes,
        mount_max_entries=args.mount_max_entries, no_mount_tools=args.no_mount_tools,
        llm_default_url=args.llm_default_url,
        llm_default_key=environ.get(ENV_LLM_DEFAULT_KEY) or None,
        safe=args.safe, sandbox=args.sandbox, allow_read=tuple(args.allow_read),
        allow_write=tuple(args.allow_write), allow_env=tuple(args.allow_env), deny_net=args.deny_net,
        auth_token=auth_token_from(args.auth_token, environ), stream=stream_from_env(environ),
        plugins=tuple(args.plugin), plugin_configs=tuple(args.plugin_config),
        plugin_timeout_ms=args.plugin_timeout, max_node_attempts=args.max_node_attempts,
    )


def _prepare_work_dir(work_dir: Path | None) -> Path | None:
    import tempfile

    from heddle.errors import UsageError

    if work_dir is None:
        return None
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--work-dir {work_dir}: cannot be created ({exc.strerror or exc}); give a writable folder") from None
    if not os.access(work_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--work-dir {work_dir}: not writable; give a writable folder")
    real = work_dir.resolve()
    # Workspaces are temporary folders too: this puts them under --work-dir with the rest.
    tempfile.tempdir = str(real)
    return real


def _announce(url: str) -> None:
    sys.stdout.write(f"heddle-server listening on {url}\n")
    sys.stdout.flush()


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
        from heddle.server.service import Service

        from heddle.server.sealed import close_sealed, digest_of, open_sealed

        sealed = open_sealed(config) if config.bundle is not None else None
        try:
            service = Service(config, sealed=sealed)
        except BaseException:
            close_sealed(sealed)
            raise
        for warning in warnings:
            sys.stderr.write(f"warning: {warning}\n")
        if sealed is not None:
            sys.stderr.write(f"heddle-server: serving bundle {sealed.name!r} {digest_of(sealed)}\n")
        return serve(service, on_ready=_announce)
    except HeddleError as exc:
        sys.stderr.write(f"error: {exc.message}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted\n")
        return 130


def main() -> None:
    sys.exit(run())
