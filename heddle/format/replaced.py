"""A file written whole or not at all: a temporary file beside it, renamed onto it at the end.

Whoever reads the path meanwhile, or after a crash, finds the old file or the whole new one,
never a torn mix; a block that fails leaves nothing behind. Only a regular file is ever replaced:
renaming onto a FIFO, a device node or a link would put a file where the user had something else
(as root, `-o /dev/null` would replace the device every program writes to).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from heddle.errors import UsageError
from heddle.safeparse import file_kind


def umasked(mode: int) -> int:
    """`mode` less this process's umask: what open() would have made."""
    umask = os.umask(0)
    os.umask(umask)
    return mode & ~umask


def check_replaceable(dest: Path, *, what: str = "") -> None:
    """UsageError (exit 2) naming `dest` unless nothing is there or a regular file is: the one
    rule of every writer of a file the user names (`-o`, `--out`) and of heddle's own records.
    `what` is how the message names the path (`-o`); the path alone without it."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"{what or 'file'} {dest}: cannot be read ({exc.strerror})") from None
    if stat.S_ISREG(st.st_mode):
        return
    named = f"{what} {dest}" if what else str(dest)
    raise UsageError(f"{named}: is {file_kind(st.st_mode)}; heddle writes a new file or replaces a regular one, "
                     "never anything else: remove it or choose another path")


@contextlib.contextmanager
def replaced(dest: Path, *, prefix: str, suffix: str = "", mode: int | None = None,
             durable: bool = True, what: str = "") -> Iterator[IO[bytes]]:
    """The new contents of `dest`, renamed onto it only if the block completes.

    `mode` None keeps the temporary file's own (0o600); `durable` syncs the data to disk before
    the rename, so that the rename never outlives the bytes. UsageError, before anything is
    written, when something other than a regular file is at `dest` (see `check_replaceable`;
    `what` names the path in it); OSError when the temporary file cannot be made in `dest`'s
    folder."""
    check_replaceable(dest, what=what)
    fd, tmp = tempfile.mkstemp(prefix=prefix, suffix=suffix, dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            if durable:
                os.fsync(fh.fileno())
        check_replaceable(dest, what=what)  # again: it may have been put there while this one was written
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
