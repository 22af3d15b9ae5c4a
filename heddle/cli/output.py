"""What `heddle run` shows while a run goes: nothing by default, progress with --verbose, or
every event as a JSON line with --protocol heddle."""

from __future__ import annotations

import json
import sys
from typing import Any


def _short(value: Any, limit: int = 200) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 3] + "..."


class EventPrinter:
    def __init__(self, *, verbose: bool = False, protocol: str | None = None) -> None:
        self.verbose = verbose
        self.protocol = protocol
        self._in_tokens = False

    def __call__(self, event) -> None:
        from heddle.engine import events as ev

        if self.protocol == "heddle":
            sys.stdout.write(json.dumps(event.to_dict(), ensure_ascii=False) + "\n")
            sys.stdout.flush()
        if isinstance(event, ev.Warning):
            self._line(f"warning: {event.message}")
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
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
