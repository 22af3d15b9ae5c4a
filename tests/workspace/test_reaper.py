"""The reaper server that every tool call on Linux runs under (heddle/tools/reaper.py, started by
heddle/tools/spawner.py): one server per heddle process, a tool started exactly as a shell would
start it, a server that died replaced, and heddle's own death taking its running tools along."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from heddle.errors import ToolError
from heddle.tools import spawner
from heddle.tools.process import run_process

pytestmark = pytest.mark.skipif(not spawner.available(), reason="the reaper server runs on Linux only")

ENV = {"PATH": "/usr/bin:/bin"}


def run(argv: list[str], **kwargs: object) -> tuple[int, str]:
    done = asyncio.run(run_process("probe", argv, b"", env=kwargs.pop("env", ENV), **kwargs))  # type: ignore[arg-type]
    return done.returncode, done.stdout.decode()


def server_pid() -> int:
    proc = spawner.SPAWNER._proc
    assert proc is not None
    return proc.pid


def test_a_tool_gets_exactly_its_environment_and_default_signals() -> None:
    code, out = run(["env"], env={"PATH": "/usr/bin:/bin", "ONLY": "this"})
    assert code == 0 and sorted(out.splitlines()) == ["ONLY=this", "PATH=/usr/bin:/bin"]
    # Nothing ignored or blocked: a tool's pipelines get SIGPIPE as from any shell.
    code, out = run(["grep", "-E", "^Sig(Ign|Blk):", "/proc/self/status"])
    assert code == 0 and out.split() == ["SigBlk:", "0" * 16, "SigIgn:", "0" * 16]


def test_one_server_serves_every_call_and_a_dead_one_is_replaced() -> None:
    assert run(["true"]) == (0, "")
    first = server_pid()
    assert run(["sh", "-c", "exit 3"]) == (3, "")
    assert server_pid() == first
    os.kill(first, signal.SIGKILL)
    os.waitpid(first, 0)
    assert run(["sh", "-c", "kill -TERM $$"]) == (-signal.SIGTERM, "")
    assert server_pid() != first


def test_a_folder_that_cannot_be_entered_is_named(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match=r"^tool 'probe': its working folder .*/gone could not be entered: "
                                        r"No such file or directory$"):
        run(["true"], cwd=tmp_path / "gone")


def test_heddle_killed_takes_its_running_tools_along(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    script = ("import asyncio, sys\nfrom heddle.tools.process import run_process\n"
              "asyncio.run(run_process('t', ['sh', '-c', sys.argv[1]], b'', env={'PATH': '/usr/bin:/bin'}))\n")
    # The tool's child leaves its session, which no process group kill reaches.
    tool = f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 60' & wait"
    holder = subprocess.Popen([sys.executable, "-c", script, tool])
    try:
        deadline = time.monotonic() + 20
        while not (pidfile.exists() and pidfile.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.02)
        escaped = int(pidfile.read_text())
        holder.kill()
        holder.wait()
        while _alive(escaped) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not _alive(escaped)
    finally:
        holder.kill()
        holder.wait()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


FORKED = """
import asyncio, os, sys
from heddle.tools import spawner
from heddle.tools.process import run_process

def call():
    return asyncio.run(run_process("t", ["sh", "-c", "echo ok"], b"", env={"PATH": "/usr/bin:/bin"})).stdout
assert call() == b"ok\\n"
parent = spawner.SPAWNER._proc.pid
pid = os.fork()
if pid == 0:
    os._exit(0 if call() == b"ok\\n" and spawner.SPAWNER._proc.pid != parent else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0 and call() == b"ok\\n" and spawner.SPAWNER._proc.pid == parent
"""


def test_a_forked_child_starts_a_server_of_its_own() -> None:
    done = subprocess.run([sys.executable, "-c", FORKED], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
