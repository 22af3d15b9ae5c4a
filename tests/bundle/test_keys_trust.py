"""Keys on disk and the trust store."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest

from heddle.format.errors import KeyFileError
from heddle.format.keys import generate, key_id, load_public_key, load_signing_key
from heddle.format.trust import TrustStore, default_trust_dir, resolve_trust
from heddle.errors import UsageError


def test_keygen_writes_a_0600_encrypted_key_and_a_public_key_whatever_the_umask(sandbox: Path) -> None:
    old = os.umask(0o000)
    try:
        made = generate(sandbox / "me", b"correct horse")
    finally:
        os.umask(old)
    assert stat.S_IMODE(made.private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(made.public_path.stat().st_mode) == 0o644
    assert made.private_path.read_bytes().startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert made.public_path.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    key = load_signing_key(made.private_path, b"correct horse")
    assert key.keyid == made.keyid == load_public_key(made.public_path).keyid
    with pytest.raises(KeyFileError, match="wrong passphrase"):
        load_signing_key(made.private_path, b"wrong")


def test_key_id_is_the_sha256_of_the_raw_public_key(sandbox: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    public = load_public_key(generate(sandbox / "k", None).public_path)
    raw = public.key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert public.keyid == hashlib.sha256(raw).hexdigest()[:16] == key_id(public.key)


def test_keygen_never_overwrites(sandbox: Path) -> None:
    (sandbox / "me.pub").write_text("someone else's")
    with pytest.raises(KeyFileError, match="already exists"):
        generate(sandbox / "me", None)
    assert not (sandbox / "me.key").exists()
    assert (sandbox / "me.pub").read_text() == "someone else's"


def test_encrypted_key_takes_its_passphrase_from_the_environment(sandbox: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = generate(sandbox / "me", b"s3cret")
    monkeypatch.setenv("HEDDLE_KEY_PASSPHRASE", "s3cret")
    assert load_signing_key(made.private_path).keyid == made.keyid
    monkeypatch.delenv("HEDDLE_KEY_PASSPHRASE")
    with pytest.raises(KeyFileError, match="HEDDLE_KEY_PASSPHRASE"):
        load_signing_key(made.private_path)  # stdin is not a terminal under pytest


def test_wrong_kind_of_key_files_are_named(sandbox: Path) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    other = ec.generate_private_key(ec.SECP256R1())
    (sandbox / "ec.pub").write_bytes(other.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(KeyFileError, match="ec.pub: not an Ed25519 key"):
        load_public_key(sandbox / "ec.pub")
    (sandbox / "junk.pub").write_text("hello")
    with pytest.raises(KeyFileError, match="junk.pub: not a PEM public key"):
        load_public_key(sandbox / "junk.pub")
    with pytest.raises(KeyFileError, match="missing.key: cannot be read"):
        load_signing_key(sandbox / "missing.key")


def test_trust_store_add_list_remove(sandbox: Path) -> None:
    a = generate(sandbox / "a", None)
    b = generate(sandbox / "b", None)
    store = TrustStore()
    assert store.directory == sandbox / "trust"
    assert store.list() == []
    key, new = store.add(a.public_path)
    assert new and key.keyid == a.keyid
    assert store.add(a.public_path)[1] is False
    store.add(b.public_path)
    assert sorted(k.keyid for k in store.list()) == sorted([a.keyid, b.keyid])
    assert store.remove(a.keyid[:8]).keyid == a.keyid
    assert [k.keyid for k in store.list()] == [b.keyid]
    with pytest.raises(UsageError, match="no trusted key"):
        store.remove(a.keyid)


def test_trust_dir_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HEDDLE_TRUST_DIR", str(tmp_path / "explicit"))
    assert default_trust_dir() == tmp_path / "explicit"
    monkeypatch.delenv("HEDDLE_TRUST_DIR")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_trust_dir() == tmp_path / "xdg" / "heddle" / "trust"
    monkeypatch.delenv("XDG_CONFIG_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_trust_dir() == tmp_path / "home" / ".config" / "heddle" / "trust"


def test_trust_names_pin_keys_for_one_command(sandbox: Path) -> None:
    a = generate(sandbox / "a", None)
    b = generate(sandbox / "b", None)
    store = TrustStore()
    store.add(a.public_path)
    assert [k.keyid for k in resolve_trust([])] == [a.keyid]
    assert [k.keyid for k in resolve_trust([str(b.public_path)])] == [b.keyid]
    assert [k.keyid for k in resolve_trust([a.keyid])] == [a.keyid]
    with pytest.raises(UsageError, match="--trust nothing"):
        resolve_trust(["nothing"])


def test_a_plain_keygen_key_is_the_key_cryptography_reads_in_any_layout(sandbox: Path) -> None:
    """An unencrypted key as keygen writes it is read without cryptography's serialization module; the
    same key written otherwise (other line breaks), and anything not an Ed25519 key, go through it."""
    import base64

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key

    made = generate(sandbox / "me", None)
    data = made.private_path.read_bytes()
    reference = serialization.load_pem_private_key(data, password=None)
    key = load_signing_key(made.private_path)
    assert key.keyid == made.keyid and key.key.private_bytes_raw() == reference.private_bytes_raw()
    body = base64.b64encode(base64.b64decode(b"".join(data.splitlines()[1:-1])))
    (sandbox / "wrapped.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\r\n" + body[:32] + b"\r\n" + body[32:]
                                          + b"\r\n-----END PRIVATE KEY-----\r\n")
    assert load_signing_key(sandbox / "wrapped.key").keyid == made.keyid
    other = generate_private_key(SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (sandbox / "ec.key").write_bytes(other)
    with pytest.raises(KeyFileError, match="not an Ed25519 key"):
        load_signing_key(sandbox / "ec.key")
