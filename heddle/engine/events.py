"""Typed run events. The CLI prints them, the server streams them, plugins may render them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True)
class Event:
    type: ClassVar[str] = "event"
    ts: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        return {"type": self.type, **data}


@dataclass(frozen=True)
class FlowStart(Event):
    type: ClassVar[str] = "flow_start"
    flow: str
    inputs: dict[str, Any]


@dataclass(frozen=True)
class NodeStart(Event):
    type: ClassVar[str] = "node_start"
    node: str
    node_type: str
    inputs: dict[str, Any]


@dataclass(frozen=True)
class NodeComplete(Event):
    type: ClassVar[str] = "node_complete"
    node: str
    node_type: str
    outputs: dict[str, Any]
    branch: str | None
    duration_ms: float


@dataclass(frozen=True)
class NodeError(Event):
    type: ClassVar[str] = "node_error"
    node: str
    node_type: str
    error: str


@dataclass(frozen=True)
class ToolCall(Event):
    type: ClassVar[str] = "tool_call"
    node: str
    tool: str
    call_id: str | None
    arguments: Any


@dataclass(frozen=True)
class ToolResult(Event):
    type: ClassVar[str] = "tool_result"
    node: str
    tool: str
    call_id: str | None
    ok: bool
    output: Any
    duration_ms: float


@dataclass(frozen=True)
class TokenDelta(Event):
    type: ClassVar[str] = "token_delta"
    node: str
    text: str


@dataclass(frozen=True)
class Message(Event):
    """A message a node shows the person running the flow (an OutputMessageNode's, its
    placeholders filled in); the run's messages are also carried beside its outputs."""

    type: ClassVar[str] = "message"
    node: str
    text: str


@dataclass(frozen=True)
class Warning(Event):
    type: ClassVar[str] = "warning"
    message: str
    node: str | None = None


@dataclass(frozen=True)
class EgressRefused(Warning):
    """A request of a tool's process that the egress proxy refused (heddle.workspace.egress_proxy):
    shown as a warning, with the tool, the host and port it asked for, and why."""

    type: ClassVar[str] = "egress_refused"
    tool: str = ""
    host: str = ""
    port: int = 0
    reason: str = ""


@dataclass(frozen=True)
class FlowComplete(Event):
    type: ClassVar[str] = "flow_complete"
    flow: str
    state: dict[str, Any]
    duration_ms: float


@dataclass(frozen=True)
class Waiting(Event):
    """A run in a session stopped to wait for a person (or a client); it is the run's last event.
    `waiting_for` is what the person must answer (kind, node, prompt, tool and arguments)."""

    type: ClassVar[str] = "waiting"
    flow: str
    waiting_for: dict[str, Any]
    duration_ms: float


EventSink = Callable[[Event], None]

EVENT_TYPES: tuple[str, ...] = tuple(
    cls.type for cls in (FlowStart, NodeStart, NodeComplete, NodeError, ToolCall, ToolResult,
                         TokenDelta, Message, Warning, EgressRefused, FlowComplete, Waiting)
)


def ignore(event: Event) -> None:
    """The sink for callers that do not listen."""
