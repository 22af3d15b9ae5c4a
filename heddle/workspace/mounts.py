"""Mounts: the user's files and folders placed into every workspace.

`--mount SRC[:DEST][:ro|:rw]` is parsed here, and every refusal the issue lists is made
here too, before any node runs, so a bad mount never costs a half-finished run.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from heddle.errors import UsageError
from heddle.workspace import MOUNT_MAX_BYTES, MOUNT_MAX_ENTRIES

MountMode = Literal["ro", "rw"]

# The workspace's own directory: the tool copies live there and the sandbox binds it
# read-only, so no mount may land in it.
RESERVED = ".heddle"


@dataclass(frozen=True)
class Mount:
    source: Path
    dest: PurePosixPath
    mode: MountMode = "ro"
    # (files and folders, bytes) of a mount read from a bundle's payload just proved against its
    # manifest: counted from the manifest, as the proof found exactly those, so not walked again.
    sealed: tuple[int, int] | None = None

    def describe(self) -> str:
        """How the user would have spelled this mount, for error messages."""
        return f"{self.source}:{self.dest}:{self.mode}"


def parse_mount(spec: str) -> Mount:
    """Parse `SRC[:DEST][:ro|:rw]`. Only syntax is checked here; `check_mounts` does the rest."""
    parts = spec.split(":")
    mode: MountMode = "ro"
    if len(parts) > 1 and parts[-1] in ("ro", "rw"):
        mode = "rw" if parts.pop() == "rw" else "ro"
    if len(parts) == 3:
        raise UsageError(
            f"--mount {spec!r}: unknown mode {parts[2]!r}; use ro or rw (SRC[:DEST][:ro|:rw])"
        )
    if len(parts) > 3:
        raise UsageError(
            f"--mount {spec!r}: too many ':'; use SRC[:DEST][:ro|:rw] "
            "(paths containing ':' cannot be mounted)"
        )
    src = parts[0]
    if not src:
        raise UsageError(f"--mount {spec!r}: SRC is empty; use SRC[:DEST][:ro|:rw]")
    source = Path(os.path.abspath(os.path.expanduser(src)))
    if len(parts) == 2:
        if not parts[1]:
            raise UsageError(
                f"--mount {spec!r}: DEST is empty; drop the ':' or name a path in the workspace"
            )
        dest = PurePosixPath(parts[1])
    else:
        if not source.name:
            raise UsageError(f"--mount {spec!r}: {source} has no base name; give a DEST")
        dest = PurePosixPath(source.name)
    return Mount(source=source, dest=dest, mode=mode)


def _check_dest(mount: Mount) -> None:
    name = mount.describe()
    dest = mount.dest
    if dest.is_absolute():
        raise UsageError(
            f"mount {name}: DEST {str(dest)!r} is absolute; give a path relative to the workspace"
        )
    if ".." in dest.parts:
        raise UsageError(
            f"mount {name}: DEST {str(dest)!r} climbs out of the workspace with '..'; "
            "give a path inside it"
        )
    if not dest.parts:
        raise UsageError(
            f"mount {name}: DEST is the workspace root; give a folder or file name inside it"
        )
    if dest.parts[0] == RESERVED:
        raise UsageError(
            f"mount {name}: DEST {str(dest)!r} is inside {RESERVED}, which heddle reserves; "
            "choose another DEST"
        )


def _nested(inner: PurePosixPath, outer: PurePosixPath) -> bool:
    return inner.parts[: len(outer.parts)] == outer.parts


def _check_overlaps(mounts: Sequence[Mount]) -> None:
    for i, a in enumerate(mounts):
        for b in mounts[i + 1 :]:
            if a.dest == b.dest:
                raise UsageError(
                    f"mount {b.describe()}: DEST {str(b.dest)!r} is already used by mount "
                    f"{a.describe()}; give one of them another DEST"
                )
            if _nested(a.dest, b.dest) or _nested(b.dest, a.dest):
                inner, outer = (a, b) if _nested(a.dest, b.dest) else (b, a)
                raise UsageError(
                    f"mount {inner.describe()}: DEST {str(inner.dest)!r} is inside the DEST "
                    f"{str(outer.dest)!r} of mount {outer.describe()}; mounts cannot nest, "
                    "give it a DEST beside the other"
                )


def _kind(mode: int) -> str | None:
    """A name for the file types a mount cannot carry; None for files and folders."""
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISFIFO(mode):
        return "a named pipe"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return "a special file"


def _check_limits(name: str, entries: int, size: int, *, max_entries: int, max_bytes: int) -> None:
    if entries > max_entries:
        raise UsageError(
            f"mount {name}: more than {max_entries} files and folders; mount a smaller "
            "folder or raise --mount-max-entries"
        )
    if size > max_bytes:
        raise UsageError(
            f"mount {name}: more than {max_bytes} bytes; mount a smaller folder or raise "
            "--mount-max-bytes"
        )


class MountCount:
    """A mount's files and folders and bytes as its walk counts them, stopped at the limits, and what it
    cannot carry refused: `check_mounts`' own walk, and sealing's, which lists a mount's files for the
    bundle in the same walk (heddle.bundle.collect) rather than walking it twice; each `add`s what it finds."""

    def __init__(self, mount: Mount, *, max_entries: int, max_bytes: int, entries: int = 0, size: int = 0) -> None:
        self.name = mount.describe()
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.entries = entries
        self.size = size

    def over(self) -> None:
        _check_limits(self.name, self.entries, self.size, max_entries=self.max_entries, max_bytes=self.max_bytes)

    def account(self, path: Path | str, st: os.stat_result) -> None:
        bad = _kind(st.st_mode)
        if bad is not None:
            raise UsageError(
                f"mount {self.name}: {path} is {bad}; mounts carry only regular files and folders, "
                "remove it or mount a folder without it"
            )
        self.entries += 1
        if stat.S_ISREG(st.st_mode):
            self.size += st.st_size
        self.over()

    def add(self, path: str, st: os.stat_result) -> None:
        """One entry a walk found: what `account` does, without its call to `over` for each file and
        folder a big tree is made of."""
        mode = st.st_mode
        if stat.S_ISREG(mode):
            self.entries += 1
            self.size += st.st_size
        elif stat.S_ISDIR(mode):
            self.entries += 1
        else:
            self.account(path, st)  # refused
        if self.entries > self.max_entries or self.size > self.max_bytes:
            self.over()

    def walk(self, folder: Path | str) -> None:
        """Count everything under `folder` (not `folder` itself)."""
        pending: list[Path | str] = [folder]
        while pending:
            folder = pending.pop()
            try:
                with os.scandir(folder) as it:
                    children = list(it)
            except OSError as exc:
                raise UsageError(
                    f"mount {self.name}: cannot list {folder}: {exc.strerror}; check its permissions"
                ) from None
            for child in children:
                try:
                    st = child.stat(follow_symlinks=False)
                except OSError as exc:
                    raise UsageError(f"mount {self.name}: cannot read {child.path}: {exc.strerror}") from None
                self.add(child.path, st)
                if stat.S_ISDIR(st.st_mode):
                    pending.append(child.path)  # a string: a Path for each of many files costs more than the stat


def _measure(mount: Mount, *, max_entries: int, max_bytes: int, walk: bool = True) -> None:
    """Walk SRC refusing what cannot be copied faithfully and stopping early at the limits; without `walk`,
    only SRC itself (its walk is made by the caller, with a MountCount)."""
    if mount.sealed is not None:
        _check_limits(mount.describe(), *mount.sealed, max_entries=max_entries, max_bytes=max_bytes)
        return
    count = MountCount(mount, max_entries=max_entries, max_bytes=max_bytes)
    try:
        top = mount.source.stat()
    except OSError as exc:
        raise UsageError(f"mount {count.name}: cannot read {mount.source}: {exc.strerror}") from None
    count.account(mount.source, top)
    if not stat.S_ISDIR(top.st_mode):
        if not os.access(mount.source, os.R_OK):
            raise UsageError(f"mount {count.name}: {mount.source} is not readable; check its permissions")
        return
    if walk:
        count.walk(mount.source)


def check_mounts(
    mounts: Sequence[Mount],
    *,
    max_entries: int = MOUNT_MAX_ENTRIES,
    max_bytes: int = MOUNT_MAX_BYTES,
    walk: bool = True,
) -> None:
    """Every start-up refusal for mounts, as a UsageError naming the mount and what to do. Without `walk`,
    a folder's contents are left to the caller's own walk, counted with a MountCount from its top's
    (sealing's, which lists them)."""
    if max_entries < 1:
        raise UsageError(f"--mount-max-entries {max_entries}: must be at least 1")
    if max_bytes < 0:
        raise UsageError(f"--mount-max-bytes {max_bytes}: must not be negative")
    for mount in mounts:
        if mount.mode not in ("ro", "rw"):
            raise UsageError(f"mount {mount.describe()}: unknown mode {mount.mode!r}; use ro or rw")
        _check_dest(mount)
    _check_overlaps(mounts)
    for mount in mounts:
        if not os.path.lexists(mount.source):
            raise UsageError(
                f"mount {mount.describe()}: {mount.source} does not exist; check the path"
            )
        if not mount.source.exists():
            raise UsageError(
                f"mount {mount.describe()}: {mount.source} is a symlink to nothing; "
                "mount its target instead"
            )
        _measure(mount, max_entries=max_entries, max_bytes=max_bytes, walk=walk)
