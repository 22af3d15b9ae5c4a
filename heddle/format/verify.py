"""Opening a bundle: prove it is what a trusted key sealed, then hand back the sealed tree.

One pass over one file descriptor, in this order, and nothing is written before trust is
decided: the frame layout; the manifest and signature entries; the trust decision; the
manifest's own rules and caps; then the payload streamed into a private staging folder,
each file hashed as it is written; then the tree is sealed read-only, its stat snapshot
taken, and both renamed into the cache under the digest.

A digest already in the cache skips the payload only once the cached tree is proved again
(heddle.format.snapshot: programs and manifests re-hashed, every other file checked against
its stat snapshot); one that fails is evicted and the payload is verified from this file as
if the cache were cold. Its signatures are always checked against the trust of this call,
and `prove_file` (what `heddle verify` asks for) reads and checks this file's payload too.
"""

from __future__ import annotations

import gc
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from heddle.errors import UsageError
from heddle.format.archive import (
    Head,
    check_entry,
    check_ratio,
    payload_name,
    read_head,
)
from heddle.format.cache import Cache, Staging, VerifiedTree, reprove
from heddle.format.errors import ContentMismatchError, MalformedBundleError
from heddle.format.frame import GZIP_MAGIC
from heddle.format.keys import PublicKey
from heddle.format.legacy import open_legacy, read_legacy_manifest
from heddle.format.limits import DEFAULT_LIMITS, Limits
from heddle.format.manifest import FileEntry, Manifest
from heddle.format.progress import Progress
from heddle.format.signing import Signatures, check_signatures
from heddle.format.snapshot import Snapshot
from heddle.format.staging import StagingTree, StagingWriter
from heddle.format.tar import Retire, TarHeader, TarReader
from heddle.safeparse import NotRegularFileError, open_regular

# (sealed flow path, manifest) -> {tool name: input-schema fingerprint}
ToolFingerprints = Callable[[Path, Manifest], Mapping[str, str]]


@dataclass(frozen=True)
class Peek:
    """A bundle's manifest and signatures, checked for shape only: no trust, no payload."""

    manifest: Manifest
    signatures: Signatures
    manifest_bytes: bytes
    legacy: bool

    @property
    def digest(self) -> str | None:
        return None if self.legacy else hashlib.sha256(self.manifest_bytes).hexdigest()


@contextmanager
def collector_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a manifest and a snapshot are read and
    checked: they make tens of thousands of small containers, none in a cycle, and every
    collection in between walks those still alive (a tenth of a warm open, measured).
    Reference counting frees them all the same, and the collector is left as it was found
    (another thread's pause included: only the one that turned it off turns it back on)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def sealed_manifest(head: Head, *, what: str, limits: Limits) -> Manifest:
    """The manifest of a head whose trust is decided (or not needed), with its caps checked."""
    manifest = Manifest.from_bytes(head.manifest_bytes, limits=limits, what=f"{what} manifest")
    check_ratio(manifest, head, what=what, limits=limits)
    return manifest


def peek(path: Path, *, limits: Limits = DEFAULT_LIMITS) -> Peek:
    """Read a bundle's manifest and signatures without deciding trust or touching the payload."""
    path = Path(path)
    what = str(path)
    with open_file(path) as fh:
        if fh.read(2) == GZIP_MAGIC:
            return Peek(read_legacy_manifest(fh, what=what, limits=limits), Signatures(), b"", True)
        head = read_head(fh, what=what, limits=limits)
        signatures = Signatures.from_bytes(head.signatures_bytes, limits=limits, what=f"{what} signatures")
        return Peek(sealed_manifest(head, what=what, limits=limits), signatures, head.manifest_bytes, False)


def open_file(path: Path) -> BinaryIO:
    """The one descriptor a bundle is read through. A path that is not there is a usage error;
    a folder, FIFO or device is not a bundle, and is refused from its stat, so a FIFO never
    blocks the verifier."""
    try:
        return os.fdopen(open_regular(path), "rb", buffering=0)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file; give the path of a .heddle bundle") from None
    except NotRegularFileError as exc:
        raise MalformedBundleError(f"{path}: not a heddle bundle (it is {exc.kind})") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot be read: {exc.strerror}") from None


def verify_bundle(
    path: Path,
    *,
    trusted_keys: Iterable[PublicKey],
    allow_unsigned: bool = False,
    cache_root: Path | None = None,
    deep: bool = False,
    prove_file: bool = False,
    progress: Progress | None = None,
    limits: Limits = DEFAULT_LIMITS,
    tool_fingerprints: ToolFingerprints | None = None,
) -> VerifiedTree:
    """Verify the bundle at `path` and return its sealed tree, or raise the outcome.

    `tool_fingerprints` maps a flow file to {tool name: input-schema fingerprint}; when
    given, the fingerprints recomputed from the sealed flow must equal the manifest's.
    `deep` re-hashes every file of a cached tree; `prove_file` checks this file's own
    payload even when its digest is cached.
    """
    path = Path(path)
    what = str(path)
    cache = Cache(cache_root)
    with open_file(path) as fh:
        if fh.read(2) == GZIP_MAGIC:
            return open_legacy(
                fh, path, allow_unsigned=allow_unsigned, cache=cache, limits=limits, progress=progress, deep=deep
            )
        head = read_head(fh, what=what, limits=limits)
        signatures = Signatures.from_bytes(head.signatures_bytes, limits=limits, what=f"{what} signatures")
        signed = check_signatures(
            head.manifest_bytes, signatures, trusted_keys, allow_unsigned=allow_unsigned, what=what
        )
        with collector_paused():
            manifest = sealed_manifest(head, what=what, limits=limits)
            digest = hashlib.sha256(head.manifest_bytes).hexdigest()
            cache.open(create=True)
            cached, repaired = False, None
            if cache.has(digest):
                repaired = reprove(cache, digest, manifest, deep=deep)
                cached = repaired is None
        if repaired is not None:  # the cached tree did not hold: verified again from this file
            cache.evict(digest)
        if cached:
            if prove_file:
                walk_payload(head.reader, manifest, lambda _item: _DISCARD, what=what, progress=progress,
                             mtime=head.mtime)
        else:
            _fill(cache, digest, manifest, head.reader, what=what, progress=progress,
                  tool_fingerprints=tool_fingerprints, mtime=head.mtime)
    opened = VerifiedTree(path, cache.payload(digest), manifest, digest, signed.signers, cached=cached,
                          repaired=repaired, signed_at=signed.signed_at)
    if cached and tool_fingerprints is not None:
        check_tools(opened.root, manifest, tool_fingerprints, what=what)
    cache.touch(digest)
    return opened


class _Discard:
    """Where a payload already in the cache goes when only the file is being proved."""

    def write(self, chunk: memoryview) -> None:
        pass

    def finish(self) -> None:
        pass

    def abort(self) -> None:
        pass


_DISCARD = _Discard()


def _fill(
    cache: Cache,
    digest: str,
    manifest: Manifest,
    reader: TarReader,
    *,
    what: str,
    progress: Progress | None,
    tool_fingerprints: ToolFingerprints | None,
    mtime: int,
) -> None:
    staging: Staging = cache.new_staging()
    try:
        tree = StagingTree(staging.payload, what=what)
        # Three threads: the reader's decompresses, this one checks entries and hashes, the
        # writer's creates and writes the files.
        writer = StagingWriter(tree)
        try:
            walk_payload(reader, manifest, lambda item: writer.file(item.path, item.executable, item.size),
                         what=what, progress=progress, retire=writer.retire, mtime=mtime)
            writer.close()
            if len(tree.rows) != len(manifest.files):
                raise OSError(f"{what}: {len(tree.rows)} of its {len(manifest.files)} files were written")
        except BaseException:
            writer.abort()
            raise
        finally:
            tree.close()
        if tool_fingerprints is not None:
            check_tools(staging.payload, manifest, tool_fingerprints, what=what)
        tree.seal()
        # The rows were taken from each file's descriptor once it was whole (heddle.format.staging):
        # what a walk of the sealed tree would find, without a second stat of every file.
        snapshot = Snapshot(digest, manifest.name, tuple(tree.rows), tuple(tree.dirs))
        cache.commit(staging, digest, snapshot, lambda: reprove(cache, digest, manifest) is None)
    except BaseException:
        staging.discard()
        raise


class FileSink(Protocol):
    def write(self, chunk: memoryview) -> None: ...

    def finish(self) -> None: ...

    def abort(self) -> None: ...


def walk_payload(
    reader: TarReader,
    manifest: Manifest,
    begin: Callable[[FileEntry], FileSink],
    *,
    what: str,
    progress: Progress | None = None,
    retire: Retire | None = None,
    mtime: int | None = None,
) -> None:
    """Check each payload entry against the manifest, in order, feeding its bytes to a sink
    from `begin` while hashing them; then check nothing follows but the end of the tar.
    `mtime` is the archive's own (its manifest entry's): a header written exactly as a packer
    writes it with that mtime is taken without a parse (TarReader.next_header).

    The stream is decompressed ahead on a thread meanwhile (the trust decision and the
    manifest's checks are behind us: nothing of the payload is read before them). A sink that
    keeps the views it is fed past its `write` gives `retire` (TarReader.reading_ahead).
    """
    expected = {payload_name(f.path): i for i, f in enumerate(manifest.files)}
    if progress is not None:
        progress.start(manifest.total_size, f"verifying {Path(what).name}")
    try:
        with reader.reading_ahead(retire):
            _walk_entries(reader, manifest, begin, expected, what=what, progress=progress, mtime=mtime)
    finally:
        if progress is not None:
            progress.finish()


def _walk_entries(
    reader: TarReader,
    manifest: Manifest,
    begin: Callable[[FileEntry], FileSink],
    expected: Mapping[str, int],
    *,
    what: str,
    progress: Progress | None,
    mtime: int | None,
) -> None:
    for index, item in enumerate(manifest.files):
        want = payload_name(item.path)
        entry = reader.next_header(None if mtime is None else (want, item.size, item.mode, mtime))
        if entry is None:
            raise MalformedBundleError(f"{what}: entry {want!r} is missing (the archive ends before it)")
        check_entry(entry, what)
        if entry.name != want:
            found = expected.get(entry.name)
            if found is None:
                raise MalformedBundleError(f"{what}: entry {entry.name!r} is not listed in the manifest")
            if found < index:
                raise MalformedBundleError(f"{what}: entry {entry.name!r} appears twice or out of manifest order")
            raise MalformedBundleError(
                f"{what}: expected entry {want!r} but found {entry.name!r}: "
                "an entry is missing or out of manifest order"
            )
        if entry.size != item.size:
            raise ContentMismatchError(
                f"{what}: {item.path!r} is {entry.size} bytes in the archive but {item.size} in the manifest"
            )
        if entry.mode != item.mode:
            raise ContentMismatchError(
                f"{what}: {item.path!r} has mode {entry.mode:o} in the archive but {item.mode:o} in the manifest"
            )
        _copy_checked(reader, entry, item, begin(item), what=what, progress=progress)
    trailing = reader.next_header()
    if trailing is not None:
        raise MalformedBundleError(f"{what}: entry {trailing.name!r} is not listed in the manifest")
    reader.expect_end()


def _copy_checked(
    reader: TarReader, entry: TarHeader, item: FileEntry, sink: FileSink, *, what: str, progress: Progress | None
) -> None:
    digest = hashlib.sha256()

    def feed(chunk: memoryview) -> None:
        digest.update(chunk)
        sink.write(chunk)
        if progress is not None:
            progress.advance(len(chunk))

    try:
        reader.copy_data(entry, feed)
        if digest.hexdigest() != item.sha256:
            raise ContentMismatchError(
                f"{what}: {item.path!r} does not match its sha256 in the manifest (tampered or corrupt)"
            )
    except BaseException:
        sink.abort()
        raise
    sink.finish()


def check_tools(root: Path, manifest: Manifest, tool_fingerprints: ToolFingerprints, *, what: str) -> None:
    """The tools the sealed flow names, with their input schemas, are exactly the sealed ones."""
    found = dict(tool_fingerprints(root / manifest.flow, manifest))
    for name, tool in sorted(manifest.tools.items()):
        actual = found.pop(name, None)
        if actual is None:
            raise ContentMismatchError(f"{what}: tool {name!r} is in the manifest but the sealed flow does not name it")
        if actual != tool.fingerprint:
            raise ContentMismatchError(
                f"{what}: tool {name!r} input-schema fingerprint is {actual} in the sealed flow "
                f"but {tool.fingerprint} in the manifest"
            )
    if found:
        name = min(found)
        raise ContentMismatchError(f"{what}: the sealed flow names tool {name!r}, which the manifest does not carry")
