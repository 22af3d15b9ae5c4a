"""The model client against the scripted model.

The first test talks to the real server (`heddle model serve`) over a socket; the rest serve the
same app in-process through httpx.ASGITransport, which answers byte for byte the same.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from heddle.errors import ModelError, UsageError
from heddle.model.client import AssistantTurn, ModelClient, ModelEndpoint
from tests.support.inproc import served_model
from tests.support.scripted_model import scripted_model

TOOLS = [{"type": "function", "function": {
    "name": "echo", "description": "Echoes",
    "parameters": {"type": "object", "properties": {"message": {"type": "string"}}}}}]


def ask(url: str, *, stream: bool, api_key: str | None = None, params: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None, turns: int = 1,
        deltas: list[str] | None = None, transport: httpx.AsyncBaseTransport | None = None) -> list[AssistantTurn]:
    endpoint = ModelEndpoint(base_url=url, model_id="scripted", api_key=api_key, params=params or {})

    async def go() -> list[AssistantTurn]:
        async with ModelClient(stream=stream, retries=0, backoff=0.01, transport=transport) as client:
            return [await client.chat(endpoint, [{"role": "user", "content": "hi"}], tools,
                                      on_delta=deltas.append if deltas is not None else None)
                    for _ in range(turns)]

    return asyncio.run(go())


def test_streamed_text_arrives_in_pieces(tmp_path: Path) -> None:
    deltas: list[str] = []
    with scripted_model([{"content": "Hello there, world"}], tmp_path) as m:
        [turn] = ask(m.url, stream=True, deltas=deltas, params={"temperature": 0.2, "max_tokens": 50})
        [request] = m.requests()
    assert turn == AssistantTurn(content="Hello there, world", tool_calls=[], finish_reason="stop")
    assert deltas == ["Hello the", "re, world"]
    assert request["path"] == "/v1/chat/completions"
    body = request["body"]
    assert body["stream"] is True and body["model"] == "scripted"
    assert body["temperature"] == 0.2 and body["max_tokens"] == 50
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert "tools" not in body
    assert request["headers"]["accept"] == "text/event-stream"


def test_buffered_answer() -> None:
    deltas: list[str] = []
    with served_model([{"content": "Bonjour"}]) as m:
        [turn] = ask(m.url, transport=m.transport, stream=False, deltas=deltas)
        [request] = m.requests()
    assert turn.content == "Bonjour" and turn.tool_calls == [] and turn.finish_reason == "stop"
    assert turn.usage == {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    assert deltas == ["Bonjour"]
    assert request["body"]["stream"] is False


def test_tool_calls_are_assembled() -> None:
    first = {"message": "hé, 世界", "nested": {"list": [1, 2, {"deep": True}]}}
    second = {"path": "notes/a.txt", "text": "x" * 200}
    entry = {"content": "Let me look.", "tool_calls": [{"name": "echo", "arguments": first},
                                                        {"name": "write_file", "arguments": second}]}
    with served_model([entry, entry]) as m:
        [streamed] = ask(m.url, transport=m.transport, stream=True, tools=TOOLS)
        [buffered] = ask(m.url, transport=m.transport, stream=False, tools=TOOLS)
        requests = m.requests()
    for n, turn in enumerate([streamed, buffered]):
        assert turn.finish_reason == "tool_calls"
        assert turn.content == "Let me look."
        assert [(c.id, c.name) for c in turn.tool_calls] == [(f"call_{n}_0", "echo"), (f"call_{n}_1", "write_file")]
        assert [json.loads(c.arguments) for c in turn.tool_calls] == [first, second]
        assert requests[n]["body"]["tools"] == TOOLS
    assert streamed.tool_calls[0].arguments == buffered.tool_calls[0].arguments
    assert streamed.as_message() == {
        "role": "assistant", "content": "Let me look.",
        "tool_calls": [
            {"id": "call_0_0", "type": "function", "function": {"name": "echo", "arguments": json.dumps(first)}},
            {"id": "call_0_1", "type": "function", "function": {"name": "write_file", "arguments": json.dumps(second)}},
        ],
    }


def test_tool_call_only_turn_has_no_content() -> None:
    entry = {"tool_calls": [{"name": "echo", "arguments": {}}]}
    with served_model([entry, entry]) as m:
        turns = ask(m.url, transport=m.transport, stream=True) + ask(m.url, transport=m.transport, stream=False)
    assert [t.content for t in turns] == [None, None]
    assert [t.tool_calls[0].arguments for t in turns] == ["{}", "{}"]


def test_non_ascii_text_both_ways() -> None:
    text = "Grüße, 世界 — ☃ 🌍 נ"
    with served_model([{"content": text}, {"content": text}]) as m:
        endpoint = ModelEndpoint(base_url=m.url, model_id="scripted", api_key=None, params={})

        async def go(stream: bool) -> AssistantTurn:
            async with ModelClient(stream=stream, retries=0, transport=m.transport) as client:
                return await client.chat(endpoint, [{"role": "user", "content": f"say {text}"}])

        turns = [asyncio.run(go(True)), asyncio.run(go(False))]
        requests = m.requests()
    assert [t.content for t in turns] == [text, text]
    assert [r["body"]["messages"][0]["content"] for r in requests] == [f"say {text}"] * 2


def test_several_turns_on_one_client() -> None:
    script: list[dict[str, Any]] = [{"content": "one"}, {"tool_calls": [{"name": "echo", "arguments": {"n": 2}}]},
                                    {"content": "three"}]
    with served_model(script) as m:
        turns = ask(m.url, transport=m.transport, stream=True, turns=3)
    assert [t.content for t in turns] == ["one", None, "three"]
    assert turns[1].tool_calls[0].id == "call_1_0"


def test_v1_is_appended_to_a_bare_host() -> None:
    with served_model([{"content": "ok"}, {"content": "ok"}]) as m:
        bare = m.url.removesuffix("/v1")
        turns = ask(bare, transport=m.transport, stream=True) + ask(bare + "/", transport=m.transport, stream=False)
        requests = m.requests()
    assert [t.content for t in turns] == ["ok", "ok"]
    assert [r["path"] for r in requests] == ["/v1/chat/completions"] * 2


def test_authorization_header_only_with_a_key() -> None:
    with served_model([{"content": "a"}, {"content": "b"}]) as m:
        ask(m.url, transport=m.transport, stream=True, api_key="sekret-123")
        ask(m.url, transport=m.transport, stream=False, api_key=None)
        with_key, without_key = m.requests()
    assert with_key["headers"]["authorization"] == "Bearer sekret-123"
    assert "authorization" not in without_key["headers"]


def test_exhausted_script_is_a_model_error_quoting_the_body() -> None:
    with served_model([]) as m:
        for stream in (True, False):
            with pytest.raises(ModelError) as info:
                ask(m.url, transport=m.transport, stream=stream)
            message = str(info.value)
            assert "HTTP 500" in message and "the script has no more responses" in message
            assert "'scripted'" in message and m.url in message
        assert len(m.requests()) == 2


def test_parameters_that_are_not_json_fail_before_sending() -> None:
    # Nothing listens on port 9 here; the error must come before any connection is tried.
    with pytest.raises(UsageError, match="default_generation_parameters"):
        ask("http://127.0.0.1:9", stream=True, params={"temperature": float("nan")})
