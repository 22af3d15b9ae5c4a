"""Folders and files the session stores create, private to the user who runs heddle: sessions hold
conversations, which are nobody else's to read."""

from __future__ import annotations

import os
from pathlib import Path

from heddle.format.private import make_private_dir

FILE_MODE = 0o600


def make_private_dirs(directory: Path, *, what: str, setting: str) -> None:
    """Create `directory` and any missing parents, each 0700 whatever the umask, and refuse (exit 2,
    naming the `chmod`/`chown` that fixes it) a folder another user could change: whoever can write
    to it can forge a session. The rule of the cache and the trust store (format/private.py)."""
    make_private_dir(directory, what=what, setting=setting)


def _xdg_home(variable: str, *default: str) -> Path:
    """$`variable`, or ~/`default`; a relative value is ignored, as the XDG base directory
    specification says."""
    value = os.environ.get(variable, "")
    if value and os.path.isabs(value):
        return Path(value)
    return Path.home().joinpath(*default)


def data_home() -> Path:
    """$XDG_DATA_HOME, or ~/.local/share."""
    return _xdg_home("XDG_DATA_HOME", ".local", "share")


def config_home() -> Path:
    """$XDG_CONFIG_HOME, or ~/.config."""
    return _xdg_home("XDG_CONFIG_HOME", ".config")
