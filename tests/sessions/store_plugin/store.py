"""A store plugin written with heddle.plugin: sessions in a sqlite file (the settings' `path`).

The compare-and-swap is one UPDATE ... WHERE version = ?, so several heddle processes, each with
its own process of this plugin, share the file safely."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

from heddle.plugin import Plugin, SessionExists, SessionMissing, StoredSession, VersionConflict


class SqliteBackend:
    def __init__(self, config: dict[str, Any]) -> None:
        self.db = sqlite3.connect(config["path"], timeout=30, isolation_level=None, check_same_thread=False)
        self.lock = threading.Lock()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS sessions "
                        "(id TEXT PRIMARY KEY, version INTEGER NOT NULL, data TEXT NOT NULL, updated REAL NOT NULL)")

    def get(self, session_id: str) -> StoredSession | None:
        row = self.db.execute("SELECT version, data, updated FROM sessions WHERE id = ?", (session_id,)).fetchone()
        return None if row is None else StoredSession(session_id, row[0], row[1], row[2])

    def create(self, session_id: str, data: str) -> StoredSession:
        now = time.time()
        cur = self.db.execute("INSERT INTO sessions VALUES (?, 1, ?, ?) ON CONFLICT (id) DO NOTHING",
                              (session_id, data, now))
        if cur.rowcount != 1:
            raise SessionExists(session_id)
        return StoredSession(session_id, 1, data, now)

    def replace(self, session_id: str, data: str, version: int) -> StoredSession:
        now = time.time()
        cur = self.db.execute("UPDATE sessions SET data = ?, version = version + 1, updated = ? "
                              "WHERE id = ? AND version = ?", (data, now, session_id, version))
        if cur.rowcount == 1:
            return StoredSession(session_id, version + 1, data, now)
        row = self.db.execute("SELECT version FROM sessions WHERE id = ?", (session_id,)).fetchone()
        if row is None:
            raise SessionMissing(session_id)
        raise VersionConflict(row[0])

    def delete(self, session_id: str) -> bool:
        return self.db.execute("DELETE FROM sessions WHERE id = ?", (session_id,)).rowcount == 1

    def list(self) -> list[StoredSession]:
        rows = self.db.execute("SELECT id, version, data, updated FROM sessions").fetchall()
        return [StoredSession(*row) for row in rows]


plugin = Plugin()
plugin.store("SqliteSessions", SqliteBackend)

if __name__ == "__main__":
    plugin.serve()
