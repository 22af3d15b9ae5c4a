"""A file the user names for heddle to write (`heddle bundle -o`, `heddle pull -o`, `heddle keygen --out`) is
created, or replaces a regular file; a FIFO, a device node, a folder or a symbolic link there is refused in one
line naming it, exit 2, and is left exactly as it was, with nothing written beside it."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from heddle import oci, seal
from tests.support.cli import error_line, heddle
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc
from tests.support.registry import RunningRegistry, registry  # noqa: F401 (a fixture)

KINDS = ("device", "fifo", "folder", "link")


def _flow(root: Path) -> Path:
    f = FlowDoc("written")
    start, end = f.start(["text"]), f.end(["text"])
    f.control(start, end)
    return f.write(root / "flow.json")


def _place(root: Path, kind: str) -> tuple[Path, str, Callable[[], None]]:
    """Something other than a regular file at a path in `root`: (the path, how an error names it, a check
    that it is still exactly what it was)."""
    path = root / f"out-{kind}.heddle"
    if kind == "fifo":
        os.mkfifo(path)

        def same_fifo() -> None:
            assert stat.S_ISFIFO(os.lstat(path).st_mode), "the FIFO was replaced"
        return path, "a FIFO", same_fifo
    if kind == "device":
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
        rdev = os.lstat(path).st_rdev

        def same_device() -> None:
            st = os.lstat(path)
            assert stat.S_ISCHR(st.st_mode) and st.st_rdev == rdev, "the device node was replaced"
        return path, "a character device", same_device
    if kind == "folder":
        path.mkdir()

        def same_folder() -> None:
            assert not path.is_symlink() and path.is_dir() and list(path.iterdir()) == [], "the folder changed"
        return path, "a directory", same_folder
    target = root / "target.heddle"
    target.write_bytes(b"the user's own")

    def same_link() -> None:
        assert path.is_symlink() and os.readlink(path) == str(target), "the link was replaced"
        assert target.read_bytes() == b"the user's own"
    path.symlink_to(target)
    return path, "a symbolic link", same_link


def _places(root: Path) -> list[tuple[Path, str, Callable[[], None]]]:
    """One of each kind (the device first) in `root`; skips the test, naming why, where a device node
    cannot be made."""
    root.mkdir()
    try:
        return [_place(root, kind) for kind in KINDS]
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD); scripts/test runs the suite as root")


def _refusal(path: Path, kind: str) -> str:
    return (f"error: -o {path}: is {kind}; heddle writes a new file or replaces a regular one, never anything "
            "else: remove it or choose another path")


def test_bundle_o_refuses_what_is_not_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow = _flow(tmp_path)
    root = tmp_path / "out"
    places = _places(root)
    before = sorted(p.name for p in root.iterdir())
    for n, (path, named, unchanged) in enumerate(places):
        # The device through the real command (as root, `-o /dev/null` replaced the device); the rest
        # through the same entry function in this process.
        proc = heddle("bundle", flow, "-o", path) if n == 0 else heddle_here(capsys, "bundle", flow, "-o", path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert error_line(proc) == _refusal(path, named)
        unchanged()
    assert sorted(p.name for p in root.iterdir()) == before  # no temporary file left beside them


def test_pull_o_refuses_what_is_not_a_regular_file(tmp_path: Path, registry: RunningRegistry,  # noqa: F811
                                                   capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEDDLE_CACHE_DIR", str(tmp_path / "cache"))
    bundle = seal(_flow(tmp_path), input={"text": "x"}, output=tmp_path / "app.heddle").path
    ref = registry.ref("writers/app:v1")
    oci.push(bundle, ref)
    root = tmp_path / "out"
    places = _places(root)
    before = sorted(p.name for p in root.iterdir())
    for n, (path, named, unchanged) in enumerate(places):
        # The device through the real command (as root, `-o /dev/null` replaced the device); the rest
        # through the same entry function in this process.
        proc = heddle("pull", ref, "-o", path) if n == 0 else heddle_here(capsys, "pull", ref, "-o", path)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert error_line(proc) == _refusal(path, named)
        unchanged()
    assert sorted(p.name for p in root.iterdir()) == before
    # A regular file there is replaced, whole.
    regular = root / "regular.heddle"
    regular.write_bytes(b"old")
    proc = heddle_here(capsys, "pull", ref, "-o", regular)
    assert proc.returncode == 0, proc.stderr
    assert regular.read_bytes() == bundle.read_bytes()


def test_keygen_out_writes_only_new_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    os.mkfifo(tmp_path / "me.key")
    proc = heddle_here(capsys, "keygen", "--out", tmp_path / "me", "--no-passphrase")
    assert proc.returncode == 2 and str(tmp_path / "me.key") in error_line(proc)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "me.key").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["me.key"]
