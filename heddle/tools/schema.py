"""A tool's input JSON Schema, its fingerprint, and checking arguments against it."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from heddle.canonical import fingerprint

if TYPE_CHECKING:
    from heddle.spec.components import WithIO


def input_schema(tool: WithIO) -> dict[str, Any]:
    """The JSON Schema (Draft 2020-12) of a tool's arguments as its inputs declare them.

    Each input property becomes a property of an object; it is required unless it has a default.
    """
    properties: dict[str, Any] = {}
    required: list[str] = []
    for prop in tool.inputs:
        properties[prop["title"]] = dict(prop)
        if "default" not in prop:
            required.append(prop["title"])
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def input_fingerprint(tool: WithIO) -> str:
    return fingerprint(input_schema(tool))


def function_definition(tool: WithIO) -> dict[str, Any]:
    """The tool as an OpenAI function-tool definition."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description or "",
            "parameters": input_schema(tool),
        },
    }


def check_arguments(schema: dict[str, Any], arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Validate `arguments`; return (arguments with defaults filled in, None) or (None, error text)."""
    import jsonschema

    if not isinstance(arguments, dict):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(arguments), key=lambda e: list(e.path))
    if errors:
        described = []
        for err in errors[:5]:
            where = "/".join(str(p) for p in err.path) or "(root)"
            described.append(f"{where}: {err.message}")
        return None, "; ".join(described)
    filled = copy.deepcopy(arguments)
    for name, prop in schema.get("properties", {}).items():
        if name not in filled and isinstance(prop, dict) and "default" in prop:
            filled[name] = copy.deepcopy(prop["default"])
    return filled, None


def checked_arguments(tool: WithIO, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` with defaults filled in, or ToolError naming `tool` when they break its inputs."""
    from heddle.errors import ToolError

    filled, problem = check_arguments(input_schema(tool), arguments)
    if problem is not None or filled is None:
        raise ToolError(tool.name, f"the arguments do not match its inputs: {problem}")
    return filled
