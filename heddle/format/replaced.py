"""A file written whole or not at all: a temporary file beside it, renamed onto it at the end.

Whoever reads the path meanwhile, or after a crash, finds the old file or the whole new one,
never a torn mix; a block that fails leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def umasked(mode: int) -> int:
    """`mode` less this process's umask: what open() would have made."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


@contextlib.contextmanager
def replaced(dest: Path, *, prefix: str, suffix: str = "", mode: int | None = None,
             durable: bool = True) -> Iterator[IO[bytes]]:
    """The new contents of `dest`, renamed onto it only if the block completes.

    `mode` None keeps the temporary file's own (0o600); `durable` syncs the data to disk before
    the rename, so that the rename never outlives the bytes. OSError when the temporary file
    cannot be made in `dest`'s folder."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
