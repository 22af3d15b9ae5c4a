"""The latest bundle seen under a tag or URL, so `heddle run` and `heddle pull` never go back or sideways.

Each pull by tag (or URL) is compared with the bundle last seen under that reference in this cache
(heddle.oci.store, `pulled/seen/`), by the order of heddle.format.release, before anything uses it:
an older one (signed earlier, or of a lower release) or another agent (another name) is refused
unless `--allow-downgrade` is given, and what is accepted becomes the latest seen: once verified, with
the time of its trusted signatures, for `heddle run`; as pulled for `heddle pull`, which verifies
nothing (so a bundle it pulls that would not verify can raise the mark, which refuses, never lowers).

The new bundle's time is read before trust is decided, so it is taken as the earliest time any of
its signatures claims: a signature nobody can verify can only lower it (a refusal), never raise it
past one that verifies, and the release and name are in the manifest the signatures cover. The
record is a high-water mark in the user's private cache folder (checked owned and not writable by
others at every use), and it is only ever compared against a new bundle: a record raised by hand, or
by a bundle that then failed verification, can cause a refusal, never a downgrade. Removing it forgets
the mark, which only its owner can do, and which is no more than `--allow-downgrade` that owner can
pass anyway.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from heddle.errors import UsageError
from heddle.format.release import DowngradeError, Stamp, lower_bound, refusal
from heddle.format.verify import peek
from heddle.oci.artifact import Pulled
from heddle.oci.store import PulledStore


def seen_key(pulled: Pulled) -> str | None:
    """The tag or URL `pulled` is remembered under; None for a digest, which names one bundle for good, or a file."""
    if pulled.reference is None:
        return None
    if pulled.resolved is not None:
        return str(pulled.resolved.reference) if pulled.resolved.reference.tag is not None else None
    return pulled.reference if pulled.oci_digest is None else None


def remember(key: str, sealed: Any, *, cache_dir: Path | None = None) -> None:
    """Remember a verified bundle (a Bundle) as the latest seen under `key`: its time is that of its
    trusted signatures, so a bundle that did not verify never moves the mark."""
    if sealed.legacy:
        return  # a format-1 bundle states no time, release or signature
    stamp = Stamp(sealed.digest, sealed.signed_at, sealed.manifest.release, sealed.manifest.name)
    store = PulledStore(cache_dir)
    old = store.seen(key)
    if old is None or old.digest != stamp.digest or old.signed_at != stamp.signed_at:
        store.see(key, stamp)


def check_seen(pulled: Pulled, *, allow_downgrade: bool = False, cache_dir: Path | None = None,
               record: bool = True) -> str | None:
    """Refuse `pulled` when it is older than, or another agent than, the bundle last seen under its tag or
    URL (DowngradeError, exit 11), else remember it (with `record`; a caller that verifies it records it
    with `remember` once it has). With `allow_downgrade` it is accepted, and the returned line says what
    was accepted."""
    key = seen_key(pulled)
    if key is None:
        if allow_downgrade:
            raise UsageError(f"--allow-downgrade applies to a reference by tag or URL; {pulled.name} names one "
                             "bundle for good: leave it out")
        return None
    seen = peek(pulled.path)
    if seen.legacy or seen.digest is None:
        return None  # a format-1 bundle states no time, release or signature
    new = Stamp(f"sha256:{seen.digest}", lower_bound(seen.signatures), seen.manifest.release, seen.manifest.name)
    store = PulledStore(cache_dir)
    old = store.seen(key)
    why = refusal(new, old) if old is not None else None
    if old is not None and why is not None and not allow_downgrade:
        raise DowngradeError(f"{key}: refused {new.digest}, {why}; the latest bundle seen here under it is "
                             f"{old.digest} ({old.when()}); pass --allow-downgrade to accept it")
    if record and (old is None or old.digest != new.digest):
        store.see(key, new)
    if old is not None and why is not None:
        return f"accepted {new.digest} with --allow-downgrade: {why}"
    return None
