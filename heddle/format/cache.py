"""The cache of verified payloads: `<root>/<key>/payload/`, read-only, filled only by rename.

An entry is `<root>/<key>/` (0700) holding the sealed `payload/` tree (0555 folders, 0444 or
0555 files), its stat `snapshot` and a `used` stamp, and appears in one rename of a folder
that was complete. Its existence proves nothing: every open re-proves it against the
manifest (heddle.format.snapshot), and one that fails is evicted and verified again from
the bundle. Work in progress lives in `.staging-*` folders, each held by an flock on its
`lock` file, so one left by a killed verifier is told from a live one and removed.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from heddle.errors import UsageError
from heddle.format.manifest import Manifest, MountEntry
from heddle.format.private import check_private_dir, make_private_dir
from heddle.format.replaced import replaced
from heddle.format.snapshot import MAX_SNAPSHOT_BYTES, Snapshot, SnapshotError, prove

CACHE_DIR_ENV = "HEDDLE_CACHE_DIR"
STAGING_PREFIX = ".staging-"
EVICTED_PREFIX = ".evicted-"
PAYLOAD = "payload"
SNAPSHOT = "snapshot"
USED = "used"
LOCK = "lock"
# A staging folder with no lock file yet is being born; one this old without one was not.
STALE_SECONDS = 600
# Not even `prune --all` takes a lock-less staging folder younger than this: it may be a
# verifier between making the folder and locking it.
BIRTH_SECONDS = 60
KEY = re.compile(r"(legacy-)?[0-9a-f]{64}")
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def digest_text(key: str) -> str:
    """A bundle's digest as every report prints it: a format-1 key (`legacy-<hex>`) as it is, else `sha256:<hex>`."""
    return key if key.startswith(("sha256:", "legacy-")) else f"sha256:{key}"


def default_cache_root() -> Path:
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache) if cache else Path.home() / ".cache"
    return base / "heddle" / "bundles"


def remove_tree(path: Path) -> None:
    """Delete a tree this module made read-only, without following any link in it; a tree
    someone else is removing at the same time is not an error."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            os.unlink(path)
            return
    except FileNotFoundError:
        return
    for top, dirs, _files in os.walk(path, followlinks=False):
        try:
            os.chmod(top, 0o700)
            for name in dirs:
                child = os.path.join(top, name)
                if stat.S_ISDIR(os.lstat(child).st_mode):
                    os.chmod(child, 0o700)
        except FileNotFoundError:
            pass

    def gone(_func: object, _path: str, exc: BaseException) -> None:
        if not isinstance(exc, FileNotFoundError):
            raise exc

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=gone)
    else:
        shutil.rmtree(path, onerror=lambda func, where, info: gone(func, where, info[1]))


class Staging:
    """A private folder being filled: `payload` is the tree, `entry` what is renamed into place."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.entry = folder / "entry"
        self.payload = self.entry / PAYLOAD
        # Locked before it takes its name, so a sweeper never sees the lock file unheld.
        self._lock = os.open(folder / f"{LOCK}.new", os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
            os.rename(folder / f"{LOCK}.new", folder / LOCK)
            os.mkdir(self.entry, 0o700)
            os.mkdir(self.payload, 0o700)
        except BaseException:
            os.close(self._lock)
            raise

    def finish(self, snapshot: Snapshot) -> None:
        """Put the snapshot and the `used` stamp beside the sealed payload (never in it)."""
        for name, data in ((SNAPSHOT, snapshot.to_bytes()), (USED, b"")):
            # Read-only like the tree; `used` is stamped with utime, which owning it allows.
            fd = os.open(self.entry / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o400)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
            finally:
                os.close(fd)

    def discard(self) -> None:
        if self._lock < 0:
            return
        try:
            remove_tree(self.folder)
        finally:
            os.close(self._lock)
            self._lock = -1


@dataclass(frozen=True)
class EntryInfo:
    """One cache entry as `heddle cache ls` shows it; `problem` says why it would not be trusted."""

    key: str
    path: Path
    name: str
    size: int
    files: int
    last_used: float
    problem: str | None = None

    @property
    def legacy(self) -> bool:
        return self.key.startswith("legacy-")

    @property
    def digest(self) -> str:
        return digest_text(self.key)


@dataclass(frozen=True)
class Pruned:
    entries: list[EntryInfo]
    staging: int
    kept: int


class Cache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_root()
        self.setting = "--cache-dir" if root is not None else CACHE_DIR_ENV
        self._checked = False

    def open(self, *, create: bool = True) -> bool:
        """Check the root is ours alone (making it with `create`), and clear what dead
        verifiers left in it. False when it does not exist and was not to be made."""
        if self._checked:
            return True
        if not create and not os.path.lexists(self.root):
            return False
        make = make_private_dir if create else check_private_dir
        self.root = make(self.root, what="cache folder", setting=self.setting)
        self._checked = True
        self.sweep()
        return True

    def entry(self, key: str) -> Path:
        return self.root / key

    def payload(self, key: str) -> Path:
        return self.root / key / PAYLOAD

    def has(self, key: str) -> bool:
        """Whether an entry stands under `key` (proving nothing about it); a file or a link
        there is a setting error, never a tree to trust or to replace."""
        path = self.entry(key)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            return True
        kind = "a link" if stat.S_ISLNK(st.st_mode) else "a file"
        raise UsageError(f"cache entry {path} is {kind}, not a folder; remove it (`rm {path}`) "
                         f"or point {self.setting} at another folder")

    def snapshot(self, key: str) -> Snapshot:
        """The entry's snapshot, read without following links; SnapshotError if it is not its own."""
        path = self.entry(key) / SNAPSHOT
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
        except FileNotFoundError:
            raise SnapshotError("the entry has no snapshot") from None
        except OSError as exc:
            raise SnapshotError(f"the snapshot cannot be read ({exc.strerror})") from None
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise SnapshotError("the snapshot is not a regular file private to this user")
            data = fh.read(MAX_SNAPSHOT_BYTES + 1)
        if len(data) > MAX_SNAPSHOT_BYTES:
            raise SnapshotError("the snapshot is over its cap")
        return Snapshot.from_bytes(data, key)

    def entry_problem(self, key: str) -> str | None:
        """Why the entry's own folder is not one heddle made for itself, or None."""
        st = os.lstat(self.entry(key))
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return "the entry folder is not private to this user"
        return None

    def rewrite_snapshot(self, key: str, snapshot: Snapshot) -> None:
        """Replace the snapshot after a re-proof found the files the same but their stat moved, or
        proved them whole in a new boot of the machine."""
        folder = self.entry(key)
        with replaced(folder / SNAPSHOT, prefix=".snapshot-", mode=0o400) as fh:
            fh.write(snapshot.to_bytes())

    def touch(self, key: str) -> None:
        """Mark the entry used now; cheap, and never a reason to fail an open."""
        stamp = self.entry(key) / USED
        try:
            os.utime(stamp, follow_symlinks=False)
        except FileNotFoundError:
            try:
                os.close(os.open(stamp, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o400))
            except OSError:
                pass
        except OSError:
            pass

    def new_staging(self) -> Staging:
        self.open(create=True)
        folder = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))
        try:
            return Staging(folder)
        except BaseException:
            remove_tree(folder)
            raise

    def commit(self, staging: Staging, key: str, snapshot: Snapshot, accept_existing: Callable[[], bool]) -> None:
        """Rename a sealed staging entry, with its snapshot, into place in one step. An entry
        that already stands there (a racing verifier's) is kept only if `accept_existing`
        proves it; otherwise it is evicted and this one takes its place."""
        staging.finish(snapshot)
        target = self.entry(key)
        for _ in range(3):
            try:
                os.rename(staging.entry, target)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise
                self.has(key)  # a file or a link there is reported as such
                if accept_existing():
                    break
                self.evict(key)
                continue
            break
        else:
            raise UsageError(f"cache entry {target} keeps being replaced while heddle writes it; "
                             "is another program writing into the cache folder?")
        staging.discard()

    def evict(self, key: str) -> None:
        """Take the entry away in one rename, then remove it."""
        aside = Path(tempfile.mkdtemp(prefix=EVICTED_PREFIX, dir=self.root))
        try:
            os.rename(self.entry(key), aside / key)
        except FileNotFoundError:
            pass
        remove_tree(aside)

    def sweep(self, *, older_than: float = STALE_SECONDS) -> int:
        """Remove staging folders no live verifier holds, and evicted entries; how many."""
        removed = 0
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return 0
        for name in names:
            path = self.root / name
            if name.startswith(EVICTED_PREFIX):
                # Only once its evictor is surely done with it (it renames into it first).
                if _age(path) >= min(older_than, BIRTH_SECONDS):
                    remove_tree(path)
                    removed += 1
            elif name.startswith(STAGING_PREFIX) and _dead_staging(path, older_than):
                removed += 1
        return removed

    def entries(self) -> list[EntryInfo]:
        """Every entry, with what its snapshot says (or why it has none that holds)."""
        if not self.open(create=False):
            return []
        out: list[EntryInfo] = []
        for name in sorted(os.listdir(self.root)):
            if not KEY.fullmatch(name):
                continue
            path = self.entry(name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                out.append(EntryInfo(name, path, "", 0, 0, st.st_mtime, "is not a folder"))
                continue
            try:
                used = os.lstat(path / USED).st_mtime
            except FileNotFoundError:
                used = st.st_mtime
            try:
                snap = self.snapshot(name)
            except SnapshotError as exc:
                out.append(EntryInfo(name, path, "", 0, 0, used, str(exc)))
                continue
            out.append(EntryInfo(name, path, snap.name, snap.size, len(snap.paths), used))
        return out

    def prune(self, *, older_than: float | None) -> Pruned:
        """Remove entries unused for `older_than` seconds (all with None), every entry whose
        snapshot does not hold, and staging nobody holds."""
        if not self.open(create=False):
            return Pruned([], 0, 0)
        now = time.time()
        removed: list[EntryInfo] = []
        kept = 0
        staging = self.sweep(older_than=BIRTH_SECONDS if older_than is None else
                             max(BIRTH_SECONDS, min(older_than, STALE_SECONDS)))
        for info in self.entries():
            if older_than is None or info.problem is not None or now - info.last_used >= older_than:
                if stat.S_ISDIR(os.lstat(info.path).st_mode):
                    self.evict(info.key)
                else:
                    os.unlink(info.path)
                removed.append(info)
            else:
                kept += 1
        return Pruned(removed, staging, kept)


def _age(path: Path) -> float:
    try:
        return time.time() - os.lstat(path).st_mtime
    except FileNotFoundError:
        return -1.0


def _dead_staging(path: Path, older_than: float) -> bool:
    """Remove `path` if no live verifier holds its lock; whether it was removed."""
    try:
        fd = os.open(path / LOCK, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    except FileNotFoundError:
        if _age(path) < older_than:
            return False
        remove_tree(path)
        return True
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        remove_tree(path)
        return True
    finally:
        os.close(fd)


@dataclass(frozen=True)
class VerifiedTree:
    """What the format proved of a bundle: `root` is its read-only payload tree in the cache (heddle.bundle.verified
    reads a `Bundle` from it)."""

    path: Path
    root: Path
    manifest: Manifest
    digest: str
    signers: list[str]
    legacy: bool = False
    cached: bool = False
    legacy_tools_dir: str | None = field(default=None, repr=False)
    # Why a cached copy of this digest was not trusted (it was evicted and verified again).
    repaired: str | None = None
    # When the latest trusted signature was made (RFC 3339, UTC); None when no signature says.
    signed_at: str | None = None

    @property
    def flow_path(self) -> Path:
        return self.root / self.manifest.flow

    @property
    def tools_dir(self) -> Path:
        return self.root / (self.legacy_tools_dir or "tools")

    def tool_path(self, name: str) -> Path:
        return self.root / self.manifest.tools[name].entry

    def mount_source(self, mount: MountEntry) -> Path:
        return self.root / mount.prefix


def reprove(
    cache: Cache,
    key: str,
    manifest: Manifest,
    *,
    deep: bool = False,
    snapshot: Snapshot | None = None,
    exact_dirs: bool = True,
) -> str | None:
    """Why the cached entry under `key` is not (or no longer) what `manifest` seals, or None.

    Keeps a refreshed snapshot when every file matched but some stat had moved on (a copy,
    a chmod and back), or the entry was proved whole in a new boot, so the next open is fast again.
    """
    problem = cache.entry_problem(key)
    if problem is not None:
        return problem
    try:
        snap = snapshot if snapshot is not None else cache.snapshot(key)
    except SnapshotError as exc:
        return str(exc)
    if snap.name != manifest.name:
        return "the snapshot belongs to another bundle"
    proof = prove(cache.payload(key), snap, manifest, exact_dirs=exact_dirs, deep=deep)
    if proof.problem is None and proof.fresh is not None:
        try:
            cache.rewrite_snapshot(key, proof.fresh)
        except OSError:
            pass  # proved all the same; the next open re-hashes again
    return proof.problem
