"""A second user on the machine, for the tests of folders heddle trusts only when they are its user's own.

`other_user` (session scope) makes a system account with `useradd` (no home, no login shell) unless
it is there already, and removes it at the end if this process made it. `made_by(user, parent, name)`
creates a folder as that user, with `setpriv`, from inside `parent`: the path to `parent` need not be
open to that user (pytest's folders are root's alone), only `parent` itself.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

NAME = "heddle-test-other"


@dataclass(frozen=True)
class OtherUser:
    name: str
    uid: int
    gid: int


@pytest.fixture(scope="session")
def other_user() -> Iterator[OtherUser]:
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("a second user needs useradd and setpriv (Debian: apt-get install passwd util-linux)")
    if os.geteuid() != 0:
        pytest.skip("a second user can be made only by root (scripts/test runs the suite as root in CI)")
    made = False
    try:
        entry = pwd.getpwnam(NAME)
    except KeyError:
        add = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell",
                              "/usr/sbin/nologin", NAME], capture_output=True, text=True, check=False)
        # 9: another test process made it first.
        assert add.returncode in (0, 9), add.stderr
        made = add.returncode == 0
        entry = pwd.getpwnam(NAME)
    # The ids are kept: a folder made with them stays that user's even once the account is gone.
    yield OtherUser(NAME, entry.pw_uid, entry.pw_gid)
    if made:
        subprocess.run(["userdel", NAME], capture_output=True, check=False)


def made_by(user: OtherUser, parent: Path, name: str) -> Path:
    """`parent/name`, a folder `user` made (mkdir as that user, in `parent`, which is made writable by
    everyone and sticky, as /tmp is, so that only the owner's ownership is what heddle sees)."""
    os.chmod(parent, 0o1777)
    subprocess.run(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "mkdir", name],
                   cwd=parent, check=True, capture_output=True)
    made = parent / name
    assert made.stat().st_uid == user.uid
    return made
