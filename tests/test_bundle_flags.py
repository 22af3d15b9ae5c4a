"""How a command fetches, trusts and opens a sealed bundle is one group of settings (heddle.cli.flags.
BundleFlags), declared once: `heddle run` and `heddle mcp` take it whole, with the same options."""

from __future__ import annotations

import inspect

import typer

from heddle.cli.flags import BUNDLE_FLAGS, BundleFlags
from heddle.cli import app
from heddle.settings import BY_NAME, SHELL_SETTINGS


def _options(command: str) -> dict[str, tuple[object, ...]]:
    group = typer.main.get_command(app)
    params = group.commands[command].params  # type: ignore[attr-defined]
    return {p.name: (tuple(p.opts), p.metavar, p.help, p.default, p.multiple) for p in params}


def test_run_and_mcp_take_the_bundle_flags_once_and_the_same() -> None:
    from heddle.cli.mcp import mcp
    from heddle.cli.run import run

    names = {s.name for s in SHELL_SETTINGS} | set(BY_NAME)
    assert set(BUNDLE_FLAGS) <= names  # every one a setting of the table
    run_options, mcp_options = _options("run"), _options("mcp")
    for name in BUNDLE_FLAGS:
        assert run_options[name] == mcp_options[name], name
    for command in (run, mcp):
        # The command's own signature names the group, not its members one by one.
        own = inspect.signature(inspect.unwrap(command)).parameters
        assert not set(BUNDLE_FLAGS) & set(own), command.__name__
        assert [p.name for p in own.values() if p.annotation in (BundleFlags, "BundleFlags")] == ["bundle_flags"]
