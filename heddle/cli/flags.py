"""`heddle`'s options for the run settings, generated from the table in heddle.settings.

A command lists the settings it takes with `@takes(...)`; the options, their defaults, metavars,
help and groups come from the table, and the command receives the values read as one
`RunSettings` (`settings=`) with the names given on the command line (`given=`), plus any shell
setting (`tools_dir`, `trust`, ...) under its own name. Only typer and heddle.settings are
imported, so `heddle --help` stays fast.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from heddle.cli import resume_collector
from heddle.cli.convert import quicken
from heddle.settings import BY_NAME, PACK_SETTINGS, SHELL_SETTINGS, RunSettings, Setting

# How a command that reads a document finds and reads it (run, validate, bundle, tools).
FORMAT = typer.Option(None, "--format", metavar="json|yaml",
                      help="Force the flow's format: json or yaml (default: by extension).")
COMPONENTS = typer.Option(None, "--components", metavar="FILE", dir_okay=False,
                          help="Read the document's shared components ($referenced_components) from FILE too, as "
                               "a disaggregated configuration does.")
FLOW = typer.Option(None, "--flow", metavar="PATH", dir_okay=False,
                    help="Read PATH as a flow document whatever its name (instead of the FLOW|BUNDLE argument).")

F = TypeVar("F", bound=Callable[..., Any])

_SHELL: Mapping[str, Setting] = {s.name: s for s in (*SHELL_SETTINGS, *PACK_SETTINGS)}
_TITLES: Mapping[str, str] = {"limits": "Limits", "workspaces": "Workspaces", "sandbox": "Sandbox",
                              "bundles": "With a bundle", "plugins": "Plugins", "models": "Models",
                              "sessions": "Sessions"}
_ORDER = ("Options", *_TITLES.values())
_CTX = "heddle_click_context"
# Set (to True) on a command function that calls heddle.cli.resume_collector itself.
RESUMES_COLLECTOR = "heddle_resumes_collector"
_TYPE = re.compile(r" <[^>]*>$")


def _spec(name: str) -> Setting:
    spec = BY_NAME.get(name) or _SHELL.get(name)
    if spec is None or not spec.cli or spec.flag is None:
        raise LookupError(f"{name!r} is not a setting heddle's command line takes")
    return spec


def _option(spec: Setting, help_text: str | None) -> tuple[Any, Any]:
    """(annotation, typer.Option) for one setting."""
    assert spec.flag is not None
    names = [spec.flag] if spec.short is None else [spec.flag, spec.short]
    panel = _TITLES.get(spec.group)
    text = help_text or spec.help_for("s")
    shown = spec.show_default() if help_text is None else None
    if shown is not None:
        # Written here rather than by typer, which puts a text default in parentheses.
        text = f"{text}  [default: {shown}]"
    if spec.kind in ("flag", "switch"):
        default = spec.default if spec.kind == "switch" else False
        return bool, typer.Option(default, *names, help=text, rich_help_panel=panel, show_default=False)
    if spec.kind in ("paths", "texts"):
        kind = list[Path] if spec.kind == "paths" else list[str]
        return kind, typer.Option([], *names, metavar=spec.metavar, help=text, rich_help_panel=panel,
                                  show_default=False)
    if spec.kind == "path":
        return Path | None, typer.Option(None, *names, metavar=spec.metavar, help=text, rich_help_panel=panel,
                                         show_default=False)
    # Numbers and durations are read by the table's own reader, as the server reads them.
    return str | None, typer.Option(None, *names, metavar=spec.metavar, help=text, rich_help_panel=panel,
                                    show_default=False)


def _value(spec: Setting, raw: Any) -> Any:

    if spec.kind == "flag":
        return not spec.default
    if spec.kind in ("paths", "texts"):
        return tuple(raw)
    if spec.kind in ("switch", "path"):
        return raw
    value, note = spec.parse(str(raw), plain="s")
    if note is not None:
        sys.stderr.write(f"note: {note}\n")
    return value


def takes(*names: str, help: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """Give a command the options of these settings (see the module docstring).

    `help` replaces a setting's help text for this command (and hides its default), for a
    command that takes a setting in another sense, as `bundle` records a proposal."""
    specs = [_spec(name) for name in names]
    overrides = dict(help or {})

    def decorate(command: F) -> F:
        own = [p for p in inspect.signature(command).parameters.values()
               if p.name not in ("settings", "given") and p.name not in names]
        hints = typing.get_type_hints(command)
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
                  for p in own]
        for spec in specs:
            annotation, option = _option(spec, overrides.get(spec.name))
            params.append(inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                            annotation=annotation))
        params.append(inspect.Parameter(_CTX, inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context))
        wants = inspect.signature(command).parameters

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            ctx = kwargs.pop(_CTX)
            values: dict[str, Any] = {}
            given: set[str] = set()
            for spec in specs:
                raw = kwargs.pop(spec.name)
                source = ctx.get_parameter_source(spec.name)
                explicit = source is not None and source.name != "DEFAULT"
                if spec.name in _SHELL:
                    kwargs[spec.name] = raw
                elif explicit:
                    given.add(spec.name)
                    values[spec.name] = _value(spec, raw)
            if "settings" in wants:
                kwargs["settings"] = RunSettings(**values)
            if "given" in wants:
                kwargs["given"] = frozenset(given)
            return command(**kwargs)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


class QuickCommand(TyperCommand):
    """A command whose options are read without a pydantic validator each (heddle.cli.convert)."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        quicken(params)
        return params

    def invoke(self, ctx: Any) -> Any:
        # The collector main() paused comes back on as the command's body starts, unless the command
        # turns it on itself, later (`heddle run`, once its document is read: `resumes_collector`).
        if not getattr(self.callback, RESUMES_COLLECTOR, False):
            resume_collector()
        return super().invoke(ctx)


class SettingsCommand(QuickCommand):
    """A command whose help lists its options in the table's groups, in one order for every command."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args: list[tuple[str, str]] = []
        groups: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            # typer adds the Python type (`<path>`, `<list[Path]>`) after a name; a person needs the metavar.
            name, text = record
            if _TYPE.search(name):
                name = _TYPE.sub("", name) if param.param_type_name == "argument" or param.metavar else \
                    _TYPE.sub(" " + (param.name or "value").upper(), name)
            if param.param_type_name == "argument":
                args.append((name, text))
            else:
                groups.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append((name, text))
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        for title in sorted(groups, key=lambda t: _ORDER.index(t) if t in _ORDER else len(_ORDER)):
            with formatter.section(title):
                formatter.write_dl(groups[title])


class SummaryGroup(TyperGroup):
    """A command group that lists each command's summary whole: its short_help, else its first
    sentence, never cut with "..." (long ones wrap). Its options and its commands' are read as
    QuickCommand's are."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        quicken(params)
        return params

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if type(command) is TyperCommand:
            # A sub-app's command declared without cls=: the same command with QuickCommand's reading.
            command.__class__ = QuickCommand
        return command

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows: list[tuple[str, str]] = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is None or command.hidden:
                continue
            rows.append((name, command.get_short_help_str(limit=1 << 16)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
