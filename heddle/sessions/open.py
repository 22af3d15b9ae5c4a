"""Opening the session store a `--session-store` spec names, and the names sessions may have."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from heddle.errors import UsageError
from heddle.sessions.seal import SealedStore, session_key
from heddle.sessions.store import SessionStore, check_session_id

if TYPE_CHECKING:
    from heddle.plugin_host.host import PluginHost
    from heddle.plugin_host.manifest import PluginManifest

__all__ = ["STORE_SPECS", "check_session_id", "new_session_id", "open_store"]

STORE_SPECS = "sqlite, file, postgres://... (or postgresql://...), or plugin:NAME"

# 24 bytes: 192 random bits, well over the 128 a session id the server issues must carry.
_ID_BYTES = 24


def new_session_id() -> str:
    """A fresh session id for the server to issue: unguessable, and a valid session name."""
    while True:
        token = secrets.token_urlsafe(_ID_BYTES)
        # A leading '-' would read as an option on a command line (1 in 64 tokens); drawing again
        # costs less than a bit of the 192.
        if not token.startswith("-"):
            return check_session_id(token)


def open_store(spec: str, *, db: Path | None = None, directory: Path | None = None,
               plugins: PluginHost | Sequence[PluginManifest] | None = None, key_file: Path | None = None,
               environ: Mapping[str, str] | None = None) -> SealedStore:
    """The store `spec` names, opened and reachable (StoreUnavailable, one line, otherwise; a plugin's
    store starts its process on its first call, or `await store.open()`), its records
    sealed under the session key (heddle.sessions.seal: `key_file`, else $HEDDLE_SESSION_KEY in
    `environ`, by default the process's, else for sqlite and file heddle's own key file; a store
    without a key is refused before it is opened).

    `db` is the sqlite file (default: heddle.sessions.sqlite.default_session_db()), `directory`
    the file store's folder (default: heddle.sessions.files.default_session_dir()), `plugins`
    the loaded plugins (a PluginHost, whose --plugin-config settings the store gets, or manifests)
    a `plugin:NAME` store may come from: NAME is a store component's componentType, or the name
    of a plugin with one store component."""
    if not spec.startswith(("postgres://", "postgresql://", "plugin:")) and spec not in ("sqlite", "file"):
        _unknown(spec)
    key = session_key(spec, key_file, os.environ if environ is None else environ)
    return SealedStore(_raw_store(spec, db=db, directory=directory, plugins=plugins), key)


def _raw_store(spec: str, *, db: Path | None, directory: Path | None,
               plugins: PluginHost | Sequence[PluginManifest] | None) -> SessionStore:
    # Only the chosen store's module is imported: postgres's needs an extra (psycopg) the others do not.
    if spec == "sqlite":
        from heddle.sessions.sqlite import SqliteStore, default_session_db

        return SqliteStore(db if db is not None else default_session_db())
    if spec == "file":
        from heddle.sessions.files import FileStore, default_session_dir

        return FileStore(directory if directory is not None else default_session_dir())
    if spec.startswith(("postgres://", "postgresql://")):
        from heddle.sessions.postgres import PostgresStore

        return PostgresStore(spec)
    if spec.startswith("plugin:"):
        from heddle.sessions.plugin_store import open_plugin_store

        return open_plugin_store(spec.removeprefix("plugin:"), plugins)
    _unknown(spec)


def _unknown(spec: str) -> NoReturn:
    shown = spec.split("://", 1)[0] + "://..." if "://" in spec else spec  # never echo a password
    raise UsageError(f"--session-store {shown!r} is not a session store; give {STORE_SPECS}")
