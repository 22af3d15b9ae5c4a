"""Input-schema fingerprints recomputed from a flow, for checking a sealed bundle.

A tool's fingerprint is the sha256 of the canonical JSON of its input JSON Schema, exactly
as `heddle validate` prints it; recomputing it from the sealed flow catches a manifest
whose tools do not describe the flow it carries.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from heddle.agentspec.document import load_components, load_flow
from heddle.errors import DocumentError
from heddle.format.errors import ContentMismatchError, MalformedBundleError
from heddle.graph import referenced_tools
from heddle.tools.schema import input_fingerprint

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.format.manifest import Manifest
    from heddle.tools.commands import CommandSet


def fingerprints_of(flow: Flow, *, leave_out: Iterable[str] = ()) -> dict[str, str]:
    """{tool name: fingerprint} for every ServerTool a loaded flow (or its subflows) names,
    but those in `leave_out` (tools a plugin provides, fingerprinted with the plugin)."""
    skip = set(leave_out)
    return {name: input_fingerprint(tool) for name, tool in referenced_tools(flow).items() if name not in skip}


def load_sealed_flow(flow_path: Path, fmt: str | None = None, node_types: Iterable[str] = (),
                     components: Path | None = None) -> Flow:
    """The sealed flow document (with its sealed components file, when it has one); one that does
    not load makes the bundle malformed."""
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
    names of the tools those plugins provide and of its commands (they are fingerprinted with the
    plugin, or the commands file, not here). The commands file is read and checked again."""
    plugin_tools: frozenset[str] = frozenset()
    types = set(node_types)
    if manifest is not None and manifest.plugins:
        # Here, not at the top: a bundle without plugins loads no plugin code (start-up).
        from heddle.plugin_host.carried import read_sealed

        # The flow sits at the payload root, beside the plugins/ folder (SPEC: payload layout).
        carried = read_sealed(flow_path.parent, manifest)
        types |= carried.node_types
        plugin_tools = carried.tool_names
    # The components file, like the plugins, sits in the payload beside the flow (SPEC: payload layout).
    components = flow_path.parent / manifest.components if manifest is not None and manifest.components else None
    commands = sealed_commands(flow_path.parent, manifest)
    if commands is not None:
        plugin_tools |= frozenset(commands.commands)
    return load_sealed_flow(flow_path, fmt, node_types=types, components=components), plugin_tools


def sealed_commands(payload: Path, manifest: Manifest | None) -> CommandSet | None:
    """The sealed commands file, read and checked as `--commands` is, each command exactly as the
    manifest lists it (revision, input-schema fingerprint, versions); None when there is none. A
    command with `working_directory: bundle` runs in the payload."""
    if manifest is None or manifest.commands is None:
        return None
    # Here, not at the top: sealing imports this module for `fingerprints_of`, and only a bundle with a
    # commands file needs the commands' module.
    from heddle.tools.commands import SYSTEM_PATH, Program, read_commands

    sealed = manifest.commands
    programs = {name: Program(entry.executable_path, entry.executable_sha256, sealed=True)
                for name, entry in sealed.entries.items()
                if entry.executable_path is not None and entry.executable_sha256 is not None}
    commands = read_commands(payload / sealed.file, what=f"the sealed commands file {sealed.file}", folder=payload,
                             error=MalformedBundleError, programs=programs)
    found = {c.name: (c.revision, c.input_schema_fingerprint, c.expected_version, c.adapter_version)
             for c in commands}
    for command in commands:
        pin = programs.get(command.name)
        # The pinned path must be where the executable the file names resolves (SYSTEM_PATH, never PATH).
        if pin is not None and pin.path != command.executable and \
                pin.path not in {f"{d}/{command.executable}" for d in SYSTEM_PATH}:
            raise ContentMismatchError(f"command {command.name!r} runs {command.executable!r} in the sealed commands "
                                       f"file, but the manifest pins {pin.path}")
    for name in sorted(set(found) | set(sealed.entries)):
        if name not in sealed.entries:
            raise ContentMismatchError(f"the sealed commands file has command {name!r}, which the manifest does not "
                                       "list")
        if name not in found:
            raise ContentMismatchError(f"command {name!r} is in the manifest but not in the sealed commands file")
        entry = sealed.entries[name]
        if found[name] != (entry.revision, entry.fingerprint, entry.expected_version, entry.adapter_version):
            raise ContentMismatchError(f"command {name!r} has revision {found[name][0]} in the sealed commands "
                                       f"file but {entry.revision} in the manifest (or another input "
                                       "schema or version)")
    return commands


def flow_tool_fingerprints(flow_path: Path, manifest: Manifest | None = None) -> dict[str, str]:
    """{tool name: fingerprint} of the tools the sealed flow names and the tools folder must carry."""
    flow, plugin_tools = sealed_flow(flow_path, manifest)
    return fingerprints_of(flow, leave_out=plugin_tools)
