"""Ed25519 signing keys: generating, storing and loading them, and naming them by key id.

A key id is the first 16 hex digits of the sha256 of the raw 32-byte Ed25519 public key.
It is a lookup hint and a handle for people; what a verifier trusts is the key itself.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from heddle import secret_env
from heddle.format.errors import KeyFileError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

PASSPHRASE_ENV = secret_env.KEY_PASSPHRASE
KEY_ID_HEX = 16


def key_id(public_key: Ed25519PublicKey) -> str:
    return hashlib.sha256(public_key.public_bytes_raw()).hexdigest()[:KEY_ID_HEX]


# An unencrypted key as `heddle keygen` writes it: PEM of PKCS#8 (RFC 8410), this DER prefix, then the key's
# 32-byte seed. Read here without cryptography's serialization module, whose import (its SSH formats and
# ciphers) is a share of a signed `heddle bundle`'s start-up; any other key file goes through it.
_PLAIN_PEM = re.compile(rb"-----BEGIN PRIVATE KEY-----\r?\n([A-Za-z0-9+/]{64})\r?\n-----END PRIVATE KEY-----\r?\n?")
_ED25519_PKCS8 = bytes.fromhex("302e020100300506032b657004220420")


def _plain_seed(data: bytes) -> bytes | None:
    """The seed of an unencrypted Ed25519 key in exactly keygen's form, else None."""
    match = _PLAIN_PEM.fullmatch(data)
    if match is None:
        return None
    der = base64.b64decode(match[1], validate=True)
    return der[len(_ED25519_PKCS8):] if len(der) == 48 and der.startswith(_ED25519_PKCS8) else None


@dataclass(frozen=True)
class PublicKey:
    """A key a verifier may trust, and where it came from (for messages)."""

    keyid: str
    key: Ed25519PublicKey
    source: str

    def verify(self, signature: bytes, message: bytes) -> bool:
        from cryptography.exceptions import InvalidSignature

        try:
            self.key.verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def pem(self) -> bytes:
        from cryptography.hazmat.primitives import serialization

        return self.key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@dataclass(frozen=True)
class SigningKey:
    keyid: str
    key: Ed25519PrivateKey

    def sign(self, message: bytes) -> bytes:
        return self.key.sign(message)

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.keyid, self.key.public_key(), "signing key")


@dataclass(frozen=True)
class GeneratedKey:
    keyid: str
    private_path: Path
    public_path: Path


def key_paths(out: Path) -> tuple[Path, Path]:
    """`--out PATH` names a pair: PATH.key and PATH.pub."""
    return out.with_name(out.name + ".key"), out.with_name(out.name + ".pub")


def _write_new(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)  # the umask must not loosen or tighten what a key file is
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def generate(out: Path, passphrase: bytes | None) -> GeneratedKey:
    """Write PATH.key (PKCS#8 PEM, 0600, encrypted unless `passphrase` is None) and PATH.pub."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private_path, public_path = key_paths(out)
    for path in (private_path, public_path):
        if os.path.lexists(path):
            raise KeyFileError(f"{path} already exists; choose another --out or remove it first")
    if not out.parent.is_dir():
        raise KeyFileError(f"--out {out}: the folder {out.parent} does not exist")
    key = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase) if passphrase else serialization.NoEncryption()
    )
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    public = PublicKey(key_id(key.public_key()), key.public_key(), str(public_path))
    _write_new(private_path, private_pem, 0o600)
    try:
        _write_new(public_path, public.pem(), 0o644)
    except BaseException:
        private_path.unlink()
        raise
    return GeneratedKey(keyid=public.keyid, private_path=private_path, public_path=public_path)


def load_public_key(path: Path) -> PublicKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"public key {path}: cannot be read: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        raise KeyFileError(f"public key {path}: not a PEM public key (expected a .pub from `heddle keygen`)") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"public key {path}: not an Ed25519 key; heddle signs with Ed25519 only")
    return PublicKey(key_id(key), key, str(path))


def passphrase_from_env_or_prompt(prompt: str, *, confirm: bool, missing_hint: str) -> bytes:
    """HEDDLE_KEY_PASSPHRASE if set, else ask on the terminal; refuse when there is none."""
    value = os.environ.get(PASSPHRASE_ENV)
    if value is not None:
        if not value:
            raise KeyFileError(f"{PASSPHRASE_ENV} is set but empty; set a passphrase or unset it")
        return value.encode("utf-8")
    if not sys.stdin.isatty():
        raise KeyFileError(f"no passphrase: set {PASSPHRASE_ENV} or {missing_hint}")
    first = getpass.getpass(prompt)
    if not first:
        raise KeyFileError(f"an empty passphrase is not a passphrase; {missing_hint}")
    if confirm and getpass.getpass("Repeat the passphrase: ") != first:
        raise KeyFileError("the two passphrases differ; nothing was written")
    return first.encode("utf-8")


def load_signing_key(path: Path, passphrase: Callable[[], bytes] | bytes | None = None) -> SigningKey:
    """Load PATH.key; an encrypted key asks `passphrase` (default: env, then the terminal)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"signing key {path}: cannot be read: {exc.strerror}") from None
    seed = _plain_seed(data)
    if seed is not None:
        plain = Ed25519PrivateKey.from_private_bytes(seed)
        return SigningKey(key_id(plain.public_key()), plain)
    from cryptography.hazmat.primitives import serialization

    encrypted = b"ENCRYPTED PRIVATE KEY" in data
    secret: bytes | None = None
    if encrypted:
        if passphrase is None:
            secret = passphrase_from_env_or_prompt(
                f"Passphrase for {path}: ", confirm=False, missing_hint="run on a terminal to be asked"
            )
        else:
            secret = passphrase() if callable(passphrase) else passphrase
    try:
        key = serialization.load_pem_private_key(data, password=secret)
    except (ValueError, TypeError):
        if encrypted:
            raise KeyFileError(f"signing key {path}: wrong passphrase (or a damaged key file)") from None
        raise KeyFileError(
            f"signing key {path}: not a PEM private key (expected a .key from `heddle keygen`)"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"signing key {path}: not an Ed25519 key; heddle signs with Ed25519 only")
    return SigningKey(key_id(key.public_key()), key)
