"""What a document's top level may be, and the one `Flow` heddle runs for each.

Agent Spec lets any component be a document: a Flow, an Agent, or a single node. heddle runs
Flows, so every other top level becomes one, and the rest of heddle (graph checks, tool
discovery, fingerprints, bundles, the server) sees only that Flow:

* an `Agent` runs as StartNode -> AgentNode -> EndNode, its inputs the flow's inputs and its
  declared outputs the flow's outputs; the run's user message goes to that AgentNode;
* a node runs as a one-node flow: a StartNode giving the node's inputs, the node, and an EndNode
  taking its outputs (one per branch the node can leave by), wired by name.

What the top level was is remembered on the Flow (`document_root`), so a shell knows an agent
document (it takes `--message`). Kinds that have nothing to run (a tool, an llm config, an edge)
are refused with one line. Another agentic component adds itself to `BUILDERS` with a function
that validates its mapping and returns the Flow and the key of the node the message goes to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from heddle.agentspec import components as c
from heddle.agentspec.components import node_key
from heddle.agentspec.io import agent_inputs, agent_outputs, inputs_of, outputs_of
from heddle.errors import DocumentError, UsageError

Kind = Literal["flow", "agent", "node"]


@dataclass(frozen=True)
class DocumentRoot:
    """A document's top-level component, as heddle read it."""

    kind: Kind
    component_type: str
    name: str
    # The node of the Flow that receives the run's user message (an agentic top level), by node key.
    message_node: str | None = None
    # Things the document does that it should not (a feature newer than its agentspec_version).
    warnings: tuple[str, ...] = ()
    # Where a run of it surely stops to wait for a person (heddle.agentspec.waits): it then needs a session.
    waits: tuple[str, ...] = ()
    # The fields it writes that the specification does not define, not read (heddle.agentspec.fields).
    undefined: tuple[str, ...] = ()

    @property
    def conversational(self) -> bool:
        """Whether a run of it takes a user message (`--message`)."""
        return self.message_node is not None


FLOW_ROOT = DocumentRoot("flow", "Flow", "")


@dataclass(frozen=True)
class Built:
    """What a builder gives for a top level: the Flow to run and the node the message goes to."""

    flow: c.Flow
    message_node: str | None = None


# validate(model, data): `data` typed by a pydantic model class or TypeAdapter, or the DocumentError
# that names the document and the fields at fault.
Validate = Callable[[Any, Any], Any]
Builder = Callable[[dict[str, Any], Validate], Built]


def document_root(flow: c.Flow) -> DocumentRoot:
    """What the document `flow` was read from had at its top level (a Flow, unless said otherwise)."""
    # From the model's private store itself: getattr on a private attribute goes through pydantic's
    # __getattr__, some 10 us, and a server request asks this several times.
    private = flow.__pydantic_private__
    root = private.get("_root") if private else None
    return root if isinstance(root, DocumentRoot) else FLOW_ROOT


def remember(flow: c.Flow, root: DocumentRoot) -> c.Flow:
    flow._root = root
    return flow


def message_target(flow: c.Flow) -> c.Node | None:
    """The node of `flow` that receives the run's user message, or None for a flow document."""
    key = document_root(flow).message_node
    if key is None:
        return None
    for node in flow.nodes:
        if node_key(node) == key:
            return node
    raise DocumentError(f"the flow {flow.name!r} has lost the node {key!r} its message goes to")


def check_message(flow: c.Flow, message: str | None, *, named: str = "--message", give: str = "--message TEXT",
                  source: str | None = None) -> None:
    """Refuse a message for a document that takes none, and none for one that needs it.

    `named` is how the shell names the message (`--message`), `give` how a user gives one."""
    root = document_root(flow)
    if root.conversational == (message is not None):
        return  # what nearly every run is: its words are made only for a refusal
    what = source or f"the document {flow.name!r}"
    top = f"its top level is {root.component_type} {root.name!r}" if root.name else \
        f"its top level is a {root.component_type}"
    if root.conversational and message is None:
        raise UsageError(f"{what} ({top}) answers a user: give the user's message with {give}")
    if not root.conversational and message is not None:
        raise UsageError(f"{named}: {what} is not an agent ({top}); a message is for a document whose top level "
                         "is an agent (give a flow its inputs instead)")


# --------------------------------------------------------------------------- building


def _unique(base: str, taken: set[str]) -> str:
    key, n = base, 1
    while key in taken:
        n += 1
        key = f"{base}-{n}"
    taken.add(key)
    return key


def _props(props: Iterable[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [dict(p) for p in props or []]


def _one_node_flow(node: c.Node, *, name: str, inputs: list[dict[str, Any]], outputs: list[dict[str, Any]],
                   ident: str, description: str | None = None) -> c.Flow:
    """StartNode (giving `inputs`) -> node -> EndNode (taking `outputs`), one EndNode per branch."""
    taken = {node_key(node)}
    start = c.StartNode(id=_unique(f"{ident}.start", taken), name="start", inputs=_props(inputs),
                        outputs=_props(inputs))
    branches = node.next_branches()
    ends = [c.EndNode(id=_unique(f"{ident}.end" if len(branches) == 1 else f"{ident}.end.{branch}", taken),
                      name="end" if len(branches) == 1 else f"end {branch}", inputs=_props(outputs),
                      outputs=_props(outputs), branch_name=None if len(branches) == 1 else branch)
            for branch in branches]
    control = [c.ControlFlowEdge(name="start -> node", from_node=start, to_node=node)]
    control += [c.ControlFlowEdge(name=f"node -> {end.name}", from_node=node, to_node=end,
                                  from_branch=None if len(branches) == 1 else branch)
                for branch, end in zip(branches, ends, strict=True)]
    data = [c.DataFlowEdge(name=f"start.{p['title']} -> node", source_node=start, source_output=p["title"],
                           destination_node=node, destination_input=p["title"]) for p in inputs]
    data += [c.DataFlowEdge(name=f"node.{p['title']} -> {end.name}", source_node=node, source_output=p["title"],
                            destination_node=end, destination_input=p["title"]) for end in ends for p in outputs]
    return c.Flow(id=ident, name=name, description=description, inputs=_props(inputs), outputs=_props(outputs),
                  start_node=start, nodes=[start, node, *ends], control_flow_connections=control,
                  data_flow_connections=data)


def agent_root(data: dict[str, Any], validate: Validate) -> Built:
    """An Agent at the top: one turn of it, as the only node of a flow."""
    return agent_flow(validate(c.Agent, data))


def agentic_root(model: Any) -> Builder:
    """The builder for a component type whose typed model (`model`) is an Agent (a subclass of it)."""

    def build(data: dict[str, Any], validate: Validate) -> Built:
        return agent_flow(validate(model, data))

    return build


def agent_flow(agent: c.Agentic | c.A2AAgent) -> Built:
    """StartNode -> AgentNode(agent) -> EndNode, the message addressed to that AgentNode."""
    inputs, outputs = agent_inputs(agent), agent_outputs(agent)
    ident = agent.id or agent.name or "agent"
    node = c.AgentNode(id=ident, name=agent.name or ident, agent=agent, inputs=_props(inputs),
                       outputs=_props(outputs))
    flow = _one_node_flow(node, name=agent.name, inputs=inputs, outputs=outputs, ident=f"{ident}.flow",
                          description=agent.description)
    return Built(flow, message_node=ident)


def node_root(data: dict[str, Any], validate: Validate) -> Built:
    """A single node at the top, run as a one-node flow."""
    from pydantic import TypeAdapter


    node: c.Node = validate(TypeAdapter(c.Node), data)
    ident = node_key(node) or node.component_type
    flow = _one_node_flow(node, name=node.name, inputs=inputs_of(node) or [], outputs=outputs_of(node) or [],
                          ident=f"{ident}.flow", description=node.description)
    return Built(flow)


def specialized_root(data: dict[str, Any], validate: Validate) -> Built:
    """A SpecializedAgent at the top: it is an Agent (heddle.agentspec.components), run like one."""
    return agentic_root(c.SpecializedAgent)(data, validate)


def multi_agent_root(data: dict[str, Any], validate: Validate) -> Built:
    """A Swarm or a ManagerWorkers at the top: one turn of its agents' conversation with the user, run
    as the agent of an AgentNode like an Agent (heddle.engine.multiagent)."""
    model = c.Swarm if data.get("component_type") == "Swarm" else c.ManagerWorkers
    return agent_flow(validate(model, data))


def a2a_root(data: dict[str, Any], validate: Validate) -> Built:
    """An A2AAgent at the top: one turn of the conversation with the agent it reaches (heddle.engine.a2a)."""
    return agent_flow(validate(c.A2AAgent, data))


# Agentic components at the top level, by component type: each takes a user message. Another
# such component adds its builder here (`agentic_root(Model)` for one whose typed model is an Agent).
BUILDERS: dict[str, Builder] = {
    "Agent": agent_root,
    "SpecializedAgent": specialized_root,
    "Swarm": multi_agent_root,
    "ManagerWorkers": multi_agent_root,
    "A2AAgent": a2a_root,
}

# What the refusal of a top-level component that has nothing to run says it could be put in.
_PUT_IN = {
    "tool": "put it in a ToolNode or an Agent's tools",
    "llm": "use it as the llm_config of an LlmNode or an Agent",
    "edge": "edges belong in a Flow",
    "other": "give a Flow, an Agent or a node",
}


def _refusal(ctype: str, name: str, source: str) -> DocumentError:
    if ctype in ("StartNode", "EndNode"):
        hint = "a flow needs one around it"
    elif ctype.endswith(("Tool", "ToolBox")):
        hint = _PUT_IN["tool"]
    elif ctype.endswith("Config"):
        hint = _PUT_IN["llm"]
    elif ctype.endswith("Edge"):
        hint = _PUT_IN["edge"]
    else:
        hint = _PUT_IN["other"]
    label = f"{ctype} {name!r}" if name else ctype
    return DocumentError(f"{source}: $ is a {label}, which heddle cannot run as a document by itself; "
                         f"heddle runs a Flow, an Agent or a single node at the top level: {hint}")


def build_root(data: dict[str, Any], *, source: str, node_types: frozenset[str], validate: Validate) -> c.Flow:
    """The Flow heddle runs for the resolved top-level component `data`, the root remembered on it."""
    ctype = data.get("component_type")
    raw_name = data.get("name")
    name = raw_name if isinstance(raw_name, str) else ""
    if ctype == "Flow":
        flow: c.Flow = validate(c.Flow, data)
        return remember(flow, DocumentRoot("flow", "Flow", flow.name))
    builder = BUILDERS.get(ctype) if isinstance(ctype, str) else None
    if builder is not None:
        built = builder(data, validate)
        kind: Kind = "agent" if built.message_node is not None else "node"
        return remember(built.flow, DocumentRoot(kind, str(ctype), name, message_node=built.message_node))
    runnable_node = ctype not in ("StartNode", "EndNode") and (ctype in c._BUILTIN_NODES or ctype in node_types)
    if isinstance(ctype, str) and runnable_node:
        return remember(node_root(data, validate).flow, DocumentRoot("node", ctype, name))
    raise _refusal(str(ctype), name, source)
