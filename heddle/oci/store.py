"""Pulled bundles: `<cache root>/pulled/`, beside the verified payloads and private to the user like them.

```text
pulled/oci-<hex>/   an OCI artifact, by its manifest digest sha256:<hex>:
                      manifest.json  its OCI manifest (whose sha256 is <hex>)
                      bundle.heddle  its one layer, byte for byte
                      origin.json    the reference it was pulled as, and when
                      stat           bundle.heddle's stat when it was stored;  used: stamped at each use
pulled/url-<hex>/   a bundle downloaded from a URL, whose own sha256 is <hex> (the same files but the manifest)
pulled/refs/<sha256 of the reference>.json   the last resolution of a tag or URL, for --offline
pulled/seen/<sha256 of the reference>.json   the latest bundle seen under a tag or URL (heddle.oci.seen)
```

An entry appears in one rename of a complete staging folder (`.staging-*`, held by an flock as
the payload cache's are, so one a killed pull left is told from a live one). Its existence
proves nothing: each use reads `manifest.json` against the entry's name and `bundle.heddle`
against its stat record, re-hashing the bundle against its digest when the stat moved; an entry
that fails is evicted. What is found is then verified like any local bundle.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from heddle.errors import UsageError
from heddle.format.cache import BIRTH_SECONDS, CACHE_DIR_ENV, STALE_SECONDS, Cache, Staging, default_cache_root
from heddle.format.errors import BundleLimitError, ContentMismatchError, MalformedBundleError
from heddle.format.release import Stamp
from heddle.format.replaced import replaced
from heddle.oci.artifact import MAX_MANIFEST_BYTES, ArtifactManifest, read_manifest

PULLED = "pulled"
BUNDLE = "bundle.heddle"
MANIFEST = "manifest.json"
ORIGIN = "origin.json"
STAT = "stat"
USED = "used"
REFS = "refs"
SEEN = "seen"
ENTRY = re.compile(r"(oci|url)-([0-9a-f]{64})")
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
_HASH_CHUNK = 1024 * 1024


def oci_key(digest: str) -> str:
    return "oci-" + digest.removeprefix("sha256:")


def url_key(digest: str) -> str:
    return "url-" + digest.removeprefix("sha256:")


def key_digest(key: str) -> str:
    return "sha256:" + key.split("-", 1)[1]


def _stat_record(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "ino": st.st_ino,
            "dev": st.st_dev, "mode": stat.S_IMODE(st.st_mode)}


def _read_small(path: Path, cap: int) -> bytes:
    """A file of an entry, never through a link, within `cap`; OSError (FileNotFoundError too) passes."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        data = fh.read(cap + 1)
    if len(data) > cap:
        raise OSError(errno.EFBIG, "over its cap")
    return data


def _write_new(path: Path, data: bytes, mode: int = 0o400) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def hash_file(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
    digest = hashlib.sha256()
    try:
        while chunk := os.read(fd, _HASH_CHUNK):
            digest.update(chunk)
    finally:
        os.close(fd)
    return "sha256:" + digest.hexdigest()


class BlobWriter:
    """`bundle.heddle` being written into a staging entry: hashed and counted as it is written, and
    refused the moment it passes the size it must have (`exact`) or may have (`cap`)."""

    def __init__(self, path: Path, *, what: str, exact: int | None = None, cap: int | None = None) -> None:
        self.path, self.what, self.exact, self.cap = path, what, exact, cap
        self.size = 0
        self._hash = hashlib.sha256()
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600)

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.exact is not None and self.size > self.exact:
            raise ContentMismatchError(f"{self.what}: the blob is longer than the {self.exact} bytes its manifest "
                                       "says; it was not used")
        if self.cap is not None and self.size > self.cap:
            raise BundleLimitError(f"{self.what}: the download is over {self.cap} bytes, larger than any bundle "
                                   "within the caps; it was not used")
        self._hash.update(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(self._fd, view):]

    def finish(self) -> str:
        """The sha256 of what was written, once it is on disk and read-only."""
        if self.exact is not None and self.size != self.exact:
            raise ContentMismatchError(f"{self.what}: the blob is {self.size} bytes, not the {self.exact} its "
                                       "manifest says; it was not used")
        os.fsync(self._fd)
        os.fchmod(self._fd, 0o400)
        self.close()
        return "sha256:" + self._hash.hexdigest()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True)
class PulledEntry:
    """One pulled bundle as `heddle cache ls` shows it; `problem` says why it would be evicted."""

    key: str
    path: Path
    reference: str | None
    size: int
    last_used: float
    problem: str | None = None

    @property
    def kind(self) -> str:
        return self.key.split("-", 1)[0]

    @property
    def digest(self) -> str:
        return key_digest(self.key)


class Staged:
    """A staging entry being filled: the bundle, its manifest and origin, renamed into place whole."""

    def __init__(self, store: PulledStore, staging: Staging) -> None:
        self._store, self._staging = store, staging
        self.entry = staging.entry
        self.bundle = self.entry / BUNDLE

    def writer(self, *, what: str, exact: int | None = None, cap: int | None = None) -> BlobWriter:
        return BlobWriter(self.bundle, what=what, exact=exact, cap=cap)

    def add(self, name: str, data: bytes) -> None:
        _write_new(self.entry / name, data)

    def commit(self, key: str, blob_digest: str, *, reference: str) -> Path:
        """Put the entry in place under `key` (an entry a racing pull put there first is kept if
        it proves); the path of its bundle."""
        origin = {"reference": reference, "pulled": datetime.now(UTC).isoformat(timespec="seconds")}
        self.add(ORIGIN, json.dumps(origin, ensure_ascii=False).encode())
        self.add(STAT, json.dumps(_stat_record(os.lstat(self.bundle))).encode())
        self.add(USED, b"")
        os.rmdir(self._staging.payload)  # the payload cache's staging makes one; a pulled entry has none
        target = self._store.root / key
        for _ in range(3):
            try:
                os.rename(self.entry, target)
                break
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                    raise
                if self._store.problem(key, blob_digest) is None:
                    break
                self._store.evict(key)
        else:
            raise UsageError(f"pulled entry {target} keeps being replaced while heddle writes it; is another "
                             "program writing into the cache folder?")
        self._staging.discard()
        return target / BUNDLE


class PulledStore:
    def __init__(self, cache_root: Path | None = None) -> None:
        base = Path(cache_root) if cache_root is not None else default_cache_root()
        self._cache = Cache(base / PULLED)
        self._cache.setting = "--cache-dir" if cache_root is not None else CACHE_DIR_ENV
        self.root = self._cache.root

    def open(self, *, create: bool = True) -> bool:
        """Check the folder is this user's alone (making it with `create`); False when it is not there."""
        made = self._cache.open(create=create)
        self.root = self._cache.root
        return made

    # -------------------------------------------------------------- reading

    def _entry_dir(self, key: str) -> Path | None:
        path = self.root / key
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        if not stat.S_ISDIR(st.st_mode):
            kind = "a link" if stat.S_ISLNK(st.st_mode) else "a file"
            raise UsageError(f"pulled entry {path} is {kind}, not a folder; remove it (`rm {path}`) or point "
                             f"{self._cache.setting} at another folder")
        return path

    def manifest(self, key: str) -> ArtifactManifest | None:
        """The OCI manifest an `oci-` entry holds, if it is the one its name says."""
        try:
            raw = _read_small(self.root / key / MANIFEST, MAX_MANIFEST_BYTES)
        except OSError:
            return None
        if hashlib.sha256(raw).hexdigest() != key.split("-", 1)[1]:
            return None
        try:
            return read_manifest(raw, what=f"cached {key}")
        except MalformedBundleError:
            return None

    def _stat_problem(self, key: str) -> str | None:
        """Why the entry is not as it was stored, judged from stat alone (what `cache ls` shows)."""
        entry = self.root / key
        problem = self._cache.entry_problem(key)
        if problem is not None:
            return problem
        try:
            st = os.lstat(entry / BUNDLE)
        except FileNotFoundError:
            return "it has no bundle.heddle"
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o222:
            return "its bundle.heddle is not a read-only regular file of this user"
        try:
            record = json.loads(_read_small(entry / STAT, 4096))
        except (OSError, ValueError):
            return "its stat record cannot be read"
        if record != _stat_record(st):
            return "its bundle.heddle changed since it was pulled"
        return None

    def problem(self, key: str, blob_digest: str) -> str | None:
        """Why the entry under `key` is not exactly the blob `blob_digest`, or None. A file whose stat
        moved (a copy, a restore) but whose bytes are the same is kept, its stat recorded again."""
        if self._entry_dir(key) is None:
            return "it is not there"
        problem = self._stat_problem(key)
        if problem is None:
            return None
        if problem != "its bundle.heddle changed since it was pulled":
            return problem
        bundle = self.root / key / BUNDLE
        if hash_file(bundle) != blob_digest:
            return "its bundle.heddle does not match its digest"
        self._rewrite_stat(key)
        return None

    def _rewrite_stat(self, key: str) -> None:
        folder = self.root / key
        with replaced(folder / STAT, prefix=".stat-", mode=0o400, durable=False) as fh:
            fh.write(json.dumps(_stat_record(os.lstat(folder / BUNDLE))).encode())

    def find(self, key: str, blob_digest: str) -> Path | None:
        """The bundle stored under `key` once it proves to be `blob_digest`; None when there is
        none (one that does not prove is evicted)."""
        if not self.open(create=False) or self._entry_dir(key) is None:
            return None
        if self.problem(key, blob_digest) is not None:
            self.evict(key)
            return None
        return self.root / key / BUNDLE

    def evict(self, key: str) -> None:
        self._cache.evict(key)

    def touch(self, key: str) -> None:
        self._cache.touch(key)

    # -------------------------------------------------------------- writing

    @contextmanager
    def staging(self) -> Iterator[Staged]:
        staging = self._cache.new_staging()
        self.root = self._cache.root
        try:
            yield Staged(self, staging)
        finally:
            staging.discard()

    # -------------------------------------------------------------- resolutions

    def _ref_path(self, reference: str) -> Path:
        return self.root / REFS / (hashlib.sha256(reference.encode()).hexdigest() + ".json")

    def record(self, reference: str, key: str) -> None:
        """Remember that `reference` (a tag or URL) last resolved to the entry `key`."""
        self.open(create=True)
        refs = self.root / REFS
        try:
            os.mkdir(refs, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(refs).st_mode):
                raise UsageError(f"{refs} is not a folder; remove it") from None
        body = {"reference": reference, "entry": key, "at": datetime.now(UTC).isoformat(timespec="seconds")}
        with replaced(self._ref_path(reference), prefix=".ref-", durable=False) as fh:
            fh.write(json.dumps(body, ensure_ascii=False).encode())

    def last(self, reference: str) -> str | None:
        """The entry `reference` last resolved to, or None."""
        if not self.open(create=False):
            return None
        try:
            data = json.loads(_read_small(self._ref_path(reference), 64 * 1024))
        except (OSError, ValueError):
            return None
        key = data.get("entry") if isinstance(data, dict) and data.get("reference") == reference else None
        return key if isinstance(key, str) and ENTRY.fullmatch(key) else None

    def seen(self, reference: str) -> Stamp | None:
        """The latest bundle seen under `reference`, or None (a record that does not read is none)."""
        if not self.open(create=False):
            return None
        try:
            data = json.loads(_read_small(self._record_path(SEEN, reference), 64 * 1024))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("reference") != reference:
            return None
        return Stamp.from_json(data.get("bundle"))

    def see(self, reference: str, stamp: Stamp) -> None:
        """Remember `stamp` as the latest bundle seen under `reference`."""
        self.open(create=True)
        body = {"reference": reference, "bundle": stamp.as_json(),
                "at": datetime.now(UTC).isoformat(timespec="seconds")}
        with replaced(self._record_path(SEEN, reference), prefix=".seen-", durable=False) as fh:
            fh.write(json.dumps(body, ensure_ascii=False).encode())

    def _record_path(self, folder: str, reference: str) -> Path:
        """Where a record of `reference` lives in `folder` (made, private, when it is not there)."""
        where = self.root / folder
        try:
            os.mkdir(where, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(where).st_mode):
                raise UsageError(f"{where} is not a folder; remove it") from None
        except FileNotFoundError:
            pass  # no cache yet: nothing to read
        return where / (hashlib.sha256(reference.encode()).hexdigest() + ".json")

    # -------------------------------------------------------------- ls and prune

    def entries(self) -> list[PulledEntry]:
        if not self.open(create=False):
            return []
        out: list[PulledEntry] = []
        for name in sorted(os.listdir(self.root)):
            if not ENTRY.fullmatch(name):
                continue
            path = self.root / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                out.append(PulledEntry(name, path, None, 0, st.st_mtime, "is not a folder"))
                continue
            try:
                used = os.lstat(path / USED).st_mtime
            except FileNotFoundError:
                used = st.st_mtime
            try:
                origin = json.loads(_read_small(path / ORIGIN, 64 * 1024))
                reference = origin.get("reference") if isinstance(origin, dict) else None
            except (OSError, ValueError):
                reference = None
            try:
                size = os.lstat(path / BUNDLE).st_size
            except FileNotFoundError:
                size = 0
            problem = self._stat_problem(name)
            if problem is None and name.startswith("oci-") and self.manifest(name) is None:
                problem = "its manifest.json is not the manifest its name says"
            out.append(PulledEntry(name, path, reference if isinstance(reference, str) else None, size, used,
                                   problem))
        return out

    def prune(self, *, older_than: float | None) -> tuple[list[PulledEntry], int]:
        """Remove entries unused for `older_than` seconds (all with None) or that would be evicted,
        staging nobody holds, and resolutions whose entry is gone: (removed, staging removed)."""
        if not self.open(create=False):
            return [], 0
        now = time.time()
        staging = self._cache.sweep(older_than=BIRTH_SECONDS if older_than is None else
                                    max(BIRTH_SECONDS, min(older_than, STALE_SECONDS)))
        removed: list[PulledEntry] = []
        for info in self.entries():
            if older_than is None or info.problem is not None or now - info.last_used >= older_than:
                if stat.S_ISDIR(os.lstat(info.path).st_mode):
                    self.evict(info.key)
                else:
                    os.unlink(info.path)
                removed.append(info)
        refs = self.root / REFS
        if os.path.isdir(refs) and not os.path.islink(refs):
            for name in os.listdir(refs):
                try:
                    data = json.loads(_read_small(refs / name, 64 * 1024))
                    key = data.get("entry") if isinstance(data, dict) else None
                except (OSError, ValueError):
                    key = None
                if not isinstance(key, str) or not (self.root / key).is_dir():
                    os.unlink(refs / name)
        return removed, staging
