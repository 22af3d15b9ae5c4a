"""Folders whose contents heddle trusts: the cache of verified payloads, the trust store, the session
stores' folders, kept workspaces (`--workspace`), the data folder of `rw` mounts (`--data-dir`) and
heddle-server's `--work-dir`.

What is in such a folder is believed because of where it is, so nobody but this user may be
able to change it: the folder must be owned by us (or root) and writable by nobody else, and
every folder above it must keep others from renaming it away (not writable by others, or
sticky, as `/tmp` is). A folder that fails is refused with the command that fixes it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from heddle.errors import UsageError

_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _who(mode: int) -> str:
    both = (mode & stat.S_IWGRP) and (mode & stat.S_IWOTH)
    return "its group and everyone" if both else "its group" if mode & stat.S_IWGRP else "everyone"


def _owner_problem(path: Path, st: os.stat_result, what: str, setting: str) -> str | None:
    uid = os.geteuid()
    if st.st_uid not in (uid, 0):
        return (f"{what} {path} is owned by uid {st.st_uid}, not by you (uid {uid}), so its owner could change what "
                f"heddle trusts; run `chown {uid} {path}` or point {setting} at a folder of your own")
    if st.st_mode & _OTHERS_WRITE:
        return (f"{what} {path} is writable by {_who(st.st_mode)} (mode {stat.S_IMODE(st.st_mode):04o}), so another "
                f"user could change what heddle trusts; run `chmod go-w {path}`")
    return None


def check_private_dir(path: Path, *, what: str, setting: str) -> Path:
    """The real path of the folder `path`, once nobody but this user (or root) can change it.

    `what` names the folder in messages ("cache folder"), `setting` the flag or variable that
    chose it. Raises UsageError (exit 2) naming the path and the `chmod`/`chown` that fixes it.
    """
    real = Path(os.path.realpath(path))
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise UsageError(f"{what} {path} does not exist; create it or point {setting} elsewhere") from None
    except OSError as exc:
        raise UsageError(f"{what} {path} cannot be read: {exc.strerror}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path} is a file, not a folder; point {setting} at a folder")
    problem = _owner_problem(path, st, what, setting)
    if problem is not None:
        raise UsageError(problem)
    _check_parents(real.parents, path, what=what, setting=setting)
    return real


def _check_parents(parents: Iterable[Path], path: Path, *, what: str, setting: str) -> None:
    for parent in parents:
        pst = os.stat(parent)
        if pst.st_mode & _OTHERS_WRITE and not pst.st_mode & stat.S_ISVTX:
            raise UsageError(
                f"{what} {path} is inside {parent}, which {_who(pst.st_mode)} can write to (mode "
                f"{stat.S_IMODE(pst.st_mode):04o}, not sticky), so another user could replace it; "
                f"run `chmod go-w {parent}` or point {setting} elsewhere"
            )


def check_private_file(path: Path, *, what: str, setting: str) -> None:
    """A file heddle trusts (a trusted key) must be as private as its folder."""
    try:
        st = os.stat(path)
    except OSError:
        return  # reading it will report the problem
    problem = _owner_problem(path, st, what, setting)
    if problem is not None:
        raise UsageError(problem)


def make_private_dir(path: Path, *, what: str, setting: str) -> Path:
    """Create `path` and any missing parents as 0700 (whatever the umask), then check it."""
    missing: list[Path] = []
    probe = Path(path)
    while not os.path.lexists(probe):
        missing.append(probe)
        if probe.parent == probe:
            break
        probe = probe.parent
    if os.path.lexists(probe) and not os.path.isdir(probe):
        raise UsageError(f"{what} {path}: {probe} is a file, not a folder; point {setting} at a folder")
    if missing:
        # Refused before anything is made inside a folder others could swap.
        real = Path(os.path.realpath(probe))
        _check_parents([real, *real.parents], path, what=what, setting=setting)
    for folder in reversed(missing):
        try:
            os.mkdir(folder, 0o700)
            os.chmod(folder, 0o700)  # a umask may have taken bits the owner needs
        except FileExistsError:
            pass
        except NotADirectoryError:
            raise UsageError(
                f"{what} {path}: {folder.parent} is a file, not a folder; point {setting} at a folder"
            ) from None
        except OSError as exc:
            raise UsageError(f"{what} {path} cannot be created: {exc.strerror}") from None
    return check_private_dir(path, what=what, setting=setting)
