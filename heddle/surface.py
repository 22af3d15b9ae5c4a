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


@dataclass(frozen=True)
class Surface:
    unit: Literal["s", "ms"] = "s"
    flags: Mapping[str, str] = field(default_factory=lambda: _FLAGS)

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
SERVER = Surface("ms")
