"""Every component type of the Agent Spec language (through version 26.3), and what heddle does with each.

heddle runs exactly the types its reader has models for (`KNOWN_COMPONENT_TYPES` in
heddle.agentspec.components): that tuple is the "runs" set, read from the code, so this catalogue cannot
claim a type the reader does not have. Every other type the specification defines is held here with
why heddle does not run it and what would, so that a document naming one is refused with that reason
(by the document reader, naming where in the document it is) rather than as merely "unknown", and
docs/agentspec.md's table is checked against it.

`python -m heddle.agentspec.catalog` prints that table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from heddle.agentspec.components import KNOWN_COMPONENT_TYPES

Status = Literal["runs", "refused"]

SESSIONS = "sessions, which a later heddle adds (a run that waits for a person and resumes)"
LATER = "a later heddle"
OPENAI_COMPATIBLE = "an OpenAI-compatible endpoint in front of the model, named by an OpenAiCompatibleConfig"


@dataclass(frozen=True)
class Refusal:
    """Why heddle does not run a component type, and what would run it."""

    reason: str
    runs_with: str
    # A type that needs what heddle does not have yet stays refused even once the reader has a
    # model for it (to name it precisely): reading a type is not running it.
    even_if_read: bool = False


@dataclass(frozen=True)
class Entry:
    component_type: str
    group: str
    refusal: Refusal | None = None  # None: heddle runs it, so it must be a type the reader knows


def _r(reason: str, runs_with: str, *, even_if_read: bool = False) -> Refusal:
    return Refusal(reason, runs_with, even_if_read)


_NODES = "Flows and nodes"
_AGENTS = "Agents"
_TOOLS = "Tools"
_MCP = "MCP transports"
_LLMS = "LLM configs"
_AUTH = "Authentication"
_DATA = "Datastores and message transforms"

# In the order of the table. A type the reader learns loses its refusal here (unless `even_if_read`),
# and one without a refusal must be a type the reader knows: tests/docs/test_agentspec_table.py
# holds both, so the table never says "runs" of what does not, nor keeps a stale reason.
ENTRIES: tuple[Entry, ...] = (
    Entry("Flow", _NODES),
    Entry("ControlFlowEdge", _NODES),
    Entry("DataFlowEdge", _NODES),
    Entry("StartNode", _NODES),
    Entry("EndNode", _NODES),
    Entry("LlmNode", _NODES),
    Entry("AgentNode", _NODES),
    Entry("ToolNode", _NODES),
    Entry("BranchingNode", _NODES),
    Entry("FlowNode", _NODES),
    Entry("MapNode", _NODES),
    Entry("ParallelMapNode", _NODES),
    Entry("ParallelFlowNode", _NODES),
    Entry("CatchExceptionNode", _NODES),
    Entry("ApiNode", _NODES),
    Entry("InputMessageNode", _NODES),
    Entry("OutputMessageNode", _NODES),
    Entry("Agent", _AGENTS),
    Entry("SpecializedAgent", _AGENTS),
    Entry("AgentSpecializationParameters", _AGENTS),
    Entry("Swarm", _AGENTS),
    Entry("ManagerWorkers", _AGENTS),
    Entry("A2AAgent", _AGENTS),
    Entry("A2AConnectionConfig", _AGENTS),
    Entry("OciAgent", _AGENTS, _r("it is an agent hosted by OCI Generative AI Agents, which heddle does not call",
                                  LATER)),
    Entry("ServerTool", _TOOLS),
    Entry("RemoteTool", _TOOLS),
    Entry("MCPTool", _TOOLS),
    Entry("MCPToolBox", _TOOLS),
    Entry("MCPToolSpec", _TOOLS),
    Entry("ClientTool", _TOOLS),
    Entry("BuiltinTool", _TOOLS, _r("it names a tool built into a runtime, and heddle builds none in",
                                    "a plugin that provides a tool of its name (--plugin MANIFEST)",
                                    even_if_read=True)),
    Entry("StdioTransport", _MCP),
    Entry("StreamableHTTPTransport", _MCP),
    Entry("StreamableHTTPmTLSTransport", _MCP),
    Entry("SSETransport", _MCP),
    Entry("SSEmTLSTransport", _MCP),
    Entry("OpenAiCompatibleConfig", _LLMS),
    Entry("OpenAiConfig", _LLMS),
    Entry("VllmConfig", _LLMS),
    Entry("OllamaConfig", _LLMS),
    Entry("LlmConfig", _LLMS, _r("a generic LlmConfig leaves the API to its provider fields, and heddle calls "
                                 "only OpenAI-compatible chat completions", OPENAI_COMPATIBLE)),
    Entry("OciGenAiConfig", _LLMS, _r("OCI Generative AI needs OCI request signing, which heddle does not do",
                                      OPENAI_COMPATIBLE)),
    Entry("OciClientConfigWithApiKey", _LLMS, _r("it belongs to an OciGenAiConfig", OPENAI_COMPATIBLE)),
    Entry("OciClientConfigWithSecurityToken", _LLMS, _r("it belongs to an OciGenAiConfig", OPENAI_COMPATIBLE)),
    Entry("OciClientConfigWithInstancePrincipal", _LLMS, _r("it belongs to an OciGenAiConfig", OPENAI_COMPATIBLE)),
    Entry("OciClientConfigWithResourcePrincipal", _LLMS, _r("it belongs to an OciGenAiConfig", OPENAI_COMPATIBLE)),
    Entry("GeminiConfig", _LLMS),
    Entry("GeminiAIStudioAuthConfig", _LLMS),
    Entry("GeminiVertexAIAuthConfig", _LLMS, _r(
        "heddle calls Gemini through its OpenAI-compatible endpoint with an AI Studio API key, and Vertex AI "
        "needs Google Cloud credentials (a service account or Application Default Credentials traded for an "
        "access token), which heddle does not obtain",
        f"a GeminiAIStudioAuthConfig with an AI Studio key; or {OPENAI_COMPATIBLE}")),
    Entry("DbmsVectorChainLlmConfig", _LLMS, _r("it calls a model from inside Oracle Database, which heddle does "
                                                "not reach", OPENAI_COMPATIBLE)),
    Entry("OAuthConfig", _AUTH, _r("it asks for an OAuth authorization-code grant, a person signing in at its "
                                   "redirect_uri (as the reference runtime runs it on an MCP transport), which "
                                   "heddle does not run",
                                   "a token in sensitive_headers as a $VAR reference; or a later heddle")),
    Entry("OAuthClientConfig", _AUTH, _r("it belongs to an OAuthConfig",
                                         "a token in sensitive_headers as a $VAR reference; or a later heddle")),
    Entry("InMemoryCollectionDatastore", _DATA),  # a message transform's cache
    Entry("OracleDatabaseDatastore", _DATA, _r("heddle keeps no data in an Oracle database",
                                               "an InMemoryCollectionDatastore, a PostgresDatabaseDatastore (or "
                                               "null) as a message transform's "
                                               "datastore; or a ServerTool that queries the database")),
    Entry("TlsOracleDatabaseConnectionConfig", _DATA, _r("it belongs to an OracleDatabaseDatastore", LATER)),
    Entry("MTlsOracleDatabaseConnectionConfig", _DATA, _r("it belongs to an OracleDatabaseDatastore", LATER)),
    Entry("PostgresDatabaseDatastore", _DATA),  # a message transform's cache, in an existing table
    Entry("TlsPostgresDatabaseConnectionConfig", _DATA),
    Entry("MessageSummarizationTransform", _DATA),
    Entry("ConversationSummarizationTransform", _DATA),
)

BY_TYPE: dict[str, Entry] = {e.component_type: e for e in ENTRIES}


def _known() -> frozenset[str]:
    # Read at each call: the reader's set is the truth, whatever this module says.
    return frozenset(KNOWN_COMPONENT_TYPES)


def refusal(component_type: str) -> Refusal | None:
    """Why heddle refuses `component_type`, or None when it runs it or the specification does not define it."""
    entry = BY_TYPE.get(component_type)
    if entry is None or entry.refusal is None:
        return None
    if component_type in _known() and not entry.refusal.even_if_read:
        return None
    return entry.refusal


def status(component_type: str) -> Status:
    """`runs` or `refused`, for a type the specification defines."""
    known = component_type in _known()
    return "runs" if known and refusal(component_type) is None else "refused"


def refusal_message(component_type: str, *, name: object, path: str) -> str | None:
    """The one line that refuses a component of `component_type` at `path`, or None if it runs
    (or the specification does not define it)."""
    why = refusal(component_type)
    if why is None:
        return None
    named = f" {name!r}" if isinstance(name, str) and name else ""
    return (f"{path}: {component_type}{named} cannot run in heddle: {why.reason}; what would run it: "
            f"{why.runs_with}")


def rows() -> list[tuple[str, str, Status, str]]:
    """(group, component type, status, why and what would run it) for every type the specification
    defines, in the table's order."""
    out: list[tuple[str, str, Status, str]] = []
    for entry in ENTRIES:
        why = refusal(entry.component_type)
        note = "" if why is None else f"{why.reason}; what would run it: {why.runs_with}"
        out.append((entry.group, entry.component_type, status(entry.component_type), note))
    return out


def markdown_table() -> str:
    """The table docs/agentspec.md carries (a test compares them)."""
    lines = ["| group | component type | in heddle | why not, and what would run it |", "|---|---|---|---|"]
    for group, ctype, state, note in rows():
        cell = note.replace("|", "\\|")
        lines.append(f"| {group} | `{ctype}` | {state} | {cell} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
