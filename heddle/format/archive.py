"""A bundle archive's layout: one zstd frame holding a ustar stream whose first two entries
are the manifest and the signatures, then one `payload/<path>` entry per manifest file.

This module reads the head of an archive (the part trust is decided from) and writes whole
archives; what happens to payload bytes is up to the caller.
"""

from __future__ import annotations

import itertools
import operator
import os
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from heddle.format.errors import BundleLimitError, MalformedBundleError
from heddle.format.frame import FrameInfo, walk_frame
from heddle.format.limits import ZSTD_LEVEL, Limits
from heddle.format.manifest import MODES, PAYLOAD, Manifest
from heddle.format.tar import (
    BLOCK,
    END_OF_ARCHIVE,
    TarHeader,
    TarReader,
    describe_type,
    entry_span,
    header,
    padding,
)

MANIFEST_ENTRY = ".heddle/manifest.json"
SIGNATURES_ENTRY = ".heddle/signatures.json"
META_MODE = 0o644
# More threads than this cost memory (below) and gain little: hashing and reading files do not
# keep more busy.
MAX_THREADS = 8
# zstd hands each worker a job of the stream, with an input and an output buffer of its size that
# incompressible data fills. Its own choice, four windows (8 MiB at level 3), costs some 40 MiB a
# worker; one window but at least 2 MiB costs 6 to 8 MiB a worker (measured: 29 MiB for 2 workers,
# 63 MiB for 8), for about 0.7% more bytes at level 3. It is a function of the level and the stream
# size alone, so the bytes still do not depend on the machine.
_MIN_JOB = 2 << 20
_GATHER = 1 << 16
_ZEROS = bytes(512)

if TYPE_CHECKING:
    from zstandard import ZstdDecompressionReader


class _ZstdSource:
    """The decompressed stream, with decoder failures reported as a malformed bundle."""

    def __init__(self, stream: ZstdDecompressionReader, what: str) -> None:
        self._stream = stream
        self._what = what

    def readinto(self, buffer: memoryview) -> int:
        import zstandard

        try:
            return self._stream.readinto(buffer)
        except zstandard.ZstdError as exc:
            raise MalformedBundleError(f"{self._what}: the zstd frame is corrupt ({exc})") from None


@dataclass
class Head:
    manifest_bytes: bytes
    signatures_bytes: bytes
    frame: FrameInfo
    reader: TarReader
    mtime: int


def check_entry(entry: TarHeader, what: str) -> None:
    """What every entry of a bundle is: a regular file, owned by 0, mode 0644 or 0755."""
    if not entry.is_regular:
        raise MalformedBundleError(
            f"{what}: entry {entry.name!r} is {describe_type(entry.typeflag)}; a bundle holds regular files only"
        )
    if entry.linkname:
        raise MalformedBundleError(f"{what}: entry {entry.name!r} names a link target; a bundle holds no links")
    if entry.uid or entry.gid:
        raise MalformedBundleError(f"{what}: entry {entry.name!r} is not owned by uid/gid 0")
    if entry.mode not in MODES:
        raise MalformedBundleError(f"{what}: entry {entry.name!r} has mode {entry.mode:o}; a bundle uses 644 or 755")


def _read_meta(reader: TarReader, name: str, cap: int, position: str, what: str) -> tuple[bytes, int]:
    entry = reader.next_header()
    if entry is None:
        raise MalformedBundleError(f"{what}: the archive ends before {name}")
    if entry.name != name:
        raise MalformedBundleError(
            f"{what}: the {position} entry is {entry.name!r}; "
            f"a bundle starts with {MANIFEST_ENTRY} then {SIGNATURES_ENTRY}"
        )
    check_entry(entry, what)
    if entry.size > cap:
        raise BundleLimitError(f"{what}: {name} is {entry.size} bytes, over the cap of {cap}")
    return reader.read_data(entry), entry.mtime


def read_head(fh: IO[bytes], *, what: str, limits: Limits) -> Head:
    """Check the frame, then read the manifest and signature entries, and nothing more."""
    import zstandard

    fd = fh.fileno()
    frame = walk_frame(fd, os.fstat(fd).st_size, what=what, limits=limits)
    fh.seek(0)
    stream = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=False, closefd=False)
    reader = TarReader(_ZstdSource(stream, what), what=what)
    manifest_bytes, mtime = _read_meta(reader, MANIFEST_ENTRY, limits.max_manifest_bytes, "first", what)
    signatures_bytes, _ = _read_meta(reader, SIGNATURES_ENTRY, limits.max_signatures_bytes, "second", what)
    return Head(manifest_bytes, signatures_bytes, frame, reader, mtime)


def tar_size(manifest: Manifest, manifest_len: int, signatures_len: int) -> int:
    """The exact length of the tar stream such a manifest describes."""
    size = entry_span(manifest_len) + entry_span(signatures_len) + len(END_OF_ARCHIVE)
    # The sum of entry_span over the files, each term a pass of C: a header each, the data, the padding.
    sizes = [f.size for f in manifest.files]
    paddings: int = sum(map(operator.mod, map(operator.neg, sizes), itertools.repeat(BLOCK)))
    return size + BLOCK * len(sizes) + sum(sizes) + paddings


def check_ratio(manifest: Manifest, head: Head, *, what: str, limits: Limits) -> None:
    """Refuse, before inflating the payload, an archive that expands past the ratio cap.

    Both the size the frame declares and the size the manifest describes are held to it;
    neither is trusted to match the other (the decoder enforces the first, the entry-by-entry
    checks the second).
    """
    expanded = max(head.frame.content_size, tar_size(manifest, len(head.manifest_bytes), len(head.signatures_bytes)))
    allowed = limits.max_expanded_bytes(head.frame.file_size)
    if expanded > allowed:
        raise BundleLimitError(
            f"{what} expands {head.frame.file_size} bytes to {expanded}, over the cap of "
            f"{limits.max_ratio}:1 past {limits.ratio_floor_bytes} bytes (a decompression bomb?)"
        )


def compression_threads() -> int:
    """The zstd worker threads a pack uses here: the CPUs this process may run on, capped."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_THREADS))


class ArchiveWriter:
    """Writes one bundle archive: a single zstd frame with its size and checksum declared.

    Compression runs on zstd's worker threads, over jobs whose size the level and the stream's
    size decide (_MIN_JOB), so the output is the same for one worker or many, but not the same
    as with none (zstd's single-threaded mode): `threads` is never 0, so the bytes never depend
    on the machine's core count.
    """

    def __init__(self, fh: IO[bytes], *, total: int, level: int = ZSTD_LEVEL, threads: int | None = None) -> None:
        import zstandard

        workers = compression_threads() if threads is None else threads
        if workers < 1:
            raise ValueError("a bundle is compressed by one zstd worker thread or more")
        window = zstandard.ZstdCompressionParameters.from_level(level, source_size=total).window_log
        params = zstandard.ZstdCompressionParameters.from_level(
            level, source_size=total, threads=workers, job_size=max(_MIN_JOB, 1 << window),
            write_checksum=True, write_content_size=True,
        )
        self._out = zstandard.ZstdCompressor(compression_params=params).stream_writer(fh, size=total, closefd=False)
        self._left = 0
        self._pad = 0
        # Headers, paddings and small files are gathered into one write to the compressor (its
        # output does not depend on how the input is cut into writes).
        self._pending = bytearray()

    def _put(self, data: bytes | memoryview) -> None:
        self._pending += data
        if len(self._pending) >= _GATHER:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self._out.write(self._pending)  # the compressor has copied it once this returns
            self._pending.clear()

    def begin(self, name: str, size: int, mode: int, mtime: int) -> None:
        self._put(header(name, size, mode, mtime))
        self._left = size
        self._pad = padding(size)

    def write(self, data: bytes | memoryview) -> None:
        if len(data) > self._left:
            raise ValueError("more data than the entry's size")
        if len(data) >= _GATHER:
            self._flush()
            self._out.write(data)
        else:
            self._put(data)
        self._left -= len(data)

    def end(self) -> None:
        if self._left:
            raise ValueError("less data than the entry's size")
        self._put(_ZEROS[: self._pad])

    def add(self, name: str, data: bytes, mode: int, mtime: int) -> None:
        size = len(data)
        if size >= _GATHER:
            self.begin(name, size, mode, mtime)
            self.write(data)
            self.end()
            return
        # A small entry whole, gathered in one step: packing writes one a small file.
        pending = self._pending
        pending += header(name, size, mode, mtime)
        pending += data
        pending += _ZEROS[: padding(size)]
        if len(pending) >= _GATHER:
            self._flush()

    def close(self) -> None:
        self._put(END_OF_ARCHIVE)
        self._flush()
        # ends the frame; closefd=False leaves the file to the caller. zstandard's stubs leave close() unannotated
        self._out.close()  # type: ignore[no-untyped-call]


def payload_name(path: str) -> str:
    return PAYLOAD + path
