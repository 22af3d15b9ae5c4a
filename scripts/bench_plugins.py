"""What a middleware plugin costs: one round-trip per tool call, as ratios to the same work
without the plugin, measured in the same run on the same machine. Prints a markdown table.

    python scripts/bench_plugins.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HEDDLE = str(BIN / "heddle")
sys.path.insert(0, str(ROOT))

TOOL_CALLS = 10
NOOP = '''from heddle.plugin import Plugin
plugin = Plugin()

@plugin.before("Watch", "toolCall")
def watch(call):
    return None

plugin.serve()
'''


def median_run(argv: list[str], runs: int, env: dict[str, str]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def write_noop(folder: Path) -> Path:
    import json

    folder.mkdir(parents=True)
    (folder / "plugin.py").write_text(NOOP)
    manifest = {"name": "watch", "version": "1", "command": ["python3", "plugin.py"],
                "components": [{"componentType": "Watch", "kind": "middleware", "seams": ["toolCall.before"]}]}
    (folder / "plugin.json").write_text(json.dumps(manifest))
    return folder / "plugin.json"


def chain(tmp: Path) -> tuple[Path, Path]:
    from tests.support.flows import FlowDoc, server_tool, write_tool

    tools = tmp / "tools"
    write_tool(tools, "step.py", "out = {'n': args.get('n', 0) + 1}")
    f = FlowDoc("steps")
    s = f.start([{"title": "n", "type": "integer", "default": 0}])
    nodes = [f.tool_node(f"step{i}", server_tool("step", [{"title": "n", "type": "integer", "default": 0}]))
             for i in range(TOOL_CALLS)]
    e = f.end(["n"])
    for a, b in zip([s, *nodes], [*nodes, e]):
        f.control(a, b)
    return f.write(tmp / "flow.json"), tools


async def round_trips(manifest: Path, tools: Path, runs: int) -> tuple[float, float]:
    """Median seconds of one `before` round-trip to a live plugin, and of one tool subprocess call."""
    from heddle.plugin_host import load_manifest
    from heddle.plugin_host.launch import plan_launch
    from heddle.plugin_host.process import PluginProcess
    from heddle.tools.process import run_tool_process
    from heddle.workspace.sandbox import SandboxPolicy

    home = Path(tempfile.mkdtemp(prefix="bench-plugin-home-"))
    m = load_manifest(manifest)
    proc = PluginProcess("watch", lambda: plan_launch(m, home=home, policy=SandboxPolicy()), timeout=30,
                         capabilities=frozenset())
    params = {"run": "bench", "component": "Watch", "config": None, "seam": "toolCall",
              "node": {"name": "step0", "id": "step0", "type": "ToolNode"}, "tool": "step",
              "arguments": {"n": 1}, "callId": None}
    await proc.call("before", params)  # started once; only the round-trip is measured
    calls = max(runs * 20, 100)
    middle = []
    for _ in range(calls):
        started = time.perf_counter()
        await proc.call("before", params)
        middle.append(time.perf_counter() - started)
    await proc.close()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    tool = []
    for _ in range(max(runs * 2, 10)):
        started = time.perf_counter()
        await run_tool_process("step", [str(tools / "step.py")], {"n": 1}, env=env)
        tool.append(time.perf_counter() - started)
    return statistics.median(middle), statistics.median(tool)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = ap.parse_args()
    runs = 3 if args.quick else 9
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        flow, tools = chain(tmp_path)
        manifest = write_noop(tmp_path / "watch")
        base = [HEDDLE, "run", str(flow), "--tools-dir", str(tools)]
        bare = median_run(base, runs, env)
        watched = median_run([*base, "--plugin", str(manifest)], runs, env)
        one, tool = asyncio.run(round_trips(manifest, tools, runs))
    rows = [
        ("one middleware round-trip to a running plugin, median", f"{one * 1e6:.0f} µs",
         f"{one / tool:.3f}x one tool call as a subprocess ({tool * 1000:.1f} ms): the cost per tool call"),
        (f"{TOOL_CALLS}-ToolNode `heddle run`, no plugin", f"{bare * 1000:.0f} ms", "baseline for the next row"),
        ("the same with a `toolCall.before` middleware (Python, `heddle.plugin`)", f"{watched * 1000:.0f} ms",
         f"{watched / bare:.2f}x the run without it, starting the plugin process once included"),
    ]
    print("| measure | value | ratio / note |")
    print("|---|---|---|")
    for a, b, c in rows:
        print(f"| {a} | {b} | {c} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
