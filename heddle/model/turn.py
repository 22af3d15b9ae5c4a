"""One assistant turn, read from a chat-completions answer, buffered or streamed.

Streaming servers send the answer as deltas: content in pieces, and tool calls whose
`id` and `name` come once while `arguments` arrive in fragments keyed by `index`.
`TurnAssembler` puts them back together; `turn_from_completion` reads a buffered answer.
Both give the same `AssistantTurn` for the same answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from heddle.errors import ModelError


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # raw JSON text as the model sent it; the engine parses and validates it

    def as_message_part(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass
class AssistantTurn:
    content: str | None  # None when the model said nothing (a tool-call-only turn)
    tool_calls: list[ToolCall]
    finish_reason: str | None
    usage: dict[str, Any] | None = field(default=None)

    def as_message(self) -> dict[str, Any]:
        """The turn as the assistant message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [c.as_message_part() for c in self.tool_calls]
        return message


def _text(content: Any) -> str:
    # Some servers answer with a list of typed parts instead of a string.
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    raise ModelError(f"model answer has content of type {type(content).__name__}; expected a string")


def _arguments(value: Any) -> str:
    # Arguments are JSON text on the wire; a few servers send the object itself.
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def _first_choice(obj: Any, what: str) -> dict[str, Any] | None:
    if not isinstance(obj, dict):
        raise ModelError(f"model {what} is not a JSON object: {_excerpt(json.dumps(obj))}")
    if obj.get("error"):
        raise ModelError(f"model answered with an error: {_excerpt(json.dumps(obj['error'], ensure_ascii=False))}")
    choices = obj.get("choices")
    if not isinstance(choices, list):
        raise ModelError(f"model {what} has no 'choices' list: {_excerpt(json.dumps(obj, ensure_ascii=False))}")
    if not choices:
        return None
    choice = choices[0]
    if not isinstance(choice, dict):
        raise ModelError(f"model {what} has a choice that is not an object")
    return choice


def _excerpt(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit] + "…"


def turn_from_completion(obj: Any) -> AssistantTurn:
    """Read a buffered `chat.completion` object."""
    choice = _first_choice(obj, "answer")
    if choice is None:
        raise ModelError("model answer has an empty 'choices' list")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError("model answer has no 'message' in its first choice")
    calls: list[ToolCall] = []
    for n, raw in enumerate(message.get("tool_calls") or []):
        function = raw.get("function") if isinstance(raw, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ModelError(f"model answer has tool call #{n} without a function name")
        calls.append(ToolCall(id=str(raw.get("id") or f"call_{n}"), name=function["name"],
                              arguments=_arguments(function.get("arguments"))))
    text = _text(message.get("content"))
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    return AssistantTurn(content=text or None, tool_calls=calls, finish_reason=choice.get("finish_reason"), usage=usage)


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class TurnAssembler:
    """Folds `chat.completion.chunk` objects into one turn, reporting content as it arrives."""

    def __init__(self, on_delta: Callable[[str], None] | None = None) -> None:
        self.on_delta = on_delta
        self._content: list[str] = []
        self._calls: dict[int, _PartialCall] = {}
        self._last_index: int | None = None
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None
        self.emitted = False  # whether any content reached on_delta (a retry would repeat it)

    def abandon(self) -> None:
        """Drop what was assembled of an answer that failed (an error's traceback may keep the
        assembler alive until a collection; its text need not live that long)."""
        self._content.clear()
        self._calls.clear()

    def feed(self, chunk: Any) -> None:
        if isinstance(chunk, dict) and isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        choice = _first_choice(chunk, "stream chunk")
        if choice is None:  # usage-only chunks carry no choice
            return
        delta = choice.get("delta") or {}
        if not isinstance(delta, dict):
            raise ModelError("model stream chunk has a 'delta' that is not an object")
        piece = _text(delta.get("content"))
        if piece:
            self._content.append(piece)
            if self.on_delta is not None:
                self.emitted = True
                self.on_delta(piece)
        for raw in delta.get("tool_calls") or []:
            if isinstance(raw, dict):
                self._feed_call(raw)
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]

    def _feed_call(self, raw: dict[str, Any]) -> None:
        index = raw.get("index")
        if not isinstance(index, int):
            # Servers that omit `index` start a new call with each new id and continue the last one otherwise.
            fresh = raw.get("id") and (self._last_index is None or self._calls[self._last_index].id != raw["id"])
            index = len(self._calls) if fresh or self._last_index is None else self._last_index
        call = self._calls.setdefault(index, _PartialCall())
        self._last_index = index
        if raw.get("id") and not call.id:
            call.id = str(raw["id"])
        function = raw.get("function") or {}
        name = function.get("name")
        if isinstance(name, str) and name and name != call.name:
            # Most servers send the name once or repeat it whole; a few send it in pieces.
            call.name = name if not call.name else call.name + name
        args = function.get("arguments")
        if args is not None:
            call.arguments.append(_arguments(args))

    def turn(self) -> AssistantTurn:
        calls = []
        for n, index in enumerate(sorted(self._calls)):
            partial = self._calls[index]
            if not partial.name:
                raise ModelError(f"model stream sent tool call #{index} without a function name")
            calls.append(ToolCall(id=partial.id or f"call_{n}", name=partial.name,
                                  arguments="".join(partial.arguments)))
        text = "".join(self._content)
        return AssistantTurn(content=text or None, tool_calls=calls, finish_reason=self.finish_reason, usage=self.usage)
