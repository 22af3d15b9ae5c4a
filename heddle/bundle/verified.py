"""A bundle opened for running: proved against a `TrustPolicy`, then described and runnable.

`open_bundle` is the one door both shells and library callers go through: the same
verification (and exit codes) as `heddle verify`, the sealed flow parsed once after every
payload byte matched, and `rw` mounts seeded into a writable data folder. A `Bundle` owns
that folder when it made it: `close()` (or leaving a `with` block) removes it.
"""

from __future__ import annotations

import operator
import os
import shutil
from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from types import MappingProxyType, TracebackType
from typing import TYPE_CHECKING, Any, Self

from heddle.bundle.datadir import seed_data_dir
from heddle.bundle.fingerprints import fingerprints_of, sealed_commands, sealed_flow
from heddle.engine.tracing import DIGEST, SIGNER, verify_span
from heddle.errors import UsageError
from heddle.format.cache import digest_text
from heddle.format.trust import TrustPolicy
from heddle.format.verify import verify_bundle
from heddle.tools.registry import discover_tools
from heddle.workspace.mounts import Mount

if TYPE_CHECKING:
    from heddle.agentspec.components import Flow
    from heddle.format.manifest import Manifest
    from heddle.format.progress import Progress
    from heddle.tools.commands import CommandSet

StrPath = str | os.PathLike[str]
_PATH, _SIZE = operator.itemgetter(0), operator.itemgetter(1)  # a manifest FileEntry's fields


@dataclass(frozen=True, eq=False)
class Bundle:
    """A verified bundle, as `open_bundle` returns it and every run takes it (heddle.run, heddle.core).

    Every path in it lies inside the read-only cache entry `open_bundle` just proved, except the `rw`
    mounts, seeded into a writable data folder so that the sealed copy is never written. What the
    bundle proposes (its input, `manifest.proposals`) is settled against the caller's settings where
    it runs: the bundle proposes, the caller disposes, and its mounts come before any the caller adds."""

    path: Path
    name: str
    digest: str  # `sha256:<hex>` of the signed manifest (a format-1 bundle: `legacy-<hex>` of the file)
    signers: tuple[str, ...]  # the trusted keys whose signatures verified; empty for an admitted unsigned one
    flow: Flow  # the sealed flow, parsed once from the verified tree
    flow_path: Path
    tools: Mapping[str, Path]
    tools_dir: Path
    tool_fingerprints: Mapping[str, str]
    mounts: tuple[Mount, ...]
    input: Mapping[str, Any]  # the input it proposes for a run given none
    plugins: tuple[Path, ...]  # its sealed plugin manifests, inside the cache
    manifest: Manifest = field(repr=False)
    data_dir: Path | None = None  # where the `rw` mounts were seeded; None when there are none (or unseeded)
    data_dir_created: bool = False
    legacy: bool = False
    cached: bool = False
    repaired: str | None = None  # why a cached copy was not trusted (removed, and verified again), or None
    commands: CommandSet | None = None  # its sealed commands file, checked again against the manifest
    signed_at: str | None = None  # when its latest trusted signature was made; None when unknown

    def close(self) -> None:
        """Remove the data folder opening made for `rw` mounts (never one the caller gave)."""
        remove_data_dir(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def remove_data_dir(bundle: Bundle | None) -> None:
    """Remove the data folder opening made for `rw` mounts, unless the caller gave it."""
    if bundle is not None and bundle.data_dir_created and bundle.data_dir is not None:
        shutil.rmtree(bundle.data_dir, ignore_errors=True)


def _sealed_size(manifest: Manifest, prefix: str) -> tuple[int, int]:
    """(files and folders, bytes) under `prefix` of a payload proved against `manifest`: what a walk of
    the mount would count (a run's mount limits), without the walk; passes of C over the paths."""
    entry = manifest.by_path.get(prefix)
    if entry is not None:
        return 1, entry.size
    under = prefix + "/"
    files = manifest.files
    paths = list(map(_PATH, files))
    if not all(map(operator.lt, paths, paths[1:])):  # a format-1 bundle's, in its archive's order
        files = tuple(sorted(files))
        paths = list(map(_PATH, files))
    # Sorted by path, the files under `prefix` are one run: from `prefix/` up to `prefix0`
    # ('0' follows '/').
    start, end = bisect_left(paths, under), bisect_left(paths, prefix + "0")
    folders = [d for d in manifest.dirs if d.startswith(under)]
    return end - start + len(folders) + 1, sum(map(_SIZE, files[start:end]))


def open_bundle(
    path: StrPath,
    *,
    trust: TrustPolicy,
    data_dir: StrPath | None = None,
    seed_data: bool = True,
    cache_dir: StrPath | None = None,
    plugins: Sequence[StrPath] = (),
    flow_format: str | None = None,
    progress: Progress | None = None,
) -> Bundle:
    """Verify the bundle at `path` against `trust` and return it, ready to run.

    Raises a `heddle.HeddleError` subclass whose `exit_code` says what failed: 3 unsigned,
    4 signed by no trusted key, 5 a bad signature from a trusted key, 6 content that does not
    match the manifest, 7 malformed or over a cap, 8 made by a newer heddle. `plugins` are
    manifests of plugins given beside the bundle (read, not started) whose node types its
    sealed flow may use. `data_dir` keeps the `rw` mounts between runs; without it they are
    seeded into a temporary folder that `Bundle.close()` removes. `seed_data=False` seeds
    nothing (to check a bundle without running it).
    """
    if not isinstance(trust, TrustPolicy):
        # A list of key files here would otherwise be read as "trust" of some kind: refuse it.
        raise UsageError(f"trust={trust!r}: give a heddle.TrustPolicy (TrustPolicy.keys(...), "
                         "TrustPolicy.store() or TrustPolicy.allow_unsigned())")
    node_types: frozenset[str] = frozenset()
    if plugins:
        # Here, not at the top: a run of a bundle without plugins loads no plugin code (start-up).
        from heddle.plugin_host.carried import read_carried

        node_types = read_carried([Path(p) for p in plugins]).node_types

    with verify_span() as span:
        bundle = _verified(Path(path), trust, data_dir=Path(data_dir) if data_dir is not None else None,
                           seed_data=seed_data, cache_root=Path(cache_dir) if cache_dir is not None else None,
                           fmt=flow_format, progress=progress, node_types=node_types)
        if span is not None:
            span.set_attributes({DIGEST: bundle.digest, SIGNER: list(bundle.signers),
                                 "heddle.bundle.name": bundle.name, "heddle.bundle.cached": bundle.cached})
    return bundle


def _verified(path: Path, trust: TrustPolicy, *, data_dir: Path | None, seed_data: bool, cache_root: Path | None,
              fmt: str | None, progress: Progress | None, node_types: Iterable[str]) -> Bundle:
    """Verify `path` (heddle.format.verify), then read what runs from the proved tree."""
    loaded: list[Flow] = []

    def sealed_fingerprints(flow_path: Path, manifest: Manifest) -> dict[str, str]:
        # Parsed once, here, after every payload byte matched: for the check and for the run.
        flow, plugin_tools = sealed_flow(flow_path, manifest, fmt=fmt, node_types=node_types)
        loaded.append(flow)
        return fingerprints_of(flow, leave_out=plugin_tools)

    opened = verify_bundle(path, trusted_keys=trust.trusted, allow_unsigned=trust.admits_unsigned,
                           cache_root=cache_root, progress=progress, tool_fingerprints=sealed_fingerprints)
    manifest = opened.manifest
    flow = loaded[-1] if loaded else sealed_flow(opened.flow_path, manifest, fmt=fmt, node_types=node_types)[0]
    # Every sealed tool is on .heddle/bin (tools may call each other); the ones the flow names
    # come from the manifest's own entries, whose fingerprints were just checked.
    tools = discover_tools(opened.tools_dir) if opened.tools_dir.is_dir() else {}
    for name in manifest.tools:
        tools[name] = opened.tool_path(name)
    mounts: tuple[Mount, ...] = ()
    seeded = seed_data_dir(opened, data_dir) if seed_data else None
    if seeded is not None:
        mounts = tuple(Mount(source=m.source, dest=PurePosixPath(m.dest), mode=m.mode,
                             sealed=_sealed_size(manifest, entry.prefix) if m.mode == "ro" else None)
                       for m, entry in zip(seeded.mounts, manifest.mounts, strict=True))
    return Bundle(
        path, manifest.name, digest_text(opened.digest), tuple(opened.signers), flow, opened.flow_path, tools,
        opened.tools_dir, {name: entry.fingerprint for name, entry in manifest.tools.items()}, mounts,
        MappingProxyType(dict(manifest.input or {})), tuple(opened.root / p.manifest for p in manifest.plugins),
        manifest, data_dir=seeded.path if seeded else None, data_dir_created=bool(seeded and seeded.created),
        legacy=opened.legacy, cached=opened.cached, repaired=opened.repaired,
        commands=sealed_commands(opened.root, manifest), signed_at=opened.signed_at)
