"""Sessions across real `heddle-server` processes: two replicas on one Postgres store carry one
conversation, request by request alternating between them; and the store's start-up checks."""

from __future__ import annotations

import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.server.support import SERVER, run_server_to_exit, start_server
from tests.support.cli import env_with
from tests.support.flows import FlowDoc, llm_config
from tests.support.postgres import fresh_schema
from tests.support.threaded_model import threaded_model


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
            a, b = pool.map(lambda name: start_server(tmp_path / name, *args), ["a", "b"])
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
    shown = subprocess.run([str(SERVER), "--help"], capture_output=True, text=True, env=env_with(None), timeout=30,
                           check=False)
    assert shown.returncode == 0
    for flag in ("--session-store", "--session-db", "--session-dir"):
        assert flag in shown.stdout
    assert "--durable" not in shown.stdout

    gone = tmp_path / "no-such-folder"
    proc = run_server_to_exit(tmp_path, "--session-store", f"postgresql://heddle:s3cret@/heddle?host={gone}")
    assert proc.returncode != 0 and "listening" not in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: postgres ") and str(gone) in lines[0], proc.stderr
    assert "s3cret" not in proc.stderr

    # The flags' own refusal through the command's entry function in this process.
    from heddle.server.cli import run

    capsys.readouterr()
    status = run(["--port", "0", "--session-db", str(tmp_path / "s.db")], env_with(None))
    proc = subprocess.CompletedProcess([], status, *capsys.readouterr())
    assert proc.returncode == 2 and "listening" not in proc.stdout
    assert proc.stderr.strip() == ("error: --session-db applies only to --session-store sqlite, and this server has "
                                   "no --session-store (sessions are off); give --session-store sqlite or drop "
                                   "--session-db")
