"""Folders and files the session stores create, private to the user who runs heddle: sessions hold
conversations, which are nobody else's to read."""

from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dirs(directory: Path) -> None:
    """Create `directory` and any missing parents, each 0700 whatever the umask; folders that exist
    are left as they are (the user may have chosen a shared one on purpose)."""
    missing: list[Path] = []
    at = directory
    while not at.exists() and not at.is_symlink():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            continue  # another process made it first
        os.chmod(folder, DIR_MODE)


def data_home() -> Path:
    """$XDG_DATA_HOME, or ~/.local/share; a relative $XDG_DATA_HOME is ignored, as the XDG base
    directory specification says."""
    value = os.environ.get("XDG_DATA_HOME", "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home() / ".local" / "share"
