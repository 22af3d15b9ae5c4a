"""heddle.bounded: bodies decoded a step at a time and counted once decoded, against httpx
responses built in memory from raw bytes (the network tests drive real servers)."""

from __future__ import annotations

import asyncio
import gzip
import os
import zlib
from collections.abc import AsyncIterator

import httpx
import pytest
import zstandard

from heddle.bounded import STEP, BodyError, read_body
from tests.support.bombs import zstd_bomb

DATA = os.urandom(200_000) + bytes(3_000_000) + b"tail" * 5000


def _raw_deflate(data: bytes) -> bytes:
    co = zlib.compressobj(wbits=-15)
    return co.compress(data) + co.flush()


async def _chunks(data: bytes, size: int = 1000) -> AsyncIterator[bytes]:
    for at in range(0, len(data), size):
        yield data[at:at + size]


def _read(raw: bytes, coding: str | None, cap: int = 1 << 30) -> bytes:
    headers = {"content-encoding": coding} if coding else {}

    async def go() -> bytes:
        # A streamed response, as a client's send(stream=True) gives one: its raw bytes not yet read.
        response = httpx.Response(200, headers=headers, stream=httpx.AsyncByteStream())
        response.stream = _Stream(raw)  # type: ignore[assignment]
        return await read_body(response, what="the test server", cap=cap, cap_text="--max-response-bytes")

    return asyncio.run(go())


class _Stream(httpx.AsyncByteStream):
    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in _chunks(self.raw):
            yield chunk


@pytest.mark.parametrize(("coding", "encode"), [
    (None, lambda d: d), ("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress),
    ("deflate", _raw_deflate), ("zstd", lambda d: zstandard.ZstdCompressor().compress(d)),
    ("gzip, zstd", lambda d: zstandard.ZstdCompressor().compress(gzip.compress(d))),
])
def test_each_coding_decodes_exactly(coding, encode) -> None:
    assert _read(encode(DATA), coding) == DATA


@pytest.mark.parametrize(("coding", "raw"), [("zstd", zstd_bomb(1 << 30)),
                                              ("gzip", zlib.compress(bytes(64 << 20), 1, wbits=31))])
def test_a_bomb_stops_at_the_cap(coding: str, raw: bytes) -> None:
    with pytest.raises(BodyError) as caught:
        _read(raw, coding, cap=5 << 20)
    assert caught.value.message == ("the test server: the answer is over 5 MiB once decoded (--max-response-bytes); "
                                    "it was not read further")


@pytest.mark.parametrize(("coding", "raw", "needle"), [
    ("br", b"abc", "br-encoded, which heddle does not decode"),
    ("gzip, gzip, gzip", b"abc", "encoded 3 times over"),
    ("gzip", gzip.compress(DATA)[:-100], "the compressed stream is incomplete"),
    ("zstd", zstandard.ZstdCompressor().compress(DATA)[:-100], "the zstd frame is incomplete"),
    ("gzip", b"not gzip at all", "content encoding is broken"),
])
def test_what_cannot_be_decoded_whole_is_refused(coding: str, raw: bytes, needle: str) -> None:
    with pytest.raises(BodyError, match=needle):
        _read(raw, coding)


def test_a_zstd_window_past_8_mib_is_refused() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=24)
    raw = zstandard.ZstdCompressor(compression_params=params).compress(os.urandom(20 << 20))
    with pytest.raises(BodyError, match="content encoding is broken"):
        _read(raw, "zstd")


def test_pieces_are_bounded() -> None:
    from heddle.bounded import decoder

    pieces = list(decoder("zstd", "x").feed(zstd_bomb(64 << 20)))
    assert sum(map(len, pieces)) == 64 << 20 and max(map(len, pieces)) <= STEP
