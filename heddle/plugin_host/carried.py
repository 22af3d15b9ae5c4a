"""Plugins carried in a bundle, seen by the code that seals and verifies it.

A bundle carries each plugin's whole folder, so its manifest, program and tool schemas are
hashed like every other file. What the bundle code needs to know about them is small: the
node types they add (so the sealed flow loads) and the tools they provide (so those are not
looked for in the tools folder, nor in the manifest's `tools`, whose fingerprints describe
the flow's ServerTools that the tools folder answers). Reading them runs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heddle.egress import merge
from heddle.plugin_host.manifest import PluginManifest, load_manifest

if TYPE_CHECKING:
    from heddle.egress import Rule


@dataclass(frozen=True)
class CarriedPlugins:
    manifests: tuple[PluginManifest, ...] = ()

    @property
    def node_types(self) -> frozenset[str]:
        """Node component types the flow may use: pass to `load_flow(..., node_types=...)`."""
        return frozenset(c.component_type for m in self.manifests for c in m.components if c.kind == "node")

    @property
    def tool_names(self) -> frozenset[str]:
        """Tools a plugin answers (from its folder or its process), not the tools folder."""
        return frozenset(t.name for m in self.manifests for t in m.tools)

    @property
    def egress(self) -> dict[str, tuple[Rule, ...]]:
        """What the plugins' manifests declare their tools may reach (heddle.egress)."""
        return merge(*(m.egress for m in self.manifests))

def read_carried(paths: Iterable[str | Path]) -> CarriedPlugins:
    """The plugins at `paths` (manifests, or folders holding one), read and checked; no settings
    are needed and no process starts."""
    return CarriedPlugins(tuple(load_manifest(p) for p in paths))


def read_sealed(root: Path, manifest: Any) -> CarriedPlugins:
    """The plugins a verified bundle carries: `manifest` is its heddle.bundle Manifest and `root`
    its payload tree in the cache."""
    return read_carried(Path(root) / entry.manifest for entry in manifest.plugins)
