"""`heddle`'s options for the run settings, generated from the table in heddle.settings.

A command lists the settings it takes with `@takes(...)`; the options, their defaults, metavars,
help and groups come from the table, and the command receives the values read as one
`RunSettings` (`settings=`) with the names given on the command line (`given=`), plus any shell
setting (`tools_dir`, `trust`, ...) under its own name. Only typer and heddle.settings are
imported, so `heddle --help` stays fast.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from typer.core import TyperCommand, TyperGroup

from heddle.cli.collector import resume_collector
from heddle.settings import BY_NAME, PACK_SETTINGS, SHELL_SETTINGS, RunSettings, Setting
from heddle.shell_options import format_sections, option, quicken, value

if TYPE_CHECKING:
    from heddle.cli.target import Remote
    from heddle.format.trust import TrustPolicy

# How a command that reads a document finds and reads it (run, validate, bundle, tools).
FORMAT = typer.Option(None, "--format", metavar="json|yaml",
                      help="Force the flow's format: json or yaml (default: by extension).")
COMPONENTS = typer.Option(None, "--components", metavar="FILE", dir_okay=False,
                          help="Read the document's shared components ($referenced_components) from FILE too, as "
                               "a disaggregated configuration does.")
FLOW = typer.Option(None, "--flow", metavar="PATH", dir_okay=False,
                    help="Read PATH as a flow document whatever its name (instead of the FLOW|BUNDLE argument).")

F = TypeVar("F", bound=Callable[..., Any])


def bundle_options(trust: list[Path], allow_unsigned: bool, data_dir: Path | None = None) -> list[str]:
    """The options given that only a bundle takes: with any of them the path must be a bundle."""
    return [name for name, given in (("--trust", trust), ("--allow-unsigned", allow_unsigned),
                                     ("--data-dir", data_dir is not None)) if given]


@dataclasses.dataclass(frozen=True)
class BundleFlags:
    """How a command that runs a sealed bundle fetches, trusts and opens it (`heddle run`, `heddle mcp`):
    the settings of these names, which @takes gives the command as one parameter of this type."""

    trust: list[Path]
    allow_unsigned: bool
    data_dir: Path | None
    plain_http: bool
    offline: bool
    allow_downgrade: bool
    transfer_timeout: str | None

    def options(self) -> list[str]:
        return bundle_options(self.trust, self.allow_unsigned, self.data_dir)

    def remote(self) -> Remote:
        from heddle.cli.target import Remote, transfer_seconds

        return Remote(self.plain_http, self.offline, seen=True, allow_downgrade=self.allow_downgrade,
                      timeout=transfer_seconds(self.transfer_timeout))

    def policy(self) -> TrustPolicy:
        from heddle.format.trust import TrustPolicy

        return TrustPolicy.from_names(self.trust, allow_unsigned=self.allow_unsigned)


# Their names, in the order their options are listed.
BUNDLE_FLAGS = tuple(field.name for field in dataclasses.fields(BundleFlags))

_SHELL: Mapping[str, Setting] = {s.name: s for s in (*SHELL_SETTINGS, *PACK_SETTINGS)}
_TITLES: Mapping[str, str] = {"limits": "Limits", "workspaces": "Workspaces", "sandbox": "Sandbox",
                              "bundles": "With a bundle", "plugins": "Plugins", "models": "Models",
                              "sessions": "Sessions"}
_ORDER = ("Options", *_TITLES.values())
_CTX = "heddle_click_context"
# Set (to True) on a command function that calls heddle.cli.collector.resume_collector itself.
RESUMES_COLLECTOR = "heddle_resumes_collector"


def _note(text: str) -> None:
    sys.stderr.write(f"note: {text}\n")


def _spec(name: str) -> Setting:
    spec = BY_NAME.get(name) or _SHELL.get(name)
    if spec is None or not spec.cli or spec.flag is None:
        raise LookupError(f"{name!r} is not a setting heddle's command line takes")
    return spec


def takes(*names: str, help: Mapping[str, str] | None = None) -> Callable[[F], F]:
    """Give a command the options of these settings (see the module docstring).

    `help` replaces a setting's help text for this command (and hides its default), for a
    command that takes a setting in another sense, as `bundle` records a proposal. A parameter
    typed `BundleFlags` receives the settings of BUNDLE_FLAGS (which `names` lists) as one value."""
    specs = [_spec(name) for name in names]
    overrides = dict(help or {})

    def decorate(command: F) -> F:
        hints = typing.get_type_hints(command)
        grouped = [name for name, hint in hints.items() if hint is BundleFlags]
        own = [p for p in inspect.signature(command).parameters.values()
               if p.name not in ("settings", "given", *grouped) and p.name not in names]
        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints.get(p.name, p.annotation))
                  for p in own]
        for spec in specs:
            annotation, typed = option(spec, plain="s", panel=_TITLES.get(spec.group),
                                       help_text=overrides.get(spec.name))
            params.append(inspect.Parameter(spec.name, inspect.Parameter.KEYWORD_ONLY, default=typed,
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
                    values[spec.name] = value(spec, raw, plain="s", note=_note)
            if "settings" in wants:
                kwargs["settings"] = RunSettings(**values)
            if "given" in wants:
                kwargs["given"] = frozenset(given)
            for name in grouped:
                kwargs[name] = BundleFlags(**{flag: kwargs.pop(flag) for flag in BUNDLE_FLAGS})
            return command(**kwargs)

        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        return wrapper  # type: ignore[return-value]

    return decorate


class QuickCommand(TyperCommand):
    """A command whose options are read without a pydantic validator each (heddle.shell_options)."""

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
        format_sections(self, ctx, formatter, _ORDER)


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
