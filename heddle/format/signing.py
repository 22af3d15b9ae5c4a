"""Signatures over the manifest, and the trust decision made from them.

Each signature is Ed25519 over the DSSE pre-authentication encoding of
(payload type, manifest bytes), so a signature cannot be replayed over some other kind
of document that happens to share bytes with a manifest.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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
_KEYID = re.compile(r"[0-9a-f]{16}")
_TRUST_HINT = "trust its key with `heddle trust add KEY.pub` or pass --trust KEY.pub"


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE v1 pre-authentication encoding."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(kind), kind, len(body), body)


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes

    def to_json(self) -> dict[str, str]:
        return {"keyid": self.keyid, "sig": base64.b64encode(self.sig).decode("ascii")}


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
            if not isinstance(item, dict) or set(item) != {"keyid", "sig"}:
                raise MalformedBundleError(f"{where} must be an object with exactly keyid and sig")
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
            out.append(Signature(keyid, raw))
        return cls(tuple(out), obj["payloadType"])


def sign(manifest_bytes: bytes, key: SigningKey) -> Signature:
    return Signature(key.keyid, key.sign(pae(PAYLOAD_TYPE, manifest_bytes)))


def decide_trust(
    manifest_bytes: bytes,
    signatures: Signatures,
    trusted: Iterable[PublicKey],
    *,
    allow_unsigned: bool,
    what: str,
) -> list[str]:
    """Return the ids of the trusted keys that signed, or raise the outcome that applies.

    A signature whose key id names a trusted key must verify: a bad one is a hard failure
    even when another trusted key also signed. A key id no trusted key has is only a hint,
    so such a signature is tried against every trusted key before it is called untrusted.
    """
    if not signatures.signatures:
        if allow_unsigned:
            return []
        raise UnsignedBundleError(
            f"{what} is unsigned; sign it with `heddle sign {what} --key KEY` or pass --allow-unsigned"
        )
    keys: Sequence[PublicKey] = list(trusted)
    by_id = {k.keyid: k for k in keys}
    message = pae(signatures.payload_type, manifest_bytes)
    signers: list[str] = []
    for signature in signatures.signatures:
        claimed = by_id.get(signature.keyid)
        if claimed is not None:
            if not claimed.verify(signature.sig, message):
                raise BadSignatureError(
                    f"{what}: the signature by trusted key {signature.keyid} does not match the manifest "
                    "(the bundle was altered after signing); do not run it"
                )
            signers.append(claimed.keyid)
            continue
        for key in keys:
            if key.verify(signature.sig, message):
                signers.append(key.keyid)
                break
    if not signers:
        ids = signatures.keyids
        named = f"key {ids[0]}, which is not" if len(ids) == 1 else f"keys {', '.join(ids)}, none of which is"
        raise UntrustedSignerError(f"{what} is signed by {named} trusted; {_TRUST_HINT}")
    return sorted(set(signers))
