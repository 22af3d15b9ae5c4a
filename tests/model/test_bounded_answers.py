"""A model's answer is read within a cap on its decoded bytes and a deadline on the whole answer:
an endless stream, a compressed bomb and a server that drips bytes each end in one ModelError."""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from heddle.errors import ModelError
from heddle.model.client import ModelClient, ModelEndpoint
from tests.support.bombs import zstd_bomb

ENDPOINT = ModelEndpoint(base_url="http://model.test", model_id="m", api_key=None)


def _ask(respond: Callable[[httpx.Request], httpx.Response], *, stream: bool, **options: object) -> str:
    async def go() -> str:
        async with ModelClient(stream=stream, retries=0, transport=httpx.MockTransport(respond),
                               **options) as client:  # type: ignore[arg-type]
            try:
                await client.chat(ENDPOINT, [{"role": "user", "content": "hi"}])
            except ModelError as exc:
                return exc.message
        raise AssertionError("the answer should have been refused")

    return asyncio.run(go())


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _endless() -> AsyncIterator[bytes]:
    chunk = json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 1000}}]})
    while True:
        yield f"data: {chunk}\n\n".encode()


def test_an_endless_stream_stops_at_the_cap() -> None:
    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=_endless())

    message = _ask(respond, stream=True, max_bytes=1 << 20)
    assert "over 1 MiB once decoded" in message and "--max-response-bytes" in message and "\n" not in message


def test_a_compressed_answer_is_capped_as_it_decodes() -> None:
    bomb = zstd_bomb(1 << 30)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    def respond(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "application/json", "content-encoding": "zstd"},
                              content=_once(bomb))

    message = _ask(respond, stream=False)
    assert "over 16 MiB once decoded" in message
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100 * 1024


@pytest.mark.parametrize("stream", [True, False])
def test_a_dripping_answer_ends_at_the_deadline(stream: bool) -> None:
    async def drip() -> AsyncIterator[bytes]:
        yield b"data: "
        while True:
            await asyncio.sleep(0.01)
            yield b" "

    def respond(request: httpx.Request) -> httpx.Response:
        kind = "text/event-stream" if stream else "application/json"
        return httpx.Response(200, headers={"content-type": kind}, content=drip())

    message = _ask(respond, stream=stream, deadline=0.3, timeout=5.0)
    assert "did not finish within 0.3 s" in message
