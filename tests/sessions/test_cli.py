"""`heddle run --session`, its answers and `--durable`, and `heddle sessions`, as a user runs them."""

from __future__ import annotations

import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import BIN, env_with, error_line, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, server_tool, write_tool


def _greeting_flow(root: Path) -> tuple[Path, Path, Path]:
    """start -> ToolNode greet (counts its runs) -> OutputMessageNode -> InputMessageNode ask ->
    OutputMessageNode -> end: (flow, tools dir, the file with a line per run of the tool)."""
    runs = root / "greet-runs"
    tools = root / "tools"
    write_tool(tools, "greet.py", f"open({str(runs)!r}, 'a').write('ran\\n')\n"
                                  "out = {'greeting': 'hello ' + args['name']}")
    f = FlowDoc("greeting")
    start = f.start(["name"])
    greet = f.tool_node("greet", server_tool("greet", ["name"], ["greeting"]))
    told = f._node("OutputMessageNode", "told", ["greeting"], [], message="the tool says {{greeting}}")
    ask = f._node("InputMessageNode", "ask", [], ["reply"], message="your reply?")
    echo = f._node("OutputMessageNode", "echo", ["reply"], [], message="you said {{reply}}")
    end = f.end(["greeting", "reply"])
    for a, b in ((start, greet), (greet, told), (told, ask), (ask, echo), (echo, end)):
        f.control(a, b)
    return f.write(root / "flow.json"), tools, runs


def _one_json(stdout: str) -> dict[str, Any]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, stdout
    return json.loads(lines[0])


def test_a_run_waits_for_a_message_and_the_next_run_resumes_it(tmp_path: Path) -> None:
    flow, tools, runs = _greeting_flow(tmp_path)
    db = tmp_path / "s.db"
    first = heddle("run", flow, "-t", tools, "--input", '{"name": "ann"}', "--session", "s1", "--session-db", db,
                   "--outputs")
    assert first.returncode == 10, first.stderr
    assert _one_json(first.stdout) == {
        "status": "waiting", "session": "s1",
        "waiting_for": {"kind": "message", "node": "ask", "prompt": "your reply?"},
        "messages": ["the tool says hello ann"]}
    assert "message from told: the tool says hello ann" in first.stderr
    assert runs.read_text() == "ran\n"

    second = heddle("run", flow, "-t", tools, "--session", "s1", "--session-db", db, "--message", "hi", "--outputs")
    assert state_of(second) == {"greeting": "hello ann", "reply": "hi", "messages": ["you said hi"]}
    assert "message from echo: you said hi" in second.stderr
    assert "the tool says" not in second.stderr  # what ran before the wait is not run (nor shown) again
    assert runs.read_text() == "ran\n"


def test_session_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow, tools, _ = _greeting_flow(tmp_path)
    db = tmp_path / "s.db"
    run = ("run", flow, "-t", tools, "--session-db", db)

    without = heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"name": "ann"}')
    assert without.returncode == 2
    line = error_line(without)
    assert "InputMessageNode 'ask'" in line and "--session" in line
    for args, said in ((("--approve",), "--approve is for a run in a session"),
                       (("--durable",), "--durable is for a run in a session"),
                       (("--session", "-x"), "session name '-x' is not valid"),
                       (("--session", "s", "--approve", "--deny", "no"), "--approve and --deny"),
                       (("--session", "s", "--tool-result", "{nope"), "--tool-result is not valid JSON")):
        proc = heddle_here(capsys, "run", flow, "-t", tools, *args)
        assert proc.returncode == 2 and said in error_line(proc), (args, proc.stderr)

    unknown = heddle_here(capsys, *run, "--session", "nobody", "--approve")
    assert unknown.returncode == 2 and "no such session" in error_line(unknown)

    waiting = heddle_here(capsys, *run, "--input", '{"name": "ann"}', "--session", "w", "--no-input")
    assert waiting.returncode == 10
    wrong = heddle_here(capsys, *run, "--session", "w", "--approve")
    assert wrong.returncode == 2
    assert "waits for a message at node 'ask'" in error_line(wrong) and "--message" in error_line(wrong)
    unanswered = heddle_here(capsys, *run, "--session", "w")  # no terminal to ask on
    assert unanswered.returncode == 2 and "answer with --message" in error_line(unanswered)

    unreachable = heddle_here(capsys, *run, "--session", "w", "--session-store", "postgres://u:secret@127.0.0.1:1/x")
    assert unreachable.returncode == 2 and "postgres" in error_line(unreachable)
    assert "secret" not in unreachable.stderr


def test_sessions_ls_show_rm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow, tools, _ = _greeting_flow(tmp_path)
    store = ("--session-db", tmp_path / "s.db")
    assert heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"name": "ann"}', "--session", "w",
                       *store).returncode == 10

    listed = heddle("sessions", "ls", "--json", *store)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert row["id"] == "w" and row["status"] == "waiting" and row["turns"] == 0
    assert row["waiting_for"] == {"kind": "message", "node": "ask", "prompt": "your reply?"}
    assert "journal" not in listed.stdout and "pending" not in row

    table = heddle_here(capsys, "sessions", "ls", *store)
    assert table.returncode == 0 and table.stdout.splitlines()[0].split()[:2] == ["NAME", "STATUS"]
    assert "message at 'ask'" in table.stdout
    shown = heddle_here(capsys, "sessions", "show", "w", *store)
    assert shown.returncode == 0 and "waits for message at node 'ask'" in shown.stdout
    assert json.loads(heddle_here(capsys, "sessions", "show", "w", "--json", *store).stdout) == row

    assert heddle_here(capsys, "sessions", "rm", "w", *store).returncode == 0
    for args in (("show", "w"), ("rm", "w")):
        gone = heddle_here(capsys, "sessions", *args, *store)
        assert gone.returncode == 2 and "no session 'w'" in error_line(gone)
    assert heddle_here(capsys, "sessions", "ls", "--json", *store).stdout.strip() == "[]"
    # Without --session-db: the sqlite file under $XDG_DATA_HOME, which conftest points at a folder of its own.
    default = heddle_here(capsys, "sessions", "ls", "-v")
    assert f"session store: sqlite {os.environ['XDG_DATA_HOME']}/heddle/sessions.db" in default.stderr


def test_validate_says_where_a_document_waits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flow, tools, _ = _greeting_flow(tmp_path)
    report = heddle_here(capsys, "validate", flow, "-t", tools, "--json")
    assert report.returncode == 0
    (where,) = json.loads(report.stdout)["waits"]
    assert "InputMessageNode 'ask'" in where
    human = heddle_here(capsys, "validate", flow, "-t", tools)
    assert "InputMessageNode 'ask'" in human.stdout and "--session NAME" in human.stdout


def _read_until(fd: int, needle: bytes, seen: bytearray) -> None:
    """Read the terminal until `needle` appears (or it closes)."""
    while needle not in seen:
        ready, _, _ = select.select([fd], [], [], 30)
        assert ready, f"no {needle!r} on the terminal; it showed {bytes(seen)!r}"
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other end closed (Linux reports EIO)
            chunk = b""
        assert chunk, f"the terminal closed before {needle!r}; it showed {bytes(seen)!r}"
        seen += chunk


def test_on_a_terminal_the_run_asks_and_goes_on(tmp_path: Path) -> None:
    flow, tools, runs = _greeting_flow(tmp_path)
    master, slave = pty.openpty()
    proc = subprocess.Popen([str(BIN / "heddle"), "run", flow, "-t", tools, "--input", '{"name": "ann"}',
                             "--session", "tty", "--session-db", tmp_path / "s.db"],
                            stdin=slave, stdout=subprocess.PIPE, stderr=slave, env=env_with({"NO_COLOR": "1"}))
    os.close(slave)
    seen = bytearray()
    try:
        _read_until(master, b"> ", seen)
        assert b"message from told: the tool says hello ann" in seen and b"ask: your reply?" in seen
        os.write(master, b"hi there\n")
        _read_until(master, b"you said hi there", seen)
        out, _ = proc.communicate(timeout=60)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, bytes(seen)
    assert _one_json(out.decode())["reply"] == "hi there"
    assert runs.read_text() == "ran\n"


def test_a_durable_run_killed_resumes_after_its_last_finished_node(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    tools = tmp_path / "tools"
    log, started, hold = tmp_path / "log", tmp_path / "slow-started", tmp_path / "hold"
    write_tool(tools, "first.py", f"open({str(log)!r}, 'a').write('first\\n')\nout = {{'a': args['x'] + 1}}")
    write_tool(tools, "slow.py", f"import time\nopen({str(log)!r}, 'a').write('slow\\n')\n"
                                 f"open({str(started)!r}, 'w').close()\n"
                                 f"while os.path.exists({str(hold)!r}):\n    time.sleep(0.05)\n"
                                 "out = {'b': args['a'] * 10}")
    f = FlowDoc("durable")
    start = f.start([{"title": "x", "type": "integer"}])
    first = f.tool_node("first", server_tool("first", [{"title": "x", "type": "integer"}],
                                             [{"title": "a", "type": "integer"}]))
    slow = f.tool_node("slow", server_tool("slow", [{"title": "a", "type": "integer"}],
                                           [{"title": "b", "type": "integer"}]))
    end = f.end([{"title": "b", "type": "integer"}])
    f.control(start, first)
    f.control(first, slow)
    f.control(slow, end)
    flow = f.write(tmp_path / "flow.json")
    store = ("--session", "d", "--session-db", tmp_path / "s.db")

    hold.touch()
    proc = subprocess.Popen([str(BIN / "heddle"), "run", flow, "-t", tools, "--input", '{"x": 1}', "--durable",
                             "--outputs", *map(str, store)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env_with(), start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the slow tool never started"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    hold.unlink()

    again = heddle_here(capsys, "run", flow, "-t", tools, *store)
    assert again.returncode == 2 and "--resume" in error_line(again)
    # Two --resume at once: exactly one takes the run over; the other is refused naming the owner, and
    # runs nothing.
    hold.touch()
    started.unlink()
    argv = [str(BIN / "heddle"), "run", str(flow), "-t", str(tools), "--resume", "--outputs", *map(str, store)]
    racers = [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env_with(), start_new_session=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 60
        while all(r.poll() is None for r in racers) or not started.exists():
            assert time.monotonic() < deadline, "neither resume ended, or the slow tool never started again"
            time.sleep(0.02)
        loser = next(r for r in racers if r.poll() is not None)
        winner = next(r for r in racers if r is not loser)
        _, err = loser.communicate()
        assert loser.returncode != 0 and winner.poll() is None, err
        assert f"is still going on in process {winner.pid} on host " in err and len(err.strip().splitlines()) == 1, err
        hold.unlink()
        out, err = winner.communicate(timeout=60)
    finally:
        for racer in racers:
            if racer.poll() is None:
                os.killpg(racer.pid, signal.SIGKILL)
                racer.communicate()
    assert winner.returncode == 0, err
    assert json.loads(out.strip().splitlines()[-1]) == {"b": 20}
    assert log.read_text() == "first\nslow\nslow\n"  # `first` finished before the kill: it did not run again


def test_help_documents_the_waiting_exit(capsys: pytest.CaptureFixture[str]) -> None:
    shown = heddle_here(capsys, "run", "--help").stdout
    assert "10 the run waits for a person" in " ".join(shown.split())
    for flag in ("--session NAME", "--approve", "--deny REASON", "--tool-result JSON", "--resume", "--no-input",
                 "--durable", "--session-store", "--session-db PATH", "--session-dir DIR"):
        assert flag in shown, flag
