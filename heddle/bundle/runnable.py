"""From a verified bundle to what the engine runs: the sealed flow, tools, mounts and proposals.

The bundle proposes, the caller disposes: the recorded input and tool-round limit are
defaults the command line may replace, and its mounts come before any the caller adds.
Nothing here weakens verification: every path handed to the engine lies inside the
read-only cache entry that `open_bundle` just proved, except `rw` mounts, which are seeded
into a writable data folder so the sealed copy is never written.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.format.manifest import Manifest
    from heddle.format.progress import Progress
    from heddle.format.trust import TrustPolicy
    from heddle.tools.commands import CommandSet
    from heddle.workspace.mounts import Mount


@dataclass(frozen=True)
class SealedRun:
    name: str
    digest: str
    signers: list[str]
    flow: Flow
    flow_path: Path
    tools: dict[str, Path]
    tools_dir: Path
    tool_fingerprints: dict[str, str]
    mounts: list[Mount]
    input: dict[str, Any]
    max_tool_rounds: int | Literal["unlimited"] | None  # the proposal: a number, "unlimited", or None for none
    plugins: list[Path]  # sealed plugin manifests, inside the cache
    manifest: Manifest = field(repr=False)
    data_dir: Path | None = None
    data_dir_created: bool = False
    legacy: bool = False
    cached: bool = False
    repaired: str | None = None  # why the cached copy was not trusted and was verified again
    commands: CommandSet | None = None  # its sealed commands file, checked again against the manifest
    signed_at: str | None = None  # when its latest trusted signature was made; None when unknown


def open_runnable(
    path: Path,
    *,
    trust: TrustPolicy,
    data_dir: Path | None = None,
    seed_data: bool = True,
    cache_root: Path | None = None,
    fmt: str | None = None,
    progress: Progress | None = None,
    node_types: Iterable[str] = (),
) -> SealedRun:
    """Verify `path` against `trust` (built once by the caller) and return what to run. Raises the
    bundle errors."""
    from heddle.bundle.datadir import seed_data_dir
    from heddle.bundle.fingerprints import fingerprints_of, sealed_commands, sealed_flow
    from heddle.format.verify import open_bundle
    from heddle.tools.registry import discover_tools
    from heddle.workspace.mounts import Mount

    loaded: list[Flow] = []

    def sealed_fingerprints(flow_path: Path, manifest: Manifest) -> dict[str, str]:
        # Parsed once, here, after every payload byte matched: for the check and for the run.
        flow, plugin_tools = sealed_flow(flow_path, manifest, fmt=fmt, node_types=node_types)
        loaded.append(flow)
        return fingerprints_of(flow, leave_out=plugin_tools)

    opened = open_bundle(Path(path), trusted_keys=trust.trusted, allow_unsigned=trust.admits_unsigned,
                         cache_root=cache_root,
                         progress=progress, tool_fingerprints=sealed_fingerprints)
    manifest = opened.manifest
    flow = loaded[-1] if loaded else sealed_flow(opened.flow_path, manifest, fmt=fmt, node_types=node_types)[0]
    tools_dir = opened.tools_dir
    # Every sealed tool is on .heddle/bin (tools may call each other); the ones the flow names
    # come from the manifest's own entries, whose fingerprints were just checked.
    tools = discover_tools(tools_dir) if tools_dir.is_dir() else {}
    for name in manifest.tools:
        tools[name] = opened.tool_path(name)
    mounts: list[Mount] = []
    seeded_dir: Path | None = None
    created = False
    if seed_data:
        seeded = seed_data_dir(opened, data_dir)
        seeded_dir, created = seeded.path, seeded.created
        mounts = [Mount(source=m.source, dest=PurePosixPath(m.dest), mode=m.mode) for m in seeded.mounts]
    return SealedRun(
        name=manifest.name,
        digest=opened.digest,
        signers=list(opened.signers),
        flow=flow,
        flow_path=opened.flow_path,
        tools=tools,
        tools_dir=tools_dir,
        tool_fingerprints={name: entry.fingerprint for name, entry in manifest.tools.items()},
        mounts=mounts,
        input=dict(manifest.input or {}),
        max_tool_rounds=manifest.proposals.max_tool_rounds,
        plugins=[opened.root / p.manifest for p in manifest.plugins],
        data_dir=seeded_dir,
        data_dir_created=created,
        legacy=opened.legacy,
        cached=opened.cached,
        manifest=manifest,
        repaired=opened.repaired,
        commands=sealed_commands(opened.root, manifest),
        signed_at=opened.signed_at,
    )
