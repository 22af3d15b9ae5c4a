"""Sealing: writing a bundle archive deterministically and atomically, and re-signing one.

The same plan gives the same bytes: files in UTF-8 byte order, modes reduced to 0644 or
0755, owners 0, one mtime for every entry (SOURCE_DATE_EPOCH or 0), a fixed compression
level (zstd's worker threads give the same bytes however many there are). The archive is
written to a temporary file beside OUT and renamed over it only once complete, so OUT is
either the old file, the new one, or absent; never half of one.

The manifest, which holds every hash, is the archive's first entry, and the frame's content
checksum runs over the manifest and then the payload, so no payload byte can be compressed
before every file is hashed. Small files are kept from the hashing read (up to a fixed budget,
so memory stays flat for any tree) and written from it: most files of a big tree are read once,
and what is written is what was hashed. A bigger file is read again to be written, mostly from
the page cache, and refused if it changed in between. The hashing pass runs bigger files on several
threads, batches of small ones on the caller's (heddle's work a small file holds the interpreter lock).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import stat
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple, Protocol

from heddle import canonical
from heddle.errors import UsageError
from heddle.format.archive import (
    MANIFEST_ENTRY,
    META_MODE,
    SIGNATURES_ENTRY,
    ArchiveWriter,
    compression_threads,
    payload_name,
    read_head,
    tar_size,
)
from heddle.format.errors import PackError
from heddle.format.keys import SigningKey
from heddle.format.limits import DEFAULT_LIMITS, ZSTD_LEVEL, ZSTD_MAX_LEVEL, ZSTD_MIN_LEVEL, Limits
from heddle.format.manifest import (
    CommandsEntry,
    FileEntry,
    Manifest,
    MountEntry,
    PluginEntry,
    Proposals,
    Requires,
    ToolEntry,
)
from heddle.format.progress import Progress
from heddle.format.replaced import check_replaceable, replaced, umasked
from heddle.format.signing import Signatures, now_stamp, sign
from heddle.format.tar import MAX_SIZE
from heddle.format.verify import open_file, sealed_manifest, walk_payload
from heddle.version import __version__

if TYPE_CHECKING:
    from concurrent.futures import Future

_CHUNK = 1 << 20
# What one hashing task takes on: enough that handing it to a thread costs little beside it.
_BATCH_BYTES = 4 << 20
_BATCH_FILES = 256
# Files up to this size are kept from the hashing read, while the kept bytes stay within the budget.
_KEEP_FILE = 64 << 10
_KEEP_BUDGET = 32 << 20
# A batch whose files average this much is hashed on the pool's threads; a smaller one on the caller's.
_SHARED_FILE = 16 << 10
_local = threading.local()


class PlanFile(NamedTuple):
    """One file to seal: where it goes under `payload/`, where it comes from, its mode, and
    its size when the walk that found it saw one (a hint for the progress bar and for sharing
    the hashing out; what is sealed is what the hashing pass reads). A tuple, not a dataclass:
    a walk makes one for each of many files."""

    path: str
    source: str | os.PathLike[str]  # a string from a walk: a Path for each of many files is dear
    mode: int = 0o644
    size: int | None = None


class Screen(Protocol):
    """A look at each file's first bytes, taken from the hashing read (no file is opened for it),
    and a verdict on the files it flagged, given before any byte of the bundle is written."""

    def flags(self, head: memoryview | bytes) -> bool:
        """Whether the file whose first read brought `head` (the whole of a small file, the first MiB of
        a bigger one) is one to judge; called on the hashing threads, for every file but an empty one."""
        ...

    def judge(self, flagged: Sequence[PlanFile]) -> None:
        """Refuse (raise) what `flagged` holds, or let the packing go on."""
        ...


@dataclass
class PackPlan:
    """Everything a bundle will hold, decided before any byte is read."""

    name: str
    flow: str
    files: list[PlanFile]
    tools: Mapping[str, ToolEntry] = field(default_factory=dict)
    plugins: Sequence[PluginEntry] = ()
    mounts: Sequence[MountEntry] = ()
    input: Mapping[str, Any] = field(default_factory=dict)
    requires: Requires = field(default_factory=Requires)
    proposals: Proposals = field(default_factory=Proposals)
    skipped: list[Path] = field(default_factory=list)
    components: str | None = None  # the payload path of the flow's components file, if it has one
    commands: CommandsEntry | None = None  # the commands file's payload path and its commands, if it has one
    release: int | None = None  # the release number sealed in the manifest (`--release N`), if given
    egress: Mapping[str, tuple[str, ...]] | None = None  # the hosts each component may reach, if declared
    secrets: Mapping[str, Mapping[str, Any]] | None = None  # the secrets the tools use unseen, if declared
    screen: Screen | None = None  # judges the files by their first bytes before anything is written


@dataclass(frozen=True)
class PackResult:
    path: Path
    digest: str
    size: int
    payload_size: int
    file_count: int
    signer: str | None
    skipped: list[Path]
    manifest: Manifest


def resolve_source_date_epoch(explicit: int | None = None) -> int:
    if explicit is not None:
        return explicit
    raw = os.environ.get("SOURCE_DATE_EPOCH")
    if raw is None or raw == "":
        return 0
    if not raw.isdigit():
        raise UsageError(f"SOURCE_DATE_EPOCH={raw!r} is not a whole number of seconds; fix or unset it")
    if int(raw) > MAX_SIZE:
        raise UsageError(f"SOURCE_DATE_EPOCH={raw!r} is past what a tar header holds ({MAX_SIZE}); fix or unset it")
    return int(raw)


@contextlib.contextmanager
def atomic_output(out: Path, *, mode: int | None = None, what: str = "-o") -> Iterator[IO[bytes]]:
    """A temporary file beside `out`, renamed onto it only if the block completes; `what` names `out`
    in a refusal (a bundle signed in place is no `-o`)."""
    out = Path(out)
    check_replaceable(out, what=what)
    if not out.parent.is_dir():
        raise PackError(f"{what} {out}: the folder {out.parent} does not exist")
    with replaced(out, prefix=f".{out.name}.", suffix=".tmp", mode=umasked(0o644) if mode is None else mode,
                  what=what) as fh:
        yield fh


def _identity(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _open_source(item: PlanFile) -> tuple[int, os.stat_result]:
    try:
        fd = os.open(item.source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise PackError(f"{item.source}: cannot be read for {item.path!r}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise PackError(f"{item.source}: is not a regular file; a bundle carries regular files only")
    return fd, st


def _size(item: PlanFile) -> int:
    try:
        return os.lstat(item.source).st_size
    except OSError as exc:
        raise PackError(f"{item.source}: cannot be read for {item.path!r}: {exc.strerror}") from None


def _buffer() -> memoryview:
    """This thread's read buffer."""
    view: memoryview | None = getattr(_local, "buffer", None)
    if view is None:
        view = _local.buffer = memoryview(bytearray(_CHUNK))
    return view


def _chunks(fd: int, size: int, item: PlanFile, buffer: memoryview) -> Iterator[memoryview]:
    """The file's `size` bytes through `buffer`, each view valid until the next one.

    Each read asks for one byte more than is left, so the end of the file is found by the
    read that brings its last bytes (a small file is one read), and a file that grew is seen.
    """
    left = size
    while True:
        want = min(left + 1, len(buffer))
        n = os.readv(fd, [buffer[:want]])
        if n > left:
            break
        if n:
            left -= n
            yield buffer[:n]
        if n == 0 or (left == 0 and n < want):
            if not left:
                return
            break
    raise PackError(f"{item.source} changed size while it was being packed; pack again")


# A file's manifest entry, the identity it had when hashed (none when its bytes were kept), its bytes
# when they were kept, and whether the screen flagged it.
Hashed = tuple[FileEntry, tuple[int, ...], bytes | None, bool]


class _Budget:
    """What is left of the bytes the hashing threads may keep."""

    def __init__(self, size: int) -> None:
        self._left = size
        self._lock = threading.Lock()

    def take(self, size: int) -> bool:
        with self._lock:
            if size > self._left:
                return False
            self._left -= size
            return True

    def grant(self, size: int) -> int:
        """Up to `size` bytes at once (a batch's small files: one lock a batch, not one a file)."""
        with self._lock:
            granted = min(size, self._left)
            self._left -= granted
            return granted

    def give_back(self, size: int) -> None:
        with self._lock:
            self._left += size


# A FileEntry from its fields, made in C (the class's own constructor is Python): one a file.
_entry: Callable[[tuple[str, int, str, int]], FileEntry] = functools.partial(tuple.__new__, FileEntry)


def _hash_batch(items: Sequence[PlanFile], small: int, budget: _Budget, screen: Screen | None) -> list[Hashed]:
    """The rows of `items`, whose small files (by the walk's sizes) hold `small` bytes."""
    out: list[Hashed] = []
    append = out.append
    flags = screen.flags if screen is not None else None
    sha256, read, close, keep = hashlib.sha256, os.read, os.close, _KEEP_FILE  # looked up once a batch
    allowance = budget.grant(small)
    try:
        for item in items:
            fd, st = _open_source(item)
            size = st.st_size
            try:
                if size <= keep and (size <= allowance or budget.take(size - allowance)):
                    allowance = allowance - size if size <= allowance else 0
                    # A small file in one read (one byte more, to see one that grew), hashed and kept as it is.
                    data = read(fd, size + 1)
                    if len(data) != size:
                        raise PackError(f"{item.source} changed size while it was being packed; pack again")
                    # No identity: what is written is these bytes, not the file again.
                    append((_entry((item.path, size, sha256(data).hexdigest(), item.mode)), (), data,
                            flags is not None and size > 0 and flags(data)))
                    continue
                digest = sha256()
                flagged = False
                first = flags is not None
                for chunk in _chunks(fd, size, item, _buffer()):
                    if first and flags is not None:
                        flagged, first = flags(chunk), False
                    digest.update(chunk)
            finally:
                close(fd)
            append((_entry((item.path, size, digest.hexdigest(), item.mode)), _identity(st), None, flagged))
    finally:
        budget.give_back(allowance)
    return out


def _batches(files: Sequence[PlanFile], sizes: Sequence[int]) -> Iterator[tuple[list[PlanFile], int, int]]:
    """The files in batches, each with its bytes and those of its small files."""
    batch: list[PlanFile] = []
    size = small = 0
    for item, item_size in zip(files, sizes, strict=True):
        batch.append(item)
        size += item_size
        if item_size <= _KEEP_FILE:
            small += item_size
        if size >= _BATCH_BYTES or len(batch) >= _BATCH_FILES:
            yield batch, size, small
            batch, size, small = [], 0, 0
    if batch:
        yield batch, size, small


def _hash_files(
    files: Sequence[PlanFile], sizes: Sequence[int], progress: Progress | None, threads: int,
    screen: Screen | None = None,
) -> list[Hashed]:
    """Every file's manifest entry and identity, in order, hashed on up to `threads` threads.

    A batch of small files is hashed on this thread: each of its files is mostly Python's work and
    system calls under the interpreter's lock, which threads would only pass to and fro (more CPU
    and more time, measured). A batch of bigger files goes to the pool, where sha256 lets the lock go.
    """
    out: list[Hashed] = []
    budget = _Budget(_KEEP_BUDGET)

    def done(rows: list[Hashed]) -> None:
        out.extend(rows)
        if progress is not None:
            progress.advance(sum(row[0].size for row in rows))

    batches = _batches(files, sizes)
    if threads <= 1 or sum(sizes) < _SHARED_FILE * len(sizes):
        for batch, _, small in batches:
            done(_hash_batch(batch, small, budget, screen))
        return out
    from concurrent.futures import ThreadPoolExecutor  # only a tree of big files needs threads

    pending: deque[Future[list[Hashed]] | list[Hashed]] = deque()
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="heddle-hash") as pool:
        try:
            for batch, size, small in batches:
                if size >= _SHARED_FILE * len(batch):
                    pending.append(pool.submit(_hash_batch, batch, small, budget, screen))
                else:  # hashed here while the pool works on the batches before it
                    pending.append(_hash_batch(batch, small, budget, screen))
                while pending and (len(pending) > 2 * threads  # a bounded window: memory stays flat
                                   or isinstance(pending[0], list) or pending[0].done()):
                    first = pending.popleft()
                    done(first if isinstance(first, list) else first.result())
            while pending:
                first = pending.popleft()
                done(first if isinstance(first, list) else first.result())
        except BaseException:
            for future in pending:
                if not isinstance(future, list):
                    future.cancel()
            raise
    return out


def _as_signing_keys(signing_key: SigningKey | Sequence[SigningKey] | None) -> list[SigningKey]:
    if signing_key is None:
        return []
    if isinstance(signing_key, SigningKey):
        return [signing_key]
    return list(signing_key)


def build_manifest(plan: PackPlan, entries: Sequence[FileEntry], *, limits: Limits,
                   what: str) -> tuple[Manifest, bytes]:
    """The manifest of `plan` holding `entries`, checked as a verifier reads one, and its canonical bytes."""
    manifest = Manifest(
        name=plan.name,
        flow=plan.flow,
        files=tuple(entries),
        tools=dict(plan.tools),
        plugins=tuple(plan.plugins),
        mounts=tuple(plan.mounts),
        input=dict(plan.input),
        requires=plan.requires,
        proposals=plan.proposals,
        heddle_version=__version__,
        components=plan.components,
        commands=plan.commands,
        release=plan.release,
        egress=plan.egress,
        secrets=plan.secrets,
    )
    doc = manifest.to_json()
    try:
        # Every member but the files, whose types the reading below checks column by column.
        canonical.dumps({**doc, "files": []})
    except canonical.CanonicalJSONError as exc:
        raise PackError(f"{what}: the manifest cannot hold {exc} (pass numbers as integers or strings)") from None
    # Read back what would be written, so a bundle this heddle makes is one it can open.
    checked = Manifest.from_json(doc, limits=limits, what=what, error=PackError)
    if checked != manifest:  # what is written is what was read back
        doc = checked.to_json()
    return checked, canonical.dumps(doc, strict=False)


def pack(
    plan: PackPlan,
    out: Path,
    *,
    signing_key: SigningKey | Sequence[SigningKey] | None = None,
    source_date_epoch: int | None = None,
    progress: Progress | None = None,
    limits: Limits = DEFAULT_LIMITS,
    level: int = ZSTD_LEVEL,
    threads: int | None = None,
    signed_at: str | None = None,
) -> PackResult:
    """Seal `plan` into the bundle `out`. Checks everything first; nothing is at `out` on failure.

    Each signature carries the time it was made (`signed_at`, RFC 3339 UTC; now when None): it
    lives in the signatures, not the manifest, so the manifest and payload bytes depend on the
    inputs alone.

    `level` is the zstd level (1 to 22); `threads` the threads that hash and compress (None:
    this machine's CPUs, capped). The bytes depend on the level, never on the threads.
    """
    out = Path(out)
    what = f"bundle {out.name}"
    check_replaceable(Path(out), what="-o")  # before the files are hashed: nothing to undo
    if type(level) is not int:
        raise UsageError(f"level {level!r}: must be a whole number")
    if not ZSTD_MIN_LEVEL <= level <= ZSTD_MAX_LEVEL:
        raise UsageError(f"level {level}: must be at {'most' if level > ZSTD_MAX_LEVEL else 'least'} "
                         f"{ZSTD_MAX_LEVEL if level > ZSTD_MAX_LEVEL else ZSTD_MIN_LEVEL}")
    workers = compression_threads() if threads is None else threads
    mtime = resolve_source_date_epoch(source_date_epoch)
    files = sorted(plan.files, key=lambda f: f.path.encode("utf-8"))
    for a, b in pairwise(files):
        if a.path == b.path:
            raise PackError(f"{what}: {a.source} and {b.source} would both be stored at {a.path!r}")
    sizes = [f.size if f.size is not None else _size(f) for f in files]
    total = sum(sizes)
    # Two passes over the same bytes (hash, then write), each its own bar counting `total`.
    if progress is not None:
        progress.start(total, f"hashing {out.name}")
    try:
        hashed = _hash_files(files, sizes, progress, workers, plan.screen)
        if plan.screen is not None:
            plan.screen.judge([item for item, row in zip(files, hashed, strict=True) if row[3]])
        if progress is not None:
            progress.finish()
            progress.start(total, f"packing {out.name}")
        manifest, manifest_bytes = build_manifest(plan, [row[0] for row in hashed], limits=limits, what=what)
        at = signed_at if signed_at is not None else now_stamp()
        signatures = Signatures(tuple(sign(manifest_bytes, k, signed_at=at) for k in _as_signing_keys(signing_key)))
        signatures_bytes = signatures.to_bytes()
        with atomic_output(out) as fh:
            writer = ArchiveWriter(fh, total=tar_size(manifest, len(manifest_bytes), len(signatures_bytes)),
                                   level=level, threads=workers)
            writer.add(MANIFEST_ENTRY, manifest_bytes, META_MODE, mtime)
            writer.add(SIGNATURES_ENTRY, signatures_bytes, META_MODE, mtime)
            buffer = _buffer()
            add = writer.add
            for item, (entry, identity, kept, _) in zip(files, hashed, strict=True):
                if kept is not None:  # the bytes that were hashed: nothing to read again
                    add(payload_name(entry.path), kept, entry.mode, mtime)
                    if progress is not None:
                        progress.advance(len(kept))
                    continue
                fd, st = _open_source(item)
                try:
                    if _identity(st) != identity:
                        raise PackError(f"{item.source} changed while it was being packed; pack again")
                    writer.begin(payload_name(entry.path), entry.size, entry.mode, mtime)
                    for chunk in _chunks(fd, entry.size, item, buffer):
                        writer.write(chunk)
                        if progress is not None:
                            progress.advance(len(chunk))
                    writer.end()
                finally:
                    os.close(fd)
            writer.close()
            size = fh.tell()
    finally:
        if progress is not None:
            progress.finish()
    return PackResult(
        path=out,
        digest=hashlib.sha256(manifest_bytes).hexdigest(),
        size=size,
        payload_size=manifest.total_size,
        file_count=len(manifest.files),
        signer=", ".join(s.keyid for s in signatures.signatures) or None,
        skipped=list(plan.skipped),
        manifest=manifest,
    )


class _ArchiveSink:
    def __init__(self, writer: ArchiveWriter, entry: FileEntry, mtime: int) -> None:
        self._writer = writer
        writer.begin(payload_name(entry.path), entry.size, entry.mode, mtime)

    def write(self, chunk: memoryview) -> None:
        self._writer.write(chunk)

    def finish(self) -> None:
        self._writer.end()

    def abort(self) -> None:
        pass


def add_signature(path: Path, key: SigningKey, *, limits: Limits = DEFAULT_LIMITS) -> tuple[str, Signatures]:
    """Sign the bundle at `path` with `key`, rewriting it atomically; the digest is unchanged.

    The payload is checked against the manifest while it is copied, so a key never signs
    a bundle whose bytes do not match what it signs. Other signatures are kept; an earlier
    one by the same key is replaced.
    """
    path = Path(path)
    what = str(path)
    with open_file(path) as src:
        head = read_head(src, what=what, limits=limits)
        signatures = Signatures.from_bytes(head.signatures_bytes, limits=limits, what=f"{what} signatures")
        manifest = sealed_manifest(head, what=what, limits=limits)
        signatures = signatures.with_signature(sign(head.manifest_bytes, key))
        signatures_bytes = signatures.to_bytes()
        mode = os.fstat(src.fileno()).st_mode & 0o777
        with atomic_output(path, mode=mode, what="bundle") as fh:
            writer = ArchiveWriter(fh, total=tar_size(manifest, len(head.manifest_bytes), len(signatures_bytes)))
            writer.add(MANIFEST_ENTRY, head.manifest_bytes, META_MODE, head.mtime)
            writer.add(SIGNATURES_ENTRY, signatures_bytes, META_MODE, head.mtime)
            walk_payload(head.reader, manifest, lambda item: _ArchiveSink(writer, item, head.mtime), what=what)
            writer.close()
    return hashlib.sha256(head.manifest_bytes).hexdigest(), signatures
