"""A tool call ends when the tool exits, and takes along everything the tool started, even
children in sessions of their own. Through the real `heddle run`, with `--safe` and with a
timeout; without either, through the same entry function in-process (the tool still runs under
its own reaper process, as it does under the command)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.cli import env_with, error_line, heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.flows import FlowDoc, server_tool
from tests.workspace.tooling import PYTHON_READ, write_tool

ALLOW_PYTHON = [arg for path in PYTHON_READ for arg in ("--allow-read", str(path))]

# Children in sessions of their own, which `killpg` never reaches: a "hold" child keeps the
# tool's stdout and stderr open, a "detach" daemon forks once more and lets go of them. Each
# writes its pid to PIDFILE.KIND, then sleeps far longer than the call. HANG makes the tool
# itself never finish.
SETSID_CHILDREN = r'''
import json, os, sys, time
args = json.load(sys.stdin)
for kind in CHILDREN:
    ready_r, ready_w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if kind == "detach":
            if os.fork() != 0:
                os._exit(0)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
        with open(f"{args['pidfile']}.{kind}", "w") as f:
            f.write(str(os.getpid()))
        os.write(ready_w, b"x")
        time.sleep(60 if kind == "detach" else 30)
        os._exit(0)
    os.read(ready_r, 1)
json.dump({"status": "started"}, sys.stdout)
sys.stdout.flush()
if HANG:
    time.sleep(30)
'''


def tool(tools: Path, name: str, *children: str, hang: bool = False) -> None:
    write_tool(tools, name, f"CHILDREN = {list(children)!r}\nHANG = {hang}\n{SETSID_CHILDREN}")


def flow(tmp_path: Path, *names: str) -> Path:
    """Start -> one ToolNode per name (each given its own pid file) -> End with each status."""
    f = FlowDoc("lifetime")
    start = f.start([f"pid_{n}" for n in names])
    end = f.end(list(names))
    previous = start
    for name in names:
        node = f.tool_node(name, server_tool(name, ["pidfile"], ["status"]))
        f.data(start, f"pid_{name}", node, "pidfile")
        f.data(node, "status", end, name)
        f.control(previous, node)
        previous = node
    f.control(previous, end)
    return f.write(tmp_path / "flow.json")


def survivors(marker: Path) -> list[str]:
    """Live processes whose command line names `marker` (the test's own folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        state = stat[stat.rfind(b")") + 2:][:1]
        if str(marker).encode() in cmdline and state != b"Z":
            words = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {words}")
    return found


def pid_is_dead(pidfile: Path) -> bool:
    try:
        stat = Path(f"/proc/{int(pidfile.read_text())}/stat").read_bytes()
    except FileNotFoundError:
        return True
    return stat[stat.rfind(b")") + 2:][:1] == b"Z"


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr and "Event loop is closed" not in stderr, stderr


@pytest.mark.parametrize("safe", [False, True], ids=["plain", "safe"])
def test_setsid_children_die_with_the_call(tmp_path: Path, safe: bool, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    tools = tmp_path / "tools"
    tool(tools, "holder", "hold")
    tool(tools, "daemon", "detach")
    pids = tmp_path / "pids"
    pids.mkdir()
    inputs = {"pid_holder": str(pids / "holder"), "pid_daemon": str(pids / "daemon")}
    flags = ["--safe", "--allow-write", str(pids), *ALLOW_PYTHON] if safe else []
    try:
        # A generous --tool-timeout: a call that waited for the holder's pipes would end only by it.
        args = ["run", flow(tmp_path, "holder", "daemon"), "-t", tools, "--input", json.dumps(inputs),
                "--tool-timeout", "20", *flags]
        if safe:
            proc = heddle(*args)
            state, stderr = state_of(proc), proc.stderr
        else:
            monkeypatch.setenv("PATH", env_with()["PATH"])  # the interpreter tools find, as the command's
            rc, out, stderr = heddle_inproc(capsys, *args)
            assert rc == 0, stderr
            state = json.loads(out)
        assert (state["holder"], state["daemon"]) == ("started", "started")
        no_traceback(stderr)
        assert survivors(tmp_path) == []
        if not safe:  # under --safe the files hold pids of the sandbox's own pid namespace
            assert pid_is_dead(pids / "holder.hold") and pid_is_dead(pids / "daemon.detach")
    finally:
        for line in survivors(tmp_path):
            os.kill(int(line.split(":")[0]), 9)


def test_a_timed_out_tool_takes_its_setsid_children_along(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tool(tools, "holder", "hold", "detach", hang=True)
    pidfile = tmp_path / "holder"
    try:
        proc = heddle("run", flow(tmp_path, "holder"), "-t", tools, "--input",
                      json.dumps({"pid_holder": str(pidfile)}), "--tool-timeout", "0.5")
        assert proc.returncode == 1, proc.stderr
        assert error_line(proc) == ("error: tool 'holder': timed out after 0.5 s and was killed "
                                    "(raise --tool-timeout if it needs longer)")
        no_traceback(proc.stderr)
        assert pid_is_dead(tmp_path / "holder.hold") and pid_is_dead(tmp_path / "holder.detach")
        assert survivors(tmp_path) == []
    finally:
        for line in survivors(tmp_path):
            os.kill(int(line.split(":")[0]), 9)
