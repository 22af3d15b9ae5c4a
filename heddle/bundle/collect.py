"""Turning folders on disk into the list of files a bundle will carry.

Only regular files and folders are carried. A link, device, socket or FIFO is refused,
naming it, because its meaning depends on the machine. `.git` folders are left out and
reported. A file that looks like a secret (a private key by name or by content, a
credentials file, anything under `.ssh/`, `.aws/`, `.gnupg/`, an `.env` file) is refused,
all of them in one error, unless `--include-secret` names it: a bundle is copied and
published, and a key sealed into one cannot be taken back.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from heddle.format.errors import PackError
from heddle.format.pack import PlanFile

INCLUDE_SECRET = "--include-secret"
LEFT_OUT = ".git"

_KEY_NAMES = frozenset({"id_rsa", "id_dsa", "id_ecdsa", "id_ed25519", "id_ecdsa_sk", "id_ed25519_sk"})
_KEY_SUFFIXES = (".pem", ".key", ".p12", ".pfx")
_CREDENTIAL_FILES = frozenset({".netrc", ".npmrc", ".pypirc", ".git-credentials"})
_CREDENTIAL_PAIRS = frozenset({(".docker", "config.json"), (".kube", "config")})
_SECRET_DIRS = frozenset({".ssh", ".aws", ".gnupg"})
# PEM ("RSA", "EC", "OPENSSH", "ENCRYPTED", ... PRIVATE KEY) and OpenPGP armour, and PuTTY's format.
_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-")
_SNIFF_BYTES = 512
_BOM = b"\xef\xbb\xbf"


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
        for i, item in enumerate(files):
            folder, name = _split(os.fspath(item.source))
            seen = folders.get(folder)
            if seen is None:
                parts = os.path.realpath(folder).split(os.sep)
                seen = folders[folder] = (parts[-1], _secret_folder(parts))
            parent, inside = seen
            dest, _, dest_name = item.path.rpartition("/")
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
                self._by_name[i] = why

    def flags(self, head: memoryview) -> bool:
        return _PRIVATE_KEY.match(bytes(head[:_SNIFF_BYTES]).removeprefix(_BOM).lstrip()) is not None

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


def collect_tree(source: Path, dest: str, *, what: str) -> Collected:
    """Everything under `source` (a file or a folder), placed at `dest` in the payload."""
    source = Path(source)
    st = _lstat(source, what)
    if stat.S_ISREG(st.st_mode):
        return Collected([PlanFile(dest, source, file_mode(st.st_mode), st.st_size)])
    if not stat.S_ISDIR(st.st_mode):
        raise _refuse(source, st.st_mode, what)
    out = Collected()
    _walk(source, dest, out, what)
    return out


def _walk(folder: str | Path, dest: str, out: Collected, what: str) -> None:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise PackError(f"{what}: {folder} cannot be listed: {exc.strerror}") from None
    files = out.files
    for entry in entries:
        path = entry.path  # a string: a Path for each of many files costs more than its stat
        if entry.name == LEFT_OUT:
            out.skipped.append(Path(path))
            continue
        st = entry.stat(follow_symlinks=False)
        target = f"{dest}/{entry.name}"
        if stat.S_ISDIR(st.st_mode):
            _walk(path, target, out, what)
        elif stat.S_ISREG(st.st_mode):
            files.append(PlanFile(target, path, file_mode(st.st_mode), st.st_size))
        else:
            raise _refuse(Path(path), st.st_mode, what)
