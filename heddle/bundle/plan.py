"""Deciding what a bundle holds from the pieces `heddle bundle` is given.

Payload layout: the flow at `<flow file name>`, its components file (when it has one) at
`components/<file name>`, its commands file (when it has one) at `commands/<file name>`, the tools
folder at `tools/`, each mount at `mounts/<dest>`, each
plugin's folder at `plugins/<name>/`. Every check that can fail
is made here, before a byte is sealed, with the source path that caused it: model keys written
in the flow are refused here too, and the plan carries the screen that refuses files looking like
secrets, by their names and by their first bytes, as the packer hashes them (one read a file).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from heddle.bundle.collect import LEFT_OUT, Collected, SecretScreen, collect_tree
from heddle.bundle.flowenv import refuse_literal_keys
from heddle.format.errors import PackError
from heddle.format.limits import DEFAULT_LIMITS, Limits
from heddle.format.manifest import (
    PAYLOAD,
    RESERVED_DEST,
    CommandEntry,
    CommandsEntry,
    MountEntry,
    PluginEntry,
    Proposals,
    Requires,
    ToolEntry,
)
from heddle.format.pack import PackPlan
from heddle.format.paths import PathSet, all_clean, collision_free, path_problem
from heddle.format.tar import split_name
from heddle.workspace.mounts import MountCount

if TYPE_CHECKING:
    from heddle.tools.commands import CommandSet
    from heddle.workspace.mounts import Mount


COMPONENTS_DIR = "components"
COMMANDS_DIR = "commands"


@dataclass(frozen=True)
class ToolSpec:
    """A tool the flow names: its executable (inside the tools folder) and input-schema fingerprint."""

    path: Path
    fingerprint: str


def plugin_name(manifest: Path) -> str:
    """A plugin's `name` from its JSON manifest, else the name of its folder."""
    try:
        data = json.loads(manifest.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = None
    name = data.get("name") if isinstance(data, dict) else None
    if isinstance(name, str) and name:
        return name
    return manifest.resolve().parent.name


def make_plan(
    flow: Path,
    *,
    name: str | None = None,
    tools_dir: Path | None = None,
    tools: Mapping[str, ToolSpec] | None = None,
    mounts: Sequence[Mount] = (),
    plugins: Sequence[Path] = (),
    input: Mapping[str, Any] | None = None,
    requires: Requires | None = None,
    proposals: Proposals | None = None,
    limits: Limits = DEFAULT_LIMITS,
    include_secrets: Sequence[Path] = (),
    flow_format: str | None = None,
    components: Path | None = None,
    commands: CommandSet | None = None,
    mount_limits: tuple[int, int] | None = None,
) -> PackPlan:
    """What sealing these pieces would write. `include_secrets` are the source paths (files,
    or folders holding them) that `--include-secret` lets be sealed though they look like secrets.
    `components` is the flow's file of shared components (`--components`); `commands` its commands
    file, read and checked (`--commands`). `mount_limits` (files and folders, bytes) are the mount limits,
    counted as each mount is walked here, its folder's top already counted (`check_mounts(..., walk=False)`)."""
    flow = Path(flow)
    carried = collect_tree(flow, flow.name, what=f"flow {flow}")
    components_entry = None
    if components is not None:
        components = Path(components)
        components_entry = f"{COMPONENTS_DIR}/{components.name}"
        carried.extend(collect_tree(components, components_entry, what=f"--components {components}"))
    commands_entry = None
    if commands is not None:
        file = f"{COMMANDS_DIR}/{commands.path.name}"
        carried.extend(collect_tree(commands.path, file, what=commands.what))
        commands_entry = CommandsEntry(file=file, entries={
            c.name: CommandEntry(revision=c.revision, fingerprint=c.input_schema_fingerprint,
                                 expected_version=c.expected_version, adapter_version=c.adapter_version,
                                 executable_path=c.program.path if c.program else None,
                                 executable_sha256=c.program.sha256 if c.program else None)
            for c in commands})
    if tools_dir is not None:
        if not Path(tools_dir).is_dir():
            raise PackError(f"--tools-dir {tools_dir}: not a folder")
        carried.extend(collect_tree(Path(tools_dir), "tools", what=f"--tools-dir {tools_dir}"))
    tool_entries = _tools(tools or {}, tools_dir, carried)
    mount_entries = [_mount(m, carried, mount_limits) for m in mounts]
    plugin_entries = _plugins(plugins, carried)
    _check_paths(carried, limits)
    refuse_literal_keys(flow, flow_format, components=components)
    if components is not None:
        refuse_literal_keys(components, None, what="--components")
    return PackPlan(
        name=name or flow.stem,
        flow=flow.name,
        files=carried.files,
        tools=tool_entries,
        plugins=plugin_entries,
        mounts=mount_entries,
        input=dict(input or {}),
        requires=requires or Requires(),
        proposals=proposals or Proposals(),
        skipped=carried.skipped,
        components=components_entry,
        commands=commands_entry,
        screen=SecretScreen(carried.files, include_secrets),
    )


def _tools(tools: Mapping[str, ToolSpec], tools_dir: Path | None, carried: Collected) -> dict[str, ToolEntry]:
    paths = {f.path for f in carried.files}
    out: dict[str, ToolEntry] = {}
    for name, spec in sorted(tools.items()):
        if tools_dir is None:
            raise PackError(f"tool {name!r}: the flow names it but there is no --tools-dir to carry it from")
        try:
            rel = Path(spec.path).resolve().relative_to(Path(tools_dir).resolve())
        except ValueError:
            raise PackError(f"tool {name!r}: {spec.path} is not inside --tools-dir {tools_dir}") from None
        entry = f"tools/{rel.as_posix()}"
        if entry not in paths:
            raise PackError(
                f"tool {name!r}: {spec.path} is not carried (anything under a {LEFT_OUT} folder is left out); move it"
            )
        out[name] = ToolEntry(entry=entry, fingerprint=spec.fingerprint)
    return out


def _mount(mount: Mount, carried: Collected, limits: tuple[int, int] | None) -> MountEntry:
    dest = str(PurePosixPath(str(mount.dest)))
    what = f"--mount {mount.source}:{dest}"
    problem = path_problem(dest, max_depth=DEFAULT_LIMITS.max_depth)
    if problem is not None:
        raise PackError(f"{what}: DEST {dest!r} {problem}")
    if dest.split("/", 1)[0] == RESERVED_DEST:
        raise PackError(f"{what}: DEST {dest!r} is inside {RESERVED_DEST}, which heddle reserves; choose another")
    if mount.mode not in ("ro", "rw"):  # a Mount is a plain dataclass: nothing checked it yet
        raise PackError(f"{what}: mode {mount.mode!r} is not ro or rw")
    prefix = f"mounts/{dest}"
    # Its top folder is counted where the mount rules checked it (check_mounts): one entry, no bytes.
    count = (MountCount(mount, max_entries=limits[0], max_bytes=limits[1], entries=1)
             if limits is not None else None)
    carried.extend(collect_tree(Path(mount.source), prefix, what=what, count=count))
    return MountEntry(prefix=prefix, dest=dest, mode=mount.mode)


def _plugins(manifests: Sequence[Path], carried: Collected) -> list[PluginEntry]:
    out: list[PluginEntry] = []
    for manifest in manifests:
        manifest = Path(manifest)
        what = f"--plugin {manifest}"
        if not manifest.is_file():
            raise PackError(f"{what}: no such manifest file")
        name = plugin_name(manifest)
        if "/" in name or path_problem(name, max_depth=1) is not None:
            raise PackError(f"{what}: plugin name {name!r} cannot name a folder; give the plugin a plain name")
        if any(p.name == name for p in out):
            raise PackError(f"{what}: two plugins are named {name!r}; rename one")
        folder = f"plugins/{name}"
        carried.extend(collect_tree(manifest.parent, folder, what=what))
        rel = f"{folder}/{manifest.name}"
        if rel not in {f.path for f in carried.files}:
            raise PackError(f"{what}: the manifest itself is left out (it lies under a {LEFT_OUT} folder); move it")
        out.append(PluginEntry(name=name, dir=folder, manifest=rel))
    return out


def _check_paths(carried: Collected, limits: Limits) -> None:
    paths = [item.path for item in carried.files]
    # Passes of C over all paths at once (as a manifest is checked); the loop below runs only to
    # name the file at fault.
    if (all_clean(paths, max_depth=limits.max_depth) and collision_free(paths)
            and all(split_name(PAYLOAD + p) is not None for p in paths if len(p.encode()) + len(PAYLOAD) > 100)):
        return
    seen = PathSet()
    for item in carried.files:
        problem = path_problem(item.path, max_depth=limits.max_depth)
        if problem is None and split_name(PAYLOAD + item.path) is None:
            problem = "is too long to store in a tar header"
        if problem is None:
            problem = seen.add_file(item.path)
        if problem is not None:
            raise PackError(f"{item.source}: cannot be carried as {item.path!r}: {problem}; rename or move it")
