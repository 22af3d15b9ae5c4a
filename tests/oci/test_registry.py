"""Bundles through a real registry (Debian's docker-registry on 127.0.0.1, tests/support/registry.py):
the library against it in-process, and a real `heddle` or `heddle-server` process where a user would
start one (a run by tag on an empty cache, a tampered blob, a server started from a reference)."""

from __future__ import annotations

import base64
import http.server
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from heddle import oci, seal
from heddle.format.errors import BundleLimitError, ContentMismatchError
from heddle.format.limits import Limits
from heddle.format.verify import peek
from heddle.oci.artifact import BUNDLE_DIGEST, BUNDLE_NAME, CREATED, EMPTY_BLOB, EMPTY_DIGEST, digest_of
from heddle.oci.errors import RegistryError
from tests.bundle.conftest import KeyPair, make_keypair
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc
from tests.support.registry import RunningRegistry

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Sealed:
    root: Path
    keypair: KeyPair
    other: KeyPair  # a key nobody signed with

    def bundle(self, text: str) -> Path:
        """A signed bundle whose recorded input is `text`: each text its own digest and blob."""
        name = text[:40].replace("/", "_")
        out = self.root / f"{name}.heddle"
        if not out.exists():
            f = FlowDoc("echo-flow")
            start, end = f.start(["text"]), f.end(["text"])
            f.control(start, end)
            flow = f.write(self.root / f"{name}.json")
            seal(flow, input={"text": text}, sign_key=self.keypair.signing, output=out)
        return out


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Sealed:
    root = tmp_path_factory.mktemp("sealed")
    (root / "keys").mkdir()
    return Sealed(root, make_keypair(root / "keys", "me"), make_keypair(root / "keys", "other"))


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache, trust store and HOME (so no docker config) for this test."""
    for name in ("cache", "trust", "home"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HEDDLE_TRUST_DIR", str(tmp_path / "trust"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("DOCKER_CONFIG", "HEDDLE_REGISTRY_USERNAME", "HEDDLE_REGISTRY_PASSWORD", "HEDDLE_REGISTRY"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


def test_push_then_pull_gives_the_same_bytes_and_the_cache_lists_it(registry: RunningRegistry, sealed: Sealed,
                                                                     home: Path, capsys: pytest.CaptureFixture[str]):
    bundle = sealed.bundle("same-bytes")
    ref = registry.ref("agents/app:v1")
    proc = heddle_here(capsys, "push", bundle, ref, "--annotation", "team=search", "--json")
    assert proc.returncode == 0, proc.stderr
    pushed = json.loads(proc.stdout)
    assert pushed["bundle_digest"] == f"sha256:{peek(bundle).digest}"
    assert pushed["pinned"] == registry.ref(f"agents/app@{pushed['oci_digest']}")
    # The same file pushed again is the same artifact: nothing in it comes from the clock.
    again = oci.push(bundle, registry.ref("agents/app:v1-again"), annotations={"team": "search"})
    assert again.oci_digest == pushed["oci_digest"]

    resolved = oci.resolve(ref)
    assert resolved.oci_digest == pushed["oci_digest"] and resolved.size == bundle.stat().st_size
    assert resolved.annotations == {BUNDLE_DIGEST: pushed["bundle_digest"], BUNDLE_NAME: "echo-flow",
                                    CREATED: "1970-01-01T00:00:00Z", "team": "search"}

    out = home / "pulled.heddle"
    proc = heddle_here(capsys, "pull", ref, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["oci_digest"] == pushed["oci_digest"]
    assert out.read_bytes() == bundle.read_bytes()

    info = json.loads(heddle_here(capsys, "inspect", ref, "--json", "--trust", sealed.keypair.pub_path).stdout)
    assert info["oci_digest"] == pushed["oci_digest"] and info["bundle"] == ref
    assert info["status"] == "signed-trusted" or "trusted" in info["detail"]

    other = registry.ref("agents/app:v2")
    oci.push(sealed.bundle("other-bytes"), other)
    changes = json.loads(heddle_here(capsys, "diff", ref, other, "--json").stdout)
    assert changes and "other-bytes" in json.dumps(changes)
    checked = json.loads(heddle_here(capsys, "doctor", ref, "--json").stdout)
    assert checked["ok"] and checked["bundle"] == ref and checked["oci_digest"] == pushed["oci_digest"]

    listed = json.loads(heddle_here(capsys, "cache", "ls", "--json").stdout)
    pulled = [e for e in listed if e["kind"] == "pulled" and e["reference"] == ref]
    assert [(e["digest"], e["reference"], e["ok"]) for e in pulled] == [(pushed["oci_digest"], ref, True)]
    pruned = json.loads(heddle_here(capsys, "cache", "prune", "--all", "--json").stdout)
    assert pushed["oci_digest"] in [e["digest"] for e in pruned["pulled_removed"]]
    assert [e for e in json.loads(heddle_here(capsys, "cache", "ls", "--json").stdout) if e["kind"] == "pulled"] == []
    # The last resolution went with it: offline, the tag is no longer known.
    proc = heddle_here(capsys, "pull", ref, "-o", out, "--offline")
    assert proc.returncode == 2 and "--offline, and this tag was never pulled" in error_line(proc)


def test_run_by_tag_and_by_digest_on_an_empty_cache(registry: RunningRegistry, sealed: Sealed, home: Path,
                                                    capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch):
    bundle = sealed.bundle("by-tag")
    pushed = oci.push(bundle, registry.ref("agents/run:prod"))
    proc = heddle("run", registry.ref("agents/run:prod"), "--trust", sealed.keypair.pub_path)
    assert state_of(proc) == {"text": "by-tag"}
    assert f"pulled {registry.ref('agents/run:prod')} ({pushed.oci_digest})" in proc.stderr
    # By digest, on another empty cache, in-process.
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(home / "cache-2"))
    pinned = str(pushed.pinned)
    assert state_of(heddle_here(capsys, "run", pinned, "--trust", sealed.keypair.pub_path,
                                "--input", '{"text": "given"}')) == {"text": "given"}
    # A digest in the cache needs no registry at all; a tag offline is its last resolution.
    assert oci.pull(pinned).downloaded is False
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(home / "cache"))
    offline = heddle_here(capsys, "run", registry.ref("agents/run:prod"), "--offline", "--trust",
                          sealed.keypair.pub_path)
    assert state_of(offline) == {"text": "by-tag"}


def test_an_untrusted_signer_is_refused_with_exit_4(registry: RunningRegistry, sealed: Sealed, home: Path,
                                                    capsys: pytest.CaptureFixture[str]):
    ref = registry.ref("agents/untrusted:v1")
    pushed = oci.push(sealed.bundle("untrusted"), ref)
    proc = heddle_here(capsys, "run", ref, "--trust", sealed.other.pub_path)
    assert proc.returncode == 4 and error_line(proc).startswith(f"error: {ref} is signed by key ")
    verdict = json.loads(heddle_here(capsys, "verify", ref, "--trust", sealed.other.pub_path, "--json").stdout)
    assert verdict["ok"] is False and verdict["error"]["kind"] == "untrusted_signer"
    assert verdict["oci_digest"] == pushed.oci_digest and verdict["bundle"] == ref


def test_a_blob_tampered_in_the_registry_is_refused_without_a_traceback(registry: RunningRegistry, sealed: Sealed,
                                                                       home: Path):
    ref = registry.ref("agents/tampered:v1")
    pushed = oci.push(sealed.bundle("tampered"), ref)
    layer = oci.resolve(ref).layer_digest
    data = registry.blob_data(layer)
    body = bytearray(data.read_bytes())
    body[len(body) // 2] ^= 0x01  # same length: only the digest can tell
    data.write_bytes(bytes(body))
    proc = heddle("run", ref, "--trust", sealed.keypair.pub_path)
    assert proc.returncode == 6, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    line = error_line(proc)
    assert layer in line and "not the layer's digest" in line
    assert [n for n in os.listdir(home / "cache" / "pulled") if not n.startswith(".")] == []
    # The library says the same, as the bundle error it is.
    with pytest.raises(ContentMismatchError):
        oci.fetch(pushed.pinned)


def test_a_layer_over_the_caps_is_refused_before_it_is_downloaded(registry: RunningRegistry, sealed: Sealed,
                                                                  home: Path):
    ref = registry.ref("agents/big:v1")
    oci.push(sealed.bundle("big-" + base64.b64encode(os.urandom(12000)).decode()), ref)  # incompressible
    resolved = oci.resolve(ref)
    assert resolved.size > 8192
    registry.blob_data(resolved.layer_digest).unlink()  # any download would now fail otherwise
    small = Limits(max_total_bytes=16, max_manifest_bytes=16, max_signatures_bytes=16, max_files=0)
    with pytest.raises(BundleLimitError, match="it was not downloaded"):
        oci.fetch(ref, limits=small)


def test_what_is_not_a_heddle_artifact_is_refused(registry: RunningRegistry, home: Path,
                                                  capsys: pytest.CaptureFixture[str]):
    from heddle.oci.client import Registry
    from heddle.oci.reference import parse_oci

    image = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": EMPTY_DIGEST,
                                   "size": 2},
                        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": EMPTY_DIGEST,
                                    "size": 2}]}).encode()
    with Registry(parse_oci(registry.ref("images/app:v1")), push=True) as client:
        client.upload_blob(EMPTY_DIGEST, 2, EMPTY_BLOB)
        assert client.put_manifest("v1", image) == digest_of(image)
    proc = heddle_here(capsys, "run", registry.ref("images/app:v1"))
    assert proc.returncode == 7 and "its artifact type is 'application/vnd.oci.image.config.v1+json'" in \
        error_line(proc)
    missing = heddle_here(capsys, "verify", registry.ref("images/app:nope"))
    assert missing.returncode == 2 and "not found in" in error_line(missing)


def test_credentials_from_the_docker_config_and_the_environment(auth_registry: RunningRegistry, sealed: Sealed,
                                                               home: Path, capsys: pytest.CaptureFixture[str],
                                                               monkeypatch: pytest.MonkeyPatch):
    ref = auth_registry.ref("agents/private:v1")
    bundle = sealed.bundle("private")
    with pytest.raises(RegistryError) as caught:
        oci.push(bundle, ref)
    assert "asks for credentials and none were found" in caught.value.message and "docker login" in caught.value.message
    monkeypatch.setenv("HEDDLE_REGISTRY_USERNAME", str(auth_registry.username))
    monkeypatch.setenv("HEDDLE_REGISTRY_PASSWORD", str(auth_registry.password))
    monkeypatch.setenv("HEDDLE_REGISTRY", auth_registry.address)
    pushed = oci.push(bundle, ref)
    monkeypatch.setenv("HEDDLE_REGISTRY_PASSWORD", "wrong")
    with pytest.raises(RegistryError, match="refused the credentials from HEDDLE_REGISTRY_USERNAME"):
        oci.resolve(ref)
    monkeypatch.delenv("HEDDLE_REGISTRY_USERNAME")
    monkeypatch.delenv("HEDDLE_REGISTRY_PASSWORD")
    docker = home / "home" / ".docker"
    docker.mkdir()
    token = f"{auth_registry.username}:{auth_registry.password}".encode()
    (docker / "config.json").write_text(json.dumps({"auths": {auth_registry.address: {
        "auth": base64.b64encode(token).decode()}}}))
    proc = heddle_here(capsys, "pull", ref, "-o", home / "private.heddle", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["oci_digest"] == pushed.oci_digest
    assert (home / "private.heddle").read_bytes() == bundle.read_bytes()


def test_plain_http_elsewhere_is_refused_and_reference_flags_need_a_reference(sealed: Sealed, home: Path,
                                                                               capsys: pytest.CaptureFixture[str]):
    # 192.0.2.0/24 is documentation space: the refusal comes before any connection is tried.
    proc = heddle_here(capsys, "run", "http://192.0.2.10/app.heddle", "--trust", sealed.keypair.pub_path)
    assert proc.returncode == 2
    assert "is plain HTTP to 192.0.2.10, which is not this machine" in error_line(proc)
    assert "--plain-http" in error_line(proc)
    proc = heddle_here(capsys, "verify", sealed.bundle("local"), "--offline", "--plain-http")
    assert proc.returncode == 2 and "--plain-http and --offline apply to a bundle reference" in error_line(proc)
    proc = heddle_here(capsys, "run", "ghcr.io/org/app:v1")
    assert proc.returncode == 2 and "write oci://ghcr.io/org/app:v1 to pull it" in error_line(proc)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def file_server(sealed: Sealed) -> Iterator[str]:
    """A plain HTTP server on loopback serving the sealed bundles' folder."""
    def handler(*args: object, **kwargs: object) -> _Quiet:
        return _Quiet(*args, directory=str(sealed.root), **kwargs)  # type: ignore[arg-type]

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_url_reference_is_downloaded_to_the_cache_then_verified(file_server: str, sealed: Sealed, home: Path,
                                                                 capsys: pytest.CaptureFixture[str]):
    bundle = sealed.bundle("served")
    url = f"{file_server}/served.heddle"
    proc = heddle_here(capsys, "verify", url, "--trust", sealed.keypair.pub_path, "--json")
    assert proc.returncode == 0, proc.stderr
    verdict = json.loads(proc.stdout)
    assert verdict["ok"] and verdict["bundle"] == url and verdict["digest"] == f"sha256:{peek(bundle).digest}"
    assert oci.fetch(url, offline=True).read_bytes() == bundle.read_bytes()
    listed = [e for e in json.loads(heddle_here(capsys, "cache", "ls", "--json").stdout) if e["kind"] == "pulled"]
    assert [(e["source"], e["reference"], e["digest"]) for e in listed] == [
        ("url", url, digest_of(bundle.read_bytes()))]
    assert state_of(heddle_here(capsys, "run", url, "--trust", sealed.keypair.pub_path)) == {"text": "served"}
    missing = heddle_here(capsys, "run", f"{file_server}/nope.heddle", "--trust", sealed.keypair.pub_path)
    assert missing.returncode == 2 and "the server answered HTTP 404" in error_line(missing)
    (sealed.root / "junk.heddle").write_bytes(b"not a bundle at all")
    junk = heddle_here(capsys, "run", f"{file_server}/junk.heddle", "--trust", sealed.keypair.pub_path)
    assert junk.returncode == 7 and error_line(junk).startswith(f"error: {file_server}/junk.heddle")


def test_the_server_starts_from_a_reference(registry: RunningRegistry, sealed: Sealed, home: Path):
    from tests.server.support import start_server

    pushed = oci.push(sealed.bundle("served-by-server"), registry.ref("agents/server:prod"))
    server = start_server(home / "server", "--bundle", registry.ref("agents/server:prod"),
                          "--trust", sealed.keypair.pub_path)
    try:
        with server.client() as client:
            assert client.get("/readyz").status_code == 200
            answer = client.post("/v1/runs", json={"inputs": {}})
            assert answer.status_code == 200, answer.text
            assert answer.json()["outputs"] == {"text": "served-by-server"}
        assert pushed.bundle_digest in server.stderr()
    finally:
        server.stop()


def test_a_pulled_file_changed_in_the_cache_is_pulled_again(registry: RunningRegistry, sealed: Sealed, home: Path):
    pushed = oci.push(sealed.bundle("changed-in-cache"), registry.ref("agents/cached:v1"))
    path = oci.fetch(pushed.pinned)
    body = bytearray(path.read_bytes())
    body[-8] ^= 0x01
    path.chmod(0o600)
    path.write_bytes(bytes(body))
    path.chmod(0o400)
    again = oci.pull(pushed.pinned)
    assert again.downloaded and again.path.read_bytes() == sealed.bundle("changed-in-cache").read_bytes()
    os.utime(again.path, (1, 1))  # a stat that moved over the same bytes: re-hashed, and kept
    assert oci.pull(pushed.pinned).downloaded is False
