"""A server that follows a tag, in-process: the swap between requests and the refusal of a digest
that does not verify, with local bundle files standing for what a registry serves (the app through
httpx.ASGITransport). tests/server/test_registry_follow.py moves a real registry's tag under a
real `heddle-server --pull-interval`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import heddle
from heddle.format.keys import generate
from heddle.format.trust import TrustPolicy
from heddle.server.app import build_app
from heddle.server.config import ServerConfig, check_config
from heddle.server.edition import Edition
from heddle.server.follow import Follower, open_edition
from heddle.server.served_bundle import open_served
from heddle.server.service import Service
from tests.server.flows import one_tool_flow
from tests.server.support import metric
from tests.support.flows import FlowDoc, write_script

DEADLINE_S = 20.0


def _tool(version: int, gate: Path | None) -> str:
    # The v1 tool waits for `gate` (polling, never past the deadline) so a run can be held in flight.
    wait = (f"i=0; while [ ! -e {gate} ] && [ $i -lt 2000 ]; do sleep 0.01; i=$((i+1)); done\n"
            if gate is not None else "")
    return f"#!/bin/sh\ncat >/dev/null\n{wait}echo '{{\"v\": {version}}}'\n"


@dataclass
class Bundles:
    v1: Path
    v2: Path
    untrusted: Path
    pub: Path
    gate: Path
    seed: Path


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> Bundles:
    root = tmp_path_factory.mktemp("follow")
    gate = root / "gate"
    mine, theirs = generate(root / "me", None), generate(root / "them", None)
    seed = root / "state"
    seed.mkdir()
    (seed / "note").write_text("seeded\n")
    made = {}
    for name, version, key, held in (("v1", 1, mine, True), ("v2", 2, mine, False), ("untrusted", 3, theirs, False)):
        tools = root / f"tools-{name}"
        write_script(tools, "answer", _tool(version, gate if held else None))
        flow = _same_agent(one_tool_flow("agent", "answer", outputs=("v",)), root / f"{name}.json")
        # An rw mount: opening seeds it into a temporary data folder, the resource a swap must keep
        # until the last run on the old bundle ends.
        made[name] = heddle.seal(flow, tools_dir=tools, input={"x": 0}, sign_key=key.private_path,
                                 mounts=[f"{seed}:state:rw"], output=root / f"{name}.heddle").path
    return Bundles(made["v1"], made["v2"], made["untrusted"], mine.public_path, gate, seed)


def _same_agent(doc: FlowDoc, path: Path, flow_id: str = "agent-flow") -> Path:
    """The flow written with a fixed id: each version of one agent keeps its id, as a followed tag needs."""
    document = doc.document()
    document["id"] = flow_id
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@dataclass
class FakeTag:
    """A registry tag that names one of the local files; digests are their names."""

    files: dict[str, Path]
    now: str = "sha256:v1"
    checks: int = 0
    pulls: list[str] = field(default_factory=list)
    reference: str = "oci://registry.test/agent:prod"
    make: Callable[[Path, str], Edition] | None = None

    def check(self) -> str:
        self.checks += 1
        return self.now

    def pull(self, digest: str) -> Edition:
        self.pulls.append(digest)
        assert self.make is not None
        return self.make(self.files[digest], digest)


async def poll(what: Callable[[], Awaitable[bool]], why: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not await what():
        assert time.monotonic() < deadline, why
        await asyncio.sleep(0.01)


def test_a_swap_keeps_runs_in_flight_on_their_bundle_and_refuses_one_that_does_not_verify(
        tmp_path: Path, bundles: Bundles, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    trust = TrustPolicy.from_names((bundles.pub,), allow_unsigned=False)
    config = ServerConfig(bundle=str(bundles.v1), trust=(bundles.pub,))
    service = Service(config, sealed=open_served(config, trust))
    tag = FakeTag({"sha256:v2": bundles.v2, "sha256:bad": bundles.untrusted})
    tag.make = lambda path, digest: open_edition(config, trust, service, path, digest)
    service.follower = Follower(service, tag, interval=0.01, digest="sha256:v1")
    first = service.edition
    old_data = first.sealed.data_dir
    assert old_data is not None and old_data.exists()

    async def main() -> None:
        transport = httpx.ASGITransport(app=build_app(service))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=DEADLINE_S) as client:
            held = asyncio.create_task(client.post("/v1/runs", json={"inputs": {"x": 1}}))
            await poll(lambda: _no(service.admission.active == 1), "the held run never started")
            service.follower.start()
            await poll(lambda: _no(tag.checks >= 2), "the follower never checked the tag")
            assert tag.pulls == [], "the digest served is never pulled again"
            tag.now = "sha256:v2"
            await poll(lambda: _no(service.edition is not first), "v2 was never swapped in")
            # The next run gets v2 while the held one is still in flight on v1, whose data folder stays.
            response = await client.post("/v1/runs", json={"inputs": {"x": 1}})
            assert response.json()["outputs"] == {"v": 2}, response.text
            assert not held.done() and old_data.exists()
            bundles.gate.touch()
            answer = await held
            assert answer.json()["outputs"] == {"v": 1}, answer.text
            # Released once its last run ended: the old edition's data folder goes.
            await poll(lambda: _no(not old_data.exists()), "the old bundle's data folder was never removed")

            tag.now = "sha256:bad"
            await poll(lambda: _no(service.follower.last_refusal is not None), "the untrusted digest was never refused")
            for _ in range(3):  # a refused digest is not pulled again while the tag stays on it
                await poll(_checked_again(tag), "the follower stopped checking")
            assert tag.pulls == ["sha256:v2", "sha256:bad"]
            assert (await client.get("/readyz")).status_code == 200
            caps = (await client.get("/v1/capabilities")).json()
            assert caps["bundle"]["ociDigest"] == "sha256:v2"
            follow = caps["follow"]
            assert follow["ociDigest"] == "sha256:v2" and follow["lastError"] is None
            refusal = follow["lastRefusal"]
            assert refusal["ociDigest"] == "sha256:bad" and refusal["kind"] == "untrusted_signer", refusal
            assert refusal["time"].endswith("Z")
            assert (await client.post("/v1/runs", json={"inputs": {"x": 1}})).json()["outputs"] == {"v": 2}
            text = (await client.get("/metrics")).text
            assert metric(text, "heddle_bundle_swaps_total") == 1
            assert metric(text, "heddle_bundle_refusals_total") == 1
            assert metric(text, "heddle_bundle_last_refusal_info",
                          'oci_digest="sha256:bad",reason="untrusted_signer"') == 1
            assert 'oci_digest="sha256:v2"' in next(line for line in text.splitlines()
                                                     if line.startswith("heddle_bundle_info{"))
            assert metric(text, "heddle_run_saturation") == 0
        service.follower.stop()
        await service.follower.wait_stopped()
        await service.aclose()

    asyncio.run(main())
    assert service.edition.sealed.data_dir is not None and not service.edition.sealed.data_dir.exists()


async def _no(done: bool) -> bool:
    return done


def _checked_again(tag: FakeTag) -> Callable[[], Awaitable[bool]]:
    seen = tag.checks

    async def checked() -> bool:
        return tag.checks > seen

    return checked


@pytest.mark.parametrize(("bundle", "says"), [
    ("app.heddle", "--bundle app.heddle, a file"),
    (None, "no --bundle"),
    ("https://example.com/app.heddle", "is a URL"),
    ("oci://registry.test/agent@sha256:" + "0" * 64, "names a digest, which never changes"),
])
def test_pull_interval_follows_only_a_tag(bundle: str | None, says: str) -> None:
    from heddle.errors import UsageError

    with pytest.raises(UsageError, match="--pull-interval") as caught:
        check_config(ServerConfig(bundle=bundle, pull_interval=1.0))
    assert says in caught.value.message


def test_an_older_bundle_is_refused_and_a_failed_download_is_tried_again(
        tmp_path: Path, bundles: Bundles, monkeypatch: pytest.MonkeyPatch) -> None:
    from heddle.format.errors import ContentMismatchError

    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    trust = TrustPolicy.from_names((bundles.pub,), allow_unsigned=False)
    config = ServerConfig(bundle=str(bundles.v1), trust=(bundles.pub,))
    service = Service(config, sealed=open_served(config, trust))
    tag = FakeTag({"sha256:v1": bundles.v1, "sha256:v2": bundles.v2})
    failures = {"sha256:v2": 1}

    def make(path: Path, digest: str) -> Edition:
        if failures.get(digest):
            failures[digest] -= 1
            raise ContentMismatchError(f"{digest}: the downloaded bytes hash to something else")
        return open_edition(config, trust, service, path, digest)

    tag.make = make
    service.follower = Follower(service, tag, interval=0.01, digest="sha256:v1")
    follower = service.follower

    async def main() -> None:
        follower.start()
        tag.now = "sha256:v2"  # signed after v1: served once a download is whole
        await poll(lambda: _no(follower.digest == "sha256:v2"), "v2 was never served after a failed download")
        assert tag.pulls == ["sha256:v2", "sha256:v2"] and follower.last_error is None
        tag.now = "sha256:v1"  # put back on the tag: older than what is served
        await poll(lambda: _no(follower.last_refusal is not None), "the rollback was never refused")
        refusal = follower.last_refusal
        assert refusal is not None and refusal.kind == "downgrade" and refusal.digest == "sha256:v1"
        assert "not signed after" in refusal.reason and follower.digest == "sha256:v2"
        follower.stop()
        await follower.wait_stopped()
        await service.aclose()

    asyncio.run(main())
