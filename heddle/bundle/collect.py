"""Turning folders on disk into the list of files a bundle will carry.

Only regular files and folders are carried. A link, device, socket or FIFO is refused,
naming it, because its meaning depends on the machine. `.git` folders are left out and
reported. A file that looks like a secret (a private key by name or by content, a
credentials file, anything under `.ssh/`, `.aws/`, `.gnupg/`, an `.env` file) is refused,
all of them in one error, unless `--include-secret` names it: a bundle is copied and
published, and a key sealed into one cannot be taken back.
"""

from __future__ import annotations

import functools
import operator
import os
import re
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from heddle.format.errors import PackError
from heddle.format.pack import PlanFile

if TYPE_CHECKING:
    from heddle.workspace.mounts import MountCount

INCLUDE_SECRET = "--include-secret"
LEFT_OUT = ".git"

_KEY_NAMES = frozenset({"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk"})
_KEY_SUFFIXES = (".pem", ".key", ".p12", ".pfx")
_CREDENTIAL_FILES = frozenset({".netrc", ".npmrc", ".pypirc", ".git-credentials"})
_CREDENTIAL_PAIRS = frozenset({(".docker", "config.json"), (".kube", "config")})
_SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg"})
# PEM ("RSA", "EC", "OPENSSH", "ENCRYPTED", ... PRIVATE KEY) and OpenPGP armour, and PuTTY's format, at the
# start of a file's first bytes but a UTF-8 byte order mark and ASCII white space (what bytes.lstrip strips).
_PRIVATE_KEY = re.compile(rb"(?:\xef\xbb\xbf)?[ \t\n\r\x0b\x0c]*"
                          rb"(?:-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-)")
_SNIFF_BYTES = 512


@dataclass
class Collected:
    files: list[PlanFile] = field(default_factory=list)
    skipped: list[Path] = field(default_factory=list)

    def extend(self, other: Collected) -> None:
        self.files.extend(other.files)
        self.skipped.extend(other.skipped)


def _secret_file(parent: str | None, name: str) -> str | None:
    """Why a file named `name` in a folder named `parent` looks like a secret by those two names."""
    lower = name.lower()
    if lower in _KEY_NAMES or lower.endswith(_KEY_SUFFIXES):
        return "a private key by its name"
    if name in _CREDENTIAL_FILES or (parent, name) in _CREDENTIAL_PAIRS:
        return "a credentials file"
    if name in (".env", ".envrc") or name.startswith(".env."):
        return "an environment file"
    return None


def _secret_folder(folders: Sequence[str]) -> str | None:
    for folder in folders:
        if folder in _SECRET_DIRS:
            return f"inside {folder}/"
    return None


def _split(source: str) -> tuple[str, str]:
    """`os.path.split` of a path the walk made (a folder's path, a separator, a name), in one step of C."""
    head, sep, name = source.rpartition(os.sep)
    return head or sep, name


def _allowed(source: str, include: Sequence[str]) -> str | None:
    for allowed in include:
        if source == allowed or source.startswith(allowed.rstrip(os.sep) + os.sep):
            return allowed
    return None


class SecretScreen:
    """Refuses, in one error naming each, the files that look like secrets, but those `include`
    names (a file, or a folder holding them, as given to --include-secret).

    Names are judged when the screen is made; contents as the packer hashes each file, from the
    same read (`flags`), and the verdict on both is given once every file is hashed, before any
    byte is written (`judge`)."""

    def __init__(self, files: Sequence[PlanFile], include: Sequence[Path] = ()) -> None:
        self._include = list(include)
        self._files = list(files)
        self._by_name: dict[int, str] = {}
        # Each folder resolved and judged once: the files collected are no links themselves.
        folders: dict[str, tuple[str, str | None]] = {}  # folder: its real name, verdict
        # The same for the folders of the payload paths, judged once a folder.
        placed: dict[str, tuple[str | None, str | None]] = {}
        by_name = self._by_name
        for i, (path, source, _, _) in enumerate(files):
            folder, name = _split(os.fspath(source))
            seen = folders.get(folder)
            if seen is None:
                parts = os.path.realpath(folder).split(os.sep)
                seen = folders[folder] = (parts[-1], _secret_folder(parts))
            parent, inside = seen
            dest, _, dest_name = path.rpartition("/")
            there = placed.get(dest)
            if there is None:
                above = dest.split("/") if dest else []
                there = placed[dest] = (above[-1] if above else None, _secret_folder(above))
            # Under the same name, the file's own folder can only add a credentials pair to the verdict.
            why = (_secret_file(there[0], dest_name) or there[1]
                   or (_secret_file(parent, name) if name != dest_name or (parent, name) in _CREDENTIAL_PAIRS
                       else None)
                   or inside)
            if why is not None:
                by_name[i] = why

    def flags(self, head: memoryview | bytes) -> bool:
        # Matched in place within the first bytes: no copy of them a file.
        return _PRIVATE_KEY.match(head, 0, _SNIFF_BYTES) is not None

    def judge(self, flagged: Sequence[PlanFile]) -> None:
        by_content = {item.path for item in flagged}
        wanted = [os.path.realpath(p) for p in self._include]
        used: set[str] = set()
        found: list[str] = []
        for i, item in enumerate(self._files):
            why = self._by_name.get(i) or ("a private key by its content" if item.path in by_content else None)
            if why is None:
                continue
            folder, name = _split(os.fspath(item.source))
            allowed = _allowed(os.path.join(os.path.realpath(folder), name), wanted)
            if allowed is not None:
                used.add(allowed)
                continue
            found.append(f"{item.source} (as {item.path}: {why})")
        unused = [str(p) for p, real in zip(self._include, wanted, strict=True) if real not in used]
        if found:
            raise PackError(
                f"{len(found)} file{'s' if len(found) > 1 else ''} look{'' if len(found) > 1 else 's'} like "
                f"{'secrets' if len(found) > 1 else 'a secret'}, which a bundle never seals: {'; '.join(found)}; "
                f"remove {'them' if len(found) > 1 else 'it'}, "
                f"or pass {INCLUDE_SECRET} PATH for each one meant to be sealed"
            )
        if unused:
            raise PackError(f"{INCLUDE_SECRET} {unused[0]}: no file sealed from there looks like a secret; "
                            "drop the flag")


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


def collect_tree(source: Path, dest: str, *, what: str, count: MountCount | None = None) -> Collected:
    """Everything under `source` (a file or a folder), placed at `dest` in the payload. A mount's folder is
    counted against the mount limits with `count` as it is walked (its `.git` folders too, which are not
    carried), and what a mount cannot hold refused as the mount rules refuse it (heddle.workspace.mounts)."""
    source = Path(source)
    st = _lstat(source, what)
    if stat.S_ISREG(st.st_mode):
        return Collected([PlanFile(dest, source, file_mode(st.st_mode), st.st_size)])
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(source, st.st_mode, what)
    out = Collected()
    _walk(source, dest, out, what, count)
    return out


# A PlanFile from its fields, made in C (a NamedTuple's own constructor is Python): one a file of a walk.
_plan_file: Callable[[tuple[str, str, int, int]], PlanFile] = functools.partial(tuple.__new__, PlanFile)
_by_name = operator.attrgetter("name")


def _walk(folder: str | Path, dest: str, out: Collected, what: str, count: MountCount | None) -> None:
    try:
        entries = sorted(os.scandir(folder), key=_by_name)
    except OSError as exc:
        raise PackError(f"{what}: {folder} cannot be listed: {exc.strerror}") from None
    append = out.files.append
    under = f"{dest}/"
    for entry in entries:
        name = entry.name
        path = entry.path  # a string: a Path for each of many files costs more than its stat
        st = entry.stat(follow_symlinks=False)
        mode = st.st_mode
        if count is not None:
            count.add(path, st)
        if name == LEFT_OUT:
            out.skipped.append(Path(path))
            if count is not None and stat.S_ISDIR(mode):
                count.walk(path)  # left out of the bundle, but a mount's limits count it
            continue
        if stat.S_ISREG(mode):
            append(_plan_file((under + name, path, file_mode(mode), st.st_size)))
        elif stat.S_ISDIR(mode):
            _walk(path, under + name, out, what, count)
        else:
            raise _refuse(Path(path), mode, what)
