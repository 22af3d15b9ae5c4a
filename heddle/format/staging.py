"""Writing a verified tree: every file created fresh, relative to directory descriptors.

Files are created with O_CREAT|O_EXCL|O_NOFOLLOW under directories opened with
O_NOFOLLOW|O_DIRECTORY, so no entry can be written through a link, over another entry,
or anywhere outside the staging folder, whatever its name says.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from heddle.format.errors import MalformedBundleError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class StagingTree:
    """A private directory being filled. Keeps descriptors only for the current directory chain."""

    def __init__(self, root: Path, *, what: str) -> None:
        self.root = root
        self._what = what
        self._chain: list[tuple[str, int]] = [("", os.open(root, _DIR_FLAGS))]
        self._current = ""
        self.dirs: list[str] = []

    def _enter(self, parts: list[str]) -> int:
        depth = 0
        while depth < min(len(parts), len(self._chain) - 1) and self._chain[depth + 1][0] == parts[depth]:
            depth += 1
        for _, fd in self._chain[depth + 1 :]:
            os.close(fd)
        del self._chain[depth + 1 :]
        for name in parts[depth:]:
            parent = self._chain[-1][1]
            try:
                os.mkdir(name, 0o700, dir_fd=parent)
                self.dirs.append("/".join([p for p, _ in self._chain[1:]] + [name]))
            except FileExistsError:
                pass
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    raise MalformedBundleError(f"{self._what}: {name!r} is both a file and a directory") from None
                raise
            self._chain.append((name, fd))
        return self._chain[-1][1]

    def mkdir(self, path: str) -> None:
        self._current = "\0"
        self._enter(path.split("/"))
        self._current = path

    def create(self, path: str) -> int:
        """A new, empty file at `path`, open for writing; refuses one that already exists."""
        folder, _, name = path.rpartition("/")
        if folder == self._current:
            parent = self._chain[-1][1]
        else:
            self._current = "\0"  # no path is this, so a failed _enter leaves no stale shortcut
            parent = self._enter(folder.split("/") if folder else [])
            self._current = folder
        try:
            return os.open(name, _FILE_FLAGS, 0o600, dir_fd=parent)
        except FileExistsError:
            raise MalformedBundleError(f"{self._what}: entry {path!r} appears twice") from None
        except OSError as exc:
            if exc.errno in (errno.EISDIR, errno.ELOOP):
                raise MalformedBundleError(f"{self._what}: {path!r} is both a file and a directory") from None
            raise

    def seal(self) -> None:
        """Make every directory read-only, deepest first (files are sealed as they close)."""
        self.close()
        for rel in sorted(self.dirs, key=lambda d: d.count("/"), reverse=True):
            fd = os.open(self.root / rel, _DIR_FLAGS)
            try:
                os.fchmod(fd, 0o555)
            finally:
                os.close(fd)
        os.chmod(self.root, 0o555)

    def close(self) -> None:
        for _, fd in self._chain:
            os.close(fd)
        self._chain = []


class StagedFile:
    """One file being written into a staging tree; read-only once complete."""

    def __init__(self, tree: StagingTree, path: str, executable: bool) -> None:
        self._fd = tree.create(path)
        self._mode = 0o555 if executable else 0o444

    def write(self, chunk: memoryview) -> None:
        while chunk:
            chunk = chunk[os.write(self._fd, chunk) :]

    def finish(self) -> None:
        try:
            os.fchmod(self._fd, self._mode)
        finally:
            os.close(self._fd)

    def abort(self) -> None:
        os.close(self._fd)
