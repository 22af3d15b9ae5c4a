"""A tag never goes back or sideways, through a real registry (tests/support/registry.py): a real
`heddle-server --pull-interval` keeps the bundle it serves when the tag is put back on an older one
(rollback) or on another agent signed by the same key (substitution), and serves a digest whose first
download was corrupted once a download is whole; `heddle run REF` and `heddle pull` refuse an older
bundle or another agent than the one last seen under the tag unless --allow-downgrade."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from heddle import oci, seal
from heddle.oci.client import Registry
from heddle.oci.reference import parse_oci
from tests.bundle.conftest import KeyPair, make_keypair
from tests.server.support import Server, metric, start_server
from tests.support.cli import env_with, error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc
from tests.support.registry import RunningRegistry

pytestmark = pytest.mark.timeout(90)
DEADLINE_S = 30.0


@dataclass(frozen=True)
class Releases:
    """One agent's releases 1 to 3, sealed in that order, and another agent sealed between 2 and 3,
    all by the same key."""

    keypair: KeyPair
    v1: Path
    v2: Path
    other: Path
    v3: Path


def _sealed(root: Path, key: KeyPair, label: str, *, name: str = "agent", release: int | None = None) -> Path:
    f = FlowDoc(name)
    start, end = f.start(["text"]), f.end(["text"])
    f.control(start, end)
    document = f.document()
    document["id"] = f"{name}-flow"  # each release of one agent keeps its id
    flow = root / f"{label}.json"
    flow.write_text(json.dumps(document), encoding="utf-8")
    out = root / f"{label}.heddle"
    return seal(flow, input={"text": label}, sign_key=key.signing, release=release, output=out).path


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Releases:
    root = tmp_path_factory.mktemp("releases")
    (root / "keys").mkdir()
    key = make_keypair(root / "keys", "me")
    # Sealed one after the other: each signature is made after the one before.
    v1 = _sealed(root, key, "v1", release=1)
    v2 = _sealed(root, key, "v2", release=2)
    other = _sealed(root, key, "other", name="another", release=7)
    v3 = _sealed(root, key, "v3", release=3)
    return Releases(key, v1, v2, other, v3)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache, trust store and HOME (so no docker config) for this test."""
    for name in ("cache", "trust", "home"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HEDDLE_TRUST_DIR", str(tmp_path / "trust"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("DOCKER_CONFIG", "HEDDLE_REGISTRY_USERNAME", "HEDDLE_REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def server_on(home: Path, releases: Releases) -> Iterator[Callable[..., Server]]:
    started: list[Server] = []

    def start(ref: str, *extra: str) -> Server:
        server = start_server(home / "server", "--bundle", ref, "--trust", releases.keypair.pub_path,
                              "--pull-interval", "100ms", *extra)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _follow(server: Server) -> dict[str, Any]:
    with server.client() as client:
        caps = client.get("/v1/capabilities").json()
    follow: dict[str, Any] = caps["follow"]
    follow["served"] = caps["bundle"]["ociDigest"]
    follow["bundle"] = caps["bundle"]
    return follow


def _wait(server: Server, done: Callable[[dict[str, Any]], bool], why: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        follow = _follow(server)
        if done(follow):
            return follow
        assert time.monotonic() < deadline, f"{why}: {follow}\n{server.stderr()[-2000:]}"
        time.sleep(0.05)


def _answer(server: Server) -> Any:
    with server.client() as client:
        response = client.post("/v1/runs", json={"inputs": {}})
    assert response.status_code == 200, response.text
    return response.json()["outputs"]["text"]


def _refused(digest: str) -> Callable[[dict[str, Any]], bool]:
    return lambda follow: (follow["lastRefusal"] or {}).get("ociDigest") == digest


def test_a_following_server_refuses_a_rollback_and_a_substitution_and_retries_a_corrupted_download(
        registry: RunningRegistry, releases: Releases, server_on: Callable[..., Server]) -> None:
    ref = registry.ref("agents/follow:prod")
    v2 = oci.push(releases.v2, ref)
    server = server_on(ref)
    assert _answer(server) == "v2"

    # Rollback: the tag put back on release 1, which the same key signed earlier.
    v1 = oci.push(releases.v1, ref)
    follow = _wait(server, _refused(v1.oci_digest), "the rollback was never refused")
    refusal = follow["lastRefusal"]
    assert refusal["kind"] == "downgrade" and "release 1" in refusal["reason"] and "release 2" in refusal["reason"]
    assert follow["served"] == v2.oci_digest and _answer(server) == "v2"

    # Substitution: another agent, signed by the same key, later and of a higher release.
    other = oci.push(releases.other, ref)
    follow = _wait(server, _refused(other.oci_digest), "the substitution was never refused")
    assert follow["lastRefusal"]["kind"] == "downgrade" and "'another'" in follow["lastRefusal"]["reason"]
    assert follow["served"] == v2.oci_digest and _answer(server) == "v2"
    with server.client() as client:
        text = client.get("/metrics").text
    assert metric(text, "heddle_bundle_refusals_total") == 2
    assert metric(text, "heddle_bundle_last_refusal_info", f'oci_digest="{other.oci_digest}",reason="downgrade"') == 1

    # Release 3, its layer corrupted in the registry when the tag moves to it: refused as a failed
    # download, and served at a later interval once the registry holds the right bytes again.
    staged = oci.push(releases.v3, registry.ref("agents/follow:staging"))
    resolved = oci.resolve(staged.pinned)
    blob = registry.blob_data(resolved.layer_digest)
    good = blob.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0x01
    blob.write_bytes(bytes(bad))
    with Registry(parse_oci(ref), push=True) as client:
        client.put_manifest("prod", resolved.manifest)
    follow = _wait(server, lambda f: (f["lastError"] or {}).get("ociDigest") == staged.oci_digest,
                   "the corrupted download was never reported")
    assert follow["lastError"]["kind"] == "content_mismatch" and follow["served"] == v2.oci_digest
    blob.write_bytes(good)
    follow = _wait(server, lambda f: f["served"] == staged.oci_digest, "release 3 was never served")
    assert follow["lastError"] is None and _answer(server) == "v3"
    assert follow["bundle"]["release"] == 3 and follow["bundle"]["signedAt"].endswith("Z")


def _refused_at_start(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    """(status, stderr) of a `heddle-server ARGS` that must refuse to start, by its entry function in
    this process (a real process refusing at start is tests/server/test_startup.py's)."""
    from heddle.server.cli import run

    capsys.readouterr()
    status = run(["--port", "0", *[str(a) for a in args]], env_with())
    return status, capsys.readouterr().err


def test_expect_name_fixes_the_agent_a_followed_tag_may_name(registry: RunningRegistry, releases: Releases,
                                                           server_on: Callable[..., Server], home: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    ref = registry.ref("agents/named:prod")
    v1 = oci.push(releases.v1, ref)
    pub = releases.keypair.pub_path
    status, err = _refused_at_start(capsys, "--bundle", ref, "--trust", pub, "--pull-interval", "1s",
                                     "--expect-name", "x")
    assert status == 11 and "its flow is named 'agent', not 'x' as --expect-name says" in err
    status, err = _refused_at_start(capsys, "--bundle", ref, "--trust", pub, "--expect-name", "agent")
    assert status == 2 and "give it with --pull-interval" in err
    server = server_on(ref, "--expect-name", "agent")
    assert _answer(server) == "v1"
    other = oci.push(releases.other, ref)
    follow = _wait(server, _refused(other.oci_digest), "another agent was never refused")
    assert "not 'agent' as --expect-name says" in follow["lastRefusal"]["reason"]
    assert follow["served"] == v1.oci_digest
    v2 = oci.push(releases.v2, ref)
    _wait(server, lambda f: f["served"] == v2.oci_digest, "release 2 was never served")
    assert _answer(server) == "v2"


def test_run_and_pull_refuse_an_older_bundle_or_another_agent_under_a_tag(
        registry: RunningRegistry, releases: Releases, home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = registry.ref("agents/cli:prod")
    pub = releases.keypair.pub_path
    # A run whose bundle does not verify remembers nothing: release 3 refused for trust, release 1 then runs.
    oci.push(releases.v3, ref)
    stranger = make_keypair(home, "stranger")
    assert heddle_here(capsys, "run", ref, "--trust", stranger.pub_path).returncode == 4
    oci.push(releases.v1, ref)
    assert state_of(heddle_here(capsys, "run", ref, "--trust", pub)) == {"text": "v1"}
    oci.push(releases.v2, ref)
    assert state_of(heddle_here(capsys, "run", ref, "--trust", pub)) == {"text": "v2"}

    v1 = oci.push(releases.v1, ref)
    proc = heddle("run", ref, "--trust", pub)  # a real process, as a user starts it
    assert proc.returncode == 11 and proc.stdout == "", proc.stderr
    line = error_line(proc)
    assert ref in line and "release 1" in line and "release 2" in line and "--allow-downgrade" in line, line
    out = home / "pulled.heddle"
    pulled = heddle_here(capsys, "pull", ref, "-o", out)
    assert pulled.returncode == 11 and "--allow-downgrade" in error_line(pulled) and not out.exists()

    # Explicitly accepted: it runs, and is then the latest seen, so release 2 is a step forward again.
    accepted = heddle_here(capsys, "pull", ref, "-o", out, "--allow-downgrade", "--json")
    assert accepted.returncode == 0 and json.loads(accepted.stdout)["oci_digest"] == v1.oci_digest
    assert "accepted" in accepted.stderr and "--allow-downgrade" in accepted.stderr
    assert state_of(heddle_here(capsys, "run", ref, "--trust", pub)) == {"text": "v1"}
    oci.push(releases.v2, ref)
    assert state_of(heddle_here(capsys, "run", ref, "--trust", pub)) == {"text": "v2"}

    oci.push(releases.other, ref)
    sideways = heddle_here(capsys, "run", ref, "--trust", pub)
    assert sideways.returncode == 11 and "it is agent 'another', not 'agent'" in error_line(sideways)
    # A digest names one bundle for good: nothing to compare.
    assert state_of(heddle_here(capsys, "run", str(oci.resolve(ref).pinned), "--trust", pub)) == {"text": "other"}
    flag = heddle_here(capsys, "run", releases.v1, "--allow-downgrade", "--trust", pub)
    assert flag.returncode == 2 and "--allow-downgrade applies to a bundle reference" in error_line(flag)
    # What orders a bundle is what `heddle verify` reports of it.
    verdict = json.loads(heddle_here(capsys, "verify", releases.v3, "--trust", pub, "--json").stdout)
    assert verdict["release"] == 3 and verdict["signed_at"] > json.loads(heddle_here(
        capsys, "verify", releases.v1, "--trust", pub, "--json").stdout)["signed_at"]
