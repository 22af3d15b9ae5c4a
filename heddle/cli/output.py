"""What every `heddle` command prints, and where.

stdout carries a command's result (a report, a key id, a run's final state, or JSON with
`--json`) and nothing else; `-q/--quiet` and `-v/--verbose` never change it. stderr carries the
rest: notes and the progress bar (silenced by `--quiet`), details of what heddle does (added by
`--verbose`), and warnings and errors (always). Colour and the progress bar appear only on a
terminal, and never when NO_COLOR is set to any value (or TERM is dumb).

Also: what `heddle run` shows while a run goes (nothing by default, each node and tool call
with --verbose, every event as a JSON line with --protocol heddle).
"""

from __future__ import annotations

import json
import os
import sys
from enum import IntEnum
from typing import IO, Any

import typer

from heddle.textsafe import printable_json, write_line

QUIET_HELP = "Print only the result, warnings and errors: no notes and no progress bar on stderr."
VERBOSE_HELP = "Also say on stderr what heddle does as it goes (for a run: every node and tool call)."

# The one definition of -q and -v: every command takes these two objects as parameter defaults
# (`quiet: bool = QUIET, verbose: bool = VERBOSE`) and hands the values to `use()`.
QUIET: Any = typer.Option(False, "--quiet", "-q", help=QUIET_HELP)
VERBOSE: Any = typer.Option(False, "--verbose", "-v", help=VERBOSE_HELP)


def json_option(help: str = "Print the report as JSON on stdout instead of text.") -> Any:
    """A command's `--json` flag."""
    return typer.Option(False, "--json", help=help)


class Verbosity(IntEnum):
    QUIET = 0
    NORMAL = 1
    VERBOSE = 2


_level = Verbosity.NORMAL
# --log-format and --log-level (heddle.settings): how each line on stderr is written, and the least
# severe written. -q and -v choose which notes are said; the level then keeps only the severe enough.
_SEVERITY = {"debug": 10, "info": 20, "warning": 30, "error": 40}
_json_lines = False
_least = _SEVERITY["debug"]
# Whether the command's JSON result is on stdout: a failure after it (doctor's exit 9) adds no second object.
_json_printed = False


def use(*, quiet: bool = False, verbose: bool = False) -> Verbosity:
    """Set how much this command says on stderr, from its -q and -v flags."""
    global _level
    if quiet and verbose:
        from heddle.errors import UsageError

        raise UsageError("give --quiet or --verbose, not both")
    _level = Verbosity.QUIET if quiet else Verbosity.VERBOSE if verbose else Verbosity.NORMAL
    return _level


def use_log(log_format: str, log_level: str) -> None:
    """Write stderr's lines as `--log-format` says, from `--log-level` up."""
    global _json_lines, _least
    from heddle.settings import check_log

    check_log(log_format, log_level)
    _json_lines, _least = log_format == "json", _SEVERITY[log_level]


def reset() -> None:
    """Back to the default, before a command runs (a process may run several, as tests do)."""
    global _level, _json_lines, _least, _json_printed
    _level = Verbosity.NORMAL
    _json_lines, _least, _json_printed = False, _SEVERITY["debug"], False


def json_printed() -> bool:
    return _json_printed


def verbosity() -> Verbosity:
    return _level


def note(text: str) -> None:
    """What a person may want to know (a file written, a hint): stderr, unless --quiet."""
    if _level >= Verbosity.NORMAL:
        _line(text)


def detail(text: str) -> None:
    """What heddle did, step by step: stderr, with --verbose only."""
    if _level >= Verbosity.VERBOSE:
        _line(text)


def warn(text: str) -> None:
    """Something a person must know even with --quiet."""
    _line(f"warning: {text}", "warning")


def error(text: str) -> None:
    """The one line saying why a command failed."""
    _line(f"error: {text}", "error")


def print_json(value: Any, *, indent: int | None = 2) -> None:
    global _json_printed
    _json_printed = True
    sys.stdout.write(printable_json(json.dumps(value, ensure_ascii=False, indent=indent)) + "\n")
    sys.stdout.flush()


def binary_size(n: float) -> str:
    """`n` bytes as heddle writes sizes everywhere: B, or KiB, MiB, GiB with one decimal."""
    value = float(n)
    for unit in ("B", "KiB", "MiB"):
        if value < 1024:
            return f"{int(n)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def decorated(stream: IO[str]) -> bool:
    """Whether `stream` may get colour or a progress bar: a terminal, no NO_COLOR, TERM not dumb."""
    if "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream is no terminal
        return False


def _line(text: str, level: str = "info") -> None:
    if _SEVERITY[level] < _least:
        return
    if _json_lines:
        import time

        text = printable_json(json.dumps({"time": round(time.time(), 3), "level": level, "message": text},
                                         ensure_ascii=False))
    write_line(sys.stderr, text)


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else \
        printable_json(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EventPrinter:
    def __init__(self, *, verbose: bool = False, protocol: str | None = None) -> None:
        self.verbose = verbose
        self.protocol = protocol

    def __call__(self, event: Any) -> None:
        from heddle.engine import events as ev

        if self.protocol == "heddle":
            sys.stdout.write(printable_json(json.dumps(event.to_dict(), ensure_ascii=False)) + "\n")
            sys.stdout.flush()
        if isinstance(event, ev.Warning):
            _line(f"warning: {event.message}", "warning")
            return
        if isinstance(event, ev.Message):
            # Meant for the person running the flow: shown unless --quiet, on stderr (stdout is the result).
            if self.verbose or _level >= Verbosity.NORMAL:
                self._line(f"message from {event.node}: {event.text}")
            return
        if not self.verbose:
            return
        if isinstance(event, ev.TokenDelta):
            return
        if isinstance(event, ev.NodeStart):
            self._line(f"> {event.node_type} {event.node}")
        elif isinstance(event, ev.NodeComplete):
            branch = f" -> {event.branch}" if event.branch else ""
            self._line(f"< {event.node} ({event.duration_ms:.0f} ms){branch}")
        elif isinstance(event, ev.NodeError):
            self._line(f"! {event.node}: {event.error}")
        elif isinstance(event, ev.Waiting):
            waiting = event.waiting_for
            self._line(f"= {event.flow} waits for {waiting.get('kind')} at {waiting.get('node')} "
                       f"({event.duration_ms:.0f} ms)")
        elif isinstance(event, ev.ToolCall):
            self._line(f"  tool {event.tool} {_short(event.arguments)}")
        elif isinstance(event, ev.ToolResult):
            mark = "ok" if event.ok else "failed"
            self._line(f"  tool {event.tool} {mark} in {event.duration_ms:.0f} ms: {_short(event.output)}")
        elif event.type == "plugin_log":
            self._line(f"  plugin {event.plugin} {event.level}: {event.message}")
        elif event.type == "plugin_event":
            self._line(f"  plugin {event.plugin} event {event.name}: {_short(event.data)}")

    @staticmethod
    def _line(text: str) -> None:
        _line(text)
