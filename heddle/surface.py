"""How the shell that started a run names its settings, so a library message speaks its language.

The engine, the tools and the plugins report limits by the flag a user would change. Both shells
read `30s` or `500ms`, but a plain number is seconds to the `heddle` CLI and milliseconds to
`heddle-server` (their historic units), so each shell passes its own `Surface` (heddle.settings: CLI,
SERVER) and a message reads `--timeout 300 s` or `--timeout 300000 ms`, in the unit its user's plain
numbers are in. The default speaks no shell's words: it names what is asked for as such.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal


def _number(value: float) -> str:
    # Never exponent notation: "300000", not "3e+05", and "0.5", not "0.500000".
    rounded = round(value, 3)
    return str(int(rounded)) if rounded == int(rounded) else repr(rounded)


# How a person gives what a session asks for (heddle.sessions.turn's messages), in no shell's terms.
_WORDS: Mapping[str, str] = MappingProxyType({
    "message": "a message", "approval": "an approval or a denial", "client_tool": "the tool's result",
    "session": "a session", "new_session": "a new session", "input": "the inputs", "resume": "a resumed turn",
    "reply": "a message", "durable": "a durable run",
})


@dataclass(frozen=True)
class Surface:
    unit: Literal["s", "ms"] = "s"
    flags: Mapping[str, str] = field(default_factory=dict)
    words: Mapping[str, str] = field(default_factory=lambda: _WORDS)

    def say(self, what: str) -> str:
        """How a person gives `what` here: an answer kind ("approval") or a session's field ("resume")."""
        return self.words[what]

    def duration(self, seconds: float) -> str:
        """`seconds` as this surface's flags take it, with the unit: "0.5 s" or "500 ms"."""
        return f"{_number(seconds * 1000)} ms" if self.unit == "ms" else f"{_number(seconds)} s"

    def flag(self, setting: str) -> str:
        """The flag that sets `setting` (a RunOptions field name such as "tool_timeout"): both shells spell it
        from the name (heddle.settings: `--tool-timeout`); a shell that differs passes its own `flags`."""
        return self.flags.get(setting, "--" + setting.replace("_", "-"))

    def setting(self, setting: str, seconds: float) -> str:
        """The flag with its value: "--timeout 300 s" or "--timeout 300000 ms"."""
        return f"{self.flag(setting)} {self.duration(seconds)}"


# The engine's default, for a caller that is no shell.
NEUTRAL = Surface()
