"""Reading heddle's option values without building a pydantic validator for each option.

typer (0.29 and later) converts every parameter's value through a pydantic TypeAdapter it builds
when the parameter is first processed, given or not: importing pydantic and building some forty
adapters is most of what `heddle run --help` costs. Our options are str, bool and Path values
(alone or repeated), for which the value typer would produce is known: the value itself, or the
Path typer's own path checks return. `quicken` gives such a parameter a converter that produces
exactly that, and hands any other value (and any value whose checks fail, so that the error is
typer's own, word for word) to the adapter typer would have used, built then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast, get_args, get_origin

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
