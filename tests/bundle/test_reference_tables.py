"""Which `$referenced_components` entry a refusal to seal a literal key names, and in what order: the
document's tables are read by the one walk over a parsed document (agentspec.fields.containers_of), in
document order, the outermost table first where an id is written twice."""

from __future__ import annotations

from typing import Any

from heddle.bundle.flowenv import literal_keys


def _subflow(name: str, table: dict[str, Any]) -> dict[str, Any]:
    return {"component_type": "FlowNode", "name": name,
            "subflow": {"component_type": "Flow", "name": name, "$referenced_components": table}}


def test_literal_keys_in_tables_are_named_in_document_order_the_outermost_first() -> None:
    ref = {"$component_ref": "shared"}
    config = {"component_type": "OpenAiConfig", "name": "main", "model_id": "m", "api_key": ref}
    document = {"component_type": "Flow", "name": "f",
                "nodes": [{"component_type": "AgentNode", "name": "a", "agent": {"llm_config": config}},
                          _subflow("one", {"p.api_key": "sk-p", "shared": "sk-inner", "x.api_key": "sk-inner-x"}),
                          _subflow("two", {"q.api_key": "sk-q", "p.api_key": "sk-later"})],
                "$referenced_components": {"x.api_key": "sk-x", "shared": "sk-outer"}}
    assert literal_keys(document) == [
        "llm_config 'main' at $.nodes[0].agent.llm_config has a literal api_key, given by $component_ref 'shared' "
        "at $.$referenced_components.shared",
        "$referenced_components entry 'x.api_key' at $.$referenced_components.x.api_key is a literal api_key",
        "$referenced_components entry 'p.api_key' at $.nodes[1].subflow.$referenced_components.p.api_key is a "
        "literal api_key",
        "$referenced_components entry 'q.api_key' at $.nodes[2].subflow.$referenced_components.q.api_key is a "
        "literal api_key",
    ]


def test_an_alias_shared_twice_is_read_once() -> None:
    table = {"k.api_key": "sk-k"}
    document = {"component_type": "Flow", "name": "f", "nodes": [_subflow("one", table), _subflow("two", table)]}
    assert literal_keys(document) == [
        "$referenced_components entry 'k.api_key' at $.nodes[0].subflow.$referenced_components.k.api_key is a "
        "literal api_key"]
