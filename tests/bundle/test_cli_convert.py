"""heddle's options read without a pydantic validator each (heddle.shell_options) give what typer's
own conversion gives: the same values, and for a value typer refuses, typer's own error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("typer._coercion")

from typer._click import Context
from typer._click.exceptions import BadParameter
from typer._coercion import build_runtime_param

from heddle.cli.root import load_command
from heddle.shell_options import quicken


def _outcome(runtime: Any, param: Any, ctx: Context, value: Any) -> tuple[str, Any]:
    try:
        return "value", runtime.coerce(value, param=param, ctx=ctx)
    except BadParameter as exc:
        return "error", exc.format_message()


@pytest.mark.parametrize("name", ["run"])
def test_every_quick_option_reads_as_typer_reads_it(name: str, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir").mkdir()
    samples = ["x", "", "-", str(tmp_path / "file"), str(tmp_path / "file") + "/", str(tmp_path / "dir"),
               str(tmp_path / "dir") + "//", str(tmp_path / "none"), None, True, False, 3, b"x"]
    command = load_command(name)
    ctx = Context(command, info_name=name)
    quick = 0
    for param in command.get_params(ctx):
        runtime = param.get_runtime_param()
        if type(runtime).__name__ != "_Quick":
            continue
        quick += 1
        typers = build_runtime_param(param.type_descriptor)
        for sample in samples:
            values: list[Any] = [sample, (sample,), [sample, sample]] if param.multiple else [sample]
            for value in values:
                # A value the quick reader hands to typer makes typer's reader the option's own: start afresh.
                param._runtime_param = None
                quicken([param])
                assert _outcome(param.get_runtime_param(), param, ctx, value) == _outcome(typers, param, ctx, value), \
                    (param.name, value)
    assert quick > 10  # the options are read the cheap way at all
