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

from heddle.blocking import STORE_READS, STORE_WRITES, Limiter, run_blocking
from heddle.errors import StoreUnavailable
from heddle.format.private import check_private_file
from heddle.sessions.private import FILE_MODE, data_home, make_private_dirs
from heddle.sessions.steps import Steps, step_taken
from heddle.sessions.store import Index, Stored, check_session_id, check_size, conflict, exists, not_found

T = TypeVar("T")

# How long a write waits for another process's write to finish. Writes are one short statement,
# so a wait this long means something holds the file (a stuck process, a backup tool).
BUSY_TIMEOUT_SECONDS = 15.0
# The layout of the table, in PRAGMA user_version: a file from a later heddle is refused, not misread.
SCHEMA_VERSION = 2  # 2: the steps table

_SCHEMA = """CREATE TABLE IF NOT EXISTS heddle_sessions (
    id TEXT PRIMARY KEY NOT NULL,
    version INTEGER NOT NULL,
    data BLOB NOT NULL,
    updated REAL NOT NULL
)"""


# A durable run's steps (heddle.sessions.steps): appended, never updated; dropped once a checkpoint holds them.
_STEPS_SCHEMA = """CREATE TABLE IF NOT EXISTS heddle_steps (
    session TEXT NOT NULL,
    base INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (session, base, seq)
)"""


# What a recovering server pages through (index_page): the sessions by the time of their last write.
_BY_TIME = "CREATE INDEX IF NOT EXISTS heddle_sessions_updated ON heddle_sessions (updated, id)"


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
                conn.execute(_STEPS_SCHEMA)
                conn.execute(_BY_TIME)
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

    async def _call(self, limiter: Limiter, what: str, work: Callable[[sqlite3.Connection], T]) -> T:
        return await run_blocking(limiter, self._run, what, work)

    # ------------------------------------------------------------------ the protocol

    async def open(self) -> None:
        """Opened already, when it was made."""

    async def get(self, session_id: str) -> Stored | None:
        check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> Stored | None:
            row = conn.execute("SELECT version, data, updated FROM heddle_sessions WHERE id = ?",
                               (session_id,)).fetchone()
            return None if row is None else Stored(session_id, int(row[0]), bytes(row[1]), float(row[2]))

        return await self._call(STORE_READS, f"cannot read session {session_id!r}", work)

    async def create(self, session_id: str, data: bytes) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)
        now = time.time()

        def work(conn: sqlite3.Connection) -> Stored:
            cur = conn.execute("INSERT INTO heddle_sessions (id, version, data, updated) VALUES (?, 1, ?, ?) "
                               "ON CONFLICT (id) DO NOTHING", (session_id, data, now))
            if cur.rowcount != 1:
                raise exists(session_id, store=self.name)
            return Stored(session_id, 1, data, now)

        return await self._call(STORE_WRITES, f"cannot write session {session_id!r}", work)

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
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

        return await self._call(STORE_WRITES, f"cannot write session {session_id!r}", work)

    async def delete(self, session_id: str) -> bool:
        check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> bool:
            conn.execute("DELETE FROM heddle_steps WHERE session = ?", (session_id,))
            return conn.execute("DELETE FROM heddle_sessions WHERE id = ?", (session_id,)).rowcount == 1

        return await self._call(STORE_WRITES, f"cannot remove session {session_id!r}", work)

    async def list(self) -> list[Stored]:
        def work(conn: sqlite3.Connection) -> list[Stored]:
            rows = conn.execute("SELECT id, version, data, updated FROM heddle_sessions "
                                "ORDER BY updated DESC, id").fetchall()
            return [Stored(str(r[0]), int(r[1]), bytes(r[2]), float(r[3])) for r in rows]

        return await self._call(STORE_READS, "cannot list the sessions", work)

    async def index(self) -> Index:
        def work(conn: sqlite3.Connection) -> Index:
            return [(str(r[0]), float(r[1])) for r in conn.execute("SELECT id, updated FROM heddle_sessions")]

        return await self._call(STORE_READS, "cannot list the sessions", work)

    async def index_page(self, *, since: float | None, until: float, after: tuple[float, str] | None,
                         limit: int) -> Index:
        where, args = ["updated <= ?"], list[float | str]([until])
        if since is not None:
            where.append("updated > ?")
            args.append(since)
        if after is not None:
            where.append("(updated > ? OR (updated = ? AND id > ?))")
            args.extend((after[0], after[0], after[1]))
        query = f"SELECT id, updated FROM heddle_sessions WHERE {' AND '.join(where)} ORDER BY updated, id LIMIT ?"

        def work(conn: sqlite3.Connection) -> Index:
            return [(str(r[0]), float(r[1])) for r in conn.execute(query, (*args, limit))]

        return await self._call(STORE_READS, "cannot list the sessions", work)

    async def close(self) -> None:
        await run_blocking(STORE_WRITES, self._close)

    def _close(self) -> None:
        with self._lock:
            self._conn.close()

    # ------------------------------------------------------------------ steps (heddle.sessions.steps)

    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> None:
            cur = conn.execute("INSERT INTO heddle_steps (session, base, seq, data) VALUES (?, ?, ?, ?) "
                               "ON CONFLICT DO NOTHING", (session_id, base, seq, data))
            if cur.rowcount != 1:
                raise step_taken(session_id, base, seq, store=self.name)

        await self._call(STORE_WRITES, f"cannot write a step of session {session_id!r}", work)

    async def steps(self, session_id: str, base: int) -> Steps:
        check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> Steps:
            rows = conn.execute("SELECT seq, data FROM heddle_steps WHERE session = ? AND base = ? ORDER BY seq",
                                (session_id, base)).fetchall()
            return [(int(r[0]), bytes(r[1])) for r in rows]

        return await self._call(STORE_READS, f"cannot read the steps of session {session_id!r}", work)

    async def drop_steps(self, session_id: str, below: int) -> None:
        check_session_id(session_id)

        def work(conn: sqlite3.Connection) -> None:
            conn.execute("DELETE FROM heddle_steps WHERE session = ? AND base < ?", (session_id, below))

        await self._call(STORE_WRITES, f"cannot remove the steps of session {session_id!r}", work)
