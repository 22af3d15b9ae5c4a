"""The time a signature was made, sealed in the signature (not the manifest), and the release number
sealed in the manifest: what orders one agent's bundles (heddle.format.release)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from heddle import canonical
from heddle.format.errors import BadSignatureError, MalformedBundleError
from heddle.format.pack import PackPlan, PlanFile, add_signature, pack
from heddle.format.release import Stamp, lower_bound, refusal
from heddle.format.signing import PAYLOAD_TYPE, Signatures, check_signatures, pae, statement
from heddle.format.verify import verify_bundle, peek
from tests.bundle.conftest import KeyPair, make_keypair


@pytest.fixture
def keys(tmp_path: Path) -> tuple[KeyPair, KeyPair]:
    (tmp_path / "keys").mkdir()
    return make_keypair(tmp_path / "keys", "me"), make_keypair(tmp_path / "keys", "other")


def _plan(root: Path, release: int | None = None) -> PackPlan:
    (root / "flow.json").write_text('{"component_type": "Flow"}\n')
    return PackPlan(name="agent", flow="flow.json", files=[PlanFile("flow.json", root / "flow.json")], release=release)


def test_the_time_is_sealed_in_the_signature_and_the_manifest_stays_the_same(
        tmp_path: Path, keys: tuple[KeyPair, KeyPair]) -> None:
    me, _ = keys
    a, b = tmp_path / "a.heddle", tmp_path / "b.heddle"
    first = pack(_plan(tmp_path), a, signing_key=me.signing, signed_at="2026-01-01T00:00:00.000001Z")
    second = pack(_plan(tmp_path), b, signing_key=me.signing, signed_at="2026-02-01T00:00:00.000001Z")
    assert first.digest == second.digest and peek(a).manifest_bytes == peek(b).manifest_bytes
    entry = json.loads(canonical.dumps(peek(b).signatures.signatures[0].to_json()))
    assert entry["signed_at"] == "2026-02-01T00:00:00.000001Z"
    opened = verify_bundle(b, trusted_keys=[me.public], cache_root=tmp_path / "cache")
    assert opened.signed_at == "2026-02-01T00:00:00.000001Z" and opened.signers == [me.public.keyid]


def test_a_changed_time_breaks_the_signature(tmp_path: Path, keys: tuple[KeyPair, KeyPair]) -> None:
    me, _ = keys
    seen = peek(pack(_plan(tmp_path), tmp_path / "a.heddle", signing_key=me.signing).path)
    obj = json.loads(seen.signatures.to_bytes())
    obj["signatures"][0]["signed_at"] = "2099-01-01T00:00:00.000000Z"
    forged = Signatures.from_bytes(json.dumps(obj).encode())
    with pytest.raises(BadSignatureError):
        check_signatures(seen.manifest_bytes, forged, [me.public], allow_unsigned=False, what="a.heddle")
    for wrong in ("yesterday", None, "2026-02-30T00:00:00.000000Z", "2026-01-01T00:00:00Z"):
        obj["signatures"][0]["signed_at"] = wrong
        with pytest.raises(MalformedBundleError, match=r"signatures\[0\]\.signed_at is not a time"):
            Signatures.from_bytes(json.dumps(obj).encode())


def test_a_signature_of_the_manifest_bytes_still_verifies_as_of_unknown_time(
        tmp_path: Path, keys: tuple[KeyPair, KeyPair]) -> None:
    me, other = keys
    seen = peek(pack(_plan(tmp_path), tmp_path / "a.heddle").path)
    old = me.signing.sign(pae(PAYLOAD_TYPE, seen.manifest_bytes))
    body = canonical.dumps({"payloadType": PAYLOAD_TYPE, "signatures": [
        {"keyid": me.public.keyid, "sig": base64.b64encode(old).decode()}]})
    signed = check_signatures(seen.manifest_bytes, Signatures.from_bytes(body), [me.public], allow_unsigned=False,
                              what="old.heddle")
    assert signed.signers == [me.public.keyid] and signed.signed_at is None
    # The time counted is a trusted key's: `heddle sign` by another, trusted key later moves it.
    path = tmp_path / "a.heddle"
    pack(_plan(tmp_path), path, signing_key=me.signing, signed_at="2026-01-01T00:00:00.000000Z")
    add_signature(path, other.signing)
    again = peek(path)
    only_me = check_signatures(again.manifest_bytes, again.signatures, [me.public], allow_unsigned=False, what="a")
    both = check_signatures(again.manifest_bytes, again.signatures, [me.public, other.public], allow_unsigned=False,
                            what="a")
    assert only_me.signed_at == "2026-01-01T00:00:00.000000Z"
    assert both.signed_at is not None and both.signed_at > "2026-01-01T00:00:00.000000Z"
    assert lower_bound(again.signatures) == "2026-01-01T00:00:00.000000Z"
    # The example of bundle-format/SPEC.md, section 6, byte for byte.
    assert statement(b"{}", "2026-01-02T03:04:05.123456Z") == (
        b'{"manifest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",'
        b'"signed_at":"2026-01-02T03:04:05.123456Z"}')


def test_the_release_is_sealed_in_the_manifest(tmp_path: Path) -> None:
    packed = pack(_plan(tmp_path, release=7), tmp_path / "r.heddle")
    assert b'"release":7' in peek(packed.path).manifest_bytes and packed.manifest.release == 7
    plain = pack(_plan(tmp_path), tmp_path / "p.heddle")
    assert b'"release"' not in peek(plain.path).manifest_bytes  # a manifest without one is as it always was


def test_the_order_of_releases() -> None:
    def at(day: int | None, release: int | None = None, name: str = "agent", digest: str = "") -> Stamp:
        when = f"2026-01-{day:02d}T00:00:00.000000Z" if day is not None else None
        return Stamp(digest or f"sha256:{day}-{release}-{name}", when, release, name, "agent-flow")

    assert refusal(at(2), at(1)) is None
    assert "not signed after" in str(refusal(at(1), at(2)))
    assert "not signed after" in str(refusal(at(None), at(2)))  # an unknown time is never after a known one
    assert refusal(at(2), at(None)) is None and refusal(at(None, 2), at(None, 1)) is None
    assert "not a release after" in str(refusal(at(3, 1), at(2, 2)))
    assert "not a release after" in str(refusal(at(3, 2), at(2, 2)))
    assert refusal(at(3, 3), at(2, 2)) is None
    assert "another agent" in str(refusal(at(3, name="other"), at(2)))
    assert refusal(at(3, name="other"), at(2), expect_name="other") is None
    assert refusal(at(1, digest="sha256:same"), at(2, digest="sha256:same")) is None  # the same bundle
    moved = Stamp("sha256:x", "2026-01-03T00:00:00.000000Z", None, "agent", "another-id")
    assert "flow id" in str(refusal(moved, at(2)))
