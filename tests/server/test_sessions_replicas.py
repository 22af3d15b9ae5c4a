"""Sessions across real `heddle-server` processes: two replicas on one Postgres store carry one
conversation, request by request alternating between them; and the store's start-up checks."""

from __future__ import annotations

import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.server.support import run_server_to_exit, start_server
from tests.support.cli import env_with
from tests.support.flows import FlowDoc, llm_config
from tests.support.postgres import fresh_schema
from tests.support.threaded_model import threaded_model

KEYED = {"HEDDLE_SESSION_KEY": "replicas-share-this-key-" * 2}


def asking_flow() -> dict[str, Any]:
    f = FlowDoc("ask")
    start = f.start([])
    ask = f._node("InputMessageNode", "ask_user", [], ["user_input"], message="Your name?")
    end = f.end(["user_input"])
    f.control(start, ask)
    f.control(ask, end)
    f.data(ask, "user_input", end, "user_input")
    return f.document()


def agent_document(url: str) -> dict[str, Any]:
    return {"component_type": "Agent", "agentspec_version": "25.4.1", "id": f"agent-{uuid.uuid4().hex[:6]}",
            "name": "helper", "inputs": [], "outputs": [], "llm_config": llm_config(url),
            "system_prompt": "You help.", "tools": []}


def test_two_servers_on_one_postgres_store_carry_one_conversation(tmp_path: Path, postgres_dsn: str) -> None:
    dsn = fresh_schema(postgres_dsn)
    script = [{"content": "Hello Ann."}, {"content": "Your name is Ann."}]
    with threaded_model(script) as model:
        args = ("--session-store", dsn, "--allow-net", "127.0.0.1")
        with ThreadPoolExecutor(2) as pool:  # the two start-ups overlap
            a, b = pool.map(lambda name: start_server(tmp_path / name, *args, env=KEYED), ["a", "b"])
        try:
            with a.client() as on_a, b.client() as on_b:
                # A flow that waits: opened and run on A, answered on B.
                flow = asking_flow()
                sid = on_a.post("/v1/sessions").json()["session"]
                waiting = on_a.post("/v1/runs", json={"flow": flow, "session": sid})
                assert waiting.status_code == 200, waiting.text
                assert waiting.json() == {"status": "waiting", "flow": "ask", "session": sid, "messages": [],
                                          "waiting_for": {"kind": "message", "node": "ask_user",
                                                          "prompt": "Your name?"}}
                assert on_b.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"
                done = on_b.post("/v1/runs", json={"flow": flow, "session": sid,
                                                   "answer": {"message": "Ann"}})
                assert done.status_code == 200, done.text
                assert done.json()["outputs"] == {"user_input": "Ann"} and done.json()["session"] == sid
                assert on_a.get(f"/v1/sessions/{sid}").json()["turns"] == 1

                # A top-level agent's two turns: the second, on B, sends the model the first, had on A.
                doc = agent_document(model.url)
                chat = on_b.post("/v1/sessions").json()["session"]
                first = on_a.post("/v1/runs", json={"flow": doc, "session": chat, "message": "My name is Ann."})
                assert first.status_code == 200, first.text
                assert first.json()["outputs"]["result"] == "Hello Ann."
                second = on_b.post("/v1/runs?stream=true", json={"flow": doc, "session": chat,
                                                                "message": "What is my name?"})
                assert second.status_code == 200 and '"session":"' + chat + '"' in second.text
                assert "Your name is Ann." in second.text
                sent = [m["content"] for m in model.requests()[1]["body"]["messages"]]
                assert sent[-3:] == ["My name is Ann.", "Hello Ann.", "What is my name?"], sent
                assert on_a.get(f"/v1/sessions/{chat}").json()["turns"] == 2

                assert on_b.delete(f"/v1/sessions/{sid}").status_code == 204
                assert on_a.get(f"/v1/sessions/{sid}").status_code == 404
        finally:
            with ThreadPoolExecutor(2) as pool:
                assert list(pool.map(lambda server: server.stop(), [a, b])) == [0, 0]
    assert "Traceback" not in a.stderr() + b.stderr()


def test_the_session_flags_and_a_store_that_cannot_be_reached(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # The flags in --help: tests/server/test_startup.py's `heddle-server --help` lists them.
    from heddle.server.cli import run

    def refused_here(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """`heddle-server ARGS` by the command's entry function in this process (a start-up each saved;
        the unreachable store below is the real process)."""
        capsys.readouterr()
        status = run(["--port", "0", *[str(a) for a in args]], env_with(env))
        return subprocess.CompletedProcess([], status, *capsys.readouterr())

    gone = tmp_path / "no-such-folder"
    # A store shared by replicas has no default key: refused at start, naming where to give one.
    proc = refused_here("--session-store", f"postgresql://heddle:s3cret@/heddle?host={gone}")
    assert proc.returncode == 2 and "listening" not in proc.stdout
    (line,) = proc.stderr.strip().splitlines()
    assert "--session-key FILE" in line and "HEDDLE_SESSION_KEY" in line and "s3cret" not in line
    short = refused_here("--session-store", f"postgresql://heddle:s3cret@/heddle?host={gone}",
                         env={"HEDDLE_SESSION_KEY": "short"})
    assert short.returncode == 2 and "fewer than 32" in short.stderr

    proc = run_server_to_exit(tmp_path, "--session-store", f"postgresql://heddle:s3cret@/heddle?host={gone}",
                              env=KEYED)
    assert proc.returncode != 0 and "listening" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: postgres ") and str(gone) in lines[0], proc.stderr
    assert "s3cret" not in proc.stderr

    # The flags' own refusal.
    proc = refused_here("--session-db", tmp_path / "s.db")
    assert proc.returncode == 2 and "listening" not in proc.stdout
    assert proc.stderr.strip() == ("error: --session-db applies only to --session-store sqlite, and this server has "
                                   "no --session-store (sessions are off); give --session-store sqlite or drop "
                                   "--session-db")


def test_of_concurrent_approvals_to_a_real_server_exactly_one_runs_the_call(tmp_path: Path) -> None:
    from concurrent.futures import FIRST_COMPLETED, wait

    from tests.server.flows import write_tools

    log, gate = tmp_path / "paid.log", tmp_path / "gate"
    f = FlowDoc("pay")
    start = f.start([{"title": "amount", "type": "integer"}])
    pay = f.tool_node("pay", {"component_type": "ServerTool", "id": "pay-tool", "name": "pay",
                              "inputs": [{"title": "amount", "type": "integer"}],
                              "outputs": [{"title": "paid", "type": "integer"}], "requires_confirmation": True})
    end = f.end([{"title": "paid", "type": "integer"}])
    f.control(start, pay)
    f.control(pay, end)
    doc = f.document()
    # The tool that pays logs the payment, then holds its answer until the gate opens.
    write_tools(tmp_path / "tools", {"pay": f"#!/bin/sh\ncat >/dev/null\necho paid >> {log}\n"
                                            f"while [ ! -e {gate} ]; do sleep 0.01; done\necho '{{\"paid\": 1}}'\n"})
    server = start_server(tmp_path / "server", "--session-store", "sqlite", "--session-db", tmp_path / "s.db",
                          "--tools-dir", tmp_path / "tools", "--max-concurrent", "8")
    try:
        with server.client(timeout=60) as client:
            sid = client.post("/v1/sessions").json()["session"]
            waiting = client.post("/v1/runs", json={"flow": doc, "session": sid, "inputs": {"amount": 1}})
            assert waiting.json()["status"] == "waiting", waiting.text
            answer = {"flow": doc, "session": sid, "answer": {"approve": True}}
            with ThreadPoolExecutor(4) as pool:
                futures = [pool.submit(client.post, "/v1/runs", json=answer) for _ in range(4)]
                pending = set(futures)
                while len(pending) > 1:  # the winner's tool holds until the gate opens
                    done, pending = wait(pending, timeout=60, return_when=FIRST_COMPLETED)
                    assert done, "the losing answers should have been refused by now; more than one runs the call"
                    assert pending, "every answer ended: the winner's tool cannot have held"
                refused = [f.result() for f in futures if f not in pending]
                gate.touch()
                (won,) = [f.result() for f in pending]
            assert won.status_code == 200 and won.json()["outputs"] == {"paid": 1}, won.text
            for response in refused:
                assert response.status_code == 409, response.text
                assert response.json()["error"]["type"] == "already_answered"
            assert log.read_text() == "paid\n"
    finally:
        assert server.stop() == 0
    assert "Traceback" not in server.stderr()
