"""A conversation keeps the release it began on, in-process: a server with sessions that swaps in a new
release (a followed tag moved) goes on running the sessions begun on the old one on the old one, new
sessions on the new one, and recovers the runs of either; a server that does not hold a session's
release (one started after the release) answers 409 release_retired, which a client meets by starting a
new session."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

import heddle
from heddle.format.trust import TrustPolicy
from heddle.server.app import build_app
from heddle.server.config import ServerConfig
from heddle.server.follow import open_edition
from heddle.server.served_bundle import open_served
from heddle.server.service import KEPT_RELEASES, Service
from heddle.settings import RunSettings
from tests.server.flows import one_tool_flow
from tests.support.flows import write_script

TRUST = TrustPolicy.from_names((), allow_unsigned=True)


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Releases 1 to KEPT_RELEASES + 2 of one agent, each answering its number."""
    root = tmp_path_factory.mktemp("releases")
    document = one_tool_flow("agent", "answer", outputs=("v",)).document()
    document["id"] = "agent-flow"
    flow = root / "agent.json"
    flow.write_text(json.dumps(document), encoding="utf-8")
    made = []
    for n in range(1, KEPT_RELEASES + 3):
        tools = root / f"tools-{n}"
        write_script(tools, "answer", f"#!/bin/sh\ncat >/dev/null\necho '{{\"v\": {n}}}'\n")
        made.append(Path(heddle.seal(flow, tools_dir=tools, release=n, output=root / f"v{n}.heddle").path))
    return made


def _service(tmp_path: Path, bundle: Path) -> Service:
    settings = RunSettings(session_store="sqlite", session_db=tmp_path / "sessions.db")
    config = ServerConfig(bundle=str(bundle), allow_unsigned=True, settings=settings)
    return Service(config, sealed=open_served(config, TRUST))


async def _turn(client: httpx.AsyncClient, sid: str) -> tuple[int, Any]:
    response = await client.post("/v1/runs", json={"session": sid, "inputs": {"x": "go"}})
    body = response.json()
    return response.status_code, body["outputs"]["v"] if response.status_code == 200 else body["error"]


def test_a_conversation_keeps_the_release_it_began_on_across_swaps(
        tmp_path: Path, releases: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    service = _service(tmp_path, releases[0])
    # A replica started after the releases, sharing the store: it holds only the last one.
    later = _service(tmp_path, releases[-1])

    async def main() -> None:
        try:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(service)),
                                         base_url="http://127.0.0.1") as client, \
                    httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(later)),
                                      base_url="http://127.0.0.1") as elsewhere:
                began: list[str] = []
                for n, bundle in enumerate(releases, start=1):
                    if n > 1:
                        service.swap(open_edition(service.config, TRUST, service, bundle, f"sha256:{n}"))
                    sid = (await client.post("/v1/sessions")).json()["session"]
                    assert await _turn(client, sid) == (200, n)
                    began.append(sid)
                # Every conversation goes on on its own release while the server keeps it: the last
                # KEPT_RELEASES before the one served; the oldest was let go.
                answers = [await _turn(client, sid) for sid in began]
                assert answers[1:] == [(200, n) for n in range(2, len(releases) + 1)], answers
                status, error = answers[0]
                assert status == 409 and error["type"] == "release_retired", answers[0]
                assert began[0] in error["message"] and "POST /v1/sessions" in error["message"]
                # Recovery finishes a run of a kept release, and leaves one of a release let go.
                sealed = [open_served(ServerConfig(bundle=str(b), allow_unsigned=True), TRUST) for b in releases]
                try:
                    assert [service.runs_release(s.digest) for s in sealed] == [False, True, True, True]
                finally:
                    from heddle.server.served_bundle import close_served

                    for s in sealed:
                        close_served(s)
                # A replica that never held the release: the same documented answer, nothing run.
                status, error = await _turn(elsewhere, began[1])
                assert status == 409 and error["type"] == "release_retired", error
                assert await _turn(elsewhere, began[-1]) == (200, len(releases))
                summary = (await client.get(f"/v1/sessions/{began[1]}")).json()
                assert summary["turns"] == 2, summary
        finally:
            await later.aclose()
            await service.aclose()

    asyncio.run(main())


def test_without_sessions_a_swapped_out_release_is_closed_once_its_runs_end(
        tmp_path: Path, releases: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    config = ServerConfig(bundle=str(releases[0]), allow_unsigned=True)
    service = Service(config, sealed=open_served(config, TRUST))

    async def main() -> None:
        try:
            first = service.edition
            service.swap(open_edition(config, TRUST, service, releases[1], "sha256:2"))
            assert not service._kept and not service.runs_release(first.core.digest)
            for _ in range(100):
                if first not in service._retired:
                    break
                await asyncio.sleep(0.01)
            assert first not in service._retired, "the old release was never closed"
        finally:
            await service.aclose()

    asyncio.run(main())


class _Tag:
    """A followed tag standing on `now`, a local file; its digest is its name."""

    reference = "oci://registry.test/agent:prod"

    def __init__(self, service: Service, files: dict[str, Path], now: str) -> None:
        self.service, self.files, self.now, self.checks = service, files, now, 0

    def check(self) -> str:
        self.checks += 1
        return self.now

    def pull(self, digest: str) -> Any:
        return open_edition(self.service.config, TRUST, self.service, self.files[digest], digest)


def test_a_replica_that_has_not_looked_yet_pulls_the_release_a_session_began_on(
        tmp_path: Path, releases: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.server.follow import Follower

    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    ahead, behind = _service(tmp_path, releases[1]), _service(tmp_path, releases[0])
    # The tag moved to release 2, which `ahead` serves; `behind` would look again only in an hour.
    tag = _Tag(behind, {"sha256:1": releases[0], "sha256:2": releases[1]}, "sha256:2")
    behind.follower = Follower(behind, tag, interval=3600, digest="sha256:1")

    async def main() -> None:
        try:
            behind.follower.start()
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(ahead)),
                                         base_url="http://127.0.0.1") as first, \
                    httpx.AsyncClient(transport=httpx.ASGITransport(app=build_app(behind)),
                                      base_url="http://127.0.0.1") as second:
                old = (await second.post("/v1/sessions")).json()["session"]
                assert await _turn(second, old) == (200, 1)
                sid = (await first.post("/v1/sessions")).json()["session"]
                other = (await first.post("/v1/sessions")).json()["session"]
                assert await _turn(first, sid) == (200, 2)
                assert tag.checks == 0
                # Their next turns reach the replica still on release 1 at once: it looks at the tag now (once;
                # the second waits for that look), swaps, and runs both turns on release 2; release 1 stays
                # for the conversation begun on it.
                assert await asyncio.gather(_turn(second, sid), _turn(second, other)) == [(200, 2), (200, 2)]
                assert tag.checks == 1 and behind.follower.digest == "sha256:2"
                assert await _turn(second, old) == (200, 1)
        finally:
            behind.follower.stop()
            await behind.follower.wait_stopped()
            await behind.aclose()
            await ahead.aclose()

    asyncio.run(main())
