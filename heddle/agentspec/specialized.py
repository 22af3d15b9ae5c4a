"""What a SpecializedAgent is, from its base agent and its AgentSpecializationParameters, as the
Agent Spec language reference defines it ("Agent Specialization for Reusability and Flexibility").

Worked out on the document's mappings (references already resolved), before the components are
typed, so the specialised agent is typed and checked like any Agent.
"""

from __future__ import annotations

from typing import Any

from heddle.agentspec.templates import placeholders


def _placeholder_inputs(text: Any) -> list[dict[str, Any]]:
    return [{"title": name, "type": "string"} for name in placeholders(text)] if isinstance(text, str) else []


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _union(name: str, kind: str, *sources: list[Any]) -> list[Any]:
    """The properties of every source, each title once; one title with two types is an error."""
    merged: dict[str, Any] = {}
    for source in sources:
        for prop in source:
            if not isinstance(prop, dict) or not isinstance(prop.get("title"), str):
                continue  # the property check of the typed component names it
            seen = merged.setdefault(prop["title"], prop)
            if seen.get("type") != prop.get("type"):
                raise ValueError(f"SpecializedAgent {name!r}: {kind[:-1]} {prop['title']!r} is {seen.get('type')} "
                                 f"in its agent and {prop.get('type')} in its agent_specialization_parameters; "
                                 "the specification wants one type")
    return list(merged.values())


def specialised_fields(base: dict[str, Any], params: dict[str, Any], *, name: str,
                       inputs: Any, outputs: Any) -> dict[str, Any]:
    """The Agent fields of the SpecializedAgent `name`: llm_config, system prompt, tools,
    toolboxes and human_in_the_loop from `base` refined by `params`, and its inputs and outputs
    (those it declares, else the union of the base agent's and the parameters')."""
    prompt, extra = base.get("system_prompt"), params.get("additional_instructions")
    parts = [text for text in (prompt, extra) if isinstance(text, str) and text]
    fields: dict[str, Any] = {
        "system_prompt": "\n\n".join(parts),
        "tools": [*_listed(base.get("tools")), *_listed(params.get("additional_tools"))],
        "toolboxes": _listed(base.get("toolboxes")),
        "transforms": _listed(base.get("transforms")),
    }
    if "llm_config" in base:
        fields["llm_config"] = base["llm_config"]
    names = [tool.get("name") for tool in fields["tools"] if isinstance(tool, dict)]
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"SpecializedAgent {name!r}: its agent and its additional_tools both have a tool named "
                         f"{twice[0]!r}; the model could not tell them apart, rename one")
    override = params.get("human_in_the_loop")
    if override is not None:
        fields["human_in_the_loop"] = override
    elif "human_in_the_loop" in base:
        fields["human_in_the_loop"] = base["human_in_the_loop"]
    if not inputs:
        fields["inputs"] = _union(name, "inputs", _listed(base.get("inputs")) or _placeholder_inputs(prompt),
                                  _listed(params.get("inputs")) or _placeholder_inputs(extra))
    if not outputs:
        fields["outputs"] = _union(name, "outputs", _listed(base.get("outputs")), _listed(params.get("outputs")))
    return fields
