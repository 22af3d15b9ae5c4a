"""Real plugins for tests: a folder with a plugin.json and a program, written on the fly.

    root = make_plugin(tmp_path / "p", components=[middleware("Gate", "toolCall.before")],
                       code='''
    @plugin.before("Gate", "toolCall")
    def gate(call):
        return reject("no")
    ''')
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

from tests.support.flows import FlowDoc, server_tool, write_tool

SDK_HEADER = "from heddle.plugin import Plugin, fail, modify, proceed, reject, replace, retry\nplugin = Plugin()\n"


def middleware(ctype: str, *seams: str, **extra: Any) -> dict[str, Any]:
    return {"componentType": ctype, "kind": "middleware", "seams": list(seams), **extra}


def node_type(ctype: str, inputs=(), outputs=(), branches=None, **extra: Any) -> dict[str, Any]:
    comp: dict[str, Any] = {"componentType": ctype, "kind": "node",
                            "inputs": [{"title": t, "type": "string"} if isinstance(t, str) else t for t in inputs],
                            "outputs": [{"title": t, "type": "string"} if isinstance(t, str) else t for t in outputs],
                            **extra}
    if branches is not None:
        comp["branches"] = list(branches)
    return comp


def make_plugin(root: Path, *, name: str | None = None, components=(), tools=(), files=(),
                capabilities=("runTool", "callModel", "emitEvent", "log"), code: str = "",
                program: str | None = None, command: list[str] | None = None, **extra: Any) -> Path:
    """Write a plugin folder; `code` is Python after the SDK header (`plugin` exists), or `program`
    is the whole program text. Returns the manifest's path."""
    root.mkdir(parents=True, exist_ok=True)
    manifest = {"name": name or root.name, "version": "1.0.0",
                "command": command or ["python3", "plugin.py"], "capabilities": list(capabilities),
                "components": list(components), "tools": list(tools), "files": list(files), **extra}
    (root / "plugin.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    if command is None or program is not None:
        text = program if program is not None else SDK_HEADER + textwrap.dedent(code) + "\nplugin.serve()\n"
        target = root / ("plugin.py" if command is None else command[-1])
        target.write_text(text, encoding="utf-8")
        target.chmod(0o755)
    return root / "plugin.json"


def tool_chain_flow(tmp_path: Path, tools=("first", "second")) -> tuple[Path, Path]:
    """Start -> one ToolNode per tool -> End; each tool answers {<name>: n + 1} from input n."""
    tools_dir = tmp_path / "tools"
    for name in tools:
        write_tool(tools_dir, f"{name}.py", f"out = {{'{name}': args.get('n', 0) + 1}}")
    f = FlowDoc("chain")
    s = f.start([{"title": "n", "type": "integer", "default": 0}])
    nodes = [f.tool_node(name, server_tool(name, [{"title": "n", "type": "integer", "default": 0}])) for name in tools]
    e = f.end(list(tools))
    for a, b in zip([s, *nodes], [*nodes, e], strict=True):
        f.control(a, b)
    return f.write(tmp_path / "flow.json"), tools_dir


def run_in_process(flow: Path, *, tools_dir: Path | None, plugins: list[Path], inputs: dict[str, Any],
                   config: list[str] = (), timeout: float = 30.0, max_node_attempts: int = 3,
                   protocol: str | None = None, options: Any = None,
                   transport: Any = None, journal: Any = None) -> tuple[Any, list[dict[str, Any]], str]:
    """Run `flow` with the library (real plugin and tool processes), as `heddle run` does.

    `transport` (httpx.ASGITransport of tests.support.inproc.served_model) carries the model calls;
    `journal` (heddle.engine.journal.Journal) makes it a run in a session.
    Returns (final state or the exception raised, every event as a dict, what an encoder wrote)."""
    from heddle.engine import RunOptions
    from heddle.engine.run import prepare_run, run_prepared
    from heddle.engine.seams import Rendering
    from heddle.plugin_host import PluginHost
    from heddle.agentspec import load_flow
    from heddle.tools.registry import discover_tools

    events: list[dict[str, Any]] = []
    written: list[str] = []
    try:
        host = PluginHost.load(plugins, config_specs=config, timeout=timeout, max_node_attempts=max_node_attempts)
        parsed = load_flow(flow, node_types=host.node_types())
        prepared = prepare_run(parsed, tools=discover_tools(tools_dir), tools_dir=tools_dir,
                               options=options or RunOptions(), plugins=host)
        rendering = Rendering(protocol, written.append) if protocol is not None else None
        state: Any = asyncio.run(run_prepared(prepared, inputs, on_event=lambda e: events.append(e.to_dict()),
                                              rendering=rendering, transport=transport,
                                              journal=journal)).state
    except Exception as exc:  # noqa: BLE001 - the test looks at it
        state = exc
    return state, events, "".join(written)


def warnings(events: list[dict[str, Any]]) -> list[str]:
    return [e["message"] for e in events if e["type"] == "warning"]
