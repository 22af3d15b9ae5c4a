"""Format 1: the older `.heddle`, a gzip of a ustar tar with a `heddle.json` manifest.

It carries no digests and no signatures, so it opens only where unsigned bundles are
allowed, and always through the same reader as a sealed bundle: the same header parser,
the same path rules and collision checks, the same staging writer (O_EXCL|O_NOFOLLOW),
the same caps, the decompression-ratio cap included (held against the sizes the tar headers
declare, before their data is inflated). Its manifest is translated into the current model
so a run sees one shape. It is cached like a sealed bundle, under the file's sha256, with
heddle.json and the file hashes kept in the snapshot, so a re-open proves the cached tree
the same way without inflating the file again.
"""

from __future__ import annotations

import base64
import hashlib
import os
import zlib
from pathlib import Path
from typing import IO, Any

from heddle.format.cache import Cache, VerifiedTree, reprove
from heddle.format.errors import (
    BundleError,
    BundleLimitError,
    MalformedBundleError,
    UnsignedBundleError,
    UnsupportedVersionError,
)
from heddle.format.limits import Limits
from heddle.format.manifest import (
    FileEntry,
    Manifest,
    MountEntry,
    PluginEntry,
    Proposals,
    Requires,
)
from heddle.format.members import load_member
from heddle.format.paths import PathSet, path_problem
from heddle.format.progress import Progress
from heddle.format.snapshot import Snapshot, SnapshotError, record
from heddle.format.staging import StagedFile, StagingTree
from heddle.format.tar import BLOCK, DIRECTORY, TarReader, describe_type, entry_span

LEGACY_MANIFEST = "heddle.json"
LEGACY_FORMAT = 1
_READ = 1 << 16


class _GzipSource:
    """One gzip member, inflated on demand, never past a cap, with nothing after it."""

    def __init__(self, fh: IO[bytes], *, what: str, max_out: int) -> None:
        self._fh = fh
        self._what = what
        self._max_out = max_out
        self._inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
        self._produced = 0

    def readinto(self, buffer: memoryview) -> int:
        while True:
            if self._inflater.eof:
                if self._inflater.unused_data or self._fh.read(1):
                    raise MalformedBundleError(f"{self._what} has bytes after its gzip stream")
                return 0
            data = self._inflater.unconsumed_tail or self._fh.read(_READ)
            if not data:
                raise MalformedBundleError(f"{self._what} is truncated (the gzip stream ends early)")
            try:
                out = self._inflater.decompress(data, len(buffer))
            except zlib.error as exc:
                raise MalformedBundleError(f"{self._what}: the gzip stream is corrupt ({exc})") from None
            if out:
                self._produced += len(out)
                if self._produced > self._max_out:
                    raise BundleLimitError(f"{self._what} inflates past the cap of {self._max_out} bytes")
                buffer[: len(out)] = out
                return len(out)


class _Hashing:
    def __init__(self, sink: StagedFile | None) -> None:
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def __call__(self, chunk: memoryview) -> None:
        self.sha.update(chunk)
        self.size += len(chunk)
        if self.sink is not None:
            self.sink.write(chunk)


def _walk(
    fh: IO[bytes],
    *,
    what: str,
    limits: Limits,
    tree: StagingTree | None,
    progress: Progress | None,
) -> tuple[bytes, list[FileEntry]]:
    cap = limits.max_total_bytes + limits.max_manifest_bytes + (limits.max_files + 4) * 1024
    compressed = os.fstat(fh.fileno()).st_size
    # The same ratio cap as a sealed bundle's: what the headers declare is held to it before
    # their data is inflated, and the inflater itself never produces more.
    allowed = min(cap, limits.max_expanded_bytes(compressed))
    reader = TarReader(_GzipSource(fh, what=what, max_out=allowed), what=what, strict=False)
    seen = PathSet()
    manifest: bytes | None = None
    files: list[FileEntry] = []
    total = 0
    while (entry := reader.next_header()) is not None:
        expanded = reader.offset + entry_span(entry.size) - BLOCK
        if expanded > allowed:
            raise BundleLimitError(
                f"{what} expands {compressed} bytes to at least {expanded}, over the cap of "
                f"{limits.max_ratio}:1 past {limits.ratio_floor_bytes} bytes (a decompression bomb?)"
            )
        name = entry.name.rstrip("/") if entry.typeflag == DIRECTORY else entry.name
        if entry.typeflag == DIRECTORY:
            problem = path_problem(name, max_depth=limits.max_depth) or seen.add_dir(name)
            if problem is not None:
                raise MalformedBundleError(f"{what}: entry {name!r}: {problem}")
            if entry.size:
                raise MalformedBundleError(f"{what}: directory entry {name!r} carries data")
            if tree is not None:
                tree.mkdir(name)
            continue
        if not entry.is_regular or entry.linkname:
            raise MalformedBundleError(
                f"{what}: entry {name!r} is {describe_type(entry.typeflag) if not entry.is_regular else 'a link'}; "
                "a bundle holds regular files only"
            )
        if name == LEGACY_MANIFEST:
            if manifest is not None:
                raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} appears twice")
            if entry.size > limits.max_manifest_bytes:
                raise BundleLimitError(
                    f"{what}: {LEGACY_MANIFEST} is over the cap of {limits.max_manifest_bytes} bytes"
                )
            manifest = reader.read_data(entry)
            continue
        problem = path_problem(name, max_depth=limits.max_depth) or seen.add_file(name)
        if problem is not None:
            raise MalformedBundleError(f"{what}: entry {name!r}: {problem}")
        total += entry.size
        if len(files) >= limits.max_files or entry.size > limits.max_file_bytes or total > limits.max_total_bytes:
            raise BundleLimitError(f"{what}: entry {name!r} takes the bundle over its caps on files or bytes")
        mode = 0o755 if entry.mode & 0o111 else 0o644
        staged = None
        if tree is not None:
            staged = StagedFile(tree, name, executable=mode == 0o755)
        hashing = _Hashing(staged)
        try:
            reader.copy_data(entry, hashing)
        except BaseException:
            if staged is not None:
                staged.abort()
            raise
        if staged is not None:
            staged.finish()
        if progress is not None:
            progress.advance(entry.size)
        files.append(FileEntry(name, hashing.size, hashing.sha.hexdigest(), mode))
    reader.expect_end(allow_zeros=True)
    if manifest is None:
        raise MalformedBundleError(f"{what}: there is no {LEGACY_MANIFEST}; this is not a heddle bundle")
    files.sort(key=lambda f: f.path.encode("utf-8"))
    return manifest, files


def _archive_path(value: Any, field: str, what: str, limits: Limits) -> str:
    problem = path_problem(value, max_depth=limits.max_depth)
    if problem is not None or not isinstance(value, str):
        raise MalformedBundleError(f"{what} {LEGACY_MANIFEST} {field} ({value!r}) {problem or 'is not a string'}")
    return value


def _requires(raw: Any, what: str) -> Requires:
    if raw is None:
        return Requires()
    bins: list[str] = []
    env: list[str] = []
    paths: list[str] = []
    if isinstance(raw, dict):
        bins = [b for b in raw.get("binaries", []) if isinstance(b, str)]
        env = [e for e in raw.get("env", []) if isinstance(e, str)]
    elif isinstance(raw, list):
        for item in raw:
            if not isinstance(item, dict):
                raise MalformedBundleError(f"{what} {LEGACY_MANIFEST} requires holds a non-object entry")
            binary = item.get("binary")
            if isinstance(binary, list) and binary and isinstance(binary[0], str):
                bins.append(binary[0])
            elif isinstance(binary, str):
                bins.append(binary)
            elif isinstance(item.get("env"), str):
                env.append(item["env"])
            elif isinstance(item.get("file"), str):
                paths.append(item["file"])
    return Requires(tuple(bins), tuple(env), tuple(paths))


def translate(raw_bytes: bytes, files: list[FileEntry], *, what: str, limits: Limits) -> tuple[Manifest, str | None]:
    """The format-1 manifest in the current model, and its tools folder (if any)."""
    raw = load_member(raw_bytes, what=f"{what}: {LEGACY_MANIFEST}")
    if not isinstance(raw, dict):
        raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} is not a JSON object")
    fmt = raw.get("format")
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} has no usable format number")
    if fmt > LEGACY_FORMAT:
        raise UnsupportedVersionError(
            f"{what}: {LEGACY_MANIFEST} is format {fmt}; this heddle reads gzip bundles up to format {LEGACY_FORMAT}"
        )
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} has no name")
    paths = {f.path for f in files}
    flow = _archive_path(raw.get("flow"), "flow", what, limits)
    if flow not in paths:
        raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} flow {flow!r} is not in the archive")
    tools = raw.get("tools")
    tools_dir = _archive_path(tools, "tools", what, limits) if tools is not None else None
    plugins = []
    for i, item in enumerate(raw.get("plugins") or []):
        manifest_path = _archive_path(item, f"plugins[{i}]", what, limits)
        if manifest_path not in paths:
            raise MalformedBundleError(
                f"{what}: {LEGACY_MANIFEST} plugins[{i}] {manifest_path!r} is not in the archive"
            )
        folder = manifest_path.rsplit("/", 1)[0] if "/" in manifest_path else ""
        plugins.append(PluginEntry(name=folder.rsplit("/", 1)[-1] or name, dir=folder, manifest=manifest_path))
    mounts = []
    for i, item in enumerate(raw.get("mounts") or []):
        if not isinstance(item, dict):
            raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} mounts[{i}] is not an object")
        prefix = _archive_path(item.get("path"), f"mounts[{i}].path", what, limits)
        dest = _archive_path(item.get("dest"), f"mounts[{i}].dest", what, limits)
        mode = item.get("mode", "ro")
        if mode not in ("ro", "rw"):
            raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} mounts[{i}] mode {mode!r} is not ro or rw")
        mounts.append(MountEntry(prefix=prefix, dest=dest, mode=mode))
    data_input = raw.get("input") or {}
    if not isinstance(data_input, dict):
        raise MalformedBundleError(f"{what}: {LEGACY_MANIFEST} input is not an object")
    rounds = raw.get("maxToolRounds")
    if isinstance(rounds, str) and rounds.strip().lower() in ("unlimited", "none", "inf"):
        proposals = Proposals("unlimited")
    elif isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1:
        proposals = Proposals(rounds)
    else:
        proposals = Proposals()
    manifest = Manifest(
        name=name,
        flow=flow,
        files=tuple(files),
        tools={},
        plugins=tuple(plugins),
        mounts=tuple(mounts),
        input=data_input,
        requires=_requires(raw.get("requires"), what),
        proposals=proposals,
        heddle_version=f"format {fmt}",
        version=0,
    )
    return manifest, tools_dir


def read_legacy_manifest(fh: IO[bytes], *, what: str, limits: Limits) -> Manifest:
    fh.seek(0)
    raw, files = _walk(fh, what=what, limits=limits, tree=None, progress=None)
    return translate(raw, files, what=what, limits=limits)[0]


def _file_digest(fh: IO[bytes]) -> str:
    fh.seek(0)
    digest = hashlib.sha256()
    while chunk := fh.read(1 << 20):
        digest.update(chunk)
    fh.seek(0)
    return digest.hexdigest()


def _remembered(raw: bytes, files: list[FileEntry]) -> dict[str, Any]:
    """What a re-open needs that format 1 does not sign: heddle.json and the file hashes."""
    return {"manifest": base64.b64encode(raw).decode("ascii"), "sha256": {f.path: f.sha256 for f in files}}


def _reopen(cache: Cache, key: str, *, what: str, limits: Limits, deep: bool) -> tuple[Manifest, str | None] | str:
    """The cached format-1 entry's manifest and tools folder once its tree is proved, or why not."""
    try:
        snap = cache.snapshot(key)
    except SnapshotError as exc:
        return str(exc)
    try:
        held = snap.legacy or {}
        raw = base64.b64decode(held["manifest"], validate=True)
        hashes = held["sha256"]
        files = [FileEntry(f.path, f.size, hashes[f.path], 0o755 if f.mode & 0o111 else 0o644)
                 for f in sorted(snap.files, key=lambda f: f.path.encode("utf-8"))]
        if not all(isinstance(h, str) for h in hashes.values()):
            raise TypeError("hash")
        manifest, tools_dir = translate(raw, files, what=what, limits=limits)
    except (KeyError, TypeError, ValueError, AttributeError, BundleError):
        return "the snapshot does not hold this format-1 bundle's manifest"
    problem = reprove(cache, key, manifest, deep=deep, snapshot=snap, exact_dirs=False)
    return problem if problem is not None else (manifest, tools_dir)


def open_legacy(
    fh: IO[bytes],
    path: Path,
    *,
    allow_unsigned: bool,
    cache: Cache,
    limits: Limits,
    progress: Progress | None,
    deep: bool = False,
) -> VerifiedTree:
    what = str(path)
    if not allow_unsigned:
        raise UnsignedBundleError(
            f"{what} is a format-1 gzip bundle, which carries no signature; repack it with `heddle bundle` "
            "or pass --allow-unsigned"
        )
    key = "legacy-" + _file_digest(fh)
    cache.open(create=True)
    repaired: str | None = None
    if cache.has(key):
        reopened = _reopen(cache, key, what=what, limits=limits, deep=deep)
        if not isinstance(reopened, str):
            cache.touch(key)
            return VerifiedTree(
                path=path, root=cache.payload(key), manifest=reopened[0], digest=key, signers=[], legacy=True,
                cached=True, legacy_tools_dir=reopened[1],
            )
        repaired = reopened
        cache.evict(key)
    staging = cache.new_staging()
    try:
        tree = StagingTree(staging.payload, what=what)
        try:
            if progress is not None:
                progress.start(0, f"opening {path.name}")
            raw, files = _walk(fh, what=what, limits=limits, tree=tree, progress=progress)
        finally:
            tree.close()
            if progress is not None:
                progress.finish()
        manifest, tools_dir = translate(raw, files, what=what, limits=limits)
        tree.seal()
        snapshot: Snapshot = record(staging.payload, key=key, name=manifest.name,
                                    legacy=_remembered(raw, files))
        cache.commit(staging, key, snapshot,
                     lambda: not isinstance(_reopen(cache, key, what=what, limits=limits, deep=False), str))
    except BaseException:
        staging.discard()
        raise
    cache.touch(key)
    return VerifiedTree(
        path=path, root=cache.payload(key), manifest=manifest, digest=key, signers=[], legacy=True,
        cached=False, legacy_tools_dir=tools_dir, repaired=repaired,
    )
