"""A message transform's summaries cached in a PostgresDatabaseDatastore, against a real throwaway
Postgres, as the reference runtime (WayFlow 26.3.1) keeps them.

The reference, read from its source: it connects to database `postgres` at `url` (host[:port]) as
`user`/`password` with `sslmode` (and the certificate files unless sslmode is `disable`), uses the
existing table named by `cache_collection_name` (it creates none), keys a conversation's rows by the
conversation's id (`{id}_{index}_content` for a message), reads the first row stored for a key and
marks it used, and inserts a row (`created_at` = `last_used_at` = now) for each summary it makes.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from heddle.errors import DocumentError
from heddle.agentspec import load_flow
from tests.engine.test_sessions import step
from tests.engine.test_transforms import MESSAGE_INSTRUCTIONS, agent, asked, prompt, summarizer, write
from tests.support.inproc import check_doc
from tests.support.memstore import MemStore

ROOT = Path(__file__).resolve().parents[2]


def connection(dsn: str, **extra: Any) -> dict[str, Any]:
    query = parse_qs(urlsplit(dsn).query)
    return {"component_type": "TlsPostgresDatabaseConnectionConfig", "name": "cachedb", "user": "$PG_USER",
            "password": "$PG_PASSWORD", "url": f"{query['host'][0]}:{query['port'][0]}", "sslmode": "disable",
            **extra}


def transform(dsn: str, table: str, **extra: Any) -> dict[str, Any]:
    schema = {table: {"title": table, "type": "object", "properties": {
        "cache_key": {"type": "string"}, "cache_content": {"type": "string"},
        "created_at": {"type": "number"}, "last_used_at": {"type": "number"}}}}
    return {"component_type": "MessageSummarizationTransform", "name": "shorten", "llm": summarizer(),
            "max_message_size": 40, "cache_collection_name": table,
            "datastore": {"component_type": "PostgresDatabaseDatastore", "name": "cache",
                          "datastore_schema": schema, "connection_config": connection(dsn, **extra)}}


@pytest.fixture
def table(postgres_dsn: str, monkeypatch: pytest.MonkeyPatch) -> str:
    import psycopg

    name = f"summaries_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (cache_key text, cache_content text, created_at double precision, "
                     "last_used_at double precision)")
    monkeypatch.setenv("PG_USER", "heddle")
    monkeypatch.setenv("PG_PASSWORD", "unused-with-trust")
    return name


def rows(dsn: str, table: str) -> list[tuple[Any, ...]]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        return conn.execute(f"SELECT cache_key, cache_content FROM {table} ORDER BY created_at").fetchall()


SECOND_TURN = """
import asyncio, json, sys
from pathlib import Path
from tests.engine.test_sessions import step
from tests.support.memstore import MemStore

store = MemStore()
asyncio.run(store.create("chat", Path(sys.argv[2]).read_bytes()))
turn = step(Path(sys.argv[1]), store, message="and?", script=[{"content": "a2"}])
print(json.dumps({"requests": [r["body"] for r in turn.requests], "outputs": turn.outcome.outputs}))
"""


def test_a_summary_cached_in_postgres_is_read_from_the_table_by_a_later_turn_in_a_new_process(
        tmp_path: Path, postgres_dsn: str, table: str) -> None:
    doc = write(tmp_path / "agent.json", agent([transform(postgres_dsn, table, sslrootcert="/nonexistent/ca.pem")]))
    question = "q" * 41  # over the 10 tokens of 40 characters
    store = MemStore()
    first = step(doc, store, message=question, script=[{"content": "M1"}, {"content": "a1"}])
    assert first.requests[0]["body"]["messages"] == asked(prompt(MESSAGE_INSTRUCTIONS), question)
    stored = rows(postgres_dsn, table)
    assert len(stored) == 1 and stored[0][0].endswith("_0_content") and stored[0][1] == "Summarized message: M1"
    # The session keeps only the conversation's id: the summary itself is in the table.
    session = store.sessions.get("chat")
    assert session is not None and b"Summarized message: M1" not in session.data
    record = tmp_path / "session.json"
    record.write_bytes(session.data)
    done = subprocess.run([sys.executable, "-c", SECOND_TURN, str(doc), str(record)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    second = json.loads(done.stdout.strip().splitlines()[-1])
    # One request, to the agent's model: the long message was not summarised again.
    assert [body["model"] for body in second["requests"]] == ["scripted"]
    assert second["requests"][0]["messages"][1:] == [
        {"role": "user", "content": "Summarized message: M1"}, {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "and?"}]
    assert second["outputs"] == {"result": "a2"}
    assert len(rows(postgres_dsn, table)) == 1


def test_another_conversation_does_not_read_the_first_ones_summaries(tmp_path: Path, postgres_dsn: str,
                                                                    table: str) -> None:
    doc = write(tmp_path / "agent.json", agent([transform(postgres_dsn, table)]))
    store = MemStore()
    for session, summary in (("one", "M1"), ("two", "M2")):
        turn = step(doc, store, session, message="q" * 41, script=[{"content": summary}, {"content": "ok"}])
        assert [r["body"]["model"] for r in turn.requests] == ["small", "scripted"]
    assert [content for _, content in rows(postgres_dsn, table)] == ["Summarized message: M1",
                                                                     "Summarized message: M2"]


@pytest.mark.parametrize(("extra", "field"), [
    ({"password": "hunter2"}, "password"),
    ({"user": "heddle"}, "user"),
    ({"sslkey": "/keys/client.key"}, "sslkey"),
    ({"url": "postgresql://db:5432"}, "url"),
])
def test_secrets_written_into_the_document_and_a_url_the_reference_cannot_use_are_refused(
        tmp_path: Path, extra: dict[str, Any], field: str) -> None:
    doc = write(tmp_path / "agent.json", agent([transform("postgresql://x@/postgres?host=/s&port=1", "t", **extra)]))
    with pytest.raises(DocumentError, match=rf"TlsPostgresDatabaseConnectionConfig 'cachedb': {field}"):
        load_flow(doc)


def test_a_missing_table_fails_the_run_naming_it(tmp_path: Path, postgres_dsn: str, table: str) -> None:
    doc = write(tmp_path / "agent.json", agent([transform(postgres_dsn, "no_such_table")]))
    from heddle.errors import RunError

    with pytest.raises(RunError, match=r"Postgres table 'no_such_table'"):
        step(doc, MemStore(), message="q" * 41, script=[{"content": "M1"}, {"content": "ok"}])


def test_a_password_read_from_one_of_heddles_own_secrets_is_refused(tmp_path: Path) -> None:
    dsn = "postgresql://x@/postgres?host=/s&port=1"
    doc = write(tmp_path / "agent.json", agent([transform(dsn, "t", password="$HEDDLE_KEY_PASSPHRASE")]))
    code, error = check_doc(doc)
    assert code != 0 and "TlsPostgresDatabaseConnectionConfig 'cachedb'" in error
    assert "password" in error and "HEDDLE_KEY_PASSPHRASE" in error


def test_a_run_resumed_after_a_wait_asks_no_summary_again_and_stores_none_twice(tmp_path: Path, postgres_dsn: str,
                                                                               table: str) -> None:
    from tests.engine.test_sessions import logging_tool, ran
    from tests.support.flows import server_tool

    tools, log = tmp_path / "tools", tmp_path / "log"
    logging_tool(tools, "stamp", log, "{'stamped': 'yes'}")
    doc = write(tmp_path / "agent.json", agent([transform(postgres_dsn, table)], tools=[
        {**server_tool("stamp", ["text"], ["stamped"]), "requires_confirmation": True}]))
    store = MemStore()
    call = {"tool_calls": [{"name": "stamp", "arguments": {"text": "form"}}]}
    first = step(doc, store, tools=tools, message="q" * 41, script=[{"content": "M1"}, call])
    assert first.outcome.waiting is not None and len(first.requests) == 2
    second = step(doc, store, tools=tools, answer={"approve": True}, script=[{"content": "Stamped."}])
    assert second.outcome.outputs == {"result": "Stamped."} and ran(log) == ["stamp"]
    (request,) = second.requests
    assert request["body"]["messages"][1] == {"role": "user", "content": "Summarized message: M1"}
    assert [content for _, content in rows(postgres_dsn, table)] == ["Summarized message: M1"]


def test_a_bundle_lists_the_variables_a_postgres_connection_reads() -> None:
    from heddle.bundle.flowenv import env_reads

    doc = {**agent([transform("postgresql://x@/postgres?host=/s&port=1", "t", sslkey="$PG_KEY")]),
           "agentspec_version": "26.1.2"}
    names = [read.name for read in env_reads(doc)]
    assert {"PG_USER", "PG_PASSWORD", "PG_KEY"} <= set(names)


def test_a_conversations_summary_is_kept_with_the_messages_it_stands_for(tmp_path: Path, postgres_dsn: str,
                                                                        table: str) -> None:
    import psycopg

    with psycopg.connect(postgres_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {table} ADD COLUMN prefix_size bigint")
    written = transform(postgres_dsn, table)
    written["datastore"]["datastore_schema"][table]["properties"]["prefix_size"] = {"type": "integer"}
    conversation = {**{k: v for k, v in written.items() if k != "max_message_size"},
                    "component_type": "ConversationSummarizationTransform", "max_num_messages": 3,
                    "min_num_messages": 2}
    doc = write(tmp_path / "agent.json", agent([conversation]))
    store = MemStore()
    for n in (1, 2):
        step(doc, store, message=f"u{n}", script=[{"content": f"a{n}"}])
    third = step(doc, store, message="u3", script=[{"content": "S1"}, {"content": "a3"}])
    assert third.requests[1]["body"]["messages"][1:] == [
        {"role": "user", "content": "Summarized conversation: S1"}, {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "u3"}]
    # The next turn starts from the stored summary, which stands for the first 3 messages.
    fourth = step(doc, store, message="u4", script=[{"content": "S2"}, {"content": "a4"}])
    assert fourth.requests[0]["body"]["messages"][0]["content"][1:] == [
        {"type": "text", "text": "Summarized conversation: S1"}, {"type": "text", "text": "\n\n\nassistant:\n\n"},
        {"type": "text", "text": "a2"}, {"type": "text", "text": "\n\n\nuser:\n\n"}, {"type": "text", "text": "u3"}]
    with psycopg.connect(postgres_dsn) as conn:
        stored = conn.execute(f"SELECT prefix_size, cache_content FROM {table} ORDER BY created_at").fetchall()
    assert stored == [(3, "Summarized conversation: S1"), (5, "Summarized conversation: S2")]
