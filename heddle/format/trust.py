"""The per-user trust store: a folder of public keys, one `<keyid>.pub` each.

Nothing but `heddle trust add` writes here; `keygen` and `--trust` never do, so what a
machine trusts is always something its user chose. A store (or a key in it) that another
user could write to is refused, never read: its keys would be whoever's wrote last.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from heddle.errors import UsageError
from heddle.format.errors import KeyFileError
from heddle.format.keys import PublicKey, load_public_key
from heddle.format.private import (
    check_private_dir,
    check_private_file,
    make_private_dir,
)

TRUST_DIR_ENV = "HEDDLE_TRUST_DIR"


def default_trust_dir() -> Path:
    explicit = os.environ.get(TRUST_DIR_ENV)
    if explicit:
        return Path(explicit)
    config = os.environ.get("XDG_CONFIG_HOME")
    base = Path(config) if config else Path.home() / ".config"
    return base / "heddle" / "trust"


_WHAT = "trust store"


class TrustStore:
    def __init__(self, directory: Path | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_trust_dir()

    def _path(self, keyid: str) -> Path:
        return self.directory / f"{keyid}.pub"

    def _check(self) -> bool:
        """Whether the store exists; refuses one another user could change."""
        if not os.path.lexists(self.directory):
            return False
        check_private_dir(self.directory, what=_WHAT, setting=TRUST_DIR_ENV)
        return True

    def add(self, public_key_file: Path) -> tuple[PublicKey, bool]:
        """Trust the key in `public_key_file`; return it and whether it was new."""
        key = load_public_key(public_key_file)
        make_private_dir(self.directory, what=_WHAT, setting=TRUST_DIR_ENV)
        target = self._path(key.keyid)
        if target.exists():
            return key, False
        tmp = self.directory / f".{key.keyid}.pub.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        try:
            os.write(fd, key.pem())
        finally:
            os.close(fd)
        os.replace(tmp, target)
        return PublicKey(key.keyid, key.key, str(target)), True

    def list(self) -> list[PublicKey]:
        if not self._check():
            return []
        keys: list[PublicKey] = []
        for path in sorted(self.directory.glob("*.pub")):
            check_private_file(path, what="trusted key file", setting=TRUST_DIR_ENV)
            key = load_public_key(path)
            if path.stem != key.keyid:
                raise KeyFileError(
                    f"trust store file {path} holds key {key.keyid}; remove it and `heddle trust add` the key again"
                )
            keys.append(key)
        return keys

    def find(self, keyid: str) -> PublicKey | None:
        """The trusted key with this id, or with this unique id prefix (8 hex digits or more)."""
        if len(keyid) < 8:
            return None
        matches = [k for k in self.list() if k.keyid.startswith(keyid)]
        if len(matches) > 1:
            raise UsageError(f"key id {keyid!r} matches {len(matches)} trusted keys; give more of it")
        return matches[0] if matches else None

    def remove(self, keyid: str) -> PublicKey:
        key = self.find(keyid)
        if key is None:
            raise UsageError(f"no trusted key {keyid!r} in {self.directory}; see `heddle trust ls`")
        self._path(key.keyid).unlink()
        return key


def resolve_trust(names: Sequence[str], store: TrustStore | None = None) -> list[PublicKey]:
    """The keys one command trusts: those `--trust` names (files or store key ids), else the store.

    Naming keys pins trust to exactly them for this command; naming none trusts every key
    in the store.
    """
    store = store if store is not None else TrustStore()
    if not names:
        return store.list()
    keys: dict[str, PublicKey] = {}
    for name in names:
        path = Path(name)
        if path.exists():
            key = load_public_key(path)
        else:
            found = store.find(name)
            if found is None:
                raise UsageError(
                    f"--trust {name}: neither a public key file nor a key id in the trust store ({store.directory})"
                )
            key = found
        keys[key.keyid] = key
    return list(keys.values())


@dataclass(frozen=True)
class TrustPolicy:
    """Whose signatures admit a bundle, decided once by the caller and handed down whole.

    Build one with `TrustPolicy.keys(...)` (exactly these public keys), `TrustPolicy.store()`
    (every key in the user's trust store) or `TrustPolicy.allow_unsigned()`; the keys are read
    when the policy is made, so a missing or damaged key file is refused before any bundle is.
    Admitting unsigned bundles never admits a signed one nobody trusted: a signature is always
    checked, and one from no trusted key is refused (exit 4).
    """

    trusted: tuple[PublicKey, ...] = ()
    admits_unsigned: bool = False

    @classmethod
    def keys(cls, *pub_keys: str | os.PathLike[str] | PublicKey, allow_unsigned: bool = False) -> TrustPolicy:
        """Trust exactly these public keys: `.pub` files from `heddle keygen`, or loaded keys."""
        if not pub_keys:
            raise UsageError("TrustPolicy.keys() names no key; give .pub files, or use TrustPolicy.store() "
                             "for the trust store")
        loaded = [k if isinstance(k, PublicKey) else load_public_key(Path(k)) for k in pub_keys]
        return cls(_unique(loaded), allow_unsigned)

    @classmethod
    def store(cls, directory: str | os.PathLike[str] | None = None, *, allow_unsigned: bool = False) -> TrustPolicy:
        """Trust every key in the trust store ($HEDDLE_TRUST_DIR or ~/.config/heddle/trust, or `directory`)."""
        return cls(_unique(TrustStore(Path(directory) if directory is not None else None).list()), allow_unsigned)

    @classmethod
    def allow_unsigned(cls) -> TrustPolicy:
        """Admit bundles that carry no signature at all, and trust no key: a signed bundle is
        refused as untrusted. Combine with keys through `keys(..., allow_unsigned=True)` or
        `store(allow_unsigned=True)`."""
        return cls((), True)

    @classmethod
    def from_names(cls, names: Sequence[str | os.PathLike[str]], *, allow_unsigned: bool = False,
                   store: TrustStore | None = None) -> TrustPolicy:
        """The `--trust` rule both shells follow: the named keys (`.pub` files, or key ids in the
        trust store) and only those; naming none trusts the whole store."""
        return cls(_unique(resolve_trust([os.fspath(n) for n in names], store)), allow_unsigned)

    @property
    def keyids(self) -> list[str]:
        return [k.keyid for k in self.trusted]


def _unique(keys: Iterable[PublicKey]) -> tuple[PublicKey, ...]:
    return tuple({k.keyid: k for k in keys}.values())
