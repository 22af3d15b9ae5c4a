"""A run's inputs against what its flow declares, checked before anything runs.

A StartNode's inputs are JSON Schema properties; a value of the wrong type would otherwise
travel until some tool or template happens to choke on it, long after the caller could be told.
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from heddle.tools.schema import Checker


def declared_inputs(flow: Any) -> list[dict[str, Any]]:
    """The StartNode's input properties (its outputs, when it declares no inputs)."""
    start = flow.start_node
    declared: list[dict[str, Any]] = getattr(start, "inputs", None) or getattr(start, "outputs", None) or []
    return declared


@dataclass(frozen=True)
class _InputCheck:
    """A StartNode's declared inputs as a schema, and that schema's compiled checker."""

    declared: list[dict[str, Any]]  # a copy of them as they were when compiled
    titles: tuple[str, ...]
    checker: Checker


# By id() of the StartNode, while it lives: a server checks every request's inputs against the
# same few flows, and finding the checker by the schema's JSON would cost more than the check.
_checks: dict[int, tuple[weakref.ref[Any], _InputCheck]] = {}


def _input_check(start: Any, declared: list[dict[str, Any]]) -> _InputCheck:
    key = id(start)
    kept = _checks.get(key)
    # The same node, its inputs as they were (a flow is not edited once read; if one were, its
    # inputs would be compiled again rather than checked against what they no longer say).
    if kept is not None and kept[0]() is start and kept[1].declared == declared:
        return kept[1]
    from heddle.tools.schema import compiled_checker

    properties = {p["title"]: dict(p) for p in declared}
    check = _InputCheck(copy.deepcopy(declared), tuple(properties),
                        compiled_checker({"type": "object", "properties": properties}))
    try:
        ref = weakref.ref(start, lambda _: _checks.pop(key, None))
    except TypeError:
        return check  # an object that cannot be referred to weakly is compiled each time
    _checks[key] = (ref, check)
    return check


def input_problem(flow: Any, inputs: dict[str, Any]) -> str | None:
    """Why a given input does not match its declared schema (naming the input), or None.
    Inputs the flow does not declare, and declared ones not given, are not this check's business."""
    from heddle.tools.schema import describe_errors

    declared = declared_inputs(flow)
    if not declared:
        return None
    try:
        check = _input_check(flow.start_node, declared)
        given = {title: inputs[title] for title in check.titles if title in inputs}
        if not given:
            return None
        return describe_errors(check.checker(given))
    except Exception as exc:
        # Only a schema jsonschema checked can be refused by it, so it is imported by then.
        import jsonschema

        if not isinstance(exc, (jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType)):
            raise
        start = flow.start_node.name
        first = str(exc).splitlines()[0]
        return f"StartNode {start!r} declares an input schema that cannot be checked ({first}); fix the flow"
