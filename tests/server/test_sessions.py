"""Sessions over HTTP, in-process (the app through httpx.ASGITransport, on a sqlite store): the
routes, a flow that waits and resumes, the errors, the SSE `waiting` frame, and two racing runs.
tests/server/test_sessions_replicas.py carries one conversation across two real servers."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from heddle.canonical import fingerprint
from heddle.server.config import ServerConfig
from heddle.server.service import Service
from heddle.settings import RunSettings
from tests.server.flows import one_tool_flow, write_tools
from tests.server.support import in_process, sse_frames
from tests.support.flows import FlowDoc, server_tool

MARKDOWN = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "markdown-encoder" / "plugin" / "plugin.json"

Client = httpx.AsyncClient


def asking_flow(name: str = "ask", question: str = "What now?") -> dict[str, Any]:
    """Start -> a message shown -> an InputMessageNode -> End(user_input)."""
    f = FlowDoc(name)
    start = f.start([])
    say = f._node("OutputMessageNode", "hello", [], [], message="Hi there")
    ask = f._node("InputMessageNode", "ask_user", [], ["user_input"], message=question)
    end = f.end(["user_input"])
    f.control(start, say)
    f.control(say, ask)
    f.control(ask, end)
    f.data(ask, "user_input", end, "user_input")
    return f.document()


def serve(tmp_path: Path, test: Callable[[Client], Awaitable[None]], *, sessions: bool = True,
          **config: Any) -> None:
    settings = RunSettings(session_store="sqlite", session_db=tmp_path / "sessions.db",
                           plugins=config.pop("plugins", ()), **config.pop("run", {})) if sessions else RunSettings()
    in_process(Service(ServerConfig(settings=settings, **config)), test)


def error(response: httpx.Response) -> tuple[int, str, str]:
    body = response.json()["error"]
    return response.status_code, body["type"], body["message"]


async def new_session(client: Client) -> str:
    response = await client.post("/v1/sessions")
    assert response.status_code == 201, response.text
    assert set(response.json()) == {"session"}
    return str(response.json()["session"])


def test_without_a_store_the_server_is_stateless_and_says_how_to_keep_sessions(tmp_path: Path) -> None:
    async def test(client: Client) -> None:
        for response in (await client.post("/v1/sessions"), await client.get("/v1/sessions/abc"),
                         await client.delete("/v1/sessions/abc"),
                         await client.post("/v1/runs", json={"flow": asking_flow(), "session": "abc"}),
                         await client.post("/v1/runs?stream=true", json={"flow": asking_flow(), "session": "abc",
                                                                         "answer": {"message": "hi"}})):
            status, type_, message = error(response)
            assert (status, type_) == (400, "sessions_off"), response.text
            assert "--session-store" in message
        assert (await client.get("/v1/capabilities")).json()["sessions"] is False
        status, type_, message = error(await client.post("/v1/runs?stream=true", json={"flow": asking_flow()}))
        assert (status, type_) == (400, "needs_session")
        assert "InputMessageNode 'ask_user'" in message and "--session-store" in message

    serve(tmp_path, test, sessions=False)


def test_a_flow_waits_for_a_message_and_resumes_in_its_session(tmp_path: Path) -> None:
    doc = asking_flow()

    async def test(client: Client) -> None:
        status, type_, message = error(await client.post("/v1/runs", json={"flow": doc}))
        assert (status, type_) == (400, "needs_session") and "POST /v1/sessions" in message
        assert (await client.get("/v1/capabilities")).json()["sessions"] is True
        sid = await new_session(client)
        assert len(base64.urlsafe_b64decode(sid + "=" * (-len(sid) % 4))) * 8 >= 128
        assert (await client.get(f"/v1/sessions/{sid}")).json()["status"] == "idle"

        streamed = await client.post("/v1/runs?stream=true", json={"flow": doc, "session": sid})
        assert streamed.status_code == 200 and streamed.headers["content-type"].startswith("text/event-stream")
        frames = sse_frames(streamed.text)
        assert [e for e, _ in frames].count("waiting") == 1 and frames[-1][0] == "waiting", frames
        waiting = frames[-1][1]
        assert {k: waiting[k] for k in ("status", "session", "waiting_for", "messages")} == {
            "status": "waiting", "session": sid, "messages": ["Hi there"],
            "waiting_for": {"kind": "message", "node": "ask_user", "prompt": "What now?"}}
        assert "flow_complete" not in [e for e, _ in frames]
        assert "journal" not in streamed.text and "entries" not in streamed.text

        shown = await client.get(f"/v1/sessions/{sid}")
        assert shown.status_code == 200
        summary = shown.json()
        assert summary["status"] == "waiting" and summary["waiting_for"]["node"] == "ask_user"
        assert summary["digest"].startswith("sha256:") and summary["document"] == "flow 'ask'"
        assert "journal" not in shown.text and "pending" not in summary

        # Refused, naming what is awaited, and nothing is written: the session still waits.
        status, type_, message = error(await client.post("/v1/runs", json={
            "flow": doc, "session": sid, "answer": {"approve": True}}))
        assert (status, type_) == (400, "session_error")
        assert "waits for a message at node 'ask_user', not for an approval" in message
        assert '"answer": {"message": TEXT}' in message and "--" not in message
        status, type_, message = error(await client.post("/v1/runs", json={"flow": doc, "session": sid}))
        assert status == 400 and "waits for a message at node 'ask_user'" in message
        status, type_, message = error(await client.post("/v1/runs", json={"flow": asking_flow("other"),
                                                                            "session": sid}))
        assert status == 400 and summary["digest"] in message and "flow 'other'" in message
        status, _, message = error(await client.post("/v1/runs", json={"flow": doc, "session": sid,
                                                                       "answer": {"approve": "yes"}}))
        assert status == 400 and "answer" in message
        assert (await client.get(f"/v1/sessions/{sid}")).json() == summary

        done = await client.post("/v1/runs", json={"flow": doc, "session": sid, "answer": {"message": "go on"}})
        assert done.status_code == 200, done.text
        assert done.json() == {"flow": "ask", "state": {"user_input": "go on"}, "outputs": {"user_input": "go on"},
                               "session": sid}
        after = (await client.get(f"/v1/sessions/{sid}")).json()
        assert after["status"] == "idle" and after["turns"] == 1 and "waiting_for" not in after

        status, _, message = error(await client.post("/v1/runs?stream=true", json={
            "flow": doc, "session": sid, "answer": {"message": "again"}}))
        assert status == 400 and "waits for nothing" in message

        # The next turn waits again; "message" is the answer to a message it waits for.
        again = await client.post("/v1/runs", json={"flow": doc, "session": sid})
        assert again.json()["status"] == "waiting", again.text
        done = await client.post("/v1/runs?stream=true", json={"flow": doc, "session": sid, "message": "yes"})
        last_event, last = sse_frames(done.text)[-1]
        assert last_event == "flow_complete" and last["session"] == sid and last["state"] == {"user_input": "yes"}

        assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204
        for response in (await client.get(f"/v1/sessions/{sid}"), await client.delete(f"/v1/sessions/{sid}"),
                         await client.post("/v1/runs", json={"flow": doc, "session": sid}),
                         await client.post("/v1/runs?stream=true", json={"flow": doc, "session": sid})):
            status, type_, message = error(response)
            assert (status, type_) == (404, "session_not_found") and "POST /v1/sessions" in message, response.text
            assert str(tmp_path) not in message  # where the operator keeps the store is not the caller's

    serve(tmp_path, test)


def test_request_fields_of_a_session_are_checked(tmp_path: Path) -> None:
    doc = asking_flow()

    async def test(client: Client) -> None:
        sid = await new_session(client)
        for body, words in (({"answer": {"message": "x"}}, "give 'session' too"),
                            ({"session": 7}, "must be a string"),
                            ({"session": "../etc"}, "is not valid"),
                            ({"session": sid, "resume": "yes"}, "true or false"),
                            ({"session": sid, "resume": True, "answer": {"approve": True}}, "give one"),
                            ({"session": sid, "answer": {"message": "a", "approve": True}}, "exactly one")):
            response = await client.post("/v1/runs", json={"flow": doc, **body})
            assert response.status_code == 400 and words in error(response)[2], (body, response.text)
        response = await client.post("/v1/sessions", json={"id": "mine"})
        assert response.status_code == 400 and "'id' is unknown" in error(response)[2]
        response = await client.post("/v1/validate", json={"flow": doc, "session": sid})
        assert response.status_code == 400 and "POST /v1/runs" in error(response)[2]
        assert (await client.get("/v1/sessions/.hidden")).status_code == 400

    serve(tmp_path, test)


def test_two_runs_racing_on_one_session_get_one_success_and_one_conflict(tmp_path: Path) -> None:
    # Each run's tool waits until its round's file is there (its input names the round). A session run on
    # a server is durable: the race is decided at the first checkpoint (or by the winner's lease), so the
    # loser is answered while the winner is still in its tool.
    gate = tmp_path / "gate"
    gate.mkdir()
    tool = (f'#!/bin/sh\nn="$(tr -dc 0-9)"\nwhile [ ! -e "{gate}/$n" ]; do sleep 0.01; done\n'
            'echo \'{"x": 1}\'\n')
    write_tools(tmp_path / "tools", {"meet": tool})
    doc = one_tool_flow("race", "meet").document()

    async def race(client: Client, body: dict[str, Any], path: str) -> tuple[Any, Any]:
        runs = {asyncio.ensure_future(client.post(path, json=body)) for _ in range(2)}
        done, going = await asyncio.wait(runs, return_when=asyncio.FIRST_COMPLETED)
        (gate / str(body["inputs"]["x"])).touch()
        return done.pop().result(), await going.pop()

    def refused(message: str) -> bool:
        return "run it again" in message or "is still going on in process" in message

    async def test(client: Client) -> None:
        sid = await new_session(client)
        # A new run's inputs are checked once the turn is known, and still answered with their status.
        status, type_, _ = error(await client.post("/v1/runs?stream=true", json={"flow": doc, "session": sid}))
        assert (status, type_) == (400, "missing_input")
        body = {"flow": doc, "session": sid, "inputs": {"x": 1}}
        lost, won = await race(client, body, "/v1/runs")
        assert (lost.status_code, won.status_code) == (409, 200), (lost.text, won.text)
        assert error(lost)[1] == "session_conflict" and refused(error(lost)[2]), lost.text
        assert (await client.get(f"/v1/sessions/{sid}")).json()["turns"] == 1

        # Streamed, the loser never shows an end: refused before its stream starts when the winner's
        # claim is already there (409), else its stream ends with the conflict.
        body["inputs"] = {"x": 2}
        lost, won = await race(client, body, "/v1/runs?stream=true")
        if lost.status_code == 409:
            assert error(lost)[1] == "session_conflict" and refused(error(lost)[2]), lost.text
        else:
            assert lost.status_code == 200 and sse_frames(lost.text)[-1][0] == "error", lost.text
            assert sse_frames(lost.text)[-1][1]["error"]["type"] == "session_conflict"
            assert "flow_complete" not in [e for e, _ in sse_frames(lost.text)]
        assert sse_frames(won.text)[-1][0] == "flow_complete", won.text
        assert (await client.get(f"/v1/sessions/{sid}")).json()["turns"] == 2

    serve(tmp_path, test, tools_dir=tmp_path / "tools")


def test_a_session_over_the_size_cap_is_refused_with_413_and_left_as_it_was(tmp_path: Path) -> None:
    big = ('#!/bin/sh\ncat >/dev/null\nprintf \'{"x": "\'\nhead -c 17000000 /dev/zero | tr "\\0" a\n'
           "printf '\"}'\n")
    write_tools(tmp_path / "tools", {"big": big})
    f = FlowDoc("big")
    start = f.start([])
    make = f.tool_node("make", {"component_type": "ServerTool", "id": "big-tool", "name": "big", "inputs": [],
                                "outputs": [{"title": "x", "type": "string"}]})
    ask = f._node("InputMessageNode", "ask_user", [], ["user_input"], message="More?")
    end = f.end(["user_input"])
    f.control(start, make)
    f.control(make, ask)
    f.control(ask, end)
    doc = f.document()

    async def test(client: Client) -> None:
        sid = await new_session(client)
        before = (await client.get(f"/v1/sessions/{sid}")).json()
        status, type_, message = error(await client.post("/v1/runs", json={"flow": doc, "session": sid}))
        assert (status, type_) == (413, "session_too_large") and "over the cap" in message
        assert (await client.get(f"/v1/sessions/{sid}")).json() == before

    # The tool's answer is over 16 MiB too: let the server take it, so that the session is what is refused.
    serve(tmp_path, test, tools_dir=tmp_path / "tools", run={"max_tool_stdout_bytes": 32 * 2**20})


def test_an_encoder_renders_the_wait_and_is_told_the_run_waits(tmp_path: Path) -> None:
    doc = asking_flow()

    async def test(client: Client) -> None:
        sid = await new_session(client)
        response = await client.post("/v1/runs?protocol=markdown", json={"flow": doc, "session": sid})
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/markdown")
        assert "## Waiting" in response.text and "`ask_user` waits for a message" in response.text
        assert "## Result" not in response.text
        assert (await client.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
        # Refused before the run starts: the status says so, not a rendering.
        response = await client.post("/v1/runs?protocol=markdown", json={"flow": doc, "session": sid})
        assert response.status_code == 400 and json.loads(response.text)["error"]["type"] == "session_error"

    serve(tmp_path, test, plugins=(MARKDOWN,))


def paying_flow(log: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """start(amount) -> ToolNode pay (requires_confirmation) -> end: the document and its tool, which logs
    each amount it pays."""
    f = FlowDoc("pay")
    start = f.start([{"title": "amount", "type": "integer"}])
    pay = f.tool_node("pay", {**server_tool("pay", [{"title": "amount", "type": "integer"}],
                                            [{"title": "paid", "type": "integer"}]), "requires_confirmation": True})
    end = f.end([{"title": "paid", "type": "integer"}])
    f.control(start, pay)
    f.control(pay, end)
    tool = (f"#!/bin/sh\nread -r args\necho \"$args\" >> {log}\n"
            'echo "{\\"paid\\": $(echo "$args" | tr -dc 0-9)}"\n')
    return f.document(), {"pay": tool}


def test_a_denial_over_http_is_final_and_no_500(tmp_path: Path) -> None:
    log = tmp_path / "paid.log"
    doc, tools = paying_flow(log)
    write_tools(tmp_path / "tools", tools)

    async def test(client: Client) -> None:
        sid = await new_session(client)
        waiting = await client.post("/v1/runs", json={"flow": doc, "session": sid, "inputs": {"amount": 3}})
        assert waiting.json()["waiting_for"]["fingerprint"] == fingerprint({"amount": 3}), waiting.text
        denied = await client.post("/v1/runs", json={"flow": doc, "session": sid, "answer": {"deny": "no"}})
        status, type_, message = error(denied)
        assert (status, type_) == (422, "call_denied") and "denied the call to tool 'pay': no" in message
        summary = (await client.get(f"/v1/sessions/{sid}")).json()
        assert summary["status"] == "idle" and "waiting_for" not in summary
        status, type_, message = error(await client.post("/v1/runs", json={"flow": doc, "session": sid,
                                                                            "answer": {"approve": True}}))
        assert (status, type_) == (400, "session_error") and "waits for nothing" in message
        # Streamed, the denial is the stream's error, with its own type.
        sid = await new_session(client)
        await client.post("/v1/runs", json={"flow": doc, "session": sid, "inputs": {"amount": 4}})
        streamed = await client.post("/v1/runs?stream=true", json={"flow": doc, "session": sid,
                                                                   "answer": {"deny": "no"}})
        assert streamed.status_code != 500 and "call_denied" in streamed.text, streamed.text
        assert not log.exists()

    serve(tmp_path, test, tools_dir=tmp_path / "tools")


def test_an_answer_over_http_is_bound_to_the_fingerprint_it_carries(tmp_path: Path) -> None:
    log = tmp_path / "paid.log"
    doc, tools = paying_flow(log)
    write_tools(tmp_path / "tools", tools)

    async def test(client: Client) -> None:
        sid = await new_session(client)
        waiting = (await client.post("/v1/runs", json={"flow": doc, "session": sid,
                                                       "inputs": {"amount": 1}})).json()["waiting_for"]
        assert waiting == {"kind": "approval", "node": "pay", "tool": "pay", "arguments": {"amount": 1},
                           "fingerprint": fingerprint({"amount": 1})}
        other = {"approve": True, "fingerprint": fingerprint({"amount": 1000000})}
        status, _, message = error(await client.post("/v1/runs", json={"flow": doc, "session": sid,
                                                                        "answer": other}))
        assert status == 409 and "another call" in message and not log.exists()
        assert (await client.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
        status, _, message = error(await client.post("/v1/runs", json={
            "flow": doc, "session": sid, "answer": {"message": "hi", "fingerprint": waiting["fingerprint"]}}))
        assert status == 400 and "fingerprint" in message
        done = await client.post("/v1/runs", json={"flow": doc, "session": sid, "answer": {
            "approve": True, "fingerprint": waiting["fingerprint"]}})
        assert done.status_code == 200 and done.json()["outputs"] == {"paid": 1}, done.text
        assert log.read_text().count("\n") == 1

    serve(tmp_path, test, tools_dir=tmp_path / "tools")


def test_sessions_are_capped_in_number_and_expire_when_idle(tmp_path: Path) -> None:
    import sqlite3

    async def test(client: Client) -> None:
        first, second = await new_session(client), await new_session(client)
        status, type_, message = error(await client.post("/v1/sessions"))
        assert (status, type_) == (507, "too_many_sessions") and "--max-sessions 2" in message
        assert (await client.get("/v1/capabilities")).status_code == 200
        # `first` left unused for longer than --session-idle-timeout.
        with sqlite3.connect(tmp_path / "sessions.db") as conn:
            conn.execute("UPDATE heddle_sessions SET updated = updated - 7200 WHERE id = ?", (first,))
        for response in (await client.get(f"/v1/sessions/{first}"),
                         await client.post("/v1/runs", json={"flow": asking_flow(), "session": first})):
            assert error(response)[:2] == (404, "session_not_found"), response.text
        with sqlite3.connect(tmp_path / "sessions.db") as conn:
            assert [r[0] for r in conn.execute("SELECT id FROM heddle_sessions")] == [second]  # removed
        third = await new_session(client)  # room again
        assert (await client.get(f"/v1/sessions/{third}")).status_code == 200
        with sqlite3.connect(tmp_path / "sessions.db") as conn:
            conn.execute("UPDATE heddle_sessions SET updated = updated - 7200 WHERE id = ?", (second,))
        await new_session(client)  # the expired one is swept to make room
        with sqlite3.connect(tmp_path / "sessions.db") as conn:
            assert second not in [r[0] for r in conn.execute("SELECT id FROM heddle_sessions")]

    serve(tmp_path, test, max_sessions=2, session_idle_timeout=3600.0)


def test_a_record_edited_in_the_store_is_refused_over_http_and_nothing_runs(tmp_path: Path) -> None:
    import sqlite3

    log = tmp_path / "paid.log"
    doc, tools = paying_flow(log)
    write_tools(tmp_path / "tools", tools)

    async def test(client: Client) -> None:
        sid = await new_session(client)
        await client.post("/v1/runs", json={"flow": doc, "session": sid, "inputs": {"amount": 1}})
        with sqlite3.connect(tmp_path / "sessions.db") as conn:
            (data,) = conn.execute("SELECT data FROM heddle_sessions WHERE id = ?", (sid,)).fetchone()
            forged = bytes(data).replace(b'"amount":1}', b'"amount":1000000}').replace(
                fingerprint({"amount": 1}).encode(), fingerprint({"amount": 1000000}).encode())
            conn.execute("UPDATE heddle_sessions SET data = ? WHERE id = ?", (forged, sid))
        for response in (await client.get(f"/v1/sessions/{sid}"),
                         await client.post("/v1/runs", json={"flow": doc, "session": sid,
                                                             "answer": {"approve": True}})):
            status, type_, message = error(response)
            assert (status, type_) == (500, "session_unreadable"), response.text
            assert f"session {sid!r}" in message and "fails its authentication" in message
            assert f"DELETE /v1/sessions/{sid}" in message and str(tmp_path) not in message
        assert not log.exists()
        assert (await client.delete(f"/v1/sessions/{sid}")).status_code == 204

    serve(tmp_path, test, tools_dir=tmp_path / "tools")
