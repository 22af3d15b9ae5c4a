"""The Postgres session store: for servers that outgrow one machine, so several heddle-server
replicas behind a load balancer share sessions.

One table, created when missing. Every write is one statement in autocommit, and the
compare-and-swap is `UPDATE ... WHERE id = %s AND version = %s`: the row lock Postgres takes makes
two racing writers one success and one conflict, whichever replica each runs on. Timestamps are
the database's clock, so "most recently written" means the same across replicas.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo

from heddle.errors import StoreUnavailable
from heddle.sessions.store import Index, Stored, check_session_id, check_size, conflict, exists, not_found

T = TypeVar("T")

TABLE = "heddle_sessions"
# Seconds to wait for the server when none is given in the DSN: an unreachable store is reported
# before anything runs, not after a long hang.
CONNECT_TIMEOUT_SECONDS = 5
# An advisory lock key of heddle's own, held while the table is laid out, so two servers starting
# at once do not both create it (CREATE TABLE IF NOT EXISTS alone can fail on that race).
_SCHEMA_LOCK = 0x6865_6464_6C65_0001

_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id text PRIMARY KEY,
    version bigint NOT NULL,
    data bytea NOT NULL,
    updated double precision NOT NULL
)"""
_NOW = "extract(epoch FROM clock_timestamp())::float8"


def redact_dsn(dsn: str) -> str:
    """The DSN with any password replaced by ***, for messages and the store's name."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:
            return re.sub(r"//[^@/]*@", "//***@", dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, _, hosts = netloc.rpartition("@")
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{hosts}"
        query = parts.query
        if query:
            pairs = parse_qsl(query, keep_blank_values=True)
            query = urlencode([(k, "***" if k == "password" else v) for k, v in pairs], safe="*")
        return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1***", dsn)


def _one_line(text: str) -> str:
    return " ".join(text.split()) or "no reason given"


class PostgresStore:
    """Sessions in a Postgres table, shared by every process that opens the same DSN."""

    def __init__(self, dsn: str) -> None:
        self.name = f"postgres {redact_dsn(dsn)}"
        self._dsn = dsn
        self._secrets = self._passwords(dsn)
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        with self._lock:
            self._set_up(self._connection())

    # ------------------------------------------------------------------ connecting

    def _passwords(self, dsn: str) -> list[str]:
        try:
            password = conninfo.conninfo_to_dict(dsn).get("password")
        except psycopg.Error as exc:
            # libpq quotes the DSN it could not parse, password and all.
            cause = _one_line(str(exc).replace(dsn, redact_dsn(dsn)))
            raise StoreUnavailable(f"{self.name}: is not a valid Postgres DSN: {cause}") from None
        return [str(password)] if password else []

    def _unavailable(self, what: str, exc: BaseException) -> StoreUnavailable:
        cause = _one_line(str(exc).replace(self._dsn, redact_dsn(self._dsn)))
        for secret in self._secrets:
            cause = cause.replace(secret, "***")
        return StoreUnavailable(f"{self.name}: {what}: {cause}")

    def _connection(self) -> psycopg.Connection[Any]:
        """The open connection, made (again) when there is none or the last one broke. Called
        with the lock held."""
        if self._closed:
            raise StoreUnavailable(f"{self.name}: the store was closed")
        if self._conn is not None and not self._conn.closed and not self._conn.broken:
            return self._conn
        self._conn = None
        extra: dict[str, Any] = {}
        if "connect_timeout" not in conninfo.conninfo_to_dict(self._dsn):
            extra["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
        try:
            self._conn = psycopg.connect(self._dsn, autocommit=True, **extra)
        except psycopg.Error as exc:
            raise self._unavailable("cannot connect", exc) from None
        return self._conn

    def _set_up(self, conn: psycopg.Connection[Any]) -> None:
        try:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (TABLE,)).fetchone()
            if row is None or not row[0]:
                # Only when it is missing: a table made by an administrator needs no CREATE right.
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                    conn.execute(_SCHEMA)
        except psycopg.Error as exc:
            raise self._unavailable(f"cannot set up the table {TABLE}", exc) from None

    def _run(self, what: str, work: Callable[[psycopg.Connection[Any]], T], *, retry: bool = False) -> T:
        """`work` on the connection. `retry` (reads only) tries once more on a new connection when
        the old one had broken, say because the server restarted; a write is never sent twice,
        since the first may have been applied."""
        with self._lock:
            for attempt in (1, 2):
                conn = self._connection()
                try:
                    return work(conn)
                except psycopg.Error as exc:
                    if retry and attempt == 1 and conn.broken:
                        continue
                    raise self._unavailable(what, exc) from None
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ the protocol

    def get(self, session_id: str) -> Stored | None:
        check_session_id(session_id)

        def work(conn: psycopg.Connection[Any]) -> Stored | None:
            row = conn.execute(f"SELECT version, data, updated FROM {TABLE} WHERE id = %s",
                               (session_id,)).fetchone()
            return None if row is None else Stored(session_id, int(row[0]), bytes(row[1]), float(row[2]))

        return self._run(f"cannot read session {session_id!r}", work, retry=True)

    def create(self, session_id: str, data: bytes) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)

        def work(conn: psycopg.Connection[Any]) -> Stored:
            row = conn.execute(f"INSERT INTO {TABLE} (id, version, data, updated) VALUES (%s, 1, %b, {_NOW}) "
                               "ON CONFLICT (id) DO NOTHING RETURNING updated", (session_id, data)).fetchone()
            if row is None:
                raise exists(session_id, store=self.name)
            return Stored(session_id, 1, data, float(row[0]))

        return self._run(f"cannot write session {session_id!r}", work)

    def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)

        def work(conn: psycopg.Connection[Any]) -> Stored:
            row = conn.execute(f"UPDATE {TABLE} SET data = %b, version = version + 1, updated = {_NOW} "
                               "WHERE id = %s AND version = %s RETURNING version, updated",
                               (data, session_id, version)).fetchone()
            if row is not None:
                return Stored(session_id, int(row[0]), data, float(row[1]))
            found = conn.execute(f"SELECT version FROM {TABLE} WHERE id = %s", (session_id,)).fetchone()
            if found is None:
                raise not_found(session_id, store=self.name)
            raise conflict(session_id, version, int(found[0]), store=self.name)

        return self._run(f"cannot write session {session_id!r}", work)

    def delete(self, session_id: str) -> bool:
        check_session_id(session_id)

        def work(conn: psycopg.Connection[Any]) -> bool:
            return conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (session_id,)).rowcount == 1

        return self._run(f"cannot remove session {session_id!r}", work)

    def list(self) -> list[Stored]:
        def work(conn: psycopg.Connection[Any]) -> list[Stored]:
            rows = conn.execute(f"SELECT id, version, data, updated FROM {TABLE} ORDER BY updated DESC, id").fetchall()
            return [Stored(str(r[0]), int(r[1]), bytes(r[2]), float(r[3])) for r in rows]

        return self._run("cannot list the sessions", work, retry=True)

    def index(self) -> Index:
        def work(conn: psycopg.Connection[Any]) -> Index:
            return [(str(r[0]), float(r[1])) for r in conn.execute(f"SELECT id, updated FROM {TABLE}").fetchall()]

        return self._run("cannot list the sessions", work, retry=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None
