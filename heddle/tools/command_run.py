"""Running commands (heddle.tools.commands) as the tools a flow names.

A run with commands is prepared with `with_commands(plugins, commands, flow)`: its Plugins with
the commands added, so that the graph checks know their names (a command named like a tools-folder
tool, or like a plugin tool that does not shadow it, is refused) and the run's seams offer each as
a tool, after the plugins' own. Everything else (the toolCall seam, the tool events, ToolNodes and
agents) is what every tool goes through.

Each call, in order: the arguments checked against the command's input schema (and every number
finite, no undeclared argument, no value that would start an argument with a "-" its schema does
not admit); then the program pinned when the file was read (or sealed) proved to be the same
bytes by its sha256 (a stat per call, hashing again only when the file changed), or the call
fails closed naming both digests; then the version probe, `[program, *version_probe]` with an
empty environment, whose trimmed stdout must equal `expected_version` with exit status 0, or the
call fails closed naming both versions; then the program itself, with the argv rendered (one
argument per entry, no shell), an environment of `HEDDLE_WORKSPACE` (and in a session `HEDDLE_IDEMPOTENCY_KEY`) alone,
in the workspace or the bundle's folder, its process group killed at `timeout_seconds` (or `--tool-timeout`, when
shorter), and under `--safe` in the same sandbox as a tool.

Telemetry shows a command's name, revision, duration and exit code, never its arguments or
output: its tool_call and tool_result events carry `ToolTelemetry` forms instead, and so do the
node_start and node_complete events of a ToolNode that calls it. The model, and the flow's state,
still get the output. Errors name the exit status and never quote what the command printed.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec.walk import of_type
from heddle.blocking import PROGRAM_CHECKS, run_blocking
from heddle.engine import events as ev
from heddle.engine.seams import IDEMPOTENCY_ENV, NO_PLUGINS, SeamsLayer
from heddle.errors import ToolError, ToolInputError
from heddle.safeparse import ParseLimitError, loads_strict_json
from heddle.tools.commands import MULTI_CALL, SYSTEM_PATH, Command, CommandSet, program_digest, program_kind
from heddle.tools.process import run_process
from heddle.workspace.egress_proxy import call_guard
from heddle.workspace.sandbox import confine

if TYPE_CHECKING:
    from heddle.engine.context import RunContext
    from heddle.engine.options import RunOptions
    from heddle.engine.seams import (
        Plugins,
        ProvidedTool,
        Rendering,
        RunSeams,
        ToolRequest,
    )
    from heddle.tools.process import Exited
    from heddle.workspace.workspace import Workspace

# What a redacted event field holds instead of the arguments or output.
REDACTED = {"redacted": True}
# Most characters of a version an error message shows.
VERSION_SHOWN = 200


class CommandError(ToolError):
    """A command call failed; `status` is the command's exit status when it ran to one (never
    heddle's own `exit_code`)."""

    def __init__(self, tool: str, message: str, *, status: int | None = None) -> None:
        super().__init__(tool, message)
        self.status = status


def with_commands(plugins: Plugins | None, commands: CommandSet | None, flow: c.Flow) -> Plugins | None:
    """`plugins` (None: none) with `commands` added, for preparing a run of `flow`."""
    if commands is None or not len(commands):
        return plugins
    return CommandPlugins(plugins or NO_PLUGINS, commands, flow)


def warm(commands: CommandSet) -> None:
    """Hash each pinned program now, at the start of a run, so that a call only stats it; what
    cannot be read is left for the call to report."""
    for command in commands:
        if command.program is not None:
            try:
                program_digest(command.program.path)
            except OSError:
                pass


class CommandPlugins:
    """A run's Plugins with commands beside them (heddle.engine.seams.Plugins)."""

    def __init__(self, inner: Plugins, commands: CommandSet, flow: c.Flow) -> None:
        self.inner = inner
        self.commands = commands
        # A ToolNode's inputs and outputs are its tool's arguments and output.
        self.tool_nodes = frozenset(node.name for _, node in of_type(flow, c.ToolNode)
                                    if node.tool.name in commands.commands)
        warm(commands)

    def known_tools(self, tools: Mapping[str, Path]) -> dict[str, Path]:
        return self.inner.known_tools(self.commands.known(tools))

    def check_flow(self, flow: c.Flow) -> list[str]:
        return [*self.inner.check_flow(flow), *self.commands.problems(flow)]

    def with_files(self, options: RunOptions) -> RunOptions:
        return self.inner.with_files(options)

    def start_run(self, ctx: RunContext, rendering: Rendering | None) -> RunSeams:
        return CommandSeams(self.inner.start_run(ctx, rendering), self, ctx)


class CommandSeams(SeamsLayer):
    """The seams of one run with commands: the inner seams', with each command offered as a tool
    after theirs, and the events of command calls redacted before anything sees them."""

    def __init__(self, inner: RunSeams, plugins: CommandPlugins, ctx: RunContext) -> None:
        super().__init__(inner)
        self.plugins = plugins
        self.ctx = ctx

    def tool(self, name: str) -> ProvidedTool | None:
        found = self.inner.tool(name)
        if found is not None:
            return found
        command = self.plugins.commands.commands.get(name)
        return CommandTool(command, self.plugins.commands, self.ctx) if command is not None else None

    def event(self, event: ev.Event, next: ev.EventSink) -> None:
        if isinstance(event, ev.NodeStart | ev.NodeComplete) and event.node_type == "ToolNode" \
                and event.node in self.plugins.tool_nodes:
            if isinstance(event, ev.NodeStart):
                event = dataclasses.replace(event, inputs=dict(REDACTED))
            else:
                event = dataclasses.replace(event, outputs=dict(REDACTED))
        self.inner.event(event, next)


class CommandTool:
    """One command as a run's tool (heddle.engine.seams.ProvidedTool), and what its events show."""

    def __init__(self, command: Command, commands: CommandSet, ctx: RunContext) -> None:
        self.command = command
        self.commands = commands
        self.ctx = ctx

    @property
    def telemetry(self) -> CommandTool:
        return self

    # ---------------------------------------------------------------- telemetry

    def arguments(self, arguments: dict[str, Any]) -> Any:
        return {**REDACTED, "revision": self.command.revision}

    def output(self, output: dict[str, Any]) -> Any:
        code = output.get("exit_code") if self.command.output == "text" else 0
        return {**REDACTED, "revision": self.command.revision, "exit_code": code if isinstance(code, int) else None}

    def failure(self, error: Exception) -> Any:
        return {**REDACTED, "revision": self.command.revision, "exit_code": getattr(error, "status", None),
                "error": str(error)}

    # ---------------------------------------------------------------- the call

    def check(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The arguments with defaults filled in, or ToolInputError naming what is wrong (by name and
        rule, never by value: arguments stay out of errors too)."""
        import copy

        import jsonschema

        command = self.command
        if not isinstance(arguments, dict):
            raise ToolInputError(command.name, f"the arguments must be a JSON object, not {type(arguments).__name__}")
        properties = command.properties
        if any(key not in properties for key in arguments):
            raise ToolInputError(command.name, "an argument is not one its input_schema declares (it declares: "
                                 + (", ".join(sorted(properties)) or "none") + ")")
        validator = jsonschema.Draft202012Validator(command.input_schema,
                                                    format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
        errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
        if errors:
            described = []
            for err in errors[:5]:
                where = "/".join(str(p) for p in err.path) or "(the arguments)"
                described.append(f"{where} does not satisfy {err.validator} {_compact(err.validator_value)}")
            raise ToolInputError(command.name, f"the arguments do not match its input_schema: {'; '.join(described)}")
        filled = copy.deepcopy(arguments)
        for name, prop in properties.items():
            if name not in filled and "default" in prop:
                filled[name] = copy.deepcopy(prop["default"])
        for name, value in filled.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ToolInputError(command.name, f"argument {name!r} is not a finite number")
            if isinstance(value, str) and "\x00" in value:
                raise ToolInputError(command.name, f"argument {name!r} holds a NUL character, which no program "
                                     "argument can")
        option = command.option_field(filled)
        if option is not None:
            raise ToolInputError(command.name, f"argument {option!r} starts with '-', so {command.executable} would "
                                 "read it as an option; give a value that does not (its input_schema admits a "
                                 "leading '-' only by a pattern starting ^-, a const or an enum)")
        return filled

    async def run(self, request: ToolRequest) -> dict[str, Any]:
        command = self.command
        if command.option_field(request.arguments) is not None:  # a seam that changed them after check
            self.check(request.arguments)
        program = await run_blocking(PROGRAM_CHECKS, self._program)
        workspace = request.workspace
        in_bundle = command.working_directory == "bundle"
        cwd = self.commands.folder if in_bundle else workspace.root
        await self._probe(program, workspace, cwd, in_bundle)
        argv = [program, *command.render(request.arguments)]
        # Its environment is made here, never inherited: the key is there in a session alone.
        key = {IDEMPOTENCY_ENV: request.idempotency_key} if request.idempotency_key else {}
        done = await self._start(argv, {"HEDDLE_WORKSPACE": str(workspace.root), **key}, workspace, cwd, in_bundle)
        return self._result(done)

    def _program(self) -> str:
        """The pinned program's path, once its bytes are proved to be those pinned (sealed in the
        bundle, or hashed when the commands file was read): stat, and sha256 again only when the
        file is not the one last hashed (heddle.tools.commands.program_digest)."""
        command = self.command
        pin = command.program
        if pin is None:
            raise CommandError(command.name, f"its executable {command.executable!r} is in none of "
                               f"{':'.join(SYSTEM_PATH)}; the call was not made (install it there)")
        when = "sealed" if pin.sealed else "pinned when its commands file was read"
        try:
            found = program_digest(pin.path)
        except OSError as exc:
            raise CommandError(command.name, f"its program {pin.path} (sha256 {pin.sha256}, {when}) cannot be read: "
                               f"{exc.strerror}; the call was not made") from None
        if found != pin.sha256:
            raise CommandError(command.name, f"{pin.path} is not the program {when}: sha256 {pin.sha256} expected, "
                               f"{found} found; the call was not made (a program that changed never runs)")
        target = os.path.basename(os.path.realpath(pin.path))
        kind = program_kind(target)
        if kind is not None and target not in MULTI_CALL:
            raise CommandError(command.name, f"its executable {pin.path} is {target}, {kind}; the call was not made "
                               f"(name the program itself in {command.source})")
        return pin.path

    def _limit(self) -> tuple[float, str, str]:
        """The call's time limit, as the shell shows it, and how to raise it."""
        command, options = self.command, self.ctx.options
        if options.tool_timeout is not None and options.tool_timeout < command.timeout_seconds:
            limit, hint = options.tool_timeout, f"raise {options.surface.flag('tool_timeout')} if it needs longer"
        else:
            limit, hint = command.timeout_seconds, f"raise its timeout_seconds in {command.source} if it needs longer"
        return limit, options.surface.duration(limit), hint

    async def _start(self, argv: list[str], env: dict[str, str], workspace: Workspace, cwd: Path,
                     in_bundle: bool) -> Exited:
        policy = self.ctx.options.sandbox
        async with call_guard(self.ctx.options, self.command.name, self.ctx.emit, runner=True) as egress:
            # The bundle's folder is bound read-only in the sandbox, where the call then starts.
            argv, env = confine(policy, argv, workspace=workspace, tools_dir=cwd if in_bundle else None, env=env,
                                chdir=cwd if in_bundle else None, egress=egress)
            limit, shown, hint = self._limit()
            return await run_process(self.command.name, argv, b"", cwd=cwd, env=env, timeout=limit,
                                     sandboxed=policy.safe, timeout_hint=hint, timeout_text=shown,
                                     netns=egress.runner if egress is not None else None)

    async def _probe(self, program: str, workspace: Workspace, cwd: Path, in_bundle: bool) -> None:
        """Fail closed unless the program reports the expected version."""
        command = self.command
        probe = " ".join([program, *command.version_probe])
        done = await self._start([program, *command.version_probe], {}, workspace, cwd, in_bundle)
        expected = command.expected_version
        if done.returncode != 0:
            how = f"was killed by signal {-done.returncode}" if done.returncode < 0 else \
                f"exited with status {done.returncode}"
            raise CommandError(command.name, f"its version probe ({probe}) {how}, so no version was found (expected "
                               f"{_shown(expected)}); the call was not made")
        try:
            found = done.stdout.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise CommandError(command.name, f"its version probe ({probe}) printed bytes that are not UTF-8 (expected "
                               f"{_shown(expected)}); the call was not made") from None
        if found != expected:
            raise CommandError(command.name, f"{program} is not the version it was declared with: "
                               f"{_difference(expected, found)}; the call was not made (check the program, then "
                               f"update expected_version in {command.source})")

    def _result(self, done: Exited) -> dict[str, Any]:
        command = self.command
        if done.returncode < 0:
            raise CommandError(command.name, f"was killed by signal {-done.returncode}", status=done.returncode)
        if command.output == "text":
            return {"exit_code": done.returncode, "stdout": self._text(done.stdout, "stdout", done.returncode),
                    "stderr": self._text(done.stderr, "stderr", done.returncode)}
        if done.returncode != 0:
            raise CommandError(command.name, f"exited with status {done.returncode} (what it printed is not shown: "
                               "a command's output stays out of errors; with output: text the model gets its exit "
                               "code, stdout and stderr)", status=done.returncode)
        return self._json(done.stdout)

    def _text(self, data: bytes, stream: str, status: int) -> str:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise CommandError(self.command.name, f"printed {len(data)} bytes on {stream} that are not UTF-8 text; "
                               "its output goes to the model as text", status=status) from None

    def _json(self, data: bytes) -> dict[str, Any]:
        name = self.command.name
        try:
            value = loads_strict_json(data.decode("utf-8"))
        except ParseLimitError as exc:
            raise CommandError(name, f"printed JSON on stdout that {exc}", status=0) from None
        except ValueError:
            raise CommandError(name, f"printed {len(data)} bytes on stdout that are not one JSON object (output: "
                               "json); print one object, or declare output: text", status=0) from None
        if not isinstance(value, dict):
            raise CommandError(name, f"printed a JSON {type(value).__name__} on stdout, not one object (output: json)",
                               status=0)
        return value


def _compact(value: Any) -> str:
    import json

    text = json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= 80 else text[:77] + "..."


def _shown(text: str) -> str:
    """A version as one line of a message."""
    import json

    if len(text) > VERSION_SHOWN:
        text = text[:VERSION_SHOWN] + "..."
    return json.dumps(text, ensure_ascii=False)


def _difference(expected: str, found: str) -> str:
    """Where two versions differ, on one line: both whole when they are one line each, else the
    first line that differs."""
    if not found:
        return f"expected version {_shown(expected)}, found nothing on stdout"
    want, got = expected.splitlines(), found.splitlines()
    if len(want) == 1 and len(got) == 1:
        return f"expected version {_shown(expected)}, found {_shown(found)}"
    for number, (a, b) in enumerate(zip(want, got, strict=False), start=1):
        if a != b:
            return f"expected version line {number} {_shown(a)}, found {_shown(b)}"
    number = min(len(want), len(got)) + 1
    return (f"expected version has {len(want)} lines and the probe printed {len(got)}; at line {number} expected "
            f"{_shown(want[number - 1]) if number <= len(want) else 'nothing'}, found "
            f"{_shown(got[number - 1]) if number <= len(got) else 'nothing'}")
