"""How the `heddle` command starts: the garbage collector, paused while a command starts, is on again
when its body runs (heddle.cli.resume_collector)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cli import env_with
from tests.support.flows import FlowDoc, server_tool, write_tool

_HEDDLE = """
import atexit, gc, sys
atexit.register(lambda: sys.stderr.write(f"collector: {gc.isenabled()} {gc.get_freeze_count() > 0}\\n"))
sys.argv = ["heddle", *sys.argv[1:]]
from heddle.cli import main
main()
"""


def test_the_collector_is_on_when_a_command_runs(tmp_path: Path) -> None:
    n = [{"title": "n", "type": "integer"}]
    write_tool(tmp_path / "tools", "one.py", "out = {'one': args['n'] + 1}")
    f = FlowDoc("one")
    s, node, e = f.start(n), f.tool_node("one", server_tool("one", n)), f.end(["one"])
    f.control(s, node)
    f.control(node, e)
    flow = f.write(tmp_path / "flow.json")
    for args in (["run", str(flow), "-t", str(tmp_path / "tools"), "--input", '{"n": 1}'],
                 ["validate", str(flow), "-t", str(tmp_path / "tools")]):
        proc = subprocess.run([sys.executable, "-c", _HEDDLE, *args], capture_output=True, text=True, timeout=60,
                              check=False, env=env_with())
        assert proc.returncode == 0, proc.stderr
        assert "collector: True True" in proc.stderr, (args, proc.stderr)
