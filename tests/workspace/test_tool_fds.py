"""A tool gets its own stdin, stdout and stderr and nothing else of heddle's: no process between
heddle and the tool (its reaper, the reaper server) holds heddle's stdout or stderr, and
`heddle run | cat` ends when heddle does, whatever the tool left behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

from tests.support.cli import BIN, env_with
from tests.support.flows import FlowDoc, server_tool
from tests.workspace.tooling import write_tool

# Reports the descriptors of itself and of each process above it, up to heddle's parent; then
# leaves a child behind in a session of its own, holding whatever the tool held.
FDS = r'''
import json, os, sys, time
args = json.load(sys.stdin)

def parent(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return int(stat[stat.rfind(b")") + 2:].split()[1])

def fds(pid):
    found = {}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            found[fd] = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed since
            pass
    return found

chain, pid = [], os.getpid()
while pid > 1 and len(chain) < 6:
    chain.append([pid, fds(pid)])
    pid = parent(pid)
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    os.setsid()
    with open(args["pidfile"], "w") as f:
        f.write(str(os.getpid()))
    os.write(ready_w, b"x")
    time.sleep(300)
    os._exit(0)
os.read(ready_r, 1)
json.dump({"chain": json.dumps(chain)}, sys.stdout)
'''


def _flow(tmp_path: Path) -> tuple[Path, Path]:
    write_tool(tmp_path / "tools", "fds", FDS)
    f = FlowDoc("fds")
    start = f.start(["pidfile"])
    node = f.tool_node("fds", server_tool("fds", ["pidfile"], ["chain"]))
    end = f.end(["chain"])
    f.control(start, node)
    f.control(node, end)
    f.data(start, "pidfile", node, "pidfile")
    return f.write(tmp_path / "flow.json"), tmp_path / "tools"


def _gone(pidfile: Path) -> bool:
    """Whether the child the tool left is dead (killed by its reaper); killed here if not."""
    pid = int(pidfile.read_text())
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except FileNotFoundError:
        return True
    if stat[stat.rfind(b")") + 2:][:1] == b"Z":
        return True
    os.kill(pid, signal.SIGKILL)
    return False


def test_a_tool_and_its_reapers_hold_nothing_of_heddles_output(tmp_path: Path) -> None:
    flow, tools = _flow(tmp_path)
    pidfile = tmp_path / "left.pid"
    argv = [str(BIN / "heddle"), "run", flow, "-t", tools, "--input", json.dumps({"pidfile": str(pidfile)})]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env_with())
    assert proc.stdout is not None and proc.stderr is not None
    heddles = {f"pipe:[{os.fstat(stream.fileno()).st_ino}]" for stream in (proc.stdout, proc.stderr)}
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    chain = json.loads(json.loads(out)["chain"])
    pids = [pid for pid, _ in chain]
    assert proc.pid in pids, chain  # the walk reached heddle: every process between was seen
    tool_fds = chain[0][1]
    assert sorted(tool_fds, key=int) == ["0", "1", "2"], tool_fds
    between = chain[:pids.index(proc.pid)]
    assert len(between) >= 2, chain  # the tool and at least its reaper
    for pid, held in between:
        assert not heddles & set(held.values()), (pid, held, heddles)
    assert _gone(pidfile)


def test_heddle_run_piped_to_cat_ends_when_heddle_does(tmp_path: Path) -> None:
    flow, tools = _flow(tmp_path)
    pidfile = tmp_path / "left.pid"
    command = (f"'{BIN / 'heddle'}' run '{flow}' -t '{tools}' --input '{json.dumps({'pidfile': str(pidfile)})}' "
               "2>&1 | cat")
    # The child the tool leaves sleeps far longer than this wait.
    done = subprocess.run(["sh", "-c", command], check=False, stdin=subprocess.DEVNULL, capture_output=True,
                          env=env_with(), timeout=60)
    assert done.returncode == 0, done.stdout
    assert b'"chain"' in done.stdout
    assert _gone(pidfile)
