"""The events plugins add to a run's stream: what they emit (`emitEvent`) and log (`log`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from heddle.engine.events import Event

LOG_LEVELS = ("debug", "info", "warning", "error")


@dataclass(frozen=True)
class PluginEvent(Event):
    type: ClassVar[str] = "plugin_event"
    plugin: str
    name: str
    data: Any
    node: str | None = None


@dataclass(frozen=True)
class PluginLog(Event):
    type: ClassVar[str] = "plugin_log"
    plugin: str
    level: str
    message: str
    node: str | None = None

