"""The tasks a run and its plugins start are owned: a cancelled run leaves none behind."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.plugins.support import make_plugin, node_type
from tests.support.flows import FlowDoc, write_tool

WORK = '''
@plugin.node("Work")
def work(call):
    call.run_tool("nap", {})
    return {}
'''


def test_a_cancelled_run_leaves_no_task_behind(tmp_path: Path) -> None:
    from heddle.agentspec import load_flow
    from heddle.engine import RunOptions
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.plugin_host import PluginHost
    from heddle.tools.registry import discover_tools

    started = tmp_path / "started"
    tools = tmp_path / "tools"
    write_tool(tools, "nap.py", f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(60)")
    plugin = make_plugin(tmp_path / "p", components=[node_type("Work")], code=WORK)
    f = FlowDoc("work")
    s, w, e = f.start([]), f._node("Work", "work", [], []), f.end([])
    f.control(s, w)
    f.control(w, e)
    host = PluginHost.load([plugin])
    prepared = prepare_run(load_flow(f.write(tmp_path / "flow.json"), node_types=host.node_types()),
                           tools=discover_tools(tools), tools_dir=tools, options=RunOptions(), plugins=host)

    async def main() -> list[asyncio.Task[object]]:
        # The plugin's process is reading, and heddle is running a tool for its call (a task
        # answering the plugin's request) when the run is cancelled.
        run = asyncio.create_task(run_prepared(prepared, {}))
        while not started.exists():
            assert not run.done(), run.result()
            await asyncio.sleep(0.02)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        return [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]

    assert asyncio.run(main()) == []
