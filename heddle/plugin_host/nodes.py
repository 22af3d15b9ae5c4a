"""Executing a node whose type a plugin declares: `execute` on its process.

The node gets its declared inputs (the node's own `inputs`, else the component's), a fresh
workspace inside the plugin's home (so a confined plugin can write it), and its properties
from the flow document. It answers `{output, branch?}`; partials `{"text": ...}` stream as
token deltas of the node.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec.io import declared_values
from heddle.blocking import WORKSPACE_COPIES, run_blocking
from heddle.engine import events as ev
from heddle.engine.seams import Outcome
from heddle.errors import RunError
from heddle.plugin_host.callbacks import Scope, endpoint_of
from heddle.plugin_host.errors import PluginError
from heddle.plugin_host.manifest import Component
from heddle.plugin_host.process import PluginCallError
from heddle.workspace.treecopy import remove_tree
from heddle.workspace.workspace import Workspaces

if TYPE_CHECKING:
    from heddle.plugin_host.middleware import PluginRun
    from heddle.workspace.workspace import Workspace


def _inputs(node: c.PluginNode, declared: list[dict[str, Any]], values: dict[str, Any]) -> dict[str, Any]:
    if not declared:
        return dict(values)
    out, missing = declared_values(declared, values)
    if missing:
        names = ", ".join(repr(m) for m in missing)
        raise RunError(f"{node.component_type} {node.name!r} needs input {names}; give it from an earlier node's "
                       "output or the flow's input")
    return out


@contextlib.asynccontextmanager
async def plugin_workspace(run: PluginRun, plugin: str, node_name: str) -> AsyncIterator[Workspace]:
    """A workspace built like every other, but inside the plugin's home."""
    ctx = run.ctx
    home = run.host.home(plugin, ctx.options)
    shared = ctx.workspaces
    options = dataclasses.replace(shared.options, keep_root=home / "workspaces")
    owner = Workspaces(options, shared.tools, tools_dir=shared.tools_dir, warn=shared.warn)
    root: Path | None = None
    try:
        async with owner.enter(node_name) as workspace:
            root = workspace.root
            yield workspace
    finally:
        if shared.options.keep_root is None and root is not None:
            # `owner` keeps its workspaces (they are in the plugin's home): removed here once closed.
            with contextlib.suppress(OSError):
                await run_blocking(WORKSPACE_COPIES, remove_tree, root)


async def execute_plugin_node(run: PluginRun, comp: Component, node: c.Node, node_input: dict[str, Any]) -> Outcome:
    """The engine's step for a node of `comp`'s type: `execute` on its plugin's process."""
    if not isinstance(node, c.PluginNode):
        raise RunError(f"{node.component_type} {node.name!r}: a built-in node type cannot be executed by a plugin")
    declared_in = list(node.inputs) or list(comp.inputs)
    values = _inputs(node, declared_in, node_input)
    properties = dict(node.model_extra or {})
    endpoint = endpoint_of(run.ctx, node)

    def on_partial(value: Any) -> None:
        if isinstance(value, dict) and isinstance(value.get("text"), str):
            run.ctx.emit(ev.TokenDelta(node=node.name, text=value["text"]))

    async with plugin_workspace(run, comp.plugin, node.name) as workspace:
        params = {"node": {"name": node.name, "id": node.id, "type": node.component_type, "properties": properties},
                  "input": values, "workspace": str(workspace.root)}
        try:
            result = await run.ask(comp.plugin, comp.component_type, "execute", params,
                                   Scope(node=node.name, workspace=workspace, endpoint=endpoint), on_partial=on_partial)
        except PluginCallError as exc:
            raise RunError(f"{node.component_type} {node.name!r} failed: {exc}") from None
    if not isinstance(result, dict) or not isinstance(result.get("output"), dict):
        raise PluginError(comp.plugin, f"{comp.component_type} answered execute for node {node.name!r} without an "
                                       "'output' object; answer {\"output\": {...}, \"branch\": ...}")
    output: dict[str, Any] = dict(result["output"])
    for prop in list(node.outputs) or list(comp.outputs):
        if prop["title"] not in output:
            if "default" not in prop:
                raise PluginError(comp.plugin, f"{comp.component_type} node {node.name!r} returned no output "
                                               f"{prop['title']!r}, which it declares")
            output[prop["title"]] = prop["default"]
    branch = result.get("branch")
    if branch is None and "next" not in comp.branches:
        raise PluginError(comp.plugin, f"{comp.component_type} node {node.name!r} chose no branch; answer with "
                                       "\"branch\": one of " + ", ".join(comp.branches))
    if branch is not None and (not isinstance(branch, str) or branch not in comp.branches):
        raise PluginError(comp.plugin, f"{comp.component_type} node {node.name!r} chose branch {branch!r}; it declares "
                                       + ", ".join(comp.branches))
    return output, (None if branch == "next" and comp.branches == ("next",) else branch)
