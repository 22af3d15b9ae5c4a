"""Where a document may stop to wait for a person or a client, found when it is read.

Some waits are certain whenever the node that holds them runs:
- an InputMessageNode waits for the user's message;
- a ToolNode whose tool has `requires_confirmation: true` waits for a person's approval of the call;
- a ToolNode whose tool is a ClientTool is run by the client, and the flow waits for its result.

Others are what an agent might do, and may never happen: an agent inside a flow with
`human_in_the_loop` (the specification's default) may answer the user instead of giving its
outputs; an agent may call a tool (or a toolbox's tool) that requires confirmation, or a ClientTool;
the remote agent of a top-level A2AAgent may ask for input (heddle.engine.a2a).

A run in a session stops at either kind and resumes with the answer (heddle.engine.journal).
Without a session, a document with a certain wait is refused before it starts, naming the first of
them; one whose agents only might wait runs, and ends with the one-line error naming --session
when it actually reaches a wait (heddle.engine.journal.no_session). Waiting inside parallel work (a
ParallelFlowNode's or ParallelMapNode's subflows) is refused outright, certain or not: parallel
branches would each stop at their own wait, and a run resumes at exactly one.
"""

from __future__ import annotations

from typing import Any

# Components inside one of these run within a flow (a node document runs as a one-node flow).
_FLOW_TYPES = frozenset({"Flow", "AgentNode"})
_PARALLEL_TYPES = frozenset({"ParallelFlowNode", "ParallelMapNode"})
_NODE_REFERENCES = frozenset({"start_node", "control_flow_connections", "data_flow_connections"})


def label(node: dict[str, Any]) -> str:
    name = node.get("name")
    return f"{node.get('component_type')} {name!r}" if isinstance(name, str) and name else str(node["component_type"])


def effective_hitl(node: dict[str, Any]) -> Any:
    """An agent's human_in_the_loop as written; a SpecializedAgent's parameters override its agent's."""
    if node.get("component_type") != "SpecializedAgent":
        return node.get("human_in_the_loop")
    params, base = node.get("agent_specialization_parameters"), node.get("agent")
    override = params.get("human_in_the_loop") if isinstance(params, dict) else None
    if override is not None:
        return override
    return effective_hitl(base) if isinstance(base, dict) else None


def _waits_here(path: str, node: dict[str, Any], ctype: str, *, in_flow: bool, hitl_done: bool
                ) -> tuple[str, bool] | None:
    """Why the component at `path` waits, and whether it surely does when its node runs."""
    if ctype == "InputMessageNode":
        return f"{path}: {label(node)} waits for the user's message", True
    tool = node.get("tool")
    if ctype == "ToolNode" and isinstance(tool, dict):
        if tool.get("requires_confirmation") is True:
            return (f"{path}.tool: {label(tool)} of {label(node)} has requires_confirmation: true (the call waits for "
                    "a person's approval)"), True
        if tool.get("component_type") == "ClientTool":
            return (f"{path}.tool: {label(tool)} of {label(node)} is a ClientTool (the client runs it; the flow "
                    "waits for its result)"), True
    if node.get("requires_confirmation") is True:
        return f"{path}: {label(node)} has requires_confirmation: true (each call waits for a person's approval)", False
    if in_flow and not hitl_done and ctype in ("Agent", "SpecializedAgent") and effective_hitl(node) is True:
        return (f"{path}: {label(node)} has human_in_the_loop: true inside a flow (it may stop to ask the user, "
                "and the flow waits for the reply)"), False
    return None


def wait_points(document: Any) -> tuple[list[str], list[str]]:
    """Where `document` (a resolved mapping) surely waits when the node run reaches it, each
    `PATH: TYPE 'name' why`, in document order; and the refusals of waits (certain or not) inside
    parallel work."""
    found: list[str] = []
    seen_why: set[str] = set()
    refused: list[str] = []
    seen: set[tuple[int, bool, bool, str | None]] = set()
    # A stack, not recursion; shared subtrees (resolved references) are visited once per context.
    stack: list[tuple[str, Any, bool, bool, str | None]] = [("$", document, False, False, None)]
    while stack:
        path, node, in_flow, hitl_done, parallel = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{path}[{i}]", item, in_flow, False, parallel)
                         for i, item in reversed(list(enumerate(node))))
            continue
        if not isinstance(node, dict):
            continue
        key = (id(node), in_flow, hitl_done, parallel)
        if key in seen:
            continue
        seen.add(key)
        ctype = node.get("component_type")
        if isinstance(ctype, str):
            waits = _waits_here(path, node, ctype, in_flow=in_flow, hitl_done=hitl_done)
            if waits is not None and waits[0] not in seen_why:
                why, certain = waits
                seen_why.add(why)
                if certain:
                    found.append(why)
                if parallel is not None:
                    refused.append(f"{why}, inside {parallel}: waiting for a person inside parallel work is not "
                                   "supported (each branch would stop at its own wait); move the wait out of the "
                                   "parallel subflows")
        inner = in_flow or ctype in _FLOW_TYPES
        here = f"{label(node)} at {path}" if ctype in _PARALLEL_TYPES else parallel
        children = []
        for field, value in node.items():
            # A flow's start node and its edges' ends are nodes of its `nodes`, where they are named.
            if field == "metadata" or (ctype == "Flow" and field in _NODE_REFERENCES):
                continue
            # A SpecializedAgent's agent runs as the specialisation says: its own flag is not the one that counts.
            done = ctype == "SpecializedAgent" and field == "agent"
            children.append((f"{path}.{field}", value, inner, done, here))
        stack.extend(reversed(children))
    return found, refused
