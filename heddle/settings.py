"""Every setting of a run, defined once: its default, its unit, its help and the flag that sets it.

`RunSettings` is what a library caller passes and what both shells build. Each of its fields
carries a `Setting` (in the field's metadata), and `heddle run`'s options and `heddle-server`'s
flags are generated from those, so a default, a unit or a help text is written here and only here.
Durations are float seconds; each shell reads them as `30s`, `500ms`, `5m`, `1h` or `1m30s`, and
a plain number in its own historic unit (the CLI seconds, the server milliseconds) with a note.
Sizes are whole bytes, read as `64MiB`, `400MB` or `16KiB` by both, a plain number as bytes.

The layers' own defaults are read from the light modules where each is written (see the imports);
nothing heavier is imported at the top: both shells read this module before `--help`.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

# The layers' own defaults, each written by the layer that uses it in a module the standard library
# alone is imported for (the model, tools and engine limits are the engine's RunOptions).
from heddle.engine.options import RunOptions
from heddle.errors import UsageError
from heddle.format.limits import ZSTD_LEVEL, ZSTD_MAX_LEVEL, ZSTD_MIN_LEVEL
from heddle.oci.limits import TRANSFER_TIMEOUT_S
from heddle.plugin_host import MAX_NODE_ATTEMPTS, PLUGIN_TIMEOUT_S
from heddle.sessions import LEASE_SECONDS
from heddle.surface import Surface
from heddle.workspace import MOUNT_MAX_BYTES, MOUNT_MAX_ENTRIES

if TYPE_CHECKING:
    from heddle.workspace.mounts import Mount

# Each shell's wording, which the run core hands the engine: how a person gives what a session asks for
# (heddle.sessions.turn's messages), and the unit a plain number of its flags is in.
CLI = Surface("s", words=MappingProxyType({
    "message": "--message TEXT", "approval": "--approve or --deny REASON", "client_tool": "--tool-result JSON",
    "session": "--session NAME", "new_session": "a new session name", "input": "--input", "resume": "--resume",
    "reply": "--message", "durable": "--durable",
}))
SERVER = Surface("ms", words=MappingProxyType({
    "message": '"answer": {"message": TEXT}', "approval": '"answer": {"approve": true} or {"deny": REASON}',
    "client_tool": '"answer": {"tool_result": JSON}', "session": '"session" (an id POST /v1/sessions issues)',
    "new_session": "a new session (POST /v1/sessions)", "input": "'inputs'", "resume": '"resume": true',
    "reply": "'message'", "durable": "a durable run",
}))

Unit = Literal["s", "ms"]
# How a setting is read from the command line: "flag" takes no value and, given, sets the opposite of
# its default; "switch" has an on and an off spelling (--stream/--no-stream).
Kind = Literal["int", "duration", "size", "rounds", "flag", "path", "paths", "text", "texts", "switch"]

# ---------------------------------------------------------------------------------------- durations

_UNITS: Mapping[str, float] = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
_PART = r"(\d+(?:\.\d*)?|\.\d+)(ms|h|m|s)"
_DURATION = re.compile(rf"(?:{_PART})+")
_PARTS = re.compile(_PART)
_PLAIN = re.compile(r"\d+(?:\.\d*)?|\.\d+")
DURATION_FORMS = "30s, 500ms, 5m, 1h or 1m30s"


def parse_duration(text: str, *, plain: Unit) -> tuple[float, bool]:
    """`text` in seconds, and whether it was a plain number read in the `plain` unit.

    Raises ValueError naming the text and the forms a duration takes."""
    value = text.strip().lower()
    if _DURATION.fullmatch(value):
        return sum(float(n) * _UNITS[u] for n, u in _PARTS.findall(value)), False
    if _PLAIN.fullmatch(value):
        if plain == "ms":
            if not value.isdigit():
                raise ValueError(f"{text!r} is not a whole number of milliseconds; give a duration with its "
                                 f"unit: {DURATION_FORMS}")
            return int(value) / 1000, True
        return float(value), True
    raise ValueError(f"{text!r} is not a duration; give one such as {DURATION_FORMS}")


def format_duration(seconds: float) -> str:
    """The shortest exact spelling `parse_duration` reads back: 300 -> "5m", 90 -> "1m30s", 0.5 -> "500ms"."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"not a duration: {seconds!r}")
    millis = round(seconds * 1000, 6)
    if millis != int(millis):
        return f"{millis:g}ms"
    if millis < 1000:
        return f"{int(millis)}ms"
    left, parts = int(millis), []
    for unit, size in (("h", 3_600_000), ("m", 60_000)):
        if left >= size:
            count, left = divmod(left, size)
            parts.append(f"{count}{unit}")
    if left:
        parts.append(f"{left // 1000}s" if left % 1000 == 0 else f"{left / 1000:g}s")
    return "".join(parts)


def plain_note(flag: str, text: str, plain: Unit) -> str:
    """The deprecation note for a duration given as a plain number."""
    if plain == "ms":
        # The number may have been meant as seconds: show both spellings, never milliseconds alone.
        return (f"{flag} {text}: a plain number is read as milliseconds, which is deprecated; write it with its "
                f"unit: {flag} {format_duration(int(text) / 1000)} to keep this meaning, or {flag} "
                f"{format_duration(int(text))} for seconds")
    return (f"{flag} {text}: a plain number is read as seconds, which is deprecated; "
            f"write it with its unit: {flag} {format_duration(float(text))}")


# ---------------------------------------------------------------------------------------- sizes

# Decimal units are powers of 1000, binary ones of 1024, as their names say; a plain number is bytes.
_SIZE_UNITS: Mapping[str, int] = {"b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
                                  "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}
_SIZE = re.compile(r"(\d{1,20})(?:\.(\d{1,20}))?\s*([kmgt]i?b|b)?")
SIZE_FORMS = "64MiB, 400MB, 16KiB or 1048576 (bytes)"


def parse_size(text: str) -> int:
    """`text` in bytes: a whole number of bytes, or a number with its unit (KB/MB/GB/TB, KiB/MiB/GiB/TiB).

    Read exactly (no float): a value that is not a whole number of bytes, such as 0.1KiB, is refused.
    Raises ValueError naming the text and the forms a size takes."""
    match = _SIZE.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"{text!r} is not a size; give one such as {SIZE_FORMS}")
    whole, fraction, unit = (str(g or "") for g in match.groups())
    bytes_, left = divmod(int(whole + fraction) * _SIZE_UNITS[unit or "b"], int(10 ** len(fraction)))
    if left:
        raise ValueError(f"{text!r} is not a whole number of bytes; give one such as {SIZE_FORMS}")
    return bytes_


def format_size(n: int) -> str:
    """The shortest exact spelling `parse_size` reads back: 16777216 -> "16MiB", 400000000 -> "400MB"."""
    units = ("KiB", "MiB", "GiB", "TiB", "KB", "MB", "GB", "TB")
    spellings = [str(n)] + [f"{n // _SIZE_UNITS[u.lower()]}{u}" for u in units if n and n % _SIZE_UNITS[u.lower()] == 0]
    return min(spellings, key=lambda t: (len(t), t.isdigit()))


# ---------------------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Setting:
    """One setting: its field, how it is read, its default, help and flag.

    `flag` is spelled the same by both shells; `cli`/`server` say which of them takes it as a flag,
    and `env` is a variable the server reads it from instead. `minimum` is in the setting's own unit
    (seconds for a duration)."""

    name: str
    kind: Kind
    default: Any
    help: str
    flag: str | None
    group: str
    metavar: str | None = None
    short: str | None = None
    minimum: float | None = None
    cli: bool = True
    server: bool = True
    env: str | None = None
    # What the help shows as the default when the value alone does not say it.
    shown: str | None = None
    maximum: float | None = None  # in the setting's own unit, as `minimum` is

    def show_default(self) -> str | None:
        """The default as a person reads it in --help, or None when there is nothing to show."""
        if self.shown is not None:
            return self.shown
        if self.kind == "duration" and isinstance(self.default, (int, float)):
            return format_duration(float(self.default))
        if self.kind == "size" and isinstance(self.default, int):
            return format_size(self.default)
        if self.kind in ("int", "rounds") and self.default is not None:
            return str(self.default)
        return None

    def help_for(self, plain: Unit) -> str:
        """The help text with the unit the shell reads a plain number in, for durations and sizes."""
        if self.kind == "size":
            return f"{self.help} A size such as 64MiB, 400MB or 16KiB (plain numbers are bytes)."
        if self.kind != "duration":
            return self.help
        unit = "milliseconds" if plain == "ms" else "seconds"
        return f"{self.help} A duration such as 30s, 500ms or 5m (plain numbers are {unit})."

    def read(self, text: str, *, plain: Unit) -> tuple[Any, str | None]:
        """The value `text` gives this setting, and a deprecation note when there is one.

        Raises ValueError with the reason (without the flag: each shell puts it in its own form)."""
        if self.kind == "duration":
            seconds, was_plain = parse_duration(text, plain=plain)
            return seconds, plain_note(self.flag or self.name, text.strip(), plain) if was_plain else None
        if self.kind == "size":
            return parse_size(text), None
        if self.kind == "int":
            try:
                return int(text.strip()), None
            except ValueError:
                raise ValueError(f"{text!r} is not a whole number") from None
        if self.kind == "rounds":
            return parse_rounds(text), None
        if self.kind in ("path", "paths"):
            return Path(text), None
        return text, None

    def parse(self, text: str, *, plain: Unit) -> tuple[Any, str | None]:
        """`read`, with its range checked: what both shells do with a flag's text.

        Raises UsageError naming the flag; the note, when there is one, is for the shell to print."""
        try:
            value, note = self.read(text, plain=plain)
        except ValueError as exc:
            raise UsageError(f"{self.flag or self.name}: {exc}") from None
        problem = self.problem(value, text)
        if problem is not None:
            raise UsageError(problem)
        return value, note

    def problem(self, value: Any, text: str | None = None) -> str | None:
        """Why `value` is out of range, as one line naming the flag, or None."""
        if value is None:
            return None
        given = f"{self.flag or self.name} {text if text is not None else value}"
        if self.maximum is not None and value > self.maximum:
            most = format_duration(self.maximum) if self.kind == "duration" else f"{self.maximum:g}"
            return f"{given}: must be at most {most}"
        if self.minimum is None or value >= self.minimum:
            return None
        least = format_duration(self.minimum) if self.kind == "duration" else f"{self.minimum:g}"
        return f"{given}: must be at least {least}"


def about(*, kind: Kind, help: str, flag: str | None, group: str, metavar: str | None = None,
          short: str | None = None, minimum: float | None = None, cli: bool = True, server: bool = True,
          env: str | None = None, shown: str | None = None) -> Mapping[str, Setting]:
    """The metadata of a dataclass field that is a setting; `settings_of` adds its name and default."""
    return {"setting": Setting(name="", kind=kind, default=None, help=help, flag=flag, group=group, metavar=metavar,
                               short=short, minimum=minimum, cli=cli, server=server, env=env, shown=shown)}


def settings_of(cls: type[Any]) -> tuple[Setting, ...]:
    """The Settings of a dataclass whose fields carry `about(...)` metadata, in declaration order."""
    return tuple(dataclasses.replace(f.metadata["setting"], name=f.name, default=f.default)
                 for f in dataclasses.fields(cls) if "setting" in f.metadata)


def parse_rounds(value: str | int | None) -> int | None:
    """`--max-tool-rounds N|unlimited` (or a bundle's proposal): a whole number >= 1, or None for unlimited."""
    if value is None:
        return RunSettings.max_tool_rounds
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif str(value).strip().lower() in ("unlimited", "none", "inf"):
        return None
    else:
        try:
            n = int(str(value))
        except ValueError:
            raise UsageError(f"--max-tool-rounds {value!r}: give a positive whole number or 'unlimited'") from None
    if n < 1:
        raise UsageError(f"--max-tool-rounds {n}: must be at least 1 (or 'unlimited')")
    return n


# Group names both shells show their flags under.
LIMITS, WORKSPACES, SANDBOX, PLUGINS, BUNDLES, SOURCE, MODELS, SESSIONS, OBSERVABILITY = (
    "limits", "workspaces", "sandbox", "plugins", "bundles", "source", "models", "sessions", "observability")


@dataclass(frozen=True)
class RunSettings:
    """How one run is configured. Every field has the default both shells use.

    Durations are seconds (None: no limit). `mounts` are `SRC[:DEST][:ro|:rw]` specs (or parsed
    Mounts); `plugins` are plugin.json paths and `plugin_configs` their `TYPE=JSON|@FILE` settings."""

    max_iterations: int = field(default=RunOptions.max_iterations, metadata=about(
        kind="int", flag="--max-iterations", metavar="N", minimum=1, group=LIMITS,
        help="Node executions per run."))
    max_tool_rounds: int | None = field(default=RunOptions.max_tool_rounds, metadata=about(
        kind="rounds", flag="--max-tool-rounds", metavar="N|unlimited", group=LIMITS,
        shown="the bundle's proposal, else 10", help="Model calls an agent may make per execution."))
    max_parallel: int = field(default=RunOptions.max_parallel, metadata=about(
        kind="int", flag="--max-parallel", metavar="N", minimum=1, group=LIMITS,
        help="Subflows one ParallelFlowNode or ParallelMapNode runs at once."))
    timeout: float | None = field(default=RunOptions.timeout, metadata=about(
        kind="duration", flag="--timeout", metavar="DURATION", minimum=0.001, group=LIMITS,
        help="Time the whole run may take."))
    tool_timeout: float | None = field(default=RunOptions.tool_timeout, metadata=about(
        kind="duration", flag="--tool-timeout", metavar="DURATION", minimum=0.001, group=LIMITS,
        help="Time one tool call may take."))
    tool_output_limit: int = field(default=RunOptions.tool_output_limit, metadata=about(
        kind="int", flag="--tool-output-limit", metavar="N", minimum=1, group=LIMITS,
        help="Characters of one tool result an agent's model gets; a longer one is written whole to "
             ".heddle/tool-output/ in the agent's workspace and the model gets its head and tail."))
    max_tool_stdout_bytes: int = field(default=RunOptions.max_tool_stdout_bytes, metadata=about(
        kind="size", flag="--max-tool-stdout-bytes", metavar="SIZE", minimum=1, group=LIMITS,
        help="Most bytes a tool process may print on its stdout in one call; past them it is killed and the "
             "call fails (its stderr is kept to its last lines)."))
    max_response_bytes: int = field(default=RunOptions.max_response_bytes, metadata=about(
        kind="size", flag="--max-response-bytes", metavar="SIZE", minimum=1, group=LIMITS,
        help="Most bytes, once decoded, of one answer a run reads from the network or an MCP server: a model's "
             "answer (streamed or not), a RemoteTool's response, a message from an MCP server (over stdio, a line "
             "of its stdout)."))
    model_timeout: float = field(default=RunOptions.model_timeout, metadata=about(
        kind="duration", flag=None, cli=False, server=False, minimum=0.001, group=MODELS,
        help="Time a model request may stay silent (connecting, or between two pieces of its answer)."))
    model_deadline: float = field(default=RunOptions.model_deadline, metadata=about(
        kind="duration", flag=None, cli=False, server=False, minimum=0.001, group=MODELS,
        help="Time one model request may take in all, its whole answer read."))
    model_retries: int = field(default=RunOptions.model_retries, metadata=about(
        kind="int", flag=None, cli=False, server=False, minimum=0, group=MODELS,
        help="Times a failed model request is retried."))
    stream: bool = field(default=RunOptions.stream, metadata=about(
        kind="switch", flag="--stream/--no-stream", server=False, env="HEDDLE_STREAM", group=MODELS, shown="--stream",
        help="Ask the model to stream its answers, or not."))
    # Not a server flag: a request must never redirect a served flow's models (its operator points
    # a bundle elsewhere with url: "$VAR" in the document, read from the server's environment).
    model_urls: tuple[str, ...] = field(default=(), metadata=about(
        kind="texts", flag="--model-url", metavar="NAME=URL", server=False, group=MODELS,
        help="Send the requests of llm config NAME (its name or id) to URL, for this run (repeatable)."))
    mounts: tuple[str | Mount, ...] = field(default=(), metadata=about(
        kind="texts", flag="--mount", short="-m", metavar="SRC[:DEST][:ro|:rw]", group=WORKSPACES,
        help="Put a file or folder into every workspace (repeatable; ro is a private copy, rw copies changes "
             "back)."))
    workspace: Path | None = field(default=None, metadata=about(
        kind="path", flag="--workspace", metavar="DIR", group=WORKSPACES,
        help="Keep each node's workspace at DIR/<node-name> instead of removing it."))
    mount_tools: bool = field(default=True, metadata=about(
        kind="flag", flag="--no-mount-tools", group=WORKSPACES,
        help="Leave .heddle/bin empty in workspaces."))
    mount_max_entries: int = field(default=MOUNT_MAX_ENTRIES, metadata=about(
        kind="int", flag="--mount-max-entries", metavar="N", minimum=1, group=WORKSPACES,
        help="Most files and folders one mount may hold."))
    mount_max_bytes: int = field(default=MOUNT_MAX_BYTES, metadata=about(
        kind="size", flag="--mount-max-bytes", metavar="SIZE", minimum=1, group=WORKSPACES,
        help="Most bytes one mount may hold."))
    safe: bool = field(default=False, metadata=about(
        kind="flag", flag="--safe", group=SANDBOX,
        help="Run each tool call in a bubblewrap sandbox."))
    sandbox: str | None = field(default=None, metadata=about(
        kind="text", flag="--sandbox", metavar="BACKEND", group=SANDBOX, shown="auto",
        help="Sandbox backend under --safe: auto or bubblewrap."))
    allow_read: tuple[Path, ...] = field(default=(), metadata=about(
        kind="paths", flag="--allow-read", metavar="PATH", group=SANDBOX,
        help="Under --safe, also let tools read PATH (repeatable)."))
    allow_write: tuple[Path, ...] = field(default=(), metadata=about(
        kind="paths", flag="--allow-write", metavar="PATH", group=SANDBOX,
        help="Under --safe, also let tools write PATH (repeatable)."))
    allow_env: tuple[str, ...] = field(default=(), metadata=about(
        kind="texts", flag="--allow-env", metavar="NAME", group=SANDBOX,
        help="Under --safe, pass environment variable NAME to tools (repeatable)."))
    deny_net: bool = field(default=False, metadata=about(
        kind="flag", flag="--deny-net", group=SANDBOX,
        help="Under --safe, give tools no network."))
    # For documents (heddle run's, a server's requests'); refused with a bundle, whose list and secrets are sealed.
    egress: tuple[str, ...] = field(default=(), metadata=about(
        kind="texts", flag="--egress", metavar="TOOL=HOST[:PORT]", group=SANDBOX,
        help="With documents: the hosts a tool (or another component, by name) may reach, the document's own "
             "URLs added (repeatable; docs/sandbox.md). A bundle's list is sealed in it."))
    secrets: tuple[str, ...] = field(default=(), metadata=about(
        kind="texts", flag="--secret", metavar="NAME=ENV@HOST", group=SANDBOX,
        help="With documents, under --safe: a tool's $NAME is a placeholder the egress proxy replaces by ENV's "
             "value in requests to HOST alone (repeatable; docs/sandbox.md)."))
    require_isolation: str | None = field(default=None, metadata=about(
        kind="text", flag="--require-isolation", metavar="LEVEL", group=SANDBOX, shown="none",
        help="Refuse the run unless its tools get this isolation here: sandbox (--safe works) or netns (also a "
             "network namespace per call: --deny-net, or a bundle's egress allow-list and its proxy)."))
    plugins: tuple[Path, ...] = field(default=(), metadata=about(
        kind="paths", flag="--plugin", metavar="MANIFEST", group=PLUGINS,
        help="A plugin's plugin.json (repeatable; with a bundle, after its own)."))
    plugin_configs: tuple[str, ...] = field(default=(), metadata=about(
        kind="texts", flag="--plugin-config", metavar="TYPE=JSON|@FILE", group=PLUGINS,
        help="Settings of a plugin component type, checked against its configSchema (repeatable)."))
    plugin_timeout: float = field(default=PLUGIN_TIMEOUT_S, metadata=about(
        kind="duration", flag="--plugin-timeout", metavar="DURATION", minimum=0.001, group=PLUGINS,
        help="Time a plugin call may stay silent before it is cancelled and the plugin killed."))
    max_node_attempts: int = field(default=MAX_NODE_ATTEMPTS, metadata=about(
        kind="int", flag="--max-node-attempts", metavar="N", minimum=1, group=PLUGINS,
        help="Times a node may run when a nodeError plugin asks to retry it."))
    discover_tools: bool = field(default=False, metadata=about(
        kind="flag", flag="--discover-tools", group=PLUGINS,
        help="Start each plugin whose manifest declares discoverTools and ask it which tools it serves; they "
             "join its manifest's tools (without this, a plugin's tools are those its manifest lists)."))

    strict: bool = field(default=False, metadata=about(
        kind="flag", flag="--strict", group=SOURCE,
        help="Refuse a document with a field the specification does not define for its component (without it, "
             "such a field is not read, with a warning naming it)."))

    session_store: str | None = field(default=None, metadata=about(
        kind="text", flag="--session-store", metavar="STORE", group=SESSIONS,
        shown="sqlite for heddle run; none for heddle-server (stateless)",
        help="Where sessions are kept: sqlite (one file), file (a folder), a postgres:// URL (shared by several "
             "servers), or plugin:NAME (a loaded plugin's store)."))
    session_db: Path | None = field(default=None, metadata=about(
        kind="path", flag="--session-db", metavar="PATH", group=SESSIONS,
        shown="$XDG_DATA_HOME/heddle/sessions.db", help="The file of the sqlite session store."))
    session_dir: Path | None = field(default=None, metadata=about(
        kind="path", flag="--session-dir", metavar="DIR", group=SESSIONS,
        shown="$XDG_DATA_HOME/heddle/sessions", help="The folder of the file session store."))
    session_key: Path | None = field(default=None, metadata=about(
        kind="path", flag="--session-key", metavar="FILE", group=SESSIONS,
        shown="$HEDDLE_SESSION_KEY; for sqlite and file, else $XDG_CONFIG_HOME/heddle/session.key (made on first use)",
        help="A file (0600) holding the key session records are authenticated with, at least 32 bytes; every server "
             "sharing a postgres:// or plugin store needs the same one."))
    durable: bool = field(default=False, metadata=about(
        kind="flag", flag="--durable", server=False, group=SESSIONS,
        help="In a session, write the run's checkpoint after every node, so that a run that was killed continues "
             "with --resume."))
    session_lease: float = field(default=LEASE_SECONDS, metadata=about(
        kind="duration", flag="--session-lease", metavar="DURATION", minimum=0.1, group=SESSIONS,
        help="How long a run in a session stays its process's after that process was last heard from: the "
             "process renews it every third of it while it runs, and another may take the run over (--resume, or "
             "a server's --recover) only once it has expired or, on the same host, the process is gone."))
    otel_capture_content: bool = field(default=False, metadata=about(
        kind="flag", flag="--otel-capture-content", group=OBSERVABILITY,
        help="Record prompts, answers, tool arguments and outputs (and error messages) in the run's trace spans, "
             "when OTEL_EXPORTER_OTLP_ENDPOINT names a collector; without it spans carry names, sizes and timings."))

    def __post_init__(self) -> None:
        # A library caller may pass lists; the settings stay hashable and immutable.
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
        if any(isinstance(m, str) for m in self.mounts):
            from heddle.workspace.mounts import parse_mount

            # Syntax now, so a bad --mount is refused before a bundle is opened or a data folder made.
            for mount in self.mounts:
                if isinstance(mount, str):
                    parse_mount(mount)
        if self.model_urls:
            from heddle.model.endpoints import parse_model_urls

            parse_model_urls(self.model_urls)
        problems = [p for s in SETTINGS if (p := s.problem(getattr(self, s.name))) is not None]
        if problems:
            raise UsageError(problems[0])

    def _model_urls(self) -> dict[str, str]:
        if not self.model_urls:
            return {}
        from heddle.model.endpoints import parse_model_urls

        return parse_model_urls(self.model_urls)

    @property
    def sandbox_flags(self) -> tuple[str, ...]:
        """Safe-only flags the policy cannot show by itself: `--sandbox auto` given explicitly."""
        return ("--sandbox",) if self.sandbox is not None else ()

    def run_options(self, *, surface: Surface | None = None) -> RunOptions:
        """The engine's RunOptions for these settings; messages name `surface`'s flags and units."""
        from heddle.workspace.mounts import Mount, parse_mount
        from heddle.workspace.sandbox import SandboxPolicy
        from heddle.workspace.workspace import WorkspaceOptions

        mounts = tuple(m if isinstance(m, Mount) else parse_mount(m) for m in self.mounts)
        return RunOptions(
            max_iterations=self.max_iterations, max_tool_rounds=self.max_tool_rounds, max_parallel=self.max_parallel,
            timeout=self.timeout,
            tool_timeout=self.tool_timeout, tool_output_limit=self.tool_output_limit, stream=self.stream,
            model_timeout=self.model_timeout, model_deadline=self.model_deadline,
            max_response_bytes=self.max_response_bytes, max_tool_stdout_bytes=self.max_tool_stdout_bytes,
            model_retries=self.model_retries, surface=surface or CLI, model_urls=self._model_urls(),
            workspace=WorkspaceOptions(mounts=mounts, keep_root=self.workspace, mount_tools=self.mount_tools,
                                       max_entries=self.mount_max_entries, max_bytes=self.mount_max_bytes),
            sandbox=SandboxPolicy(safe=self.safe, backend=self.sandbox or "auto", allow_read=self.allow_read,
                                  allow_write=self.allow_write, allow_env=self.allow_env, deny_net=self.deny_net,
                                  require_isolation=self.require_isolation),
        )


SETTINGS: tuple[Setting, ...] = settings_of(RunSettings)
BY_NAME: Mapping[str, Setting] = {s.name: s for s in SETTINGS}

# Taken by both shells beside the run settings: where tools come from and how a bundle is trusted.
TOOLS_DIR = Setting("tools_dir", "path", None, "Folder of tool executables (a tool's name is its file name "
                    "without extension).", "--tools-dir", SOURCE, metavar="DIR", short="-t")
TRUST = Setting("trust", "paths", (), "With a bundle: a public key (.pub) trusted to have signed it "
                "(repeatable).", "--trust", BUNDLES, metavar="KEY.pub")
ALLOW_UNSIGNED = Setting("allow_unsigned", "flag", False, "With a bundle: admit one that carries no signature "
                         "at all.", "--allow-unsigned", BUNDLES)
DATA_DIR = Setting("data_dir", "path", None, "With a bundle: where its rw mounts are seeded and kept.",
                   "--data-dir", BUNDLES, metavar="DIR", shown="a temporary folder")
COMMANDS = Setting("commands", "path", None, "A YAML or JSON file of commands: each a fixed operation of a "
                   "program on this machine, with its version and argv template, that a flow names as a tool.",
                   "--commands", SOURCE, metavar="FILE")
PLAIN_HTTP = Setting("plain_http", "flag", False, "With a bundle reference: speak plain HTTP to a registry or URL "
                     "that is not on this machine (a loopback one always is).", "--plain-http", BUNDLES)
OFFLINE = Setting("offline", "flag", False, "With a bundle reference: ask no registry; a tag is its last "
                  "resolution and the bundle must be in the cache.", "--offline", BUNDLES)
TRANSFER_TIMEOUT = Setting("transfer_timeout", "duration", TRANSFER_TIMEOUT_S, "With a bundle reference: time one "
                           "exchange with the registry or URL may take in all, its whole answer read (the tag's "
                           "manifest, the bundle's download).", "--transfer-timeout", BUNDLES, metavar="DURATION",
                           minimum=0.001)
ALLOW_DOWNGRADE = Setting("allow_downgrade", "flag", False, "With a bundle reference by tag or URL: accept a "
                          "bundle signed before (or of a lower release than, or another agent than) the one last "
                          "seen under it here.", "--allow-downgrade", BUNDLES, server=False)
# How hard `heddle bundle` compresses. 3, zstd's own default, packs a tree of mixed files to the size
# `tar | zstd -T0 -3` does, in its time plus the hashing pass; 1 is a quarter faster for 1-4% more
# bytes, 6 and 9 take three to four times as long for 0.5-2% fewer (docs/benchmarks.md, "Bundles").
# Levels past 19 also take far more memory per compression thread.
LEVEL = Setting("level", "int", ZSTD_LEVEL, "zstd compression level of the bundle, 1 (fastest) to 22 (smallest). "
                "The same tree at the same level gives the same bytes on any machine.", "--level", SOURCE,
                metavar="N", minimum=ZSTD_MIN_LEVEL, server=False, maximum=ZSTD_MAX_LEVEL)
# What a shell writes on stderr (heddle run: its notes, warnings and errors; heddle-server: its log).
LOG_FORMAT = Setting("log_format", "text", "text", "How lines on stderr are written: text, or json (one object a "
                     "line, for a log collector).", "--log-format", OBSERVABILITY, metavar="text|json")
LOG_LEVEL = Setting("log_level", "text", "info", "The least severe lines written on stderr: debug, info, warning or "
                    "error.", "--log-level", OBSERVABILITY, metavar="LEVEL")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


def check_log(log_format: str, log_level: str) -> None:
    """UsageError naming the flag when `--log-format` or `--log-level` is not one it takes."""
    for spec, value, allowed in ((LOG_FORMAT, log_format, LOG_FORMATS), (LOG_LEVEL, log_level, LOG_LEVELS)):
        if value not in allowed:
            raise UsageError(f"{spec.flag} {value!r}: use {' or '.join(allowed)}")
SHELL_SETTINGS: tuple[Setting, ...] = (TOOLS_DIR, COMMANDS, TRUST, ALLOW_UNSIGNED, DATA_DIR, PLAIN_HTTP, OFFLINE,
                                       ALLOW_DOWNGRADE, TRANSFER_TIMEOUT, LOG_FORMAT, LOG_LEVEL)
# Taken by `heddle bundle` alone: how a bundle is written, not how anything runs.
PACK_SETTINGS: tuple[Setting, ...] = (LEVEL,)


def explicit(settings: RunSettings) -> frozenset[str]:
    """The names of the settings that differ from their defaults (so were surely set by someone)."""
    return frozenset(s.name for s in SETTINGS if getattr(settings, s.name) != s.default)


def settle(settings: RunSettings, proposals: Any = None, *, given: Collection[str] | None = None,
           mounts: Sequence[Mount] = (), plugins: Iterable[Path] = ()) -> RunSettings:
    """The settings a run of a bundle uses: the bundle proposes, the command line disposes.

    A setting `given` explicitly (by name; also any that differs from its default) keeps its value;
    otherwise the bundle's proposal (a `Proposals`, a mapping, or None) replaces the default. The
    bundle's own `mounts` and `plugins` come before those given. Both shells call this one."""
    chosen = explicit(settings) | frozenset(given or ())
    if proposals is None:
        proposed: Mapping[str, Any] = {}
    elif isinstance(proposals, Mapping):
        proposed = proposals
    else:
        proposed = {f.name: getattr(proposals, f.name) for f in dataclasses.fields(proposals)}
    changes: dict[str, Any] = {}
    for name, value in proposed.items():
        spec = BY_NAME.get(name)
        if spec is None:
            # A proposal this heddle cannot apply must not be silently dropped.
            raise UsageError(f"the bundle proposes {name!r}, which this heddle does not know; upgrade heddle")
        if value is None or name in chosen:
            continue
        changes[name] = parse_rounds(value) if spec.kind == "rounds" else value
    if mounts:
        changes["mounts"] = (*mounts, *settings.mounts)
    plugins = tuple(plugins)
    if plugins:
        changes["plugins"] = (*plugins, *settings.plugins)
    return dataclasses.replace(settings, **changes) if changes else settings
