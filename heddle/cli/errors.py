"""Turning library errors into one line on stderr and the right exit code."""

from __future__ import annotations

import sys

import typer

# `heddle run` in a session whose run stopped to wait for a person (or a client): the waiting object is
# on stdout; the next `heddle run ... --session NAME` with the answer resumes it.
WAITING_EXIT = 10


# A pulled bundle's file in the cache, and the reference a person gave for it: messages name the latter.
_ALIASES: dict[str, str] = {}


def alias(path: str, name: str) -> None:
    """Name `path` as `name` in the error lines this command prints."""
    _ALIASES[path] = name


def shown(message: str) -> str:
    """`message` with each aliased path written as its name."""
    for path, name in _ALIASES.items():
        message = message.replace(path, name)
    return message


def report(message: str) -> None:
    sys.stderr.write(f"error: {shown(message)}\n")


def _usage_error_types() -> tuple[type[BaseException], ...]:
    # typer >= 0.29 carries its own click (typer._click); older ones use click itself.
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


def _exit_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [typer.Exit]
    try:
        from click.exceptions import Exit

        types.append(Exit)
    except ImportError:
        pass
    return tuple(types)


def run_app(app: typer.Typer, args: list[str] | None = None) -> int:
    """Run `app` and return the process exit code, printing library errors as one line."""
    from heddle.cli import output
    from heddle.errors import HeddleError

    output.reset()
    _ALIASES.clear()
    try:
        rc = app(args=args, standalone_mode=False)
    except HeddleError as exc:
        report(exc.message)
        return exc.exit_code
    except typer.Abort:
        report("aborted")
        return 130
    except _exit_types() as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except _usage_error_types() as exc:
        exc.show()  # type: ignore[attr-defined]
        return int(getattr(exc, "exit_code", 2))
    except KeyboardInterrupt:
        report("interrupted")
        return 130
    except BrokenPipeError:
        return 1
    return rc if isinstance(rc, int) else 0
