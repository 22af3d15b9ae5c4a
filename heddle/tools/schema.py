"""A tool's input JSON Schema, its fingerprint, and checking arguments against it."""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from heddle.canonical import fingerprint
from heddle.errors import ToolError

if TYPE_CHECKING:
    from heddle.agentspec.components import WithIO


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


# --------------------------------------------------------------------------- checking arguments
# Most tools declare their inputs as typed properties: {"type": "object", "properties": {name:
# {"title", "type", "description", "default"}}, "required": [...]}. Such a schema is checked here,
# with the errors, their order and their words exactly those of jsonschema's Draft202012Validator
# (tests/engine/test_tool_schema.py compares the two); any other schema goes to jsonschema, which
# is imported then. Either way a schema is compiled once and its checker kept (_compiled), so an
# agent calling one tool many times, or a server running one flow many times, checks each call
# without building a validator again.

Error = tuple[list[Any], str]  # (path into the arguments, message), as jsonschema reports them
Checker = Callable[[dict[str, Any]], list[Error]]

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "$comment", "deprecated", "readOnly",
                          "writeOnly"})


def _is_integer(value: Any) -> bool:
    # Draft 2020-12: 1.0 is an integer; a bool is not a number at all.
    return not isinstance(value, bool) and (isinstance(value, int) or (isinstance(value, float) and value.is_integer()))


def _is_number(value: Any) -> bool:
    import numbers

    return not isinstance(value, bool) and isinstance(value, numbers.Number)


_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": _is_integer,
    "number": _is_number,
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def _type_check(schema: Any) -> Callable[[Any], str | None] | None:
    """What a property's schema says of a value (None when it admits it, else the message), for a
    schema of annotations and a `type`; None for a schema that needs jsonschema."""
    if not isinstance(schema, dict) or not set(schema) <= _ANNOTATIONS | {"type"}:
        return None
    declared = schema.get("type")
    if declared is None and "type" not in schema:
        return lambda value: None
    types = [declared] if isinstance(declared, str) else declared
    if not isinstance(types, list) or not all(isinstance(t, str) and t in _TYPES for t in types):
        return None
    tests = [_TYPES[t] for t in types]
    reprs = ", ".join(repr(t) for t in types)

    def check(value: Any) -> str | None:
        return None if any(test(value) for test in tests) else f"{value!r} is not of type {reprs}"

    return check


def _plain_checker(schema: dict[str, Any]) -> Checker | None:
    """The checker of an object schema of typed properties, or None when the schema says more."""
    steps: list[Callable[[dict[str, Any]], list[Error]]] = []
    for keyword, value in schema.items():
        if keyword in _ANNOTATIONS:
            continue
        if keyword == "type":
            if value != "object" or not isinstance(value, str):
                return None
        elif keyword == "properties":
            if not isinstance(value, dict):
                return None
            checks: list[tuple[str, Callable[[Any], str | None]]] = []
            for name, prop in value.items():
                check = _type_check(prop)
                if check is None:
                    return None
                checks.append((name, check))

            def properties(arguments: dict[str, Any], checks: list[tuple[str, Callable[[Any], str | None]]] = checks,
                           ) -> list[Error]:
                found = []
                for name, check in checks:
                    if name in arguments:
                        message = check(arguments[name])
                        if message is not None:
                            found.append(([name], message))
                return found

            steps.append(properties)
        elif keyword == "required":
            if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
                return None

            def required(arguments: dict[str, Any], names: list[str] = value) -> list[Error]:
                return [([], f"{name!r} is a required property") for name in names if name not in arguments]

            steps.append(required)
        else:
            return None

    def check_all(arguments: dict[str, Any]) -> list[Error]:
        # In the schema's keyword order, as jsonschema yields them.
        return [error for step in steps for error in step(arguments)]

    return check_all


def _jsonschema_checker(schema: Any) -> Checker:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema)

    def check(arguments: dict[str, Any]) -> list[Error]:
        return [(list(err.path), err.message) for err in validator.iter_errors(arguments)]

    return check


def _checker(schema: Any) -> Checker:
    return (_plain_checker(schema) if isinstance(schema, dict) else None) or _jsonschema_checker(schema)


@functools.lru_cache(maxsize=512)
def _compiled(text: str) -> Checker:
    return _checker(json.loads(text))


def compiled_checker(schema: Any) -> Checker:
    """The checker of `schema`, compiled once per schema: keyed by its JSON in its own key order,
    which is the order the errors come in."""
    try:
        text = json.dumps(schema, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return _checker(schema)  # not JSON (a library caller's own objects): checked as it is, not kept
    if json.loads(text) != schema:
        return _checker(schema)  # a value JSON does not round-trip (a tuple): not kept either
    return _compiled(text)


def describe_errors(errors: list[Error]) -> str | None:
    """A checker's errors as one line (the first five, by path), or None when there are none."""
    if not errors:
        return None
    described = []
    for path, message in sorted(errors, key=lambda e: e[0])[:5]:
        where = "/".join(str(p) for p in path) or "(root)"
        described.append(f"{where}: {message}")
    return "; ".join(described)


def check_arguments(schema: dict[str, Any], arguments: Any) -> tuple[dict[str, Any] | None, str | None]:
    """Validate `arguments`; return (arguments with defaults filled in, None) or (None, error text)."""
    if not isinstance(arguments, dict):
        return None, f"arguments must be a JSON object, got {type(arguments).__name__}"
    problem = describe_errors(compiled_checker(schema)(arguments))
    if problem is not None:
        return None, problem
    filled = copy.deepcopy(arguments)
    for name, prop in schema.get("properties", {}).items():
        if name not in filled and isinstance(prop, dict) and "default" in prop:
            filled[name] = copy.deepcopy(prop["default"])
    return filled, None


def checked_arguments(tool: WithIO, arguments: dict[str, Any]) -> dict[str, Any]:
    """`arguments` with defaults filled in, or ToolError naming `tool` when they break its inputs."""
    filled, problem = check_arguments(input_schema(tool), arguments)
    if problem is not None or filled is None:
        raise ToolError(tool.name, f"the arguments do not match its inputs: {problem}")
    return filled
