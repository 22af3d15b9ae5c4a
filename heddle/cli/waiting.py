"""A run that waits for a person, on a terminal: what it waits for is shown on stderr and the answer is
read from stdin, so that `heddle run` can resume the run in the same process.

Only when stdin and stderr are both terminals (and not `--no-input`): anywhere else the run prints its
waiting object and exits 10, and the answer comes with the next `heddle run ... --session NAME`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import typer

from heddle.textsafe import printable_json, write_line

if TYPE_CHECKING:
    from heddle.engine.journal import Answer, WaitingFor


def on_terminal(no_input: bool) -> bool:
    """Whether a wait may be answered here and now."""
    if no_input:
        return False
    try:
        return sys.stdin.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream is no terminal
        return False


def waiting_object(session: str, waiting: WaitingFor, messages: Sequence[str]) -> dict[str, Any]:
    """What a run that waits prints on stdout: what it waits for and the messages it showed in this step."""
    return {"status": "waiting", "session": session, "waiting_for": waiting.as_json(), "messages": list(messages)}


def _say(text: str) -> None:
    write_line(sys.stderr, text)


def _arguments(value: Any) -> str:
    # Every character of the arguments shown, the ones a terminal would act on as escapes.
    return printable_json(json.dumps(value if value is not None else {}, ensure_ascii=False, indent=2))


def read_line(prompt: str, *, allow_empty: bool = False) -> str:
    """A line the person types, after `prompt` on stderr; asked again when empty (unless `allow_empty`).

    Not typer.prompt: it echoes a space to stdout, which carries the run's result alone."""
    while True:
        _say_inline(prompt)
        try:
            line = input()
        except EOFError:
            sys.stderr.write("\n")
            raise typer.Abort() from None
        if line or allow_empty:
            return line


def _say_inline(text: str) -> None:
    write_line(sys.stderr, text, end="")


def _yes(prompt: str) -> bool:
    while True:
        answer = read_line(f"{prompt} [y/n] ").strip().lower()
        if answer in ("y", "yes", "n", "no"):
            return answer.startswith("y")
        _say("answer y or n")


def ask(waiting: WaitingFor, messages: Sequence[str] = ()) -> Answer:
    """The person's answer to `waiting`, asked for on stderr. `messages` are shown first (those the
    run showed while --quiet kept them off stderr)."""
    from heddle.engine.journal import Answer
    from heddle.safeparse import json_problem, loads_strict_json

    for text in messages:
        _say(text)
    if waiting.kind == "message":
        if waiting.prompt:
            _say(f"{waiting.node}: {waiting.prompt}")
        return Answer("message", message=read_line("> "))
    if waiting.kind == "approval":
        _say(f"{waiting.node} asks to call the tool {waiting.tool!r} with:")
        _say(_arguments(waiting.arguments))
        if _yes("Run it?"):
            return Answer("approval", approved=True)
        reason = read_line("Why not> ", allow_empty=True)
        return Answer("approval", approved=False, reason=reason)
    _say(f"{waiting.node} calls the client tool {waiting.tool!r} (you give its result) with:")
    _say(_arguments(waiting.arguments))
    while True:
        text = read_line("Its result (JSON)> ")
        try:
            return Answer("client_tool", tool_result=loads_strict_json(text))
        except ValueError as exc:
            _say(f"not JSON ({json_problem(exc)}); give a JSON value, such as \"sunny\" or "
                 "{\"temperature\": 21}")
