"""Turning library errors into one line on stderr and the right exit code."""

from __future__ import annotations

import sys

import click
import typer


def report(message: str) -> None:
    sys.stderr.write(f"error: {message}\n")


def run_app(app: typer.Typer, args: list[str] | None = None) -> int:
    from heddle.errors import HeddleError

    try:
        app(args=args, standalone_mode=False)
    except HeddleError as exc:
        report(exc.message)
        return exc.exit_code
    except click.exceptions.Abort:
        report("aborted")
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except KeyboardInterrupt:
        report("interrupted")
        return 130
    except BrokenPipeError:
        return 1
    return 0
