"""Runs in a session, in-process: the scripted model through ASGITransport, a store in memory
(tests/support/memstore.py), real tool subprocesses that append to a log, so that what ran is
counted, never timed.

A run that waits stops there and resumes exactly there: what finished is not run again, the
model is not asked again for the turns it answered, a denied tool never runs. The refusals of the
session core (the wrong answer, a session of another document, a race, a record over its cap)
write nothing.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from heddle.canonical import fingerprint
from heddle.engine import events as ev
from heddle.engine.journal import Answer
from heddle.engine.run import RunOutcome
from heddle.errors import (
    DocumentError,
    NeedsSessionError,
    RunError,
    SessionAlreadyAnswered,
    SessionConflict,
    SessionError,
    SessionTooLarge,
    ToolError,
)
from heddle.runs import execute, from_document
from heddle.sessions.record import decode
from heddle.sessions.store import MAX_SESSION_BYTES
from heddle.sessions.turn import SessionUse, Turn, flow_digest, run_turn
from heddle.settings import CLI, RunSettings
from tests.support.flows import FlowDoc, llm_config, prop, server_tool, write_tool
from tests.support.inproc import URL, served_model
from tests.support.memstore import MemStore


@dataclass
class Step:
    outcome: RunOutcome
    requests: list[dict[str, Any]]
    events: list[ev.Event]


def step(doc: Path, store: MemStore, session: str = "chat", *, tools: Path | None = None,
         inputs: Mapping[str, Any] | None = None, message: str | None = None,
         answer: Mapping[str, Any] | None = None, resume: bool = False, durable: bool = False,
         script: Iterable[dict[str, Any]] = ()) -> Step:
    """One `heddle run DOC --session NAME ...` in-process: its outcome, the model requests it made, its events."""
    events: list[ev.Event] = []
    with served_model(list(script)) as model:
        loaded = from_document(doc, RunSettings(), tools_dir=tools, inputs=inputs)
        use = SessionUse(store, session, answer=Answer.from_json(dict(answer)) if answer is not None else None,
                         resume=resume, durable=durable, surface=CLI)
        outcome = asyncio.run(execute(loaded, message=message, on_event=events.append, transport=model.transport,
                                      session=use, inputs_given=inputs is not None))
        return Step(outcome, model.requests(), events)


def logging_tool(tools: Path, name: str, log: Path, out: str) -> None:
    """A tool that appends its name to `log` (so each run of it is counted) and gives `out`."""
    write_tool(tools, f"{name}.py", f"open({str(log)!r}, 'a').write({name!r} + '\\n')\nout = {out}")


def ran(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def unchanged(store: MemStore, session: str, before: tuple[int, bytes], writes: int) -> bool:
    now = store.sessions.get(session)
    assert now is not None
    return (now.version, now.data) == before and store.writes == writes


# ------------------------------------------------------------------ each kind of wait

def waiting_flow(tmp_path: Path, kind: str) -> tuple[Path, Path, Path]:
    """start(x) -> count (a tool) -> the node that waits -> end: the document, its tools, the log."""
    tools, log = tmp_path / "tools", tmp_path / "log"
    logging_tool(tools, "count", log, "{'counted': args['x'] + '!'}")
    f = FlowDoc(f"waits-{kind}")
    s = f.start(["x"])
    count = f.tool_node("count", server_tool("count", ["x"], ["counted"]))
    if kind == "message":
        wait = f._node("InputMessageNode", "ask", ["counted"], ["user_input"], message="Go on after {{counted}}?")
        outputs = ["counted", "user_input"]
    elif kind == "approval":
        logging_tool(tools, "stamp", log, "{'stamped': args['counted'] + ' stamped'}")
        wait = f.tool_node("ask", {**server_tool("stamp", ["counted"], ["stamped"]), "requires_confirmation": True})
        outputs = ["counted", "stamped"]
    else:
        client = {"component_type": "ClientTool", "id": "lookup", "name": "lookup", "inputs": [prop("counted")],
                  "outputs": [prop("found")]}
        wait = f.tool_node("ask", client)
        outputs = ["counted", "found"]
    e = f.end(outputs)
    f.control(s, count)
    f.control(count, wait)
    f.control(wait, e)
    return f.write(tmp_path / "flow.json"), tools, log


@pytest.mark.parametrize(("kind", "answer", "expected", "runs"), [
    ("message", {"message": "yes"}, {"user_input": "yes"}, ["count"]),
    ("approval", {"approve": True}, {"stamped": "a! stamped"}, ["count", "stamp"]),
    ("client_tool", {"tool_result": "in the shed"}, {"found": "in the shed"}, ["count"]),
])
def test_each_kind_of_wait_stops_there_and_resumes_exactly_there(tmp_path: Path, kind: str, answer: dict[str, Any],
                                                                  expected: dict[str, Any], runs: list[str]) -> None:
    doc, tools, log = waiting_flow(tmp_path, kind)
    store = MemStore()
    first = step(doc, store, tools=tools, inputs={"x": "a"})
    waiting = first.outcome.waiting
    assert waiting is not None and (waiting.kind, waiting.node) == (kind, "ask")
    assert first.outcome.state == {} and first.outcome.outputs == {}
    last = first.events[-1]
    assert isinstance(last, ev.Waiting) and last.waiting_for == waiting.as_json()
    assert not [e for e in first.events if isinstance(e, ev.FlowComplete)]
    if kind == "message":
        assert waiting.prompt == "Go on after a!?"
    else:
        assert waiting.tool == ("stamp" if kind == "approval" else "lookup")
        assert waiting.arguments == {"counted": "a!"}
    assert ran(log) == ["count"]
    assert decode("chat", store.sessions["chat"].data, store="memory").status == "waiting"

    second = step(doc, store, tools=tools, answer=answer)
    assert second.outcome.waiting is None
    assert second.outcome.outputs == {"counted": "a!", **expected}
    assert ran(log) == runs  # count ran once over both steps
    # The resumed step replays `count` from the journal: no event says it ran again.
    assert not [e for e in second.events if isinstance(e, ev.NodeStart) and e.node == "count"]
    record = decode("chat", store.sessions["chat"].data, store="memory")
    # Version 2 claimed the answer before anything ran; 3 is the finished turn.
    assert (record.status, record.turns, store.sessions["chat"].version) == ("idle", 1, 3)


def confirm_agent(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A top-level agent with one tool that needs a person's approval of each call."""
    tools, log = tmp_path / "tools", tmp_path / "log"
    logging_tool(tools, "stamp", log, "{'stamped': args['text'] + ' stamped'}")
    doc = {"component_type": "Agent", "agentspec_version": "26.1.0", "id": "clerk", "name": "clerk",
           "llm_config": llm_config(URL), "system_prompt": "You stamp.",
           "tools": [{**server_tool("stamp", ["text"], ["stamped"]), "requires_confirmation": True}]}
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(doc))
    return path, tools, log


CALL = {"tool_calls": [{"name": "stamp", "arguments": {"text": "form"}}]}


def test_an_approved_call_runs_once_and_the_model_is_not_asked_again_for_the_turn_before(tmp_path: Path) -> None:
    doc, tools, log = confirm_agent(tmp_path)
    store = MemStore()
    first = step(doc, store, tools=tools, message="stamp the form", script=[CALL])
    assert first.outcome.waiting is not None and first.outcome.waiting.as_json() == {
        "kind": "approval", "node": first.outcome.waiting.node, "tool": "stamp", "arguments": {"text": "form"},
        "fingerprint": fingerprint({"text": "form"})}
    assert len(first.requests) == 1 and ran(log) == []
    second = step(doc, store, tools=tools, answer={"approve": True}, script=[{"content": "Stamped."}])
    assert second.outcome.outputs == {"result": "Stamped."}
    assert len(second.requests) == 1 and ran(log) == ["stamp"]
    sent = second.requests[0]["body"]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[1]["content"] == "stamp the form" and "form stamped" in sent[-1]["content"]


def test_an_approval_is_bound_to_the_arguments_shown_and_a_call_with_others_never_runs(tmp_path: Path) -> None:
    doc, tools, log = confirm_agent(tmp_path)
    store = MemStore()
    first = step(doc, store, tools=tools, message="stamp the form", script=[CALL])
    assert first.outcome.waiting is not None and first.outcome.waiting.fingerprint == fingerprint({"text": "form"})
    # The record edited behind heddle's back (this store seals nothing): the wait still shows "form", the
    # model's recorded call the run replays now asks for "FORGED".
    stored = store.sessions["chat"]
    record = json.loads(stored.data)
    journal = record["pending"]["journal"]
    journal["entries"] = json.loads(json.dumps(journal["entries"]).replace("form", "FORGED"))
    assert "FORGED" in json.dumps(journal) and record["pending"]["waiting_for"]["arguments"] == {"text": "form"}
    store.sessions["chat"] = replace(stored, data=json.dumps(record).encode())
    with pytest.raises(SessionError, match=r"other than those the answer was given for.*it is not run"):
        step(doc, store, tools=tools, answer={"approve": True}, script=[{"content": "Stamped."}])
    assert ran(log) == []

    # An answer that names another call than the one waiting is refused before anything runs.
    again = MemStore()
    step(doc, again, tools=tools, message="stamp the form", script=[CALL])
    before, writes = (again.sessions["chat"].version, again.sessions["chat"].data), again.writes
    with pytest.raises(SessionConflict, match="the answer was given for another call, and nothing ran"):
        step(doc, again, tools=tools, answer={"approve": True, "fingerprint": fingerprint({"text": "other"})})
    assert unchanged(again, "chat", before, writes) and ran(log) == []
    done = step(doc, again, tools=tools, answer={"approve": True, "fingerprint": fingerprint({"text": "form"})},
                script=[{"content": "Stamped."}])
    assert done.outcome.outputs == {"result": "Stamped."} and ran(log) == ["stamp"]


def test_an_answer_taken_is_never_taken_again_even_after_its_run_was_stopped(tmp_path: Path) -> None:
    doc, tools, log = waiting_flow(tmp_path, "approval")
    store = MemStore()
    assert step(doc, store, tools=tools, inputs={"x": "a"}).outcome.waiting is not None
    record = decode("chat", store.sessions["chat"].data, store="memory")

    async def stopped(turn: Turn) -> RunOutcome:
        raise asyncio.CancelledError  # the process stops (a crash, a kill) once the answer is taken

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run_turn(SessionUse(store, "chat", answer=Answer("approval", approved=True)),
                             digest=record.digest, document=record.document, inputs={}, inputs_given=False,
                             message=None, run=stopped))
    taken = decode("chat", store.sessions["chat"].data, store="memory")
    assert taken.status == "interrupted" and taken.pending is not None and taken.pending.answered is not None
    # Another answer while it is taken (its run may still be going on) is refused, and runs nothing.
    for answer in ({"approve": True}, {"deny": "no"}):
        with pytest.raises(SessionAlreadyAnswered, match=r"was already answered .* this one ran nothing"):
            step(doc, store, tools=tools, answer=answer)
    # --resume goes on from there, and asks again rather than take the same answer a second time.
    resumed = step(doc, store, tools=tools, resume=True)
    assert resumed.outcome.waiting is not None and resumed.outcome.waiting.tool == "stamp"
    assert ran(log) == ["count"]
    assert step(doc, store, tools=tools, answer={"approve": True}).outcome.outputs["stamped"] == "a! stamped"
    assert ran(log) == ["count", "stamp"]


def test_a_denied_call_never_runs_and_the_model_is_told_why(tmp_path: Path) -> None:
    doc, tools, log = confirm_agent(tmp_path)
    store = MemStore()
    assert step(doc, store, tools=tools, message="stamp the form", script=[CALL]).outcome.waiting is not None
    second = step(doc, store, tools=tools, answer={"deny": "not on a Sunday"},
                  script=[{"content": "I did not stamp it."}])
    assert second.outcome.outputs == {"result": "I did not stamp it."}
    assert ran(log) == []
    told = second.requests[0]["body"]["messages"][-1]
    assert told["role"] == "tool" and "not on a Sunday" in told["content"] and "denied" in told["content"]


def test_a_client_tool_an_agent_calls_waits_for_its_result_and_the_model_gets_it(tmp_path: Path) -> None:
    doc = tmp_path / "agent.json"
    client = {"component_type": "ClientTool", "id": "ct", "name": "lookup", "inputs": [prop("q")],
              "outputs": [prop("found")]}
    doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "a",
                               "llm_config": llm_config(URL), "system_prompt": "You help.", "tools": [client]}))
    store = MemStore()
    call = {"tool_calls": [{"name": "lookup", "arguments": {"q": "keys"}}]}
    first = step(doc, store, message="where?", script=[call])
    assert first.requests[0]["body"]["tools"][0]["function"]["name"] == "lookup"  # offered to the model
    assert first.outcome.waiting is not None and first.outcome.waiting.arguments == {"q": "keys"}
    # Called, not failed: the result is the client's to give.
    assert [e.type for e in first.events if e.type in ("tool_call", "tool_result")] == ["tool_call"]
    second = step(doc, store, answer={"tool_result": {"found": "in the door"}},
                  script=[{"content": "In the door."}])
    assert second.outcome.outputs == {"result": "In the door."} and len(second.requests) == 1
    told = second.requests[0]["body"]["messages"][-1]
    assert told["role"] == "tool" and json.loads(told["content"]) == {"found": "in the door"}


def test_a_message_answers_an_agent_that_asked_the_user(tmp_path: Path) -> None:
    # human_in_the_loop (true unless written false) in a flow: prose where its outputs were asked
    # for is a question to the user, and the reply continues the same turn.
    f = FlowDoc("triage")
    s = f.start(["query"])
    a = f.agent("triage", URL, inputs=("query",), outputs=("topic", "summary"))
    e = f.end(["topic", "summary"])
    f.control(s, a)
    f.control(a, e)
    doc = f.write(tmp_path / "flow.json")
    store = MemStore()
    first = step(doc, store, inputs={"query": "my wifi drops"}, script=[{"content": "Which laptop do you use?"}])
    waiting = first.outcome.waiting
    assert waiting is not None and (waiting.kind, waiting.node, waiting.prompt) == (
        "message", "triage", "Which laptop do you use?")
    second = step(doc, store, message="A Dell",
                  script=[{"content": json.dumps({"topic": "wifi", "summary": "a Dell drops wifi"})}])
    assert second.outcome.outputs == {"topic": "wifi", "summary": "a Dell drops wifi"}
    assert len(second.requests) == 1
    sent = second.requests[0]["body"]["messages"]
    assert sent[-2:] == [{"role": "assistant", "content": "Which laptop do you use?"},
                         {"role": "user", "content": "A Dell"}]


# ------------------------------------------------------------------ refusals that write nothing

def test_the_wrong_answer_and_an_answer_to_nothing_are_refused_naming_what_is_awaited(tmp_path: Path) -> None:
    doc, tools, log = waiting_flow(tmp_path, "message")
    store = MemStore()
    step(doc, store, tools=tools, inputs={"x": "a"})
    held = store.sessions["chat"]
    before, writes = (held.version, held.data), store.writes
    for wrong in ({"approve": True}, {"tool_result": {"a": 1}}):
        with pytest.raises(SessionError) as err:
            step(doc, store, tools=tools, answer=wrong)
        assert "waits for a message at node 'ask'" in str(err.value) and "--message TEXT" in str(err.value)
        assert unchanged(store, "chat", before, writes)
    with pytest.raises(SessionError) as err:
        step(doc, store, tools=tools)
    assert "waits for a message at node 'ask'; answer with --message TEXT" in str(err.value)
    assert ran(log) == ["count"]
    step(doc, store, tools=tools, answer={"message": "ok"})
    held = store.sessions["chat"]
    before, writes = (held.version, held.data), store.writes
    with pytest.raises(SessionError) as err:
        step(doc, store, tools=tools, answer={"message": "again?"})
    assert "waits for nothing" in str(err.value) and unchanged(store, "chat", before, writes)
    assert ran(log) == ["count"]


def test_a_session_resumes_only_with_the_document_that_opened_it(tmp_path: Path) -> None:
    doc, tools, _ = waiting_flow(tmp_path, "message")
    other, other_tools, _ = waiting_flow(tmp_path / "other", "approval")
    store = MemStore()
    step(doc, store, tools=tools, inputs={"x": "a"})
    held = store.sessions["chat"]
    mine = flow_digest(from_document(doc, RunSettings(), tools_dir=tools).flow)
    theirs = flow_digest(from_document(other, RunSettings(), tools_dir=other_tools).flow)
    assert mine != theirs and mine.startswith("sha256:")
    with pytest.raises(SessionError) as err:
        step(other, store, tools=other_tools, answer={"message": "yes"})
    assert mine in str(err.value) and theirs in str(err.value)
    assert unchanged(store, "chat", (held.version, held.data), 1)


def test_two_turns_racing_on_one_session_get_one_conflict(tmp_path: Path) -> None:
    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "a",
                               "llm_config": llm_config(URL), "system_prompt": "You help."}))
    store = MemStore()
    step(doc, store, message="hi", script=[{"content": "hello"}])
    # Both turns read the session before either writes it back.
    async def race(transport: Any) -> list[RunOutcome | BaseException]:
        meet = asyncio.Barrier(2)
        store.before_get = lambda: asyncio.wait_for(meet.wait(), 30)
        turns = [execute(from_document(doc, RunSettings()), message=text, transport=transport,
                         session=SessionUse(store, "chat"), inputs_given=False) for text in ("one", "two")]
        return await asyncio.gather(*turns, return_exceptions=True)

    with served_model([{"content": "first"}, {"content": "second"}]) as model:
        results = asyncio.run(race(model.transport))
    store.before_get = None
    conflicts = [r for r in results if isinstance(r, SessionConflict)]
    done = [r for r in results if isinstance(r, RunOutcome)]
    assert len(conflicts) == 1 and len(done) == 1, results
    assert "another run took its turn first" in str(conflicts[0]) and conflicts[0].http_status == 409
    record = decode("chat", store.sessions["chat"].data, store="memory")
    assert (store.sessions["chat"].version, record.turns) == (2, 2)


def test_a_top_level_agents_second_turn_sends_the_first_turns_history(tmp_path: Path) -> None:
    doc = tmp_path / "agent.json"
    doc.write_text(json.dumps({"component_type": "Agent", "agentspec_version": "26.1.0", "id": "a", "name": "a",
                               "llm_config": llm_config(URL), "system_prompt": "You help."}))
    store = MemStore()
    assert step(doc, store, message="hi", script=[{"content": "hello"}]).outcome.outputs == {"result": "hello"}
    second = step(doc, store, message="again", script=[{"content": "hello again"}])
    assert second.outcome.outputs == {"result": "hello again"}
    assert second.requests[0]["body"]["messages"] == [
        {"role": "system", "content": "You help."}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]


def test_without_a_session_a_document_that_may_wait_is_refused_before_anything_runs(tmp_path: Path) -> None:
    doc, tools, log = waiting_flow(tmp_path, "message")
    with pytest.raises(NeedsSessionError) as err:
        asyncio.run(execute(from_document(doc, RunSettings(), tools_dir=tools, inputs={"x": "a"})))
    assert "InputMessageNode 'ask' waits for the user's message" in str(err.value)
    assert "--session NAME" in str(err.value) and err.value.exit_code == 2
    # An agent that may call a tool requiring confirmation runs; its call ends the run, naming --session.
    agent, tools, log = confirm_agent(tmp_path / "agent")
    with served_model([CALL]) as model:
        with pytest.raises(NeedsSessionError) as err:
            asyncio.run(execute(from_document(agent, RunSettings(), tools_dir=tools), message="stamp it",
                                transport=model.transport))
        assert len(model.requests()) == 1
    assert "waits for an approval" in str(err.value) and "--session NAME" in str(err.value)
    assert ran(log) == []


def test_a_wait_inside_a_parallel_subflow_is_refused_when_the_document_is_read(tmp_path: Path) -> None:
    from heddle.agentspec import load_flow

    sub = FlowDoc("branch")
    s = sub.start([], name="branch-start")
    ask = sub._node("InputMessageNode", "ask", [], ["user_input"], message="Which?")
    e = sub.end(["user_input"], name="branch-end")
    sub.control(s, ask)
    sub.control(ask, e)
    outer = FlowDoc("outer")
    start = outer.start([])
    both = outer._node("ParallelFlowNode", "both", [], [prop("user_input")], subflows=[sub.document()])
    end = outer.end([])
    outer.control(start, both)
    outer.control(both, end)
    with pytest.raises(DocumentError) as err:
        load_flow(outer.write(tmp_path / "flow.json"))
    message = str(err.value)
    assert "InputMessageNode 'ask' waits for the user's message" in message
    assert "inside ParallelFlowNode 'both'" in message and "not supported" in message and "\n" not in message


# ------------------------------------------------------------------ --durable, MapNode, the size cap

def test_a_durable_run_checkpoints_each_node_and_resumes_after_the_last_that_finished(tmp_path: Path) -> None:
    tools, log, broken = tmp_path / "tools", tmp_path / "log", tmp_path / "broken"
    logging_tool(tools, "one", log, "{'a': args['x'] + '1'}")
    logging_tool(tools, "two", log, "{'b': args['a'] + '2'}")
    # `three` fails while the file `broken` exists: the run stops after node two, as a killed one would.
    write_tool(tools, "three.py", f"if os.path.exists({str(broken)!r}):\n    sys.exit('broken')\n"
                                  f"open({str(log)!r}, 'a').write('three\\n')\nout = {{'c': args['b'] + '3'}}")
    broken.write_text("")
    f = FlowDoc("durable")
    s = f.start(["x"])
    one = f.tool_node("one", server_tool("one", ["x"], ["a"]))
    two = f.tool_node("two", server_tool("two", ["a"], ["b"]))
    three = f.tool_node("three", server_tool("three", ["b"], ["c"]))
    e = f.end(["c"])
    for a, b in ((s, one), (one, two), (two, three), (three, e)):
        f.control(a, b)
    doc = f.write(tmp_path / "flow.json")

    written: list[bytes] = []
    store = MemStore()
    keep = store._put

    def put(stored: Any) -> Any:
        written.append(stored.data)
        return keep(stored)

    store._put = put  # type: ignore[method-assign]
    # Refused at its StartNode (no input x): the run never started, so it left no checkpoint.
    with pytest.raises(RunError):
        step(doc, store, tools=tools, inputs={}, durable=True)
    assert store.sessions == {} and written == []
    with pytest.raises(ToolError):
        step(doc, store, tools=tools, inputs={"x": "x"}, durable=True)
    assert ran(log) == ["one", "two"]
    # A checkpoint after each node that finished: start, one, two, each naming its owner; then the run that
    # failed lets go of its lease (its checkpoint and the steps since, owned by nobody): only --resume
    # continues it.
    records = [decode("chat", data, store="memory") for data in written]
    checkpoints = [r.pending for r in records]
    assert [p.status if p else None for p in checkpoints] == ["running"] * 4
    assert [len(p.journal["entries"]) for p in checkpoints[:3] if p] == [1, 2, 3]
    assert [r.owner is not None for r in records] == [True, True, True, False]
    with pytest.raises(SessionError) as err:
        step(doc, store, tools=tools)
    assert "did not finish" in str(err.value) and "--resume" in str(err.value)

    broken.unlink()
    written.clear()
    resumed = step(doc, store, tools=tools, resume=True, durable=True)
    assert resumed.outcome.outputs == {"c": "x123"}
    assert ran(log) == ["one", "two", "three"]  # nodes one and two did not run again
    assert [e.node for e in resumed.events if isinstance(e, ev.NodeStart)] == ["three", "end"]
    # The resume claimed before anything ran, the checkpoint after `three`, then the turn's record.
    assert len(written) == 3 and decode("chat", written[-1], store="memory").pending is None


def test_parallel_branches_of_a_durable_run_checkpoint_one_at_a_time(tmp_path: Path) -> None:
    tools, log = tmp_path / "tools", tmp_path / "log"
    logging_tool(tools, "echo", log, "{'y': args['x']}")

    def branch(name: str) -> dict[str, Any]:
        sub = FlowDoc(name)
        s = sub.start(["x"], name=f"{name}-start")
        t = sub.tool_node(f"{name}-echo", server_tool("echo", ["x"], ["y"]))
        e = sub.end([], name=f"{name}-end")
        sub.control(s, t)
        sub.control(t, e)
        return {**sub.document(), "inputs": [prop("x")], "outputs": []}

    f = FlowDoc("fan-out")
    s = f.start(["x"])
    both = f._node("ParallelFlowNode", "all", ["x"], [], subflows=[branch("a"), branch("b"), branch("c")])
    e = f.end([])
    f.control(s, both)
    f.control(both, e)
    store = MemStore()
    # Each branch's nodes write a checkpoint as they finish, concurrently: none may take another's version.
    done = step(f.write(tmp_path / "flow.json"), store, tools=tools, inputs={"x": "v"}, durable=True)
    assert done.outcome.waiting is None and ran(log) == ["echo"] * 3
    assert decode("chat", store.sessions["chat"].data, store="memory").status == "idle"
    assert store.writes == store.sessions["chat"].version > 3


def test_map_iterations_journal_apart(tmp_path: Path) -> None:
    tools, log = tmp_path / "tools", tmp_path / "log"
    logging_tool(tools, "count", log, "{'counted': args['x'] + '!'}")
    sub = FlowDoc("each")
    s = sub.start(["x"], name="each-start")
    count = sub.tool_node("count", server_tool("count", ["x"], ["counted"]))
    ask = sub._node("InputMessageNode", "ask", [prop("counted")], ["user_input"], message="About {{counted}}?")
    e = sub.end(["counted", "user_input"], name="each-end")
    sub.control(s, count)
    sub.control(count, ask)
    sub.control(ask, e)
    each = {**sub.document(), "inputs": [prop("x")], "outputs": [prop("counted"), prop("user_input")]}
    f = FlowDoc("map")
    start = f.start([prop("iterated_x", "array", items={"type": "string"})])
    m = f._node("MapNode", "map", [prop("iterated_x", "array", items={"type": "string"})],
                [prop("collected_counted", "array"), prop("collected_user_input", "array")],
                subflow=each, reducers={"counted": "append", "user_input": "append"})
    end = f.end([prop("collected_counted", "array"), prop("collected_user_input", "array")])
    f.control(start, m)
    f.control(m, end)
    doc = f.write(tmp_path / "flow.json")
    store = MemStore()
    first = step(doc, store, tools=tools, inputs={"iterated_x": ["a", "b"]})
    assert first.outcome.waiting is not None and first.outcome.waiting.prompt == "About a!?"
    second = step(doc, store, tools=tools, message="yes to a")
    assert second.outcome.waiting is not None and second.outcome.waiting.prompt == "About b!?"
    third = step(doc, store, tools=tools, message="yes to b")
    assert third.outcome.outputs == {"collected_counted": ["a!", "b!"],
                                     "collected_user_input": ["yes to a", "yes to b"]}
    assert ran(log) == ["count", "count"]  # once per iteration over the three steps


def test_a_session_record_over_its_cap_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    f = FlowDoc("big")
    s = f.start(["text"])
    ask = f._node("InputMessageNode", "ask", [], ["user_input"], message="Well?")
    e = f.end(["user_input"])
    f.control(s, ask)
    f.control(ask, e)
    doc = f.write(tmp_path / "flow.json")
    store = MemStore()
    # The waiting run keeps its input, so the record would be over the cap.
    with pytest.raises(SessionTooLarge) as err:
        step(doc, store, inputs={"text": "x" * MAX_SESSION_BYTES})
    assert err.value.http_status == 413 and "over the cap" in str(err.value)
    assert store.sessions == {} and store.writes == 0


# ------------------------------------------------------------------ the library

def test_the_librarys_session_arguments_are_checked_before_anything_runs(tmp_path: Path) -> None:
    import heddle
    from heddle.errors import UsageError

    doc, tools, log = waiting_flow(tmp_path, "approval")
    db = RunSettings(session_db=tmp_path / "sessions.db")
    for wrong, named in (({"answer": {"approve": True}}, "answer"), ({"resume": True}, "resume"),
                         ({"settings": RunSettings(durable=True)}, "settings.durable")):
        with pytest.raises(UsageError, match=f"^{named}: for a run in a session; give session=NAME too"):
            heddle.run(doc, tools_dir=tools, inputs={"x": "a"}, **wrong)
    with pytest.raises(SessionError, match=re.escape("session name '../up' is not valid")):
        heddle.run(doc, tools_dir=tools, inputs={"x": "a"}, session="../up", settings=db)
    with pytest.raises(SessionError, match="answer: 'approve' with str is not an answer"):
        heddle.run(doc, tools_dir=tools, session="s", answer={"approve": "yes"}, settings=db)
    with pytest.raises(UsageError, match=re.escape("settings.session_dir is for the file session store")):
        heddle.run(doc, tools_dir=tools, inputs={"x": "a"}, session="s",
                   settings=RunSettings(session_dir=tmp_path / "dir"))
    assert ran(log) == [] and not (tmp_path / "sessions.db").exists() and not (tmp_path / "dir").exists()
    waiting = heddle.run(doc, tools_dir=tools, inputs={"x": "a"}, session="s", settings=db)
    assert (waiting.session, waiting.waiting) == ("s", {"kind": "approval", "node": "ask", "tool": "stamp",
                                                        "arguments": {"counted": "a!"},
                                                        "fingerprint": fingerprint({"counted": "a!"})})
    assert waiting.state == {} and isinstance(waiting.events[-1], heddle.Waiting)
    done = heddle.run(doc, tools_dir=tools, session="s", answer={"approve": True}, settings=db)
    assert done.waiting is None and done.outputs == {"counted": "a!", "stamped": "a! stamped"}
    assert ran(log) == ["count", "stamp"]
