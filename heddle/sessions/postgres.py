"""The Postgres session store: for servers that outgrow one machine, so several heddle-server
replicas behind a load balancer share sessions.

One table, created when missing. Every write is one statement in autocommit, and the
compare-and-swap is `UPDATE ... WHERE id = %s AND version = %s`: the row lock Postgres takes makes
two racing writers one success and one conflict, whichever replica each runs on. Timestamps are
the database's clock, so "most recently written" means the same across replicas.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import conninfo

from heddle.errors import SessionConflict, StoreUnavailable
from heddle.sessions.steps import Steps, step_taken
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
# What a recovering server pages through (index_page): the sessions by the time of their last write.
_BY_TIME = f"CREATE INDEX IF NOT EXISTS {TABLE}_updated ON {TABLE} (updated, id)"
_NOW = "extract(epoch FROM clock_timestamp())::float8"
# A durable run's steps (heddle.sessions.steps): appended, never updated; dropped once a checkpoint holds them.
STEPS_TABLE = "heddle_steps"
_STEPS_SCHEMA = f"""CREATE TABLE IF NOT EXISTS {STEPS_TABLE} (
    session text NOT NULL,
    base bigint NOT NULL,
    seq bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (session, base, seq)
)"""


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
        # The connection is psycopg's asynchronous one, tied to the loop it was made on: a store used
        # from another loop (a test's, a second asyncio.run) connects again there.
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        # Reached and laid out now, on a connection of its own: an unreachable store is reported
        # before anything runs, wherever the store was opened (a shell starting, a worker thread).
        try:
            with psycopg.connect(self._dsn, autocommit=True, **self._connect_options()) as conn:
                self._set_up(conn)
                self._set_up_steps(conn)
        except psycopg.Error as exc:
            raise self._unavailable("cannot connect", exc) from None

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

    def _connect_options(self) -> dict[str, Any]:
        if "connect_timeout" not in conninfo.conninfo_to_dict(self._dsn):
            return {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
        return {}

    async def _connection(self) -> psycopg.AsyncConnection[Any]:
        """The open connection, made (again) when there is none or the last one broke. Called
        with the lock held."""
        if self._closed:
            raise StoreUnavailable(f"{self.name}: the store was closed")
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._conn = None
        try:
            self._conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True, **self._connect_options())
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
        try:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"{TABLE}_updated",)).fetchone()
            if row is None or not row[0]:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                    conn.execute(_BY_TIME)
        except psycopg.errors.InsufficientPrivilege:
            pass  # a table an administrator made and did not index: paged through all the same, only slower
        except psycopg.Error as exc:
            raise self._unavailable(f"cannot index the table {TABLE}", exc) from None

    def _on_this_loop(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            # A connection of another loop cannot be used (nor closed) here: it is let go.
            self._loop, self._conn, self._lock = loop, None, asyncio.Lock()
        return self._lock

    async def _run(self, what: str, work: Callable[[psycopg.AsyncConnection[Any]], Awaitable[T]], *,
                   retry: bool = False) -> T:
        """`work` on the connection. `retry` (reads only) tries once more on a new connection when
        the old one had broken, say because the server restarted; a write is never sent twice,
        since the first may have been applied."""
        async with self._on_this_loop():
            for attempt in (1, 2):
                conn = await self._connection()
                try:
                    return await work(conn)
                except psycopg.Error as exc:
                    if retry and attempt == 1 and conn.broken:
                        continue
                    raise self._unavailable(what, exc) from None
        raise AssertionError("unreachable")

    # ------------------------------------------------------------------ the protocol

    async def open(self) -> None:
        async with self._on_this_loop():
            await self._connection()

    async def get(self, session_id: str) -> Stored | None:
        check_session_id(session_id)

        async def work(conn: psycopg.AsyncConnection[Any]) -> Stored | None:
            cur = await conn.execute(f"SELECT version, data, updated FROM {TABLE} WHERE id = %s", (session_id,))
            row = await cur.fetchone()
            return None if row is None else Stored(session_id, int(row[0]), bytes(row[1]), float(row[2]))

        return await self._run(f"cannot read session {session_id!r}", work, retry=True)

    async def create(self, session_id: str, data: bytes) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)

        async def work(conn: psycopg.AsyncConnection[Any]) -> Stored:
            cur = await conn.execute(f"INSERT INTO {TABLE} (id, version, data, updated) VALUES (%s, 1, %b, {_NOW}) "
                                     "ON CONFLICT (id) DO NOTHING RETURNING updated", (session_id, data))
            row = await cur.fetchone()
            if row is None:
                raise exists(session_id, store=self.name)
            return Stored(session_id, 1, data, float(row[0]))

        return await self._run(f"cannot write session {session_id!r}", work)

    async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)

        async def work(conn: psycopg.AsyncConnection[Any]) -> Stored:
            cur = await conn.execute(f"UPDATE {TABLE} SET data = %b, version = version + 1, updated = {_NOW} "
                                     "WHERE id = %s AND version = %s RETURNING version, updated",
                                     (data, session_id, version))
            row = await cur.fetchone()
            if row is not None:
                return Stored(session_id, int(row[0]), data, float(row[1]))
            found = await (await conn.execute(f"SELECT version FROM {TABLE} WHERE id = %s", (session_id,))).fetchone()
            if found is None:
                raise not_found(session_id, store=self.name)
            raise conflict(session_id, version, int(found[0]), store=self.name)

        return await self._run(f"cannot write session {session_id!r}", work)

    async def claim(self, session_id: str, data: bytes, *, version: int) -> Stored:
        """`replace`, for taking over a run whose owner is gone: the row is locked with `FOR UPDATE SKIP
        LOCKED`, so a replica that meets another taking the same run over at that moment is refused at
        once (SessionConflict) rather than waiting for it, and both never proceed."""
        check_session_id(session_id)
        check_size(session_id, data, store=self.name)

        async def work(conn: psycopg.AsyncConnection[Any]) -> Stored:
            async with conn.transaction():
                cur = await conn.execute(f"SELECT version FROM {TABLE} WHERE id = %s FOR UPDATE SKIP LOCKED",
                                         (session_id,))
                row = await cur.fetchone()
                if row is None:
                    # MVCC: a plain read of a locked row does not wait.
                    cur = await conn.execute(f"SELECT 1 FROM {TABLE} WHERE id = %s", (session_id,))
                    if await cur.fetchone() is None:
                        raise not_found(session_id, store=self.name)
                    raise SessionConflict(f"{self.name}: session {session_id!r} is being taken over by another "
                                          "server at this moment")
                if int(row[0]) != version:
                    raise conflict(session_id, version, int(row[0]), store=self.name)
                cur = await conn.execute(f"UPDATE {TABLE} SET data = %b, version = version + 1, updated = {_NOW} "
                                         "WHERE id = %s RETURNING version, updated", (data, session_id))
                done = await cur.fetchone()
                assert done is not None, "the row is locked"
                return Stored(session_id, int(done[0]), data, float(done[1]))

        return await self._run(f"cannot write session {session_id!r}", work)

    async def delete(self, session_id: str) -> bool:
        check_session_id(session_id)

        async def work(conn: psycopg.AsyncConnection[Any]) -> bool:
            await conn.execute(f"DELETE FROM {STEPS_TABLE} WHERE session = %s", (session_id,))
            return (await conn.execute(f"DELETE FROM {TABLE} WHERE id = %s", (session_id,))).rowcount == 1

        return await self._run(f"cannot remove session {session_id!r}", work)

    async def list(self) -> list[Stored]:
        async def work(conn: psycopg.AsyncConnection[Any]) -> list[Stored]:
            cur = await conn.execute(f"SELECT id, version, data, updated FROM {TABLE} ORDER BY updated DESC, id")
            return [Stored(str(r[0]), int(r[1]), bytes(r[2]), float(r[3])) for r in await cur.fetchall()]

        return await self._run("cannot list the sessions", work, retry=True)

    async def index(self) -> Index:
        async def work(conn: psycopg.AsyncConnection[Any]) -> Index:
            cur = await conn.execute(f"SELECT id, updated FROM {TABLE}")
            return [(str(r[0]), float(r[1])) for r in await cur.fetchall()]

        return await self._run("cannot list the sessions", work, retry=True)

    async def index_page(self, *, since: float | None, until: float, after: tuple[float, str] | None,
                         limit: int) -> Index:
        where, args = ["updated <= %s"], list[float | str]([until])
        if since is not None:
            where.append("updated > %s")
            args.append(since)
        if after is not None:
            where.append("(updated, id) > (%s, %s)")
            args.extend(after)
        query = f"SELECT id, updated FROM {TABLE} WHERE {' AND '.join(where)} ORDER BY updated, id LIMIT %s"

        async def work(conn: psycopg.AsyncConnection[Any]) -> Index:
            cur = await conn.execute(query, (*args, limit))
            return [(str(r[0]), float(r[1])) for r in await cur.fetchall()]

        return await self._run("cannot list the sessions", work, retry=True)

    async def close(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is self._loop:
                await conn.close()

    # ------------------------------------------------------------------ steps (heddle.sessions.steps)

    def _set_up_steps(self, conn: psycopg.Connection[Any]) -> None:
        try:
            row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (STEPS_TABLE,)).fetchone()
            if row is None or not row[0]:
                with conn.transaction():
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))
                    conn.execute(_STEPS_SCHEMA)
        except psycopg.Error as exc:
            raise self._unavailable(f"cannot set up the table {STEPS_TABLE}", exc) from None

    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        check_session_id(session_id)

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            cur = await conn.execute(f"INSERT INTO {STEPS_TABLE} (session, base, seq, data) VALUES (%s, %s, %s, %b) "
                                     "ON CONFLICT DO NOTHING", (session_id, base, seq, data))
            if cur.rowcount != 1:
                raise step_taken(session_id, base, seq, store=self.name)

        await self._run(f"cannot write a step of session {session_id!r}", work)

    async def steps(self, session_id: str, base: int) -> Steps:
        check_session_id(session_id)

        async def work(conn: psycopg.AsyncConnection[Any]) -> Steps:
            cur = await conn.execute(f"SELECT seq, data FROM {STEPS_TABLE} WHERE session = %s AND base = %s "
                                     "ORDER BY seq", (session_id, base))
            return [(int(r[0]), bytes(r[1])) for r in await cur.fetchall()]

        return await self._run(f"cannot read the steps of session {session_id!r}", work, retry=True)

    async def drop_steps(self, session_id: str, below: int) -> None:
        check_session_id(session_id)

        async def work(conn: psycopg.AsyncConnection[Any]) -> None:
            await conn.execute(f"DELETE FROM {STEPS_TABLE} WHERE session = %s AND base < %s", (session_id, below))

        await self._run(f"cannot remove the steps of session {session_id!r}", work)
