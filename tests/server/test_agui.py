"""AG-UI in-process: `POST /v1/runs?protocol=ag-ui` read by a consumer that checks each event against
ag-ui-protocol's own models and the stream's order: a tool call that waits for approval ends the run
with an interrupt, the answer's run finishes it; refusals keep POST /v1/runs's errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.server.surfaces import PAYING, Client, Sealed, seal_agent, serve, service_of
from tests.support.threaded_model import threaded_model


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with threaded_model([]) as model:
        yield seal_agent(tmp_path_factory.mktemp("agui"), model)


def consume(text: str) -> list[Any]:
    """The stream's events as ag-ui-protocol's models, checked in order as a consumer needs them."""
    from ag_ui.core import Event, EventType
    from pydantic import TypeAdapter

    adapter: TypeAdapter[Any] = TypeAdapter(Event)
    frames = [block for block in text.split("\n\n") if block.strip()]
    assert all(block.startswith("data: ") and "\n" not in block for block in frames), text
    events = [adapter.validate_json(block[len("data: "):]) for block in frames]
    assert events[0].type == EventType.RUN_STARTED and events[-1].type in (EventType.RUN_FINISHED,
                                                                         EventType.RUN_ERROR)
    open_messages: set[str] = set()
    open_steps: list[str] = []
    calls: dict[str, str] = {}  # id -> "open" | "ended"
    state: dict[str, Any] = {}
    for event in events[1:-1]:
        kind = event.type
        if kind == EventType.TEXT_MESSAGE_START:
            open_messages.add(event.message_id)
        elif kind == EventType.TEXT_MESSAGE_CONTENT:
            assert event.message_id in open_messages
        elif kind == EventType.TEXT_MESSAGE_END:
            open_messages.remove(event.message_id)
        elif kind == EventType.STEP_STARTED:
            open_steps.append(event.step_name)
        elif kind == EventType.STEP_FINISHED:
            assert event.step_name in open_steps
            open_steps.remove(event.step_name)
        elif kind == EventType.TOOL_CALL_START:
            calls[event.tool_call_id] = "open"
        elif kind in (EventType.TOOL_CALL_ARGS, EventType.TOOL_CALL_END):
            assert calls[event.tool_call_id] == "open"
            if kind == EventType.TOOL_CALL_END:
                calls[event.tool_call_id] = "ended"
        elif kind == EventType.STATE_SNAPSHOT:
            state = dict(event.snapshot)
        elif kind == EventType.STATE_DELTA:
            for op in event.delta:
                assert op.op == "add" and op.path.startswith("/nodes/")
                state.setdefault("nodes", {})[op.path.split("/", 2)[2]] = op.value
    assert not open_messages and not open_steps, "every text message and step ends before the run does"
    return events


def test_a_run_waits_as_an_interrupt_and_its_answer_finishes_it(sealed: Sealed, tmp_path: Path) -> None:
    from ag_ui.core import EventType

    sealed.script(PAYING)
    service = service_of(sealed, tmp_path)

    async def test(client: Client) -> None:
        assert "ag-ui" in (await client.get("/v1/capabilities")).json()["protocols"]
        sid = (await client.post("/v1/sessions")).json()["session"]
        response = await client.post("/v1/runs?protocol=ag-ui", json={"session": sid, "message": "Pay 5, please."})
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = consume(response.text)
        assert events[0].thread_id == sid
        end = events[-1]
        assert end.type == EventType.RUN_FINISHED and end.outcome.type == "interrupt"
        (interrupt,) = end.outcome.interrupts
        assert interrupt.reason == "approval" and interrupt.metadata["waiting_for"]["tool"] == "pay"
        assert {"approve", "deny"} <= set(json.dumps(interrupt.response_schema).replace('"', " ").split())
        kinds = [e.type for e in events]
        assert EventType.STEP_STARTED in kinds and EventType.STATE_SNAPSHOT in kinds

        # The answer, as the interrupt's schema says: the call runs and the model's answer streams.
        response = await client.post("/v1/runs?protocol=ag-ui", json={"session": sid, "answer": {"approve": True}})
        events = consume(response.text)
        kinds = [e.type for e in events]
        results = [e for e in events if e.type == EventType.TOOL_CALL_RESULT]
        assert [json.loads(r.content) for r in results] == [{"paid": 5}]
        text = "".join(e.delta for e in events if e.type == EventType.TEXT_MESSAGE_CONTENT)
        assert text == "Paid 5."
        assert kinds[-1] == EventType.RUN_FINISHED and events[-1].outcome is None
        assert events[-1].result["outputs"]
        assert EventType.STATE_DELTA in kinds

    serve(service, test)


def test_refusals_keep_the_errors_of_v1_runs_and_an_unserved_protocol_is_refused(sealed: Sealed,
                                                                                tmp_path: Path) -> None:
    service = service_of(sealed, tmp_path, max_concurrent=1)

    async def test(client: Client) -> None:
        missing = await client.post("/v1/runs?protocol=ag-ui", json={"session": "nope", "message": "hi"})
        assert missing.status_code == 404 and missing.json()["error"]["type"] == "session_not_found"
        bad = await client.post("/v1/runs?protocol=ag-ui", json={"message": 3})
        assert bad.status_code == 400 and "'message' must be a string" in bad.json()["error"]["message"]
        ticket = service.admission.admit()
        busy = await client.post("/v1/runs?protocol=ag-ui", json={"message": "hi"})
        assert busy.status_code == 429 and busy.json()["error"]["type"] == "busy"
        ticket.release()
        service.admission.start_draining()
        draining = await client.post("/v1/runs?protocol=ag-ui", json={"message": "hi"})
        assert draining.status_code == 503 and draining.json()["error"]["type"] == "draining"

    serve(service, test)
    unserved = service_of(sealed, tmp_path / "runs-only", serve="runs")

    async def refused(client: Client) -> None:
        response = await client.post("/v1/runs?protocol=ag-ui", json={"message": "hi"})
        assert response.status_code == 400 and response.json()["error"]["type"] == "unknown_protocol"
        assert (await client.get("/v1/capabilities")).json()["serve"] == ["runs"]
        assert (await client.get("/.well-known/agent-card.json")).status_code == 404

    serve(unserved, refused)


def test_an_ag_ui_client_sends_run_agent_input_and_resumes_the_interrupt(sealed: Sealed, tmp_path: Path) -> None:
    from ag_ui.core import RunAgentInput, UserMessage

    sealed.script(PAYING)
    service = service_of(sealed, tmp_path)

    def run_input(thread: str, **fields: Any) -> dict[str, Any]:
        made = RunAgentInput(**{"thread_id": thread, "run_id": "run-1", "state": {}, "messages": [], "tools": [],
                                "context": [], "forwarded_props": {}, **fields})
        return made.model_dump(by_alias=True, exclude_none=True)

    async def test(client: Client) -> None:
        thread = (await client.post("/v1/sessions")).json()["session"]
        said = run_input(thread, messages=[UserMessage(id="u1", role="user", content="Pay 5, please.")])
        events = consume((await client.post("/v1/runs?protocol=ag-ui", json=said)).text)
        assert (events[0].thread_id, events[0].run_id) == (thread, "run-1")
        (interrupt,) = events[-1].outcome.interrupts
        stale = await client.post("/v1/runs?protocol=ag-ui", json=run_input(thread, resume=[
            {"interruptId": "sha256:" + "0" * 64, "status": "resolved", "payload": {"approve": True}}]))
        assert stale.status_code == 400 and stale.json()["error"]["type"] == "stale_answer"
        resumed = run_input(thread, resume=[{"interruptId": interrupt.id, "status": "resolved",
                                             "payload": {"approve": True}}])
        events = consume((await client.post("/v1/runs?protocol=ag-ui", json=resumed)).text)
        assert events[-1].result["outputs"] and events[-1].thread_id == thread

        refused = await client.post("/v1/runs?protocol=ag-ui", json=run_input(thread, tools=[
            {"name": "confirm", "description": "ask", "parameters": {}}]))
        assert refused.status_code == 400 and "frontend tools" in refused.json()["error"]["message"]

    serve(service, test)
