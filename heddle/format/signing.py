"""Signatures over the manifest, and the trust decision made from them.

Each signature is Ed25519 over the DSSE pre-authentication encoding of a payload type and a
body, so a signature cannot be replayed over some other kind of document that happens to share
bytes with a manifest. A signature made now signs a small statement, the manifest's digest and
the time it was signed (`signed_at`), so the time is sealed without touching the manifest: the
same inputs still give the same manifest and payload. A signature of an older heddle signs the
manifest bytes themselves, and its time is unknown.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from heddle import canonical
from heddle.format.errors import (
    BadSignatureError,
    BundleLimitError,
    MalformedBundleError,
    UnsignedBundleError,
    UntrustedSignerError,
)
from heddle.format.keys import PublicKey, SigningKey
from heddle.format.limits import DEFAULT_LIMITS, Limits
from heddle.format.members import load_member

PAYLOAD_TYPE = "application/vnd.heddle.manifest+json"
STATEMENT_TYPE = "application/vnd.heddle.statement+json"
# RFC 3339 in UTC to the microsecond, always this long: text order is time order.
_SIGNED_AT = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z")
_KEYID = re.compile(r"[0-9a-f]{16}")
_TRUST_HINT = "trust its key with `heddle trust add KEY.pub` or pass --trust KEY.pub"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(body), body)


def now_stamp() -> str:
    """The time now as a `signed_at` is written."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def is_stamp(value: object) -> bool:
    if not isinstance(value, str) or not _SIGNED_AT.fullmatch(value):
        return False
    try:
        datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return False
    return True


def statement(manifest_bytes: bytes, signed_at: str) -> bytes:
    """What a timed signature signs: the manifest's digest and the time, as canonical JSON."""
    digest = "sha256:" + hashlib.sha256(manifest_bytes).hexdigest()
    return canonical.dumps({"manifest": digest, "signed_at": signed_at})


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes
    signed_at: str | None = None  # None: a signature over the manifest bytes, of unknown time

    def to_json(self) -> dict[str, str]:
        out = {"keyid": self.keyid, "sig": base64.b64encode(self.sig).decode("ascii")}
        if self.signed_at is not None:
            out["signed_at"] = self.signed_at
        return out

    def message(self, payload_type: str, manifest_bytes: bytes) -> bytes:
        """The bytes this signature is over."""
        if self.signed_at is None:
            return pae(payload_type, manifest_bytes)
        return pae(STATEMENT_TYPE, statement(manifest_bytes, self.signed_at))


@dataclass(frozen=True)
class Signed:
    """Who of the trusted keys signed, and the latest time one of them sealed (None: unknown)."""

    signers: list[str]
    signed_at: str | None = None


@dataclass(frozen=True)
class Signatures:
    signatures: tuple[Signature, ...] = ()
    payload_type: str = PAYLOAD_TYPE

    @property
    def keyids(self) -> list[str]:
        return [s.keyid for s in self.signatures]

    def to_bytes(self) -> bytes:
        ordered = sorted(self.signatures, key=lambda s: s.keyid)
        return canonical.dumps(
            {"payloadType": self.payload_type, "signatures": [s.to_json() for s in ordered]}
        )

    def with_signature(self, signature: Signature) -> Signatures:
        """Add `signature`, replacing an earlier one by the same key."""
        kept = tuple(s for s in self.signatures if s.keyid != signature.keyid)
        return Signatures((*kept, signature), self.payload_type)

    @classmethod
    def from_bytes(cls, data: bytes, *, limits: Limits = DEFAULT_LIMITS, what: str = "signatures") -> Signatures:
        if len(data) > limits.max_signatures_bytes:
            raise BundleLimitError(f"{what} is {len(data)} bytes, over the cap of {limits.max_signatures_bytes}")
        obj = load_member(data, what=what)
        if not isinstance(obj, dict) or set(obj) != {"payloadType", "signatures"}:
            raise MalformedBundleError(f"{what} must be an object with exactly payloadType and signatures")
        if obj["payloadType"] != PAYLOAD_TYPE:
            raise MalformedBundleError(f"{what} payloadType is {obj['payloadType']!r}, expected {PAYLOAD_TYPE!r}")
        items = obj["signatures"]
        if not isinstance(items, list):
            raise MalformedBundleError(f"{what} signatures must be a list")
        if len(items) > limits.max_signatures:
            raise BundleLimitError(f"{what} holds {len(items)} signatures, over the cap of {limits.max_signatures}")
        out: list[Signature] = []
        for i, item in enumerate(items):
            where = f"{what} signatures[{i}]"
            if not isinstance(item, dict) or not {"keyid", "sig"} <= set(item) <= {"keyid", "sig", "signed_at"}:
                raise MalformedBundleError(f"{where} must be an object with exactly keyid and sig, and "
                                           "optionally signed_at")
            signed_at = item.get("signed_at")
            if "signed_at" in item and not is_stamp(signed_at):  # JSON null too: absent is written absent
                raise MalformedBundleError(f"{where}.signed_at is not a time written YYYY-MM-DDTHH:MM:SS.ffffffZ "
                                           "(UTC)")
            keyid, sig = item["keyid"], item["sig"]
            if not isinstance(keyid, str) or not _KEYID.fullmatch(keyid):
                raise MalformedBundleError(f"{where}.keyid must be 16 lowercase hex digits")
            try:
                raw = base64.b64decode(sig, validate=True) if isinstance(sig, str) else b""
            except binascii.Error:
                raw = b""
            if len(raw) != 64:
                raise MalformedBundleError(f"{where}.sig (key {keyid}) is not a base64 Ed25519 signature")
            if any(s.keyid == keyid for s in out):
                raise MalformedBundleError(f"{what} lists key {keyid} twice; each key signs once")
            if any(s.sig == raw for s in out):
                raise MalformedBundleError(f"{what} holds the same signature twice (key {keyid})")
            out.append(Signature(keyid, raw, signed_at))
        return cls(tuple(out), obj["payloadType"])


def sign(manifest_bytes: bytes, key: SigningKey, *, signed_at: str | None = None) -> Signature:
    """`key`'s signature of the manifest and the time (now, unless `signed_at` says when)."""
    at = signed_at if signed_at is not None else now_stamp()
    if not is_stamp(at):
        raise ValueError(f"signed_at {at!r} is not written YYYY-MM-DDTHH:MM:SS.ffffffZ")
    unsigned = Signature(key.keyid, b"", at)
    return Signature(key.keyid, key.sign(unsigned.message(PAYLOAD_TYPE, manifest_bytes)), at)


def decide_trust(
    manifest_bytes: bytes,
    signatures: Signatures,
    trusted: Iterable[PublicKey],
    *,
    allow_unsigned: bool,
    what: str,
) -> list[str]:
    """Return the ids of the trusted keys that signed, or raise the outcome that applies."""
    return check_signatures(manifest_bytes, signatures, trusted, allow_unsigned=allow_unsigned, what=what).signers


def check_signatures(
    manifest_bytes: bytes,
    signatures: Signatures,
    trusted: Iterable[PublicKey],
    *,
    allow_unsigned: bool,
    what: str,
) -> Signed:
    """The trusted keys that signed and when, or raise the outcome that applies.

    The time is the latest `signed_at` among the signatures that verified under a trusted key: a
    key holder who signs an old manifest again says it is current now. Signatures of no trusted
    key say nothing of time.

    A signature whose key id names a trusted key must verify: a bad one is a hard failure
    even when another trusted key also signed. A key id no trusted key has is only a hint,
    so such a signature is tried against every trusted key before it is called untrusted.
    """
    if not signatures.signatures:
        if allow_unsigned:
            return Signed([])
        raise UnsignedBundleError(
            f"{what} is unsigned; sign it with `heddle sign {what} --key KEY` or pass --allow-unsigned"
        )
    keys: Sequence[PublicKey] = list(trusted)
    by_id = {k.keyid: k for k in keys}
    signers: list[str] = []
    times: list[str] = []
    for signature in signatures.signatures:
        message = signature.message(signatures.payload_type, manifest_bytes)
        claimed = by_id.get(signature.keyid)
        if claimed is not None:
            if not claimed.verify(signature.sig, message):
                raise BadSignatureError(
                    f"{what}: the signature by trusted key {signature.keyid} does not match the manifest "
                    "(the bundle was altered after signing); do not run it"
                )
            signers.append(claimed.keyid)
            times += [signature.signed_at] if signature.signed_at is not None else []
            continue
        for key in keys:
            if key.verify(signature.sig, message):
                signers.append(key.keyid)
                times += [signature.signed_at] if signature.signed_at is not None else []
                break
    if not signers:
        ids = signatures.keyids
        named = f"key {ids[0]}, which is not" if len(ids) == 1 else f"keys {', '.join(ids)}, none of which is"
        raise UntrustedSignerError(f"{what} is signed by {named} trusted; {_TRUST_HINT}")
    return Signed(sorted(set(signers)), max(times) if times else None)
