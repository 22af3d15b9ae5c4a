"""`$component_ref` resolution, following the Agent Spec rules.

A component may carry `$referenced_components`, a map of id -> component. A `$component_ref`
anywhere below it (including inside other referenced components) resolves against the maps of
all its enclosing components, nearest first. References to one id resolve to the same object, so
a shared `llm_config` stays one config. Missing ids and cycles are errors that name the id and the
JSON path where the reference was used.

The document's top level may itself be a reference (beside its own `$referenced_components` and
its `agentspec_version`), and a document may take its shared components from a second file, as
disaggregated configurations do: that file's table is the outermost scope, and an id both define
is refused rather than silently taken from one of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from heddle.errors import DocumentError
from heddle.safeparse import DEFAULT_PARSE_LIMITS

REF = "$component_ref"
REFS = "$referenced_components"
# What may stand beside a reference at the top level of a document: its table and its version.
ROOT_KEYS = frozenset({REFS, "agentspec_version", "air_version"})


class _Scope:
    __slots__ = ("label", "parent", "resolved", "table")

    def __init__(self, parent: _Scope | None, table: Mapping[str, Any], label: str = REFS) -> None:
        self.parent = parent
        self.table = table
        self.label = label  # how a path into this table starts
        self.resolved: dict[str, Any] = {}

    def find(self, ref: str) -> _Scope | None:
        scope: _Scope | None = self
        while scope is not None:
            if ref in scope.table:
                return scope
            scope = scope.parent
        return None


def _short(path: str) -> str:
    return path if len(path) <= 120 else f"{path[:60]}...{path[-50:]}"


def resolve_references(document: Any, *, source: str = "<flow>", components: Mapping[str, Any] | None = None,
                       components_source: str = "--components") -> Any:
    """Return `document` with every `$component_ref` replaced by the component it names.

    `components` is a second file's `$referenced_components` (id -> component), the scope around
    the whole document; `components_source` names that file in errors."""
    resolving: list[str] = []
    # Each reference inlines a component where it is used, so a chain of them nests deeper,
    # and stands for more values, than the text does: both are capped as the walk goes, before
    # it runs out of stack or anything after it walks an exponential tree.
    max_depth = DEFAULT_PARSE_LIMITS.max_resolved_depth
    max_nodes = DEFAULT_PARSE_LIMITS.max_nodes
    shape: dict[int, tuple[int, int]] = {}  # id(resolved container) -> (values expanded, height)

    def shape_of(value: Any) -> tuple[int, int]:
        return shape[id(value)] if isinstance(value, (list, dict)) else (1, 0)

    def measured(out: Any, children: Iterable[Any], path: str) -> Any:
        nodes, height = 1, 0
        for child in children:
            n, h = shape_of(child)
            nodes += n
            height = max(height, h)
        if nodes > max_nodes:
            raise DocumentError(f"{source}: {_short(path)} stands for more than {max_nodes} values once its "
                                f"{REF}s are resolved; refer to fewer copies of the same components")
        shape[id(out)] = (nodes, height + 1)
        return out

    outer = _Scope(None, components, f"{components_source} {REFS}") if components is not None else None

    def walk(node: Any, scope: _Scope | None, path: str, depth: int = 0) -> Any:
        if not isinstance(node, (list, dict)):
            return node
        if depth >= max_depth:
            raise DocumentError(f"{source}: {_short(path)} nests deeper than {max_depth} levels once its "
                                f"{REF}s are resolved; a chain of references that long is not a flow heddle runs")
        if isinstance(node, list):
            items = [walk(item, scope, f"{path}[{i}]", depth + 1) for i, item in enumerate(node)]
            return measured(items, items, path)
        scope = enter(node, scope, path)
        if REF in node:
            return follow(node, scope, path, depth)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == REFS:
                continue
            out[key] = walk(value, scope, f"{path}.{key}", depth + 1)
        return measured(out, out.values(), path)

    def enter(node: dict[str, Any], scope: _Scope | None, path: str) -> _Scope | None:
        table = node.get(REFS)
        if table is None:
            return scope
        if not isinstance(table, dict):
            raise DocumentError(f"{source}: {path}.{REFS} must be an object of id -> component")
        if outer is not None:
            clash = sorted(set(table) & set(outer.table))
            if clash:
                raise DocumentError(f"{source}: {path}.{REFS} defines {clash[0]!r}, which {components_source} "
                                    "also defines; keep one of them")
        return _Scope(scope, table)

    def follow(node: dict[str, Any], scope: _Scope | None, path: str, depth: int) -> Any:
        ref = node[REF]
        if not isinstance(ref, str):
            raise DocumentError(f"{source}: {path}.{REF} must be a string id")
        extra = set(node) - {REF} - (ROOT_KEYS if path == "$" else set())
        if extra:
            raise DocumentError(
                f"{source}: {path} has {REF} beside other keys ({', '.join(sorted(extra))}); "
                "a reference must stand alone"
            )
        owner = scope.find(ref) if scope else None
        if owner is None:
            elsewhere = "" if outer is not None else " (or pass the file that defines it with --components FILE)"
            raise DocumentError(
                f"{source}: {path} refers to component {ref!r}, which is not in any enclosing "
                f"{REFS}; add it there or fix the id{elsewhere}"
            )
        if ref in owner.resolved:
            value = owner.resolved[ref]
            # Resolved once, at the depth of its first use: this use may be deeper.
            if depth + shape_of(value)[1] > max_depth:
                raise DocumentError(f"{source}: {_short(path)} nests deeper than {max_depth} levels once its "
                                    f"{REF}s are resolved; a chain of references that long is not a flow heddle runs")
            return value
        if ref in resolving:
            chain = " -> ".join([*resolving[resolving.index(ref):], ref])
            raise DocumentError(f"{source}: reference cycle {chain} (at {path})")
        resolving.append(ref)
        try:
            # A referenced component sees the scope it was declared in (and its own table).
            value = walk(owner.table[ref], owner, f"{owner.label}[{ref!r}]", depth)
        finally:
            resolving.pop()
        owner.resolved[ref] = value
        return value

    return walk(document, outer, "$")
