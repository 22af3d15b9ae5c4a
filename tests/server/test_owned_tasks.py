"""Every task heddle starts has an owner (heddle.blocking.Tasks, or a task group of the block that
awaits it), so that the owner's end cancels and awaits it: read from the source (ast), and shown on a
server in-process whose end (Service.aclose) leaves no task of its own running."""

from __future__ import annotations

import ast
import asyncio
import logging
import signal
from pathlib import Path

import pytest
import uvicorn

from heddle.blocking import Tasks
from heddle.engine.events import ignore
from heddle.server.app import build_app
from heddle.server.config import ServerConfig
from heddle.server.serve import DrainingServer
from heddle.server.service import Service
from tests.server.flows import one_tool_flow, write_tools

HEDDLE = Path(__file__).resolve().parents[2] / "heddle"
# The one place a task is made: the owner itself.
OWNER = HEDDLE / "blocking.py"
GROUPS = ("TaskGroup", "create_task_group")


def _dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ""


def bare_tasks(tree: ast.AST) -> list[int]:
    """The lines that start a task outside an owner: asyncio.create_task/ensure_future, or a loop's
    create_task; a task group's own `create_task`, in the `async with` that awaits it, is owned."""
    groups = {item.optional_vars.id for node in ast.walk(tree) if isinstance(node, ast.AsyncWith)
              for item in node.items if isinstance(item.optional_vars, ast.Name)
              and isinstance(item.context_expr, ast.Call) and _dotted(item.context_expr.func).endswith(GROUPS)}
    return sorted(node.lineno for node in ast.walk(tree)
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("create_task", "ensure_future")
                  and not (isinstance(node.func.value, ast.Name) and node.func.value.id in groups))


def test_no_task_is_started_without_an_owner() -> None:
    texts = {path: path.read_text(encoding="utf-8") for path in sorted(HEDDLE.rglob("*.py")) if path != OWNER}
    found = [f"{path.relative_to(HEDDLE.parent)}:{line}" for path, text in texts.items()
             if "create_task" in text or "ensure_future" in text for line in bare_tasks(ast.parse(text))]
    assert found == [], "start these under a heddle.blocking.Tasks of their owner: " + ", ".join(found)


def test_the_check_sees_each_way_of_starting_a_task() -> None:
    source = ("async def f(loop):\n"
              "    asyncio.create_task(g())\n"
              "    asyncio.ensure_future(g())\n"
              "    asyncio.get_running_loop().create_task(g())\n"
              "    loop.create_task(g())\n"
              "    async with asyncio.TaskGroup() as group:\n"
              "        group.create_task(g())\n")
    assert bare_tasks(ast.parse(source)) == [2, 3, 4, 5]


def test_a_failing_task_of_an_owner_nobody_awaits_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def fails() -> None:
        raise RuntimeError("the registry went away")

    async def main() -> None:
        tasks = Tasks(logging.getLogger("heddle.server"))
        task = tasks.start(fails(), name="heddle-follow")
        await asyncio.wait({task})
        await tasks.aclose()

    with caplog.at_level(logging.ERROR, logger="heddle.server"):
        asyncio.run(main())
    [record] = [r for r in caplog.records if "heddle-follow" in r.getMessage()]
    assert record.exc_info is not None and "the registry went away" in str(record.exc_info[1])


def test_the_servers_end_stops_and_awaits_every_task_it_started(tmp_path: Path) -> None:
    """A run in flight and the drain a signal started (waiting for it): the server's end after a
    second signal cancels and awaits both, and nothing of the server is left running."""
    marker = tmp_path / "started"
    tools = write_tools(tmp_path / "tools", {"slow": f"#!/bin/sh\ntouch {marker}\nexec sleep 60\n"})
    service = Service(ServerConfig(tools_dir=tools))
    flow = one_tool_flow("held", "slow").document()

    async def main() -> None:
        mine = asyncio.current_task()
        submitted = await service.submit({"flow": flow, "inputs": {"x": 1}}, ignore)
        try:
            for _ in range(2000):  # until the tool runs (bounded: the run fails the test if it never does)
                if marker.exists() or submitted.task is None or submitted.task.done():
                    break
                await asyncio.sleep(0.01)
            assert marker.exists()
            server = DrainingServer(uvicorn.Config(build_app(service)), service, on_ready=lambda: None)
            server._signalled(signal.SIGTERM)
            drain = server._drain
            assert drain is not None
            await asyncio.sleep(0)  # the drain is waiting for the run
            assert not drain.done()
            await service.aclose()
            assert submitted.task is not None and submitted.task.cancelled()
            assert drain.done()
            assert {task for task in asyncio.all_tasks() if task is not mine} == set()
        finally:
            await submitted.aclose()

    asyncio.run(main())
