"""Where the surfaces meet the server (in-process, the app through ASGI): a surface's route must be one the
guard and the access log know; a conversation's handle names the turn its own call wrote; a streamed
Responses run stops as soon as its client leaves, as a /v1/runs stream does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Mount

import heddle
from heddle.format.keys import generate
from heddle.format.trust import TrustPolicy
from heddle.server.app import build_app
from heddle.server.config import ServerConfig
from heddle.server.served_bundle import open_served
from heddle.server.service import Service
from heddle.server.surfaces import responses
from heddle.server.surfaces.agent import ServedAgent
from heddle.settings import RunSettings
from tests.server.flows import write_tools
from tests.support.flows import llm_config, server_tool
from tests.support.threaded_model import ThreadedModel, threaded_model

BASE = "http://127.0.0.1"


@pytest.fixture(scope="module")
def model() -> Any:
    with threaded_model([]) as served:
        yield served


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory, model: ThreadedModel) -> tuple[Path, Path, Path]:
    """An agent whose one tool, `slow`, says it started and then takes a minute; the bundle, its key and
    the file the tool writes its pid to."""
    root = tmp_path_factory.mktemp("seams")
    started = root / "started"
    tools = write_tools(root / "tools", {"slow": f"#!/bin/sh\ncat >/dev/null\necho $$ >> {started}\nsleep 60\n"})
    doc = {"component_type": "Agent", "agentspec_version": "26.1.0", "id": "waiter", "name": "waiter",
           "description": "Takes its time.", "llm_config": llm_config(model.url), "system_prompt": "You help.",
           "tools": [server_tool("slow", [], ["done"])]}
    flow = root / "waiter.json"
    flow.write_text(json.dumps(doc))
    key = generate(root / "me", None)
    sealed = heddle.seal(flow, tools_dir=tools, sign_key=key.private_path, output=root / "waiter.heddle").path
    return Path(sealed), key.public_path, started


def served(bundle: tuple[Path, Path, Path], tmp_path: Path) -> Service:
    settings = RunSettings(session_store="sqlite", session_db=tmp_path / "sessions.db")
    config = ServerConfig(bundle=str(bundle[0]), trust=(bundle[1],), settings=settings)
    return Service(config, sealed=open_served(config, TrustPolicy.from_names((bundle[1],), allow_unsigned=False)))


def test_a_surface_route_the_guard_cannot_read_is_refused_loudly(bundle: tuple[Path, Path, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    service = served(bundle, tmp_path)
    monkeypatch.setattr(responses, "routes", lambda service: [Mount("/v1/responses", app=lambda *a: None)])
    try:
        with pytest.raises(TypeError, match="Mount"):
            build_app(service)
    finally:
        asyncio.run(service.aclose())


def test_a_handle_names_the_version_its_own_turn_wrote(bundle: tuple[Path, Path, Path], model: ThreadedModel,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service = served(bundle, tmp_path)
    written: list[int] = []
    plain_run = ServedAgent._run

    async def another_turn_lands(self: ServedAgent, body: dict[str, Any], on_event: Any) -> Any:
        # The turn is written; before its caller reads anything, another write of the session lands.
        outcome = await plain_run(self, body, on_event)
        store: Any = service.sessions
        got = await store.get(body["session"])
        written.append(got.version)
        await store.replace(body["session"], got.data, version=got.version)
        return outcome

    monkeypatch.setattr(ServedAgent, "_run", another_turn_lands)

    async def main() -> None:
        try:
            model.app.script = [{"content": "Hello."}]
            model.app.requests.clear()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(service)), base_url=BASE,
                                         timeout=30) as http:
                answer = await http.post("/v1/responses", json={"model": "waiter", "input": "Hi"})
                assert answer.status_code == 200, answer.text
                rid = answer.json()["id"]
                version = rid.removeprefix(responses.RESPONSE_PREFIX).split(".")[2]
                assert int(version) == written[0]
                # So the handle is not that of the latest turn, and continuing from it is refused.
                again = await http.post("/v1/responses", json={"model": "waiter", "input": "And?",
                                                               "previous_response_id": rid})
                assert again.status_code == 409 and again.json()["error"]["code"] == "not_latest"
        finally:
            await service.aclose()

    asyncio.run(main())


def test_a_streamed_response_stops_its_run_when_the_client_leaves(bundle: tuple[Path, Path, Path],
                                                                   model: ThreadedModel, tmp_path: Path) -> None:
    """Under a server of ASGI 2.4 (which does not itself watch a streaming response's client), too: the
    run is cancelled while its tool runs, without waiting for another frame to write."""
    service = served(bundle, tmp_path)
    started = bundle[2]
    started.unlink(missing_ok=True)
    app = build_app(service)
    body = json.dumps({"model": "waiter", "input": "Go", "stream": True}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/responses", "raw_path": b"/v1/responses",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode())]}

    async def main() -> None:
        calling = asyncio.Event()
        sent: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            sent.append(message.get("body", b""))
            if b'"mcp_call"' in message.get("body", b""):
                calling.set()

        messages = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if messages:
                return messages.pop(0)
            await calling.wait()
            while not started.exists():  # the tool is running
                await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

        try:
            model.app.script = [{"tool_calls": [{"name": "slow", "arguments": {}}]}, {"content": "Done."}]
            model.app.requests.clear()
            # The run ends with the client's leaving, long before the tool's minute.
            await asyncio.wait_for(app(scope, receive, send), timeout=30)
            assert service.admission.active == 0
            assert not any(b"response.completed" in chunk for chunk in sent)
        finally:
            await service.aclose()

    asyncio.run(main())
    pid = int(started.read_text().split()[0])
    with pytest.raises(ProcessLookupError):
        import os

        os.kill(pid, 0)


def test_what_every_run_route_shares_has_a_public_home() -> None:
    """The client-left watcher, the answer of a failed or stopped run and the keep-alive period that /v1/runs and
    every surface use."""
    from heddle.errors import MissingInputError
    from heddle.server import sse
    from heddle.server.body import disconnected
    from heddle.server.errors import CANCELLED, ApiError, run_failure

    assert run_failure(ApiError(409, "not_latest", "later"))[0] == 409
    status, body = run_failure(MissingInputError("x is missing"))
    assert status == 400 and body["error"]["message"] == "x is missing"
    assert run_failure(RuntimeError("boom"))[0] == 500
    assert CANCELLED[0] == 503 and CANCELLED[1]["error"]["type"] == "cancelled"
    assert sse.KEEPALIVE_S > 0

    async def leaves() -> None:
        messages = [{"type": "http.request", "body": b""}, {"type": "http.disconnect"}]

        async def receive() -> dict[str, Any]:
            return messages.pop(0)

        await asyncio.wait_for(disconnected(receive), timeout=5)
        assert not messages

    asyncio.run(leaves())
