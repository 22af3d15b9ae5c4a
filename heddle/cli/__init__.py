"""The `heddle` command: a thin typer shell over the library.

Only typer and the standard library are imported here at start-up; every command imports what
it needs when it runs, so `heddle --help` stays fast.
"""

from __future__ import annotations

import os
import sys

import typer

from heddle import __version__
from heddle.cli import bundle as bundle_cmds
from heddle.cli import model as model_cmds
from heddle.cli import run as run_cmds
from heddle.cli.flags import SettingsCommand, SummaryGroup

app = typer.Typer(
    name="heddle",
    cls=SummaryGroup,
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


# The summaries `heddle --help` lists; a command's help starts with its full sentence.
_SUMMARY = {
    "run": "Run a flow or a sealed bundle and print its final state.",
    "validate": "Check a flow or a bundle without running it.",
    "bundle": "Seal a flow, its tools, mounts and plugins into a .heddle file.",
    "verify": "Prove a bundle is what a trusted key sealed.",
    "inspect": "Show a bundle's manifest, files and tools without unpacking it.",
    "diff": "Show what differs between two bundles.",
    "doctor": "Check that this machine has what a bundle needs.",
    "trust": "The keys this user trusts to sign bundles.",
    "cache": "The cache of verified payloads.",
    "model": "Serve a scripted model for deterministic agent tests.",
}
app.command("run", cls=SettingsCommand, short_help=_SUMMARY["run"])(run_cmds.run)
app.command("validate", cls=SettingsCommand, short_help=_SUMMARY["validate"])(run_cmds.validate)
app.command("bundle", cls=SettingsCommand, short_help=_SUMMARY["bundle"])(run_cmds.bundle)
app.command("init", cls=SettingsCommand)(run_cmds.init)
for _name in ("keygen", "sign", "verify", "inspect", "diff", "doctor"):
    app.command(_name, cls=SettingsCommand, short_help=_SUMMARY.get(_name))(getattr(bundle_cmds, _name))
app.add_typer(bundle_cmds.trust_app, name="trust", cls=SummaryGroup, short_help=_SUMMARY["trust"])
app.add_typer(bundle_cmds.cache_app, name="cache", cls=SummaryGroup, short_help=_SUMMARY["cache"])
app.add_typer(model_cmds.model_app, name="model", cls=SummaryGroup, short_help=_SUMMARY["model"])


def main() -> None:
    from heddle.cli.errors import run_app

    sys.exit(run_app(app))
