"""The typer options both shells (`heddle`, `heddle-server`) build from the settings table.

One builder, so that a setting's flag, metavar, help, unit and shown default read alike in
`heddle run --help` and `heddle-server --help`: a shell says only which settings it takes, the
unit it reads a plain number of a duration in (`heddle` seconds, `heddle-server` milliseconds, as
each always did, with a deprecation note) and the titles of its help's sections. Only typer and
heddle.settings are imported, so either shell's `--help` stays fast.

Reading the options' values without building a pydantic validator for each (`quicken`): typer
(0.29 and later) converts every parameter's value through a pydantic TypeAdapter it builds when
the parameter is first processed, given or not: importing pydantic and building some forty
adapters is most of what `heddle run --help` costs. Our options are str, bool and Path values
(alone or repeated), for which the value typer would produce is known: the value itself, or the
Path typer's own path checks return. `quicken` gives such a parameter a converter that produces
exactly that, and hands any other value (and any value whose checks fail, so that the error is
typer's own, word for word) to the adapter typer would have used, built then.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args, get_origin

import typer

from heddle.settings import Setting, Unit

# typer adds the Python type (`<path>`, `<list[Path]>`) after a name; a person needs the metavar.
_TYPE = re.compile(r" <[^>]*>$")


def without_pydantic_plugins() -> None:
    """Build this process's pydantic validators without looking for pydantic plugins: for a shell's own
    process only, called before its first validator is built.

    pydantic asks for its plugins as it builds its first validator, by reading the entry points of every
    installed distribution (importing importlib.metadata, email and zipfile on the way): 50 to 80 ms of
    every command that reads a document, where no plugin was ever meant to watch heddle's own models. A
    library caller's process keeps pydantic's behaviour; so does a process that already loaded them."""
    loader = types.ModuleType("pydantic.plugin._loader")
    loader.get_plugins = tuple  # type: ignore[attr-defined]  # no plugins: ()
    sys.modules.setdefault("pydantic.plugin._loader", loader)


def option(spec: Setting, *, plain: Unit, panel: str | None, help_text: str | None = None) -> tuple[Any, Any]:
    """(annotation, typer.Option) for one setting; `help_text` replaces its help (and hides its default)."""
    assert spec.flag is not None
    names = [spec.flag] if spec.short is None else [spec.flag, spec.short]
    text = help_text or spec.help_for(plain)
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
    # Numbers, durations and sizes are read by the table's own reader, with its own messages.
    return str | None, typer.Option(None, *names, metavar=spec.metavar, help=text, rich_help_panel=panel,
                                    show_default=False)


def value(spec: Setting, raw: Any, *, plain: Unit, note: Callable[[str], None]) -> Any:
    """The setting's value from what its option gave (given explicitly); UsageError naming the flag."""
    if spec.kind == "flag":
        return not spec.default
    if spec.kind in ("paths", "texts"):
        return tuple(raw)
    if spec.kind in ("switch", "path"):
        return raw
    parsed, deprecated = spec.parse(str(raw), plain=plain)
    if deprecated is not None:
        note(deprecated)
    return parsed


def format_sections(command: Any, ctx: Any, formatter: Any, order: Sequence[str]) -> None:
    """A command's help: its arguments, then its options under their panels' titles, in `order`
    (a title not in it last); an option without a panel is under "Options"."""
    args: list[tuple[str, str]] = []
    groups: dict[str, list[tuple[str, str]]] = {}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is None:
            continue
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
    for title in sorted(groups, key=lambda t: order.index(t) if t in order else len(order)):
        with formatter.section(title):
            formatter.write_dl(groups[title])


def usage_error_types() -> tuple[type[BaseException], ...]:
    """The exceptions typer raises for a command line it cannot read (an unknown option, with its
    did-you-mean; a missing value). typer >= 0.29 carries its own click; older ones use click's."""
    types: list[type[BaseException]] = []
    try:
        from typer._click.exceptions import ClickException as TyperClick

        types.append(TyperClick)
    except ImportError:
        pass
    try:
        from click.exceptions import ClickException

        types.append(ClickException)
    except ImportError:
        pass
    return tuple(types)


try:
    from typer._click.exceptions import BadParameter
    from typer._coercion import RuntimeParam, build_runtime_param
    from typer._param_types import coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # typer < 0.29 converts with click's own types, which cost nothing to build
    RuntimeParam = None  # type: ignore[assignment,misc]

_MISS = object()
_LEAVES = (str, bool, Path)


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class _Quick(RuntimeParam):
        leaf: type[Any]
        many: bool

        def _one(self, value: Any, param: _TyperParameter, ctx: Any) -> Any:
            # Only the exact types the command line gives; anything else goes to typer's adapter.
            if type(value) is not (str if self.leaf is Path else self.leaf):
                return _MISS
            if self.leaf is Path:
                # What typer's path adapter returns for a str on success: Path(value), checked.
                return coerce_cli_path(Path(value), self.parameter_info, path_type=Path, param=param, ctx=ctx)
            return value

        def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Any) -> Any:
            try:
                if self.many:
                    items = value if isinstance(value, (list, tuple)) else [value]
                    out = [self._one(item, param, ctx) for item in items]
                    quick: Any = _MISS if any(item is _MISS for item in out) else out
                else:
                    quick = self._one(value, param, ctx)
            except (BadParameter, OSError, ValueError):
                quick = _MISS  # typer's adapter says what is wrong, as it would have
            if quick is not _MISS:
                return quick
            full = build_runtime_param(param.type_descriptor)
            param._runtime_param = full
            return full._coerce_value(value, param=param, ctx=ctx)

    def _quick_for(param: _TyperParameter) -> RuntimeParam | None:
        descriptor = param.type_descriptor
        info, annotation = descriptor.parameter_info, cast(Any, descriptor.annotation)
        if info.parser is not None or descriptor.file_annotation is not None:
            return None
        many = get_origin(annotation) is list
        leaf = get_args(annotation)[0] if many else annotation
        if leaf not in _LEAVES or (many and len(get_args(annotation)) != 1):
            return None
        if leaf is Path and (info.allow_dash or info.path_type is not None):
            return None
        if leaf is bool and many:
            return None
        return _Quick(parameter_info=info, annotation=annotation, leaf=leaf, many=many)

    def quicken(params: Iterable[Any]) -> None:
        """Give each of `params` that typer has not converted yet the cheap converter, when one fits."""
        for param in params:
            if isinstance(param, _TyperParameter) and param._runtime_param is None:
                quick = _quick_for(param)
                if quick is not None:
                    param._runtime_param = quick

else:  # pragma: no cover - typer < 0.29

    def quicken(params: Iterable[Any]) -> None:
        """Nothing to do: click's types convert cheaply."""
