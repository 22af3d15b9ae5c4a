"""Turning library errors into one line on stderr and the right exit code."""

from __future__ import annotations

import sys
from typing import Any

import typer

from heddle.shell_options import usage_error_types

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
    from heddle.cli import output

    output.error(shown(message))


# What a command's JSON error says beside the error itself (`verify`: the bundle and its OCI digest).
_CONTEXT: dict[str, Any] = {}


def error_context(**fields: Any) -> None:
    """Name `fields` in the JSON object a failure of this command prints under `--json`."""
    _CONTEXT.update(fields)


def _wants_json(args: list[str]) -> bool:
    """Whether the command line asks for JSON (`--json` before any `--`): then its failure is JSON too."""
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _fail(kind: str, exit_code: int, message: str, as_json: bool) -> int:
    """Say why the command failed, once: the error line on stderr, and under `--json` the object on stdout."""
    from heddle.cli import output

    report(message)
    if as_json and not output.json_printed():
        output.print_json({"ok": False, **_CONTEXT,
                           "error": {"kind": kind, "exit_code": exit_code, "message": shown(message)}}, indent=None)
    return exit_code


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
    _CONTEXT.clear()
    as_json = _wants_json(sys.argv[1:] if args is None else args)
    try:
        rc = app(args=args, standalone_mode=False)
    except HeddleError as exc:
        return _fail(exc.kind, exc.exit_code, exc.message, as_json)
    except typer.Abort:
        return _fail("interrupted", 130, "aborted", as_json)
    except _exit_types() as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except usage_error_types() as exc:
        code = int(getattr(exc, "exit_code", 2))
        if as_json:
            return _fail("usage_error", code, exc.format_message(), as_json)  # type: ignore[attr-defined]
        exc.show()  # type: ignore[attr-defined]
        return code
    except KeyboardInterrupt:
        return _fail("interrupted", 130, "interrupted", as_json)
    except BrokenPipeError:
        return 1
    finally:
        from heddle.cli.opening import close_opened

        close_opened()
    return rc if isinstance(rc, int) else 0
