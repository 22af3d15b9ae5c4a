"""Every field the specification defines for a component type heddle runs is honoured, or refused,
naming it, when a document sets it: heddle.agentspec.fields' table says which, and these tests hold the
table against pyagentspec 26.3.1's models (a field a release adds is noticed), against heddle's
own models (an honoured field is read; a refused one is refused) and against docs/agentspec.md."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from heddle.agentspec import catalog
from heddle.agentspec import components as c
from heddle.agentspec.fields import COMMON, REFUSED_WHEN_SET, SPEC_FIELDS, _modelled, markdown_table, unread_fields
from tests.examples.test_pyagentspec_valid import _pyagentspec_python

DOC = Path(__file__).resolve().parents[2] / "docs" / "agentspec.md"
RUNS = [t for t in c.KNOWN_COMPONENT_TYPES if catalog.status(t) == "runs"]


def honoured(ctype: str) -> frozenset[str]:
    """What the table says heddle honours of a type's fields: all but those it refuses when set."""
    return SPEC_FIELDS[ctype] - REFUSED_WHEN_SET.get(ctype, frozenset())

# pyagentspec's fields of each type, in its scratch environment; those every component has (and
# those it never serialises) aside.
FIELDS = r"""
import json
from pyagentspec.component import Component
from pyagentspec._component_registry import BUILTIN_CLASS_MAP
import sys
base = set(Component.model_fields) | {"component_type"}
out = {t: sorted(set(BUILTIN_CLASS_MAP[t].model_fields) - base) for t in json.loads(sys.argv[1])}
print(json.dumps(out))
"""


def test_the_table_names_every_field_pyagentspec_defines_for_a_type_heddle_runs() -> None:
    python = _pyagentspec_python()
    proc = subprocess.run([str(python), "-c", FIELDS, json.dumps(RUNS)], check=False, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    theirs = json.loads(proc.stdout)
    differ = {t: {"pyagentspec": sorted(set(theirs[t]) - SPEC_FIELDS[t]), "heddle": sorted(SPEC_FIELDS[t] -
                                                                                            set(theirs[t]))}
              for t in RUNS if set(theirs[t]) != SPEC_FIELDS[t]}
    assert differ == {}, ("pyagentspec's fields differ from heddle.agentspec.fields.SPEC_FIELDS; honour each new "
                          f"field exactly or add it to REFUSED_WHEN_SET, and docs/agentspec.md's Fields: {differ}")


@pytest.mark.parametrize("ctype", RUNS)
def test_each_field_is_honoured_or_refused_and_an_honoured_one_is_read(ctype: str) -> None:
    refused = REFUSED_WHEN_SET.get(ctype, frozenset())
    assert refused <= SPEC_FIELDS[ctype]
    assert honoured(ctype) | refused == SPEC_FIELDS[ctype] and not honoured(ctype) & refused
    # An honoured field is one heddle's model reads; one its model does not read must be refused.
    modelled = _modelled()[ctype] - COMMON
    assert honoured(ctype) <= modelled, sorted(honoured(ctype) - modelled)
    assert SPEC_FIELDS[ctype] - modelled <= refused


# A value other than the field's default, for each refused field.
SET = {"api_type": "responses", "api_provider": "acme", "provider": "acme", "ca_file": "ca.pem",
       "cert_file": "c.pem", "key_file": "k.pem", "api_key": "$KEY", "url": "http://127.0.0.1:9/v1",
       "retry_policy": {"max_attempts": 1}, "auth": {"component_type": "OAuthConfig", "name": "o"},
       "inputs": [{"title": "q", "type": "string"}], "outputs": [{"title": "a", "type": "string"}]}
# The least of each type whose model reads a refused field, to give it one.
LEAST: dict[str, dict[str, Any]] = {
    "GeminiConfig": {"model_id": "gemini-2.0-flash", "auth": {"component_type": "GeminiAIStudioAuthConfig"}},
    "RemoteTool": {"url": "http://127.0.0.1:9/x", "http_method": "GET"},
    "ApiNode": {"url": "http://127.0.0.1:9/x", "http_method": "GET"},
    "StreamableHTTPTransport": {"url": "http://127.0.0.1:9/mcp"},
    "StreamableHTTPmTLSTransport": {"url": "https://127.0.0.1:9/mcp", "key_file": "k", "cert_file": "c",
                                    "ca_file": "a"},
    "SSETransport": {"url": "http://127.0.0.1:9/sse"},
    "SSEmTLSTransport": {"url": "https://127.0.0.1:9/sse", "key_file": "k", "cert_file": "c", "ca_file": "a"},
    "A2AConnectionConfig": {},
    "A2AAgent": {"agent_url": "http://127.0.0.1:9/", "connection_config": {"component_type": "A2AConnectionConfig",
                                                                          "name": "cc"}},
}
REFUSED = sorted((t, f) for t, fields in REFUSED_WHEN_SET.items() for f in fields)


@pytest.mark.parametrize(("ctype", "field"), REFUSED, ids=[f"{t}.{f}" for t, f in REFUSED])
def test_a_refused_field_set_is_refused_naming_it(ctype: str, field: str) -> None:
    value = SET[field]
    if field not in _modelled()[ctype]:
        [found] = unread_fields({"component_type": ctype, "name": "x", field: value})
        assert f"{ctype} 'x' gives {field}" in found
        assert unread_fields({"component_type": ctype, "name": "x", field: None}) == []
        return
    model = {cls.model_fields["component_type"].default: cls for cls in vars(c).values()
             if isinstance(cls, type) and issubclass(cls, c.Component) and "component_type" in cls.model_fields}[ctype]
    model.model_validate({"name": "x", **LEAST[ctype]})  # the least is read
    with pytest.raises(ValidationError) as info:
        model.model_validate({"name": "x", **LEAST[ctype], field: value})
    assert field in str(info.value)


def test_docs_agentspec_lists_what_is_refused_when_set() -> None:
    text = DOC.read_text(encoding="utf-8")
    table = text.split("<!-- fields table: python -m heddle.agentspec.fields -->\n", 1)[1].split("<!-- end of", 1)[0]
    assert table == markdown_table(), "docs/agentspec.md's Fields table is stale: python -m heddle.agentspec.fields"


@pytest.mark.parametrize(("node", "refused"), [
    ({"component_type": "StartNode", "branches": ["next"]}, None),
    ({"component_type": "StartNode", "branches": ["next", "next"]}, "name a branch twice"),
    ({"component_type": "ToolNode", "branches": ["done"]}, "are not the branches it has (['next'])"),
    ({"component_type": "EndNode", "branches": ["next"]}, "are not the branches it has ([])"),
    ({"component_type": "BranchingNode", "mapping": {"a": "x"}, "branches": ["x"]}, "(['default', 'x'])"),
    ({"component_type": "BranchingNode", "mapping": {"a": "x"}, "branches": ["x", "default"]}, None),
    ({"component_type": "AgentNode", "branches": ["next", "escalate"]}, None),  # any, as pyagentspec says
])
def test_written_branches_are_checked_as_pyagentspec_checks_them(node: dict[str, Any], refused: str | None) -> None:
    # pyagentspec refuses a node whose written branches are not those it has; WayFlow loads only what it accepts.
    cls = {"StartNode": c.StartNode, "ToolNode": c.ToolNode, "EndNode": c.EndNode, "BranchingNode": c.BranchingNode,
           "AgentNode": c.AgentNode}[node["component_type"]]
    extra: dict[str, Any] = {}
    if cls is c.ToolNode:
        extra["tool"] = {"component_type": "ServerTool", "name": "t"}
    if cls is c.AgentNode:
        extra["agent"] = {"component_type": "Agent", "name": "a", "system_prompt": "hi",
                          "llm_config": {"component_type": "OpenAiCompatibleConfig", "name": "m", "model_id": "m",
                                         "url": "http://127.0.0.1:9/v1"}}
    data = {"name": "n", **node, **extra}
    if refused is None:
        cls.model_validate(data)
        return
    with pytest.raises(ValidationError) as info:
        cls.model_validate(data)
    assert refused in str(info.value) and f"{node['component_type']} 'n'" in str(info.value)
