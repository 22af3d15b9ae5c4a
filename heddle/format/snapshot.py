"""The stat snapshot of a cached payload tree, and the proof that re-opens it.

A cache entry is believed only as far as it can be re-proved on each open, without paying
a full re-hash of big mounts: the programs (every executable, every tool and plugin entry,
the files a plugin's command names), the flow and the plugin manifests are re-hashed every
time; every other file is compared with the stat snapshot recorded when the tree was
committed (type and mode, size, device, inode, mtime and ctime in nanoseconds) and
re-hashed only if anything differs. A file that was rewritten keeps none of (inode, ctime)
by accident: ctime moves on every write or chmod, and no user can set it back.

The snapshot sits beside the tree, never in it, as one file: a line with its format and a
sha256 binding it to the entry's key (the manifest digest), then its JSON body.

A stat says nothing of bytes a crash of the machine lost: the tree is written and renamed into
place without waiting for the disk (a sync per file would cost a big mount seconds), and after a
power loss a file may keep its size and times but read as zeros or stale blocks. So a snapshot names
the boot it was taken in (Linux's boot_id); an entry first opened in another boot is re-hashed
whole, and its snapshot recorded anew for this boot. While the machine stays up, the page cache is
what every reader sees, written to disk or not. A system that names no boot (not Linux) keeps the
stat proof across restarts.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import posixpath
import stat
from array import array
from binascii import a2b_base64, b2a_base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter
from typing import Any, NamedTuple

from heddle.format.manifest import Manifest

# 2: the files as columns (format 1, a row per file, is refused, so its entry is verified again).
FORMAT = 2
# Each stat column's array type: unsigned 64 bits, but the times, which may be before 1970.
_TYPECODES = ("Q", "Q", "Q", "Q", "q", "q")
MAGIC = b"heddle-snapshot"
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024
SEALED_DIR_MODE = stat.S_IFDIR | 0o555
_HASH_CHUNK = 1 << 20
# O_NONBLOCK: a FIFO planted where a file should be is refused, never waited on.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# Deeper than any bundle's paths go (32 components): a tree that does is not one heddle sealed.
_MAX_WALK_DEPTH = 64
BOOT_ID = "/proc/sys/kernel/random/boot_id"


@functools.cache
def current_boot() -> str:
    """This boot of the machine (a UUID the kernel draws at boot), or "" where the system names none."""
    try:
        with open(BOOT_ID, "rb") as fh:
            return fh.read(64).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return ""


class SnapshotError(Exception):
    """A snapshot that is missing, does not parse, or does not belong to its entry."""


class FileStat(NamedTuple):
    # A tuple, not a dataclass: a warm open builds and compares thousands of them.
    path: str
    mode: int  # st_mode: type and permission bits
    size: int
    dev: int
    ino: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: str, st: os.stat_result) -> FileStat:
        return cls(path, st.st_mode, st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)


# A FileStat from a row in its field order, built in C (the class's own constructor is Python).
_file_stat: Callable[[Iterable[Any]], FileStat] = functools.partial(tuple.__new__, FileStat)


class Snapshot:
    """The stat of a sealed tree. Its files are held as columns in path order, one per FileStat
    field: the paths a list, each stat field an array of 64-bit integers (in the file, the base64
    of its bytes, in this machine's order). A warm open decodes each column at once (a JSON
    number a field of a file was most of its reading) and compares whole columns with what a walk
    found, never a row per file. Made from rows (`files`) or read back with `from_bytes`;
    OverflowError from rows whose stat does not fit 64 bits (no tree heddle made)."""

    __slots__ = ("boot", "columns", "dirs", "key", "legacy", "name")

    def __init__(self, key: str, name: str, files: Iterable[FileStat], dirs: Iterable[str],
                 legacy: dict[str, Any] | None = None) -> None:
        rows = sorted(files)
        paths, *stats = zip(*rows, strict=True) if rows else [()] * len(FileStat._fields)
        columns = [list(paths), *map(array, _TYPECODES, stats)]
        # Taken now, of a tree written in this boot.
        self._fill(key, name, columns, tuple(dirs), legacy, current_boot())

    def _fill(self, key: str, name: str, columns: list[Any], dirs: tuple[str, ...],
              legacy: dict[str, Any] | None, boot: str) -> None:
        self.key = key
        self.name = name
        self.boot = boot
        # path, mode, size, dev, ino, mtime_ns, ctime_ns: FileStat's fields, each in path order.
        self.columns = columns
        self.dirs = dirs
        # Format 1 carries no signed manifest: its heddle.json and file hashes live here instead.
        self.legacy = legacy

    @property
    def paths(self) -> list[str]:
        paths: list[str] = self.columns[0]
        return paths

    @property
    def files(self) -> tuple[FileStat, ...]:
        return tuple(map(_file_stat, zip(*self.columns, strict=True)))

    @property
    def size(self) -> int:
        return sum(self.columns[2])

    def to_bytes(self) -> bytes:
        body: dict[str, Any] = {
            "format": FORMAT, "key": self.key, "name": self.name, "dirs": sorted(self.dirs), "boot": self.boot,
            "files": {"path": self.paths, **{field: b2a_base64(column.tobytes(), newline=False).decode("ascii")
                                             for field, column in zip(FileStat._fields[1:], self.columns[1:],
                                                                      strict=True)}},
        }
        if self.legacy is not None:
            body["legacy"] = self.legacy
        raw = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return b"%s %d %s\n%s" % (MAGIC, FORMAT, _seal(self.key, raw).encode("ascii"), raw)

    @classmethod
    def from_bytes(cls, data: bytes, key: str) -> Snapshot:
        line, sep, raw = data.partition(b"\n")
        parts = line.split(b" ")
        if not sep or len(parts) != 3 or parts[0] != MAGIC:
            raise SnapshotError("the snapshot is not a heddle snapshot")
        if parts[1] != str(FORMAT).encode():
            # An older heddle's rows: never trusted, so the entry is verified again and recorded anew.
            raise SnapshotError(f"the snapshot is format {parts[1].decode('ascii', 'replace')!r}, not {FORMAT}")
        if parts[2] != _seal(key, raw).encode("ascii"):
            raise SnapshotError("the snapshot's checksum does not match this entry (corrupt or not its own)")
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError):
            raise SnapshotError("the snapshot does not parse") from None
        try:
            return cls._from_body(body, key)
        except (KeyError, TypeError, ValueError):
            raise SnapshotError("the snapshot's fields are not what heddle writes") from None

    @classmethod
    def _from_body(cls, body: Any, key: str) -> Snapshot:
        if not isinstance(body, dict) or body["format"] != FORMAT or body["key"] != key:
            raise ValueError("not this entry's")
        files, dirs, name, legacy = body["files"], body["dirs"], body["name"], body.get("legacy")
        # One an earlier heddle wrote names no boot: proved whole once, as one of another boot.
        boot = body.get("boot", "")
        if type(files) is not dict or files.keys() != _COLUMN_NAMES or type(dirs) is not list or not isinstance(
                name, str) or type(boot) is not str:
            raise ValueError("bad fields")
        paths, encoded = files["path"], [files[field] for field in FileStat._fields[1:]]
        # Passes of C over the paths, and a whole stat column decoded at once: a warm open reads
        # thousands of files.
        if type(paths) is not list or not set(map(type, paths)) <= {str} or not set(map(type, encoded)) <= {str}:
            raise ValueError("bad columns")
        stats = [array(code) for code in _TYPECODES]
        for column, text in zip(stats, encoded, strict=True):
            column.frombytes(a2b_base64(text, strict_mode=True))  # ValueError (binascii.Error) if not whole
            if len(column) != len(paths):
                raise ValueError("columns of different lengths")
        columns = [paths, *stats]
        if not set(map(type, dirs)) <= {str}:
            raise ValueError("bad names")
        if legacy is not None and not isinstance(legacy, dict):
            raise ValueError("bad legacy")
        snapshot = cls.__new__(cls)
        snapshot._fill(key, name, columns, tuple(dirs), legacy, boot)
        return snapshot


_COLUMN_NAMES = frozenset(FileStat._fields)


def _seal(key: str, raw: bytes) -> str:
    return hashlib.sha256(MAGIC + b"\0" + key.encode("utf-8") + b"\0" + raw).hexdigest()


def sealed_mode(executable: bool) -> int:
    return stat.S_IFREG | (0o555 if executable else 0o444)


# The sealed st_mode of each manifest mode; and the columns `consistent` compares.
_SEALED_MODES = {0o644: sealed_mode(False), 0o755: sealed_mode(True)}
_ENTRY_PATH, _ENTRY_SIZE, _ENTRY_MODE = itemgetter(0), itemgetter(1), itemgetter(3)


def record(payload: str | os.PathLike[str], *, key: str, name: str, legacy: dict[str, Any] | None = None) -> Snapshot:
    """The snapshot of a sealed tree, taken once it is read-only and will not change again."""
    files: list[FileStat] = []
    dirs: list[str] = []
    for rel, st in _walk(os.fspath(payload)):
        if stat.S_ISDIR(st.st_mode):
            dirs.append(rel)
        else:
            files.append(FileStat.of(rel, st))
    return Snapshot(key, name, tuple(files), tuple(dirs), legacy)


def _walk(top: str, rel: str = "") -> Iterable[tuple[str, os.stat_result]]:
    """Every entry under `top`, links not followed, parents before children."""
    with os.scandir(top) as it:
        entries = list(it)
    for entry in entries:
        path = f"{rel}/{entry.name}" if rel else entry.name
        st = entry.stat(follow_symlinks=False)
        yield path, st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(entry.path, path)


def always_hashed(payload: str | os.PathLike[str], manifest: Manifest) -> frozenset[str]:
    """The files re-hashed on every open: what runs, and what says what runs."""
    paths = manifest.by_path
    out = {manifest.flow}
    if manifest.components is not None:
        out.add(manifest.components)  # part of the document: it can name the tools and models
    if manifest.commands is not None:
        out.add(manifest.commands.file)  # says which programs run, and with what
    files = manifest.files
    out.update(compress(map(_ENTRY_PATH, files), map((0o755).__eq__, map(_ENTRY_MODE, files))))  # the executables
    out.update(t.entry for t in manifest.tools.values())
    for plugin in manifest.plugins:
        out.add(plugin.manifest)
        named = _command_files(os.path.join(os.fspath(payload), plugin.manifest), plugin.dir, paths)
        if named is None:  # a manifest we cannot read for its command: its whole folder is code
            prefix = f"{plugin.dir}/" if plugin.dir else ""
            named = {p for p in paths if p.startswith(prefix)}
        out.update(named)
    return frozenset(p for p in out if p in paths)


def _command_files(manifest_path: str, folder: str, paths: dict[str, Any]) -> set[str] | None:
    """The files inside `folder` that a plugin manifest's `command` names (its program and
    the script an interpreter is given); None when the manifest cannot be read for them."""
    try:
        fd = os.open(manifest_path, _READ_FLAGS)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = json.loads(fh.read(MAX_SNAPSHOT_BYTES))
    except (OSError, ValueError, RecursionError):
        return None
    command = data.get("command") if isinstance(data, dict) else None
    if isinstance(command, str):
        command = [command]
    if not isinstance(command, list):
        return None
    out: set[str] = set()
    for arg in command:
        if isinstance(arg, str) and arg and not arg.startswith("/"):
            candidate = posixpath.normpath(posixpath.join(folder, arg)) if folder else posixpath.normpath(arg)
            if candidate in paths:
                out.add(candidate)
    return out


@dataclass
class Proof:
    """The outcome of re-proving a cached tree: `problem` is None when it is what was sealed;
    `fresh` is the snapshot to keep when files matched but their stat had moved on, or when the
    tree was proved whole in a boot other than its snapshot's."""

    problem: str | None
    fresh: Snapshot | None = None


def consistent(snapshot: Snapshot, manifest: Manifest, *, exact_dirs: bool) -> str | None:
    """Why `snapshot` cannot describe a tree of `manifest`, or None."""
    listed = manifest.by_path
    paths, modes, sizes = snapshot.columns[:3]
    if len(paths) != len(listed):
        return "the snapshot does not list this bundle's files"
    # Both are sorted by path as heddle writes them, so the rows line up with the files: path,
    # size and mode compared column by column, in C. Anything else is looked up row by row.
    files = manifest.files
    if (paths != list(map(_ENTRY_PATH, files)) or sizes.tolist() != list(map(_ENTRY_SIZE, files))
            or modes.tolist() != list(map(_SEALED_MODES.get, map(_ENTRY_MODE, files)))):
        sealed = (sealed_mode(False), sealed_mode(True))
        for path, mode, size in zip(paths, modes, sizes, strict=True):
            item = listed.get(path)
            if item is None or size != item.size or mode != sealed[item.mode == 0o755]:
                return f"the snapshot does not match the manifest at {path!r}"
    implied = manifest.dirs
    dirs = set(snapshot.dirs)
    if not implied <= dirs or (exact_dirs and dirs != implied):
        return "the snapshot does not list this bundle's folders"
    return None


def prove(
    payload: str | os.PathLike[str],
    snapshot: Snapshot,
    manifest: Manifest,
    *,
    exact_dirs: bool = True,
    deep: bool = False,
) -> Proof:
    """Re-prove the tree at `payload` against `manifest`, trusting `snapshot` only for stat.

    Every sealed program and manifest is re-hashed (and with `deep`, or when the snapshot was
    taken in another boot of the machine, every file); any other file whose stat differs from the
    snapshot is re-hashed; anything missing, extra, of another type or mode, or of other bytes is
    the problem reported.
    """
    problem = consistent(snapshot, manifest, exact_dirs=exact_dirs)
    if problem is not None:
        return Proof(problem)
    top = os.fspath(payload)
    try:
        fd = os.open(top, _DIR_FLAGS)
    except FileNotFoundError:
        return Proof("the payload folder is missing")
    except OSError:
        return Proof("the payload folder is not a folder of this user's")
    try:
        st = os.fstat(fd)
        if st.st_mode != SEALED_DIR_MODE or st.st_uid != os.geteuid():
            return Proof("the payload folder is not read-only and ours")
        rebooted = snapshot.boot != current_boot()
        hashed = frozenset(manifest.by_path) if deep or rebooted else always_hashed(top, manifest)
        walk = _ProofWalk(snapshot, manifest, hashed)
        try:
            problem = walk.folder(fd, "", 1)
        except FileNotFoundError:
            return Proof("a file vanished while it was being checked")
        except OSError as exc:
            return Proof(f"the payload could not be walked ({exc.strerror})")
    finally:
        os.close(fd)
    if problem is not None:
        return Proof(problem)
    if len(walk.seen_files) != len(manifest.by_path):
        missing = sorted(set(manifest.by_path) - {row[0] for row in walk.seen_files})
        return Proof(f"{missing[0]!r} is missing")
    if walk.seen_dirs != len(set(snapshot.dirs)):
        return Proof("a folder of the bundle is missing")
    if not walk.moved and not rebooted:
        return Proof(None)
    rows = tuple(FileStat._make(row) for row in walk.seen_files)
    try:
        return Proof(None, Snapshot(snapshot.key, snapshot.name, rows, snapshot.dirs, snapshot.legacy))
    except OverflowError:  # a time past what 64 bits of nanoseconds hold: proved, but nothing to keep
        return Proof(None)


class _ProofWalk:
    """The walk of a cached tree by `prove`: each folder read through its own descriptor
    (opened without following links), each entry stat-ed by name relative to it, so no path
    is resolved twice and no folder swapped for a link mid-walk can lead elsewhere."""

    def __init__(self, snapshot: Snapshot, manifest: Manifest, hashed: frozenset[str]) -> None:
        self.listed = manifest.by_path
        rows = snapshot.files
        self.recorded = dict(zip(snapshot.paths, rows, strict=True))
        self.dirs = frozenset(snapshot.dirs)
        self.hashed = hashed
        self.uid = os.geteuid()
        self.modes = (sealed_mode(False), sealed_mode(True))
        self.seen_files: list[tuple[str, int, int, int, int, int, int]] = []
        self.seen_dirs = 0
        self.moved = False

    def folder(self, fd: int, rel: str, depth: int) -> str | None:
        """The first problem in the folder open at `fd` (at `rel`), or None."""
        prefix = f"{rel}/" if rel else ""
        recorded, hashed, seen = self.recorded, self.hashed, self.seen_files
        # scandir on a descriptor stats each entry relative to it (fstatat, links not followed).
        with os.scandir(fd) as entries:
            for entry in entries:
                path = prefix + entry.name
                st = entry.stat(follow_symlinks=False)
                row = recorded.get(path)
                # `consistent` matched every row to the manifest (a listed path, its size, its
                # sealed mode): a file exactly as recorded, and not one re-hashed on every open,
                # passes every check below, so it is taken here in a few steps.
                if row is not None and path not in hashed:
                    now = (path, st.st_mode, st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
                    if now == row:
                        seen.append(now)
                        continue
                problem = self.entry(fd, entry.name, path, st, row, depth)
                if problem is not None:
                    return problem
        return None

    def entry(self, fd: int, name: str, path: str, st: os.stat_result, row: FileStat | None,
              depth: int) -> str | None:
        """The problem with one entry of the folder open at `fd`, or None."""
        mode = st.st_mode
        if stat.S_ISDIR(mode):
            if path not in self.dirs:
                return f"{path!r} is a folder the bundle does not have"
            if mode != SEALED_DIR_MODE or st.st_uid != self.uid:
                return f"folder {path!r} is no longer read-only"
            if depth >= _MAX_WALK_DEPTH:
                return f"folder {path!r} is deeper than a bundle's paths go"
            self.seen_dirs += 1
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                return self.folder(child, path, depth + 1)
            finally:
                os.close(child)
        item = self.listed.get(path)
        if item is None:
            return f"{path!r} is not in the manifest"
        if not stat.S_ISREG(mode):
            return f"{path!r} is not a regular file"
        if mode != self.modes[item.mode == 0o755]:
            return f"{path!r} changed mode"
        now = (path, mode, st.st_size, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        if now != row or path in self.hashed:
            if not _same_bytes(fd, name, item.size, item.sha256):
                return f"{path!r} changed content"
            self.moved = self.moved or now != row
        self.seen_files.append(now)
        return None


def _same_bytes(dir_fd: int, name: str, size: int, sha256: str) -> bool:
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return False
    digest = hashlib.sha256()
    total = 0
    with os.fdopen(fd, "rb", buffering=0) as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
            total += len(chunk)
            if total > size:
                return False
    return total == size and digest.hexdigest() == sha256
