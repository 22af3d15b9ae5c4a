"""Every typed component of a document, with its path in it (`$.nodes[2].tool`).

The walk follows the models' fields, so a component type added to heddle is walked without
being named here: a subflow of a composite node, an agent's tools, a specialisation's tools.
Field names are the document's own keys, so the paths are the document's (after its
`$component_ref`s are resolved).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from pydantic import BaseModel

from heddle.agentspec import components as c
from heddle.agentspec.roots import document_root, message_target

C = TypeVar("C", bound=c.Component)


def _fields(model: BaseModel) -> Iterator[tuple[str, Any]]:
    skip: tuple[str, ...] = ("metadata",)
    if isinstance(model, c.Flow):
        # Its start node and its edges' ends are nodes of `nodes`, walked there.
        skip += ("start_node", "control_flow_connections", "data_flow_connections")
    elif isinstance(model, c.SpecializedAgent):
        # Filled in from its agent and parameters: walked where the document writes them.
        skip += c.SPECIALISED_FIELDS
    for name in type(model).model_fields:
        if name not in skip:
            yield name, getattr(model, name)


def components(root: BaseModel, path: str = "$") -> Iterator[tuple[str, c.Component]]:
    """(path, component) for `root` and every component below it, in document order, each once."""
    seen: set[int] = set()
    stack: list[tuple[str, Any]] = [(path, root)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, BaseModel):
            if id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value, c.Component):
                yield where, value
            children = [(f"{where}.{name}", child) for name, child in _fields(value)]
        elif isinstance(value, list):
            children = [(f"{where}[{i}]", item) for i, item in enumerate(value)]
        elif isinstance(value, dict):
            children = [(f"{where}.{key}", item) for key, item in value.items()]
        else:
            continue
        stack.extend(reversed(children))


def _document(root: BaseModel) -> BaseModel:
    """What the document's top level was, for a Flow heddle built around an agent or a node
    (heddle.agentspec.roots): paths are the document's, `$` that agent or node."""
    if not isinstance(root, c.Flow):
        return root
    kind = document_root(root).kind
    if kind == "agent":
        target = message_target(root)
        return target.agent if isinstance(target, c.AgentNode) else root
    if kind == "node":
        return next((n for n in root.nodes if not isinstance(n, (c.StartNode, c.EndNode))), root)
    return root


def document_components(root: BaseModel) -> Iterator[tuple[str, c.Component]]:
    """`components(root)` with the paths of the document it was read from."""
    return components(_document(root))


def of_type(root: BaseModel, kind: type[C]) -> Iterator[tuple[str, C]]:
    """(path in the document, component) for every component of `kind` in `root`."""
    for where, component in document_components(root):
        if isinstance(component, kind):
            yield where, component
