"""The plugins one heddle process has loaded: manifests, settings, and a process per plugin.

A host is made once (by `heddle run`, or once for the whole of `heddle-server`) and serves
every run: it is the `plugins` a run is prepared with (heddle.engine.seams.Plugins), and
each run gets a `PluginRun` (heddle.plugin_host.middleware), its seams, whose calls name it.
Loading reads manifests and checks settings; no process starts until its first call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec.components import node_key
from heddle.blocking import WORKSPACE_COPIES, run_blocking
from heddle.graph import FlowGraph, subflows
from heddle.plugin_host import MAX_NODE_ATTEMPTS, PLUGIN_TIMEOUT_S
from heddle.plugin_host.config import parse_config_options, resolve_configs
from heddle.plugin_host.errors import PluginError, PluginLoadError
from heddle.plugin_host.launch import Launch, plan_launch
from heddle.plugin_host.manifest import (
    CAPABILITIES,
    Component,
    Phase,
    PluginManifest,
    PluginTool,
    discovered_tools,
    load_manifest,
)
from heddle.plugin_host.middleware import PluginRun
from heddle.plugin_host.process import PluginCallError, PluginProcess
from heddle.plugin_host.protocol import LIST_TOOLS
from heddle.workspace.mounts import Mount
from heddle.workspace.treecopy import remove_tree
from heddle.workspace.workspace import make_keep_root

if TYPE_CHECKING:
    from heddle.engine.context import RunContext
    from heddle.engine.options import RunOptions
    from heddle.engine.seams import Rendering
    from heddle.workspace.egress_proxy import EgressCall


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


class PluginHost:
    """Loaded plugins. Use `PluginHost.load(paths, ...)`; `await aclose()` stops their processes.

    With `keep_running` (a server) the processes serve run after run until `aclose()`; without
    it they stop when each run ends."""

    def __init__(self, manifests: Sequence[PluginManifest], *, configs: Mapping[str, Any] | None = None,
                 timeout: float = PLUGIN_TIMEOUT_S, max_node_attempts: int = MAX_NODE_ATTEMPTS,
                 grant: Iterable[str] | None = None, require_settings: bool = True,
                 keep_running: bool = False) -> None:
        if not timeout > 0:
            raise PluginLoadError(f"--plugin-timeout {timeout:g}: must be more than 0 seconds")
        if max_node_attempts < 1:
            raise PluginLoadError(f"--max-node-attempts {max_node_attempts}: must be at least 1")
        self.timeout = float(timeout)
        self.max_node_attempts = max_node_attempts
        self.keep_running = keep_running
        granted = set(CAPABILITIES if grant is None else grant)
        self.manifests: dict[str, PluginManifest] = {}
        self.components: dict[str, Component] = {}
        self.tools: dict[str, PluginTool] = {}
        self.encoders: dict[str, Component] = {}
        self.middleware: dict[tuple[str, Phase], list[Component]] = {}
        self.granted: dict[str, frozenset[str]] = {}
        for manifest in manifests:
            self._add(manifest, granted)
        self.configs = resolve_configs(self.components, configs or {}, require=require_settings)
        self._processes: dict[str, PluginProcess] = {}
        self._homes: dict[str, tuple[Path, bool]] = {}
        self.discovered = False  # whether discover_tools asked the plugins that list tools

    @classmethod
    def load(cls, paths: Iterable[str | Path], *, config_specs: Iterable[str] = (), **kwargs: Any) -> PluginHost:
        """Read every manifest in `paths` and the `--plugin-config` settings; start nothing."""
        return cls([load_manifest(p) for p in paths], configs=parse_config_options(config_specs), **kwargs)

    def _add(self, manifest: PluginManifest, granted: set[str]) -> None:
        source = str(manifest.path)
        other = self.manifests.get(manifest.name)
        if other is not None:
            raise PluginLoadError(f"{source}: plugin name {manifest.name!r} is also the name of {other.path}; "
                                  "load each plugin once, or rename one")
        for i, comp in enumerate(manifest.components):
            taken = self.components.get(comp.component_type)
            if taken is not None:
                raise PluginLoadError(f"{source}: components[{i}].componentType {comp.component_type!r} is also "
                                      f"declared by plugin {taken.plugin!r} ({self.manifests[taken.plugin].path}); "
                                      "rename one")
            if comp.kind == "encoder" and comp.protocol in self.encoders:
                taken = self.encoders[comp.protocol]
                raise PluginLoadError(f"{source}: components[{i}].protocol {comp.protocol!r} is also the protocol of "
                                      f"plugin {taken.plugin!r}; give each encoder its own")
        for tool in manifest.tools:
            taken_tool = self.tools.get(tool.name)
            if taken_tool is not None and not tool.shadows:
                raise PluginLoadError(f"{source}: {tool.where}.name {tool.name!r} is also a tool of plugin "
                                      f"{taken_tool.plugin!r}; set \"shadows\": true to replace it, or rename it")
        self.manifests[manifest.name] = manifest
        self.granted[manifest.name] = frozenset(manifest.capabilities & granted)
        for comp in manifest.components:
            self.components[comp.component_type] = comp
            if comp.kind == "encoder":
                self.encoders[comp.protocol] = comp
            for seam_phase in sorted(comp.seams):
                self.middleware.setdefault(seam_phase, []).append(comp)
        for tool in manifest.tools:
            self.tools[tool.name] = tool

    # ---------------------------------------------------------------- what the flow may use

    def node_types(self) -> frozenset[str]:
        """The node component types a flow may use with these plugins."""
        return frozenset(c.component_type for c in self.components.values() if c.kind == "node")

    def node_component(self, component_type: str) -> Component | None:
        comp = self.components.get(component_type)
        return comp if comp is not None and comp.kind == "node" else None

    def chain(self, seam: str, phase: Phase) -> list[Component]:
        return self.middleware.get((seam, phase), [])

    def known_tools(self, tools: Mapping[str, Path]) -> dict[str, Path]:
        """`tools` with the plugins' tools added, for checking a flow; a plugin tool that takes the
        name of one of `tools` without `"shadows": true` is refused."""
        out = dict(tools)
        for name, tool in sorted(self.tools.items()):
            if name in tools and not tool.shadows:
                manifest = self.manifests[tool.plugin]
                if tool.discovered:
                    raise PluginLoadError(f"plugin {tool.plugin!r} listed tool {name!r} (listTools), which is also "
                                          f"the tool {tools[name]}; a listed tool never replaces another, so rename "
                                          "one")
                raise PluginLoadError(f"{manifest.path}: {tool.where}.name {name!r} is also the tool {tools[name]}; "
                                      "set \"shadows\": true to replace it, or rename it")
            out[name] = tool.path or manifest_path(self, tool)
        return out

    def check_flow(self, flow: c.Flow) -> list[str]:
        """Problems with the plugin nodes of `flow` (and its subflows): branches without an edge,
        edges leaving by a branch the node type does not have."""
        problems: list[str] = []

        def walk(f: c.Flow, prefix: str) -> None:
            graph = FlowGraph.build(f)
            for node in f.nodes:
                for label, sub in subflows(node):
                    walk(sub, f"{prefix}{label} > ")
                if not isinstance(node, c.PluginNode):
                    continue
                comp = self.node_component(node.component_type)
                if comp is None:
                    problems.append(f"{prefix}{node.component_type} {node.name!r}: no loaded plugin declares the node "
                                    f"type {node.component_type!r}")
                    continue
                edges = graph.edges_from.get(node_key(node), [])
                covered = {e.from_branch for e in edges}
                for edge in edges:
                    if edge.from_branch is not None and edge.from_branch not in comp.branches:
                        problems.append(f"{prefix}control edge {edge.name!r} leaves {node.component_type} "
                                        f"{node.name!r} by branch {edge.from_branch!r}, which {comp.label()} does not "
                                        f"declare (it declares: {', '.join(comp.branches)})")
                if edges and None not in covered:
                    for branch in comp.branches:
                        if branch not in covered:
                            problems.append(f"{prefix}{node.component_type} {node.name!r} can take branch {branch!r} "
                                            "but no control edge leaves by it")

        walk(flow, "")
        return problems

    def with_files(self, options: RunOptions) -> RunOptions:
        """`options` with every plugin's `files` added as read-only mounts of every workspace."""
        mounts = [Mount(source=m.root.joinpath(*PurePosixPath(rel).parts), dest=PurePosixPath(rel), mode="ro")
                  for m in self.manifests.values() for rel in m.files]
        if not mounts:
            return options
        workspace = dataclasses.replace(options.workspace, mounts=(*options.workspace.mounts, *mounts))
        return dataclasses.replace(options, workspace=workspace)

    # ---------------------------------------------------------------- processes

    def home(self, plugin: str, options: RunOptions) -> Path:
        """The plugin process's own folder, where it runs and the one place it may write."""
        if plugin not in self._homes:
            keep_root = options.workspace.keep_root
            if keep_root is not None:
                home = make_keep_root(Path(keep_root)) / f"plugin-{plugin}"
                home.mkdir(0o700, exist_ok=True)
                self._homes[plugin] = (Path(os.path.realpath(home)), True)
            else:
                made = tempfile.mkdtemp(prefix=f"heddle-plugin-{plugin}-")
                self._homes[plugin] = (Path(os.path.realpath(made)), False)
        return self._homes[plugin][0]

    def process(self, plugin: str, options: RunOptions) -> PluginProcess:
        """The plugin's process, made (not started) on first use with the first run's sandbox policy."""
        proc = self._processes.get(plugin)
        if proc is None:
            from heddle.workspace.egress_proxy import process_guard

            manifest = self.manifests[plugin]
            policy = options.sandbox

            def launch(egress: EgressCall | None = None) -> Launch:
                return plan_launch(manifest, home=self.home(plugin, options), policy=policy, egress=egress)

            # Under --safe with an allow-list, its one way out is a proxy that admits what the plugin's own
            # entry and its tools' admit: one process serves them all.
            guard = process_guard(options, plugin, [plugin, *(tool.name for tool in manifest.tools)])
            proc = PluginProcess(plugin, launch, timeout=self.timeout, capabilities=self.granted[plugin],
                                 surface=options.surface, egress=guard)
            self._processes[plugin] = proc
        return proc

    async def discover_tools(self, options: RunOptions) -> None:
        """Start each plugin whose manifest declares `discoverTools` and ask it which tools it serves
        (`listTools`, --discover-tools): they join the plugin tools, answered by its process. A listed
        tool never replaces another, so a name already taken is refused. Asked once per host."""
        if self.discovered:
            return
        for manifest in self.manifests.values():
            if not manifest.discover_tools:
                continue
            try:
                answer = await self.process(manifest.name, options).call(LIST_TOOLS, {})
            except PluginCallError as exc:
                raise PluginError(manifest.name, f"refused listTools: {exc}") from None
            try:
                listed = discovered_tools(manifest, answer)
            except ValueError as exc:
                raise PluginError(manifest.name, str(exc)) from None
            for tool in listed:
                taken = self.tools.get(tool.name)
                if taken is not None:
                    raise PluginError(manifest.name, f"listed tool {tool.name!r}, which is also a tool of plugin "
                                                     f"{taken.plugin!r}; a listed tool never replaces another, so "
                                                     "rename one")
                self.tools[tool.name] = tool
        self.discovered = True

    def start_run(self, ctx: RunContext, rendering: Rendering | None) -> PluginRun:
        """The seams of one run, under an id its encoder and its middleware calls share."""
        return PluginRun(self, ctx, new_run_id(), rendering)

    async def aclose(self) -> None:
        """Stop every plugin process and remove the homes heddle made for them."""
        processes, self._processes = self._processes, {}
        for proc in processes.values():
            await proc.close()
        homes, self._homes = self._homes, {}
        for home, kept in homes.values():
            if not kept:
                with contextlib.suppress(OSError):
                    await run_blocking(WORKSPACE_COPIES, remove_tree, home)

    def describe(self) -> list[dict[str, Any]]:
        """What `heddle validate` reports about the loaded plugins."""
        rows = []
        for m in self.manifests.values():
            rows.append({
                "name": m.name, "version": m.version, "manifest": str(m.path), "fingerprint": m.fingerprint,
                "capabilities": sorted(self.granted[m.name]),
                "components": [{"componentType": c.component_type, "kind": c.kind,
                                **({"seams": sorted(f"{s}.{p}" for s, p in c.seams)} if c.kind == "middleware" else {}),
                                **({"protocol": c.protocol} if c.kind == "encoder" else {})}
                               for c in m.components],
                "tools": [{"name": t.name, "fingerprint": t.fingerprint} for t in m.tools]
                + [{"name": t.name, "fingerprint": t.fingerprint, "discovered": True}
                   for t in self.tools.values() if t.discovered and t.plugin == m.name],
            })
        return rows


def manifest_path(host: PluginHost, tool: PluginTool) -> Path:
    return host.manifests[tool.plugin].path
