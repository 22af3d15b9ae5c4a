"""The session stores, one suite for every backend: sqlite, file, Postgres and a plugin's store
(tests/sessions/store_plugin, written with heddle.plugin) behave alike."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from heddle.errors import (
    SessionConflict,
    SessionError,
    SessionNotFound,
    SessionTooLarge,
    StoreUnavailable,
    UsageError,
)
from heddle.sessions.open import check_session_id, new_session_id, open_store
from heddle.sessions.store import MAX_SESSION_BYTES, SessionStore
from tests.sessions.support import SESSION_KEY, STORE_PLUGIN, Synced, store_options, synced
from tests.support.postgres import fresh_schema

KINDS = ["sqlite", "file", "postgres", "plugin"]
KEYED = {"HEDDLE_SESSION_KEY": SESSION_KEY}


def _where(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """The spec of a fresh, empty store of `kind`, and where it keeps its data (as JSON can say)."""
    if kind == "postgres":
        return fresh_schema(request.getfixturevalue("postgres_dsn")), {}
    if kind == "sqlite":
        return "sqlite", {"db": str(tmp_path / "data" / "sessions.db")}
    if kind == "file":
        return "file", {"directory": str(tmp_path / "data" / "sessions")}
    return "plugin:SqliteSessions", {"plugin": str(STORE_PLUGIN), "path": str(tmp_path / "plugin.db")}


Opened = tuple[Synced, str, dict[str, str]]


@pytest.fixture(params=KINDS)
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    spec, where = _where(request.param, tmp_path, request)
    store = synced(spec, **store_options(where))
    try:
        yield store, spec, where
    finally:
        store.close()


@pytest.fixture
def store(opened: Opened) -> Synced:
    return opened[0]


def test_create_get_replace_delete_list(store: Synced) -> None:
    first = store.create("chat-1", b'{"turn":1}')
    assert (first.id, first.version, first.data) == ("chat-1", 1, b'{"turn":1}')
    assert store.get("chat-1") == first
    second = store.replace("chat-1", b'{"turn":2}', version=1)
    assert (second.version, second.data) == (2, b'{"turn":2}')
    assert second.updated >= first.updated
    assert store.get("chat-1") == second
    store.create("chat-2", b'{"other":true}')
    store.replace("chat-1", b'{"turn":3}', version=2)
    # most recently written first
    assert [(s.id, s.version) for s in store.list()] == [("chat-1", 3), ("chat-2", 1)]
    assert store.delete("chat-1") is True
    assert store.get("chat-1") is None
    assert store.delete("chat-1") is False
    assert [s.id for s in store.list()] == ["chat-2"]
    # a removed name can be used again, from version 1
    assert store.create("chat-1", b"{}").version == 1


def test_records_come_back_byte_for_byte(store: Synced) -> None:
    data = json.dumps({"text": 'quote " back\\slash }\n{ "record":', "é": "ünï", "n": [1.5, None]},
                      ensure_ascii=False).encode()
    store.create("exact", data)
    got = store.get("exact")
    assert got is not None and got.data == data
    assert store.list()[0].data == data


def test_two_writers_at_one_version_one_wins(store: Synced) -> None:
    store.create("race", b'{"turn":1}')
    seen_a, seen_b = store.get("race"), store.get("race")
    assert seen_a is not None and seen_b is not None
    store.replace("race", b'{"turn":"a"}', version=seen_a.version)
    with pytest.raises(SessionConflict) as caught:
        store.replace("race", b'{"turn":"b"}', version=seen_b.version)
    message = str(caught.value)
    assert "\n" not in message and store.name in message and "'race'" in message and "it is now at 2" in message
    now = store.get("race")
    assert now is not None and (now.version, now.data) == (2, b'{"turn":"a"}')


def test_creating_a_taken_id_is_a_conflict(store: Synced) -> None:
    store.create("taken", b"{}")
    with pytest.raises(SessionConflict, match="already exists"):
        store.create("taken", b'{"x":1}')
    got = store.get("taken")
    assert got is not None and got.data == b"{}"


def test_missing_session(store: Synced) -> None:
    assert store.get("nobody-here") is None
    assert store.delete("nobody-here") is False
    with pytest.raises(SessionNotFound) as caught:
        store.replace("nobody-here", b"{}", version=1)
    assert store.name in str(caught.value) and "'nobody-here'" in str(caught.value)
    assert store.list() == []


def test_the_index_lists_ids_and_last_writes_without_records(store: Synced) -> None:
    assert store.index() == []
    store.create("one", b'{"n":1}')
    second = store.create("two", b'{"n":2}')
    store.replace("one", b'{"n":3}', version=1)
    index = dict(store.index())
    assert set(index) == {"one", "two"} and index["two"] == second.updated
    assert index["one"] == store.get("one").updated  # type: ignore[union-attr]
    store.delete("one")
    assert [sid for sid, _ in store.index()] == ["two"]


def test_the_index_pages_by_last_write_between_two_times(store: Synced) -> None:
    for n in range(5):
        store.create(f"s{n}", b'{"n":1}')
    every = sorted((updated, sid) for sid, updated in store.index())
    first, last = every[0][0], every[-1][0]

    def paged(since: float | None, until: float) -> list[str]:
        out: list[str] = []
        after = None
        while True:
            page = store.index_page(since=since, until=until, after=after, limit=2)
            assert len(page) <= 2
            out += [sid for sid, _ in page]
            if len(page) < 2:
                return out
            after = (page[-1][1], page[-1][0])

    assert paged(None, last) == [sid for _, sid in every]  # in order of (last write, id), each once
    assert paged(None, first - 1) == []
    assert paged(first, last) == [sid for updated, sid in every if updated > first]


def test_over_the_size_cap_nothing_is_written(store: Synced) -> None:
    big = b'"' + b"x" * (MAX_SESSION_BYTES - 1) + b'"'
    with pytest.raises(SessionTooLarge) as caught:
        store.create("big", big)
    assert store.name in str(caught.value) and "'big'" in str(caught.value)
    assert store.get("big") is None
    store.create("big", b"{}")
    with pytest.raises(SessionTooLarge):
        store.replace("big", big, version=1)
    got = store.get("big")
    assert got is not None and (got.version, got.data) == (1, b"{}")
    # right at the cap is allowed
    at_cap = big[:-2] + b'"'
    assert store.replace("big", at_cap, version=1).version == 2
    got = store.get("big")
    assert got is not None and got.data == at_cap


def test_session_names_are_checked(store: Synced) -> None:
    for bad in ("../escape", ".hidden", "-option", "a/b", "", "x" * 129, "sp ace", "new\nline"):
        with pytest.raises(SessionError, match="is not valid"):
            store.get(bad)
        with pytest.raises(SessionError, match="is not valid"):
            store.create(bad, b"{}")


def test_concurrent_calls_share_a_store(store: Synced) -> None:
    store.create("counter", b"0")

    async def increments(raw: SessionStore, times: int) -> None:
        for _ in range(times):
            while True:
                seen = await raw.get("counter")
                assert seen is not None
                try:
                    await raw.replace("counter", str(int(seen.data) + 1).encode(), version=seen.version)
                    break
                except SessionConflict:
                    continue

    async def all_of_them() -> None:
        await asyncio.gather(*(increments(store.store, 10) for _ in range(4)))

    store._loop.run_until_complete(all_of_them())
    got = store.get("counter")
    assert got is not None and (got.data, got.version) == (b"40", 41)


_RACER = """
import json, sys
from heddle.errors import SessionConflict
from tests.sessions.support import store_options, synced
spec, where, times = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
store = synced(spec, **store_options(where))
print("ready", flush=True)
sys.stdin.readline()  # both start together
conflicts = 0
for _ in range(times):
    while True:
        seen = store.get("shared")
        try:
            store.replace("shared", str(int(seen.data) + 1).encode(), version=seen.version)
            break
        except SessionConflict:
            conflicts += 1
print(conflicts, flush=True)
store.close()
"""


def test_two_processes_racing_on_one_session_lose_no_turn(opened: Opened) -> None:
    store, spec, where = opened
    store.create("shared", b"0")
    times = 40
    argv = [sys.executable, "-c", _RACER, spec, json.dumps(where), str(times)]
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    racers = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env) for _ in range(2)]
    for racer in racers:
        assert racer.stdout is not None and racer.stdout.readline().strip() == "ready"
    for racer in racers:
        assert racer.stdin is not None
        racer.stdin.write("go\n")
        racer.stdin.flush()
    for racer in racers:
        _, err = racer.communicate(timeout=60)
        assert racer.returncode == 0, err
    got = store.get("shared")
    assert got is not None and (got.data, got.version) == (str(2 * times).encode(), 2 * times + 1)


# ---------------------------------------------------------------- opening


def test_open_store_refuses_an_unknown_spec() -> None:
    with pytest.raises(UsageError, match="sqlite, file, postgres://"):
        open_store("mysql://root:hunter2@db/x")
    try:
        open_store("mysql://root:hunter2@db/x")
    except UsageError as exc:
        assert "hunter2" not in str(exc)


def test_session_ids_the_server_issues() -> None:
    ids = {new_session_id() for _ in range(200)}
    assert len(ids) == 200
    for session_id in ids:
        assert check_session_id(session_id) == session_id and len(session_id) == 32  # 192 bits, base64url


def test_check_session_id() -> None:
    for good in ("a", "chat-1", "A.b_c-9", "_x", "9" * 128):
        assert check_session_id(good) == good
    with pytest.raises(SessionError) as caught:
        check_session_id("../etc/passwd")
    assert "'../etc/passwd'" in str(caught.value) and "\n" not in str(caught.value)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_postgres_is_one_line_naming_it_without_the_password() -> None:
    dsn = f"postgresql://alice:s3cret-pw@127.0.0.1:{_free_port()}/sessions?connect_timeout=5"
    with pytest.raises(StoreUnavailable) as caught:
        open_store(dsn, environ=KEYED)
    message = str(caught.value)
    assert "\n" not in message and "s3cret-pw" not in message
    assert message.startswith("postgres postgresql://alice:***@127.0.0.1:") and "cannot connect" in message
    # libpq quotes a DSN it cannot parse: the password is taken out of that too
    with pytest.raises(StoreUnavailable) as caught:
        open_store("postgresql://alice:s3cret-pw@[::1/sessions", environ=KEYED)
    assert "s3cret-pw" not in str(caught.value) and "is not a valid Postgres DSN" in str(caught.value)


def test_an_unusable_sqlite_path_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("not a folder")
    with pytest.raises(UsageError) as refused:
        open_store("sqlite", db=tmp_path / "plain" / "sessions.db")
    assert str(refused.value) == (f"folder of the sessions file {tmp_path / 'plain'}: {tmp_path / 'plain'} is a file, "
                                  "not a folder; point --session-db at a folder")
    (tmp_path / "junk.db").write_bytes(b"this is not sqlite, it is long enough to be read as a header" * 20)
    with pytest.raises(StoreUnavailable, match=r"junk\.db"):
        open_store("sqlite", db=tmp_path / "junk.db")
    with pytest.raises(StoreUnavailable, match="not a regular file"):
        open_store("sqlite", db=tmp_path)


def test_the_default_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.sessions.files import default_session_dir
    from heddle.sessions.sqlite import default_session_db

    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_session_db() == tmp_path / "xdg" / "heddle" / "sessions.db"
    assert default_session_dir() == tmp_path / "xdg" / "heddle" / "sessions"
    monkeypatch.setenv("XDG_DATA_HOME", "relative/ignored")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_session_db() == tmp_path / "home" / ".local" / "share" / "heddle" / "sessions.db"
    store = synced("sqlite")
    store.close()
    assert stat.S_IMODE((tmp_path / "home" / ".local" / "share" / "heddle").stat().st_mode) == 0o700


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_sqlite_is_private_and_in_wal_mode(tmp_path: Path) -> None:
    import sqlite3

    old = os.umask(0o022)
    try:
        store = synced("sqlite", db=tmp_path / "new" / "sessions.db")
        store.create("s", b"{}")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "new") == 0o700 and _mode(tmp_path / "new" / "sessions.db") == 0o600
    for extra in ("sessions.db-wal", "sessions.db-shm"):
        if (tmp_path / "new" / extra).exists():
            assert _mode(tmp_path / "new" / extra) == 0o600
    with sqlite3.connect(tmp_path / "new" / "sessions.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


# ---------------------------------------------------------------- the file store's files


def test_file_store_layout_is_readable_and_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = synced("file", directory=tmp_path / "new" / "sessions")
        store.create("chat", b'{"messages":[]}')
        store.replace("chat", b'{"messages":["hi"]}', version=1)
    finally:
        os.umask(old)
    folder = tmp_path / "new" / "sessions"
    assert _mode(tmp_path / "new") == 0o700 and _mode(folder) == 0o700
    assert sorted(p.name for p in folder.iterdir()) == ["chat.json", "chat.lock"]  # no temporary file is left
    assert _mode(folder / "chat.json") == 0o600 and _mode(folder / "chat.lock") == 0o600
    held = json.loads((folder / "chat.json").read_text())
    # The record as written, sealed (heddle.sessions.seal).
    assert held["id"] == "chat" and held["version"] == 2 and held["record"]["record"] == {"messages": ["hi"]}
    assert held["record"]["mac"].startswith("hmac-sha256:")
    assert isinstance(held["updated"], float)
    store.delete("chat")
    assert list(folder.iterdir()) == []
    store.close()


def test_file_store_never_follows_a_link_or_reads_a_special_file(tmp_path: Path) -> None:
    folder = tmp_path / "sessions"
    store = synced("file", directory=folder)
    outside = tmp_path / "outside.json"
    outside.write_text('{"id":"linked","version":1,"updated":1.0,"record":{}}\n')
    (folder / "linked.json").symlink_to(outside)
    for attempt in (lambda: store.get("linked"), lambda: store.replace("linked", b"{}", version=1),
                    lambda: store.delete("linked"), store.list):
        with pytest.raises(StoreUnavailable, match=r"linked\.json is a symbolic link"):
            attempt()
    assert outside.read_text().startswith('{"id":"linked"')
    (folder / "linked.json").unlink()
    # a link planted as the lock file is not followed either
    (folder / "locked.lock").symlink_to(tmp_path / "elsewhere.lock")
    with pytest.raises(StoreUnavailable, match=r"locked\.lock is a symbolic link"):
        store.create("locked", b"{}")
    assert not (tmp_path / "elsewhere.lock").exists() and not (folder / "locked.json").exists()
    os.mkfifo(folder / "pipe.json")
    with pytest.raises(StoreUnavailable, match=r"pipe\.json is a FIFO"):
        store.get("pipe")
    (folder / "pipe.json").unlink()
    (folder / "dir.json").mkdir()
    with pytest.raises(StoreUnavailable, match=r"dir\.json is a directory"):
        store.get("dir")
    store.close()


def test_file_store_refuses_a_damaged_or_misplaced_file(tmp_path: Path) -> None:
    store = synced("file", directory=tmp_path)
    store.create("whole", b'{"a":1}')
    text = (tmp_path / "whole.json").read_bytes()
    (tmp_path / "cut.json").write_bytes(text[:-5])
    with pytest.raises(StoreUnavailable, match=r"cut\.json is not a session file heddle wrote"):
        store.get("cut")
    (tmp_path / "moved.json").write_bytes(text)
    with pytest.raises(StoreUnavailable, match=r"moved\.json holds session 'whole'"):
        store.get("moved")
    # files that are no session's are not listed
    (tmp_path / "cut.json").unlink()
    (tmp_path / "moved.json").unlink()
    (tmp_path / ".hidden.json").write_text("{}")
    (tmp_path / "notes.txt").write_text("hello")
    assert [s.id for s in store.list()] == ["whole"]
    store.close()


# ---------------------------------------------------------------- Postgres


def test_two_postgres_stores_set_up_one_new_table_at_once(postgres_dsn: str) -> None:
    from heddle.sessions.postgres import PostgresStore

    dsn = fresh_schema(postgres_dsn)
    opened: list[PostgresStore] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def start() -> None:
        barrier.wait()
        try:
            opened.append(PostgresStore(dsn))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=start) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors
    stores = [Synced(s) for s in opened]
    stores[0].create("one", b"{}")
    assert [s.id for s in stores[1].list()] == ["one"]
    for s in stores:
        s.close()


def test_postgres_reads_survive_a_dropped_connection(postgres_dsn: str) -> None:
    import psycopg

    store = synced(fresh_schema(postgres_dsn), environ=KEYED)
    store.create("kept", b'{"k":1}')
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'")
    got = store.get("kept")
    assert got is not None and got.data == b'{"k":1}'
    assert store.replace("kept", b'{"k":2}', version=1).version == 2
    store.close()
    with pytest.raises(StoreUnavailable, match="closed"):
        store.get("kept")


def test_postgres_claim_skips_a_row_another_taker_holds(postgres_dsn: str) -> None:
    import psycopg

    dsn = fresh_schema(postgres_dsn)
    store = synced(dsn, environ=KEYED)
    store.create("left", b'{"run":"of a replica that died"}')
    with psycopg.connect(dsn) as other:  # another replica, taking the run over at this moment
        other.execute("SELECT 1 FROM heddle_sessions WHERE id = 'left' FOR UPDATE")
        with pytest.raises(SessionConflict, match="is being taken over by another server"):
            store.claim("left", b'{"run":"mine"}', version=1)  # refused at once, not after the other's commit
    with pytest.raises(SessionConflict, match="it was at version 2, it is now at 1"):
        store.claim("left", b'{"run":"mine"}', version=2)
    with pytest.raises(SessionNotFound):
        store.claim("nobody", b"{}", version=1)
    assert store.claim("left", b'{"run":"mine"}', version=1).version == 2
    got = store.get("left")
    assert got is not None and got.data == b'{"run":"mine"}'
    store.close()


def test_a_file_store_refuses_a_file_larger_than_any_it_writes(tmp_path: Path) -> None:
    from heddle.sessions.files import MAX_STEPS_FILE_BYTES, STEPS_SUFFIX, SUFFIX

    store = synced("file", directory=tmp_path / "sessions", environ={"HEDDLE_SESSION_KEY": SESSION_KEY})
    try:
        store.create("s", b"{}")
        (tmp_path / "sessions" / f"s{SUFFIX}").write_bytes(b"x" * (MAX_SESSION_BYTES + 1024))
        with pytest.raises(StoreUnavailable, match=r"s\.json is over \d+ bytes, larger than any session heddle"):
            store.get("s")
        (tmp_path / "sessions" / f"t{STEPS_SUFFIX}").write_bytes(b"x" * (MAX_STEPS_FILE_BYTES + 1))
        with pytest.raises(StoreUnavailable, match=r"t\.steps is over \d+ bytes, more than a run's steps"):
            store.steps("t", 0)
    finally:
        store.close()
