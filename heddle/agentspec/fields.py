"""The fields the specification defines for each component type heddle reads, and the fields a
document writes beyond them.

A field the specification does not define for a component is not interpreted: the specification's
reader (pyagentspec) drops it, so its reference runtime never sees it, and heddle does the same. It
is not walked for components, references to refuse or places to wait, and it is not read; each one
is named in a warning (`PATH: TYPE 'name' has field 'F', ...`), and `--strict` refuses the document
instead. The table is pyagentspec 26.3.1's fields of each type (beyond those every component has);
the fields heddle's own model of a type reads are defined too.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from heddle.agentspec import components as c

# Every component's: its identity, and what a serialised document adds to one.
COMMON = frozenset({"component_type", "id", "name", "description", "metadata", "agentspec_version", "air_version",
                     "component_plugin_name", "component_plugin_version"})


def _f(names: str) -> frozenset[str]:
    return frozenset(names.split())


SPEC_FIELDS: dict[str, frozenset[str]] = {
    "Flow": _f("control_flow_connections data_flow_connections inputs nodes outputs start_node"),
    "ControlFlowEdge": _f("from_branch from_node to_node"),
    "DataFlowEdge": _f("destination_input destination_node source_node source_output"),
    "StartNode": _f("branches inputs outputs"),
    "EndNode": _f("branch_name branches inputs outputs"),
    "LlmNode": _f("branches inputs llm_config outputs prompt_template"),
    "AgentNode": _f("agent branches inputs outputs"),
    "ToolNode": _f("branches inputs outputs tool"),
    "BranchingNode": _f("branches inputs mapping outputs"),
    "FlowNode": _f("branches inputs outputs subflow"),
    "MapNode": _f("branches inputs outputs reducers subflow"),
    "ParallelMapNode": _f("branches inputs outputs reducers subflow"),
    "ParallelFlowNode": _f("branches inputs outputs subflows"),
    "CatchExceptionNode": _f("branches inputs outputs subflow"),
    "ApiNode": _f("api_spec_uri branches data headers http_method inputs outputs query_params retry_policy "
                  "sensitive_headers url url_allow_list"),
    "InputMessageNode": _f("branches inputs message outputs"),
    "OutputMessageNode": _f("branches inputs message outputs"),
    "Agent": _f("human_in_the_loop inputs llm_config outputs system_prompt toolboxes tools transforms"),
    "SpecializedAgent": _f("agent agent_specialization_parameters inputs outputs"),
    "AgentSpecializationParameters": _f("additional_instructions additional_tools human_in_the_loop inputs outputs"),
    "Swarm": _f("first_agent handoff inputs outputs relationships"),
    "ManagerWorkers": _f("group_manager inputs outputs workers"),
    "A2AAgent": _f("agent_url connection_config inputs outputs session_parameters"),
    "A2AConnectionConfig": _f("cert_file headers key_file retry_policy ssl_ca_cert timeout verify"),
    "OciAgent": _f("agent_endpoint_id client_config inputs outputs retry_policy"),
    "ServerTool": _f("inputs outputs requires_confirmation"),
    "RemoteTool": _f("api_spec_uri data headers http_method inputs outputs query_params requires_confirmation "
                     "retry_policy sensitive_headers url url_allow_list"),
    "MCPTool": _f("client_transport inputs outputs requires_confirmation retry_policy"),
    "MCPToolBox": _f("client_transport requires_confirmation retry_policy tool_filter"),
    "MCPToolSpec": _f("inputs outputs requires_confirmation"),
    "ClientTool": _f("inputs outputs requires_confirmation"),
    "BuiltinTool": _f("configuration executor_name inputs outputs requires_confirmation tool_type tool_version"),
    "StdioTransport": _f("args command cwd env session_parameters"),
    "StreamableHTTPTransport": _f("auth headers retry_policy sensitive_headers session_parameters url"),
    "StreamableHTTPmTLSTransport": _f("auth ca_file cert_file headers key_file retry_policy sensitive_headers "
                                      "session_parameters url"),
    "SSETransport": _f("auth headers retry_policy sensitive_headers session_parameters url"),
    "SSEmTLSTransport": _f("auth ca_file cert_file headers key_file retry_policy sensitive_headers session_parameters "
                           "url"),
    "OpenAiCompatibleConfig": _f("api_key api_provider api_type ca_file cert_file default_generation_parameters "
                                 "key_file model_id provider retry_policy url"),
    "OpenAiConfig": _f("api_key api_provider api_type default_generation_parameters model_id provider retry_policy "
                       "url"),
    "VllmConfig": _f("api_key api_provider api_type ca_file cert_file default_generation_parameters key_file model_id "
                     "provider retry_policy url"),
    "OllamaConfig": _f("api_key api_provider api_type ca_file cert_file default_generation_parameters key_file "
                       "model_id provider retry_policy url"),
    "LlmConfig": _f("api_key api_provider api_type default_generation_parameters model_id provider retry_policy url"),
    "OciGenAiConfig": _f("api_key api_provider api_type client_config compartment_id conversation_store_id "
                         "default_generation_parameters model_id provider retry_policy serving_mode url"),
    "OciClientConfigWithApiKey": _f("auth_file_location auth_profile auth_type service_endpoint"),
    "OciClientConfigWithSecurityToken": _f("auth_file_location auth_profile auth_type service_endpoint"),
    "OciClientConfigWithInstancePrincipal": _f("auth_type service_endpoint"),
    "OciClientConfigWithResourcePrincipal": _f("auth_type service_endpoint"),
    "GeminiConfig": _f("api_key api_provider api_type auth default_generation_parameters model_id provider "
                       "retry_policy url"),
    "GeminiAIStudioAuthConfig": _f("api_key"),
    "MessageSummarizationTransform": _f("cache_collection_name datastore llm max_cache_lifetime max_cache_size "
                                         "max_message_size summarization_instructions summarized_message_template"),
    "ConversationSummarizationTransform": _f("cache_collection_name datastore llm max_cache_lifetime max_cache_size "
                                              "max_num_characters max_num_messages min_num_messages "
                                              "summarization_instructions summarized_conversation_template"),
    "InMemoryCollectionDatastore": _f("datastore_schema"),
    "GeminiVertexAIAuthConfig": _f("credentials location project_id"),
    "DbmsVectorChainLlmConfig": _f("api_key api_provider api_type connection_config credential_name "
                                   "default_generation_parameters host model_id provider retry_policy transfer_timeout "
                                   "url"),
    "OAuthConfig": _f("client endpoints issuer pkce redirect_uri resource scope_policy scopes"),
    "OAuthClientConfig": _f("client_id client_id_metadata_url client_secret registration_endpoint "
                            "token_endpoint_auth_method type"),
    "OracleDatabaseDatastore": _f("connection_config datastore_schema"),
    "TlsOracleDatabaseConnectionConfig": _f("config_dir dsn password protocol user"),
    "MTlsOracleDatabaseConnectionConfig": _f("config_dir dsn password protocol user wallet_location wallet_password"),
    "PostgresDatabaseDatastore": _f("connection_config datastore_schema"),
    "TlsPostgresDatabaseConnectionConfig": _f("password sslcert sslcrl sslkey sslmode sslrootcert url user"),
}

_LLM_UNREAD = "api_provider api_type provider"
_TLS_FILES = "ca_file cert_file key_file"

# For each type heddle runs, the fields the specification defines that heddle refuses, naming the
# field, when a document gives one a value other than its default: those its model does not read
# (refused by `unread_fields`) and those its model reads only to refuse. Every other field of
# SPEC_FIELDS is honoured as the reference runtime honours it. docs/agentspec.md ("Fields") says the
# same, and tests/docs/test_agentspec_fields.py holds this table against pyagentspec's models and
# heddle's own, so a field is never parsed and then ignored: a field heddle learns leaves this table.
REFUSED_WHEN_SET: dict[str, frozenset[str]] = {
    "OpenAiCompatibleConfig": _f(f"{_LLM_UNREAD} {_TLS_FILES}"),
    "VllmConfig": _f(f"{_LLM_UNREAD} {_TLS_FILES}"),
    "OllamaConfig": _f(f"{_LLM_UNREAD} {_TLS_FILES}"),
    "OpenAiConfig": _f(_LLM_UNREAD),
    "GeminiConfig": _f("api_key api_provider api_type url"),  # the reference calls Gemini's own service
    "RemoteTool": _f("retry_policy"),
    "ApiNode": _f("retry_policy"),
    "StreamableHTTPTransport": _f("auth retry_policy"),
    "StreamableHTTPmTLSTransport": _f("auth retry_policy"),
    "SSETransport": _f("auth retry_policy"),
    "SSEmTLSTransport": _f("auth retry_policy"),
    "A2AConnectionConfig": _f("retry_policy"),
    "A2AAgent": _f("inputs outputs"),  # the reference drops them: the remote agent takes a message only
}


def markdown_table() -> str:
    """docs/agentspec.md's table of the fields refused when set (a test compares them)."""
    lines = ["| component type | refused when set |", "|---|---|"]
    for ctype, fields in REFUSED_WHEN_SET.items():
        lines.append(f"| `{ctype}` | {', '.join(f'`{f}`' for f in sorted(fields))} |")
    return "\n".join(lines) + "\n"


@functools.cache
def _modelled() -> dict[str, frozenset[str]]:
    """The fields heddle's own model of each type reads: the specification's, and any heddle defines
    beyond them (a RemoteTool's `timeout`)."""
    found: dict[str, frozenset[str]] = {}
    for value in vars(c).values():
        if isinstance(value, type) and issubclass(value, c.Component) and "component_type" in value.model_fields:
            tag = value.model_fields["component_type"].default
            if isinstance(tag, str):
                found[tag] = frozenset(value.model_fields)
    # Filled in from its agent and parameters when read: not fields a document gives it.
    found["SpecializedAgent"] -= frozenset(c.SPECIALISED_FIELDS)
    return found


def defined(component_type: str) -> frozenset[str] | None:
    """The fields a component of this type may have; None for a type the specification does not
    define (a plugin's node, whose fields are its own properties)."""
    spec = SPEC_FIELDS.get(component_type)
    if spec is None:
        return None
    return COMMON | spec | _modelled().get(component_type, frozenset())


# pyagentspec 26.3.1's defaults of fields the specification defines that heddle's models do not read
# (beside null, every such field's default): written so, they say nothing heddle would leave undone.
_UNREAD_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "api_type": ("chat_completions",),
    "api_provider": ("openai", "vllm", "ollama"),
    "provider": ("openai",),
    "requires_confirmation": (False,),
}


def unread_fields(document: Any) -> list[str]:
    """Where a component of `document` gives a field the specification defines, and heddle's model
    of its type does not read, a value other than its default: refused, never ignored."""
    found: list[str] = []
    for path, component, field in _components_fields(document):
        ctype = component["component_type"]
        modelled = _modelled().get(ctype)
        if modelled is None or field in modelled or field in COMMON or field not in SPEC_FIELDS.get(ctype, ()):
            continue
        value = component[field]
        if value is None or value in _UNREAD_DEFAULTS.get(field, ()):
            continue
        name = component.get("name")
        label = f"{ctype} {name!r}" if isinstance(name, str) and name else str(ctype)
        found.append(f"{path}: {label} gives {field} {value!r}, which heddle does not honour yet; remove it (or "
                     "give it its default)")
    return found


def components_of(document: Any, *, skip_metadata: bool = True) -> Iterator[tuple[str, dict[str, Any]]]:
    """(JSON path, component) of every component of a parsed document, in document order."""
    return ((path, node) for path, node in containers_of(document, skip_metadata=skip_metadata)
            if isinstance(node, dict) and isinstance(node.get("component_type"), str))


def containers_of(document: Any, *, skip_metadata: bool = True) -> Iterator[tuple[str, dict[str, Any] | list[Any]]]:
    """(JSON path, object or array) of every container of a parsed document, in document order.

    A stack, not recursion: a document from a bundle may nest as deep as it likes; and each
    container once, since YAML aliases (and resolved references) share them."""
    stack: list[tuple[str, Any]] = [("$", document)]
    seen: set[int] = set()
    while stack:
        path, node = stack.pop()
        if not isinstance(node, (dict, list)) or id(node) in seen:
            continue
        seen.add(id(node))
        yield path, node
        if isinstance(node, dict):
            stack.extend((f"{path}.{key}", value) for key, value in reversed(node.items())
                         if not (skip_metadata and key == "metadata"))
        else:
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(node))))


def _components_fields(document: Any) -> list[tuple[str, dict[str, Any], str]]:
    """(path, component, field) for every field of every component of `document`, each component once."""
    return [(path, node, field) for path, node in components_of(document) for field in node]


def read_fields(component_type: str, component: dict[str, Any]) -> list[str]:
    """The fields of `component` that are read (and walked): all but those its type does not define."""
    known = defined(component_type)
    return list(component) if known is None else [field for field in component if field in known]


def undefined_fields(document: Any) -> list[tuple[str, dict[str, Any], str]]:
    """(path, component, field) for every field of a component of `document` (a resolved mapping)
    that its type does not define, in document order, each component once."""
    found: list[tuple[str, dict[str, Any], str]] = []
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [("$", document)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{path}[{i}]", item) for i, item in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        ctype = node.get("component_type")
        fields = read_fields(ctype, node) if isinstance(ctype, str) else list(node)
        if isinstance(ctype, str):
            found.extend((path, node, field) for field in node if field not in fields)
        stack.extend((f"{path}.{field}", node[field]) for field in reversed(fields) if field != "metadata")
    return found


def describe(path: str, component: dict[str, Any], field: str) -> str:
    ctype, name = component.get("component_type"), component.get("name")
    label = f"{ctype} {name!r}" if isinstance(name, str) and name else str(ctype)
    return (f"{path}: {label} has field {field!r}, which the specification does not define for {ctype}; "
            "it is not read (as the specification's reader drops it)")


if __name__ == "__main__":
    print(markdown_table(), end="")
