"""A person's answer counts once, and for exactly what was shown, as a user meets it on the command
line: concurrent `heddle run --approve` processes run the call once, a denial is final, a stored
record edited outside heddle (or forged) is refused naming the session, and a damaged one is one line.

The tool appends each amount it is called with to a log, so that what ran is counted, never timed."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import pytest

from heddle.canonical import dumps, fingerprint
from heddle.sessions.seal import seal
from heddle.sessions.sqlite import SqliteStore
from tests.sessions.support import Synced
from tests.support.cli import BIN, env_with, heddle, state_of
from tests.support.cli_inproc_proc import heddle_here
from tests.support.flows import FlowDoc, prop, server_tool, write_tool


def _pay_flow(root: Path, *, hold: bool = False) -> tuple[Path, Path, Path, Path]:
    """start(amount) -> ToolNode pay (requires_confirmation) -> end(paid): the document, its tools, the log
    of amounts paid, and a gate file the tool waits for (when `hold`) before it answers."""
    tools, log, gate = root / "tools", root / "paid.log", root / "gate"
    wait = f"import time\nwhile not os.path.exists({str(gate)!r}):\n    time.sleep(0.01)\n" if hold else ""
    write_tool(tools, "pay.py", f"open({str(log)!r}, 'a').write(str(args['amount']) + '\\n')\n{wait}"
                                "out = {'paid': args['amount']}")
    f = FlowDoc("pay")
    start = f.start([prop("amount", "integer")])
    pay = f.tool_node("pay", {**server_tool("pay", [prop("amount", "integer")], [prop("paid", "integer")]),
                              "requires_confirmation": True})
    end = f.end([prop("paid", "integer")])
    f.control(start, pay)
    f.control(pay, end)
    return f.write(root / "flow.json"), tools, log, gate


def _waiting(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert proc.returncode == 10, proc.stderr
    return dict(json.loads(proc.stdout)["waiting_for"])


def _one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_of_concurrent_approvals_exactly_one_runs_the_call(tmp_path: Path) -> None:
    flow, tools, log, gate = _pay_flow(tmp_path, hold=True)
    store = ("--session-db", tmp_path / "s.db")
    shown = _waiting(heddle("run", flow, "-t", tools, "--input", '{"amount": 1}', "--session", "p", *store))
    assert shown["arguments"] == {"amount": 1} and shown["fingerprint"] == fingerprint({"amount": 1})

    argv = [str(BIN / "heddle"), "run", str(flow), "-t", str(tools), "--session", "p", *map(str, store), "--approve"]
    procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env_with(None)) for _ in range(3)]
    try:
        # The winner's tool holds until the gate opens: the others end first, having run nothing.
        deadline = time.monotonic() + 60
        while sum(p.poll() is not None for p in procs) < 2:
            assert time.monotonic() < deadline, "two of the three answers should have been refused by now"
            time.sleep(0.02)
        gate.touch()
        done = [(p, *p.communicate(timeout=60)) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert sorted(p.returncode for p, _, _ in done) == [0, 2, 2], [(p.returncode, err) for p, _, err in done]
    for p, out, err in done:
        if p.returncode == 2:
            line = _one_error(subprocess.CompletedProcess([], 2, out, err))
            assert "already answered" in line and "session 'p'" in line and "ran nothing" in line
        else:
            assert json.loads(out)["paid"] == 1
    assert log.read_text() == "1\n"


def test_a_denial_is_final_and_a_later_approval_runs_nothing(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    flow, tools, log, _ = _pay_flow(tmp_path)
    store = ("--session-db", tmp_path / "s.db")
    _waiting(heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"amount": 5}', "--session", "p", *store))

    denied = heddle("run", flow, "-t", tools, "--session", "p", *store, "--deny", "not today")
    assert denied.returncode == 1  # the ToolNode fails, as the specification says
    assert "denied the call to tool 'pay': not today" in _one_error(denied)
    shown = json.loads(heddle_here(capsys, "sessions", "show", "p", "--json", *store).stdout)
    assert shown["status"] == "idle" and "waiting_for" not in shown  # it waits no more

    later = heddle_here(capsys, "run", flow, "-t", tools, "--session", "p", *store, "--approve")
    assert later.returncode == 2 and "waits for nothing" in _one_error(later)
    assert not log.exists()  # the denied call never ran


def _tamper(data: bytes) -> bytes:
    """What someone who can write the store but lacks the key would make of a record waiting to pay 1:
    the same record paying 1000000, fingerprint and all."""
    forged = data.replace(b'"amount":1}', b'"amount":1000000}')
    forged = forged.replace(fingerprint({"amount": 1}).encode(), fingerprint({"amount": 1000000}).encode())
    assert forged.count(b"1000000") >= 3, data  # the wait shown, its fingerprint, and the input it replays
    return forged


def test_a_record_edited_in_the_sqlite_store_is_refused_and_nothing_runs(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    flow, tools, log, _ = _pay_flow(tmp_path)
    db = tmp_path / "s.db"
    shown = _waiting(heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"amount": 1}', "--session", "p",
                                 "--session-db", db))
    assert shown["arguments"] == {"amount": 1}
    with sqlite3.connect(db) as conn:
        (data,) = conn.execute("SELECT data FROM heddle_sessions WHERE id = 'p'").fetchone()
        conn.execute("UPDATE heddle_sessions SET data = ? WHERE id = 'p'", (_tamper(bytes(data)),))

    approved = heddle("run", flow, "-t", tools, "--session", "p", "--session-db", db, "--approve")
    assert approved.returncode == 2
    line = _one_error(approved)
    assert "session 'p'" in line and "fails its authentication" in line and "heddle sessions rm p" in line
    assert not log.exists()
    listed = heddle_here(capsys, "sessions", "ls", "--json", "--session-db", db)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["status"] == "unreadable"
    assert "fails its authentication" in listed.stderr


def test_a_record_edited_in_the_file_store_or_forged_as_approved_is_refused(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    flow, tools, log, _ = _pay_flow(tmp_path)
    store = ("--session-store", "file", "--session-dir", tmp_path / "sessions")
    _waiting(heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"amount": 1}', "--session", "p", *store))
    path = tmp_path / "sessions" / "p.json"
    original = path.read_bytes()
    path.write_bytes(_tamper(original))
    # In-process: an edited record refused by a real process is the sqlite store's test above.
    edited = heddle_here(capsys, "run", flow, "-t", tools, "--session", "p", *store, "--approve")
    assert edited.returncode == 2 and "fails its authentication" in _one_error(edited)

    # A forged approval: the run made to look as if the person had approved it, for --resume to continue.
    held = json.loads(original)
    record = held["record"]["record"]
    waited = record["pending"]["waiting_for"]
    record["pending"] |= {"status": "running", "waiting_for": None, "answered": waited}
    record["pending"]["journal"]["entries"][record["pending"]["journal"]["waited"]] = {
        "kind": "approval", "message": None, "approved": True, "reason": None, "tool_result": None,
        "fingerprint": waited["fingerprint"]}
    held["record"]["record"] = record
    path.write_text(json.dumps(held, separators=(",", ":")) + "\n")
    forged = heddle("run", flow, "-t", tools, "--session", "p", *store, "--resume")
    assert forged.returncode == 2 and "session 'p'" in _one_error(forged)
    assert not log.exists()


def test_the_session_key_is_heddles_own_private_file_apart_from_the_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    flow, tools, log, _ = _pay_flow(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    store = ("--session-store", "file", "--session-dir", tmp_path / "sessions")
    _waiting(heddle_here(capsys, "run", flow, "-t", tools, "--input", '{"amount": 1}', "--session", "p", *store))
    key = tmp_path / "config" / "heddle" / "session.key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and stat.S_IMODE(key.parent.stat().st_mode) == 0o700
    assert len(key.read_text().strip()) == 64
    assert sorted(p.name for p in (tmp_path / "sessions").iterdir()) == ["p.json", "p.lock"]

    key.chmod(0o644)
    refused = heddle_here(capsys, "run", flow, "-t", tools, "--session", "p", *store, "--approve")
    assert refused.returncode == 2 and f"chmod 600 {key}" in _one_error(refused)
    key.chmod(0o600)

    # Another key (another user's, a copy of the store elsewhere) does not open these records.
    other = tmp_path / "other.key"
    other.write_text("x" * 64)
    other.chmod(0o600)
    foreign = heddle_here(capsys, "run", flow, "-t", tools, "--session", "p", *store, "--approve", "--session-key",
                          other)
    assert foreign.returncode == 2 and "another session key" in _one_error(foreign)
    assert state_of(heddle_here(capsys, "run", flow, "-t", tools, "--session", "p", *store, "--approve"))["paid"] == 1
    assert log.read_text() == "1\n"


def _record(pending: object = None, **changes: object) -> bytes:
    record = {"format": 3, "id": "d", "digest": "sha256:" + "0" * 64, "document": "x", "created": 1.0,
              "updated": 1.0, "turns": 0, "conversation": {}, "inputs": {}, "pending": pending, **changes}
    return dumps(record, strict=False)


@pytest.mark.parametrize(("data", "said"), [
    (None, "is not a sealed session record"),
    (b"not json", "is not one this heddle reads"),
    (_record(conversation=[1]), "is not one this heddle reads"),
    (_record(format=1), "its record is format 1 (written by an earlier heddle)"),
    (_record({"status": "running", "inputs": {}, "message": None, "journal": {"entries": {}, "waited": None}},
             format=2), "recorded in record format 2"),
    (_record({"status": "waiting", "inputs": {}, "message": None, "journal": {"entries": "x"},
              "waiting_for": {"kind": "approval", "node": "pay", "tool": "pay", "arguments": {}}}),
     "is not one this heddle reads"),
    (_record({"status": "waiting", "inputs": {}, "message": None, "journal": {},
              "waiting_for": {"kind": "approval", "node": "pay", "tool": "pay", "arguments": {"amount": 1},
                              "fingerprint": fingerprint({"amount": 2})}}), "fingerprint"),
    (_record({"status": "sleeping", "inputs": [], "message": 3, "journal": None}), "is not one this heddle reads"),
])
def test_a_damaged_record_is_one_line_naming_the_session(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        data: bytes | None, said: str) -> None:
    flow, tools, log, _ = _pay_flow(tmp_path)
    key = tmp_path / "k"
    key.write_text("a-key-of-this-test-" * 3)
    key.chmod(0o600)
    db = tmp_path / "s.db"
    raw = Synced(SqliteStore(db))
    raw.create("d", b"garbage" if data is None else seal(key.read_bytes().strip(), "d", 1, data))
    raw.close()
    store = ("--session-db", db, "--session-key", key)
    for args in (("run", flow, "-t", tools, "--session", "d", *store, "--approve"), ("sessions", "show", "d", *store)):
        proc = heddle_here(capsys, *args)
        assert proc.returncode == 2, proc.stderr
        line = _one_error(proc)
        assert "session 'd'" in line and said in line and "heddle sessions rm d" in line, line
    listed = heddle_here(capsys, "sessions", "ls", "--json", *store)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["status"] == "unreadable"
    assert heddle_here(capsys, "sessions", "rm", "d", *store).returncode == 0
    assert not log.exists()
    assert not os.path.exists(tmp_path / "config")
