"""Run a flow document in the test's own process, the scripted model served through ASGITransport.

    with served_model([{"content": "hi"}]) as m:
        state = run_doc(flow_path, tools_dir, {"text": "x"}, transport=m.transport)
        assert m.requests()[0]["body"]["stream"] is True

The same steps `heddle run FLOW -t TOOLS --input JSON` takes (load, discover tools, settle
settings, prepare, run), without a process start per run: for engine and agent logic, where
the CLI adds nothing. Tools still run as real subprocesses. Errors surface as the HeddleError
the CLI would print on its `error:` line.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from heddle.engine import events as ev
from heddle.engine.run import RunOutcome
from heddle.model.scripted import ScriptedModel
from heddle.settings import RunSettings

# Any host does: the transport hands every request to the app. The /v1 suffix is kept so that
# recorded paths read as they do against the real server.
URL = "http://scripted.test/v1"


@dataclass
class ServedModel:
    app: ScriptedModel
    url: str = URL

    @property
    def transport(self) -> httpx.AsyncBaseTransport:
        return httpx.ASGITransport(app=self.app)

    def requests(self) -> list[dict[str, Any]]:
        """Every request received so far: {"path", "headers", "body"}, as the real server records them."""
        return list(self.app.requests)


@contextmanager
def served_model(script: list[dict[str, Any]], *, loop: bool = False) -> Iterator[ServedModel]:
    logged: list[str] = []
    yield ServedModel(ScriptedModel(script, loop=loop, log=logged.append))


async def arun_outcome(flow: Path, tools_dir: Path | None = None, inputs: dict[str, Any] | None = None, *,
                       settings: RunSettings | None = None, transport: httpx.AsyncBaseTransport | None = None,
                       events: list[ev.Event] | None = None, message: str | None = None,
                       components: Path | None = None) -> RunOutcome:
    """The final state and the outputs (what `heddle run` and `heddle run --outputs` print)."""
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.agentspec import load_flow
    from heddle.tools.registry import discover_tools

    settings = settings or RunSettings()
    loaded = load_flow(flow, components=components)
    tools = discover_tools(tools_dir)
    prepared = prepare_run(loaded, tools=tools, tools_dir=tools_dir.absolute() if tools_dir is not None else None,
                           options=settings.run_options(), sandbox_flags=settings.sandbox_flags)
    sink = events.append if events is not None else ev.ignore
    return await run_prepared(prepared, dict(inputs or {}), on_event=sink, transport=transport, message=message)


async def arun_doc(flow: Path, tools_dir: Path | None = None, inputs: dict[str, Any] | None = None, *,
                   settings: RunSettings | None = None, transport: httpx.AsyncBaseTransport | None = None,
                   events: list[ev.Event] | None = None, message: str | None = None,
                   components: Path | None = None) -> dict[str, Any]:
    return (await arun_outcome(flow, tools_dir, inputs, settings=settings, transport=transport, events=events,
                               message=message, components=components)).state


def run_doc(flow: Path, tools_dir: Path | None = None, inputs: dict[str, Any] | None = None, *,
            settings: RunSettings | None = None, transport: httpx.AsyncBaseTransport | None = None,
            events: list[ev.Event] | None = None, message: str | None = None,
            components: Path | None = None) -> dict[str, Any]:
    """Run `flow` to its end and return the final state (what `heddle run` prints)."""
    return asyncio.run(arun_doc(flow, tools_dir, inputs, settings=settings, transport=transport, events=events,
                                message=message, components=components))


def run_outcome(flow: Path, tools_dir: Path | None = None, inputs: dict[str, Any] | None = None, *,
                settings: RunSettings | None = None, transport: httpx.AsyncBaseTransport | None = None,
                events: list[ev.Event] | None = None, message: str | None = None,
                components: Path | None = None) -> RunOutcome:
    """`arun_outcome` to the end, for a test without an event loop."""
    return asyncio.run(arun_outcome(flow, tools_dir, inputs, settings=settings, transport=transport, events=events,
                                    message=message, components=components))


def refusal(flow: Path, tools_dir: Path | None = None, inputs: dict[str, Any] | None = None, *,
            settings: RunSettings | None = None,
            transport: httpx.AsyncBaseTransport | None = None) -> tuple[int, str]:
    """The exit code and `error:` line `heddle run` would give for a run that must fail."""
    from heddle.errors import HeddleError

    try:
        state = run_doc(flow, tools_dir, inputs, settings=settings, transport=transport)
    except HeddleError as exc:
        return exc.exit_code, f"error: {exc.message}"
    raise AssertionError(f"the run should have failed, but ended with {state!r}")


def check_doc(flow: Path, tools_dir: Path | None = None) -> tuple[int, str]:
    """What `heddle validate FLOW [-t TOOLS]` decides, in-process: (0, "") or (exit code, the error)."""
    from heddle.engine.options import RunOptions
    from heddle.engine.run import prepare_run
    from heddle.errors import HeddleError
    from heddle.agentspec import load_flow
    from heddle.tools.registry import discover_tools

    try:
        prepare_run(load_flow(flow), tools=discover_tools(tools_dir), tools_dir=tools_dir, options=RunOptions())
    except HeddleError as exc:
        return exc.exit_code, f"error: {exc.message}"
    return 0, ""
