"""Typed models of the Agent Spec components heddle runs.

The wire format is Agent Spec's own (snake_case fields, `component_type` as the tag). Fields we do
not use are kept (extra="allow") so a valid document is never refused for carrying them, and
so a document re-serialises as it was written.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator

Property = dict[str, Any]
"""A JSON Schema fragment with a `title`: an input or output of a component."""


class Component(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=False, populate_by_name=True)

    id: str = ""
    name: str = ""
    description: str | None = None
    metadata: dict[str, Any] | None = None


def _check_properties(value: list[Property] | None) -> list[Property]:
    props = list(value or [])
    seen: set[str] = set()
    for i, prop in enumerate(props):
        if not isinstance(prop, dict):
            # pydantic reports a ValueError as the document's error; a TypeError would escape
            raise ValueError(f"property {i} must be a JSON Schema object")  # noqa: TRY004
        title = prop.get("title")
        if not isinstance(title, str) or not title:
            raise ValueError(f"property {i} needs a non-empty string `title`")
        if title in seen:
            raise ValueError(f"two properties are titled {title!r}")
        seen.add(title)
    return props


class WithIO(Component):
    inputs: list[Property] = Field(default_factory=list)
    outputs: list[Property] = Field(default_factory=list)

    _io = field_validator("inputs", "outputs", mode="before")(
        classmethod(lambda cls, v: _check_properties(v))
    )

    def input_titles(self) -> list[str]:
        return [p["title"] for p in self.inputs]

    def output_titles(self) -> list[str]:
        return [p["title"] for p in self.outputs]


# --------------------------------------------------------------------------- LLM configs


class LlmConfigBase(Component):
    model_id: str
    default_generation_parameters: dict[str, Any] | None = None
    api_key: str | None = None


class OpenAiCompatibleConfig(LlmConfigBase):
    component_type: Literal["OpenAiCompatibleConfig"] = "OpenAiCompatibleConfig"
    url: str


class VllmConfig(LlmConfigBase):
    component_type: Literal["VllmConfig"] = "VllmConfig"
    url: str


class OllamaConfig(LlmConfigBase):
    component_type: Literal["OllamaConfig"] = "OllamaConfig"
    url: str


class OpenAiConfig(LlmConfigBase):
    component_type: Literal["OpenAiConfig"] = "OpenAiConfig"
    url: str = "https://api.openai.com/v1"


LlmConfig = Annotated[
    OpenAiCompatibleConfig | VllmConfig | OllamaConfig | OpenAiConfig,
    Field(discriminator="component_type"),
]

# --------------------------------------------------------------------------- tools


class ServerTool(WithIO):
    component_type: Literal["ServerTool"] = "ServerTool"


Tool = Annotated[ServerTool, Field(discriminator="component_type")]


class Agent(WithIO):
    component_type: Literal["Agent"] = "Agent"
    llm_config: LlmConfig
    system_prompt: str = ""
    tools: list[Tool] = Field(default_factory=list)


# --------------------------------------------------------------------------- nodes


class NodeBase(WithIO):
    branches: list[str] | None = None

    def next_branches(self) -> list[str]:
        """The branches this node can leave by. Most nodes have one: `next`."""
        return ["next"]


class StartNode(NodeBase):
    component_type: Literal["StartNode"] = "StartNode"


class EndNode(NodeBase):
    component_type: Literal["EndNode"] = "EndNode"
    branch_name: str | None = None

    def next_branches(self) -> list[str]:
        return []


class ToolNode(NodeBase):
    component_type: Literal["ToolNode"] = "ToolNode"
    tool: Tool


class LlmNode(NodeBase):
    component_type: Literal["LlmNode"] = "LlmNode"
    llm_config: LlmConfig
    prompt_template: str


class AgentNode(NodeBase):
    component_type: Literal["AgentNode"] = "AgentNode"
    agent: Agent


class BranchingNode(NodeBase):
    component_type: Literal["BranchingNode"] = "BranchingNode"
    mapping: dict[str, str] = Field(default_factory=dict)

    def next_branches(self) -> list[str]:
        # Without a DEFAULT_BRANCH entry an unmapped value leaves by "default".
        names = list(self.mapping.values())
        if "DEFAULT_BRANCH" not in self.mapping:
            names.append("default")
        return list(dict.fromkeys(names))


class FlowNode(NodeBase):
    component_type: Literal["FlowNode"] = "FlowNode"
    subflow: Flow


class PluginNode(NodeBase):
    """A node of a type a loaded plugin declares; the plugin's process executes it.

    The document reader admits such a type only when a plugin declaring it is loaded. Fields
    beyond the common ones are the node's own properties, passed to the plugin as they are.
    """

    component_type: str
    llm_config: LlmConfig | None = None


_BUILTIN_NODES = ("StartNode", "EndNode", "ToolNode", "LlmNode", "AgentNode", "BranchingNode", "FlowNode")


def _node_tag(value: Any) -> str | None:
    ctype = value.get("component_type") if isinstance(value, dict) else getattr(value, "component_type", None)
    if ctype is None or ctype in _BUILTIN_NODES:
        return ctype
    return "PluginNode"


Node = Annotated[
    Annotated[StartNode, Tag("StartNode")]
    | Annotated[EndNode, Tag("EndNode")]
    | Annotated[ToolNode, Tag("ToolNode")]
    | Annotated[LlmNode, Tag("LlmNode")]
    | Annotated[AgentNode, Tag("AgentNode")]
    | Annotated[BranchingNode, Tag("BranchingNode")]
    | Annotated[FlowNode, Tag("FlowNode")]
    | Annotated[PluginNode, Tag("PluginNode")],
    Discriminator(_node_tag),
]

# --------------------------------------------------------------------------- edges and flow


class ControlFlowEdge(Component):
    component_type: Literal["ControlFlowEdge"] = "ControlFlowEdge"
    from_node: Node
    from_branch: str | None = None
    to_node: Node


class DataFlowEdge(Component):
    component_type: Literal["DataFlowEdge"] = "DataFlowEdge"
    source_node: Node
    source_output: str
    destination_node: Node
    destination_input: str


class Flow(WithIO):
    component_type: Literal["Flow"] = "Flow"
    agentspec_version: str | None = None
    start_node: Node
    nodes: list[Node] = Field(default_factory=list)
    control_flow_connections: list[ControlFlowEdge] = Field(default_factory=list)
    data_flow_connections: list[DataFlowEdge] | None = None

    @field_validator("nodes", "control_flow_connections", mode="before")
    @classmethod
    def _none_is_empty(cls, v: Any) -> Any:
        return [] if v is None else v


FlowNode.model_rebuild()

KNOWN_COMPONENT_TYPES: tuple[str, ...] = (
    "Flow",
    "StartNode",
    "EndNode",
    "ToolNode",
    "AgentNode",
    "LlmNode",
    "BranchingNode",
    "FlowNode",
    "Agent",
    "ServerTool",
    "ControlFlowEdge",
    "DataFlowEdge",
    "OpenAiConfig",
    "OpenAiCompatibleConfig",
    "VllmConfig",
    "OllamaConfig",
)
