"""A model's answer as plugins see and write it: `{content, toolCalls: [{id, name, arguments}]}`."""

from __future__ import annotations

import json
from typing import Any

from heddle.model.turn import AssistantTurn, ToolCall


def turn_to_json(turn: AssistantTurn) -> dict[str, Any]:
    return {
        "content": turn.content,
        "toolCalls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in turn.tool_calls],
        "finishReason": turn.finish_reason,
    }


def turn_from_json(value: Any, *, where: str) -> AssistantTurn:
    """A response a plugin wrote; ValueError naming what is wrong with it (its type included: the
    caller reports every malformed response the same way)."""
    if not isinstance(value, dict):
        raise ValueError(f"{where} must be an object {{content, toolCalls}}")  # noqa: TRY004
    content = value.get("content")
    if content is not None and not isinstance(content, str):
        raise ValueError(f"{where}.content must be a string or null")
    calls = value.get("toolCalls") or []
    if not isinstance(calls, list):
        raise ValueError(f"{where}.toolCalls must be a list")  # noqa: TRY004
    out: list[ToolCall] = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or not call["name"]:
            raise ValueError(f"{where}.toolCalls[{i}] must be an object with a 'name'")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        out.append(ToolCall(id=str(call.get("id") or f"plugin-call-{i + 1}"), name=call["name"], arguments=arguments))
    return AssistantTurn(content=content, tool_calls=out, finish_reason="tool_calls" if out else "stop")
