"""The `heddle` typer app, whose commands are imported only when they are used.

`heddle --help` lists every command from `COMMANDS` (name -> module, attribute, summary) without
importing a command's module; `heddle run ...` imports heddle.cli.run and builds that one
command's options, nothing else. Shell completion asks the same group, so it loads the command
being completed only.
"""

from __future__ import annotations

import os
from collections.abc import KeysView
from typing import Any, NamedTuple

import typer

from heddle import __version__
from heddle.cli.flags import SettingsCommand, SummaryGroup


class Lazy(NamedTuple):
    module: str
    attribute: str  # a command function, or a typer.Typer for a group of commands
    summary: str


# In the order `heddle --help` lists them.
COMMANDS: dict[str, Lazy] = {
    "run": Lazy("heddle.cli.run", "run", "Run a flow or a sealed bundle and print its final state."),
    "validate": Lazy("heddle.cli.run", "validate", "Check a flow or a bundle without running it."),
    "tools": Lazy("heddle.cli.tools", "tools", "List the tools a run would have, with their schema fingerprints."),
    "bundle": Lazy("heddle.cli.run", "bundle", "Seal a flow, its tools, mounts and plugins into a .heddle file."),
    "init": Lazy("heddle.cli.run", "init", "Write a starter agent that runs as printed."),
    "mcp": Lazy("heddle.cli.mcp", "mcp", "Serve a sealed bundle's agent as an MCP tool over stdio."),
    "sessions": Lazy("heddle.cli.sessions", "sessions_app", "List, show and remove the sessions runs keep."),
    "keygen": Lazy("heddle.cli.bundle", "keygen", "Make an Ed25519 signing key pair and print its key id."),
    "sign": Lazy("heddle.cli.bundle", "sign", "Add a signature to a bundle."),
    "verify": Lazy("heddle.cli.bundle", "verify", "Prove a bundle is what a trusted key sealed."),
    "inspect": Lazy("heddle.cli.bundle", "inspect", "Show a bundle's manifest, files and tools without unpacking it."),
    "diff": Lazy("heddle.cli.bundle", "diff", "Show what differs between two bundles."),
    "doctor": Lazy("heddle.cli.bundle", "doctor", "Check that this machine has what a bundle needs."),
    "push": Lazy("heddle.cli.registry", "push", "Push a bundle to an OCI registry."),
    "pull": Lazy("heddle.cli.registry", "pull", "Download a bundle from an OCI registry or a URL."),
    "trust": Lazy("heddle.cli.bundle", "trust_app", "The keys this user trusts to sign bundles."),
    "cache": Lazy("heddle.cli.bundle", "cache_app", "The cache of verified payloads."),
    "model": Lazy("heddle.cli.model", "model_app", "Serve a scripted model for deterministic agent tests."),
}


def load_command(name: str) -> Any:
    """The click command `name` of COMMANDS, built from its module as typer builds any command."""
    entry = COMMANDS[name]
    # By the import statement's own machinery (not importlib.import_module), so that `python -X
    # importtime` counts the command's module and what it imports.
    target = getattr(__import__(entry.module, fromlist=[entry.attribute]), entry.attribute)
    holder = typer.Typer(rich_markup_mode=None, add_completion=False)
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=name, cls=SummaryGroup, short_help=entry.summary)
    else:
        holder.command(name, cls=SettingsCommand, short_help=entry.summary)(target)
    return typer.main.get_group(holder).commands[name]


class _Commands(dict[str, Any]):
    """A group's commands, each built the first time it is looked up."""

    def __missing__(self, name: str) -> Any:
        if name not in COMMANDS:
            raise KeyError(name)
        command = self[name] = load_command(name)
        return command

    def keys(self) -> KeysView[str]:  # type: ignore[override]
        # What typer offers a mistyped command from ("Did you mean 'run'?"): every name, loaded or not.
        return dict.fromkeys([*COMMANDS, *dict.keys(self)]).keys()

    def get(self, name: str, default: Any = None) -> Any:
        try:
            return self[name]
        except KeyError:
            return default


class LazyGroup(SummaryGroup):
    """The root group: lists COMMANDS without importing them and builds one when it is asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _Commands(self.commands)

    def list_commands(self, ctx: Any) -> list[str]:
        # Commands added to the group by hand (none today) come after the table's.
        return [*COMMANDS, *(name for name in self.commands if name not in COMMANDS)]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(name, entry.summary) for name, entry in COMMANDS.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


app = typer.Typer(
    name="heddle",
    cls=LazyGroup,
    help="Seal Agent Spec flows, their tools and files into one signed bundle, and run them.",
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    # `heddle --install-completion` (bash, zsh, fish, PowerShell) and `--show-completion`.
    add_completion=True,
    no_args_is_help=True,
    # NO_COLOR (any value) turns colour off even on a terminal; without it, colour only on one.
    context_settings={"help_option_names": ["-h", "--help"], **({"color": False} if "NO_COLOR" in os.environ else {})},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"heddle {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """Seal Agent Spec flows, their tools and files into one signed bundle, and run them.

    Start with `heddle init DIR`, then `heddle run DIR/flow.yaml --tools-dir DIR/tools`.
    """
