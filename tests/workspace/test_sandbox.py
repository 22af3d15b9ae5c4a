"""Safe mode with real bubblewrap: what a confined tool can and cannot reach."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from heddle.errors import RunError, UsageError
from heddle.workspace import (
    SandboxPolicy,
    WorkspaceOptions,
    Workspaces,
    check_policy,
    confine,
    parse_mount,
)
from tests.workspace.tooling import PYTHON_READ, ToolBox, Warnings, call_tool, probe

SAFE = SandboxPolicy(safe=True, allow_read=PYTHON_READ)


def safe(**changes: object) -> SandboxPolicy:
    fields = {
        "safe": True,
        "allow_read": PYTHON_READ,
        **changes,
    }
    return SandboxPolicy(**fields)  # type: ignore[arg-type]


@pytest.fixture
def spaces(toolbox: ToolBox, warned: Warnings, tmp_path: Path) -> Workspaces:
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("input")
    out = tmp_path / "out"
    out.mkdir()
    spaces = Workspaces(
        WorkspaceOptions(mounts=(parse_mount(f"{data}:data"), parse_mount(f"{out}:out:rw"))),
        toolbox.tools,
        tools_dir=toolbox.tools_dir,
        warn=warned,
    )
    spaces.check()
    check_policy(SAFE, explicitly_set=["--safe"])
    return spaces


@pytest.fixture
def home_marker() -> Iterator[Path]:
    """A marker in the real home folder of whoever runs the tests."""
    marker = Path.home() / f".heddle-test-marker-{uuid.uuid4().hex}"
    marker.write_text("private")
    try:
        yield marker
    finally:
        marker.unlink()


def test_cannot_read_real_home(toolbox: ToolBox, spaces: Workspaces, home_marker: Path) -> None:
    with spaces.open("n") as ws:
        outside, home, listing = probe(
            toolbox,
            ws,
            SAFE,
            {"op": "read", "arg": str(home_marker)},
            {"op": "env", "arg": "HOME"},
            {"op": "listdir", "arg": "/tmp/home"},
        )
        # The same call without --safe reads it: the marker is real and readable.
        (plain,) = probe(toolbox, ws, SandboxPolicy(), {"op": "read", "arg": str(home_marker)})
    assert outside["ok"] is False and "FileNotFoundError" in outside["error"]
    assert home == {"ok": True, "value": "/tmp/home"}
    assert listing == {"ok": True, "value": []}
    assert plain == {"ok": True, "value": "private"}


def test_cannot_write_tools_dir(toolbox: ToolBox, spaces: Workspaces) -> None:
    target = toolbox.tools_dir / "planted"
    with spaces.open("n") as ws:
        (tools_dir, bin_dir, own) = probe(
            toolbox,
            ws,
            SAFE,
            {"op": "write", "arg": str(target)},
            {"op": "write", "arg": ".heddle/bin/probe"},
            {"op": "read", "arg": str(toolbox.tools["echo"])},
        )
        assert (ws.bin_dir / "probe").read_text() == toolbox.tools["probe"].read_text()
    assert tools_dir["ok"] is False and "Read-only file system" in tools_dir["error"]
    assert bin_dir["ok"] is False and "Read-only file system" in bin_dir["error"]
    assert own["ok"] is True
    assert not target.exists()


def test_cannot_write_host_tmp(toolbox: ToolBox, spaces: Workspaces) -> None:
    name = f"/tmp/heddle-escape-{uuid.uuid4().hex}"
    with spaces.open("n") as ws:
        written, read = probe(
            toolbox, ws, SAFE, {"op": "write", "arg": name}, {"op": "read", "arg": name}
        )
    # The write lands in the sandbox's own /tmp, which vanishes with it.
    assert written == {"ok": True}
    assert read == {"ok": True, "value": "x"}
    assert not os.path.exists(name)


def test_fresh_tmp_per_call(toolbox: ToolBox, spaces: Workspaces) -> None:
    with spaces.open("n") as ws:
        probe(toolbox, ws, SAFE, {"op": "write", "arg": "/tmp/left-behind"})
        (listing,) = probe(toolbox, ws, SAFE, {"op": "listdir", "arg": "/tmp"})
    assert "left-behind" not in listing["value"]


def test_ro_mount_is_read_only_rw_mount_and_workspace_are_writable(
    toolbox: ToolBox, spaces: Workspaces, tmp_path: Path, warned: Warnings
) -> None:
    with spaces.open("n") as ws:
        ro_write, ro_delete, ro_read, rw_write, scratch = probe(
            toolbox,
            ws,
            SAFE,
            {"op": "write", "arg": "data/in.txt", "data": "tampered"},
            {"op": "delete", "arg": "data/in.txt"},
            {"op": "read", "arg": "data/in.txt"},
            {"op": "write", "arg": "out/result.txt", "data": "made in the sandbox"},
            {"op": "write", "arg": "scratch.txt"},
        )
        # The next call of the same node sees the scratch file.
        (shared,) = probe(toolbox, ws, SAFE, {"op": "read", "arg": "scratch.txt"})
    assert ro_write["ok"] is False and "Read-only file system" in ro_write["error"]
    assert ro_delete["ok"] is False
    assert ro_read == {"ok": True, "value": "input"}
    assert rw_write == {"ok": True}
    assert scratch == {"ok": True}
    assert shared == {"ok": True, "value": "x"}
    assert (tmp_path / "data" / "in.txt").read_text() == "input"
    assert (tmp_path / "out" / "result.txt").read_text() == "made in the sandbox"
    assert warned == []


def test_environment_is_cleared(
    toolbox: ToolBox, spaces: Workspaces, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HEDDLE_TEST_SECRET", "leaked")
    monkeypatch.setenv("SECRET_TOKEN", "leaked")
    monkeypatch.setenv("ALLOWED_TOKEN", "arrived")
    monkeypatch.setenv("LANG", "C.UTF-8")
    ops = [
        {"op": "env", "arg": name}
        for name in ("SECRET_TOKEN", "ALLOWED_TOKEN", "LANG", "HEDDLE_WORKSPACE", "TMPDIR")
    ]
    with spaces.open("n") as ws:
        secret, allowed, lang, workspace, tmpdir = probe(toolbox, ws, SAFE, *ops)
        allowed_run = probe(toolbox, ws, safe(allow_env=("ALLOWED_TOKEN",)), *ops)
    assert secret == {"ok": False, "value": None}
    assert allowed == {"ok": False, "value": None}
    assert lang == {"ok": True, "value": "C.UTF-8"}
    assert workspace == {"ok": True, "value": str(ws.root)}
    assert tmpdir == {"ok": True, "value": "/tmp"}
    assert allowed_run[0] == {"ok": False, "value": None}
    assert allowed_run[1] == {"ok": True, "value": "arrived"}


def test_deny_net_blocks_loopback(toolbox: ToolBox, spaces: Workspaces, tcp_server: int) -> None:
    connect = {"op": "connect", "arg": ["127.0.0.1", tcp_server]}
    with spaces.open("n") as ws:
        (open_net,) = probe(toolbox, ws, SAFE, connect)
        (denied,) = probe(toolbox, ws, safe(deny_net=True), connect)
    assert open_net == {"ok": True, "value": "pong"}
    assert denied["ok"] is False and "ConnectionRefusedError" in denied["error"]


def test_tools_call_each_other_inside_the_sandbox(toolbox: ToolBox, spaces: Workspaces) -> None:
    with spaces.open("n") as ws:
        (result,) = probe(
            toolbox, ws, SAFE, {"op": "run", "arg": ["probe"], "data": '{"ops": [{"op": "cwd"}]}'}
        )
    assert result["ok"], result
    assert str(ws.root) in result["value"]


def test_cannot_see_processes_or_regain_privileges(toolbox: ToolBox, spaces: Workspaces) -> None:
    with spaces.open("n") as ws:
        (procs, status) = probe(
            toolbox,
            ws,
            SAFE,
            {"op": "listdir", "arg": "/proc"},
            {"op": "read", "arg": "/proc/self/status"},
        )
    pids = [p for p in procs["value"] if p.isdigit()]
    assert str(os.getpid()) not in pids and len(pids) <= 3
    cap_eff = next(line for line in status["value"].splitlines() if line.startswith("CapEff"))
    assert cap_eff.split()[1] == "0" * 16


def test_allow_read_and_allow_write(toolbox: ToolBox, spaces: Workspaces, tmp_path: Path) -> None:
    readable = tmp_path / "readable"
    readable.mkdir()
    (readable / "r.txt").write_text("r")
    writable = tmp_path / "writable"
    writable.mkdir()
    with spaces.open("n") as ws:
        before = probe(
            toolbox,
            ws,
            SAFE,
            {"op": "read", "arg": str(readable / "r.txt")},
            {"op": "write", "arg": str(writable / "w.txt")},
        )
        policy = safe(allow_read=PYTHON_READ + (readable,), allow_write=(writable,))
        after = probe(
            toolbox,
            ws,
            policy,
            {"op": "read", "arg": str(readable / "r.txt")},
            {"op": "write", "arg": str(readable / "no.txt")},
            {"op": "write", "arg": str(writable / "w.txt"), "data": "w"},
        )
    assert [r["ok"] for r in before] == [False, False]
    assert after[0] == {"ok": True, "value": "r"}
    assert after[1]["ok"] is False and "Read-only file system" in after[1]["error"]
    assert after[2] == {"ok": True}
    assert (writable / "w.txt").read_text() == "w"
    assert not (readable / "no.txt").exists()


def test_allow_read_of_a_parent_keeps_workspace_writable(
    toolbox: ToolBox, spaces: Workspaces, tmp_path: Path
) -> None:
    # Binds are applied parents first, so a wide --allow-read never covers the workspace.
    policy = safe(allow_read=PYTHON_READ + (Path("/tmp"), tmp_path))
    with spaces.open("n") as ws:
        written, tools = probe(
            toolbox,
            ws,
            policy,
            {"op": "write", "arg": "fine.txt"},
            {"op": "write", "arg": str(toolbox.tools_dir / "planted")},
        )
    assert written == {"ok": True}
    assert tools["ok"] is False


def test_without_safe_confine_changes_nothing(toolbox: ToolBox, spaces: Workspaces) -> None:
    with spaces.open("n") as ws:
        env = {"A": "1"}
        argv, out = confine(SandboxPolicy(), ["/x"], workspace=ws, tools_dir=None, env=env)
    assert argv == ["/x"] and out == env and out is not env


# Start-up refusals.


def refusal(policy: SandboxPolicy, explicitly_set: list[str]) -> str:
    with pytest.raises(UsageError) as err:
        check_policy(policy, explicitly_set=explicitly_set)
    assert err.value.exit_code == 2
    assert "\n" not in str(err.value)
    return str(err.value)


def test_safe_flags_without_safe_are_listed() -> None:
    assert refusal(SandboxPolicy(), ["--deny-net", "--allow-env", "--mount"]) == (
        "--allow-env, --deny-net only work with --safe and would be ignored; "
        "add --safe or drop them"
    )
    assert refusal(SandboxPolicy(), ["--sandbox"]) == (
        "--sandbox only works with --safe and would be ignored; add --safe or drop them"
    )


def test_safe_flags_set_without_cli_are_listed(tmp_path: Path) -> None:
    policy = SandboxPolicy(allow_read=(tmp_path,), allow_write=(tmp_path,), deny_net=True)
    assert refusal(policy, []).startswith("--allow-read, --allow-write, --deny-net only work")


def test_plain_policy_passes() -> None:
    check_policy(SandboxPolicy(), explicitly_set=[])
    check_policy(SandboxPolicy(), explicitly_set=["--mount", "--workspace"])


def test_missing_bwrap_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert refusal(SandboxPolicy(safe=True), ["--safe"]) == (
        "--safe needs bubblewrap and 'bwrap' is not on PATH; install bubblewrap "
        "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
    )


def test_unknown_backend() -> None:
    assert refusal(SandboxPolicy(safe=True, backend="docker"), ["--sandbox"]) == (
        "--sandbox 'docker': unknown; use auto or bubblewrap"
    )


def test_bad_allow_env_name() -> None:
    assert refusal(SandboxPolicy(safe=True, allow_env=("A=1",)), ["--allow-env"]) == (
        "--allow-env 'A=1': not an environment variable name; give NAME only"
    )


def test_missing_allow_paths(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert refusal(SandboxPolicy(safe=True, allow_read=(missing,)), []) == (
        f"--allow-read {missing}: does not exist; give an existing file or folder"
    )
    assert refusal(SandboxPolicy(safe=True, allow_write=(missing,)), []).startswith(
        f"--allow-write {missing}: does not exist"
    )


HEARTBEAT = """#!/bin/sh
( while true; do date +%s%N > beat; sleep 0.05; done ) &
while true; do sleep 1; done
"""

PARENT = """
import json, subprocess, sys, time
argv, env, cwd = json.load(sys.stdin)
child = subprocess.Popen(argv, env=env, cwd=cwd)
print(child.pid, flush=True)
time.sleep(120)
"""


def test_sandbox_dies_with_its_parent(toolbox: ToolBox, spaces: Workspaces) -> None:
    script = toolbox.tools_dir / "heartbeat"
    script.write_text(HEARTBEAT)
    script.chmod(0o755)
    with spaces.open("n") as ws:
        argv, env = confine(
            SAFE, [str(script)], workspace=ws, tools_dir=toolbox.tools_dir, env=ws.env(os.environ)
        )
        # A stand-in for heddle: the real parent of bwrap, killed without a chance to clean up.
        parent = subprocess.Popen(
            [sys.executable, "-c", PARENT],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert parent.stdin is not None and parent.stdout is not None
        parent.stdin.write(json.dumps([argv, env, str(ws.root)]))
        parent.stdin.close()
        parent.stdout.readline()
        beat = ws.root / "beat"
        deadline = time.monotonic() + 20
        while not (beat.exists() and beat.read_text().strip()):
            assert time.monotonic() < deadline, "the sandboxed tool never started"
            time.sleep(0.05)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        parent.stdout.close()
        time.sleep(0.5)
        last = beat.read_text()
        time.sleep(0.5)
        assert beat.read_text() == last, "the sandboxed tool outlived its parent"



def test_ro_mount_swapped_for_a_link_is_refused(
    toolbox: ToolBox, warned: Warnings, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    host = tmp_path / "host"
    (host / "b").mkdir(parents=True)
    (host / "b" / "secret.txt").write_text("secret")
    spaces = Workspaces(
        WorkspaceOptions(mounts=(parse_mount(f"{data}:a/b"),)),
        toolbox.tools,
        tools_dir=toolbox.tools_dir,
        warn=warned,
    )
    spaces.check()
    # The folder above the read-only copy is writable: a tool can move it and leave a link,
    # hoping the next call binds `a/b` wherever the link leads.
    script = toolbox.tools_dir / "mover"
    script.write_text(f"#!/bin/sh\nmv a moved && ln -s {host} a\necho '{{}}'\n")
    script.chmod(0o755)
    with spaces.open("n") as ws:
        assert call_tool(script, {}, workspace=ws, policy=SAFE, tools_dir=toolbox.tools_dir) == {}
        assert (ws.root / "a").is_symlink()
        with pytest.raises(RunError) as err:
            confine(SAFE, [str(script)], workspace=ws, tools_dir=toolbox.tools_dir, env={})
    assert str(err.value) == (
        f"node 'n': {ws.root / 'a' / 'b'} in the workspace was moved or replaced by a tool; "
        "read-only paths must stay where they were put"
    )


def test_rw_copy_back_does_not_follow_a_planted_link(
    toolbox: ToolBox, warned: Warnings, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    host = tmp_path / "host"
    (host / "out").mkdir(parents=True)
    (host / "out" / "secret.txt").write_text("secret")
    spaces = Workspaces(
        WorkspaceOptions(mounts=(parse_mount(f"{out}:x/out:rw"),)),
        toolbox.tools,
        tools_dir=toolbox.tools_dir,
        warn=warned,
    )
    spaces.check()
    # Inside the sandbox the link leads nowhere; copy-back runs outside it, where it would
    # lead to the host folder and carry its files into the user's mount.
    script = toolbox.tools_dir / "planter"
    script.write_text(f"#!/bin/sh\nmv x moved && ln -s {host} x\necho '{{}}'\n")
    script.chmod(0o755)
    with spaces.open("n") as ws:
        assert call_tool(script, {}, workspace=ws, policy=SAFE, tools_dir=toolbox.tools_dir) == {}
    assert list(out.iterdir()) == []
    assert warned == [
        f"did not copy back mount {out}:x/out:rw: a folder above {ws.root / 'x' / 'out'} "
        "was replaced by a symlink or a file"
    ]
