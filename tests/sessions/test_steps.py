"""A durable run's steps, in-process: each model and tool call's intent before it and its result after,
appended beside the record (sealed) and replayed on resume; the typed journal refusing to hand one
call's result to another; the record's format and writer named (heddle.engine.journal,
heddle.sessions.steps, heddle.sessions.record)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from heddle.canonical import dumps
from heddle.engine.run import RunOutcome
from heddle.errors import SessionUnreadable, StoreUnavailable
from heddle.runs import execute, from_document
from heddle.sessions.record import FORMAT, decode
from heddle.sessions.seal import SealedStore
from heddle.sessions.sqlite import SqliteStore
from heddle.sessions.store import SessionStore
from heddle.sessions.turn import SessionUse
from heddle.settings import RunSettings
from tests.support.flows import llm_config, server_tool, write_tool
from tests.support.inproc import URL, served_model
from tests.support.memstore import MemStore


def _agent(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A top-level agent with the tool `tick`, which logs its idempotency key and argument."""
    tools, log = tmp_path / "tools", tmp_path / "log"
    write_tool(tools, "tick.py", f"open({str(log)!r}, 'a').write(os.environ['HEDDLE_IDEMPOTENCY_KEY'] + ' ' + "
                                 "str(args['n']) + '\\n')\nout = {'m': args['n'] + 1}")
    tick = server_tool("tick", [{"title": "n", "type": "integer"}], [{"title": "m", "type": "integer"}])
    doc = {"component_type": "Agent", "agentspec_version": "26.1.0", "id": "ticker", "name": "ticker",
           "llm_config": llm_config(URL), "system_prompt": "You tick.", "tools": [tick]}
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(doc))
    return path, tools, log


def _call(n: int) -> dict[str, Any]:
    return {"tool_calls": [{"name": "tick", "arguments": {"n": n}}]}


def _turn(doc: Path, tools: Path, store: SessionStore, script: Iterable[dict[str, Any]], *,
          resume: bool = False) -> tuple[RunOutcome, list[dict[str, Any]]]:
    with served_model(list(script)) as model:
        loaded = from_document(doc, RunSettings(), tools_dir=tools)
        use = SessionUse(store, "chat", resume=resume, durable=not resume)
        done = asyncio.run(execute(loaded, message=None if resume else "tick twice", transport=model.transport,
                                   session=use))
        return done, model.requests()


def _logged(log: Path) -> list[tuple[str, int]]:
    return [(key, int(n)) for key, n in (line.split() for line in log.read_text().splitlines())]


class LosesAResult(MemStore):
    """A store that fails to append the result of the second tool call, once: as if the process died
    after the tool ran and before its result was kept."""

    def __init__(self) -> None:
        super().__init__()
        self.results = 0
        self.appended: list[tuple[int, str]] = []  # (the record's version, the entry's type)
        self.died_at: int | None = None  # the record writes when it died

    async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
        if b'"type":"tool_done"' in data:
            self.results += 1
            if self.results == 2:
                self.died_at = self.writes
                raise StoreUnavailable("memory: the process died here")
        self.appended.append((base, json.loads(data)["entry"]["type"]))
        await super().append_step(session_id, base, seq, data)


def test_a_step_whose_result_was_lost_runs_again_with_its_key_and_a_completed_one_never(tmp_path: Path) -> None:
    doc, tools, log = _agent(tmp_path)
    store = LosesAResult()
    with pytest.raises(StoreUnavailable):
        _turn(doc, tools, store, [_call(0), _call(1), {"content": "never asked"}])
    (first, zero), (second, one) = _logged(log)
    assert (zero, one) == (0, 1) and first.startswith("hk-") and second.startswith("hk-") and first != second
    # The record was written at the StartNode's checkpoint alone: every call since is a step appended beside it.
    assert store.died_at == 1
    assert store.appended == [(1, t) for t in ("intent", "model", "intent", "tool_done", "intent", "model", "intent")]

    done, asked = _turn(doc, tools, store, [{"content": "ticked"}], resume=True)
    assert done.waiting is None
    # The call whose result was lost ran again, with the key it had; the one that completed did not.
    assert _logged(log) == [(first, 0), (second, 1), (second, 1)]
    # The model was asked only for what the journal did not hold: the turn after the last tool result.
    assert len(asked) == 1 and [m["role"] for m in asked[0]["body"]["messages"]][-2:] == ["assistant", "tool"]
    assert decode("chat", store.sessions["chat"].data, store="memory").status == "idle"
    assert store.steps_kept == {}  # the finished turn's record holds all; the steps are dropped


def test_replay_refuses_a_recorded_result_of_another_call_naming_its_position(tmp_path: Path) -> None:
    doc, tools, log = _agent(tmp_path)
    store = LosesAResult()
    with pytest.raises(StoreUnavailable):
        _turn(doc, tools, store, [_call(0), _call(1), {"content": "never asked"}])
    ran = log.read_text()
    # The first call's recorded result edited into one of another tool (this store seals nothing), in the
    # steps or in the record that holds them now: on the code before typed entries, replay handed it to
    # the call of `tick` at that position.
    edited = 0
    for steps in store.steps_kept.values():
        for seq, line in steps.items():
            if b'"tool_done"' in line:
                steps[seq], edited = line.replace(b'"name":"tick"', b'"name":"tock"'), edited + 1
    stored = store.sessions["chat"]
    if b'"tool_done"' in stored.data:
        store.sessions["chat"] = replace(stored, data=stored.data.replace(b'"name":"tick","output"',
                                                                          b'"name":"tock","output"'))
        edited += 1
    assert edited == 1
    with pytest.raises(SessionUnreadable) as refused:
        _turn(doc, tools, store, [{"content": "ticked"}], resume=True)
    message = str(refused.value)
    assert "at journal position /" in message and "/2t" in message and "tool 'tock'" in message
    assert "a call to tool 'tick'" in message and "\n" not in message
    assert log.read_text() == ran  # nothing ran


def test_steps_are_appended_sealed_and_dropped_with_the_checkpoint(tmp_path: Path) -> None:
    doc, tools, log = _agent(tmp_path)
    raw = SqliteStore(tmp_path / "s.db")
    store = SealedStore(raw, b"k" * 32)

    class Dies(SealedStore):
        """Dies before its fourth step is kept: nothing more is written (as a killed process writes nothing)."""

        dead = False

        async def append_step(self, session_id: str, base: int, seq: int, data: bytes) -> None:
            if seq == 4:
                self.dead = True
                raise StoreUnavailable("killed")
            await super().append_step(session_id, base, seq, data)

        async def replace(self, session_id: str, data: bytes, *, version: int) -> Any:
            if self.dead:
                raise StoreUnavailable("killed")
            return await super().replace(session_id, data, version=version)

    with pytest.raises(StoreUnavailable):
        _turn(doc, tools, Dies(raw, b"k" * 32), [_call(0), {"content": "never asked"}])
    with sqlite3.connect(tmp_path / "s.db") as conn:
        rows = conn.execute("SELECT base, seq, data FROM heddle_steps ORDER BY seq").fetchall()
        assert [(b, s) for b, s, _ in rows] == [(1, 1), (1, 2), (1, 3)]
        assert all(bytes(d).startswith(b'{"mac":"hmac-sha256:') for _, _, d in rows)
        # A step edited outside heddle fails its check, naming the session and the step.
        forged = bytes(rows[1][2]).replace(b'"finish_reason":"tool_calls"', b'"finish_reason":"stop"')
        conn.execute("UPDATE heddle_steps SET data = ? WHERE seq = 2", (forged,))
    with pytest.raises(SessionUnreadable, match=r"session 'chat' in sqlite .*: its step 2 fails its authentication"):
        _turn(doc, tools, store, [{"content": "ticked"}], resume=True)
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute("UPDATE heddle_steps SET data = ? WHERE seq = 2", (rows[1][2],))
    done, _ = _turn(doc, tools, store, [{"content": "ticked"}], resume=True)
    assert done.waiting is None and [n for _, n in _logged(log)] == [0, 0]  # its result was lost
    with sqlite3.connect(tmp_path / "s.db") as conn:
        assert conn.execute("SELECT count(*) FROM heddle_steps").fetchone() == (0,)
    asyncio.run(raw.close())


def _record(fmt: int, pending: Any = None, **more: Any) -> bytes:
    return dumps({"format": fmt, "id": "d", "digest": "sha256:" + "0" * 64, "document": "x", "created": 1.0,
                  "updated": 1.0, "turns": 2, "conversation": {}, "inputs": {}, "pending": pending, **more},
                 strict=False)


def test_the_record_names_its_format_and_writer_and_an_older_one_is_read_or_refused_by_name() -> None:
    from heddle import __version__
    from heddle.sessions.record import Record

    written = json.loads(Record(id="d", digest="sha256:x", document="x").encode())
    assert (written["format"], written["heddle"]) == (FORMAT, __version__) == (3, __version__)
    # Format 2 without an unfinished run: its conversation and inputs are this format's.
    assert decode("d", _record(2), store="memory").turns == 2
    running = {"status": "running", "inputs": {}, "message": None, "journal": {"entries": {}, "waited": None}}
    with pytest.raises(SessionUnreadable, match=r"its unfinished run was recorded in record format 2 by an earlier "
                                                r"heddle, whose journal this heddle \(format 3\) does not replay"):
        decode("d", _record(2, running), store="memory")
    with pytest.raises(SessionUnreadable, match=r"its record is format 4 \(written by heddle 9\.0\); this heddle "
                                                r"reads formats 2, 3: upgrade heddle"):
        decode("d", _record(4, heddle="9.0"), store="memory")


def test_the_key_reaches_remote_mcp_and_plugin_calls() -> None:
    from heddle.plugin import Call, Plugin
    from heddle.tools.mcp import _Session
    from heddle.tools.remote import Outgoing, with_idempotency_key

    outgoing = Outgoing("POST", "https://api.example/pay", [], {"X-Team": "a"}, b"{}")
    assert with_idempotency_key(outgoing, "hk-1").headers == {"X-Team": "a", "Idempotency-Key": "hk-1"}
    assert with_idempotency_key(outgoing, None) is outgoing  # outside a session: none
    own = Outgoing("POST", "https://api.example/pay", [], {"idempotency-key": "the document's"}, b"{}")
    assert with_idempotency_key(own, "hk-1") is own  # a header the document sets is its own

    seen: dict[str, Any] = {}

    class Session:
        async def call_tool(self, name: str, arguments: dict[str, Any], meta: Any = None) -> str:
            seen.update(name=name, meta=meta)
            return "result"

    async def call() -> Any:
        mcp = _Session("server 'x'", lambda: None, 1.0, None)  # type: ignore[arg-type,return-value]
        mcp.session, mcp._task = Session(), asyncio.get_running_loop().create_future()  # type: ignore[assignment]
        return await mcp.call("add", {"a": 1}, None, "", None, "hk-2")

    assert asyncio.run(call()) == "result" and seen == {"name": "add", "meta": {"heddle/idempotency-key": "hk-2"}}
    params = {"tool": "lookup", "arguments": {}, "idempotencyKey": "hk-3"}
    assert Call(Plugin(), 1, "callTool", params).idempotency_key == "hk-3"


@pytest.fixture(params=["sqlite", "file", "postgres"])
def keeps(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from tests.sessions.support import store_options, synced
    from tests.support.postgres import fresh_schema

    if request.param == "postgres":
        spec, where = fresh_schema(request.getfixturevalue("postgres_dsn")), {}
    elif request.param == "sqlite":
        spec, where = "sqlite", {"db": str(tmp_path / "sessions.db")}
    else:
        spec, where = "file", {"directory": str(tmp_path / "sessions")}
    store = synced(spec, **store_options(where))
    yield store
    store.close()


def test_every_store_that_keeps_steps_appends_reads_and_drops_them(keeps: Any) -> None:
    from heddle.errors import SessionConflict

    store = keeps
    assert store.keeps_steps is True
    store.create("s", b'{"r":1}')
    store.append_step("s", 1, 1, b'{"one":1}')
    store.append_step("s", 1, 2, b'{"two":2}')
    with pytest.raises(SessionConflict, match="step 2 after version 1 was written by another run"):
        store.append_step("s", 1, 2, b'{"two":"again"}')
    store.append_step("s", 2, 1, b'{"next":1}')
    assert store.steps("s", 1) == [(1, b'{"one":1}'), (2, b'{"two":2}')]
    store.drop_steps("s", 2)
    assert store.steps("s", 1) == [] and store.steps("s", 2) == [(1, b'{"next":1}')]
    assert store.delete("s") is True
    assert store.steps("s", 2) == []  # a session removed takes its steps along


def test_the_file_store_never_reads_a_step_a_crash_cut_short(tmp_path: Path) -> None:
    from tests.sessions.support import store_options, synced

    store = synced("file", **store_options({"directory": str(tmp_path / "sessions")}))
    store.create("s", b'{"r":1}')
    store.append_step("s", 1, 1, b'{"one":1}')
    lines = tmp_path / "sessions" / "s.steps"
    with lines.open("ab") as cut:
        cut.write(b'1 2 {"mac":"hmac-sha256:')  # the process died while it wrote step 2
    assert [seq for seq, _ in store.steps("s", 1)] == [1]
    store.append_step("s", 1, 2, b'{"two":2}')
    assert [seq for seq, _ in store.steps("s", 1)] == [1, 2]
    assert lines.read_bytes().count(b"\n") == 2
    store.close()
