"""What `heddle run` reads from its session flags before anything else: the answer --approve,
--deny or --tool-result gives, and the refusal of session flags without --session.

Apart from heddle.cli.sessions (the `heddle sessions` commands), so that a run without a session
does not build those commands to check its flags.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from heddle.engine.journal import Answer

_FLAGS = {"session_store": "--session-store", "session_db": "--session-db", "session_dir": "--session-dir",
          "session_key": "--session-key",
          "durable": "--durable"}


def refuse_without_session(given: Collection[str], flags: dict[str, bool]) -> None:
    """Session flags given without --session would be ignored: refuse them, naming each."""
    from heddle.errors import UsageError

    named = [_FLAGS[name] for name in _FLAGS if name in given] + [flag for flag, on in flags.items() if on]
    if named:
        raise UsageError(f"{', '.join(named)} {'is' if len(named) == 1 else 'are'} for a run in a session; give "
                         "--session NAME too")


def answer_from_flags(*, approve: bool, deny: str | None, tool_result: str | None) -> Answer | None:
    """The answer --approve, --deny REASON or --tool-result JSON gives (at most one of them)."""
    from heddle.engine.journal import Answer
    from heddle.errors import UsageError

    given = [flag for flag, on in (("--approve", approve), ("--deny", deny is not None),
                                   ("--tool-result", tool_result is not None)) if on]
    if len(given) > 1:
        raise UsageError(f"{' and '.join(given)}: give one answer to what the session waits for")
    if approve:
        return Answer("approval", approved=True)
    if deny is not None:
        return Answer("approval", approved=False, reason=deny)
    if tool_result is not None:
        from heddle.safeparse import json_problem, loads_strict_json

        try:
            value = loads_strict_json(tool_result)
        except ValueError as exc:
            raise UsageError(f"--tool-result is not valid JSON ({json_problem(exc)}); give the tool's result as "
                             "JSON, such as '\"sunny\"' or '{\"temperature\": 21}'") from None
        return Answer("client_tool", tool_result=value)
    return None
