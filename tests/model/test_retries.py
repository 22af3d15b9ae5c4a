"""Retries against a vendor stand-in that fails on cue, and the error once they run out."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import pytest

from heddle.errors import ModelError
from heddle.model.client import AssistantTurn, ModelClient, ModelEndpoint
from tests.model.vendor import ANSWER, Vendor


def ask(url: str, *, stream: bool = True, retries: int = 3, backoff: float = 0.01,
        on_delta: Callable[[str], None] | None = None) -> AssistantTurn:
    endpoint = ModelEndpoint(base_url=url, model_id="vendor-model", api_key="k", params={})

    async def go() -> AssistantTurn:
        async with ModelClient(stream=stream, retries=retries, backoff=backoff) as client:
            return await client.chat(endpoint, [{"role": "user", "content": "hi"}], on_delta=on_delta)

    return asyncio.run(go())


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "buffered"])
def test_429_and_5xx_are_retried(stream: bool) -> None:
    with Vendor([429, 503, 500]) as vendor:
        turn = ask(vendor.url, stream=stream)
    assert turn.content == ANSWER
    assert len(vendor.attempts) == 4
    # Every attempt is the same request.
    assert all(a["body"] == vendor.attempts[0]["body"] for a in vendor.attempts)


def test_error_after_the_last_retry_quotes_status_and_body_start() -> None:
    with Vendor([502] * 10, error_body="upstream exploded: " + "x" * 1000) as vendor:
        with pytest.raises(ModelError) as info:
            ask(vendor.url, retries=2)
    assert len(vendor.attempts) == 3
    message = str(info.value)
    assert "HTTP 502 after 3 attempts: upstream exploded: xxx" in message
    assert "'vendor-model'" in message and vendor.url in message
    assert len(message) < 500 and "\n" not in message


@pytest.mark.parametrize(("status", "hint"), [(400, ""), (401, "api_key"), (404, "url and model_id")])
def test_other_client_errors_are_not_retried(status: int, hint: str) -> None:
    with Vendor([status]) as vendor:
        with pytest.raises(ModelError) as info:
            ask(vendor.url)
    assert len(vendor.attempts) == 1
    assert f"HTTP {status}: " in str(info.value) and f"vendor says {status}" in str(info.value)
    assert hint in str(info.value)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "buffered"])
def test_dropped_connections_are_retried(stream: bool) -> None:
    with Vendor(["drop", "drop"]) as vendor:
        turn = ask(vendor.url, stream=stream)
    assert turn.content == ANSWER
    assert len(vendor.attempts) == 3


def test_connection_refused_is_retried_with_backoff_then_reported() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Nothing listens on the port now.
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        ask(f"http://127.0.0.1:{port}", retries=3, backoff=0.05)
    elapsed = time.monotonic() - started
    assert elapsed >= 0.05 + 0.1 + 0.2
    message = str(info.value)
    assert f"http://127.0.0.1:{port}/v1" in message and "cannot connect after 4 attempts" in message


def test_a_stream_cut_before_any_content_was_shown_is_retried() -> None:
    with Vendor(["break"]) as vendor:
        turn = ask(vendor.url)
    assert turn.content == ANSWER and len(vendor.attempts) == 2


def test_a_stream_cut_after_content_was_shown_is_not_retried() -> None:
    shown: list[str] = []
    with Vendor(["break"]) as vendor:
        with pytest.raises(ModelError, match="closed the connection"):
            ask(vendor.url, on_delta=shown.append)
    # A retry would show the same words twice.
    assert len(vendor.attempts) == 1 and shown == ["Hel"]
