"""Whether a bundle looked at without opening it is verified: the trust status `inspect` prints.

VERIFIED only when a trusted key signed the manifest and the payload in the cache proves to be
what was sealed (the same re-open proof a run makes). Everything else is UNVERIFIED, with why:
nothing here unpacks, and a verdict never admits an unsigned bundle, whatever the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from heddle.format.cache import Cache, reprove
from heddle.format.errors import BundleError
from heddle.format.signing import decide_trust
from heddle.format.trust import TrustPolicy
from heddle.format.verify import Peek


@dataclass(frozen=True)
class TrustVerdict:
    verified: bool
    detail: str  # why, as one clause: who signed, and whether the payload was proved
    signers: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        return "VERIFIED" if self.verified else "UNVERIFIED"

    def __str__(self) -> str:
        return f"{self.status} ({self.detail})"


def trust_verdict(bundle: Path, seen: Peek, trust: TrustPolicy, *, cache_dir: Path | None = None) -> TrustVerdict:
    """The verdict on the bundle at `bundle`, whose manifest and signatures `seen` holds (from
    `heddle.format.verify.peek`), under `trust`, against the cache at `cache_dir`."""
    if seen.legacy:
        return TrustVerdict(False, "format-1 gzip bundle: carries no signature")
    try:
        signers = tuple(decide_trust(seen.manifest_bytes, seen.signatures, trust.trusted, allow_unsigned=False,
                                     what=str(bundle)))
    except BundleError as exc:
        return TrustVerdict(False, f"{exc.kind.replace('_', ' ')}: {exc.message}")
    who = ", ".join(signers)
    digest = seen.digest
    cache = Cache(cache_dir)
    if digest is not None and cache.open(create=False) and cache.has(digest):
        problem = reprove(cache, digest, seen.manifest)
        if problem is None:
            return TrustVerdict(True, f"signed by {who}; payload verified in the cache", signers)
        return TrustVerdict(False, f"signed by trusted key {who}; the cached copy is not what was sealed: "
                                   f"{problem}; run heddle verify", signers)
    return TrustVerdict(False, f"signed by trusted key {who}; payload not checked yet: run heddle verify", signers)
