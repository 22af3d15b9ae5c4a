"""The checks a server makes on every request, kept exact where their work is done once per flow:
strict JSON's duplicate keys, and a StartNode's inputs against a checker compiled once."""

from __future__ import annotations

import pytest

from heddle.canonical import CanonicalJSONError, loads_strict
from heddle.engine.inputs import input_problem
from heddle.server.documents import flow_from_value


def _flow(inputs: list[dict[str, object]]) -> object:
    nodes = [{"component_type": "StartNode", "id": "start", "name": "start", "inputs": inputs, "outputs": inputs},
             {"component_type": "EndNode", "id": "end", "name": "end", "branches": [], "inputs": inputs,
              "outputs": inputs}]
    edge = {"component_type": "ControlFlowEdge", "id": "c0", "name": "c0", "from_node": {"$component_ref": "start"},
            "from_branch": None, "to_node": {"$component_ref": "end"}}
    return flow_from_value({"component_type": "Flow", "agentspec_version": "26.1.0", "id": "f", "name": "f",
                            "inputs": inputs, "outputs": inputs, "start_node": {"$component_ref": "start"},
                            "nodes": [{"$component_ref": n["id"]} for n in nodes],
                            "control_flow_connections": [edge], "data_flow_connections": [],
                            "$referenced_components": {n["id"]: n for n in nodes}})


@pytest.mark.parametrize(("text", "key"), [('{"a": 1, "a": 2}', "a"), ('{"x": [{"b": 1, "c": 2, "b": 3}]}', "b"),
                                           ('{"k": 1, "m": {"n": 1, "n": 1}}', "n")])
def test_strict_json_still_names_the_repeated_key(text: str, key: str) -> None:
    with pytest.raises(CanonicalJSONError, match=f"duplicate key {key!r}"):
        loads_strict(text)
    assert loads_strict('{"a": {"b": [1, {"c": null}]}, "d": "e"}') == {"a": {"b": [1, {"c": None}]}, "d": "e"}


def test_inputs_are_checked_the_same_on_every_request_and_again_after_an_edit() -> None:
    flow = _flow([{"title": "n", "type": "integer"}, {"title": "s", "type": "string"}])
    for _ in range(2):  # the second request uses the checker the first compiled
        assert input_problem(flow, {"n": 3, "s": "x", "other": object()}) is None
        problem = input_problem(flow, {"n": "3", "s": 4})
        assert problem == "n: '3' is not of type 'integer'; s: 4 is not of type 'string'"
        assert input_problem(flow, {}) is None
    # A flow edited in place after it was read is compiled again, never checked by what it no longer says.
    flow.start_node.inputs[0]["type"] = "string"  # type: ignore[attr-defined]
    assert input_problem(flow, {"n": "3"}) is None
    assert input_problem(flow, {"n": 3}) == "n: 3 is not of type 'string'"
