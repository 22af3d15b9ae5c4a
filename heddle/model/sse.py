"""Server-sent events: the `data:` payloads of an event stream, one per event.

Only what chat-completions streams use: `data` fields (several lines join with a newline),
comments and other fields ignored, an event ending at a blank line.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator


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
