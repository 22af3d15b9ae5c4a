"""A run's inputs against what its flow declares, checked before anything runs.

A StartNode's inputs are JSON Schema properties; a value of the wrong type would otherwise
travel until some tool or template happens to choke on it, long after the caller could be told.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from heddle.tools.schema import compiled_checker, describe_errors

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


def _input_check(flow: Any, declared: list[dict[str, Any]]) -> _InputCheck:
    """The check kept on `flow` (its `_input_check`, read from the model's private store: finding
    the checker by the schema's JSON, or pydantic's __getattr__, would cost more than the check),
    made now if there is none or its inputs have changed since (a flow is not edited once read;
    if one were, its inputs are compiled again rather than checked against what they no longer say)."""
    private = getattr(flow, "__pydantic_private__", None)
    kept = private.get("_input_check") if private else None
    if isinstance(kept, _InputCheck) and kept.declared == declared:
        return kept
    properties = {p["title"]: dict(p) for p in declared}
    check = _InputCheck(copy.deepcopy(declared), tuple(properties),
                        compiled_checker({"type": "object", "properties": properties}))
    if private is not None:
        private["_input_check"] = check
    return check


def input_problem(flow: Any, inputs: dict[str, Any]) -> str | None:
    """Why a given input does not match its declared schema (naming the input), or None.
    Inputs the flow does not declare, and declared ones not given, are not this check's business."""
    declared = declared_inputs(flow)
    if not declared:
        return None
    try:
        check = _input_check(flow, declared)
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
