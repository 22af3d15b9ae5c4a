"""Where a bundle's mounts come from at run time.

`ro` mounts are used straight from the read-only cache. `rw` mounts are copied out of it
into a writable data folder first (`--data-dir`, or a fresh temporary folder made only when
there is an `rw` mount to seed), so a run can change them while the sealed copy stays exactly
what was verified. A data folder that already holds a mount's destination keeps it: that is
how state survives between runs.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from heddle.format.private import check_private_dir, make_private_dir

if TYPE_CHECKING:
    from heddle.format.cache import VerifiedTree
    from heddle.format.manifest import MountMode


@dataclass(frozen=True)
class SeededMount:
    source: Path
    dest: PurePosixPath
    mode: MountMode
    seeded: bool = False


@dataclass(frozen=True)
class DataDir:
    path: Path | None  # None: nothing to seed and no folder given, so none was made
    created: bool
    mounts: list[SeededMount]


def _make_writable(root: Path) -> None:
    if not root.is_dir():
        root.chmod(0o755 if root.stat().st_mode & 0o111 else 0o644)
        return
    for top, _dirs, files in os.walk(root):
        os.chmod(top, 0o755)
        for name in files:
            path = os.path.join(top, name)
            os.chmod(path, 0o755 if os.lstat(path).st_mode & 0o111 else 0o644)


def seed_data_dir(opened: VerifiedTree, data_dir: Path | None = None) -> DataDir:
    has_rw = any(m.mode == "rw" for m in opened.manifest.mounts)
    created = data_dir is None and has_rw
    base: Path | None = Path(tempfile.mkdtemp(prefix="heddle-data-")) if created else data_dir
    if data_dir is not None and (has_rw or os.path.lexists(data_dir)):
        # The state a run goes on from: another user able to change it would choose what the
        # next run's rw mounts hold.
        (make_private_dir if has_rw else check_private_dir)(data_dir, what="data folder", setting="--data-dir")
    mounts: list[SeededMount] = []
    for mount in opened.manifest.mounts:
        source = opened.mount_source(mount)
        dest = PurePosixPath(mount.dest)
        if mount.mode == "ro":
            mounts.append(SeededMount(source, dest, "ro"))
            continue
        assert base is not None  # made above whenever there is an rw mount
        target = base.joinpath(*dest.parts)
        seeded = not os.path.lexists(target)
        if seeded:
            target.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(source):
                target.mkdir()
            elif stat.S_ISDIR(os.lstat(source).st_mode):
                shutil.copytree(source, target, symlinks=True)
            else:
                shutil.copy2(source, target, follow_symlinks=False)
            _make_writable(target)
        mounts.append(SeededMount(target, dest, "rw", seeded))
    return DataDir(Path(base) if base is not None else None, created, mounts)
