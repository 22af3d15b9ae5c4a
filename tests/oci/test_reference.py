"""References and the artifact's manifest, read exactly or refused in one line (pure logic, in-process)."""

from __future__ import annotations

import json

import pytest

from heddle.errors import UsageError
from heddle.format.errors import MalformedBundleError
from heddle.format.limits import DEFAULT_LIMITS, Limits
from heddle.oci.artifact import (
    ARTIFACT_TYPE,
    BUNDLE_DIGEST,
    INDEX_TYPE,
    LAYER_TYPE,
    build_manifest,
    digest_of,
    read_manifest,
)
from heddle.oci.reference import Reference, is_loopback, looks_like_reference, parse_oci, parse_reference, parse_url

DIGEST = "sha256:" + "ab" * 32


def test_oci_references_parse_exactly() -> None:
    assert parse_oci("oci://ghcr.io/org/agents/app:1.0") == Reference("ghcr.io", "org/agents/app", "1.0")
    assert parse_oci(f"oci://127.0.0.1:5000/app@{DIGEST}") == Reference("127.0.0.1:5000", "app", None, DIGEST)
    ref = parse_oci("oci://[::1]:5000/a/b:prod")
    assert (ref.host, ref.loopback, ref.endpoint) == ("[::1]", True, "[::1]:5000")
    assert parse_oci("oci://docker.io/me/app:1").endpoint == "registry-1.docker.io"
    assert str(parse_oci("oci://localhost:5000/app:v1").at(DIGEST)) == f"oci://localhost:5000/app@{DIGEST}"
    assert parse_oci("oci://reg.example.com/app", for_push=True).tag is None
    assert looks_like_reference("OCI://x/y:z") and looks_like_reference("https://x/a.heddle")
    assert not looks_like_reference("app.heddle") and not looks_like_reference("./oci://x")


@pytest.mark.parametrize(("text", "needle"), [
    ("oci://reg.example.com/app", "no tag and no digest"),
    (f"oci://reg.example.com/app:v1@{DIGEST}", "names the tag 'v1' and a digest"),
    ("oci://reg.example.com/App:v1", "is not a repository name"),
    ("oci://reg.example.com/app:-v1", "is not a tag"),
    ("oci://reg.example.com/app@sha512:" + "a" * 128, "not sha256"),
    ("oci://reg.example.com/app@sha256:ABC", "64 lowercase hex"),
    ("oci://reg.example.com:99999/app:v1", "not a port number"),
    ("oci://reg_example/app:v1", "not a host name"),
    ("oci:///app:v1", "no registry"),
    ("oci://reg.example.com", "no repository"),
])
def test_bad_references_are_refused_in_one_line(text: str, needle: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_reference(text)
    message = caught.value.message
    assert needle in message and message.startswith(text) and "\n" not in message
    assert "oci://REGISTRY/REPOSITORY:TAG" in message


def test_urls_are_read_whole_or_refused() -> None:
    assert parse_url("https://example.com/a/app.heddle?x=1").host == "example.com"
    for text, needle in (("https://user:pw@example.com/a.heddle", "credentials in a URL"),
                         ("https://example.com/a.heddle#part", "#fragment"),
                         ("https:///a.heddle", "with a host"),
                         ("https://example.com:bad/a.heddle", "not a URL")):
        with pytest.raises(UsageError, match=needle):
            parse_url(text)
    assert is_loopback("127.0.0.2") and is_loopback("localhost") and is_loopback("[::1]")
    assert not is_loopback("192.0.2.1") and not is_loopback("localhost.example.com")


def _manifest(**changes: object) -> bytes:
    data = json.loads(build_manifest(layer_digest=DIGEST, layer_size=10, annotations={BUNDLE_DIGEST: DIGEST},
                                     title="app.heddle"))
    data.update(changes)
    return json.dumps(data).encode()


def test_the_artifact_manifest_is_read_back_and_anything_else_refused() -> None:
    raw = build_manifest(layer_digest=DIGEST, layer_size=10, annotations={"k": "v"}, title="app.heddle")
    assert raw == build_manifest(layer_digest=DIGEST, layer_size=10, annotations={"k": "v"}, title="app.heddle")
    read = read_manifest(raw, what="ref")
    assert (read.digest, read.layer_digest, read.layer_size, read.annotations) == (digest_of(raw), DIGEST, 10,
                                                                                   {"k": "v"})
    layer = {"mediaType": LAYER_TYPE, "digest": DIGEST, "size": 10}
    for raw, needle in (
        (_manifest(mediaType=INDEX_TYPE), "an image index"),
        (_manifest(artifactType="application/vnd.example+json"), "not 'application/vnd.heddle.bundle.v1'"),
        (_manifest(layers=[layer, layer]), "exactly one layer, this one has 2"),
        (_manifest(layers=[{**layer, "mediaType": "application/vnd.oci.image.layer.v1.tar"}]), "its layer is"),
        (_manifest(layers=[{**layer, "size": -1}]), "size -1 is not a whole number"),
        (_manifest(annotations={BUNDLE_DIGEST: "sha256:nope"}), "is not a sha256 digest"),
        (b'{"schemaVersion": 2, "schemaVersion": 2}', "not JSON"),
        (b"[1]", "not a JSON object"),
    ):
        with pytest.raises(MalformedBundleError) as caught:
            read_manifest(raw, what="oci://r/app:v1")
        assert needle in caught.value.message and caught.value.exit_code == 7, caught.value.message
    # An artifact typed by its config (as older tools push them) is one too.
    data = json.loads(_manifest())
    del data["artifactType"]
    data["config"]["mediaType"] = ARTIFACT_TYPE
    assert read_manifest(json.dumps(data).encode(), what="r").layer_size == 10


def test_the_largest_bundle_file_follows_from_the_caps() -> None:
    small = Limits(max_total_bytes=1000, max_manifest_bytes=100, max_signatures_bytes=10, max_files=1)
    assert small.max_content_bytes() == 1000 + 100 + 10 + 5 * 1024
    assert small.max_content_bytes() < small.max_archive_bytes() < small.max_content_bytes() + 64
    assert DEFAULT_LIMITS.max_archive_bytes() > DEFAULT_LIMITS.max_total_bytes
