"""Cancelling the task that awaits the model aborts the HTTP request."""

from __future__ import annotations

import asyncio
import time

import pytest

from heddle.model.client import ModelClient, ModelEndpoint
from tests.model.vendor import Vendor


async def _until(predicate, timeout: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "buffered"])
def test_cancel_closes_the_connection(stream: bool) -> None:
    with Vendor(["hang"]) as vendor:
        endpoint = ModelEndpoint(base_url=vendor.url, model_id="m", api_key=None, params={})

        async def go() -> None:
            async with ModelClient(stream=stream, retries=0) as client:
                task = asyncio.create_task(client.chat(endpoint, [{"role": "user", "content": "hi"}]))
                assert await _until(vendor.got_request.is_set)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # Checked while the client is still open: the cancelled request's connection
                # must be closed, not kept for reuse.
                assert await _until(vendor.disconnected.is_set, timeout=5)

        asyncio.run(go())


def test_cancel_during_backoff_is_prompt() -> None:
    with Vendor([503] * 5) as vendor:
        endpoint = ModelEndpoint(base_url=vendor.url, model_id="m", api_key=None, params={})

        async def go() -> float:
            async with ModelClient(retries=3, backoff=30.0) as client:
                task = asyncio.create_task(client.chat(endpoint, [{"role": "user", "content": "hi"}]))
                assert await _until(lambda: len(vendor.attempts) == 1)
                await asyncio.sleep(0.05)
                started = time.monotonic()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                return time.monotonic() - started

        assert asyncio.run(go()) < 1.0
        assert len(vendor.attempts) == 1
