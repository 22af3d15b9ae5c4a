"""Everything `heddle-server` was started with, checked once, before anything opens.

The command line and the environment both land here, so the rest of the server reads one
typed value instead of flags. The run settings are a `heddle.settings.RunSettings` (with the
names given on the command line, so a bundle's proposals yield to them); the server's own
settings are declared below in the same style, and the flag parser is generated from both.
Durations are seconds, as everywhere in the library; the flags read them as the settings say.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heddle import secret_env
from heddle.errors import UsageError
from heddle.settings import (
    ALLOW_UNSIGNED,
    BUNDLES,
    COMMANDS,
    DATA_DIR,
    LIMITS,
    LOG_FORMAT,
    LOG_LEVEL,
    OBSERVABILITY,
    OFFLINE,
    PLAIN_HTTP,
    SESSIONS,
    SOURCE,
    TOOLS_DIR,
    TRANSFER_TIMEOUT,
    TRUST,
    RunSettings,
    Setting,
    about,
    check_log,
)

DEFAULT_MAX_CONNECTIONS = 512
MAX_BODY_BYTES = 1 << 20

ENV_AUTH_TOKEN = secret_env.AUTH_TOKEN
ENV_STREAM = "HEDDLE_STREAM"
ENV_LLM_DEFAULT_KEY = secret_env.LLM_DEFAULT_KEY
ENV_SESSION_STORE = secret_env.SESSION_STORE
ENV_SESSION_KEY = secret_env.SESSION_KEY

NETWORK, REQUESTS = "network", "requests"


def _own(**about_: Any) -> Mapping[str, Setting]:
    # A setting only heddle-server takes.
    return about(cli=False, **about_)


def _shared(spec: Setting) -> Mapping[str, Setting]:
    # A setting both shells take beside the run settings; heddle.settings declares it.
    return {"setting": spec}


@dataclass(frozen=True)
class ServerConfig:
    # Text, not a path: a reference (oci://REGISTRY/REPO:TAG, an https:// URL) is pulled first.
    bundle: str | None = field(default=None, metadata=_own(
        kind="text", flag="--bundle", metavar="X.heddle|REF", group=SOURCE,
        help="Serve this sealed bundle (a path, oci://REGISTRY/REPO:TAG, oci://REGISTRY/REPO@sha256:DIGEST or an "
             "https:// URL, pulled into the cache), verified before the port opens."))
    trust: tuple[Path, ...] = field(default=TRUST.default, metadata=_shared(TRUST))
    allow_unsigned: bool = field(default=ALLOW_UNSIGNED.default, metadata=_shared(ALLOW_UNSIGNED))
    data_dir: Path | None = field(default=DATA_DIR.default, metadata=_shared(DATA_DIR))
    plain_http: bool = field(default=PLAIN_HTTP.default, metadata=_shared(PLAIN_HTTP))
    offline: bool = field(default=OFFLINE.default, metadata=_shared(OFFLINE))
    transfer_timeout: float = field(default=TRANSFER_TIMEOUT.default, metadata=_shared(TRANSFER_TIMEOUT))
    # None: the bundle served at start is served until the server stops.
    pull_interval: float | None = field(default=None, metadata=_own(
        kind="duration", flag="--pull-interval", metavar="DURATION", minimum=0.1, group=BUNDLES,
        shown="none (the bundle resolved at start is served until the server stops)",
        help="With --bundle oci://REGISTRY/REPO:TAG: resolve the tag again this often, and serve a new digest once "
             "it is pulled and verified (runs in flight finish on the one they started with; one that does not "
             "verify is refused and the served one stays)."))
    expect_name: str | None = field(default=None, metadata=_own(
        kind="text", flag="--expect-name", metavar="NAME", group=BUNDLES,
        help="With --pull-interval: serve only a bundle whose flow is named NAME (the one served at start too), "
             "whatever flow id it has; without it, a new digest must be the flow served (its name and id)."))
    tools_dir: Path | None = field(default=TOOLS_DIR.default, metadata=_shared(TOOLS_DIR))
    commands: Path | None = field(default=COMMANDS.default, metadata=_shared(COMMANDS))
    flows_root: Path | None = field(default=None, metadata=_own(
        kind="path", flag="--flows-root", metavar="DIR", group=SOURCE,
        help="Requests may name flows under DIR with flowPath."))
    # None: served_surfaces' default (every surface with a bundle; runs and ag-ui without one).
    serve: str | None = field(default=None, metadata=_own(
        kind="text", flag="--serve", metavar="SURFACE,...", group=SOURCE,
        shown="runs,mcp,a2a,responses,ag-ui with --bundle; runs,ag-ui without",
        help="The protocols to answer on, comma-separated: runs (/v1/runs and /v1/sessions), mcp (/mcp), a2a "
             "(/.well-known/agent-card.json, /a2a), responses (/v1/responses, /v1/models) and ag-ui (?protocol=ag-ui "
             "on the stream of /v1/runs). mcp, a2a and responses serve one agent, so need --bundle."))
    card_key: Path | None = field(default=None, metadata=_own(
        kind="path", flag="--card-key", metavar="KEY", group=BUNDLES, shown="none (the card is not signed)",
        help="With a2a served: sign the A2A agent card (JWS over its JCS form) with this Ed25519 key from `heddle "
             "keygen` (HEDDLE_KEY_PASSPHRASE unlocks an encrypted one); the signature's kid is its key id. Needs "
             "--public-url, the address the signed card names."))
    public_url: str | None = field(default=None, metadata=_own(
        kind="text", flag="--public-url", metavar="URL", group=NETWORK,
        shown="none (the card names the address each request was sent to)",
        help="The address callers reach this server at (https://agents.example.com), as the A2A agent card names "
             "it."))
    host: str = field(default="127.0.0.1", metadata=_own(
        kind="text", flag="--host", metavar="ADDRESS", group=NETWORK, shown="127.0.0.1",
        help="Address to listen on."))
    port: int = field(default=4319, metadata=_own(
        kind="int", flag="--port", metavar="PORT", group=NETWORK,
        help="Port to listen on; 0 picks a free one."))
    cors_origins: tuple[str, ...] = field(default=(), metadata=_own(
        kind="texts", flag="--cors-origin", metavar="ORIGIN", group=NETWORK,
        help="Let browser pages from ORIGIN (such as https://app.example.com) call the server (repeatable; * for "
             "any). Requests from other pages get 403."))
    allowed_hosts: tuple[str, ...] = field(default=(), metadata=_own(
        kind="texts", flag="--allowed-host", metavar="NAME", group=NETWORK,
        help="Also accept requests whose Host header is NAME, at any port (repeatable; * for any name, for a "
             "server behind a proxy). Others get 421; see below."))
    auth_token: str | None = field(default=None, metadata=_own(
        kind="text", flag="--auth-token", metavar="TOKEN", group=NETWORK, env=ENV_AUTH_TOKEN,
        help=f"Require 'Authorization: Bearer TOKEN' (see {ENV_AUTH_TOKEN})."))
    max_concurrent: int = field(default=4, metadata=_own(
        kind="int", flag="--max-concurrent", metavar="N", minimum=1, group=LIMITS,
        help="Runs at once; more are refused with 429, never queued."))
    drain_timeout: float = field(default=30.0, metadata=_own(
        kind="duration", flag="--drain-timeout", metavar="DURATION", minimum=0, group=LIMITS,
        help="On SIGTERM, how long runs in flight may finish before they are cancelled."))
    drain_delay: float = field(default=0.0, metadata=_own(
        kind="duration", flag="--drain-delay", metavar="DURATION", minimum=0, group=LIMITS,
        help="On SIGTERM, how long the port stays open at least (/readyz 503, new runs 503) so that a load "
             "balancer stops sending requests before it closes; 0 where something else waits (a preStop hook)."))
    header_timeout: float = field(default=10.0, metadata=_own(
        kind="duration", flag="--header-timeout", metavar="DURATION", minimum=0.001, group=LIMITS,
        help="Time a connection may take to send a request's line and headers, from when it opens or sends its "
             "first byte; then it gets 408 and is closed."))
    body_timeout: float = field(default=30.0, metadata=_own(
        kind="duration", flag="--body-timeout", metavar="DURATION", minimum=0.001, group=LIMITS,
        help="Time a request may take to send its body once its headers are in; then it gets 408 and is closed."))
    # None: not given, so the default applies, lowered to what the open-file limit allows.
    max_connections: int | None = field(default=None, metadata=_own(
        kind="int", flag="--max-connections", metavar="N", minimum=1, group=LIMITS,
        shown=f"{DEFAULT_MAX_CONNECTIONS}, lowered to fit the open-file limit (ulimit -n) with a warning",
        help="Open connections at once; more are answered 503 and closed."))
    allow_request_code: bool = field(default=False, metadata=_own(
        kind="flag", flag="--allow-request-code", group=REQUESTS,
        help="Accept tools sent in requests (written to a per-run folder, removed afterwards)."))
    allow_net: tuple[str, ...] = field(default=(), metadata=_own(
        kind="texts", flag="--allow-net", metavar="HOST", group=REQUESTS,
        help="Let request flows call models on HOST even if it is loopback or private (repeatable)."))
    llm_default_url: str | None = field(default=None, metadata=_own(
        kind="text", flag="--llm-default-url", metavar="URL", group=REQUESTS,
        help=f"The operator's model endpoint: always reachable, and sent {ENV_LLM_DEFAULT_KEY}."))
    work_dir: Path | None = field(default=None, metadata=_own(
        kind="path", flag="--work-dir", metavar="DIR", group=REQUESTS,
        help="Where per-run folders and workspaces are made."))
    max_sessions: int = field(default=10_000, metadata=_own(
        kind="int", flag="--max-sessions", metavar="N", minimum=1, group=SESSIONS,
        help="Sessions the --session-store may hold (shared by the servers on one store); past them POST "
             "/v1/sessions answers 507 too_many_sessions until some expire or are removed."))
    session_idle_timeout: float = field(default=7 * 24 * 3600.0, metadata=_own(
        kind="duration", flag="--session-idle-timeout", metavar="DURATION", minimum=1, group=SESSIONS,
        help="A session not written for this long (waiting for an answer, or between turns) expires: it is "
             "removed, and a request naming it gets 404 as for one that never was."))
    # None: not given, so on with a postgres:// store (where replicas share runs) and off with the others.
    recover: bool | None = field(default=None, metadata=_own(
        kind="switch", flag="--recover/--no-recover", group=SESSIONS, shown="on with a postgres:// store, else off",
        help="Finish the session runs of a server that died: a run whose owner's lease (--session-lease) expired "
             "is resumed here from its checkpoint, if this server serves the bundle it started with."))
    log_format: str = field(default=LOG_FORMAT.default, metadata=_shared(LOG_FORMAT))
    log_level: str = field(default=LOG_LEVEL.default, metadata=_shared(LOG_LEVEL))
    # The run settings as the command line gave them (a bundle's proposals are settled later),
    # and the names it gave explicitly.
    settings: RunSettings = field(default_factory=RunSettings)
    given: frozenset[str] = frozenset()
    llm_default_key: str | None = None
    max_body_bytes: int = MAX_BODY_BYTES
    # $HEDDLE_SESSION_KEY as the server's environment gives it (None: not set): the session store's key.
    session_key_env: str | None = None

    @property
    def surfaces(self) -> frozenset[str]:
        """The protocols this server answers on (`--serve`, or its default); UsageError for a bad one."""
        return served_surfaces(self.serve, bundle=self.bundle is not None)

    @property
    def plugins(self) -> tuple[Path, ...]:
        """The --plugin manifests (a bundle's own are added when it is settled)."""
        return self.settings.plugins

    @property
    def sandbox_flags(self) -> tuple[str, ...]:
        """Safe-only flags the policy cannot show by itself: `--sandbox auto` given explicitly."""
        return self.settings.sandbox_flags


# Where each group of flags is shown in --help, in this order.
GROUPS: Mapping[str, str] = {SOURCE: "What to serve", BUNDLES: "What to serve", NETWORK: "Network",
                             LIMITS: "Limits", REQUESTS: "Request code and models", SESSIONS: "Sessions",
                             "plugins": "Plugins", "workspaces": "Workspaces", "sandbox": "Sandbox",
                             OBSERVABILITY: "Logs and traces"}


# Every surface `--serve` names, in the order they are listed; the last three speak for one agent.
SURFACES: tuple[str, ...] = ("runs", "mcp", "a2a", "responses", "ag-ui")
ONE_AGENT_SURFACES = frozenset({"mcp", "a2a", "responses"})


# The module each surface needs beyond heddle's own dependencies, and the extra that installs it.
SURFACE_PACKAGES: Mapping[str, tuple[str, str]] = {"a2a": ("a2a.server", "heddle[a2a]")}


def _absent(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is None
    except ImportError:
        return True


def missing_package(surface: str) -> str | None:
    """The extra to install for `surface`, when its package is not installed; else None."""
    needed = SURFACE_PACKAGES.get(surface)
    return needed[1] if needed is not None and _absent(needed[0]) else None


def served_surfaces(serve: str | None, *, bundle: bool) -> frozenset[str]:
    """What `--serve` chooses: every surface by default with a bundle; runs and ag-ui without one (the
    others answer as one agent, which only a bundle is). Refuses an unknown surface by name."""
    if serve is None:
        # A surface whose optional package is not installed is left out of the default (--serve names it to
        # be told how to install it).
        return frozenset(SURFACES) - (frozenset() if bundle else ONE_AGENT_SURFACES) - frozenset(
            surface for surface in SURFACE_PACKAGES if missing_package(surface))
    names = [name.strip().lower() for name in serve.split(",")]
    unknown = [name for name in names if name not in SURFACES]
    if unknown:
        what = f"{unknown[0]!r} is not a surface" if unknown[0] else "a surface is missing"
        raise UsageError(f"--serve {serve!r}: {what}; give some of {','.join(SURFACES)}, comma-separated")
    chosen = frozenset(names)
    one_agent = sorted(chosen & ONE_AGENT_SURFACES)
    if one_agent and not bundle:
        raise UsageError(f"--serve {one_agent[0]} answers as one agent, and this server serves no bundle; give "
                         f"--bundle X.heddle or drop {one_agent[0]} from --serve")
    if "ag-ui" in chosen and "runs" not in chosen:
        raise UsageError("--serve ag-ui is an encoding of the stream of /v1/runs; add runs to --serve")
    return chosen


def server_settings() -> tuple[Setting, ...]:
    """The server's own settings and the shared ones, in declaration order."""
    from heddle.settings import settings_of

    return settings_of(ServerConfig)


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


def check_public_url(url: str) -> None:
    """`--public-url`: an http(s) URL naming a host, and no query or fragment."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment \
            or parts.username is not None:
        raise UsageError(f"--public-url {url!r}: give the http(s) address callers reach this server at, such as "
                         "https://agents.example.com")


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


def session_store_from_env(environ: Mapping[str, str]) -> str:
    value = environ[ENV_SESSION_STORE]
    if not value.strip():
        raise UsageError(f"{ENV_SESSION_STORE} is set but empty; give it a store (such as a postgres:// URL) or "
                         "unset it")
    return value


def check_session_flags(settings: RunSettings) -> None:
    """A store's folder or file only with that store: the server keeps no sessions by default, so
    `--session-db` alone would otherwise be read and then ignored."""
    store = settings.session_store
    for flag, given, wanted in (("--session-db", settings.session_db is not None, "sqlite"),
                                ("--session-dir", settings.session_dir is not None, "file")):
        if given and store != wanted:
            now = f"--session-store {store.split('://', 1)[0] + '://...' if '://' in store else store}" \
                if store else "no --session-store (sessions are off)"
            raise UsageError(f"{flag} applies only to --session-store {wanted}, and this server has {now}; give "
                             f"--session-store {wanted} or drop {flag}")


def check_following(bundle: object) -> None:
    """`--pull-interval` follows a tag: refused with anything else, which would never change."""
    from heddle.oci.reference import OCI_SCHEME, looks_like_reference, parse_oci

    text = str(bundle) if bundle is not None else None
    if text is None or not looks_like_reference(text):
        given = f"--bundle {text}, a file" if text is not None else "no --bundle"
        raise UsageError(f"--pull-interval follows a tag of a registry, and this server has {given}; give "
                         "--bundle oci://REGISTRY/REPO:TAG or drop --pull-interval")
    if not text.lower().startswith(OCI_SCHEME):
        raise UsageError(f"--pull-interval follows a tag of a registry, and --bundle {text} is a URL; push the "
                         "bundle to a registry and give --bundle oci://REGISTRY/REPO:TAG, or drop --pull-interval")
    if parse_oci(text).digest is not None:
        raise UsageError(f"--pull-interval follows a tag, and --bundle {text} names a digest, which never changes; "
                         "give the tag (oci://REGISTRY/REPO:TAG) or drop --pull-interval")


def check_config(config: ServerConfig) -> list[str]:
    """Refuse combinations that cannot mean anything; return warnings for risky ones."""
    warnings: list[str] = []
    check_log(config.log_format, config.log_level)
    if config.bundle is not None:
        ignored = [name for name, given in (
            ("--tools-dir", config.tools_dir is not None),
            ("--commands", config.commands is not None),
            ("--flows-root", config.flows_root is not None),
            ("--allow-request-code", config.allow_request_code),
            ("--allow-net", bool(config.allow_net)),
        ) if given]
        if ignored:
            raise UsageError(f"{', '.join(ignored)} cannot be used with --bundle {config.bundle}: "
                             "a bundle server runs only the sealed flow and its own tools")
    if config.bundle is not None and (config.settings.egress or config.settings.secrets):
        flag = "--egress" if config.settings.egress else "--secret"
        raise UsageError(f"{flag} applies to the documents requests send; bundle {config.bundle} has its egress list "
                         "and secrets sealed in it: seal it again with them (heddle bundle), or drop them")
    if config.settings.plugin_configs and not config.plugins and config.bundle is None:
        raise UsageError("--plugin-config sets a plugin component's settings; load the plugin with --plugin MANIFEST")
    bundle_only = [name for name, given in (("--trust", bool(config.trust)),
                                            ("--allow-unsigned", config.allow_unsigned),
                                            ("--data-dir", config.data_dir is not None),
                                            ("--plain-http", config.plain_http),
                                            ("--offline", config.offline),
                                            ("--transfer-timeout",
                                             config.transfer_timeout != TRANSFER_TIMEOUT.default)) if given]
    if bundle_only and config.bundle is None:
        verb = "applies" if len(bundle_only) == 1 else "apply"
        raise UsageError(f"{', '.join(bundle_only)} {verb} only to --bundle; give --bundle X.heddle or drop "
                         f"{'it' if len(bundle_only) == 1 else 'them'}")
    if config.expect_name is not None and config.pull_interval is None:
        raise UsageError("--expect-name fixes the agent a followed tag may name; give it with --pull-interval")
    if config.pull_interval is not None:
        check_following(config.bundle)
        if config.offline:
            raise UsageError("--pull-interval resolves the tag on every interval, and --offline never asks the "
                             "registry; drop one of them")
    check_session_flags(config.settings)
    surfaces = config.surfaces
    for surface in sorted(surfaces):
        extra = missing_package(surface)
        if extra is not None:
            raise UsageError(f"--serve {surface} needs a package this installation lacks; install it with "
                             f"pip install '{extra}', or drop {surface} from --serve")
    if config.card_key is not None and "a2a" not in surfaces:
        raise UsageError("--card-key signs the A2A agent card, and this server serves no a2a; give --bundle "
                         "(and a2a in --serve) or drop --card-key")
    if config.card_key is not None and _absent("jwt"):
        raise UsageError("--card-key signs with a2a-sdk's JWS helpers, which need PyJWT; install them with "
                         "pip install 'heddle[a2a]'")
    if config.card_key is not None and config.public_url is None:
        # A card signed with the address a request named would vouch for whatever Host a caller sent.
        raise UsageError("--card-key signs the agent card, which names this server's address; give that address "
                         "with --public-url https://HOST")
    if config.public_url is not None:
        check_public_url(config.public_url)
    for flag, folder in (("--tools-dir", config.tools_dir), ("--flows-root", config.flows_root)):
        if folder is not None and not folder.is_dir():
            what = "does not exist" if not folder.exists() else "is not a folder"
            raise UsageError(f"{flag} {folder}: {what}; give an existing folder")
    if not 0 <= config.port <= 65535:
        raise UsageError(f"--port {config.port}: give a port number from 0 to 65535")
    # Every setting's own range was checked as it was read (heddle.settings), and again here for a
    # config built in code.
    for spec in server_settings():
        problem = spec.problem(getattr(config, spec.name))
        if problem is not None:
            raise UsageError(problem)
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
    if config.allow_request_code and not config.settings.safe:
        warnings.append("--allow-request-code without --safe: code sent by callers runs with this "
                        "server's user and files; add --safe to confine it")
    return warnings

