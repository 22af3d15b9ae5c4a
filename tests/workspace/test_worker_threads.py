"""Copy-in, copy-back and removal of workspaces leave the event loop free for other runs."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from heddle.workspace import WorkspaceOptions, Workspaces, parse_mount, treecopy

TICKS = 5
PATIENCE_S = 10.0  # only bounds a broken run: a healthy one is released within milliseconds


def test_slow_copies_of_two_runs_do_not_stall_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ticks = 0
    gated: list[str] = []

    def gate(name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        # Holds the copy until the loop has ticked TICKS more times: a copy run on the loop
        # itself would stop the ticker, and come out of here only to fail.
        def slow(*args: Any, **kwargs: Any) -> Any:
            start, deadline = ticks, time.monotonic() + PATIENCE_S
            while ticks < start + TICKS:
                assert time.monotonic() < deadline, f"the loop stood still during {name}"
                time.sleep(0.001)
            gated.append(name)
            return real(*args, **kwargs)

        return slow

    for name in ("copy_in", "copy_back", "remove_tree"):
        monkeypatch.setattr(treecopy, name, gate(name, getattr(treecopy, name)))

    def run_folder(name: str) -> Workspaces:
        source = tmp_path / name
        source.mkdir()
        (source / "in.txt").write_text(name)
        options = WorkspaceOptions(mounts=(parse_mount(f"{source}:data:rw"),), mount_tools=False)
        return Workspaces(options, {}, tools_dir=None, warn=lambda message: None)

    async def node(workspaces: Workspaces) -> str:
        async with workspaces.enter("node") as workspace:
            copy = workspace.root / "data"
            (copy / "out.txt").write_text("written")
            return (copy / "in.txt").read_text()

    async def main() -> list[str]:
        nonlocal ticks
        stop = asyncio.Event()

        async def ticker() -> None:
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0.001)

        beat = asyncio.create_task(ticker())
        try:
            return list(await asyncio.gather(node(run_folder("one")), node(run_folder("two"))))
        finally:
            stop.set()
            await beat

    assert asyncio.run(main()) == ["one", "two"]
    assert sorted(gated) == sorted(["copy_in", "copy_back", "remove_tree"] * 2)
    assert (tmp_path / "one" / "out.txt").read_text() == "written" == (tmp_path / "two" / "out.txt").read_text()
    assert ticks >= 3 * TICKS


def test_a_cancelled_copy_in_leaves_no_workspace_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started, release = threading.Event(), threading.Event()
    real = treecopy.copy_in

    def held(*args: Any, **kwargs: Any) -> Any:
        started.set()
        assert release.wait(PATIENCE_S)
        return real(*args, **kwargs)

    monkeypatch.setattr(treecopy, "copy_in", held)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.txt").write_text("x")
    options = WorkspaceOptions(mounts=(parse_mount(f"{tmp_path / 'src'}:data"),), mount_tools=False)
    workspaces = Workspaces(options, {}, tools_dir=None, warn=lambda message: None)
    roots: list[Path] = []
    real_open = workspaces.open

    def open_and_note(node_name: str, **kwargs: Any) -> Any:
        workspace = real_open(node_name, **kwargs)
        roots.append(workspace.root)
        return workspace

    monkeypatch.setattr(workspaces, "open", open_and_note)

    async def main() -> None:
        async def node() -> None:
            async with workspaces.enter("node"):
                raise AssertionError("a cancelled node must not get its workspace")

        task = asyncio.create_task(node())
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.sleep(0)
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert roots and not roots[0].exists()
