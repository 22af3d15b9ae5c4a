"""Tool output that fits the model (--tool-output-limit, a tool's metadata.truncate): one real run
of `heddle run` under the sandbox against the scripted model, a command's long output, and the rules
in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from heddle.engine.tool_output import MARKER, cut, file_stem, lines_cut, truncate_of
from heddle.graph import check_flow
from heddle.agentspec import load_flow
from heddle.agentspec.components import ServerTool
from tests.support.cli import state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_script
from tests.support.threaded_model import threaded_model

# 1000 lines of 100 characters (the newline included): a 100,000-character text, made by awk so that
# it also runs inside the sandbox without an interpreter.
PRODUCE = r"""#!/bin/sh
cat >/dev/null
awk 'BEGIN { printf "{\"text\":\""; for (i = 0; i < 1000; i++) { printf "line %04d ", i;
  for (j = 0; j < 89; j++) printf "x"; printf "\\n" } printf "\"}" }'
"""
TEXT = "".join(f"line {i:04d} " + "x" * 89 + "\n" for i in range(1000))
# Reads back, from inside the sandbox, the file the first cut result was written to.
READ_BACK = """#!/bin/sh
cat >/dev/null
printf '{"bytes": %s}' "$(wc -c < .heddle/tool-output/call_0_0.txt)"
"""


def _serialized(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _tool_message(requests: list[dict[str, Any]], call_id: str) -> str:
    for request in requests:
        for message in request["body"]["messages"]:
            if message.get("role") == "tool" and message.get("tool_call_id") == call_id:
                content: str = message["content"]
                return content
    raise AssertionError(f"no tool message for {call_id}")


def test_a_long_result_reaches_the_model_cut_and_the_workspace_whole(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert len(TEXT) == 100_000
    tools = tmp_path / "tools"
    write_script(tools, "produce.sh", PRODUCE)
    write_script(tools, "read_back.sh", READ_BACK)
    produce = server_tool("produce", outputs=["text"])
    tight = {**server_tool("produce", outputs=["text"]), "metadata": {"truncate": 100}}
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "produce", "arguments": {}}]},  # call_0_0, cut to the run's limit
        {"tool_calls": [{"name": "read_back", "arguments": {}}]},  # the file is there while the agent runs
        {"content": "first done"},
        {"tool_calls": [{"name": "produce", "arguments": {}}]},  # call_3_0, cut to the tool's own 100
        {"content": "second done"},
    ]
    with threaded_model(script) as model:
        f = FlowDoc("cutting")
        start = f.start(["query"])
        whole = f.tool_node("whole", produce)
        first = f.agent("first", model.url, tools=[produce, server_tool("read_back", outputs=["bytes"])])
        second = f.agent("second", model.url, tools=[tight])
        end = f.end(["text", "result"])
        for a, b in ((start, whole), (whole, first), (first, second), (second, end)):
            f.control(a, b)
        flow = f.write(tmp_path / "flow.json")
        keep = tmp_path / "kept"
        # The command in this process, its tools under the sandbox as ever (`--tool-output-limit`
        # from a process: the docs/tools.md blocks).
        proc = heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"query": "go"}', "--safe", "--workspace",
                           keep)
        state = state_of(proc)
        requests = model.requests()
    # A ToolNode's output reaches the state whole.
    assert state["text"] == TEXT and state["result"] == "second done"
    full = _serialized({"text": TEXT})
    assert len(full) == 101_011  # {"text":" + 1000 lines of 99 characters and the two of "\n" + "}
    # The default limit, 30000: its first 15000 characters, the marker, its last 15000. The cut runs from
    # line 148 (its 44th character; lines count from 0, each 101 characters after the 9 of {"text":")
    # to line 851 (its 51st): 704 lines.
    path = ".heddle/tool-output/call_0_0.txt"
    marker = f"[... 704 lines cut; full output in {path}]"
    assert _tool_message(requests, "call_0_0") == full[:15000] + marker + full[-15000:]
    assert json.loads(_tool_message(requests, "call_1_0")) == {"bytes": len(full)}
    assert (keep / "first" / path).read_text(encoding="utf-8") == full
    # The tool's own metadata.truncate, tighter: 50 characters, the marker, 50; every line is cut into.
    tight_path = ".heddle/tool-output/call_3_0.txt"
    assert _tool_message(requests, "call_3_0") == \
        full[:50] + f"[... 1000 lines cut; full output in {tight_path}]" + full[-50:]
    assert (keep / "second" / tight_path).read_text(encoding="utf-8") == full


def test_what_fits_is_untouched_and_the_marker_counts_the_lines_cut() -> None:
    assert cut("short", 5, "p") == "short"
    text = _serialized({"text": "ab\ncd\nef\ngh"})  # {"text":"ab\ncd\nef\ngh"}, 25 characters
    # The cut t":"ab\ncd\nef\ touches three lines: JSON's \n escape is a line break of the value.
    assert cut(text, 10, "p") == '{"tex' + MARKER.format(lines=3, path="p") + 'ngh"}'
    assert lines_cut("a\nb\nc\n", 2, 4) == 1  # "b\n": one line, its break included
    assert lines_cut("a\nb\nc\n", 1, 4) == 2
    assert cut("x" * 11, 10, "p") == "xxxxx" + MARKER.format(lines=1, path="p") + "xxxxx"


def test_a_call_id_names_its_file_only_when_it_is_a_plain_name() -> None:
    assert file_stem("call_1_0") == "call_1_0"
    for unsafe in ("../escape", ".hidden", "a/b", "", None, "x" * 200):
        stem = file_stem(unsafe)
        assert stem.startswith("call-") and len(stem) == 21 and "/" not in stem


def _tool(metadata: dict[str, Any] | None) -> ServerTool:
    return ServerTool(name="t", metadata=metadata)


def test_truncate_is_read_exactly() -> None:
    assert truncate_of(_tool(None)) is None and truncate_of(_tool({"other": 1})) is None
    assert truncate_of(_tool({"truncate": 2000})) == 2000
    for bad in (0, -5, True, "2000", 20.5, None):
        with pytest.raises(ValueError, match=r"metadata\.truncate .* is not a positive whole number"):
            truncate_of(_tool({"truncate": bad}))


def test_a_bad_truncate_is_refused_at_validation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools"
    write_script(tools, "produce.sh", PRODUCE)
    f = FlowDoc("bad")
    start = f.start(["query"])
    agent = f.agent("helper", "http://127.0.0.1:9/v1",
                    tools=[{**server_tool("produce", outputs=["text"]), "metadata": {"truncate": "lots"}}])
    end = f.end(["result"])
    f.control(start, agent)
    f.control(agent, end)
    flow = f.write(tmp_path / "flow.json")
    problems = check_flow(load_flow(flow), tools={"produce": tools / "produce.sh"}, tools_dir=tools)
    assert len(problems) == 1 and problems[0].startswith("$.nodes[1].agent.tools[0]: ServerTool 'produce' "
                                                         "metadata.truncate 'lots' is not a positive whole number")
    rc, out, _ = heddle_inproc(capsys, "validate", flow, "-t", tools)
    assert rc == 2 and problems[0] in out


COUNT = """commands:
  - name: count
    description: Count from 1 to n
    input_schema: {type: object, properties: {n: {type: integer}}, required: [n]}
    executable: seq
    version_probe: ["1"]
    expected_version: "1"
    argv: ["{n}"]
    timeout_seconds: 5
    working_directory: workspace
    adapter_version: "1"
    output: text
"""


def test_a_commands_long_output_is_cut_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "commands.yaml").write_text(COUNT, encoding="utf-8")
    script: list[dict[str, Any]] = [{"tool_calls": [{"name": "count", "arguments": {"n": 3000}}]},
                                    {"content": "counted"}]
    with threaded_model(script) as model:
        f = FlowDoc("counting")
        start = f.start(["query"])
        agent = f.agent("counter", model.url, tools=[server_tool("count", [{"title": "n", "type": "integer"}])])
        end = f.end(["result"])
        f.control(start, agent)
        f.control(agent, end)
        flow = f.write(tmp_path / "flow.json")
        keep = tmp_path / "kept"
        # The command runs as a real process; heddle itself in this one (the cut is the same code path).
        rc, _, err = heddle_inproc(capsys, "run", flow, "--commands", tmp_path / "commands.yaml", "--input",
                                     '{"query": "go"}', "--workspace", keep, "--tool-output-limit", "1000")
        assert rc == 0, err
        sent = _tool_message(model.requests(), "call_0_0")
    whole = (keep / "counter" / ".heddle" / "tool-output" / "call_0_0.txt").read_text(encoding="utf-8")
    assert json.loads(whole)["stdout"] == "".join(f"{i}\n" for i in range(1, 3001))
    assert sent.startswith(whole[:500]) and sent.endswith(whole[-500:]) and len(sent) < 1100
    assert " lines cut; full output in .heddle/tool-output/call_0_0.txt]" in sent
