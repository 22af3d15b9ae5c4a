"""The file session store: one readable file per session in a folder.

    <dir>/<id>.json   {"id": ..., "version": N, "updated": SECONDS, "record": <the record, verbatim>}
    <dir>/<id>.lock   empty; held with flock while the session is written

Every write goes to a temporary file in the same folder and is renamed over the session's file, so
a reader sees the old record or the new one, never half of either. The compare-and-swap (read the
version, write the next) happens under an exclusive flock on the session's lock file, so several
processes on one machine (on a local file system) share the folder safely. Files are opened
relative to the folder's descriptor and never through a link: a link or a device planted in the
folder is refused, not followed.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from heddle.blocking import STORE_READS, STORE_WRITES, run_blocking
from heddle.errors import SessionError, StoreUnavailable
from heddle.safeparse import file_kind
from heddle.sessions.private import FILE_MODE, data_home, make_private_dirs
from heddle.sessions.steps import Steps, step_taken
from heddle.sessions.store import (
    MAX_SESSION_BYTES,
    Index,
    Stored,
    check_session_id,
    check_size,
    conflict,
    exists,
    not_found,
)

SUFFIX = ".json"
LOCK_SUFFIX = ".lock"
STEPS_SUFFIX = ".steps"
_STEP_LINE = re.compile(rb"([1-9][0-9]{0,18}) ([1-9][0-9]{0,18}) ")
# A run's steps between two checkpoints are within the record's cap, each sealed with some room.
MAX_STEPS_FILE_BYTES = 2 * MAX_SESSION_BYTES
_HEADER = re.compile(rb'\{"id":"([A-Za-z0-9._-]{1,128})","version":([1-9][0-9]{0,18}),'
                     rb'"updated":([0-9]+(?:\.[0-9]+)?(?:e[+-]?[0-9]+)?),"record":')
_TRAILER = b"}\n"
# A header is well under this; a file longer than a record may be plus this is not one of ours.
_HEADER_ROOM = 512
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def default_session_dir() -> Path:
    """Where the file store keeps sessions when no --session-dir is given."""
    return data_home() / "heddle" / "sessions"


def _encode(session_id: str, version: int, updated: float, data: bytes) -> bytes:
    head = f'{{"id":"{session_id}","version":{version},"updated":{updated!r},"record":'.encode()
    return head + data + _TRAILER


class FileStore:
    """Sessions as files in one folder, safe for several processes and threads on one machine."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.name = f"file {self.directory}"
        self._closed = threading.Event()
        try:
            make_private_dirs(self.directory, what="session folder", setting="--session-dir")
            self._dir = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except NotADirectoryError:
            raise StoreUnavailable(f"{self.name}: is not a folder; give --session-dir a folder (it is created when "
                                   "missing)") from None
        except OSError as exc:
            raise self._unavailable("cannot open the folder", exc) from None
        if not os.access(self.directory, os.R_OK | os.W_OK | os.X_OK):
            os.close(self._dir)
            raise StoreUnavailable(f"{self.name}: cannot write in the folder: permission denied")

    # ------------------------------------------------------------------ pieces

    def _unavailable(self, what: str, exc: OSError) -> StoreUnavailable:
        return StoreUnavailable(f"{self.name}: {what}: {exc.strerror or exc}")

    def _refused(self, filename: str, kind: str) -> StoreUnavailable:
        return StoreUnavailable(f"{self.name}: {filename} is {kind}, not a regular file; the file store never "
                                "follows links or reads special files: remove it")

    def _dir_fd(self) -> int:
        if self._closed.is_set():
            raise StoreUnavailable(f"{self.name}: the store was closed")
        return self._dir

    def _open_regular(self, filename: str, flags: int, mode: int = FILE_MODE) -> int | None:
        """A descriptor on `filename` in the folder, None when it is not there; a link or a
        special file there is refused."""
        # O_NONBLOCK: opening a FIFO planted there would otherwise wait for a writer.
        try:
            fd = os.open(filename, flags | _NOFOLLOW | os.O_NONBLOCK, mode, dir_fd=self._dir_fd())
        except FileNotFoundError:
            return None
        except OSError as exc:
            kind = self._kind_of(filename)
            if kind is not None:
                raise self._refused(filename, kind) from None
            raise self._unavailable(f"cannot open {filename}", exc) from None
        try:
            st_mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(st_mode):
                raise self._refused(filename, file_kind(st_mode))
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _kind_of(self, filename: str) -> str | None:
        """What stands at `filename` when it is not a regular file (for the refusal), else None."""
        try:
            st_mode = os.stat(filename, dir_fd=self._dir_fd(), follow_symlinks=False).st_mode
        except OSError:
            return None
        if stat.S_ISLNK(st_mode):
            return "a symbolic link"
        return None if stat.S_ISREG(st_mode) else file_kind(st_mode)

    def _read(self, session_id: str) -> Stored | None:
        filename = session_id + SUFFIX
        fd = self._open_regular(filename, os.O_RDONLY)
        if fd is None:
            return None
        try:
            raw = self._read_capped(fd, filename, MAX_SESSION_BYTES + _HEADER_ROOM,
                                    "larger than any session heddle writes; move it away")
        finally:
            os.close(fd)
        head = _HEADER.match(raw)
        if head is None or not raw.endswith(_TRAILER) or head.end() > len(raw) - len(_TRAILER):
            raise StoreUnavailable(f"{self.name}: {filename} is not a session file heddle wrote (damaged, or "
                                   "written by something else); move it away or remove the session")
        if head.group(1).decode() != session_id:
            raise StoreUnavailable(f"{self.name}: {filename} holds session {head.group(1).decode()!r}, not "
                                   f"{session_id!r}; a session's file is named after it: move it away")
        return Stored(session_id, int(head.group(2)), raw[head.end() : -len(_TRAILER)], float(head.group(3)))

    def _read_capped(self, fd: int, filename: str, cap: int, too_big: str) -> bytes:
        """The file open at `fd`, refused once it is over `cap` bytes (`too_big`: why no file heddle wrote is)."""
        chunks: list[bytes] = []
        size = 0
        try:
            while size <= cap:
                chunk = os.read(fd, min(1 << 20, cap + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            raise self._unavailable(f"cannot read {filename}", exc) from None
        if size > cap:
            raise StoreUnavailable(f"{self.name}: {filename} is over {cap} bytes, {too_big}")
        return b"".join(chunks)

    def _write(self, session_id: str, version: int, data: bytes) -> Stored:
        now = time.time()
        self._rewrite(session_id, SUFFIX, _encode(session_id, version, now, data), f"session {session_id!r}")
        return Stored(session_id, version, data, now)

    def _rewrite(self, session_id: str, suffix: str, content: bytes, what: str) -> None:
        """The session's file of `suffix` made `content`, whole or not at all: written beside it, synced,
        renamed over it."""
        dir_fd = self._dir_fd()
        # Hidden (a leading dot no session name has) so neither list() nor a session's name meets it.
        temp = f".{session_id}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE, dir_fd=dir_fd)
            try:
                view = memoryview(content)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(temp, session_id + suffix, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=dir_fd)
            raise self._unavailable(f"cannot write {what}", exc) from None
        self._sync_dir()

    def _sync_dir(self) -> None:
        # The rename (or unlink) is durable once the folder is: a crash then keeps the new record.
        try:
            os.fsync(self._dir_fd())
        except OSError as exc:
            raise self._unavailable("cannot flush the folder", exc) from None

    @contextlib.contextmanager
    def _locked(self, session_id: str) -> Iterator[None]:
        """Hold the session's lock file exclusively (against other processes and other threads)."""
        filename = session_id + LOCK_SUFFIX
        while True:
            fd = self._open_regular(filename, os.O_RDWR | os.O_CREAT)
            if fd is None:  # even with O_CREAT: the folder itself is gone
                raise StoreUnavailable(f"{self.name}: the folder was removed while heddle used it")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                held = os.fstat(fd)
                try:
                    now = os.stat(filename, dir_fd=self._dir_fd(), follow_symlinks=False)
                except FileNotFoundError:
                    now = None
            except OSError as exc:
                os.close(fd)
                raise self._unavailable(f"cannot lock session {session_id!r}", exc) from None
            except BaseException:
                os.close(fd)
                raise
            # A delete removes the lock file while holding it; whoever waited on the removed file
            # holds nothing anyone else can see, so it takes the lock again on the file there now.
            if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
                break
            os.close(fd)
        try:
            yield
        finally:
            os.close(fd)  # releases the flock

    def _drop_lock_file(self, session_id: str) -> None:
        """Remove the lock file, while holding it: a session that does not exist keeps none."""
        self._remove(session_id + LOCK_SUFFIX, f"the lock of session {session_id!r}")

    def _remove(self, name: str, what: str) -> bool:
        """Remove `name` from the folder; False when it was not there (nothing to remove is no failure)."""
        try:
            os.unlink(name, dir_fd=self._dir_fd())
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise self._unavailable(f"cannot remove {what}", exc) from None
        return True

    # ------------------------------------------------------------------ the protocol

    async def open(self) -> None:
        """Opened already, when it was made."""

    async def get(self, session_id: str) -> Stored | None:
        return await run_blocking(STORE_READS, self._get, session_id)

    async def create(self, session_id: str, data: bytes) -> Stored:
        return await run_blocking(STORE_WRITES, self._create, session_id, data)

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        return await run_blocking(STORE_WRITES, self._replace, session_id, data, version=version)

    async def delete(self, session_id: str) -> bool:
        return await run_blocking(STORE_WRITES, self._delete, session_id)

    async def list(self) -> list[Stored]:
        return await run_blocking(STORE_READS, self._list)

    async def index(self) -> Index:
        return await run_blocking(STORE_READS, self._index)

    async def close(self) -> None:
        self._close()

    # ------------------------------------------------------------------ the protocol's work, in a worker thread

    def _get(self, session_id: str) -> Stored | None:
        return self._read(check_session_id(session_id))

    def _create(self, session_id: str, data: bytes) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)
        with self._locked(session_id):
            if self._read(session_id) is not None:
                raise exists(session_id, store=self.name)
            return self._write(session_id, 1, data)

    def _replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)
        with self._locked(session_id):
            current = self._read(session_id)
            if current is None:
                self._drop_lock_file(session_id)
                raise not_found(session_id, store=self.name)
            if current.version != version:
                raise conflict(session_id, version, current.version, store=self.name)
            return self._write(session_id, version + 1, data)

    def _delete(self, session_id: str) -> bool:
        check_session_id(session_id)
        with self._locked(session_id):
            found = self._read(session_id) is not None
            if found:
                try:
                    os.unlink(session_id + SUFFIX, dir_fd=self._dir_fd())
                except OSError as exc:
                    raise self._unavailable(f"cannot remove session {session_id!r}", exc) from None
            self._remove(session_id + STEPS_SUFFIX, f"the steps of session {session_id!r}")
            self._drop_lock_file(session_id)
            if found:
                self._sync_dir()
            return found

    def _names(self) -> builtins.list[str]:
        """The ids of the sessions whose files are in the folder."""
        try:
            names = os.listdir(self._dir_fd())
        except OSError as exc:
            raise self._unavailable("cannot list the folder", exc) from None
        found: builtins.list[str] = []
        for filename in names:
            if not filename.endswith(SUFFIX) or filename.startswith("."):
                continue
            session_id = filename[: -len(SUFFIX)]
            try:
                found.append(check_session_id(session_id))
            except SessionError:  # a file that is no session's is not listed
                continue
        return found

    def _list(self) -> builtins.list[Stored]:
        found: builtins.list[Stored] = []
        for session_id in self._names():
            stored = self._read(session_id)
            if stored is not None:  # None: removed since the listing
                found.append(stored)
        found.sort(key=lambda s: (-s.updated, s.id))
        return found

    def _index(self) -> Index:
        found: Index = []
        for session_id in self._names():
            fd = self._open_regular(session_id + SUFFIX, os.O_RDONLY)
            if fd is None:  # removed since the listing
                continue
            try:
                head = _HEADER.match(os.read(fd, _HEADER_ROOM))
            except OSError as exc:
                raise self._unavailable(f"cannot read {session_id + SUFFIX}", exc) from None
            finally:
                os.close(fd)
            if head is None:
                raise StoreUnavailable(f"{self.name}: {session_id + SUFFIX} is not a session file heddle wrote "
                                       "(damaged, or written by something else); move it away or remove the session")
            found.append((session_id, float(head.group(3))))
        return found

    def _close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            os.close(self._dir)

    # ------------------------------------------------------------------ steps (heddle.sessions.steps)
    #
    # <dir>/<id>.steps holds a durable run's steps, one line each, `BASE SEQ <sealed step>\n`, only ever
    # appended to (O_APPEND, fsync) under the session's lock; a line without its newline is one a crash
    # cut short, never read (and cut off before the next append). Dropping steps rewrites what is left.

    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        await run_blocking(STORE_WRITES, self._append_step, session_id, base, seq, data)

    async def steps(self, session_id: str, base: int) -> Steps:
        kept = await run_blocking(STORE_READS, self._steps, session_id)
        return [(s, line) for b, s, line in kept if b == base]

    async def drop_steps(self, session_id: str, below: int) -> None:
        await run_blocking(STORE_WRITES, self._drop_steps, session_id, below)

    def _steps(self, session_id: str) -> builtins.list[tuple[int, int, bytes]]:
        """Every whole line of the session's steps file: (base, seq, sealed step)."""
        check_session_id(session_id)
        filename = session_id + STEPS_SUFFIX
        fd = self._open_regular(filename, os.O_RDONLY)
        if fd is None:
            return []
        try:
            raw = self._read_capped(fd, filename, MAX_STEPS_FILE_BYTES,
                                    "more than a run's steps between two checkpoints; remove the session")
        finally:
            os.close(fd)
        out: builtins.list[tuple[int, int, bytes]] = []
        for line in raw.split(b"\n")[:-1]:  # the last piece has no newline: empty, or cut short
            match = _STEP_LINE.match(line)
            if match is None:
                raise StoreUnavailable(f"{self.name}: {filename} is not a steps file heddle wrote (damaged, or "
                                       "written by something else); remove the session")
            out.append((int(match.group(1)), int(match.group(2)), line[match.end() :]))
        return out

    def _append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        check_session_id(session_id)
        if b"\n" in data:
            raise StoreUnavailable(f"{self.name}: a step of session {session_id!r} spans lines; it is not written")
        filename = session_id + STEPS_SUFFIX
        with self._locked(session_id):
            if any(b == base and s == seq for b, s, _ in self._steps(session_id)):
                raise step_taken(session_id, base, seq, store=self.name)
            fd = self._open_regular(filename, os.O_RDWR | os.O_APPEND | os.O_CREAT)
            if fd is None:
                raise StoreUnavailable(f"{self.name}: the folder was removed while heddle used it")
            try:
                size = os.fstat(fd).st_size
                if size:
                    # A line a crash cut short is cut off, so the new one starts a line of its own.
                    whole = os.pread(fd, size, 0).rfind(b"\n") + 1
                    if whole != size:
                        os.ftruncate(fd, whole)
                view = memoryview(b"%d %d " % (base, seq) + data + b"\n")
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            except OSError as exc:
                raise self._unavailable(f"cannot write a step of session {session_id!r}", exc) from None
            finally:
                os.close(fd)
            if not size:
                self._sync_dir()

    def _drop_steps(self, session_id: str, below: int) -> None:
        check_session_id(session_id)
        with self._locked(session_id):
            kept = self._steps(session_id)
            left = [(b, s, line) for b, s, line in kept if b >= below]
            if len(left) == len(kept) and kept:
                return
            if not left:
                if self._remove(session_id + STEPS_SUFFIX, f"the steps of session {session_id!r}"):
                    self._sync_dir()
                return
            content = b"".join(b"%d %d " % (b, s) + line + b"\n" for b, s, line in left)
            self._rewrite(session_id, STEPS_SUFFIX, content, f"the steps of session {session_id!r}")
