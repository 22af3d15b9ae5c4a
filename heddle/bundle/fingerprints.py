"""Input-schema fingerprints recomputed from a flow, for checking a sealed bundle.

A tool's fingerprint is the sha256 of the canonical JSON of its input JSON Schema, exactly
as `heddle validate` prints it; recomputing it from the sealed flow catches a manifest
whose tools do not describe the flow it carries.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from heddle.errors import DocumentError
from heddle.format.errors import MalformedBundleError

if TYPE_CHECKING:
    from heddle.format.manifest import Manifest
    from heddle.spec.components import Flow


def fingerprints_of(flow: Flow, *, leave_out: Iterable[str] = ()) -> dict[str, str]:
    """{tool name: fingerprint} for every ServerTool a loaded flow (or its subflows) names,
    but those in `leave_out` (tools a plugin provides, fingerprinted with the plugin)."""
    from heddle.graph import referenced_tools
    from heddle.tools.schema import input_fingerprint

    skip = set(leave_out)
    return {name: input_fingerprint(tool) for name, tool in referenced_tools(flow).items() if name not in skip}


def load_sealed_flow(flow_path: Path, fmt: str | None = None, node_types: Iterable[str] = (),
                     components: Path | None = None) -> Flow:
    """The sealed flow document (with its sealed components file, when it has one); one that does
    not load makes the bundle malformed."""
    from heddle.spec.document import load_components, load_flow

    try:
        shared = None
        if components is not None:
            shared = load_components(components, source=f"the sealed components file {components.name}")
        return load_flow(flow_path, fmt=fmt, node_types=node_types, components=shared)
    except DocumentError as exc:
        raise MalformedBundleError(f"the sealed flow does not load: {exc}") from None


def sealed_flow(flow_path: Path, manifest: Manifest | None = None, *, fmt: str | None = None,
                node_types: Iterable[str] = ()) -> tuple[Flow, frozenset[str]]:
    """The sealed flow, read with the node types of the plugins the bundle carries, and the
    names of the tools those plugins provide (they are fingerprinted with the plugin, not here)."""
    plugin_tools: frozenset[str] = frozenset()
    types = set(node_types)
    if manifest is not None and manifest.plugins:
        from heddle.plugin_host.carried import read_sealed

        # The flow sits at the payload root, beside the plugins/ folder (SPEC: payload layout).
        carried = read_sealed(flow_path.parent, manifest)
        types |= carried.node_types
        plugin_tools = carried.tool_names
    # The components file, like the plugins, sits in the payload beside the flow (SPEC: payload layout).
    components = flow_path.parent / manifest.components if manifest is not None and manifest.components else None
    return load_sealed_flow(flow_path, fmt, node_types=types, components=components), plugin_tools


def flow_tool_fingerprints(flow_path: Path, manifest: Manifest | None = None) -> dict[str, str]:
    """{tool name: fingerprint} of the tools the sealed flow names and the tools folder must carry."""
    flow, plugin_tools = sealed_flow(flow_path, manifest)
    return fingerprints_of(flow, leave_out=plugin_tools)
