"""The `heddle` command: a thin typer shell over the library.

Only typer and the standard library are imported here at start-up; every command imports what
it needs when it runs, so `heddle --help` stays fast.
"""

from __future__ import annotations

import sys

import typer

from heddle import __version__
from heddle.cli import bundle as bundle_cmds
from heddle.cli import model as model_cmds
from heddle.cli import run as run_cmds

app = typer.Typer(
    name="heddle",
    help="Seal Agent Spec flows, their tools and files into one signed bundle, and run them.",
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    add_completion=False,
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
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


app.command("run")(run_cmds.run)
app.command("validate")(run_cmds.validate)
app.command("bundle")(run_cmds.bundle)
app.command("init")(run_cmds.init)
for _name in ("keygen", "sign", "verify", "inspect", "diff", "doctor"):
    app.command(_name)(getattr(bundle_cmds, _name))
app.add_typer(bundle_cmds.trust_app, name="trust")
app.add_typer(bundle_cmds.cache_app, name="cache")
app.add_typer(model_cmds.model_app, name="model")


def main() -> None:
    from heddle.cli.errors import run_app

    sys.exit(run_app(app))
