"""Turning what a request names (`flow` inline, or `flowPath`) into a typed flow.

The document is untrusted: YAML aliases are refused (they can expand a small text into an
enormous tree), and any failure to read it is the caller's 400, never the server's 500.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.agentspec.document import read_yaml
from heddle.errors import DocumentError, HeddleError

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.agentspec.document import Format


def _typed(data: Any, source: str, node_types: frozenset[str]) -> Flow:
    from heddle.agentspec import parse_flow

    try:
        return parse_flow(data, source=source, node_types=node_types)
    except HeddleError:
        raise
    except RecursionError:
        raise DocumentError(f"{source}: the document nests too deeply to be read") from None
    except Exception as exc:  # noqa: BLE001 - an unreadable document is the caller's error
        raise DocumentError(f"{source}: cannot be read as a flow ({type(exc).__name__}: {exc})") from None


def flow_from_value(value: Any, *, source: str = "flow", node_types: frozenset[str] = frozenset()) -> Flow:
    """A request's `flow`: a document object, or its JSON or YAML text. `node_types` are the
    node types the server's plugins add."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            from heddle.canonical import CanonicalJSONError
            from heddle.safeparse import ParseLimitError, loads_strict_json

            try:
                value = loads_strict_json(text)
            except ParseLimitError as exc:
                raise DocumentError(f"{source}: {exc}") from None
            except (ValueError, CanonicalJSONError) as exc:
                raise DocumentError(f"{source}: is not valid JSON: {exc}") from None
        else:
            value = read_yaml(text, source, aliases=False)
    elif not isinstance(value, dict):
        raise DocumentError(f"{source}: must be a flow document (an object, or its JSON or YAML text), "
                            f"not {type(value).__name__}")
    return _typed(value, source, node_types)


def flow_from_text(text: str, name: str, *, node_types: frozenset[str] = frozenset()) -> Flow:
    """The `flowPath` document `name` from its text (read under the server's flows root), errors naming
    the path as the caller wrote it, not where it lives."""
    from heddle.agentspec import load_flow_text

    fmt: Format = "yaml" if Path(name).suffix.lower() in (".yaml", ".yml") else "json"
    source = f"flowPath {name}"
    try:
        return load_flow_text(text, fmt=fmt, source=source, node_types=node_types)
    except HeddleError:
        raise
    except Exception as exc:  # noqa: BLE001 - an unreadable document is the caller's error
        raise DocumentError(f"{source}: cannot be read as a flow ({type(exc).__name__}: {exc})") from None
