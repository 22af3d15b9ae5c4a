"""Who runs a session's unfinished run: its owner's lease refuses a second taker while it runs, lets one
taker have it once it expired, is renewed while the run goes on, and a run whose record was taken over
stops. In-process, with the store in memory (tests/support/memstore.py) and real tool subprocesses."""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from heddle.engine.journal import Journal
from heddle.errors import SessionConflict
from heddle.runs import execute, from_document
from heddle.sessions.lease import Owner, new_owner
from heddle.sessions.record import Pending, Record, decode
from heddle.sessions.store import Stored
from heddle.sessions.turn import SessionUse, flow_digest
from heddle.settings import RunSettings
from tests.engine.test_sessions import ran, step
from tests.support.flows import FlowDoc, server_tool, write_tool
from tests.support.memstore import MemStore


def _flow(tmp_path: Path, *, wait: Path | None = None) -> tuple[Path, Path, Path]:
    """start -> one -> end; `one` appends to the log, and while the file `wait` exists, waits for it to go."""
    tools, log = tmp_path / "tools", tmp_path / "log"
    hold = f"import time\nwhile os.path.exists({str(wait)!r}):\n    time.sleep(0.02)\n" if wait is not None else ""
    write_tool(tools, "one.py", f"{hold}open({str(log)!r}, 'a').write('one\\n')\nout = {{'a': args['x'] + '1'}}")
    f = FlowDoc("leased")
    s = f.start(["x"])
    one = f.tool_node("one", server_tool("one", ["x"], ["a"]))
    e = f.end(["a"])
    f.control(s, one)
    f.control(one, e)
    return f.write(tmp_path / "flow.json"), tools, log


def _stopped_run(store: MemStore, doc: Path, owner: Owner | None) -> None:
    """The session as a durable run of `doc` that stopped before its first node left it, owned by `owner`."""
    digest = flow_digest(from_document(doc, RunSettings()).flow)
    record = Record(id="chat", digest=digest, document=str(doc), owner=owner,
                    pending=Pending("running", {"x": "x"}, None, Journal().as_json()))
    store.sessions["chat"] = Stored("chat", 3, record.encode(), time.time())


def _elsewhere(until: float) -> Owner:
    return Owner(host="elsewhere", pid=4242, run="0123456789abcdef", until=until, space="another machine")


def test_a_run_whose_lease_is_live_is_refused_naming_its_owner(tmp_path: Path) -> None:
    doc, tools, log = _flow(tmp_path)
    store = MemStore()
    _stopped_run(store, doc, _elsewhere(time.time() + 3600))
    before = store.sessions["chat"]
    with pytest.raises(SessionConflict) as refused:
        step(doc, store, tools=tools, resume=True, durable=True)
    message = str(refused.value)
    assert "is still going on in process 4242 on host elsewhere" in message and "\n" not in message
    assert refused.value.http_status == 409
    assert store.sessions["chat"] == before and ran(log) == []


def test_an_expired_lease_is_taken_over(tmp_path: Path) -> None:
    doc, tools, log = _flow(tmp_path)
    store = MemStore()
    _stopped_run(store, doc, _elsewhere(time.time() - 1))
    done = step(doc, store, tools=tools, resume=True, durable=True)
    assert done.outcome.outputs == {"a": "x1"} and ran(log) == ["one"]
    finished = decode("chat", store.sessions["chat"].data, store="memory")
    assert finished.pending is None and finished.owner is None


def test_a_run_of_this_process_that_ended_is_not_held(tmp_path: Path) -> None:
    # Its process is alive (it is this one), but the run is no longer going on in it.
    doc, tools, _ = _flow(tmp_path)
    store = MemStore()
    _stopped_run(store, doc, new_owner(3600))
    assert step(doc, store, tools=tools, resume=True, durable=True).outcome.outputs == {"a": "x1"}


def test_two_resumes_at_once_one_proceeds(tmp_path: Path) -> None:
    doc, tools, log = _flow(tmp_path)
    store = MemStore()
    _stopped_run(store, doc, _elsewhere(time.time() - 1))

    async def race() -> list[Any]:
        meet = asyncio.Barrier(2)
        store.before_get = lambda: asyncio.wait_for(meet.wait(), 30)  # both read the expired lease
        turns = [execute(from_document(doc, RunSettings(), tools_dir=tools), session=SessionUse(
            store, "chat", resume=True, durable=True)) for _ in range(2)]
        return await asyncio.gather(*turns, return_exceptions=True)

    results = asyncio.run(race())
    store.before_get = None
    refused = [r for r in results if isinstance(r, SessionConflict)]
    assert len(refused) == 1 and [r.outputs for r in results if r not in refused] == [{"a": "x1"}], results
    # The loser read the record before the winner wrote it: its compare-and-swap failed, and it names the
    # winner, which was running then.
    assert f"is still going on in process {os.getpid()} on host " in str(refused[0])
    assert ran(log) == ["one"]


def test_the_owner_renews_its_lease_and_stops_when_its_run_was_taken_over(tmp_path: Path) -> None:
    wait = tmp_path / "wait"
    wait.touch()
    doc, tools, _ = _flow(tmp_path, wait=wait)
    store = MemStore()
    _stopped_run(store, doc, None)
    leases: list[float] = []

    async def run() -> Any:
        use = SessionUse(store, "chat", resume=True, durable=True, lease=0.3)
        going = asyncio.ensure_future(execute(from_document(doc, RunSettings(), tools_dir=tools), session=use))
        while len(leases) < 3:  # the claim, then renewals while the tool waits
            await asyncio.sleep(0.02)
            owner = decode("chat", store.sessions["chat"].data, store="memory").owner
            assert owner is not None
            if not leases or owner.until != leases[-1]:
                leases.append(owner.until)
        # Another process takes the run over (as if this one had stalled past its lease).
        held = store.sessions["chat"]
        taken = decode("chat", held.data, store="memory")
        store.sessions["chat"] = replace(held, version=held.version + 1,
                                         data=replace(taken, owner=_elsewhere(time.time() + 60)).encode())
        try:
            return await going
        finally:
            wait.unlink()

    with pytest.raises(SessionConflict, match="lease expired and another process took the run over"):
        asyncio.run(run())
    assert leases == sorted(leases) and len(set(leases)) == 3
    # Nothing this run did after it lost the record was written over the new owner's.
    now = decode("chat", store.sessions["chat"].data, store="memory").owner
    assert now is not None and now.host == "elsewhere"


def test_a_renewal_under_way_when_the_run_ends_finishes_before_the_runs_last_write() -> None:
    """The store applies a renewal, and the run ends before its answer is back: cut off there, the
    renewal's version would be lost to the run, whose last write would then meet it as another's."""
    from heddle.engine.run import RunOutcome
    from heddle.sessions.turn import Turn, run_turn

    applied = asyncio.Event()

    class AnswersLate(MemStore):
        async def replace(self, session_id: str, data: bytes, *, version: int) -> Stored:
            saved = await super().replace(session_id, data, version=version)
            if decode(session_id, data, store=self.name).running and not applied.is_set():
                applied.set()  # a renewal is in the store; its answer is on its way
                await asyncio.sleep(0.05)
            return saved

    store = AnswersLate()

    async def run(turn: Turn) -> RunOutcome:
        assert turn.journal.checkpoint is not None
        await turn.journal.checkpoint(turn.journal)  # the run's first write: the session is running
        await applied.wait()  # the run ends while the renewal's answer is on its way
        return RunOutcome({"a": "done"}, {"a": "done"})

    async def main() -> Any:
        return await run_turn(SessionUse(store, "chat", durable=True, lease=0.03), digest="sha256:" + "0" * 64,
                              document="doc", inputs={"x": "x"}, inputs_given=True, message=None, run=run)

    done = asyncio.run(main())
    assert done.outcome.outputs == {"a": "done"}
    record = decode("chat", store.sessions["chat"].data, store="memory")
    assert record.status == "idle" and record.turns == 1 and record.owner is None
