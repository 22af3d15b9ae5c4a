"""Registry credentials and challenges (pure logic, in-process): the docker config as docker reads it,
the environment variables, credential helpers, and the Bearer token dance over a mock transport."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

from heddle.oci.artifact import BUNDLE_DIGEST, build_manifest
from heddle.oci.auth import find_credentials, parse_challenge
from heddle.oci.errors import RegistryError
from heddle.oci.pulling import resolve

DIGEST = "sha256:" + "cd" * 32
OCI = "application/vnd.oci.image.manifest.v1+json"
MANIFEST = build_manifest(layer_digest=DIGEST, layer_size=3, annotations={BUNDLE_DIGEST: DIGEST}, title="a.heddle")


def _config(folder: Path, config: dict[str, object]) -> dict[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return {"DOCKER_CONFIG": str(folder), "PATH": str(folder)}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_docker_config_and_environment_credentials(tmp_path: Path) -> None:
    env = _config(tmp_path / "d", {"auths": {"https://reg.example.com/v1/": {"auth": _b64("ann:pw:with:colons")},
                                             "other.example.com": {"username": "bo", "password": "x"},
                                             "empty.example.com": {}}})
    found = find_credentials("reg.example.com", env)
    assert found is not None and (found.username, found.password) == ("ann", "pw:with:colons")
    assert "config.json auths" in found.source
    other = find_credentials("other.example.com", env)
    assert other is not None and other.username == "bo"
    assert find_credentials("empty.example.com", env) is None
    assert find_credentials("nowhere.example.com", env) is None
    # The environment variables win over the file, for the registry HEDDLE_REGISTRY names alone.
    both = {**env, "HEDDLE_REGISTRY_USERNAME": "ci", "HEDDLE_REGISTRY_PASSWORD": "tok",
            "HEDDLE_REGISTRY": "REG.example.com"}
    from_env = find_credentials("reg.example.com", both)
    assert from_env is not None and (from_env.username, from_env.password) == ("ci", "tok")
    kept = find_credentials("other.example.com", both)  # another registry gets its own, from the file
    assert kept is not None and kept.username == "bo"
    assert find_credentials("nowhere.example.com", both) is None
    for registry in ("", "https://reg.example.com", "reg.example.com/v2"):
        with pytest.raises(RegistryError, match="HEDDLE_REGISTRY") as refused:
            find_credentials("reg.example.com", {**both, "HEDDLE_REGISTRY": registry})
        assert "tok" not in refused.value.message
    with pytest.raises(RegistryError, match="HEDDLE_REGISTRY_USERNAME is set but HEDDLE_REGISTRY_PASSWORD is not"):
        find_credentials("reg.example.com", {**env, "HEDDLE_REGISTRY_USERNAME": "ci"})
    bad = _config(tmp_path / "bad", {"auths": {"reg.example.com": {"auth": "not base64!"}}})
    with pytest.raises(RegistryError) as caught:
        find_credentials("reg.example.com", bad)
    assert "auth is not base64 of user:password" in caught.value.message and "\n" not in caught.value.message


def test_a_credential_helper_is_asked_without_heddles_secrets(tmp_path: Path) -> None:
    env = _config(tmp_path / "d", {"credHelpers": {"reg.example.com": "fake"}, "credsStore": "missing"})
    helper = tmp_path / "d" / "docker-credential-fake"
    helper.write_text("#!/bin/sh\nread server\n"
                      'printf \'{"Username": "%s", "Secret": "%s"}\' "$server" "${HEDDLE_AUTH_TOKEN:-none}"\n')
    helper.chmod(0o755)
    found = find_credentials("reg.example.com", {**env, "HEDDLE_AUTH_TOKEN": "server-secret"})
    assert found is not None and (found.username, found.password) == ("reg.example.com", "none")
    # credsStore names a helper that is not installed: one line saying so.
    with pytest.raises(RegistryError, match="docker-credential-missing is not on PATH"):
        find_credentials("elsewhere.example.com", env)


def test_challenges_are_parsed() -> None:
    challenge = parse_challenge('Bearer realm="https://auth.example.com/token",service="reg",scope="repository:a:pull"')
    assert challenge is not None and challenge.scheme == "bearer"
    assert dict(challenge.params) == {"realm": "https://auth.example.com/token", "service": "reg",
                                      "scope": "repository:a:pull"}
    basic = parse_challenge('Basic realm="x \\"y\\""')
    assert basic is not None and basic.scheme == "basic" and basic.params["realm"] == 'x "y"'
    assert parse_challenge("") is None


def _registry(realm: str, seen: list[httpx.Request]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/token":
            if request.headers.get("authorization") != "Basic " + _b64("ann:pw"):
                return httpx.Response(401)
            assert request.url.params["scope"] == "repository:team/app:pull"
            assert request.url.params["service"] == "reg.example.com"
            return httpx.Response(200, json={"token": "T0KEN"})
        if request.headers.get("authorization") != "Bearer T0KEN":
            challenge = f'Bearer realm="{realm}",service="reg.example.com"'
            return httpx.Response(401, headers={"WWW-Authenticate": challenge})
        return httpx.Response(200, content=MANIFEST,
                              headers={"Content-Type": "application/vnd.oci.image.manifest.v1+json"})

    return httpx.MockTransport(handle)


def test_a_bearer_challenge_is_answered_with_a_token_from_its_realm(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    env = {"HEDDLE_REGISTRY_USERNAME": "ann", "HEDDLE_REGISTRY_PASSWORD": "pw", "HEDDLE_REGISTRY": "reg.example.com",
           "HOME": str(tmp_path)}
    resolved = resolve("oci://reg.example.com/team/app:v1", environ=env, cache_dir=tmp_path / "c",
                       transport=_registry("https://auth.example.com/token", seen))
    assert resolved.size == 3 and resolved.layer_digest == DIGEST
    assert [r.url.host for r in seen] == ["reg.example.com", "auth.example.com", "reg.example.com"]
    # The registry never sees the password; the realm never sees the token.
    assert "authorization" not in seen[0].headers and seen[2].headers["authorization"] == "Bearer T0KEN"
    with pytest.raises(RegistryError) as caught:
        resolve("oci://reg.example.com/team/app:v1", environ={**env, "HEDDLE_REGISTRY_PASSWORD": "wrong"},
                cache_dir=tmp_path / "c", transport=_registry("https://auth.example.com/token", []))
    assert "refused the credentials from HEDDLE_REGISTRY_USERNAME/HEDDLE_REGISTRY_PASSWORD" in caught.value.message


def test_no_credentials_go_to_a_plain_http_realm_elsewhere(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    env = {"HEDDLE_REGISTRY_USERNAME": "ann", "HEDDLE_REGISTRY_PASSWORD": "pw", "HEDDLE_REGISTRY": "reg.example.com",
           "HOME": str(tmp_path)}
    with pytest.raises(RegistryError) as caught:
        resolve("oci://reg.example.com/team/app:v1", environ=env, cache_dir=tmp_path / "c",
                transport=_registry("http://auth.example.com/token", seen))
    assert "is plain HTTP to auth.example.com, which is not this machine" in caught.value.message
    assert "--plain-http" in caught.value.message
    assert [r.url.host for r in seen] == ["reg.example.com"]


def test_a_redirect_keeps_the_scheme_rule_and_drops_credentials(tmp_path: Path) -> None:
    from heddle.oci.client import Registry
    from heddle.oci.reference import parse_oci

    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "reg.example.com":
            if "authorization" not in request.headers:
                return httpx.Response(401, headers={"WWW-Authenticate": 'Basic realm="r"'})
            target = "https://blobs.example.net/b" if request.url.path.endswith("good") else "http://blobs.example.net/b"
            return httpx.Response(307, headers={"Location": target})
        return httpx.Response(200, content=b"abc")

    env = {"HEDDLE_REGISTRY_USERNAME": "ann", "HEDDLE_REGISTRY_PASSWORD": "pw", "HEDDLE_REGISTRY": "reg.example.com"}
    with Registry(parse_oci("oci://reg.example.com/app:v1"), environ=env,
                  transport=httpx.MockTransport(handle)) as registry:
        with registry.blob("good") as response:
            assert response.read() == b"abc"
        assert seen[-1].url.host == "blobs.example.net" and "authorization" not in seen[-1].headers
        with pytest.raises(RegistryError, match=r"is plain HTTP to blobs\.example\.net"), registry.blob("bad"):
            pass


def test_credentials_answer_no_challenge_from_elsewhere(tmp_path: Path) -> None:
    """A redirect to a host that asks, and a realm on plain HTTP elsewhere: neither hears the password."""
    env = {"HEDDLE_REGISTRY_USERNAME": "ann", "HEDDLE_REGISTRY_PASSWORD": "pw", "HEDDLE_REGISTRY": "reg.example.com",
           "HOME": str(tmp_path)}
    seen: list[httpx.Request] = []

    def redirected(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.host == "reg.example.com":
            return httpx.Response(307, headers={"Location": "https://evil.example.net/v2/team/app/manifests/v1"})
        return httpx.Response(401, headers={"WWW-Authenticate": 'Bearer realm="https://evil.example.net/token"'})

    with pytest.raises(RegistryError, match=r"evil\.example\.net, where reg\.example\.com redirected heddle, asks "
                                            r"for credentials; heddle sends reg\.example\.com's to reg\.example\.com "
                                            r"alone"):
        resolve("oci://reg.example.com/team/app:v1", environ=env, cache_dir=tmp_path / "c",
                transport=httpx.MockTransport(redirected))
    assert [r.url.host for r in seen] == ["reg.example.com", "evil.example.net"]
    assert all("authorization" not in r.headers for r in seen)
    # With --plain-http a realm may be plain HTTP, but then only on the registry's own host.
    seen.clear()
    with pytest.raises(RegistryError, match=r"token service auth\.example\.com is plain HTTP on another host"):
        resolve("oci://reg.example.com/team/app:v1", environ=env, cache_dir=tmp_path / "c", plain_http=True,
                transport=_registry("http://auth.example.com/token", seen))
    assert [r.url.host for r in seen] == ["reg.example.com"]
    seen.clear()
    resolved = resolve("oci://reg.example.com/team/app:v1", environ=env, cache_dir=tmp_path / "c", plain_http=True,
                       transport=_registry("http://reg.example.com:8080/token", seen))
    assert resolved.size == 3 and [r.url.port for r in seen] == [None, 8080, None]


def test_a_manifest_that_is_not_the_digest_asked_for_is_refused(tmp_path: Path) -> None:
    from heddle.format.errors import ContentMismatchError

    def handle(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=MANIFEST, headers={"Content-Type": OCI})

    with pytest.raises(ContentMismatchError, match="whose bytes hash to sha256:"):
        resolve(f"oci://reg.example.com/app@{DIGEST}", cache_dir=tmp_path, transport=httpx.MockTransport(handle))

    def lying(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=MANIFEST, headers={"Content-Type": OCI, "Docker-Content-Digest": DIGEST})

    with pytest.raises(ContentMismatchError, match=f"the registry says the manifest is {DIGEST}"):
        resolve("oci://reg.example.com/app:v1", cache_dir=tmp_path, transport=httpx.MockTransport(lying))
