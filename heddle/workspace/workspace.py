"""Workspaces: the folder a node's tools run in.

One `Workspaces` per run builds every node's workspace the same way: the tools under
`.heddle/bin`, a copy of every mount, and on close the `rw` mounts' changes copied back
before the tree is removed (or kept under `--workspace DIR`).

A run on the event loop enters a workspace with `async with workspaces.enter(node)`: the
copies (up to the mount limits) and the removal happen in a worker thread, so other runs
on the loop go on meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import stat
import tempfile
import threading
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from heddle.blocking import WORKSPACE_COPIES, run_blocking, run_blocking_undoable
from heddle.errors import RunError, UsageError
from heddle.format.private import check_private_dir, make_private_dir
from heddle.secret_env import without_secrets
from heddle.workspace import MOUNT_MAX_BYTES, MOUNT_MAX_ENTRIES, treecopy
from heddle.workspace.mounts import RESERVED, Mount, check_mounts

Warn = Callable[[str], None]

_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class WorkspaceOptions:
    mounts: tuple[Mount, ...] = ()
    keep_root: Path | None = None
    mount_tools: bool = True
    max_entries: int = MOUNT_MAX_ENTRIES
    max_bytes: int = MOUNT_MAX_BYTES


def folder_name(node_name: str) -> str:
    """A file name for a node: node names are free text, folder names must not climb or hide."""
    name = _UNSAFE_NAME.sub("_", node_name).lstrip(".")[:100]
    return name or "node"


def _check_tool_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UsageError(
            f"tool {name!r}: its name cannot be a file name in {RESERVED}/bin; "
            "rename the tool or run with --no-mount-tools"
        )


def _within(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


KEPT = "workspace folder"


def make_keep_root(keep_root: Path) -> Path:
    """The `--workspace` folder, made 0700 when missing: what a node finds in its workspace and
    what comes back into an `rw` mount's source from it must be nobody else's to change, and what
    a run wrote there nobody else's to read. Refused (exit 2) when another user could change it."""
    return make_private_dir(keep_root, what=KEPT, setting="--workspace")


def _check_keep_root(keep_root: Path, mounts: tuple[Mount, ...]) -> None:
    root = Path(os.path.realpath(keep_root))
    if os.path.lexists(keep_root):
        if not root.is_dir():
            raise UsageError(f"--workspace {keep_root}: not a folder; give a folder path")
        check_private_dir(keep_root, what=KEPT, setting="--workspace")
        if not os.access(root, os.W_OK | os.X_OK):
            raise UsageError(f"--workspace {keep_root}: not writable; check its permissions")
    else:
        parent = root.parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise UsageError(
                f"--workspace {keep_root}: cannot be created because {parent} is not a "
                "writable folder; choose another place"
            )
    for mount in mounts:
        source = Path(os.path.realpath(mount.source))
        if _within(root, source):
            raise UsageError(
                f"--workspace {keep_root}: inside mount {mount.describe()}, so every node "
                "would copy the earlier workspaces; keep them elsewhere"
            )


class Workspace:
    """One node execution's workspace. Use as a context manager; see `Workspaces.open`."""

    root: Path
    bin_dir: Path
    node_name: str

    def __init__(
        self,
        owner: Workspaces,
        node_name: str,
        root: Path,
        kept: bool,
        warn: Warn | None = None,
    ) -> None:
        self._owner = owner
        self._warn = warn or owner.warn
        self.node_name = node_name
        self.root = root
        self.kept = kept
        self.heddle_dir = root / RESERVED
        self.bin_dir = self.heddle_dir / "bin"
        self._copies: list[tuple[Mount, Path, treecopy.Snapshot]] = []
        self._ro_ids: dict[Path, tuple[int, int]] = {}
        self._closed = False

    @property
    def ro_paths(self) -> tuple[Path, ...]:
        """Paths inside the workspace that the sandbox binds read-only."""
        return (self.heddle_dir, *(p for m, p, _ in self._copies if m.mode == "ro"))

    def _lstat_inside(self, path: Path) -> os.stat_result | None:
        """lstat of `path` in the workspace, reached without following any symlink.

        None when it is missing; a symlink stat when it, or a folder on the way, is a link.
        """
        st = os.lstat(self.root)
        where = self.root
        for part in path.relative_to(self.root).parts:
            if stat.S_ISLNK(st.st_mode):
                return st
            where = where / part
            try:
                st = os.lstat(where)
            except FileNotFoundError:
                return None
        return st

    def ro_binds(self) -> tuple[Path, ...]:
        """`ro_paths`, checked to be the very folders and files this workspace was built with.

        A sandboxed tool cannot write to them, but it can rename a writable folder above
        one and leave a symlink in its place; binding such a path would let the next call
        see whatever the link points at on the host.
        """
        for path in self.ro_paths:
            st = self._lstat_inside(path)
            if st is None or (st.st_dev, st.st_ino) != self._ro_ids[path]:
                raise RunError(
                    f"node {self.node_name!r}: {path} in the workspace was moved or replaced by "
                    "a tool; read-only paths must stay where they were put"
                )
        return self.ro_paths

    def path_of(self, mount: Mount) -> Path:
        return self.root.joinpath(*mount.dest.parts)

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment of a tool in this workspace: `base` with heddle's settings for it,
        and without heddle's own secrets."""
        env = without_secrets(base)
        env["HEDDLE_WORKSPACE"] = str(self.root)
        env["HEDDLE_WORKSPACE_BIN"] = str(self.bin_dir)
        # After the system entries, so a tool named like a system command cannot shadow it
        # for the other tools.
        system = base.get("PATH") or os.defpath
        env["PATH"] = f"{system}{os.pathsep}{self.bin_dir}"
        return env

    def _populate(self, tools: Mapping[str, Path], mount_tools: bool) -> None:
        self.bin_dir.mkdir(parents=True)
        if mount_tools:
            for name, executable in tools.items():
                # Resolved first: a tool may be a link into a development tree, while
                # mount contents are never followed.
                source = Path(os.path.realpath(executable))
                treecopy.copy_file(source, self.bin_dir / name, mode=0o755)
        for mount in self._owner.options.mounts:
            target = self.path_of(mount)
            target.parent.mkdir(parents=True, exist_ok=True)
            snap = treecopy.copy_in(
                mount.source,
                target,
                track=mount.mode == "rw",
                warn=self._warn,
                label=mount.describe(),
            )
            self._copies.append((mount, target, snap))
        for path in self.ro_paths:
            st = os.lstat(path)
            self._ro_ids[path] = (st.st_dev, st.st_ino)

    def close(self) -> None:
        """Copy `rw` mounts back, then remove the tree unless it is kept. Never raises."""
        if self._closed:
            return
        self._closed = True
        warn = self._warn
        with self._owner.sync_lock:
            for mount, copy, snap in self._copies:
                if mount.mode != "rw":
                    continue
                try:
                    above = self._lstat_inside(copy.parent)
                    if above is None:
                        continue  # the node deleted it; deletions never propagate
                    if not stat.S_ISDIR(above.st_mode):
                        # Following a link planted above the copy would bring back files
                        # from wherever it points, not the node's work.
                        warn(
                            f"did not copy back mount {mount.describe()}: a folder above "
                            f"{copy} was replaced by a symlink or a file"
                        )
                        continue
                    treecopy.copy_back(snap, copy, mount.source, warn=warn, node=self.node_name)
                except Exception as exc:  # noqa: BLE001 - the node's own error must win
                    warn(f"could not copy back mount {mount.describe()}: {exc}")
        if self.kept:
            return
        try:
            treecopy.remove_tree(self.root)
        except OSError as exc:
            warn(f"could not remove the workspace {self.root}: {exc.strerror or exc}")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Workspaces:
    """Builds the workspaces of one run."""

    def __init__(
        self,
        options: WorkspaceOptions,
        tools: Mapping[str, Path],
        *,
        tools_dir: Path | None,
        warn: Warn,
    ) -> None:
        self.options = options
        self.tools = dict(tools)
        self.tools_dir = tools_dir
        self.warn = warn
        # Copy-backs of nodes closing at the same time must not interleave on one file.
        self.sync_lock = threading.Lock()
        self._names_lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._keep_made = False  # the --workspace folder made (or found) and checked

    def check(self, *, mounts: bool = True) -> None:
        """Every start-up refusal: bad mounts, tool names, the `--workspace` folder. `mounts=False`
        when the caller has just checked the same mounts (each check walks every mounted file)."""
        opts = self.options
        if mounts:
            check_mounts(opts.mounts, max_entries=opts.max_entries, max_bytes=opts.max_bytes)
        if opts.mount_tools:
            for name, executable in self.tools.items():
                _check_tool_name(name)
                path = Path(executable)
                if not path.is_file():
                    raise UsageError(f"tool {name!r}: executable {path} is not a file")
        if opts.keep_root is not None:
            _check_keep_root(opts.keep_root, opts.mounts)

    def _make_root(self, node_name: str) -> tuple[Path, bool]:
        base = folder_name(node_name)
        if self.options.keep_root is None:
            return Path(tempfile.mkdtemp(prefix=f"heddle-{base}-")), False
        with self._names_lock:
            keep = self.options.keep_root
            if not self._keep_made:
                make_keep_root(keep)
                self._keep_made = True
            n = self._counts.get(base, 0)
            while True:
                n += 1
                candidate = keep / (base if n == 1 else f"{base}-{n}")
                try:
                    candidate.mkdir(0o700)
                except FileExistsError:
                    continue
                self._counts[base] = n
                return candidate, True

    def open(self, node_name: str, *, warn: Warn | None = None) -> Workspace:
        """Build a workspace for one node execution. Close it (or use `with`) when the node ends.

        This copies files: on the event loop, use `enter` instead. `warn` replaces the run's
        warning sink for this workspace."""
        try:
            root, kept = self._make_root(node_name)
        except OSError as exc:
            raise RunError(
                f"node {node_name!r}: cannot create its workspace: {exc.strerror or exc}"
            ) from None
        # Absolute and free of symlinks: the sandbox binds the workspace at this very path,
        # and tools that change directory still find HEDDLE_WORKSPACE.
        ws = Workspace(self, node_name, Path(os.path.realpath(root)), kept, warn)
        try:
            ws._populate(self.tools, self.options.mount_tools)
        except BaseException as exc:
            # A half-built workspace is never handed to a node nor left behind.
            try:
                treecopy.remove_tree(root)
            except OSError:
                pass
            if isinstance(exc, OSError):
                where = f" {exc.filename}" if exc.filename else ""
                raise RunError(
                    f"node {node_name!r}: cannot build its workspace:{where}: "
                    f"{exc.strerror or exc}"
                ) from None
            raise
        return ws

    @contextlib.asynccontextmanager
    async def enter(self, node_name: str) -> AsyncIterator[Workspace]:
        """`open` and `close` for a coroutine: built and copied back in a worker thread, its
        warnings passed to the run's sink on the loop."""
        loop = asyncio.get_running_loop()

        def warn(message: str) -> None:
            loop.call_soon_threadsafe(self.warn, message)

        workspace = await run_blocking_undoable(WORKSPACE_COPIES, lambda: self.open(node_name, warn=warn),
                                                Workspace.close)
        try:
            yield workspace
        finally:
            await run_blocking(WORKSPACE_COPIES, workspace.close)
