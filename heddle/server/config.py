"""Everything `heddle-server` was started with, checked once, before anything opens.

The command line and the environment both land here, so the rest of the server reads one
typed value instead of flags. Durations are kept in milliseconds, as the flags give them.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from heddle import secret_env
from heddle.errors import UsageError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 4319
DEFAULT_MAX_CONCURRENT = 4
DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_DRAIN_TIMEOUT_MS = 30_000
DEFAULT_HEADER_TIMEOUT_MS = 10_000
DEFAULT_BODY_TIMEOUT_MS = 30_000
DEFAULT_MAX_CONNECTIONS = 512
MAX_BODY_BYTES = 1 << 20

ENV_AUTH_TOKEN = secret_env.AUTH_TOKEN
ENV_STREAM = "HEDDLE_STREAM"
ENV_LLM_DEFAULT_KEY = secret_env.LLM_DEFAULT_KEY


@dataclass(frozen=True)
class ServerConfig:
    bundle: Path | None = None
    trust: tuple[Path, ...] = ()
    allow_unsigned: bool = False
    tools_dir: Path | None = None
    flows_root: Path | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_concurrent: int = DEFAULT_MAX_CONCURRENT
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    max_iterations: int = 50
    # None: not given on the command line, so a bundle's proposal (or the engine default) applies.
    max_tool_rounds: str | None = None
    drain_timeout_ms: int = DEFAULT_DRAIN_TIMEOUT_MS
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    header_timeout_ms: int = DEFAULT_HEADER_TIMEOUT_MS
    body_timeout_ms: int = DEFAULT_BODY_TIMEOUT_MS
    # None: not given, so the default applies, lowered to what the open-file limit allows.
    max_connections: int | None = None
    allow_request_code: bool = False
    allow_net: tuple[str, ...] = ()
    work_dir: Path | None = None
    data_dir: Path | None = None
    mounts: tuple[str, ...] = ()
    workspace: Path | None = None
    mount_max_bytes: int = 64 * 2**20
    mount_max_entries: int = 4096
    no_mount_tools: bool = False
    llm_default_url: str | None = None
    llm_default_key: str | None = None
    safe: bool = False
    sandbox: str | None = None
    allow_read: tuple[Path, ...] = ()
    allow_write: tuple[Path, ...] = ()
    allow_env: tuple[str, ...] = ()
    deny_net: bool = False
    auth_token: str | None = None
    stream: bool = True
    max_body_bytes: int = MAX_BODY_BYTES
    tool_timeout_ms: int = 30_000
    plugins: tuple[Path, ...] = ()
    plugin_configs: tuple[str, ...] = ()
    plugin_timeout_ms: int = 30_000
    max_node_attempts: int = 3

    @property
    def sandbox_flags(self) -> tuple[str, ...]:
        """Safe-only flags the policy cannot show by itself: `--sandbox auto` given explicitly."""
        return ("--sandbox",) if self.sandbox is not None else ()


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_origin(origin: str) -> None:
    """`--cors-origin`: `*`, or scheme://host[:port] exactly as a browser sends it in Origin."""
    from urllib.parse import urlsplit

    if origin == "*":
        return
    parts = urlsplit(origin.rstrip("/"))
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path or parts.query or parts.fragment \
            or parts.username is not None:
        raise UsageError(f"--cors-origin {origin!r}: give an origin such as https://app.example.com "
                         "(scheme, host and port only), or *")


def check_allowed_host(name: str) -> None:
    """`--allowed-host`: a host name or IP address (no port, no scheme), or `*`."""
    import re

    if name == "*" or is_ip_literal(name.strip("[]")):
        return
    if not re.fullmatch(r"[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?", name):
        raise UsageError(f"--allowed-host {name!r}: give a host name such as api.example.com (no scheme or "
                         "port), an IP address, or * for any")


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def stream_from_env(environ: Mapping[str, str]) -> bool:
    value = environ.get(ENV_STREAM)
    if value is None:
        return True
    if value not in ("0", "1"):
        raise UsageError(f"{ENV_STREAM}={value!r}: use 1 (models stream their answers) or 0 (they do not)")
    return value == "1"


def auth_token_from(flag: str | None, environ: Mapping[str, str]) -> str | None:
    if flag is not None:
        if not flag.strip():
            raise UsageError("--auth-token is empty; give a token or leave the flag out")
        return flag
    value = environ.get(ENV_AUTH_TOKEN)
    if value is None:
        return None
    if not value.strip():
        raise UsageError(f"{ENV_AUTH_TOKEN} is set but empty; give it a token or unset it")
    return value


def check_config(config: ServerConfig) -> list[str]:
    """Refuse combinations that cannot mean anything; return warnings for risky ones."""
    warnings: list[str] = []
    if config.bundle is not None:
        ignored = [name for name, given in (
            ("--tools-dir", config.tools_dir is not None),
            ("--flows-root", config.flows_root is not None),
            ("--allow-request-code", config.allow_request_code),
            ("--allow-net", bool(config.allow_net)),
        ) if given]
        if ignored:
            raise UsageError(f"{', '.join(ignored)} cannot be used with --bundle {config.bundle}: "
                             "a bundle server runs only the sealed flow and its own tools")
    if config.plugin_configs and not config.plugins and config.bundle is None:
        raise UsageError("--plugin-config sets a plugin component's settings; load the plugin with --plugin MANIFEST")
    bundle_only = [name for name, given in (("--trust", bool(config.trust)),
                                            ("--allow-unsigned", config.allow_unsigned),
                                            ("--data-dir", config.data_dir is not None)) if given]
    if bundle_only and config.bundle is None:
        verb = "applies" if len(bundle_only) == 1 else "apply"
        raise UsageError(f"{', '.join(bundle_only)} {verb} only to --bundle; give --bundle X.heddle or drop "
                         f"{'it' if len(bundle_only) == 1 else 'them'}")
    for flag, folder in (("--tools-dir", config.tools_dir), ("--flows-root", config.flows_root)):
        if folder is not None and not folder.is_dir():
            what = "does not exist" if not folder.exists() else "is not a folder"
            raise UsageError(f"{flag} {folder}: {what}; give an existing folder")
    if not 0 <= config.port <= 65535:
        raise UsageError(f"--port {config.port}: give a port number from 0 to 65535")
    for flag, value, least in (("--max-concurrent", config.max_concurrent, 1), ("--timeout", config.timeout_ms, 1),
                               ("--max-iterations", config.max_iterations, 1),
                               ("--drain-timeout", config.drain_timeout_ms, 0),
                               ("--mount-max-bytes", config.mount_max_bytes, 1),
                               ("--mount-max-entries", config.mount_max_entries, 1),
                               ("--tool-timeout", config.tool_timeout_ms, 1),
                               ("--plugin-timeout", config.plugin_timeout_ms, 1),
                               ("--max-node-attempts", config.max_node_attempts, 1),
                               ("--header-timeout", config.header_timeout_ms, 1),
                               ("--body-timeout", config.body_timeout_ms, 1),
                               ("--max-connections", 1 if config.max_connections is None else config.max_connections, 1)):
        if value < least:
            raise UsageError(f"{flag} {value}: must be at least {least}")
    if config.llm_default_url is not None:
        from urllib.parse import urlsplit

        parts = urlsplit(config.llm_default_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise UsageError(f"--llm-default-url {config.llm_default_url!r}: give an http(s) URL "
                             "such as http://127.0.0.1:8000/v1")
    for origin in config.cors_origins:
        check_origin(origin)
    for name in config.allowed_hosts:
        check_allowed_host(name)
    if not is_loopback_host(config.host):
        if config.auth_token is None:
            warnings.append(f"--host {config.host} is not a loopback address and there is no authentication: "
                            "anyone who reaches this port can run the agent; set --auth-token or "
                            f"{ENV_AUTH_TOKEN}")
        else:
            warnings.append(f"--host {config.host} is not a loopback address: requests need the bearer token, "
                            "but traffic is plain HTTP; put TLS in front of this server")
    if config.llm_default_key and config.llm_default_url is None:
        warnings.append(f"{ENV_LLM_DEFAULT_KEY} is set but --llm-default-url is not: the key is sent nowhere")
    if config.allow_request_code and not config.safe:
        warnings.append("--allow-request-code without --safe: code sent by callers runs with this "
                        "server's user and files; add --safe to confine it")
    return warnings

