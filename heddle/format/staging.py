"""Writing a verified tree: every file created fresh, relative to directory descriptors.

Files are created with O_CREAT|O_EXCL|O_NOFOLLOW under directories opened with
O_NOFOLLOW|O_DIRECTORY, so no entry can be written through a link, over another entry,
or anywhere outside the staging folder, whatever its name says.

A file is created with its sealed mode (0444 or 0555: the descriptor that creates it may
still write it) and its snapshot row is taken from that descriptor once written, so a
small file costs open, write, fstat and close, and the sealed tree need not be walked
again to be recorded. The staging folder is private (0700), so no one else sees a file
before it is whole.
"""

from __future__ import annotations

import errno
import os
import queue
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from heddle.format.errors import MalformedBundleError
from heddle.format.snapshot import FileStat

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
        # The stat of every file written, taken once it was whole: the snapshot's rows.
        self.rows: list[FileStat] = []

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

    def create(self, path: str, mode: int = 0o600) -> int:
        """A new, empty file at `path`, open for writing; refuses one that already exists."""
        folder, _, name = path.rpartition("/")
        if folder == self._current:
            parent = self._chain[-1][1]
        else:
            self._current = "\0"  # no path is this, so a failed _enter leaves no stale shortcut
            parent = self._enter(folder.split("/") if folder else [])
            self._current = folder
        try:
            return os.open(name, _FILE_FLAGS, mode, dir_fd=parent)
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
    """One file being written into a staging tree, read-only from the start. Given its `size`,
    it refuses to finish at any other (the verifier hashed the stream; this is what reached disk)."""

    def __init__(self, tree: StagingTree, path: str, executable: bool, size: int | None = None) -> None:
        self._mode = 0o555 if executable else 0o444
        self._fd = tree.create(path, self._mode)
        self._tree = tree
        self._path = path
        self._size = size

    def write(self, chunk: memoryview) -> None:
        while chunk:
            chunk = chunk[os.write(self._fd, chunk) :]

    def finish(self) -> None:
        try:
            st = os.fstat(self._fd)
            if self._size is not None and st.st_size != self._size:
                raise OSError(errno.EIO, f"{self._path!r} was written with {st.st_size} of its {self._size} bytes")
            if stat.S_IMODE(st.st_mode) != self._mode:  # the umask took bits the sealed mode has
                os.fchmod(self._fd, self._mode)
                st = os.fstat(self._fd)
            self._tree.rows.append(FileStat.of(self._path, st))
        finally:
            os.close(self._fd)

    def abort(self) -> None:
        os.close(self._fd)


_OPEN, _WRITE, _FINISH, _ABORT = range(4)
_Op = tuple[int, "QueuedFile", memoryview | None]
_Batch = tuple[list[_Op], bytearray | None, Callable[[bytearray], None] | None]


class QueuedFile:
    """A file the writer thread will create and write: what the verifier's sink is while the
    verifier itself goes on hashing. Each step joins the writer's batch of the moment (a file
    spans as many of the reader's buffers, so as many batches, as its bytes do)."""

    __slots__ = ("_writer", "executable", "path", "size", "staged")

    def __init__(self, writer: StagingWriter, path: str, executable: bool, size: int | None) -> None:
        self._writer = writer
        self.path = path
        self.executable = executable
        self.size = size
        self.staged: StagedFile | None = None
        writer.queue(_OPEN, self, None)

    def write(self, chunk: memoryview) -> None:
        self._writer.queue(_WRITE, self, chunk)

    def finish(self) -> None:
        self._writer.queue(_FINISH, self, None)

    def abort(self) -> None:
        self._writer.queue(_ABORT, self, None)


class StagingWriter:
    """Creates and writes the files of a staging tree on a thread of its own, in the order given.

    The verifier hands over each file's bytes as views into the tar reader's buffers and goes on
    hashing; a buffer goes back to be filled only once every write from it is done (`retire`, the
    reader's hook). The first failure stops the writing, and is raised by the next `file` or by
    `close`. A file is finished (sealed read-only and its stat row taken) only once the verifier
    has checked its hash and said so.
    """

    def __init__(self, tree: StagingTree) -> None:
        self._tree = tree
        self._ops: list[_Op] = []
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self.error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="heddle-write", daemon=True)
        self._thread.start()

    def file(self, path: str, executable: bool, size: int | None = None) -> QueuedFile:
        if self.error is not None:
            raise self.error
        return QueuedFile(self, path, executable, size)

    def queue(self, kind: int, item: QueuedFile, chunk: memoryview | None) -> None:
        self._ops.append((kind, item, chunk))

    def retire(self, buffer: bytearray, release: Callable[[bytearray], None]) -> None:
        """Hand over what was queued while `buffer` was being read; `release` it once written.
        The batch is the writer thread's from now on: nothing is added to it again."""
        self._queue.put((self._ops, buffer, release))
        self._ops = []

    def close(self) -> None:
        """Wait for every write handed over, then raise the first failure, if any."""
        self._queue.put((self._ops, None, None))
        self._ops = []
        self._queue.put(None)
        self._thread.join()
        if self.error is not None:
            raise self.error

    def abort(self) -> None:
        """Stop writing (what was handed over is dropped) and close what is open."""
        self._stop = True
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        open_files: set[QueuedFile] = set()
        while (batch := self._queue.get()) is not None:
            ops, buffer, release = batch
            if self.error is None and not self._stop:
                try:
                    self._apply(ops, open_files)
                except BaseException as exc:  # noqa: BLE001 - raised on the verifier's thread by file() or close()
                    self.error = exc
            if release is not None and buffer is not None:
                release(buffer)  # even after a failure, or the reader would wait for it forever
        for item in open_files:
            if item.staged is not None:
                item.staged.abort()

    def _apply(self, ops: list[_Op], open_files: set[QueuedFile]) -> None:
        for kind, item, chunk in ops:
            if kind == _WRITE:
                assert item.staged is not None and chunk is not None
                item.staged.write(chunk)
            elif kind == _OPEN:
                item.staged = StagedFile(self._tree, item.path, item.executable, item.size)
                open_files.add(item)
            else:
                open_files.discard(item)
                assert item.staged is not None
                if kind == _FINISH:
                    item.staged.finish()
                else:
                    item.staged.abort()
