"""Checking a tool's arguments without jsonschema for schemas of typed properties: the same errors,
in the same order and words, as jsonschema's Draft202012Validator gives."""

from __future__ import annotations

from typing import Any

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from heddle.tools import schema as S

TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]
NAMES = st.sampled_from(["a", "b", "n", "query", "é"])

values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from([0.0, 1.0, 1.5, -2.0]) | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(NAMES, inner, max_size=2),
    max_leaves=4,
)
prop_schemas = st.fixed_dictionaries(
    {},
    optional={
        "title": st.text(max_size=3),
        "description": st.text(max_size=3),
        "default": values,
        "type": st.sampled_from(TYPES) | st.lists(st.sampled_from(TYPES), max_size=3),
    },
)
object_schemas = st.fixed_dictionaries(
    {"type": st.just("object"), "properties": st.dictionaries(NAMES, prop_schemas, max_size=4)},
    optional={"required": st.lists(NAMES, max_size=3), "title": st.text(max_size=2)},
)


def _jsonschema_says(schema: dict[str, Any], arguments: dict[str, Any]) -> tuple[None, str] | None:
    # What check_arguments said before it had its own checker.
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(arguments), key=lambda e: list(e.path))
    if not errors:
        return None
    return None, "; ".join(f"{'/'.join(str(p) for p in e.path) or '(root)'}: {e.message}" for e in errors[:5])


@settings(max_examples=120, deadline=None)
@given(object_schemas, st.dictionaries(NAMES, values, max_size=4))
def test_typed_properties_are_checked_as_jsonschema_checks_them(schema: dict[str, Any],
                                                                arguments: dict[str, Any]) -> None:
    assert S._plain_checker(schema) is not None
    expected = _jsonschema_says(schema, arguments)
    got = S.check_arguments(schema, arguments)
    if expected is None:
        assert got[1] is None
    else:
        assert got == expected


def test_a_schema_that_says_more_goes_to_jsonschema() -> None:
    for schema in ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 2}}},
                   {"type": "object", "properties": {"n": {"type": "decimal"}}},
                   {"type": "object", "additionalProperties": False},
                   {"type": "object", "properties": {"n": True}}):
        assert S._plain_checker(schema) is None
    assert S.check_arguments({"type": "object", "properties": {"n": {"type": "integer", "minimum": 2}}},
                             {"n": 1}) == (None, "n: 1 is less than the minimum of 2")


def test_a_schema_is_compiled_once_and_kept() -> None:
    schema = {"type": "object", "properties": {"n": {"title": "n", "type": "integer"}}, "required": ["n"]}
    first = S.compiled_checker(schema)
    assert S.compiled_checker({"type": "object", "properties": {"n": {"title": "n", "type": "integer"}},
                               "required": ["n"]}) is first
    # Key order is the order of the errors: another order is another checker.
    assert S.compiled_checker({"required": ["n"], "type": "object",
                               "properties": {"n": {"title": "n", "type": "integer"}}}) is not first
    assert S.check_arguments(schema, {"n": 2, "extra": 1}) == ({"n": 2, "extra": 1}, None)
