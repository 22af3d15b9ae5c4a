"""`$component_ref` resolution, following the Agent Spec rules.

A component may carry `$referenced_components`, a map of id -> component. A `$component_ref`
anywhere below it (including inside other referenced components) resolves against the maps of
all its enclosing components, nearest first. References to one id resolve to the same object, so
a shared `llm_config` stays one config. Missing ids and cycles are errors that name the id and the
JSON path where the reference was used.
"""

from __future__ import annotations

from typing import Any

from heddle.errors import DocumentError

REF = "$component_ref"
REFS = "$referenced_components"


class _Scope:
    __slots__ = ("parent", "table", "resolved")

    def __init__(self, parent: "_Scope | None", table: dict[str, Any]) -> None:
        self.parent = parent
        self.table = table
        self.resolved: dict[str, Any] = {}

    def find(self, ref: str) -> "_Scope | None":
        scope: _Scope | None = self
        while scope is not None:
            if ref in scope.table:
                return scope
            scope = scope.parent
        return None


def resolve_references(document: Any, *, source: str = "<flow>") -> Any:
    """Return `document` with every `$component_ref` replaced by the component it names."""
    resolving: list[str] = []

    def walk(node: Any, scope: _Scope | None, path: str) -> Any:
        if isinstance(node, list):
            return [walk(item, scope, f"{path}[{i}]") for i, item in enumerate(node)]
        if not isinstance(node, dict):
            return node
        if REF in node:
            return follow(node, scope, path)
        table = node.get(REFS)
        if table is not None:
            if not isinstance(table, dict):
                raise DocumentError(f"{source}: {path}.{REFS} must be an object of id -> component")
            scope = _Scope(scope, table)
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == REFS:
                continue
            out[key] = walk(value, scope, f"{path}.{key}")
        return out

    def follow(node: dict[str, Any], scope: _Scope | None, path: str) -> Any:
        ref = node[REF]
        if not isinstance(ref, str):
            raise DocumentError(f"{source}: {path}.{REF} must be a string id")
        extra = set(node) - {REF}
        if extra:
            raise DocumentError(
                f"{source}: {path} has {REF} beside other keys ({', '.join(sorted(extra))}); "
                "a reference must stand alone"
            )
        owner = scope.find(ref) if scope else None
        if owner is None:
            raise DocumentError(
                f"{source}: {path} refers to component {ref!r}, which is not in any enclosing "
                f"{REFS}; add it there or fix the id"
            )
        if ref in owner.resolved:
            return owner.resolved[ref]
        if ref in resolving:
            chain = " -> ".join([*resolving[resolving.index(ref):], ref])
            raise DocumentError(f"{source}: reference cycle {chain} (at {path})")
        resolving.append(ref)
        try:
            # A referenced component sees the scope it was declared in (and its own table).
            value = walk(owner.table[ref], owner, f"{REFS}[{ref!r}]")
        finally:
            resolving.pop()
        owner.resolved[ref] = value
        return value

    return walk(document, None, "$")
