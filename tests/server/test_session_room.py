"""POST /v1/sessions, in-process (httpx.ASGITransport): refused while the server drains, as a run is,
and its room under --max-sessions counted from a page of the store's index, never the whole of it."""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from heddle.server.config import ServerConfig
from heddle.server.service import Service
from heddle.server.sessions import Expiring
from heddle.settings import RunSettings
from tests.server.support import in_process


def serve(tmp_path: Path, test: Callable[[httpx.AsyncClient, Service], Awaitable[None]], **config: Any) -> None:
    settings = RunSettings(session_store="sqlite", session_db=tmp_path / "sessions.db")
    service = Service(ServerConfig(settings=settings, **config))
    in_process(service, lambda client: test(client, service))


def stored(tmp_path: Path) -> list[str]:
    with sqlite3.connect(tmp_path / "sessions.db") as conn:
        return sorted(r[0] for r in conn.execute("SELECT id FROM heddle_sessions"))


def test_a_draining_server_issues_no_session(tmp_path: Path) -> None:
    async def test(client: httpx.AsyncClient, service: Service) -> None:
        service.admission.start_draining()
        response = await client.post("/v1/sessions")
        assert response.status_code == 503, response.text
        assert response.json()["error"]["type"] == "draining"
        assert "new sessions" in response.json()["error"]["message"]
        assert response.headers["retry-after"] == "1"
        assert stored(tmp_path) == []

    serve(tmp_path, test)


def test_the_room_for_a_session_is_counted_without_listing_every_session(tmp_path: Path) -> None:
    async def test(client: httpx.AsyncClient, service: Service) -> None:
        assert isinstance(service.sessions, Expiring)
        store = service.sessions.store

        async def whole_index() -> Any:
            raise AssertionError("the whole index was read")

        store.index = whole_index  # type: ignore[method-assign]
        made = [(await client.post("/v1/sessions")).json()["session"] for _ in range(3)]
        full = await client.post("/v1/sessions")
        assert full.status_code == 507 and full.json()["error"]["type"] == "too_many_sessions", full.text
        with sqlite3.connect(tmp_path / "sessions.db") as conn:
            conn.execute("UPDATE heddle_sessions SET updated = updated - 7200 WHERE id = ?", (made[0],))
        fourth = await client.post("/v1/sessions")  # the expired one is removed to make room
        assert fourth.status_code == 201, fourth.text
        assert stored(tmp_path) == sorted([*made[1:], fourth.json()["session"]])

    serve(tmp_path, test, max_sessions=3, session_idle_timeout=3600.0)
