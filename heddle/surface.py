"""How the shell that started a run names its settings, so a library message speaks its language.

The engine, the tools and the plugins report limits by the flag a user would change. Both shells
read `30s` or `500ms`, but a plain number is seconds to the `heddle` CLI and milliseconds to
`heddle-server` (their historic units), so each shell passes its own `Surface` and a message reads
`--timeout 300 s` or `--timeout 300000 ms`, in the unit its user's plain numbers are in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from heddle.settings import SETTINGS

# Both shells spell every setting's flag the same way (heddle.settings); a shell that differs
# passes its own names.
_FLAGS: Mapping[str, str] = MappingProxyType({s.name: s.flag for s in SETTINGS if s.flag is not None})


def _number(value: float) -> str:
    # Never exponent notation: "300000", not "3e+05", and "0.5", not "0.500000".
    rounded = round(value, 3)
    return str(int(rounded)) if rounded == int(rounded) else repr(rounded)


# How a person gives what a session asks for, in each shell's terms (heddle.sessions.turn's messages).
_CLI_WORDS: Mapping[str, str] = MappingProxyType({
    "message": "--message TEXT", "approval": "--approve or --deny REASON", "client_tool": "--tool-result JSON",
    "session": "--session NAME", "new_session": "a new session name", "input": "--input", "resume": "--resume",
    "reply": "--message", "durable": "--durable",
})
_SERVER_WORDS: Mapping[str, str] = MappingProxyType({
    "message": '"answer": {"message": TEXT}', "approval": '"answer": {"approve": true} or {"deny": REASON}',
    "client_tool": '"answer": {"tool_result": JSON}', "session": '"session" (an id POST /v1/sessions issues)',
    "new_session": "a new session (POST /v1/sessions)", "input": "'inputs'", "resume": '"resume": true',
    "reply": "'message'", "durable": "a durable run",
})


@dataclass(frozen=True)
class Surface:
    unit: Literal["s", "ms"] = "s"
    flags: Mapping[str, str] = field(default_factory=lambda: _FLAGS)
    words: Mapping[str, str] = field(default_factory=lambda: _CLI_WORDS)

    def say(self, what: str) -> str:
        """How a person gives `what` here: an answer kind ("approval") or a session's field ("resume")."""
        return self.words[what]

    def duration(self, seconds: float) -> str:
        """`seconds` as this surface's flags take it, with the unit: "0.5 s" or "500 ms"."""
        return f"{_number(seconds * 1000)} ms" if self.unit == "ms" else f"{_number(seconds)} s"

    def flag(self, setting: str) -> str:
        """The flag that sets `setting` (a RunOptions field name such as "tool_timeout")."""
        return self.flags.get(setting, setting)

    def setting(self, setting: str, seconds: float) -> str:
        """The flag with its value: "--timeout 300 s" or "--timeout 300000 ms"."""
        return f"{self.flag(setting)} {self.duration(seconds)}"


CLI = Surface("s")
SERVER = Surface("ms", words=_SERVER_WORDS)
