"""Reading a flow document: bytes -> mapping -> resolved mapping -> typed `Flow`."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from heddle.errors import DocumentError
from heddle.spec.references import resolve_references

if TYPE_CHECKING:
    from pydantic import ValidationError

    from heddle.spec.components import Flow

Format = Literal["json", "yaml"]
_FORMATS: dict[str, Format] = {"json": "json", "yaml": "yaml"}

SUPPORTED_VERSIONS = re.compile(r"^(25|26)\.\d+(\.\d+)?([.-].*)?$")


def detect_format(path: Path, forced: str | None = None) -> Format:
    if forced:
        fmt = _FORMATS.get(forced)
        if fmt is None:
            raise DocumentError(f"--format must be json or yaml, not {forced!r}")
        return fmt
    return "yaml" if path.suffix.lower() in (".yaml", ".yml") else "json"


def _parse_text(text: str, fmt: Format, source: str) -> Any:
    # Within the nesting and alias caps: a flow file may come from anyone (a bundle, a request).
    from heddle.safeparse import ParseLimitError, load_yaml, loads_json

    if fmt == "yaml":
        import yaml

        try:
            return load_yaml(text)
        except ParseLimitError as exc:
            raise DocumentError(f"{source}: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
            raise DocumentError(f"{source}:{where} is not valid YAML: {problem}") from None
    try:
        return loads_json(text)
    except ParseLimitError as exc:
        raise DocumentError(f"{source}: {exc}") from None
    except json.JSONDecodeError as exc:
        hint = " (is it YAML? name it .yaml or pass --format yaml)" if exc.pos == 0 else ""
        raise DocumentError(
            f"{source}: line {exc.lineno}, column {exc.colno} is not valid JSON: {exc.msg}{hint}"
        ) from None
    except ValueError as exc:  # a number json will not turn into an int, for one
        raise DocumentError(f"{source}: is not valid JSON: {exc}") from None


def _check_component_types(node: Any, source: str, path: str = "$",
                           node_types: frozenset[str] = frozenset()) -> None:
    from heddle.spec.components import KNOWN_COMPONENT_TYPES

    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_component_types(item, source, f"{path}[{i}]", node_types)
    elif isinstance(node, dict):
        ctype = node.get("component_type")
        if ctype is not None and ctype not in KNOWN_COMPONENT_TYPES and ctype not in node_types:
            known = ", ".join((*KNOWN_COMPONENT_TYPES, *sorted(node_types)))
            hint = "" if node_types else " (a plugin's node type needs --plugin MANIFEST)"
            raise DocumentError(f"{source}: {path} has unknown component_type {ctype!r}; known types: {known}{hint}")
        for key, value in node.items():
            if key not in ("metadata",):
                _check_component_types(value, source, f"{path}.{key}", node_types)


def _describe_validation_error(exc: ValidationError, source: str) -> str:
    errors = exc.errors()
    parts = []
    for err in errors[:5]:
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        # Pydantic puts the union tag in the location; it is noise for a reader.
        loc = re.sub(r"\.(Flow|StartNode|EndNode|ToolNode|AgentNode|LlmNode|BranchingNode|FlowNode|"
                     r"PluginNode|Agent|ServerTool|OpenAiConfig|OpenAiCompatibleConfig|VllmConfig|OllamaConfig)"
                     r"(?=\.|\[|$)", "", loc)
        parts.append(f"${loc}: {err['msg']}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return f"{source}: " + "; ".join(parts) + more


def parse_flow(data: Any, *, source: str = "<flow>", node_types: Iterable[str] = ()) -> Flow:
    """Turn a parsed document (dict) into a typed, reference-resolved `Flow`.

    `node_types` are the node component types loaded plugins declare; any other unknown
    type is refused.
    """
    from pydantic import ValidationError

    from heddle.spec.components import Flow

    if not isinstance(data, dict):
        raise DocumentError(f"{source}: the document must be an object with component_type Flow")
    if data.get("component_type") != "Flow":
        raise DocumentError(
            f"{source}: top-level component_type is {data.get('component_type')!r}; heddle runs a Flow"
        )
    version = data.get("agentspec_version")
    if version is not None and not SUPPORTED_VERSIONS.match(str(version)):
        raise DocumentError(
            f"{source}: agentspec_version {version!r} is not supported; heddle reads 25.x and 26.x"
        )
    resolved = resolve_references(data, source=source)
    _check_component_types(resolved, source, node_types=frozenset(node_types))
    try:
        return Flow.model_validate(resolved)
    except ValidationError as exc:
        raise DocumentError(_describe_validation_error(exc, source)) from None


def load_flow_text(text: str, *, fmt: Format = "json", source: str = "<flow>", node_types: Iterable[str] = ()) -> Flow:
    return parse_flow(_parse_text(text, fmt, source), source=source, node_types=node_types)


def load_flow(path: str | Path, *, fmt: str | None = None, node_types: Iterable[str] = ()) -> Flow:
    """Read, resolve and type the flow at `path`."""
    from heddle.safeparse import NotRegularFileError, ParseLimitError, read_regular

    p = Path(path)
    try:
        # A FIFO or a device is refused from its stat: reading one would block or never end.
        text = read_regular(p).decode("utf-8")
    except FileNotFoundError:
        raise DocumentError(f"{p}: no such file") from None
    except NotRegularFileError as exc:
        if exc.kind == "a directory":
            raise DocumentError(f"{p}: is a directory; give the flow document's path") from None
        raise DocumentError(f"{p}: is {exc.kind}, not a regular file; give the path of a flow document") from None
    except ParseLimitError as exc:
        raise DocumentError(f"{p}: {exc}") from None
    except UnicodeDecodeError:
        raise DocumentError(f"{p}: is not UTF-8 text") from None
    except OSError as exc:
        raise DocumentError(f"{p}: cannot be read: {exc.strerror}") from None
    return load_flow_text(text, fmt=detect_format(p, fmt), source=str(p), node_types=node_types)
