"""Folders heddle keeps state in or reads state from are refused unless they are its user's own: made by
another user (a real second account, `useradd`), or writable by others, each is one line naming the
folder and the `chown`/`chmod` that fixes it, exit 2, before anything runs. Kept workspaces are 0700."""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest

from tests.server.support import run_server_to_exit
from tests.support.cli import error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_tool
from tests.support.users import OtherUser, made_by, other_user  # noqa: F401 (a fixture)


def _flow(tmp_path: Path) -> tuple[Path, Path]:
    """start -> one ToolNode (`note`, which writes a file in its workspace) -> end; and its tools folder."""
    tools = tmp_path / "tools"
    write_tool(tools, "note.py", "open('note.txt', 'w').write(args['text'])\nout = {'seen': args['text']}")
    f = FlowDoc("owned")
    start = f.start(["text"])
    node = f.tool_node("note", server_tool("note", ["text"], ["seen"]))
    end = f.end(["seen"])
    f.control(start, node)
    f.control(node, end)
    f.data(start, "text", node, "text")
    f.data(node, "seen", end, "seen")
    return f.write(tmp_path / "flow.json"), tools


def _refused_as_others(line: str, folder: Path, what: str, setting: str, uid: int) -> None:
    assert line == (f"error: {what} {folder} is owned by uid {uid}, not by you (uid {os.geteuid()}), so its owner "
                    f"could change what heddle trusts; run `chown {os.geteuid()} {folder}` or point {setting} at "
                    "a folder of your own")


def test_folders_another_user_made_are_refused(tmp_path: Path, other_user: OtherUser,  # noqa: F811
                                               capsys: pytest.CaptureFixture[str]) -> None:
    flow, tools = _flow(tmp_path)
    shared = tmp_path / "shared"
    shared.mkdir()
    theirs = made_by(other_user, shared, "theirs")
    run = ("run", flow, "-t", tools, "--input", '{"text": "hi"}')

    # The real `heddle`: a workspace another user made would give them the run's files, and what an
    # rw mount gets back from it.
    proc = heddle(*run, "--workspace", theirs)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    _refused_as_others(error_line(proc), theirs, "workspace folder", "--workspace", other_user.uid)
    assert list(theirs.iterdir()) == []  # nothing ran

    # The session stores' folders: whoever can write there forges a session. The same command in this process.
    for flags, what, setting, folder in (
            (("--session-store", "file", "--session-dir", theirs), "session folder", "--session-dir", theirs),
            (("--session-db", theirs / "s.db"), "folder of the sessions file", "--session-db", theirs)):
        proc = heddle_here(capsys, *run, "--session", "s", *flags)
        assert proc.returncode == 2, proc.stderr
        _refused_as_others(error_line(proc), folder, what, setting, other_user.uid)
        assert list(theirs.iterdir()) == []

    # heddle-server's --work-dir, where every run makes its folders: refused before the port opens.
    proc = run_server_to_exit(tmp_path, "--work-dir", theirs)
    assert proc.returncode == 2 and "listening" not in proc.stdout
    _refused_as_others([line for line in proc.stderr.splitlines() if line.startswith("error: ")][-1], theirs,
                       "work folder", "--work-dir", other_user.uid)


def test_folders_others_can_write_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    flow, tools = _flow(tmp_path)
    run = ("run", flow, "-t", tools, "--input", '{"text": "hi"}')
    group = tmp_path / "group"
    group.mkdir()
    group.chmod(0o775)
    proc = heddle_here(capsys, *run, "--workspace", group)
    assert proc.returncode == 2
    assert error_line(proc) == (f"error: workspace folder {group} is writable by its group (mode 0775), so another "
                                f"user could change what heddle trusts; run `chmod go-w {group}`")
    world = tmp_path / "world"
    world.mkdir()
    world.chmod(0o777)
    proc = heddle_here(capsys, *run, "--session", "s", "--session-store", "file", "--session-dir", world)
    assert proc.returncode == 2
    assert error_line(proc) == (f"error: session folder {world} is writable by its group and everyone (mode 0777), "
                                f"so another user could change what heddle trusts; run `chmod go-w {world}`")
    # A folder heddle would make inside one others can write to (not sticky) could be swapped for theirs.
    inside = world / "heddle" / "sessions.db"
    proc = heddle_here(capsys, *run, "--session", "s", "--session-db", inside)
    assert proc.returncode == 2 and f"inside {world}, which its group and everyone can write to" in error_line(proc)
    assert list(world.iterdir()) == [] and list(group.iterdir()) == []
    # heddle-server's --work-dir, in its own entry point.
    from heddle.server.cli import run as server

    monkeypatch.setattr(tempfile, "tempdir", tempfile.tempdir)  # a refusal must not leave it pointed elsewhere
    assert server(["--port", "0", "--work-dir", str(group)], {}) == 2
    assert f"error: work folder {group} is writable by its group" in capsys.readouterr().err


def test_kept_workspaces_are_their_owners_alone(tmp_path: Path) -> None:
    flow, tools = _flow(tmp_path)
    old = os.umask(0o022)
    try:
        keep = tmp_path / "new" / "kept"
        state = state_of(heddle("run", flow, "-t", tools, "--input", '{"text": "hi"}', "--workspace", keep))
    finally:
        os.umask(old)
    assert state["seen"] == "hi"
    assert (keep / "note" / "note.txt").read_text() == "hi"
    for folder in (tmp_path / "new", keep, keep / "note"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder
