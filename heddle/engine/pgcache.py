"""A message transform's cache in a PostgresDatabaseDatastore, as the reference runtime (WayFlow
26.3.1) keeps it.

The reference connects to database `postgres` at the config's `url` as `user`/`password`, with
`sslmode` (and, unless it is `disable`, `sslcert`, `sslkey`, `sslrootcert`, `sslcrl`), and uses the
existing table named by the transform's `cache_collection_name`: it creates nothing. A row is
`cache_key`, `cache_content`, (`prefix_size`,) `created_at`, `last_used_at` (seconds since the epoch);
reading a key first deletes the rows older than `max_cache_lifetime`, takes the first row stored for
it and marks it used; storing first evicts the least recently used key when the table holds more
than `max_cache_size` rows, then inserts. A key is the conversation's own id, so two conversations
never share a summary; a session keeps its id with its conversation, a run outside one is a new
conversation.

In a session the rows read and the writes made are journaled, so that a run resumed after a wait
decides as it did the first time and writes nothing twice.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from heddle.agentspec import components as c
from heddle.agentspec.fields import components_of
from heddle.errors import RunError

if TYPE_CHECKING:
    from heddle.engine.journal import Journal

CONVERSATION = "conversation"  # the cache key of an agent's conversation (each cache is one agent's)

CONNECT_TIMEOUT_SECONDS = 5
STATEMENT_TIMEOUT_MS = 10_000
MAX_CONTENT_CHARS = 4_000_000  # of one cached summary read back: a summary is a model's short answer
_TLS_FILES = ("sslcert", "sslkey", "sslrootcert", "sslcrl")


def _secret(config: c.TlsPostgresDatabaseConnectionConfig, field: str, where: str) -> str:
    written = getattr(config, field)
    variable = c.env_reference(written)
    assert variable is not None, "the component holds only $VAR references for its secrets"
    value = os.environ.get(variable)
    if value is None:
        raise RunError(f"{where}: {field} names environment variable {variable}, which is not set; set it where the "
                       "flow runs")
    return value


def connect_args(config: c.TlsPostgresDatabaseConnectionConfig, where: str) -> dict[str, Any]:
    """libpq's connection parameters for `config`, read as the reference reads them."""
    host, _, port = config.url.rpartition(":") if ":" in config.url else (config.url, "", "")
    args: dict[str, Any] = {
        "host": host or config.url, "dbname": "postgres", "user": _secret(config, "user", where),
        "password": _secret(config, "password", where), "sslmode": config.sslmode,
        "connect_timeout": CONNECT_TIMEOUT_SECONDS, "options": f"-c statement_timeout={STATEMENT_TIMEOUT_MS}"}
    if port:
        args["port"] = port
    if config.sslmode != "disable":
        for field in _TLS_FILES:
            if getattr(config, field) is not None:
                args[field] = _secret(config, field, where) if field == "sslkey" else getattr(config, field)
    return args


class PostgresCache:
    """One transform's cache: the rows of its table whose keys belong to this conversation."""

    def __init__(self, transform: c.MessageSummarizationTransform | c.ConversationSummarizationTransform,
                 datastore: c.PostgresDatabaseDatastore, columns: list[str], conversation: str,
                 journal: Journal | None, where: str) -> None:
        self.max_size = transform.max_cache_size
        self.max_lifetime = transform.max_cache_lifetime
        self.table = transform.cache_collection_name
        self.datastore, self.columns = datastore, columns
        self.conversation, self.journal, self.where = conversation, journal, where

    async def _run(self, work: Any) -> Any:
        import psycopg
        from psycopg import sql

        table = sql.Identifier(self.table)
        try:
            conn = await psycopg.AsyncConnection.connect(**connect_args(self.datastore.connection_config, self.where))
            async with conn, conn.transaction():
                return await work(conn, table, sql)
        except psycopg.Error as exc:
            detail = " ".join(str(exc).split())[:300]
            raise RunError(f"{self.where}: the summaries cache in Postgres table {self.table!r} failed: {detail}; "
                           "the table must exist with the transform's columns") from exc

    async def _expire(self, conn: Any, table: Any, sql: Any, now: float) -> None:
        if self.max_lifetime is not None:
            await conn.execute(sql.SQL("DELETE FROM {} WHERE %s - created_at > %s").format(table),
                               (now, self.max_lifetime))

    def _journaled(self) -> tuple[str | None, bool, Any]:
        if self.journal is None:
            return None, False, None
        key = self.journal.key("d")
        found, value = self.journal.recorded(key)
        return key, found, value

    async def aretrieve(self, key: str, now: float) -> dict[str, Any] | None:
        journal_key, found, value = self._journaled()
        if found:
            return dict(value) if value is not None else None
        key = self.conversation + key.removeprefix(CONVERSATION)

        async def work(conn: Any, table: Any, sql: Any) -> dict[str, Any] | None:
            await self._expire(conn, table, sql, now)
            cursor = await conn.execute(
                sql.SQL("SELECT {} FROM {} WHERE cache_key = %s ORDER BY created_at LIMIT 1").format(
                    sql.SQL(", ").join(sql.Identifier(column) for column in self.columns), table), (key,))
            row = await cursor.fetchone()
            if row is None:
                return None
            await conn.execute(sql.SQL("UPDATE {} SET last_used_at = %s WHERE cache_key = %s").format(table),
                               (now, key))
            return dict(zip(self.columns, row, strict=True))

        row: dict[str, Any] | None = await self._run(work)
        if row is not None:
            content = row.get("cache_content")
            prefix = row.get("prefix_size", 0)
            if (not isinstance(content, str) or len(content) > MAX_CONTENT_CHARS
                    or not isinstance(prefix, int) or prefix < 0):
                raise RunError(f"{self.where}: Postgres table {self.table!r} holds a row for this conversation whose "
                               f"cache_content is not a text of at most {MAX_CONTENT_CHARS} characters or whose "
                               "prefix_size is not a count")
            row = {name: (float(v) if name in ("created_at", "last_used_at") else v) for name, v in row.items()}
        if journal_key is not None and self.journal is not None:
            self.journal.record(journal_key, row)
        return row

    async def astore(self, key: str, content: dict[str, Any], now: float) -> None:
        journal_key, found, _ = self._journaled()
        if found:
            return
        key = self.conversation + key.removeprefix(CONVERSATION)
        row = {"cache_key": key, **content, "created_at": now, "last_used_at": now}

        async def work(conn: Any, table: Any, sql: Any) -> None:
            cursor = await conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table))
            counted = await cursor.fetchone()
            if self.max_size and counted is not None and counted[0] > self.max_size:
                await conn.execute(sql.SQL(
                    "DELETE FROM {0} WHERE cache_key = (SELECT cache_key FROM {0} ORDER BY last_used_at LIMIT 1)"
                ).format(table))
            await self._expire(conn, table, sql, now)
            await conn.execute(sql.SQL("INSERT INTO {} ({}) VALUES ({})").format(
                table, sql.SQL(", ").join(sql.Identifier(name) for name in row),
                sql.SQL(", ").join(sql.Placeholder() for _ in row)), list(row.values()))

        await self._run(work)
        if journal_key is not None and self.journal is not None:
            self.journal.record(journal_key, True)


def postgres_env_reads(document: Any) -> list[tuple[str, str]]:
    """(variable, what reads it) for each sensitive field of a Postgres connection config in a resolved
    document (a mapping), in document order; for what a bundle needs where it runs."""
    out: list[tuple[str, str]] = []
    for path, node in components_of(document):
        if node["component_type"] == "TlsPostgresDatabaseConnectionConfig":
            for field in ("user", "password", "sslkey"):
                value = node.get(field)
                name = c.env_reference(value) if isinstance(value, str) else None
                if name is not None:
                    label = f"TlsPostgresDatabaseConnectionConfig {node.get('name')!r}"
                    out.append((name, f"{field} of {label} at {path}"))
    return out
