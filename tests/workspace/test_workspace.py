"""Workspaces without the sandbox: layout, sharing, keeping, and `rw` copy-back."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from heddle.errors import RunError, UsageError
from heddle.workspace import (
    SandboxPolicy,
    WorkspaceOptions,
    Workspaces,
    parse_mount,
)
from tests.workspace.tooling import ToolBox, Warnings, call_tool, probe

PLAIN = SandboxPolicy()


def make(toolbox: ToolBox, warn: Warnings, *mounts: str, **options: Any) -> Workspaces:
    ws = Workspaces(
        WorkspaceOptions(mounts=tuple(parse_mount(m) for m in mounts), **options),
        toolbox.tools,
        tools_dir=toolbox.tools_dir,
        warn=warn,
    )
    ws.check()
    return ws


@pytest.fixture
def data(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a")
    (root / "sub" / "b.txt").write_text("b")
    return root


def test_layout_env_and_cwd(toolbox: ToolBox, warned: Warnings, data: Path) -> None:
    spaces = make(toolbox, warned, f"{data}:in/data")
    with spaces.open("agent") as ws:
        results = probe(
            toolbox,
            ws,
            PLAIN,
            {"op": "cwd"},
            {"op": "env", "arg": "HEDDLE_WORKSPACE"},
            {"op": "env", "arg": "HEDDLE_WORKSPACE_BIN"},
            {"op": "env", "arg": "PATH"},
            {"op": "listdir", "arg": ".heddle/bin"},
            {"op": "read", "arg": "in/data/sub/b.txt"},
        )
        cwd, root, bin_dir, path, tools, b = (r["value"] for r in results)
        assert Path(cwd) == ws.root == Path(root)
        assert Path(bin_dir) == ws.root / ".heddle" / "bin" == ws.bin_dir
        assert path == f"{os.environ['PATH']}{os.pathsep}{bin_dir}"
        assert tools == ["echo", "probe"]
        assert stat.S_IMODE((ws.bin_dir / "echo").stat().st_mode) == 0o755
        assert b == "b"
    assert not ws.root.exists()
    assert warned == []


def test_tools_call_each_other_by_name(toolbox: ToolBox, warned: Warnings) -> None:
    spaces = make(toolbox, warned)
    with spaces.open("agent") as ws:
        (result,) = probe(
            toolbox, ws, PLAIN, {"op": "run", "arg": ["probe"], "data": '{"ops": [{"op": "cwd"}]}'}
        )
        assert result["ok"], result
        assert f'"value": "{ws.root}"' in result["value"]


def test_no_mount_tools_leaves_bin_empty(toolbox: ToolBox, warned: Warnings) -> None:
    spaces = make(toolbox, warned, mount_tools=False)
    with spaces.open("agent") as ws:
        assert ws.bin_dir.is_dir()
        assert list(ws.bin_dir.iterdir()) == []


def test_calls_in_one_workspace_share_files(toolbox: ToolBox, warned: Warnings) -> None:
    spaces = make(toolbox, warned)
    with spaces.open("agent") as ws:
        probe(toolbox, ws, PLAIN, {"op": "write", "arg": "handoff.txt", "data": "from call one"})
        (read,) = probe(toolbox, ws, PLAIN, {"op": "read", "arg": "handoff.txt"})
    assert read == {"ok": True, "value": "from call one"}


def test_two_workspaces_share_nothing(toolbox: ToolBox, warned: Warnings, data: Path) -> None:
    spaces = make(toolbox, warned, str(data))
    with spaces.open("tool") as first:
        probe(
            toolbox,
            first,
            PLAIN,
            {"op": "write", "arg": "own.txt"},
            {"op": "write", "arg": "data/a.txt", "data": "edited"},
        )
        with spaces.open("tool") as second:
            assert first.root != second.root
            results = probe(
                toolbox,
                second,
                PLAIN,
                {"op": "read", "arg": "own.txt"},
                {"op": "read", "arg": "data/a.txt"},
            )
    assert results[0]["ok"] is False and "FileNotFoundError" in results[0]["error"]
    assert results[1] == {"ok": True, "value": "a"}
    # An ro mount is a private copy: the edit never reached the source.
    assert (data / "a.txt").read_text() == "a"


def test_ro_copies_of_read_only_sources_are_writable(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    # A sealed cache is read-only; its copies must still be private, writable files.
    for path in (data / "a.txt", data / "sub" / "b.txt", data / "sub", data):
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        spaces = make(toolbox, warned, str(data))
        with spaces.open("n") as ws:
            (written,) = probe(toolbox, ws, PLAIN, {"op": "write", "arg": "data/sub/new.txt"})
            assert written == {"ok": True}
            assert (ws.root / "data" / "a.txt").stat().st_mode & stat.S_IWUSR
    finally:
        for path in (data, data / "sub", data / "a.txt", data / "sub" / "b.txt"):
            path.chmod(0o755 if path.is_dir() else 0o644)
    assert not ws.root.exists()


def test_single_file_mount(toolbox: ToolBox, warned: Warnings, tmp_path: Path) -> None:
    src = tmp_path / "notes.txt"
    src.write_text("v1")
    spaces = make(toolbox, warned, f"{src}:docs/notes.txt:rw")
    with spaces.open("n") as ws:
        probe(toolbox, ws, PLAIN, {"op": "write", "arg": "docs/notes.txt", "data": "v2"})
    assert src.read_text() == "v2"
    assert warned == []


def test_rw_edits_come_back_and_deletions_do_not(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    untouched = os.stat(data / "sub" / "b.txt")
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("writer") as ws:
        results = probe(
            toolbox,
            ws,
            PLAIN,
            {"op": "write", "arg": "work/a.txt", "data": "changed"},
            {"op": "write", "arg": "work/created.txt", "data": "new"},
            {"op": "delete", "arg": "work/sub/b.txt"},
        )
        assert all(r["ok"] for r in results), results
        os.makedirs(ws.root / "work" / "deep" / "er")
        (ws.root / "work" / "deep" / "er" / "f.txt").write_text("deep")
    assert (data / "a.txt").read_text() == "changed"
    assert (data / "created.txt").read_text() == "new"
    assert (data / "deep" / "er" / "f.txt").read_text() == "deep"
    # The node deleted b.txt; the user's file stays, and was not even rewritten.
    assert (data / "sub" / "b.txt").read_text() == "b"
    assert os.stat(data / "sub" / "b.txt").st_ino == untouched.st_ino
    assert not [p for p in data.rglob("*") if p.name.startswith(".heddle-")]
    assert warned == []


def test_rw_delete_everything_deletes_nothing(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("vandal") as ws:
        shutil.rmtree(ws.root / "work")
    assert sorted(p.relative_to(data).as_posix() for p in data.rglob("*")) == [
        "a.txt",
        "sub",
        "sub/b.txt",
    ]


def test_later_nodes_see_earlier_writes(toolbox: ToolBox, warned: Warnings, data: Path) -> None:
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("first") as ws:
        probe(toolbox, ws, PLAIN, {"op": "write", "arg": "work/note.txt", "data": "from first"})
    with spaces.open("second") as ws:
        (read,) = probe(toolbox, ws, PLAIN, {"op": "read", "arg": "work/note.txt"})
    assert read == {"ok": True, "value": "from first"}


def test_same_size_same_mtime_edit_is_still_seen(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("sly") as ws:
        copy = ws.root / "work" / "a.txt"
        before = copy.stat()
        copy.write_text("z")
        os.utime(copy, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (data / "a.txt").read_text() == "z"


def test_rewriting_same_content_is_not_a_change(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    original = os.stat(data / "a.txt")
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("n") as ws:
        probe(toolbox, ws, PLAIN, {"op": "write", "arg": "work/a.txt", "data": "a"})
        # The user edits the original meanwhile; the node changed nothing, so no conflict.
        (data / "sub" / "b.txt").write_text("user")
    assert os.stat(data / "a.txt").st_ino == original.st_ino
    assert (data / "sub" / "b.txt").read_text() == "user"
    assert warned == []


def test_concurrent_change_warns_and_run_wins(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("editor") as ws:
        probe(
            toolbox,
            ws,
            PLAIN,
            {"op": "write", "arg": "work/a.txt", "data": "run"},
            {"op": "write", "arg": "work/both.txt", "data": "run"},
        )
        (data / "a.txt").write_text("user edit")
        (data / "both.txt").write_text("user created")
    assert (data / "a.txt").read_text() == "run"
    assert (data / "both.txt").read_text() == "run"
    assert sorted(warned) == sorted(
        f"{data / name} changed outside the run while node 'editor' was running; "
        "kept the run's version"
        for name in ("a.txt", "both.txt")
    )


def test_parallel_nodes_writing_one_file_warn(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    spaces = make(toolbox, warned, f"{data}:work:rw")
    first = spaces.open("left")
    second = spaces.open("right")
    (first.root / "work" / "a.txt").write_text("left")
    (second.root / "work" / "a.txt").write_text("right")
    first.close()
    assert warned == []
    second.close()
    assert (data / "a.txt").read_text() == "right"
    assert warned == [
        f"{data / 'a.txt'} changed outside the run while node 'right' was running; "
        "kept the run's version"
    ]


def test_failed_copy_back_is_a_warning_and_the_node_error_wins(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with pytest.raises(RuntimeError, match="the node failed"):
        with spaces.open("broken") as ws:
            (ws.root / "work" / "made").mkdir()
            (ws.root / "work" / "made" / "x.txt").write_text("x")
            (ws.root / "work" / "a.txt").write_text("kept")
            # Meanwhile the user puts a file where the node's new folder would go.
            (data / "made").write_text("user file")
            raise RuntimeError("the node failed")
    assert (data / "made").read_text() == "user file"
    assert (data / "a.txt").read_text() == "kept"
    assert warned == [
        f"could not copy back into {data / 'made'}: it is no longer a folder; "
        "files under it were not copied back"
    ]
    assert not ws.root.exists()


def test_symlinks_made_by_a_node_are_not_followed_back(
    toolbox: ToolBox, warned: Warnings, data: Path, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("secret")
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("n") as ws:
        (ws.root / "work" / "leak").symlink_to(secret)
    assert not os.path.lexists(data / "leak")
    assert warned == [f"did not copy back {ws.root / 'work' / 'leak'}: it is a symlink"]


def test_copy_back_replaces_by_rename(toolbox: ToolBox, warned: Warnings, data: Path) -> None:
    before = os.stat(data / "a.txt")
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("n") as ws:
        (ws.root / "work" / "a.txt").write_text("new")
    after = os.stat(data / "a.txt")
    # A new inode: the file was written beside and renamed over, never rewritten in place.
    assert after.st_ino != before.st_ino
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)
    assert sorted(os.listdir(data)) == ["a.txt", "sub"]


def test_mode_change_comes_back(toolbox: ToolBox, warned: Warnings, data: Path) -> None:
    spaces = make(toolbox, warned, f"{data}:work:rw")
    with spaces.open("n") as ws:
        (ws.root / "work" / "a.txt").chmod(0o750)
    assert stat.S_IMODE(os.stat(data / "a.txt").st_mode) == 0o750


def test_keep_root_keeps_trees_with_suffixes(
    toolbox: ToolBox, warned: Warnings, tmp_path: Path, data: Path
) -> None:
    keep = tmp_path / "runs"
    spaces = make(toolbox, warned, str(data), keep_root=keep)
    roots = []
    for node in ("agent", "agent", "agent", "tool/x"):
        with spaces.open(node) as ws:
            probe(toolbox, ws, PLAIN, {"op": "write", "arg": "out.txt", "data": node})
            roots.append(ws.root)
    assert roots == [keep / "agent", keep / "agent-2", keep / "agent-3", keep / "tool_x"]
    assert [(r / "out.txt").read_text() for r in roots] == ["agent", "agent", "agent", "tool/x"]
    assert (keep / "agent-2" / "data" / "sub" / "b.txt").read_text() == "b"
    assert (keep / "agent" / ".heddle" / "bin" / "probe").is_file()


def test_keep_root_skips_leftovers(toolbox: ToolBox, warned: Warnings, tmp_path: Path) -> None:
    keep = tmp_path / "runs"
    (keep / "agent").mkdir(parents=True)
    spaces = make(toolbox, warned, keep_root=keep)
    with spaces.open("agent") as ws:
        assert ws.root == keep / "agent-2"


@pytest.mark.parametrize("name", ["..", ".hidden", "", "a b/c"])
def test_node_names_become_safe_folders(
    toolbox: ToolBox, warned: Warnings, tmp_path: Path, name: str
) -> None:
    keep = tmp_path / "runs"
    spaces = make(toolbox, warned, keep_root=keep)
    with spaces.open(name) as ws:
        assert ws.root.parent == keep
        assert not ws.root.name.startswith(".")


def test_temporary_workspace_removed_even_with_locked_folders(
    toolbox: ToolBox, warned: Warnings
) -> None:
    spaces = make(toolbox, warned)
    with spaces.open("n") as ws:
        locked = ws.root / "locked"
        (locked / "inner").mkdir(parents=True)
        (locked / "inner" / "f").write_text("f")
        (locked / "inner").chmod(0)
        locked.chmod(0o500)
    assert not ws.root.exists()
    assert warned == []


def test_failed_open_leaves_nothing(
    toolbox: ToolBox, warned: Warnings, tmp_path: Path, data: Path
) -> None:
    keep = tmp_path / "runs"
    spaces = make(toolbox, warned, str(data), keep_root=keep)
    # The source vanishes between the start-up check and the node.
    (data / "sub" / "b.txt").unlink()
    (data / "sub").rmdir()
    (data / "a.txt").unlink()
    data.rmdir()
    with pytest.raises(RunError) as err:
        spaces.open("n")
    assert str(err.value) == (
        f"node 'n': cannot build its workspace: {data}: No such file or directory"
    )
    assert list(keep.iterdir()) == []


def test_keep_root_that_is_a_file(toolbox: ToolBox, warned: Warnings, tmp_path: Path) -> None:
    keep = tmp_path / "file"
    keep.write_text("")
    with pytest.raises(UsageError) as err:
        make(toolbox, warned, keep_root=keep)
    assert str(err.value) == f"--workspace {keep}: not a folder; give a folder path"


def test_keep_root_inside_a_mount(
    toolbox: ToolBox, warned: Warnings, data: Path
) -> None:
    with pytest.raises(UsageError) as err:
        make(toolbox, warned, f"{data}:work:rw", keep_root=data / "runs")
    assert str(err.value) == (
        f"--workspace {data / 'runs'}: inside mount {data}:work:rw, so every node would copy "
        "the earlier workspaces; keep them elsewhere"
    )


def test_bad_tool_name(toolbox: ToolBox, warned: Warnings) -> None:
    spaces = Workspaces(
        WorkspaceOptions(), {"a/b": toolbox.tools["echo"]}, tools_dir=None, warn=warned
    )
    with pytest.raises(UsageError) as err:
        spaces.check()
    assert str(err.value) == (
        "tool 'a/b': its name cannot be a file name in .heddle/bin; "
        "rename the tool or run with --no-mount-tools"
    )
    # Without tool mounting the name never becomes a file.
    Workspaces(
        WorkspaceOptions(mount_tools=False),
        {"a/b": toolbox.tools["echo"]},
        tools_dir=None,
        warn=warned,
    ).check()


def test_missing_tool_executable(toolbox: ToolBox, warned: Warnings, tmp_path: Path) -> None:
    spaces = Workspaces(
        WorkspaceOptions(), {"ghost": tmp_path / "ghost"}, tools_dir=None, warn=warned
    )
    with pytest.raises(UsageError) as err:
        spaces.check()
    assert str(err.value) == f"tool 'ghost': executable {tmp_path / 'ghost'} is not a file"


def test_check_refuses_bad_mounts(toolbox: ToolBox, warned: Warnings, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        make(toolbox, warned, str(tmp_path / "missing"))
    assert "does not exist; check the path" in str(err.value)


def test_echo_tool_round_trip(toolbox: ToolBox, warned: Warnings) -> None:
    spaces = make(toolbox, warned)
    with spaces.open("n") as ws:
        out = call_tool(
            toolbox.tools["echo"], {"q": 1}, workspace=ws, policy=PLAIN, tools_dir=toolbox.tools_dir
        )
    assert out == {"echo": {"q": 1}}


def test_relative_keep_root_gives_absolute_workspaces(
    toolbox: ToolBox, warned: Warnings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    monkeypatch.chdir(tmp_path)
    spaces = make(toolbox, warned, keep_root=Path("link/runs"))
    with spaces.open("n") as ws:
        (cwd,) = probe(toolbox, ws, PLAIN, {"op": "env", "arg": "HEDDLE_WORKSPACE"})
    assert ws.root == tmp_path / "real" / "runs" / "n"
    assert cwd["value"] == str(ws.root)
