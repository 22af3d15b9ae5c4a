"""Copying mount trees into a workspace and the changes of `rw` mounts back out.

Copy-in records what each `rw` file looked like on both sides, so that copy-back can tell
what the node created or changed (size and mode first, the content digest when those
agree) and whether the original moved on meanwhile (inode, size and both times).
Copy-back only ever writes: nothing the node deleted is deleted outside.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

Warn = Callable[[str], None]

_CHUNK = 1 << 20
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


@dataclass(frozen=True)
class FileState:
    # The workspace copy as the node received it.
    size: int
    mode: int
    digest: bytes
    # The original when it was copied: (inode, size, mtime_ns, ctime_ns), and its mode.
    origin: tuple[int, int, int, int]
    origin_mode: int


@dataclass
class Snapshot:
    """Files and folders of one `rw` mount as copied in, keyed by path relative to the mount."""

    files: dict[str, FileState] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sendfile(fd_in: int, fd_out: int) -> bool:
    """Copy inside the kernel where it can; False (nothing written) where it cannot."""
    if not hasattr(os, "sendfile") or not sys.platform.startswith("linux"):
        return False
    offset = 0
    while True:
        try:
            sent = os.sendfile(fd_out, fd_in, offset, _CHUNK)
        except OSError as exc:
            if offset == 0 and exc.errno in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
                return False
            raise
        if sent == 0:
            return True
        offset += sent


def _pump(fd_in: int, fd_out: int, size: int, digest: bool) -> bytes:
    if not digest and _sendfile(fd_in, fd_out):
        return b""
    h = hashlib.sha256() if digest else None
    # Sized to the file: a fresh megabyte buffer per small file costs more than the copy.
    step = max(4096, min(_CHUNK, size + 1))
    while chunk := os.read(fd_in, step):
        if h is not None:
            h.update(chunk)
        _write_all(fd_out, chunk)
    return h.digest() if h is not None else b""


def _file_mode(st: os.stat_result) -> int:
    # Private copies stay writable by their owner outside the sandbox, even when they come
    # from a read-only sealed cache; set-id bits never travel.
    return (stat.S_IMODE(st.st_mode) & 0o777) | 0o600


def _dir_mode(st: os.stat_result) -> int:
    return (stat.S_IMODE(st.st_mode) & 0o777) | 0o700


def copy_file(
    src: Path, dst: Path, *, mode: int | None = None, digest: bool = False
) -> tuple[os.stat_result, bytes]:
    """Copy one regular file to a new `dst`. Returns the source's stat and (optionally) digest.

    The source is opened without following symlinks and without blocking, so a file
    swapped for a link or a named pipe after the start-up checks is refused, not followed
    or waited on.
    """
    fd_in = os.open(src, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
    try:
        st = os.fstat(fd_in)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(src))
        fd_out = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o600)
        try:
            sha = _pump(fd_in, fd_out, st.st_size, digest)
            os.fchmod(fd_out, _file_mode(st) if mode is None else mode)
            os.utime(fd_out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)
    return st, sha


def _hash_file(path: Path) -> bytes:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
    try:
        step = max(4096, min(_CHUNK, os.fstat(fd).st_size + 1))
        while chunk := os.read(fd, step):
            h.update(chunk)
    finally:
        os.close(fd)
    return h.digest()


def _rel(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def copy_in(source: Path, target: Path, *, track: bool, warn: Warn, label: str) -> Snapshot:
    """Copy the file or folder `source` to the new path `target`.

    With `track`, the returned snapshot holds what copy-back needs; otherwise it is empty.
    Entries that are not regular files or folders appeared after the start-up checks;
    they are skipped with a warning rather than followed.
    """
    snap = Snapshot()
    top = os.stat(source)

    def one_file(src: Path, dst: Path, rel: str) -> None:
        st, sha = copy_file(src, dst, digest=track)
        if track:
            out = os.stat(dst)
            snap.files[rel] = FileState(
                size=out.st_size,
                mode=stat.S_IMODE(out.st_mode),
                digest=sha,
                origin=_identity(st),
                origin_mode=stat.S_IMODE(st.st_mode),
            )

    if not stat.S_ISDIR(top.st_mode):
        one_file(source, target, "")
        return snap

    os.mkdir(target, _dir_mode(top))
    if track:
        snap.dirs.add("")
    pending: list[tuple[Path, Path, str]] = [(source, target, "")]
    while pending:
        src_dir, dst_dir, rel_dir = pending.pop()
        with os.scandir(src_dir) as it:
            children = list(it)
        for child in children:
            src = Path(child.path)
            dst = dst_dir / child.name
            rel = _rel(rel_dir, child.name)
            st = child.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(dst, _dir_mode(st))
                if track:
                    snap.dirs.add(rel)
                pending.append((src, dst, rel))
            elif stat.S_ISREG(st.st_mode):
                one_file(src, dst, rel)
            else:
                warn(f"mount {label}: skipped {src}: it is no longer a regular file or folder")
    return snap


class _CopyBack:
    def __init__(self, snap: Snapshot, original: Path, warn: Warn, node: str) -> None:
        self.snap = snap
        self.original = original
        self.warn = warn
        self.node = node

    def _changed(self, rel: str, path: Path, st: os.stat_result) -> bool:
        before = self.snap.files.get(rel)
        if before is None:
            return True
        if (st.st_size, stat.S_IMODE(st.st_mode)) != (before.size, before.mode):
            return True
        # Same size: only the content can tell. The time is no help either way: a tool may
        # rewrite a file unchanged, or change it within one clock tick of the copy.
        return _hash_file(path) != before.digest

    def file(self, rel: str, path: Path, st: os.stat_result) -> None:
        if not self._changed(rel, path, st):
            return
        dest = self.original / rel if rel else self.original
        before = self.snap.files.get(rel)
        try:
            now = os.lstat(dest)
        except FileNotFoundError:
            now = None
        except OSError as exc:
            self.warn(f"could not copy back {dest}: {exc.strerror}; the original is unchanged")
            return
        expected = before.origin if before is not None else None
        current = _identity(now) if now is not None else None
        if current != expected:
            self.warn(
                f"{dest} changed outside the run while node {self.node!r} was running; "
                "kept the run's version"
            )
        if now is not None and not stat.S_ISREG(now.st_mode):
            self.warn(
                f"could not copy back {dest}: it is no longer a regular file; left it as it is"
            )
            return
        if before is not None and stat.S_IMODE(st.st_mode) == before.mode:
            mode = stat.S_IMODE(now.st_mode) if now is not None else before.origin_mode
        else:
            mode = stat.S_IMODE(st.st_mode) & 0o777
        try:
            self._replace(path, dest, mode)
        except OSError as exc:
            self.warn(f"could not copy back {dest}: {exc.strerror}; the original is unchanged")

    @staticmethod
    def _replace(src: Path, dest: Path, mode: int) -> None:
        # Written beside the destination and renamed over it, so the original is either
        # the old file or the whole new one, never a torn mix.
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd_out, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".heddle-", suffix=".part")
        try:
            try:
                fd_in = os.open(src, os.O_RDONLY | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK)
                try:
                    st = os.fstat(fd_in)
                    _pump(fd_in, fd_out, st.st_size, False)
                finally:
                    os.close(fd_in)
                os.fchmod(fd_out, mode)
                os.utime(fd_out, ns=(st.st_atime_ns, st.st_mtime_ns))
                os.fsync(fd_out)
            finally:
                os.close(fd_out)
            os.replace(tmp, dest)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise

    def folder(self, rel: str) -> bool:
        """Make sure the folder exists outside; False when its subtree cannot be copied back."""
        dest = self.original / rel if rel else self.original
        if rel in self.snap.dirs and os.path.isdir(dest) and not os.path.islink(dest):
            return True
        try:
            st = os.lstat(dest)
        except FileNotFoundError:
            try:
                os.makedirs(dest, exist_ok=True)
            except OSError as exc:
                self.warn(
                    f"could not copy back into {dest}: {exc.strerror}; "
                    "files under it were not copied back"
                )
                return False
            return True
        if stat.S_ISDIR(st.st_mode):
            return True
        self.warn(
            f"could not copy back into {dest}: it is no longer a folder; "
            "files under it were not copied back"
        )
        return False

    def skip(self, path: Path, st: os.stat_result) -> None:
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
        self.warn(f"did not copy back {path}: it is {what}")


def copy_back(snap: Snapshot, copy: Path, original: Path, *, warn: Warn, node: str) -> None:
    """Bring files the node created or changed in `copy` back to `original`. Never deletes.

    Every failure is a warning: copy-back runs while a node's own error may be on its way
    out, and that error is the one to report.
    """
    job = _CopyBack(snap, original, warn, node)
    try:
        top = os.lstat(copy)
    except FileNotFoundError:
        return
    if stat.S_ISREG(top.st_mode):
        if not snap.dirs:
            job.file("", copy, top)
        else:
            warn(f"did not copy back {copy}: the mounted folder was replaced by a file")
        return
    if not stat.S_ISDIR(top.st_mode):
        job.skip(copy, top)
        return
    if "" not in snap.dirs:
        warn(f"did not copy back {copy}: the mounted file was replaced by a folder")
        return
    pending: list[tuple[Path, str]] = [(copy, "")]
    while pending:
        folder, rel_dir = pending.pop()
        if not job.folder(rel_dir):
            continue
        try:
            with os.scandir(folder) as it:
                children = list(it)
        except OSError as exc:
            warn(f"could not copy back {folder}: {exc.strerror}")
            continue
        for child in children:
            path = Path(child.path)
            rel = _rel(rel_dir, child.name)
            try:
                st = child.stat(follow_symlinks=False)
            except OSError as exc:
                warn(f"could not copy back {path}: {exc.strerror}")
                continue
            if stat.S_ISDIR(st.st_mode):
                pending.append((path, rel))
            elif stat.S_ISREG(st.st_mode):
                job.file(rel, path, st)
            else:
                job.skip(path, st)


def remove_tree(path: Path) -> None:
    """Remove a workspace, including folders a tool left without write or search permission."""
    try:
        shutil.rmtree(path)
        return
    except FileNotFoundError:
        return
    except PermissionError:
        pass
    pending = [path]
    while pending:
        folder = pending.pop()
        try:
            os.chmod(folder, 0o700)
            with os.scandir(folder) as it:
                pending.extend(Path(c.path) for c in it if c.is_dir(follow_symlinks=False))
        except OSError:
            continue
    shutil.rmtree(path)
