"""Server-sent events: the `data:` payloads of an event stream, one per event.

Only what chat-completions streams use: `data` fields (several lines join with a newline),
comments and other fields ignored, an event ending at a blank line.
"""

from __future__ import annotations

import codecs
import re
from collections.abc import AsyncIterable, AsyncIterator

_BREAK = re.compile(r"\r\n|\r|\n")


async def lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """The lines of a UTF-8 byte stream (ended by CRLF, LF or CR), decoded as they arrive; a line
    is never longer than what the stream's cap let through."""
    decode = codecs.getincrementaldecoder("utf-8")("replace").decode
    partial: list[str] = []
    cr = False  # a CR ended the last chunk: a LF starting the next one belongs to it
    async for chunk in chunks:
        text = decode(chunk)
        if not text:
            continue
        if cr:
            text = "\r" + text
        cr = text.endswith("\r")
        if cr:
            text = text[:-1]
        parts = _BREAK.split(text)
        partial.append(parts[0])
        if len(parts) == 1:
            continue
        yield "".join(partial)
        for line in parts[1:-1]:
            yield line
        partial = [parts[-1]]
    rest = "".join(partial) + decode(b"", True)
    if cr or rest:
        yield rest


async def event_data(lines: AsyncIterable[str]) -> AsyncIterator[str]:
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name != "data":
            continue
        data.append(value.removeprefix(" "))
    if data:  # a stream may end without the final blank line
        yield "\n".join(data)
