"""Model scripts: the answers a scripted model gives, one per chat-completions request, in order.

A script is a JSON or YAML list. Each entry is `{"content": "text"}`,
`{"tool_calls": [{"name": "echo", "arguments": {...}}]}`, or both keys at once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from heddle.canonical import CanonicalJSONError, loads_strict
from heddle.errors import UsageError

ENTRY_KEYS = ("content", "tool_calls")
CALL_KEYS = ("name", "arguments")


class ScriptError(UsageError):
    """A model script cannot be read or has an entry that is not an answer."""


def load_script(path: str | Path) -> list[dict[str, Any]]:
    """Read and check a script file: `.json` is strict JSON, anything else YAML."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError(f"{path}: no such script file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"{path}: cannot read the script ({exc})") from None
    if path.suffix.lower() == ".json":
        try:
            data = loads_strict(text)
        except (ValueError, CanonicalJSONError) as exc:
            raise ScriptError(f"{path}: not valid JSON ({exc})") from None
    else:
        # Read as a flow document's YAML is, within the same nesting and alias caps.
        from heddle.agentspec.document import read_yaml
        from heddle.errors import DocumentError

        try:
            data = read_yaml(text, str(path))
        except DocumentError as exc:
            raise ScriptError(exc.message) from None
    return check_script(data, str(path))


def check_script(data: Any, source: str) -> list[dict[str, Any]]:
    """Check a parsed script; `source` names it in errors (a file name)."""
    if not isinstance(data, list):
        raise ScriptError(f"{source}: a model script is a list of answers, got {_kind(data)};"
                          ' write e.g. [{"content": "hello"}]')
    return [_check_entry(entry, f"{source}: entry {i}") for i, entry in enumerate(data)]


def _check_entry(entry: Any, where: str) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise ScriptError(f"{where}: an answer is an object with 'content' and/or 'tool_calls', got {_kind(entry)}")
    unknown = sorted(set(entry) - set(ENTRY_KEYS), key=str)
    if unknown:
        raise ScriptError(f"{where}: unknown key {unknown[0]!r}; an answer has only 'content' and/or 'tool_calls'")
    if not entry:
        raise ScriptError(f"{where}: empty answer; give 'content' and/or 'tool_calls'")
    if "content" in entry and not isinstance(entry["content"], str):
        raise ScriptError(f"{where}: 'content' must be a string, got {_kind(entry['content'])}")
    if "tool_calls" in entry:
        calls = entry["tool_calls"]
        if not isinstance(calls, list) or not calls:
            raise ScriptError(f"{where}: 'tool_calls' must be a non-empty list of {{name, arguments}} objects")
        for j, call in enumerate(calls):
            _check_call(call, f"{where}: tool_calls[{j}]")
    try:
        json.dumps(entry, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ScriptError(f"{where}: not representable as JSON ({exc})") from None
    return entry


def _check_call(call: Any, where: str) -> None:
    if not isinstance(call, dict):
        raise ScriptError(f"{where}: a tool call is an object with 'name' and 'arguments', got {_kind(call)}")
    for key in CALL_KEYS:
        if key not in call:
            raise ScriptError(f"{where}: missing {key!r}; a tool call has 'name' and 'arguments'")
    unknown = sorted(set(call) - set(CALL_KEYS), key=str)
    if unknown:
        raise ScriptError(f"{where}: unknown key {unknown[0]!r}; a tool call has only 'name' and 'arguments'")
    if not isinstance(call["name"], str) or not call["name"]:
        raise ScriptError(f"{where}: 'name' must be the tool's name, a non-empty string")
    if not isinstance(call["arguments"], dict):
        raise ScriptError(f"{where}: 'arguments' must be an object (the tool's input), got {_kind(call['arguments'])}")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
