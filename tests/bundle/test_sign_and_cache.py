"""Signing adds a signature and keeps the digest; re-opening a cached digest still decides trust;
--deep catches a tampered cache; rw mounts are seeded outside the cache."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from heddle.bundle.datadir import seed_data_dir
from heddle.format.errors import ContentMismatchError, UnsignedBundleError, UntrustedSignerError
from heddle.format.pack import add_signature, pack
from heddle.format.verify import verify_bundle, peek

from .conftest import KeyPair, agent_plan, make_keypair, write_agent


@pytest.fixture
def packed(sandbox: Path, keypair: KeyPair) -> Path:
    paths = write_agent(sandbox / "agent")
    out = sandbox / "app.heddle"
    pack(agent_plan(paths), out, signing_key=keypair.signing)
    return out


def test_sign_adds_a_signature_and_keeps_the_digest(sandbox: Path, keypair: KeyPair, packed: Path) -> None:
    other = make_keypair(sandbox / "keys", "other")
    before = peek(packed)
    digest, signatures = add_signature(packed, other.signing)
    after = peek(packed)
    assert digest == before.digest == after.digest
    assert after.manifest_bytes == before.manifest_bytes
    assert sorted(after.signatures.keyids) == sorted([keypair.signing.keyid, other.signing.keyid])
    # Either key alone now verifies the bundle.
    for key in (keypair.public, other.public):
        cache = sandbox / f"cache-{key.keyid}"
        assert verify_bundle(packed, trusted_keys=[key], cache_root=cache).signers == [key.keyid]
    # Signing again with the same key replaces its signature rather than adding one.
    add_signature(packed, other.signing)
    assert len(peek(packed).signatures.keyids) == 2


def test_signing_an_unsigned_bundle_makes_it_openable(sandbox: Path, keypair: KeyPair) -> None:
    paths = write_agent(sandbox / "agent")
    out = sandbox / "plain.heddle"
    pack(agent_plan(paths), out)
    with pytest.raises(UnsignedBundleError):
        verify_bundle(out, trusted_keys=[keypair.public])
    add_signature(out, keypair.signing)
    assert verify_bundle(out, trusted_keys=[keypair.public]).signers == [keypair.signing.keyid]


def test_sign_refuses_a_bundle_whose_payload_does_not_match(sandbox: Path, keypair: KeyPair) -> None:
    from .conftest import VECTORS

    target = sandbox / "tampered.heddle"
    target.write_bytes((VECTORS / "flipped-payload-byte.heddle").read_bytes())
    before = target.read_bytes()
    with pytest.raises(ContentMismatchError, match="tools/echo.py"):
        add_signature(target, keypair.signing)
    assert target.read_bytes() == before
    assert sorted(os.listdir(sandbox)) == ["cache", "home", "keys", "tampered.heddle", "trust"]


def test_a_cached_digest_is_still_checked_against_current_trust(sandbox: Path, keypair: KeyPair, packed: Path) -> None:
    first = verify_bundle(packed, trusted_keys=[keypair.public])
    assert not first.cached
    again = verify_bundle(packed, trusted_keys=[keypair.public])
    assert again.cached and again.root == first.root
    stranger = make_keypair(sandbox / "keys", "stranger")
    with pytest.raises(UntrustedSignerError, match=keypair.signing.keyid):
        verify_bundle(packed, trusted_keys=[stranger.public])
    with pytest.raises(UntrustedSignerError):
        verify_bundle(packed, trusted_keys=[], allow_unsigned=True)


def _rewrite(target: Path, text: str) -> None:
    """Change a sealed cache file in place, putting the read-only modes back."""
    os.chmod(target.parent, 0o755)
    os.chmod(target, 0o644)
    target.write_text(text)
    os.chmod(target, 0o444)
    os.chmod(target.parent, 0o555)


def test_a_modified_cache_is_evicted_and_verified_again(sandbox: Path, keypair: KeyPair, packed: Path) -> None:
    from heddle.format.cache import Cache
    from heddle.format.verify import reprove

    opened = verify_bundle(packed, trusted_keys=[keypair.public])
    assert verify_bundle(packed, trusted_keys=[keypair.public], deep=True).cached
    _rewrite(opened.root / "mounts/notes/readme.md", "# changed\n")
    # A plain re-open does not trust the cache: the stat snapshot shows the change, so the
    # copy is evicted and the payload verified from the file again.
    again = verify_bundle(packed, trusted_keys=[keypair.public])
    assert not again.cached and "mounts/notes/readme.md" in (again.repaired or "")
    assert (again.root / "mounts/notes/readme.md").read_text() == "# notes\n"
    # Without the file at hand (as `inspect` looks), the changed copy is found, naming the file.
    _rewrite(again.root / "mounts/notes/readme.md", "# changed\n")
    assert "mounts/notes/readme.md" in (reprove(Cache(), again.digest, again.manifest) or "")
    fresh = verify_bundle(packed, trusted_keys=[keypair.public])
    assert not fresh.cached
    assert (fresh.root / "mounts/notes/readme.md").read_text() == "# notes\n"


def test_rw_mounts_are_seeded_into_a_data_dir_never_the_cache(sandbox: Path, keypair: KeyPair, packed: Path) -> None:
    opened = verify_bundle(packed, trusted_keys=[keypair.public])
    data = seed_data_dir(opened, sandbox / "data")
    by_dest = {str(m.dest): m for m in data.mounts}
    assert by_dest["notes"].source == opened.root / "mounts/notes"
    assert by_dest["notes"].mode == "ro"
    work = by_dest["work"]
    assert work.mode == "rw" and work.seeded
    assert work.source == sandbox / "data" / "work"
    (work.source / "draft.txt").write_text("edited\n")
    assert stat.S_IMODE(os.stat(work.source).st_mode) & 0o200
    assert (opened.root / "mounts/work/draft.txt").read_text() == "draft\n"
    # The next run with the same data folder keeps what the last one wrote.
    again = seed_data_dir(opened, sandbox / "data")
    assert not {str(m.dest): m for m in again.mounts}["work"].seeded
    assert (sandbox / "data/work/draft.txt").read_text() == "edited\n"
    temporary = seed_data_dir(opened)
    try:
        assert temporary.created and (temporary.path / "work" / "draft.txt").read_text() == "draft\n"
    finally:
        import shutil

        shutil.rmtree(temporary.path)


def test_two_openers_racing_share_one_cache_entry(sandbox: Path, keypair: KeyPair, packed: Path) -> None:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        roots = list(pool.map(lambda _: verify_bundle(packed, trusted_keys=[keypair.public]).root, range(4)))
    assert len(set(roots)) == 1
    assert sorted(os.listdir(sandbox / "cache")) == [roots[0].parent.name]
