"""The sqlite session store, the CLI's default: one file under the user's data directory.

WAL mode lets readers go on while one process writes, and the busy timeout makes a second writer
wait its turn rather than fail, so several heddle processes on one machine share the file. Every
write is one statement, so the compare-and-swap on `version` is atomic without a transaction.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from heddle.errors import StoreUnavailable
from heddle.format.private import check_private_file
from heddle.sessions.private import FILE_MODE, data_home, make_private_dirs
from heddle.sessions.store import Index, Stored, check_session_id, check_size, conflict, exists, not_found

T = TypeVar("T")

# How long a write waits for another process's write to finish. Writes are one short statement,
# so a wait this long means something holds the file (a stuck process, a backup tool).
BUSY_TIMEOUT_SECONDS = 15.0
# The layout of the table, in PRAGMA user_version: a file from a later heddle is refused, not misread.
SCHEMA_VERSION = 1

_SCHEMA = """CREATE TABLE IF NOT EXISTS heddle_sessions (
    id TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL,
    data BLOB NOT NULL,
    updated REAL NOT NULL
)"""


def default_session_db() -> Path:
    """Where the CLI keeps sessions when no --session-db is given."""
    return data_home() / "heddle" / "sessions.db"


class SqliteStore:
    """Sessions in one sqlite file, safe for several processes (and threads) on one machine."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.name = f"sqlite {self.path}"
        # One connection, used by one thread at a time: sqlite serialises writers anyway.
        self._lock = threading.Lock()
        self._prepare_file()
        try:
            self._conn = sqlite3.connect(str(self.path), timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._unavailable("cannot open it", exc) from None
        try:
            self._set_up()
        except BaseException:
            self._conn.close()
            raise

    # ------------------------------------------------------------------ opening

    def _prepare_file(self) -> None:
        try:
            make_private_dirs(self.path.parent, what="folder of the sessions file", setting="--session-db")
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
            except FileExistsError:
                mode = os.stat(self.path).st_mode
                if not stat.S_ISREG(mode):
                    raise StoreUnavailable(f"{self.name}: is not a regular file; give --session-db the path of "
                                           "a sessions file (it is created when missing)") from None
                check_private_file(self.path, what="sessions file", setting="--session-db")
                return
            try:
                os.fchmod(fd, FILE_MODE)  # whatever the umask
            finally:
                os.close(fd)
        except OSError as exc:
            raise self._unavailable("cannot create it", exc) from None

    def _set_up(self) -> None:
        conn = self._conn
        try:
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()
            if mode is None or str(mode[0]).lower() != "wal":
                raise StoreUnavailable(
                    f"{self.name}: cannot use write-ahead logging there (journal mode stays {mode and mode[0]!r}); "
                    "put the sessions file on a local file system")
            # Under BEGIN IMMEDIATE so two processes opening a new file at once do not both lay it out.
            conn.execute("BEGIN IMMEDIATE")
            try:
                found = int(conn.execute("PRAGMA user_version").fetchone()[0])
                if found > SCHEMA_VERSION:
                    raise StoreUnavailable(
                        f"{self.name}: was written by a later heddle (layout {found}, this one reads "
                        f"{SCHEMA_VERSION}); upgrade heddle or give another --session-db")
                conn.execute(_SCHEMA)
                if found < SCHEMA_VERSION:
                    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._unavailable("cannot be opened as a sessions file", exc) from None

    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailable:
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return StoreUnavailable(f"{self.name}: {what}: {' '.join(cause.split())}")

    def _run(self, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return work(self._conn)
            except sqlite3.Error as exc:
                raise self._unavailable(what, exc) from None

    # ------------------------------------------------------------------ the protocol

    def get(self, session_id: str) -> Stored | None:
        check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> Stored | None:
            row = conn.execute("SELECT version, data, updated FROM heddle_sessions WHERE id = ?",
                               (session_id,)).fetchone()
            return None if row is None else Stored(session_id, int(row[0]), bytes(row[1]), float(row[2]))

        return self._run(f"cannot read session {session_id!r}", work)

    def create(self, session_id: str, data: bytes) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)
        now = time.time()

        def work(conn: sqlite3.Connection) -> Stored:
            cur = conn.execute("INSERT INTO heddle_sessions (id, version, data, updated) VALUES (?, 1, ?, ?) "
                               "ON CONFLICT (id) DO NOTHING", (session_id, data, now))
            if cur.rowcount != 1:
                raise exists(session_id, store=self.name)
            return Stored(session_id, 1, data, now)

        return self._run(f"cannot write session {session_id!r}", work)

    def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)
        now = time.time()

        def work(conn: sqlite3.Connection) -> Stored:
            cur = conn.execute("UPDATE heddle_sessions SET data = ?, version = version + 1, updated = ? "
                               "WHERE id = ? AND version = ?", (data, now, session_id, version))
            if cur.rowcount == 1:
                return Stored(session_id, version + 1, data, now)
            row = conn.execute("SELECT version FROM heddle_sessions WHERE id = ?", (session_id,)).fetchone()
            if row is None:
                raise not_found(session_id, store=self.name)
            raise conflict(session_id, version, int(row[0]), store=self.name)

        return self._run(f"cannot write session {session_id!r}", work)

    def delete(self, session_id: str) -> bool:
        check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> bool:
            return conn.execute("DELETE FROM heddle_sessions WHERE id = ?", (session_id,)).rowcount == 1

        return self._run(f"cannot remove session {session_id!r}", work)

    def list(self) -> list[Stored]:
        def work(conn: sqlite3.Connection) -> list[Stored]:
            rows = conn.execute("SELECT id, version, data, updated FROM heddle_sessions "
                                "ORDER BY updated DESC, id").fetchall()
            return [Stored(str(r[0]), int(r[1]), bytes(r[2]), float(r[3])) for r in rows]

        return self._run("cannot list the sessions", work)

    def index(self) -> Index:
        def work(conn: sqlite3.Connection) -> Index:
            return [(str(r[0]), float(r[1])) for r in conn.execute("SELECT id, updated FROM heddle_sessions")]

        return self._run("cannot list the sessions", work)

    def close(self) -> None:
        with self._lock:
            self._conn.close()
