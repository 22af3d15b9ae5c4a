"""Whether two JSON Schemas can admit a value in common: a document's declaration of a tool against
the schema its server lists.

The reference runtime does not compare the two: it calls the tool and the server judges each call.
A document may declare `number` where its server lists `integer` (an integer it sends is taken), so
a difference alone refuses nothing; only a real conflict does, where no value the document may send
could be taken: types that cannot meet (`string` against `integer`; `integer` lies within
`number`), enums or consts with no value in common, a property one side needs that the other cannot
send (or takes no such property). Any other keyword (a `minimum`, a `pattern`, array items) is left
to each call, checked against the server's schema before it is sent. The annotations (title,
description, default, examples) admit nothing and are not compared.
"""

from __future__ import annotations

import json
from typing import Any

_ANNOTATIONS = frozenset({"title", "description", "default", "examples", "deprecated", "readOnly", "writeOnly",
                          "$comment", "$schema"})


def _text(schema: Any) -> str:
    return json.dumps(schema, sort_keys=True)


def _bare(schema: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in schema.items() if k not in _ANNOTATIONS and k != "nullable"}
    # OpenAPI's `nullable: true`, as some servers write it: null is admitted too.
    if schema.get("nullable") is True and "type" in out:
        kinds = [out["type"]] if isinstance(out["type"], str) else list(out["type"])
        out["type"] = [*kinds, "null"] if "null" not in kinds else kinds
    return out


def _types(schema: dict[str, Any]) -> set[str] | None:
    """The JSON types the schema's `type` admits; None when it does not say."""
    kind = schema.get("type")
    if kind is None:
        return None
    return {kind} if isinstance(kind, str) else set(kind)


def _meet(mine: set[str], theirs: set[str]) -> set[str]:
    both = mine & theirs
    if "integer" in (mine | theirs) and "number" in (mine | theirs) and both.isdisjoint({"integer", "number"}):
        both.add("integer")  # `integer` against `number`: the integers
    return both


def _admits(schema: dict[str, Any], value: Any) -> bool:
    import jsonschema

    return bool(jsonschema.Draft202012Validator(_bare(schema)).is_valid(value))


def conflict(mine: Any, theirs: Any, where: str = "") -> str | None:
    """None when some value `mine` admits, `theirs` admits too (as far as the keywords above say);
    else where and how they cannot meet."""
    here = where or "the value"
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return f"{here}: {_text(mine)} against {_text(theirs)}" if False in (mine, theirs) else None
    mine, theirs = _bare(mine), _bare(theirs)
    for finite, other, whose in ((mine, theirs, "the document's"), (theirs, mine, "the server's")):
        if "enum" in finite or "const" in finite:
            values = finite["enum"] if "enum" in finite else [finite["const"]]
            if any(_admits(finite, v) and _admits(other, v) for v in values):
                return None
            return f"{here}: none of {whose} values {_text(values)} is admitted by {_text(other)}"
    for split, other, ours in ((mine, theirs, True), (theirs, mine, False)):
        branches = split.get("anyOf", split.get("oneOf"))
        if isinstance(branches, list):
            rest = {k: v for k, v in split.items() if k not in ("anyOf", "oneOf")}
            options = [{**rest, **b} for b in branches if isinstance(b, dict)]
            if any((conflict(o, other) if ours else conflict(other, o)) is None for o in options):
                return None
            return f"{here}: {_text(mine)} meets none of {_text(theirs)}"
    kinds, wide = _types(mine), _types(theirs)
    if kinds is not None and wide is not None:
        kinds = _meet(kinds, wide)
        if not kinds:
            return f"{here}: the document says {'/'.join(sorted(_types(mine) or ()))}, " \
                   f"the server {'/'.join(sorted(wide))}"
    # Object keywords bind objects alone: a conflict there is one only where both admit nothing else.
    if (kinds or wide) == {"object"}:
        return _object_conflict(mine, theirs, where)
    return None


def _property(schema: dict[str, Any], name: str) -> Any:
    found = (schema.get("properties") or {}).get(name)
    if found is not None:
        return found
    extra = schema.get("additionalProperties", {})
    return extra if isinstance(extra, dict) else {}


def _object_conflict(mine: dict[str, Any], theirs: dict[str, Any], where: str) -> str | None:
    """Where no object both admit: a property one requires that the other cannot take, or a
    property both may need whose schemas cannot meet."""
    prefix = f"{where}." if where else ""
    names: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for one, other, whose in ((mine, theirs, "document"), (theirs, mine, "server")):
        for name in one.get("required") or []:
            props = other.get("properties") or {}
            if name not in props and other.get("additionalProperties") is False:
                return f"{prefix}{name}: " + ("the document always sends it, and the server takes no such property"
                                             if whose == "document" else
                                             "the server requires it, and the document has no way to send it")
            names[name] = (_property(mine, name), _property(theirs, name))
    for name, (a, b) in names.items():
        problem = conflict(a, b, f"{prefix}{name}")
        if problem is not None:
            return problem
    return None
