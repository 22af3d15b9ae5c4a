"""The cache of verified payloads: `<root>/<digest>/`, read-only, filled only by rename.

A directory appears under its digest in one rename, after every byte in it was checked,
so its existence means "verified"; a half-written tree only ever lives in a private
`.staging-*` folder beside it and is removed on failure.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path

CACHE_DIR_ENV = "HEDDLE_CACHE_DIR"
STAGING_PREFIX = ".staging-"


def default_cache_root() -> Path:
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME")
    base = Path(cache) if cache else Path.home() / ".cache"
    return base / "heddle" / "bundles"


def remove_tree(path: Path) -> None:
    """Delete a tree this module made read-only, without following any link in it."""
    if not os.path.lexists(path):
        return
    if not stat.S_ISDIR(os.lstat(path).st_mode):
        os.unlink(path)
        return
    for top, dirs, _files in os.walk(path, followlinks=False):
        os.chmod(top, 0o700)
        for name in dirs:
            child = os.path.join(top, name)
            if stat.S_ISDIR(os.lstat(child).st_mode):
                os.chmod(child, 0o700)
    shutil.rmtree(path)


class Cache:
    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_root()

    def entry(self, key: str) -> Path:
        return self.root / key

    def has(self, key: str) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(self.entry(key)).st_mode)
        except FileNotFoundError:
            return False

    def new_staging(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=self.root))

    def commit(self, staging: Path, key: str) -> Path:
        """Rename a sealed staging tree into place; a tree already there (a racing opener) wins."""
        target = self.entry(key)
        try:
            os.rename(staging, target)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not self.has(key):
                raise
            remove_tree(staging)
        return target

    def evict(self, key: str) -> None:
        remove_tree(self.entry(key))
