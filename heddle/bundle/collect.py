"""Turning folders on disk into the list of files a bundle will carry.

Only regular files and folders are carried. A link, device, socket or FIFO is refused,
naming it, because its meaning depends on the machine. Files that look like secrets
(`.git`, `.env*`, `*.pem`, `*.key`) are left out and reported, never carried silently.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from heddle.bundle.errors import PackError


@dataclass(frozen=True)
class PlanFile:
    """One file to seal: where it goes under `payload/`, where it comes from, its mode."""

    path: str
    source: Path
    mode: int = 0o644


@dataclass
class Collected:
    files: list[PlanFile] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)

    def extend(self, other: "Collected") -> None:
        self.files.extend(other.files)
        self.skipped.extend(other.skipped)


def is_secret(name: str) -> bool:
    return name == ".git" or name.startswith(".env") or name.endswith((".pem", ".key"))


def file_mode(st_mode: int) -> int:
    """Executable for anyone on the packing machine means 0755 in the bundle; else 0644."""
    return 0o755 if st_mode & 0o111 else 0o644


def _kind(st_mode: int) -> str:
    if stat.S_ISLNK(st_mode):
        return "a symbolic link"
    if stat.S_ISFIFO(st_mode):
        return "a FIFO"
    if stat.S_ISSOCK(st_mode):
        return "a socket"
    if stat.S_ISCHR(st_mode) or stat.S_ISBLK(st_mode):
        return "a device"
    return "not a regular file or folder"


def _lstat(path: Path, what: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise PackError(f"{what}: {path} does not exist") from None
    except OSError as exc:
        raise PackError(f"{what}: {path} cannot be read: {exc.strerror}") from None


def _refuse(path: Path, st_mode: int, what: str) -> PackError:
    return PackError(
        f"{what}: {path} is {_kind(st_mode)}; a bundle carries regular files only, replace or remove it"
    )


def collect_tree(source: Path, dest: str, *, what: str) -> Collected:
    """Everything under `source` (a file or a folder), placed at `dest` in the payload."""
    source = Path(source)
    st = _lstat(source, what)
    if stat.S_ISREG(st.st_mode):
        if is_secret(source.name):
            raise PackError(
                f"{what}: {source} looks like a secret (.git, .env*, *.pem, *.key) and bundles never carry those; "
                "rename it if it is not one"
            )
        return Collected([PlanFile(dest, source, file_mode(st.st_mode))])
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(source, st.st_mode, what)
    out = Collected()
    _walk(source, dest, out, what)
    return out


def _walk(folder: Path, dest: str, out: Collected, what: str) -> None:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise PackError(f"{what}: {folder} cannot be listed: {exc.strerror}") from None
    for entry in entries:
        path = Path(entry.path)
        if is_secret(entry.name):
            out.skipped.append(path)
            continue
        st = entry.stat(follow_symlinks=False)
        target = f"{dest}/{entry.name}"
        if stat.S_ISDIR(st.st_mode):
            _walk(path, target, out, what)
        elif stat.S_ISREG(st.st_mode):
            out.files.append(PlanFile(target, path, file_mode(st.st_mode)))
        else:
            raise _refuse(path, st.st_mode, what)
