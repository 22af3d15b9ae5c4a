"""A run's inputs against what its flow declares, checked before anything runs.

A StartNode's inputs are JSON Schema properties; a value of the wrong type would otherwise
travel until some tool or template happens to choke on it, long after the caller could be told.
"""

from __future__ import annotations

from typing import Any


def declared_inputs(flow: Any) -> list[dict[str, Any]]:
    """The StartNode's input properties (its outputs, when it declares no inputs)."""
    start = flow.start_node
    declared: list[dict[str, Any]] = getattr(start, "inputs", None) or getattr(start, "outputs", None) or []
    return declared


def input_problem(flow: Any, inputs: dict[str, Any]) -> str | None:
    """Why a given input does not match its declared schema (naming the input), or None.
    Inputs the flow does not declare, and declared ones not given, are not this check's business."""
    from heddle.tools.schema import check_arguments

    properties = {p["title"]: dict(p) for p in declared_inputs(flow)}
    given = {title: inputs[title] for title in properties if title in inputs}
    if not given:
        return None
    try:
        _, problem = check_arguments({"type": "object", "properties": properties}, given)
    except Exception as exc:
        # Only a schema jsonschema checked can be refused by it, so it is imported by then.
        import jsonschema

        if not isinstance(exc, (jsonschema.exceptions.SchemaError, jsonschema.exceptions.UnknownType)):
            raise
        start = flow.start_node.name
        first = str(exc).splitlines()[0]
        return f"StartNode {start!r} declares an input schema that cannot be checked ({first}); fix the flow"
    return problem
