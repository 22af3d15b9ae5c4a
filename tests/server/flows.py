"""The small flows and tools the server tests run. Tools are sh scripts: they start in a
millisecond, which keeps the suite fast."""

from __future__ import annotations

from pathlib import Path

from tests.support.flows import FlowDoc, llm_config, server_tool, write_script

ECHO = "#!/bin/sh\ncat\n"
FAIL = "#!/bin/sh\ncat >/dev/null\necho 'disk on fire' >&2\nexit 3\n"


def sleeper(pidfile: Path, seconds: int = 60) -> str:
    """A tool that records its PID, then sleeps (as that same process)."""
    return f"#!/bin/sh\necho $$ > {pidfile}.tmp && mv {pidfile}.tmp {pidfile}\nexec sleep {seconds}\n"


def napper(marker: Path, seconds: float) -> str:
    """A tool that marks that it started, sleeps a little, and answers."""
    return f"#!/bin/sh\ncat >/dev/null\necho started > {marker}\nsleep {seconds}\necho '{{\"slept\": true}}'\n"


def untyped(titles) -> list[dict]:
    """Inputs that take any JSON value (the server checks given values against declared types)."""
    return [{"title": t} for t in titles]


def one_tool_flow(name: str, tool: str, inputs=("x",), outputs=("x",)) -> FlowDoc:
    f = FlowDoc(name)
    s = f.start(untyped(inputs))
    t = f.tool_node(tool, server_tool(tool))
    e = f.end(list(outputs))
    f.control(s, t)
    f.control(t, e)
    return f


def tool_chain(name: str, tools: list[str]) -> FlowDoc:
    """StartNode(x) -> one ToolNode per tool, in order -> EndNode(x)."""
    f = FlowDoc(name)
    previous = f.start(untyped(["x"]))
    for i, tool in enumerate(tools):
        node = f.tool_node(f"step{i}-{tool}", server_tool(tool))
        f.control(previous, node)
        previous = node
    e = f.end(["x"])
    f.control(previous, e)
    return f


def agent_flow(name: str, url: str, tools=(), **config) -> FlowDoc:
    f = FlowDoc(name)
    s = f.start(["query"])
    a = f.agent("agent", llm_config(url, **config), tools=list(tools))
    e = f.end(["result"])
    f.control(s, a)
    f.control(a, e)
    f.data(s, "query", a, "query")
    f.data(a, "result", e, "result")
    return f


def write_tools(folder: Path, scripts: dict[str, str]) -> Path:
    for name, text in scripts.items():
        write_script(folder, name, text)
    return folder
