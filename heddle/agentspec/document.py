"""Reading a document: bytes -> mapping -> resolved mapping -> the typed `Flow` heddle runs.

The top level may be a Flow, an Agent or a single node (heddle.agentspec.roots makes each a Flow), or a
`$component_ref` to one; its shared components may come from a second file (`--components`).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from heddle.agentspec.catalog import refusal_message
from heddle.agentspec.components import KNOWN_COMPONENT_TYPES
from heddle.agentspec.fields import describe, undefined_fields, unread_fields
from heddle.agentspec.references import REFS, resolve_references
from heddle.agentspec.roots import build_root, document_root, remember
from heddle.agentspec.versions import READS, newer_features, parse_version, readable
from heddle.agentspec.waits import wait_points
from heddle.errors import DocumentError
from heddle.safeparse import NotRegularFileError, ParseLimitError, load_yaml, loads_json, read_regular

if TYPE_CHECKING:
    from pydantic import ValidationError

    from heddle.agentspec.components import Flow

Format = Literal["json", "yaml"]
_FORMATS: dict[str, Format] = {"json": "json", "yaml": "yaml"}



@dataclass(frozen=True)
class Components:
    """Shared components from a second file: the `$referenced_components` of a disaggregated
    configuration, the scope around the document's own references."""

    table: Mapping[str, Any]
    source: str  # how errors name the file, e.g. "--components comps.yaml"


def detect_format(path: Path, forced: str | None = None) -> Format:
    if forced:
        fmt = _FORMATS.get(forced)
        if fmt is None:
            raise DocumentError(f"--format must be json or yaml, not {forced!r}")
        return fmt
    return "yaml" if path.suffix.lower() in (".yaml", ".yml") else "json"


def read_yaml(text: str, source: str, *, aliases: bool = True) -> Any:
    """YAML text within the nesting and alias caps (`aliases=False` refuses every alias), or a
    DocumentError naming `source` and, for text that is not YAML, the line and column."""
    import yaml

    try:
        return load_yaml(text, aliases=aliases)
    except ParseLimitError as exc:
        raise DocumentError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise DocumentError(f"{source}:{where} is not valid YAML: {problem}") from None


def _parse_text(text: str, fmt: Format, source: str) -> Any:
    # Within the nesting and alias caps: a flow file may come from anyone (a bundle, a request).
    if fmt == "yaml":
        return read_yaml(text, source)
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
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_component_types(item, source, f"{path}[{i}]", node_types)
    elif isinstance(node, dict):
        ctype = node.get("component_type")
        if ctype is not None and ctype not in KNOWN_COMPONENT_TYPES and ctype not in node_types:
            # A type the specification defines is refused with why, and what would run it.
            refused = refusal_message(str(ctype), name=node.get("name"), path=path)
            if refused is not None:
                raise DocumentError(f"{source}: {refused}")
            known = ", ".join((*KNOWN_COMPONENT_TYPES, *sorted(node_types)))
            hint = "" if node_types else " (a plugin's node type needs --plugin MANIFEST)"
            raise DocumentError(f"{source}: {path} has unknown component_type {ctype!r}; known types: {known}{hint}")
        for key, value in node.items():
            if key not in ("metadata",):
                _check_component_types(value, source, f"{path}.{key}", node_types)


def _describe_validation_error(exc: ValidationError, source: str) -> str:
    # A component referenced from several places (a node and the edges naming it) fails once per
    # place with one message: the first place is enough.
    firsts: dict[tuple[str, str], Any] = {}
    for err in exc.errors():
        firsts.setdefault((err["msg"], json.dumps(err.get("input"), sort_keys=True, default=str)), err)
    errors = list(firsts.values())
    parts = []
    for err in errors[:5]:
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"])
        # Pydantic puts the union tag in the location; it is noise for a reader.
        loc = re.sub(r"\.(Flow|StartNode|EndNode|ToolNode|AgentNode|LlmNode|BranchingNode|FlowNode|"
                     r"MapNode|ParallelMapNode|ParallelFlowNode|CatchExceptionNode|InputMessageNode|OutputMessageNode|"
                     r"MCPTool|MCPToolSpec|StdioTransport|SSETransport|SSEmTLSTransport|StreamableHTTPTransport|"
                     r"StreamableHTTPmTLSTransport|str|"
                     r"RemoteTool|ClientTool|BuiltinTool|SpecializedAgent|AgentSpecializationParameters|Swarm|"
                     r"ManagerWorkers|"
                     r"PluginNode|Agent|ServerTool|OpenAiConfig|OpenAiCompatibleConfig|VllmConfig|OllamaConfig|GeminiConfig)"
                     r"(?=\.|\[|$)", "", loc)
        parts.append(f"${loc}: {err['msg']}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return f"{source}: " + "; ".join(parts) + more


def declared_version(data: Mapping[str, Any], source: str) -> str | None:
    """The document's `agentspec_version` (or its former name, `air_version`), refused unless heddle reads it."""
    field = "agentspec_version" if "agentspec_version" in data else "air_version"
    value = data.get(field)
    if value is None:
        return None
    # YAML reads `26.1` as a number; the version is its text.
    text = str(value) if isinstance(value, (str, int, float)) and not isinstance(value, bool) else None
    version = parse_version(text) if text is not None else None
    if text is None or version is None or not readable(version):
        raise DocumentError(f"{source}: {field} {value!r} is not supported; heddle reads {READS}")
    return text


def parse_components(data: Any, *, source: str) -> Components:
    """A components file: one key, `$referenced_components`, an object of id -> component."""
    if not isinstance(data, dict) or set(data) != {REFS}:
        found = f"keys {', '.join(sorted(map(str, data)))}" if isinstance(data, dict) else type(data).__name__
        raise DocumentError(f"{source}: a components file is an object with one key, {REFS} (id -> component, "
                            f"as a disaggregated configuration is exported), not {found}")
    table = data[REFS]
    if not isinstance(table, dict) or not all(isinstance(k, str) for k in table):
        raise DocumentError(f"{source}: {REFS} must be an object of id -> component")
    return Components(table=table, source=source)


def parse_flow(data: Any, *, source: str = "<flow>", node_types: Iterable[str] = (),
               components: Components | None = None, strict: bool = False) -> Flow:
    """Turn a parsed document (dict) into the typed, reference-resolved `Flow` heddle runs.

    The top level may be a Flow, an Agent or a node (heddle.agentspec.roots), or a `$component_ref` to
    one. `node_types` are the node component types loaded plugins declare; any other unknown
    type is refused. `components` are shared components from a second file. A field the
    specification does not define for its component is dropped with a warning (heddle.agentspec.fields),
    or refused when `strict`.
    """
    from pydantic import ValidationError


    if not isinstance(data, dict):
        raise DocumentError(f"{source}: the document must be an object: a component (a Flow, an Agent or a "
                            "node) with its component_type")
    version = declared_version(data, source)
    resolved = resolve_references(data, source=source, components=components.table if components else None,
                                  components_source=components.source if components else "--components")
    if not isinstance(resolved, dict) or not isinstance(resolved.get("component_type"), str):
        raise DocumentError(f"{source}: the document's top level has no component_type; give a Flow, an Agent "
                            "or a node")
    if version is not None and "agentspec_version" in resolved:
        resolved["agentspec_version"] = version  # its text, though YAML read `26.1` as a number
    undefined = [f"{source}: {describe(*found)}" for found in _drop_undefined(resolved)]
    if undefined and strict:
        raise _strict_refusal(undefined)
    unread = unread_fields(resolved)
    if unread:
        raise DocumentError(f"{source}: " + "; ".join(unread))
    types = frozenset(node_types)
    _check_component_types(resolved, source, node_types=types)
    waits, refused = wait_points(resolved)
    if refused:
        raise DocumentError(f"{source}: " + "; ".join(refused))

    def validate(model: Any, value: Any) -> Any:
        try:
            if hasattr(model, "model_validate"):
                return model.model_validate(value)
            return model.validate_python(value)
        except ValidationError as exc:
            raise DocumentError(_describe_validation_error(exc, source)) from None

    flow = build_root(resolved, source=source, node_types=types, validate=validate)
    warnings = list(undefined)
    if version is not None:
        # The Flow made for another top level (or reached by a root reference) is in the document's version.
        flow.agentspec_version = flow.agentspec_version or version
        too_new = newer_features(resolved, version, source=source)
        if too_new:
            raise DocumentError("; ".join(too_new))
    if warnings:
        remember(flow, dataclasses.replace(document_root(flow), warnings=tuple(warnings)))
    if waits or undefined:
        remember(flow, dataclasses.replace(document_root(flow), waits=tuple(waits), undefined=tuple(undefined)))
    return flow


def _strict_refusal(undefined: list[str] | tuple[str, ...]) -> DocumentError:
    return DocumentError("; ".join(undefined) + " (--strict refuses a field the specification does not define; "
                         "remove it, or run without --strict)")


def check_strict(flow: Flow) -> None:
    """Under --strict, refuse a document read before (a bundle's) that writes fields the specification
    does not define."""
    undefined = document_root(flow).undefined
    if undefined:
        raise _strict_refusal(undefined)


def _drop_undefined(resolved: Any) -> list[tuple[str, dict[str, Any], str]]:
    """Remove from `resolved`, as the specification's reader does, the fields no component's type
    defines; return where each was."""
    found = undefined_fields(resolved)
    for _, component, field in found:
        component.pop(field, None)
    return found


def load_flow_text(text: str, *, fmt: Format = "json", source: str = "<flow>", node_types: Iterable[str] = (),
                   components: Components | None = None, strict: bool = False) -> Flow:
    return parse_flow(_parse_text(text, fmt, source), source=source, node_types=node_types, components=components,
                      strict=strict)


def _read_text(p: Path, what: str) -> str:
    try:
        # A FIFO or a device is refused from its stat: reading one would block or never end.
        return read_regular(p).decode("utf-8")
    except FileNotFoundError:
        raise DocumentError(f"{p}: no such file") from None
    except NotRegularFileError as exc:
        if exc.kind == "a directory":
            raise DocumentError(f"{p}: is a directory; give the {what}'s path") from None
        raise DocumentError(f"{p}: is {exc.kind}, not a regular file; give the path of a {what}") from None
    except ParseLimitError as exc:
        raise DocumentError(f"{p}: {exc}") from None
    except UnicodeDecodeError:
        raise DocumentError(f"{p}: is not UTF-8 text") from None
    except OSError as exc:
        raise DocumentError(f"{p}: cannot be read: {exc.strerror}") from None


def load_components(path: str | Path, *, source: str | None = None) -> Components:
    """Read the components file at `path` (JSON, or YAML by its .yaml/.yml name)."""
    p = Path(path)
    label = source or f"--components {p}"
    text = _read_text(p, "components file")
    return parse_components(_parse_text(text, detect_format(p), label), source=label)


def load_flow(path: str | Path, *, fmt: str | None = None, node_types: Iterable[str] = (),
              components: str | Path | Components | None = None, strict: bool = False) -> Flow:
    """Read, resolve and type the document at `path`; `components` is a components file (or one read)."""
    p = Path(path)
    text = _read_text(p, "flow document")
    shared = components if isinstance(components, Components) or components is None else load_components(components)
    return load_flow_text(text, fmt=detect_format(p, fmt), source=str(p), node_types=node_types, components=shared,
                          strict=strict)
