"""Workspaces, mounts and --safe through the real `heddle run` on small flows (and an agent's
shared workspace through the engine in-process, its tools still in the sandbox)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from heddle.settings import RunSettings
from tests.support.cli import BIN, error_line, heddle, state_of
from tests.support.cli_inproc import heddle_inproc
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool
from tests.support.inproc import run_doc, served_model
from tests.workspace.tooling import PROBE, PYTHON_READ, write_tool

PROBE_TOOL = server_tool("probe", ["ops"], ["report"])
ALLOW_PYTHON = [arg for path in PYTHON_READ for arg in ("--allow-read", str(path))]


def tool_flow(tmp_path: Path, *names: str) -> Path:
    """Start -> one ToolNode per name (each running `probe` on its own ops) -> End."""
    f = FlowDoc("workspaces")
    start = f.start([f"ops_{n}" for n in names])
    end = f.end([f"report_{n}" for n in names])
    previous = start
    for name in names:
        node = f.tool_node(name, PROBE_TOOL)
        f.control(previous, node)
        f.data(start, f"ops_{name}", node, "ops")
        f.data(node, "report", end, f"report_{name}")
        previous = node
    f.control(previous, end)
    return f.write(tmp_path / "flow.json")


def run_ops(
    tmp_path: Path,
    ops: dict[str, list[dict[str, Any]]],
    *flags: Any,
    env: dict[str, str] | None = None,
    capsys: pytest.CaptureFixture[str] | None = None,
) -> tuple[dict[str, list[dict[str, Any]]], str]:
    """Each node's report and the run's stderr, from a real `heddle run` (with `capsys`, from the
    command's entry function in this process; `env` is then not taken)."""
    flow = tool_flow(tmp_path, *ops)
    tools = tmp_path / "tools"
    if not (tools / "probe.py").exists():
        write_tool(tools, "probe.py", PROBE)
    inputs = {f"ops_{name}": json.dumps(node_ops) for name, node_ops in ops.items()}
    args = ("run", flow, "-t", tools, "--input", json.dumps(inputs), *flags)
    if capsys is None:
        proc = heddle(*args, env=env)
    else:
        assert env is None
        proc = heddle_here(capsys, *args)
    state = state_of(proc)
    return {name: json.loads(state[f"report_{name}"]) for name in ops}, proc.stderr


def test_safe_run_confines_the_tool(tmp_path: Path, tcp_server: int, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    marker = Path.home() / f".heddle-cli-marker-{uuid.uuid4().hex}"
    marker.write_text("private")
    data = tmp_path / "data"
    data.mkdir()
    (data / "in.txt").write_text("input")
    escape = f"/tmp/heddle-escape-{uuid.uuid4().hex}"
    connect = {"op": "connect", "arg": ["127.0.0.1", tcp_server]}
    ops = [
        {"op": "read", "arg": str(marker)},
        {"op": "write", "arg": str(tmp_path / "tools" / "planted")},
        {"op": "write", "arg": escape},
        {"op": "write", "arg": "data/in.txt", "data": "tampered"},
        {"op": "read", "arg": "data/in.txt"},
        {"op": "env", "arg": "HEDDLE_CLI_SECRET"},
        {"op": "env", "arg": "HEDDLE_CLI_ALLOWED"},
        connect,
    ]
    env = {"HEDDLE_CLI_SECRET": "leaked", "HEDDLE_CLI_ALLOWED": "arrived"}
    try:
        reports, _ = run_ops(
            tmp_path,
            {"tool": ops},
            "--mount", data, "--safe", "--deny-net", "--allow-env", "HEDDLE_CLI_ALLOWED",
            *ALLOW_PYTHON,
            env={**env, "SECRET_TOKEN": "leaked"},
        )
    finally:
        marker.unlink()
    home, tools, tmp, ro_write, ro_read, unlisted, allowed, denied = reports["tool"]
    assert home["ok"] is False and "FileNotFoundError" in home["error"]
    assert tools["ok"] is False and "Read-only file system" in tools["error"]
    assert tmp == {"ok": True} and not os.path.exists(escape)
    assert ro_write["ok"] is False and "Read-only file system" in ro_write["error"]
    assert ro_read == {"ok": True, "value": "input"}
    assert unlisted == {"ok": False, "value": None}
    assert allowed == {"ok": True, "value": "arrived"}
    assert denied["ok"] is False and "ConnectionRefusedError" in denied["error"]
    assert not (tmp_path / "tools" / "planted").exists()
    assert (data / "in.txt").read_text() == "input"

    # Any name not on the sandbox's short list needs --allow-env: the same command in this
    # process (the tool still in bwrap), the variable set in the environment it inherits.
    monkeypatch.setenv("SECRET_TOKEN", "leaked")
    flow = tool_flow(tmp_path, "tool")
    ops_in = {"ops_tool": json.dumps([{"op": "env", "arg": "SECRET_TOKEN"}, connect])}
    rc, out, err = heddle_inproc(capsys, "run", flow, "-t", tmp_path / "tools", "--input", json.dumps(ops_in),
                                 "--safe", *ALLOW_PYTHON)
    assert rc == 0, err
    assert json.loads(json.loads(out)["report_tool"]) == [{"ok": False, "value": None}, {"ok": True, "value": "pong"}]


def test_rw_mounts_and_kept_workspaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The command in this process: a real `heddle run` with mounts is test_safe_run_confines_the_tool's.
    out = tmp_path / "out"
    out.mkdir()
    for name in ("a", "b", "c"):
        (out / f"{name}.txt").write_text(name)
    keep = tmp_path / "runs"
    reports, stderr = run_ops(
        tmp_path,
        {
            "first": [
                {"op": "write", "arg": "own.txt", "data": "first's scratch"},
                {"op": "write", "arg": "out/a.txt", "data": "edited"},
                {"op": "write", "arg": "out/new.txt", "data": "created"},
                {"op": "delete", "arg": "out/b.txt"},
                {"op": "write", "arg": "out/c.txt", "data": "the run's"},
                # The user's copy changes while the node runs.
                {"op": "write", "arg": str(out / "c.txt"), "data": "the user's"},
            ],
            "second": [
                {"op": "read", "arg": "own.txt"},
                {"op": "read", "arg": "out/new.txt"},
                {"op": "listdir", "arg": "out"},
            ],
        },
        "--mount", f"{out}:out:rw", "--workspace", keep,
        capsys=capsys,
    )
    assert all(r["ok"] for r in reports["first"]), reports["first"]
    own, new, listing = reports["second"]
    assert own["ok"] is False and "FileNotFoundError" in own["error"]
    assert new == {"ok": True, "value": "created"}
    # The first node deleted b.txt; the second still sees it, because the user's copy kept it.
    assert listing == {"ok": True, "value": ["a.txt", "b.txt", "c.txt", "new.txt"]}
    assert {p.name: p.read_text() for p in out.iterdir()} == {
        "a.txt": "edited",
        "b.txt": "b",
        "c.txt": "the run's",
        "new.txt": "created",
    }
    assert (
        f"warning: {out / 'c.txt'} changed outside the run while node 'first' was running; "
        "kept the run's version"
    ) in stderr.splitlines()
    assert sorted(p.name for p in keep.iterdir()) == ["first", "second"]
    assert (keep / "first" / "own.txt").read_text() == "first's scratch"
    assert (keep / "first" / ".heddle" / "bin" / "probe").is_file()
    assert (keep / "second" / "out" / "new.txt").read_text() == "created"


def test_agent_tool_calls_share_one_workspace(tmp_path: Path) -> None:
    write_tool(tmp_path / "tools", "probe.py", PROBE)
    write = [{"op": "write", "arg": "handoff.txt", "data": "from the first call"}]
    read = [{"op": "read", "arg": "handoff.txt"}, {"op": "env", "arg": "HEDDLE_WORKSPACE"}]
    script = [
        {"tool_calls": [{"name": "probe", "arguments": {"ops": json.dumps(write)}}]},
        {"tool_calls": [{"name": "probe", "arguments": {"ops": json.dumps(read)}}]},
        {"content": "done"},
    ]
    # The engine's logic: in-process (the model over ASGITransport); the tools still run in bwrap.
    with served_model(script) as model:
        f = FlowDoc("agent")
        start = f.start(["query"])
        agent = f.agent("helper", model.url, tools=[PROBE_TOOL])
        end = f.end(["result"])
        f.control(start, agent)
        f.control(agent, end)
        f.data(start, "query", agent, "query")
        f.data(agent, "result", end, "result")
        flow = f.write(tmp_path / "flow.json")
        safe = RunSettings(safe=True, allow_read=tuple(PYTHON_READ))
        state = run_doc(flow, tmp_path / "tools", {"query": "go"}, settings=safe, transport=model.transport)
        assert state["result"] == "done"
        last = model.requests()[-1]["body"]["messages"][-1]
    assert last["role"] == "tool"
    handoff, workspace = json.loads(json.loads(last["content"])["report"])
    assert handoff == {"ok": True, "value": "from the first call"}
    # The workspace is gone once the agent's node ended.
    assert not os.path.exists(workspace["value"])


def refused(tmp_path: Path, *flags: Any, env: dict[str, str] | None = None) -> str:
    flow = tool_flow(tmp_path, "tool")
    write_tool(tmp_path / "tools", "probe.py", PROBE)
    proc = heddle(
        "run", flow, "-t", tmp_path / "tools", "--input", json.dumps({"ops_tool": "[]"}), *flags,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    return error_line(proc)


def refused_inproc(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: Any) -> str:
    """`refused`, the command run by the CLI's entry function in this process."""
    flow = tool_flow(tmp_path, "tool")
    write_tool(tmp_path / "tools", "probe.py", PROBE)
    rc, out, err = heddle_inproc(capsys, "run", flow, "-t", tmp_path / "tools", "--input",
                                 json.dumps({"ops_tool": "[]"}), *flags)
    assert rc == 2, err
    assert out == ""
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert lines, f"no error line on stderr: {err!r}"
    return lines[-1]


def test_safe_only_flags_without_safe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # In this process (a refusal from a process: test_bad_mounts_refused_before_anything_is_written).
    assert refused_inproc(tmp_path, capsys, "--deny-net", "--allow-env", "X", "--sandbox", "auto") == (
        "error: --sandbox, --allow-env, --deny-net only work with --safe and would be ignored; "
        "add --safe or drop them"
    )


def test_missing_bwrap(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(BIN))
    assert refused_inproc(tmp_path, capsys, "--safe") == (
        "error: --safe needs bubblewrap and 'bwrap' is not on PATH; install bubblewrap "
        "(Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap)"
    )


def test_bad_mounts_refused_before_anything_is_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "link").symlink_to(tmp_path)
    keep = tmp_path / "runs"
    assert refused(tmp_path, "--mount", f"{out}:out:rw", "--workspace", keep) == (
        f"error: mount {out}:out:rw: {out / 'link'} is a symlink; mounts carry only regular "
        "files and folders, remove it or mount a folder without it"
    )
    assert not keep.exists()
    assert [p.name for p in out.iterdir()] == ["link"]
    (out / "link").unlink()
    # The other refusals of --mount: the same command in this process.
    assert refused_inproc(tmp_path, capsys, "--mount", f"{out}:.heddle/out") == (
        f"error: mount {out}:.heddle/out:ro: DEST '.heddle/out' is inside .heddle, which heddle "
        "reserves; choose another DEST"
    )
    assert refused_inproc(tmp_path, capsys, "--mount", f"{tmp_path / 'nope'}") == (
        f"error: mount {tmp_path / 'nope'}:nope:ro: {tmp_path / 'nope'} does not exist; "
        "check the path"
    )
    assert refused_inproc(tmp_path, capsys, "--mount", f"{out}:x", "--mount", f"{out}:x/y") == (
        f"error: mount {out}:x/y:ro: DEST 'x/y' is inside the DEST 'x' of mount {out}:x:ro; "
        "mounts cannot nest, give it a DEST beside the other"
    )
    assert refused_inproc(tmp_path, capsys, "--mount", f"{out}:x:rx") == (
        f"error: --mount '{out}:x:rx': unknown mode 'rx'; use ro or rw (SRC[:DEST][:ro|:rw])"
    )
